//! Shared by the `IdempotencyLayer` tests: the backends, a store whose
//! completions fail, and a bounded send.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use futures::future::{BoxFuture, FutureExt};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tollgate_core::idempotency::{
    ClaimReply, ClaimRequest, IdempotencyBackend, IdempotencyStore, IdempotencyStoreBuilder,
    RecordKeys, StoredResponse,
};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, ReleaseEvents};
use tollgate_core::{BackendError, FencingToken, LockBackend, MemoryBackend, RedisBackend, Result};
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
    builder(kind).await.build().unwrap()
}

/// A store builder over a fresh backend of `kind`.
pub async fn builder(kind: Kind) -> IdempotencyStoreBuilder {
    match kind {
        Kind::Memory => IdempotencyStore::builder(MemoryBackend::new()),
        Kind::Redis => IdempotencyStore::builder(
            RedisBackend::connect(&super::shared_redis().url())
                .await
                .unwrap(),
        ),
        Kind::Cluster => IdempotencyStore::builder(
            RedisBackend::connect_cluster(super::shared_cluster().seeds())
                .await
                .unwrap(),
        ),
    }
}

/// A store on `kind` whose first `failures` completions fail as an outage
/// (a reset connection) without reaching the backend, and the counter of
/// completions sent.
pub async fn failing_completes(
    kind: Kind,
    failures: usize,
) -> (IdempotencyStore, Arc<AtomicUsize>) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let store = match kind {
        Kind::Memory => faulty(MemoryBackend::new(), failures, &attempts),
        Kind::Redis => faulty(
            RedisBackend::connect(&super::shared_redis().url())
                .await
                .unwrap(),
            failures,
            &attempts,
        ),
        Kind::Cluster => faulty(
            RedisBackend::connect_cluster(super::shared_cluster().seeds())
                .await
                .unwrap(),
            failures,
            &attempts,
        ),
    };
    (store, attempts)
}

fn faulty<B: IdempotencyBackend>(
    inner: B,
    failures: usize,
    attempts: &Arc<AtomicUsize>,
) -> IdempotencyStore {
    let backend = FailingCompletes {
        inner,
        failures: AtomicUsize::new(failures),
        attempts: Arc::clone(attempts),
    };
    IdempotencyStore::new(backend)
}

/// A real backend whose first completions fail; everything else goes
/// straight through.
#[derive(Debug)]
struct FailingCompletes<B> {
    inner: B,
    failures: AtomicUsize,
    attempts: Arc<AtomicUsize>,
}

impl<B: LockBackend> LockBackend for FailingCompletes<B> {
    fn acquire_lock<'a>(&'a self, r: &'a AcquireRequest) -> BoxFuture<'a, Result<AcquireReply>> {
        self.inner.acquire_lock(r)
    }
    fn release_lock<'a>(&'a self, k: &'a LockKeys, t: &'a str) -> BoxFuture<'a, Result<bool>> {
        self.inner.release_lock(k, t)
    }
    fn extend_lock<'a>(
        &'a self,
        k: &'a LockKeys,
        t: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.inner.extend_lock(k, t, ttl)
    }
    fn raise_fence<'a>(
        &'a self,
        k: &'a LockKeys,
        t: &'a str,
        f: FencingToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.inner.raise_fence(k, t, f, ttl)
    }
    fn release_events(&self, prefix: &str) -> Option<BoxFuture<'static, Result<ReleaseEvents>>> {
        self.inner.release_events(prefix)
    }
    fn local_lock(&self) -> Arc<dyn LockBackend> {
        self.inner.local_lock()
    }
    fn lock_kind(&self) -> &'static str {
        self.inner.lock_kind()
    }
}

impl<B: IdempotencyBackend> IdempotencyBackend for FailingCompletes<B> {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<ClaimReply>> {
        self.inner.claim(request)
    }

    fn complete<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
        response: &'a StoredResponse,
        record_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            let e = BackendError::outage("connection reset by peer");
            return futures::future::ready(Err(e.into())).boxed();
        }
        self.inner
            .complete(keys, token, fence, response, record_ttl)
    }

    fn abandon<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<bool>> {
        self.inner.abandon(keys, token, fence)
    }
}

/// Sends `req` and collects the whole response, each within [`BOUND`].
pub async fn collect(app: &Router, req: Request<Body>) -> (StatusCode, HeaderMap, Bytes) {
    let (head, body, _) = collect_whole(app, req).await;
    (head.status, head.headers, body)
}

/// [`collect`], with the response's whole head and its trailers (empty
/// when it has none).
pub async fn collect_whole(
    app: &Router,
    req: Request<Body>,
) -> (http::response::Parts, Bytes, HeaderMap) {
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req))
        .await
        .expect("bounded")
        .unwrap();
    let (head, body) = res.into_parts();
    let body = tokio::time::timeout(BOUND, body.collect())
        .await
        .expect("bounded")
        .unwrap();
    let trailers = body.trailers().cloned().unwrap_or_default();
    (head, body.to_bytes(), trailers)
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
