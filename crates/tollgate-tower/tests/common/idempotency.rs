//! Shared by the `IdempotencyLayer` tests: the backends, and a bounded send.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::{MemoryBackend, RedisBackend};
use tower::ServiceExt;

/// Far above anything these tests wait for, far below a hang.
pub const BOUND: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Memory,
    Redis,
    Cluster,
}

/// A fresh store on `kind`.
pub async fn store(kind: Kind) -> IdempotencyStore {
    match kind {
        Kind::Memory => IdempotencyStore::new(MemoryBackend::new()),
        Kind::Redis => IdempotencyStore::new(
            RedisBackend::connect(&super::shared_redis().url())
                .await
                .unwrap(),
        ),
        Kind::Cluster => IdempotencyStore::new(
            RedisBackend::connect_cluster(super::shared_cluster().seeds())
                .await
                .unwrap(),
        ),
    }
}

/// Sends `req` and collects the whole response, each within [`BOUND`].
pub async fn collect(app: &Router, req: Request<Body>) -> (StatusCode, HeaderMap, Bytes) {
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req))
        .await
        .expect("bounded")
        .unwrap();
    let (head, body) = res.into_parts();
    let body = tokio::time::timeout(BOUND, body.collect())
        .await
        .expect("bounded")
        .unwrap();
    (head.status, head.headers, body.to_bytes())
}

/// One `#[tokio::test]` per backend, each running `$suite(kind)`.
#[macro_export]
macro_rules! idempotency_on_every_backend {
    ($suite:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn memory() {
            $suite($crate::common::idempotency::Kind::Memory).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn redis_standalone() {
            $suite($crate::common::idempotency::Kind::Redis).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn redis_cluster() {
            $suite($crate::common::idempotency::Kind::Cluster).await;
        }
    };
}
