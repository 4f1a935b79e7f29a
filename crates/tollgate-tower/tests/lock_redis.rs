//! The LockLayer suite on a real standalone Redis, plus the faults only a
//! real server has: paused (SIGSTOP) mid-request, and down.

mod common;

lock_suite!(common::lock_redis);

use std::time::Duration;

use http::StatusCode;
use tollgate_core::{LockOptions, Locker, RedisBackend};
use tollgate_testkit::RedisServer;
use tollgate_tower::LockLayer;

use common::lock_suite::{app, key, req, resource, ProbeRx, BOUND};

/// Redis frozen (SIGSTOP) while a request holds the lock: renewals cannot
/// succeed, the lease's safe deadline passes, the handler is dropped before
/// it finishes, and the request is answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_mid_request_cancels_the_handler() {
    let server = RedisServer::start().unwrap();
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let mut p = ProbeRx::new();
    let app = app(
        LockLayer::new(locker, key()).options(LockOptions::new().ttl(Duration::from_secs(1))),
        p.probe.clone(),
    );
    let r = resource("pause");
    let a = {
        let app = app.clone();
        tokio::spawn(async move { common::send(&app, req("/work", &r, "a", true)).await })
    };
    p.wait_entered("a").await;
    server.pause();
    let a = tokio::time::timeout(BOUND, a)
        .await
        .expect("never answered")
        .unwrap();
    server.resume();
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(p.running(), 0, "the handler was not dropped");
    p.probe.gate.add_permits(10);
    assert_eq!(p.events(), ["start a"], "the handler must never finish");
}

/// Redis down: 503, never a hang; back up: locks work again without a
/// restart of the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_503_and_recovers() {
    let mut server = RedisServer::start().unwrap();
    let locker = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let p = ProbeRx::new();
    let app = app(LockLayer::new(locker, key()), p.probe.clone());
    let r = resource("down");
    assert_eq!(
        common::send(&app, req("/work", &r, "a", false))
            .await
            .status,
        StatusCode::OK
    );
    tokio::task::block_in_place(|| server.stop());
    let b = tokio::time::timeout(BOUND, common::send(&app, req("/work", &r, "b", false)))
        .await
        .unwrap();
    assert_eq!(b.status, StatusCode::SERVICE_UNAVAILABLE, "{b:?}");
    assert_eq!(common::problem_detail(&b), "lock service unavailable");
    tokio::task::block_in_place(|| server.restart()).unwrap();
    let deadline = std::time::Instant::now() + BOUND;
    loop {
        let c = tokio::time::timeout(BOUND, common::send(&app, req("/work", &r, "c", false)))
            .await
            .unwrap();
        if c.status == StatusCode::OK {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no recovery: {c:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
