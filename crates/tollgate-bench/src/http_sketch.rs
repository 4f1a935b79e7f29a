//! A bound for the HTTP item: the least work a Redis-backed limiter can add
//! to a request. Each request hands a one-shot sender to a queue; one task
//! takes everything queued, decides it in one call of the least-work GCRA
//! sketch ([`crate::sketch`]) — one call in flight, so batches
//! grow with the load — and answers each. No headers, no key extraction
//! beyond one fixed key, no failure policy: what is left is the Redis
//! round trip and the script, which a limiter that sends every decision to
//! Redis pays.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, oneshot};

use crate::common::BenchResult;
use crate::sketch::load_script;

/// The queue the middleware hands requests to.
#[derive(Clone)]
pub(crate) struct SketchQueue {
    tx: mpsc::UnboundedSender<oneshot::Sender<bool>>,
}

/// Starts the deciding task for `key` at `per_second` (burst the same).
pub(crate) async fn start(
    conn: MultiplexedConnection,
    key: String,
    per_second: u64,
) -> BenchResult<SketchQueue> {
    let script = load_script(&conn).await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<oneshot::Sender<bool>>();
    tokio::spawn(async move {
        let mut batch = Vec::new();
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while let Ok(next) = rx.try_recv() {
                batch.push(next);
            }
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.sha.as_str()).arg(batch.len());
            for _ in 0..batch.len() {
                cmd.arg(key.as_str());
            }
            cmd.arg(per_second).arg(1_000_000 / per_second);
            let mut c = conn.clone();
            let answers: Vec<i64> = cmd.query_async(&mut c).await.unwrap_or_default();
            for (i, waiting) in batch.drain(..).enumerate() {
                let _ = waiting.send(answers.get(i) == Some(&1));
            }
        }
    });
    Ok(SketchQueue { tx })
}

/// The middleware: admitted requests go on, others get a bare 429.
pub(crate) async fn limit(State(queue): State<SketchQueue>, req: Request, next: Next) -> Response {
    let (tx, rx) = oneshot::channel();
    if queue.tx.send(tx).is_ok() && rx.await == Ok(true) {
        return next.run(req).await;
    }
    StatusCode::TOO_MANY_REQUESTS.into_response()
}
