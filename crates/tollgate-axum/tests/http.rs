//! The extractors through a real `axum::serve` on a loopback port and a real
//! HTTP client, against the memory backend, a standalone Redis and a Redis
//! Cluster (real `redis-server` processes, no mocks): locks here, rate limits
//! in `http_rate.rs`, the app both serve in `common/`.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_axum::{Rejection, RejectionReason};
use tollgate_core::{LockOptions, Locker, MemoryBackend, RedisBackend, Subject};
use tollgate_testkit::http::loopback::post as post_;
use tollgate_testkit::http::retry_after;
use tollgate_testkit::{RedisCluster, RedisServer};

use common::{memory_limiter, memory_locker, problem_detail, serve, Watched};

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
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert_eq!(
        problem_detail(&r),
        // The same words as a LockLayer's 409 (one rejection model).
        format!("resource is busy; retry in {ra} s")
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
    // The client goes away; the server's closing the connection (read as
    // its end) says it saw that and dropped the request, waiter and all.
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .expect("the server closes the connection")
        .unwrap();
    assert!(
        rest.is_empty(),
        "answered: {:?}",
        String::from_utf8_lossy(&rest)
    );
    // A bounded negative check: a waiter that was not cancelled would have
    // the lock within 300 ms of the release (it is woken at once).
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
    let detail = problem_detail(&r);
    assert!(
        detail.starts_with("tollgate is misconfigured: "),
        "{detail}"
    );
    assert!(detail.contains("TTL") || detail.contains("ttl"), "{detail}");
    // A route without the parameter the resource is named after.
    let r = post_(srv.addr, "/noparam").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.body);
}

// ------------------------------------------------------------ memory tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_concurrent_requests_are_serialized() {
    concurrent_requests_are_serialized(memory_locker()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_busy_is_409() {
    busy_is_409(Watched::new(Arc::new(MemoryBackend::new()))).await;
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
    disconnect_while_waiting_takes_nothing(Watched::new(Arc::new(MemoryBackend::new()))).await;
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
    busy_is_409(Watched::new(Arc::new(
        RedisBackend::connect(&server.url()).await.unwrap(),
    )))
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
    disconnect_while_waiting_takes_nothing(Watched::new(Arc::new(
        RedisBackend::connect(&server.url()).await.unwrap(),
    )))
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
    let watched = Watched::new(Arc::new(backend));
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
    assert_eq!(problem_detail(&r), "lock service unavailable");

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
