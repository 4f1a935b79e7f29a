//! An API gateway built only from tollgate's public API: API keys, a
//! distributed concurrency limit per key, idempotent orders and a rate limit
//! per key by plan, and a token budget per key settled to the tokens used,
//! on memory, Redis or a cluster.
//!
//! ```text
//! cargo run --example gateway                                   # in memory
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example gateway  # standalone Redis
//! REDIS_CLUSTER=127.0.0.1:7000,127.0.0.1:7001 cargo run --example gateway
//! REDIS_SENTINELS=127.0.0.1:26379 REDIS_SENTINEL_SERVICE=mymaster cargo run --example gateway --features sentinel
//! TOLLGATE_ADDR=127.0.0.1:3001 cargo run --example gateway      # another port
//! TOLLGATE_ADMIN_TOKEN=s3cret cargo run --example gateway       # the operator plane at /admin
//! ```
//!
//! Then:
//!
//! ```text
//! curl -i -X POST -H 'X-Api-Key: demo' 'http://127.0.0.1:3000/v1/generate?ms=2000'
//! # {"permit_fence":...}; a third concurrent one with the same key is 429
//! curl -i -H 'X-Api-Key: demo' http://127.0.0.1:3000/v1/quota
//! # {"plan":"free","remaining":9}; the 11th in a minute is 429 (pro-… keys: 100)
//! curl -i -X POST -H 'X-Api-Key: demo' -d '{"max_tokens":300}' http://127.0.0.1:3000/v1/chat
//! # {"tokens":120}; RateLimit: "chat";r=880;… (1000 tokens a minute, settled)
//! curl -H 'Authorization: Bearer s3cret' http://127.0.0.1:3000/admin/api/throttled
//! # who is throttled; the dashboard: http://127.0.0.1:3000/admin/#token=s3cret
//! ```
//!
//! Several instances on one Redis share the limits. The contract is in
//! `app.rs` and checked end to end by `tests/gateway.rs`.

use std::process::ExitCode;

mod app;
#[path = "../support/mod.rs"]
mod support;

#[tokio::main]
async fn main() -> ExitCode {
    support::run("gateway", app::router).await
}
