//! tollgate's quickstart: an axum server with a per-IP rate limit and a
//! fenced job lock.
//!
//! ```text
//! cargo run --example quickstart                                   # in memory
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart  # standalone Redis
//! REDIS_CLUSTER=127.0.0.1:7000,127.0.0.1:7001 cargo run --example quickstart
//! REDIS_SENTINELS=127.0.0.1:26379 REDIS_SENTINEL_SERVICE=mymaster cargo run --example quickstart --features sentinel
//! TOLLGATE_ADDR=127.0.0.1:3001 cargo run --example quickstart      # another port
//! ```
//!
//! Then:
//!
//! ```text
//! curl -i http://127.0.0.1:3000/          # 200 hello; the 6th quick one is 429
//! curl -i -X POST http://127.0.0.1:3000/jobs/42   # {"job":"42","fence":...}
//! ```
//!
//! Several instances on one Redis share the rate limit and the job locks.

use std::process::ExitCode;

mod app;
#[path = "../support/mod.rs"]
mod support;

#[tokio::main]
async fn main() -> ExitCode {
    support::run("quickstart", app::router).await
}
