//! What every example server shares: the backend the environment names, the
//! listener, the startup line and graceful shutdown. Included by each
//! example's `main.rs` (`#[path = "../support/mod.rs"] mod support;`).

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use tokio::net::TcpListener;
use tollgate::{Error, RateBackend, RedisBackend};

/// The Redis backend the environment names, if any: `REDIS_CLUSTER`
/// (comma-separated `host:port` seeds) selects a cluster, else `REDIS_URL` a
/// standalone Redis; `None` means this process's memory.
///
/// A standalone Redis is connected lazily: the server starts (and its limits
/// fail open, its locks answer 503) while Redis is down, and recovers on its
/// own when Redis is back. A cluster must be reachable at start, to learn its
/// slots.
pub(crate) async fn redis_from_env() -> Result<Option<RedisBackend>, Error> {
    let var = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(seeds) = var("REDIS_CLUSTER") {
        let seeds = seeds.split(',').map(str::trim).filter(|s| !s.is_empty());
        return Ok(Some(RedisBackend::connect_cluster(seeds).await?));
    }
    var("REDIS_URL")
        .map(|url| RedisBackend::connect_lazy(&url))
        .transpose()
}

/// Runs the example `name`: listens on `TOLLGATE_ADDR` (default
/// `127.0.0.1:3000`), builds its router with `build` on the backend the
/// environment names (`None`: memory), prints
/// `listening on http://<addr> (backend: <kind>)` and serves until Ctrl-C.
pub(crate) async fn run(
    name: &str,
    build: impl FnOnce(Option<RedisBackend>) -> Router,
) -> ExitCode {
    let addr = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let redis = match redis_from_env().await {
        Ok(redis) => redis,
        Err(e) => {
            eprintln!("{name}: cannot set up the backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(&addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("{name}: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = listener
        .local_addr()
        .expect("a bound listener has an address");
    let kind = redis.as_ref().map_or("memory", |r| r.kind());
    let router = build(redis);
    println!("listening on http://{local} (backend: {kind})");
    match serve(listener, router).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: server error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves `router` on `listener`, recording each connection's peer address
/// (for per-IP keys).
pub(crate) async fn serve(listener: TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
