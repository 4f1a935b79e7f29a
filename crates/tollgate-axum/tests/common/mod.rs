//! The app `http.rs` and `http_rate.rs` serve on a loopback port: lock
//! resources, handlers, routes, the running server, and a lock backend that
//! counts refused acquires ([`Watched`]).
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{FromRef, Path, State};
use axum::routing::{get, post};
use axum::Router;
use http::request::Parts;
use tollgate_axum::{HeldLock, LockResource, RateLimitPolicy, RateLimitStatus, RateLimited};
use tollgate_core::{Algorithm, LockOptions, Locker, MemoryBackend, Quota, RateLimiter, Subject};
use tollgate_testkit::http::Reply;
use tollgate_tower::key::{KeyError, PathParam};
use tollgate_tower::RateLimitLayer;

/// The `detail` of a rejection's body, after checking the body is an
/// `about:blank` problem document of the reply's status.
pub(crate) fn problem_detail(r: &Reply) -> String {
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"));
    assert_eq!(v["type"], "about:blank", "{v}");
    assert_eq!(v["title"], r.status.canonical_reason().unwrap(), "{v}");
    assert_eq!(v["status"], r.status.as_u16(), "{v}");
    let detail = v["detail"].as_str();
    detail
        .unwrap_or_else(|| panic!("no detail in {v}"))
        .to_owned()
}

// ---------------------------------------------------------------- resources

/// `job:{id}`: the lock of the job the path names.
type JobKey = (Subject, PathParam);

fn job_key() -> JobKey {
    (Subject::new("job"), PathParam::new("id"))
}

/// Waits up to 10 s for the lock.
struct Waiting;

impl<S: Send + Sync> LockResource<S> for Waiting {
    type Key = JobKey;
    fn key(_: &S) -> JobKey {
        job_key()
    }
    fn options(_: &S) -> LockOptions {
        LockOptions::new()
            .ttl(Duration::from_secs(5))
            .wait(Duration::from_secs(10))
    }
}

/// Never waits: busy → 409. A 30 s TTL, so a test that gets the lock back
/// quickly proves it was released, not expired.
struct NoWait;

impl<S: Send + Sync> LockResource<S> for NoWait {
    type Key = JobKey;
    fn key(_: &S) -> JobKey {
        job_key()
    }
    fn options(_: &S) -> LockOptions {
        LockOptions::new().ttl(Duration::from_secs(30))
    }
}

/// A short lease that is not renewed: lost after 300 ms.
struct Short;

impl<S: Send + Sync> LockResource<S> for Short {
    type Key = JobKey;
    fn key(_: &S) -> JobKey {
        job_key()
    }
    fn options(_: &S) -> LockOptions {
        LockOptions::new()
            .ttl(Duration::from_millis(300))
            .renew(false)
    }
}

/// A TTL the drift allowance leaves nothing of: a configuration error.
struct BadOptions;

impl<S: Send + Sync> LockResource<S> for BadOptions {
    type Key = JobKey;
    fn key(_: &S) -> JobKey {
        job_key()
    }
    fn options(_: &S) -> LockOptions {
        LockOptions::new().ttl(Duration::from_millis(1))
    }
}

// -------------------------------------------------------------------- app

#[derive(Default)]
pub(crate) struct Probe {
    pub(crate) active: AtomicUsize,
    pub(crate) max_active: AtomicUsize,
    /// Fences in the order the handlers ran.
    pub(crate) fences: Mutex<Vec<u64>>,
}

#[derive(Clone, FromRef)]
struct AppState {
    locker: Locker,
    probe: Arc<Probe>,
    limiter: RateLimiter,
}

fn ms(params: &HashMap<String, String>) -> u64 {
    params.get("ms").and_then(|m| m.parse().ok()).unwrap_or(0)
}

async fn guarded<R>(
    lock: HeldLock<R>,
    Path(params): Path<HashMap<String, String>>,
    State(probe): State<Arc<Probe>>,
) -> String {
    let now = probe.active.fetch_add(1, Ordering::SeqCst) + 1;
    probe.max_active.fetch_max(now, Ordering::SeqCst);
    probe.fences.lock().unwrap().push(lock.fence().get());
    tokio::time::sleep(Duration::from_millis(ms(&params))).await;
    probe.active.fetch_sub(1, Ordering::SeqCst);
    lock.fence().to_string()
}

/// Works until the lease is lost, then says so.
async fn until_lost(lock: HeldLock<Short>) -> String {
    tokio::select! {
        _ = lock.lost() => format!("lost {}", lock.is_held()),
        _ = tokio::time::sleep(Duration::from_secs(5)) => "not lost".to_owned(),
    }
}

async fn panics(_lock: HeldLock<NoWait>) -> &'static str {
    panic!("handler panics while holding the lock (expected by the test)");
}

async fn release_early(lock: HeldLock<NoWait>) -> String {
    let fence = lock.fence();
    let was_ours = lock.release().await.unwrap();
    format!("{fence} {was_ours}")
}

/// Limited per `x-user` header, 2 per minute.
struct PerUser;

/// The `x-user` header, or 400.
fn user(parts: &Parts) -> Result<Option<Subject>, KeyError> {
    parts
        .headers
        .get("x-user")
        .map(|v| Some(Subject::new(v.as_bytes())))
        .ok_or_else(|| KeyError::bad_request("missing x-user header"))
}

type UserKey = fn(&Parts) -> Result<Option<Subject>, KeyError>;

impl RateLimitPolicy<AppState> for PerUser {
    type Key = UserKey;
    fn limiter(state: &AppState) -> RateLimiter {
        state.limiter.clone()
    }
    fn key(_: &AppState) -> UserKey {
        user
    }
}

/// Like `PerUser`, each request costing `x-cost` units.
struct Bulk;

impl RateLimitPolicy<AppState> for Bulk {
    fn limiter(state: &AppState) -> RateLimiter {
        state.limiter.clone()
    }
    type Key = UserKey;
    fn key(_: &AppState) -> UserKey {
        user
    }
    fn cost(parts: &Parts, _: &AppState) -> u64 {
        parts
            .headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    }
}

async fn bulk(l: RateLimited<Bulk>) -> String {
    format!("left {}", l.remaining())
}

async fn limited(l: RateLimited<PerUser>) -> (RateLimited<PerUser>, String) {
    let left = l.remaining();
    (l, format!("left {left}"))
}

async fn status(s: RateLimitStatus) -> String {
    format!("remaining {}", s.remaining())
}

async fn maybe_status(s: Option<RateLimitStatus>) -> String {
    format!("{:?}", s.map(|s| s.remaining()))
}

fn app(locker: Locker, limiter: RateLimiter) -> (Router, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    let state = AppState {
        locker,
        probe: probe.clone(),
        limiter,
    };
    let layered = Router::new()
        .route("/status", get(status))
        .layer(RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::TokenBucket)
                .quota(Quota::per_minute(3))
                .name("layered")
                .build()
                .unwrap(),
        ));
    let router = Router::new()
        .route("/wait/{id}/{ms}", post(guarded::<Waiting>))
        .route("/nowait/{id}/{ms}", post(guarded::<NoWait>))
        .route("/panic/{id}", post(panics))
        .route("/short/{id}", post(until_lost))
        .route("/release/{id}", post(release_early))
        .route("/bad/{id}", post(guarded::<BadOptions>))
        .route("/noparam", post(guarded::<NoWait>))
        .route("/limited", get(limited))
        .route("/bulk", get(bulk))
        .route("/maybe", get(maybe_status))
        .route("/unlayered", get(status))
        .with_state(state)
        .merge(layered);
    (router, probe)
}

pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) probe: Arc<Probe>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn serve(locker: Locker, limiter: RateLimiter) -> Running {
    let (router, probe) = app(locker, limiter);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    Running { addr, probe, task }
}

pub(crate) fn memory_limiter() -> RateLimiter {
    RateLimiter::token_bucket(MemoryBackend::new(), Quota::per_minute(2)).unwrap()
}

#[path = "../../../tollgate-core/tests/lock_common/watched.rs"]
mod watched;
#[allow(unused_imports)]
pub(crate) use watched::Watched;

pub(crate) fn memory_locker() -> Locker {
    Locker::new(MemoryBackend::new())
}
