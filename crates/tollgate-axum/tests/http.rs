//! The extractors through a real `axum::serve` on a loopback port and a real
//! HTTP client, against the memory backend, a standalone Redis and a Redis
//! Cluster (real `redis-server` processes, no mocks).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRef, Path, State};
use axum::routing::{get, post};
use axum::Router;
use futures::future::{BoxFuture, FutureExt};
use http::request::Parts;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_axum::{
    HeldLock, LockResource, RateLimitPolicy, RateLimitStatus, RateLimited, Rejection,
    RejectionReason,
};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, ReleaseEvents};
use tollgate_core::{
    Algorithm, FailurePolicy, FencingToken, LockBackend, LockOptions, Locker, MemoryBackend, Quota,
    RateLimiter, RedisBackend, Subject,
};
use tollgate_testkit::http::loopback::{post as post_, send};
use tollgate_testkit::http::retry_after;
use tollgate_testkit::{RedisCluster, RedisServer};
use tollgate_tower::key::{KeyError, PathParam};
use tollgate_tower::RateLimitLayer;

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
struct Probe {
    active: AtomicUsize,
    max_active: AtomicUsize,
    /// Fences in the order the handlers ran.
    fences: Mutex<Vec<u64>>,
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

struct Running {
    addr: SocketAddr,
    probe: Arc<Probe>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(locker: Locker, limiter: RateLimiter) -> Running {
    let (router, probe) = app(locker, limiter);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    Running { addr, probe, task }
}

fn memory_limiter() -> RateLimiter {
    RateLimiter::token_bucket(MemoryBackend::new(), Quota::per_minute(2)).unwrap()
}

/// A lock backend that forwards to another and counts the acquires it
/// answered "held": a test waits for a waiter's refused attempt (it then
/// waits for the lock) instead of sleeping and hoping it got that far.
#[derive(Debug, Clone)]
struct Watched {
    inner: Arc<dyn LockBackend>,
    refused: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Watched {
    fn new(inner: impl LockBackend) -> Self {
        Watched {
            inner: Arc::new(inner),
            refused: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// Waits (up to 10 s) until at least `n` acquires were refused.
    async fn refused(&self, n: u64) {
        let mut rx = self.refused.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&c| c >= n))
            .await
            .unwrap_or_else(|_| panic!("{} acquires refused, not {n}", self.refusals()))
            .unwrap();
    }

    fn refusals(&self) -> u64 {
        *self.refused.borrow()
    }
}

impl LockBackend for Watched {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.inner.acquire_lock(request).await;
            if let Ok(AcquireReply::Held { .. }) = reply {
                self.refused.send_modify(|c| *c += 1);
            }
            reply
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.release_lock(keys, token)
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.extend_lock(keys, token, ttl)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, tollgate_core::Result<ReleaseEvents>>> {
        self.inner.release_events(channel_prefix)
    }

    fn lock_kind(&self) -> &'static str {
        self.inner.lock_kind()
    }
}

// ------------------------------------------------------------------ checks

/// Concurrent requests on one resource run one at a time, and every holder
/// gets a larger fence than the one before.
async fn concurrent_requests_are_serialized(locker: Locker) {
    let srv = serve(locker, memory_limiter()).await;
    let n = 5;
    let started = Instant::now();
    let replies =
        futures::future::join_all((0..n).map(|_| post_(srv.addr, "/wait/serial/100"))).await;
    for r in &replies {
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    assert_eq!(
        srv.probe.max_active.load(Ordering::SeqCst),
        1,
        "two handlers held the lock at once"
    );
    assert!(started.elapsed() >= Duration::from_millis(100 * n as u64));
    let fences = srv.probe.fences.lock().unwrap().clone();
    assert_eq!(fences.len(), n);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase: {fences:?}"
    );
    // A different resource is not serialized with this one.
    let other = post_(srv.addr, "/nowait/other/0").await;
    assert_eq!(other.status, StatusCode::OK);
    assert!(other.body.parse::<u64>().unwrap() > 0);
}

/// A held resource is answered 409 with `Retry-After` and a text body.
async fn busy_is_409(watched: Watched) {
    let locker = Locker::new(watched.clone());
    let srv = serve(locker.clone(), memory_limiter()).await;
    let held = locker
        .try_acquire(
            Subject::compound(["job", "busy"]),
            &LockOptions::new().ttl(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    let r = post_(srv.addr, "/nowait/busy/0").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let ra = retry_after(&r);
    assert!((1..=20).contains(&ra), "Retry-After {ra}");
    assert_eq!(r.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(
        r.body,
        // The same words as a LockLayer's 409 (one rejection model).
        format!("resource is busy; retry in {ra} s\n")
    );
    // A waiting resource gets it as soon as the holder releases: released
    // once the waiter was refused, so it waits.
    let refused = watched.refusals();
    let waiter = tokio::spawn({
        let addr = srv.addr;
        async move { post_(addr, "/wait/busy/0").await }
    });
    watched.refused(refused + 1).await;
    assert!(!waiter.is_finished(), "answered while the lock was held");
    let fence = held.fence().get();
    assert!(held.release().await.unwrap());
    let r = waiter.await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.parse::<u64>().unwrap() > fence);
}

/// Polls `path` until it is answered 200, within `within` (much less than the
/// 30 s TTL, so success means the lock was released, not expired).
async fn acquires_again(addr: SocketAddr, path: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let r = post_(addr, path).await;
        if r.status == StatusCode::OK {
            return start.elapsed();
        }
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
        assert!(
            start.elapsed() < within,
            "the lock was not released within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A client that disconnects mid-request cancels the handler, and dropping
/// the guard releases the lock: the next request gets it at once, long
/// before the 30 s TTL.
async fn disconnect_releases_lock(locker: Locker) {
    let srv = serve(locker, memory_limiter()).await;
    let mut stream = TcpStream::connect(srv.addr).await.unwrap();
    stream
        .write_all(b"POST /nowait/gone/20000 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    // Wait until the handler holds the lock.
    let start = Instant::now();
    while srv.probe.active.load(Ordering::SeqCst) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "handler never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = post_(srv.addr, "/nowait/gone/0").await;
    assert_eq!(r.status, StatusCode::CONFLICT, "the lock is held meanwhile");
    // The client goes away.
    drop(stream);
    acquires_again(srv.addr, "/nowait/gone/0", Duration::from_secs(3)).await;
}

/// A client that goes away while its request waits for the lock takes
/// nothing: when the holder releases, the lock is free.
async fn disconnect_while_waiting_takes_nothing(watched: Watched) {
    let locker = Locker::new(watched.clone());
    let srv = serve(locker.clone(), memory_limiter()).await;
    let name = Subject::compound(["job", "queued"]);
    let held = locker
        .try_acquire(name.clone(), &LockOptions::new())
        .await
        .unwrap();
    let mut stream = TcpStream::connect(srv.addr).await.unwrap();
    stream
        .write_all(b"POST /wait/queued/0 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    // The request waits for the lock once it was refused.
    watched.refused(1).await;
    drop(stream);
    // Bounded negative checks: the server sees the disconnect well within
    // 200 ms, and a waiter that was not cancelled would have the lock within
    // 300 ms of the release (it is woken at once).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(held.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        srv.probe.fences.lock().unwrap().len(),
        0,
        "the cancelled request never ran"
    );
    let again = locker.try_acquire(name, &LockOptions::new()).await;
    assert!(again.is_ok(), "the lock is free: {again:?}");
}

/// `lost()` resolves when the lease runs out, and the handler sees it.
async fn lost_is_observable(locker: Locker) {
    let srv = serve(locker, memory_limiter()).await;
    let r = post_(srv.addr, "/short/s").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "lost false");
}

/// A handler that panics drops its guard while unwinding: released.
async fn panic_releases_lock(locker: Locker) {
    let srv = serve(locker, memory_limiter()).await;
    let mut stream = TcpStream::connect(srv.addr).await.unwrap();
    stream
        .write_all(b"POST /panic/p HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    // The server closes the connection without a response.
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf)).await;
    acquires_again(srv.addr, "/nowait/p/0", Duration::from_secs(3)).await;
}

/// `release().await` inside the handler reports `true` and frees the lock.
async fn explicit_release(locker: Locker) {
    let srv = serve(locker, memory_limiter()).await;
    let r = post_(srv.addr, "/release/r").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.ends_with(" true"), "{}", r.body);
    let r = post_(srv.addr, "/nowait/r/0").await;
    assert_eq!(r.status, StatusCode::OK);
}

/// Misconfiguration is a 500 whose message says what to fix.
async fn misconfiguration_is_500(locker: Locker) {
    let srv = serve(locker, memory_limiter()).await;
    let r = post_(srv.addr, "/bad/x").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        r.body.starts_with("tollgate is misconfigured: "),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("TTL") || r.body.contains("ttl"),
        "{}",
        r.body
    );
    // A route without the parameter the resource is named after.
    let r = post_(srv.addr, "/noparam").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.body);
}

// ------------------------------------------------------------ memory tests

fn memory_locker() -> Locker {
    Locker::new(MemoryBackend::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_concurrent_requests_are_serialized() {
    concurrent_requests_are_serialized(memory_locker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_busy_is_409() {
    busy_is_409(Watched::new(MemoryBackend::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_disconnect_releases_lock() {
    disconnect_releases_lock(memory_locker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_panic_releases_lock() {
    panic_releases_lock(memory_locker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_explicit_release() {
    explicit_release(memory_locker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_misconfiguration_is_500() {
    misconfiguration_is_500(memory_locker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_disconnect_while_waiting_takes_nothing() {
    disconnect_while_waiting_takes_nothing(Watched::new(MemoryBackend::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_lost_is_observable() {
    lost_is_observable(memory_locker()).await;
}

// ------------------------------------------------------------- redis tests

async fn redis_locker(server: &RedisServer) -> Locker {
    Locker::new(RedisBackend::connect(&server.url()).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_requests_are_serialized() {
    let server = RedisServer::start().unwrap();
    concurrent_requests_are_serialized(redis_locker(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_busy_is_409() {
    let server = RedisServer::start().unwrap();
    busy_is_409(Watched::new(
        RedisBackend::connect(&server.url()).await.unwrap(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_disconnect_releases_lock() {
    let server = RedisServer::start().unwrap();
    disconnect_releases_lock(redis_locker(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_panic_releases_lock() {
    let server = RedisServer::start().unwrap();
    panic_releases_lock(redis_locker(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_explicit_release() {
    let server = RedisServer::start().unwrap();
    explicit_release(redis_locker(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_misconfiguration_is_500() {
    let server = RedisServer::start().unwrap();
    misconfiguration_is_500(redis_locker(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_disconnect_while_waiting_takes_nothing() {
    let server = RedisServer::start().unwrap();
    disconnect_while_waiting_takes_nothing(Watched::new(
        RedisBackend::connect(&server.url()).await.unwrap(),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_is_observable() {
    let server = RedisServer::start().unwrap();
    lost_is_observable(redis_locker(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_locks_serialize_and_release() {
    let cluster = RedisCluster::start().unwrap();
    let backend = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    let watched = Watched::new(backend);
    let locker = Locker::new(watched.clone());
    concurrent_requests_are_serialized(locker.clone()).await;
    busy_is_409(watched).await;
    disconnect_releases_lock(locker).await;
}

/// Redis down: the acquire is bounded and answered 503 with `Retry-After`;
/// once Redis is back, the same locker works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unavailable_is_503_and_recovers() {
    let mut server = RedisServer::start().unwrap();
    let srv = serve(redis_locker(&server).await, memory_limiter()).await;
    assert_eq!(post_(srv.addr, "/nowait/u/0").await.status, StatusCode::OK);

    server.pause();
    let start = Instant::now();
    let r = post_(srv.addr, "/nowait/u/0").await;
    server.resume();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "the acquire must be bounded"
    );
    assert_eq!(retry_after(&r), 1);
    // The same words as a LockLayer's 503 (one rejection model).
    assert_eq!(r.body, "lock service unavailable\n");

    server.stop();
    let r = post_(srv.addr, "/nowait/u2/0").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);

    server.restart().unwrap();
    let start = Instant::now();
    loop {
        let r = post_(srv.addr, "/nowait/u3/0").await;
        if r.status == StatusCode::OK {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no recovery: {} {}",
            r.status,
            r.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ------------------------------------------------------------ rate limits

/// `RateLimited<P>`: admitted with headers, then 429 with `Retry-After`,
/// the draft-10 headers and a text body; a missing key is 400.
async fn handler_rate_limit(limiter: RateLimiter) {
    let srv = serve(memory_locker(), limiter).await;
    let user = [("x-user", "ann")];
    let r = send(srv.addr, Method::GET, "/limited", &user).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "left 1");
    let policy = r.headers["ratelimit-policy"].to_str().unwrap().to_owned();
    assert!(policy.ends_with(";q=2;w=60"), "{policy}");
    assert!(
        r.headers["ratelimit"].to_str().unwrap().contains(";r=1;t="),
        "{:?}",
        r.headers["ratelimit"]
    );
    let r = send(srv.addr, Method::GET, "/limited", &user).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "left 0");

    let r = send(srv.addr, Method::GET, "/limited", &user).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let ra = retry_after(&r);
    assert!((1..=30).contains(&ra), "Retry-After {ra}");
    assert_eq!(r.headers["content-type"], "application/problem+json");
    let name = policy.split(';').next().unwrap();
    assert_eq!(
        r.body,
        format!(
            concat!(
                r#"{{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
                r#""title":"Request cannot be satisfied as assigned quota has been exceeded","#,
                r#""status":429,"detail":"rate limit exceeded; retry in {ra} s","#,
                r#""violated-policies":[{name}]}}"#
            ),
            ra = ra,
            name = name
        )
    );
    assert_eq!(r.headers["ratelimit-policy"].to_str().unwrap(), policy);
    assert!(r.headers["ratelimit"].to_str().unwrap().contains(";r=0;t="));

    // Another key has its own budget.
    let r = send(srv.addr, Method::GET, "/limited", &[("x-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::OK);
    // No key: 400.
    let r = send(srv.addr, Method::GET, "/limited", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body, "missing x-user header\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_handler_rate_limit() {
    handler_rate_limit(memory_limiter()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_handler_rate_limit() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    handler_rate_limit(RateLimiter::token_bucket(backend, Quota::per_minute(2)).unwrap()).await;
}

/// Under `FailurePolicy::Deny`, a dead backend is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_handler_rate_limit_deny_policy_is_503() {
    let mut server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let limiter = RateLimiter::builder(backend, tollgate_core::Algorithm::TokenBucket)
        .quota(Quota::per_minute(2))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let srv = serve(memory_locker(), limiter).await;
    server.stop();
    let r = send(srv.addr, Method::GET, "/limited", &[("x-user", "ann")]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
}

/// A cost the limit can never admit is 413, answered as a `RateLimitLayer`
/// answers it (status, body, `RateLimit-Policy`, no `Retry-After`), and
/// spends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_beyond_capacity_is_413_like_the_layer() {
    use tower::ServiceExt;

    let limiter = memory_limiter();
    let srv = serve(memory_locker(), limiter.clone()).await;
    let r = send(
        srv.addr,
        Method::GET,
        "/bulk",
        &[("x-user", "ann"), ("x-cost", "5")],
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert_eq!(
        r.body,
        "request cost 5 exceeds the rate limit's capacity 2; it can never be admitted\n"
    );
    assert!(!r.headers.contains_key("retry-after"));
    assert!(!r.headers.contains_key("ratelimit"));
    // Nothing was spent.
    let ok = send(
        srv.addr,
        Method::GET,
        "/bulk",
        &[("x-user", "ann"), ("x-cost", "2")],
    )
    .await;
    assert_eq!((ok.status, ok.body.as_str()), (StatusCode::OK, "left 0"));

    // The layer over the same limiter answers the same.
    let layered = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter).cost(5));
    let res = layered
        .oneshot(Request::get("/").body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), r.status);
    for name in ["content-type", "ratelimit-policy"] {
        assert_eq!(res.headers().get(name), r.headers.get(name), "{name}");
    }
    assert!(r.headers.contains_key("ratelimit-policy"));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, r.body.as_bytes());
}

/// `RateLimitStatus` reads what the layer decided; without the layer it is
/// a 500 naming the layer, and `Option<RateLimitStatus>` is `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_decision_is_readable() {
    let srv = serve(memory_locker(), memory_limiter()).await;
    let r = send(srv.addr, Method::GET, "/status", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "remaining 2");
    assert_eq!(r.headers["ratelimit"], r#""layered";r=2;t=20"#);
    let r = send(srv.addr, Method::GET, "/status", &[]).await;
    assert_eq!(r.body, "remaining 1");

    let r = send(srv.addr, Method::GET, "/unlayered", &[]).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.body.contains("RateLimitLayer"), "{}", r.body);
    let r = send(srv.addr, Method::GET, "/maybe", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "None");
}

#[test]
fn rejection_reasons_map_to_statuses() {
    use tollgate_tower::rejection::Middleware;

    let busy = Rejection::busy(Some(Duration::from_millis(2500)));
    assert_eq!(busy.reason(), RejectionReason::Busy);
    assert_eq!(busy.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    let down = Rejection::from_error(Middleware::Lock, tollgate_core::Error::CircuitOpen);
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bad = Rejection::from_error(
        Middleware::RateLimit,
        tollgate_core::Error::InvalidConfig("x".into()),
    );
    assert_eq!(bad.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let too_costly = Rejection::from_error(
        Middleware::RateLimit,
        tollgate_core::Error::CostExceedsCapacity {
            cost: 7,
            capacity: 3,
        },
    );
    assert_eq!(
        too_costly.reason(),
        RejectionReason::CostExceedsCapacity {
            cost: 7,
            capacity: 3
        }
    );
    assert_eq!(too_costly.status(), StatusCode::PAYLOAD_TOO_LARGE);
}
