//! tollgate's quickstart: an axum server with a per-IP rate limit and a
//! fenced job lock.
//!
//! ```text
//! cargo run --example quickstart                                   # in memory
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart  # standalone Redis
//! REDIS_CLUSTER=127.0.0.1:7000,127.0.0.1:7001 cargo run --example quickstart
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

use tokio::net::TcpListener;
use tollgate::{MemoryBackend, RateBackend};

mod app;

#[tokio::main]
async fn main() -> ExitCode {
    let addr = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let redis = match app::redis_from_env().await {
        Ok(redis) => redis,
        Err(e) => {
            eprintln!("quickstart: cannot set up the backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(&addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("quickstart: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = listener
        .local_addr()
        .expect("a bound listener has an address");
    let (kind, router) = match redis {
        Some(redis) => (redis.kind(), app::router(redis)),
        None => ("memory", app::router(MemoryBackend::new())),
    };
    println!("listening on http://{local} (backend: {kind})");
    match app::serve(listener, router).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: server error: {e}");
            ExitCode::FAILURE
        }
    }
}
