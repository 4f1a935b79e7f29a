//! What every example server shares: the backend the environment names, the
//! listener, the startup line and graceful shutdown. Included by each
//! example's `main.rs` (`#[path = "../support/mod.rs"] mod support;`).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::Router;
use tokio::net::TcpListener;
use tollgate::Backend;
use tracing_subscriber::EnvFilter;

/// Runs the example `name`: logs tollgate's warnings to stderr (`RUST_LOG`
/// overrides the level), listens on `TOLLGATE_ADDR` (default
/// `127.0.0.1:3000`), builds its router with `build` on the backend the
/// environment names ([`Backend::from_env`]: `REDIS_CLUSTER`,
/// `REDIS_SENTINELS` or `REDIS_URL`, else memory), prints
/// `listening on http://<addr> (backend: <kind>)` and serves until Ctrl-C.
///
/// A standalone Redis is connected lazily: the server starts (and its limits
/// fail open, its locks answer 503) while Redis is down, and recovers on its
/// own when Redis is back. A cluster must be reachable at start, to learn its
/// slots.
pub(crate) async fn run(name: &str, build: impl FnOnce(Backend) -> Router) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let addr = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let backend = match Backend::from_env().await {
        Ok(backend) => backend,
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
    let kind = backend.kind();
    let router = build(backend);
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
