//! The quickstart's contract, end to end: the example's own router
//! (`examples/quickstart/app.rs`) served by `axum::serve` on loopback ports,
//! called by a real HTTP client, on the memory backend, a standalone Redis
//! and a Redis Cluster (real `redis-server` processes, no mocks).
//!
//! The contract (README): `GET /` → 200 `hello`, limited per client IP by a
//! token bucket of capacity 5 refilled one token every 2 s, shared by every
//! instance on one backend, with `RateLimit-Policy` / `RateLimit` headers
//! and 429 + `Retry-After` (whole seconds, ≥ 1) + a quota-exceeded
//! problem+json body; `POST /jobs/{id}` → holds
//! the job's lock for 500 ms and answers `{"job":"<id>","fence":<n>}`, 409 +
//! `Retry-After` while held by any instance, fences strictly increasing
//! across instances and Redis restarts; Redis down → `GET /` still answers
//! within the limiter's timeout, `POST` answers 503, and both recover when
//! Redis is back.

#[allow(dead_code)]
#[path = "../examples/quickstart/app.rs"]
mod app;
mod common;
#[allow(dead_code)]
#[path = "../examples/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use tokio::net::TcpListener;
use tollgate::{MemoryBackend, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};

use common::{
    assert_hello, check_down, check_jobs, check_rate_limit, check_recovered, eventually, get,
    job_fence, post,
};

/// One running instance of the quickstart.
struct Instance {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(router: Router) -> Instance {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        support::serve(listener, router).await.unwrap();
    });
    Instance { addr, task }
}

// ------------------------------------------------------------------ memory

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_rate_limit_per_ip_shared_by_instances() {
    let backend = MemoryBackend::new();
    let (a, b) = (
        start(app::router(backend.clone())).await,
        start(app::router(backend)).await,
    );
    check_rate_limit(a.addr, b.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_jobs_are_locked_and_fenced() {
    let backend = MemoryBackend::new();
    let (a, b) = (
        start(app::router(backend.clone())).await,
        start(app::router(backend)).await,
    );
    check_jobs(a.addr, b.addr).await;
}

// ------------------------------------------------------------------- redis

/// An instance as the example makes it for `REDIS_URL`: its own lazily
/// connected backend.
fn redis_backend(server: &RedisServer) -> Router {
    app::router(RedisBackend::connect_lazy(&server.url()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rate_limit_per_ip_shared_by_instances() {
    let server = RedisServer::start().unwrap();
    let a = start(redis_backend(&server)).await;
    let b = start(redis_backend(&server)).await;
    check_rate_limit(a.addr, b.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_jobs_are_locked_and_fenced() {
    let server = RedisServer::start().unwrap();
    let a = start(redis_backend(&server)).await;
    let b = start(redis_backend(&server)).await;
    check_jobs(a.addr, b.addr).await;
}

/// Fences keep increasing after Redis restarts without persistence (all
/// lock state lost), on both instances, without restarting them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fences_increase_across_restart() {
    let mut server = RedisServer::start().unwrap();
    let a = start(redis_backend(&server)).await;
    let b = start(redis_backend(&server)).await;
    let f1 = job_fence(&post(a.addr, "/jobs/r").await, "r");
    let f2 = job_fence(&post(b.addr, "/jobs/r").await, "r");
    assert!(f1 < f2);

    server.restart().unwrap();
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "0", "the data is gone");

    let post_ok = |addr: SocketAddr| async move {
        let r = post(addr, "/jobs/r").await;
        (r.status == StatusCode::OK).then(|| job_fence(&r, "r"))
    };
    let f3 = eventually(Duration::from_secs(10), "b recovers", || post_ok(b.addr)).await;
    let f4 = eventually(Duration::from_secs(10), "a recovers", || post_ok(a.addr)).await;
    assert!(
        f2 < f3 && f3 < f4,
        "fences must keep increasing: {f2} {f3} {f4}"
    );
    // And the limit works again (a fresh bucket: the data was lost).
    let r = get(a.addr, "/").await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_get_answers_post_503_then_recovers() {
    let server = RedisServer::start().unwrap();
    let a = start(redis_backend(&server)).await;
    assert_hello(&get(a.addr, "/").await, 4);
    job_fence(&post(a.addr, "/jobs/warm").await, "warm");

    server.pause();
    check_down(a.addr).await;
    server.resume();
    check_recovered(a.addr, "after-pause").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_get_answers_post_503_then_recovers() {
    let mut server = RedisServer::start().unwrap();
    let a = start(redis_backend(&server)).await;
    assert_hello(&get(a.addr, "/").await, 4);
    job_fence(&post(a.addr, "/jobs/warm").await, "warm");

    server.stop();
    check_down(a.addr).await;
    server.restart().unwrap();
    check_recovered(a.addr, "after-stop").await;
}

/// The example starts while Redis is down (lazy connection) and works once
/// Redis comes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_starts_while_redis_is_down() {
    let mut server = RedisServer::start().unwrap();
    server.stop();
    let a = start(redis_backend(&server)).await;
    check_down(a.addr).await;
    server.restart().unwrap();
    check_recovered(a.addr, "late").await;
}

// ----------------------------------------------------------------- cluster

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_contract() {
    let cluster = RedisCluster::start().unwrap();
    let backend = || async {
        app::router(
            RedisBackend::connect_cluster(cluster.seeds())
                .await
                .unwrap(),
        )
    };
    let a = start(backend().await).await;
    let b = start(backend().await).await;
    check_rate_limit(a.addr, b.addr).await;
    check_jobs(a.addr, b.addr).await;
}
