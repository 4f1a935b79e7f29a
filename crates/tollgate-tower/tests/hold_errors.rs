//! An inner service's error leaves a `LockLayer` or a
//! `ConcurrencyLimitLayer` only after the lock or permit is released, as a
//! response does: a retry made at once (a retry layer outside) finds it
//! free, never a 409 or 429 of its own request's making.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate_core::{Locker, RedisBackend, Semaphore};
use tollgate_testkit::RedisServer;
use tollgate_tower::key::GlobalKey;
use tollgate_tower::{ConcurrencyLimitLayer, LockLayer};
use tower::{service_fn, Layer, ServiceExt};

#[derive(Debug, PartialEq)]
struct Flaky;

/// Fails its first call, answers 200 after.
fn flaky(
) -> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Flaky, Future = impl Send>
       + Clone {
    let calls = Arc::new(AtomicUsize::new(0));
    service_fn(move |_: Request<Body>| {
        let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                Err(Flaky)
            } else {
                Ok(Response::new(Body::empty()))
            }
        }
    })
}

// One thread: a release left to a spawned task has not been sent when the
// retry's acquire is (a round trip to a redis-server of the test's own).
#[tokio::test(flavor = "current_thread")]
async fn a_lock_is_released_before_an_inner_error_returns() {
    let server = RedisServer::start().expect("redis-server");
    let backend = RedisBackend::connect(&server.url()).await.expect("redis");
    let svc = LockLayer::new(Locker::new(backend), GlobalKey).layer(flaky());
    let err = svc.clone().oneshot(Request::new(Body::empty())).await;
    assert_eq!(err.unwrap_err(), Flaky);
    let retry = svc.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
}

#[tokio::test(flavor = "current_thread")]
async fn a_permit_is_released_before_an_inner_error_returns() {
    let server = RedisServer::start().expect("redis-server");
    let backend = RedisBackend::connect(&server.url()).await.expect("redis");
    let permits = Semaphore::new(backend, 1).unwrap();
    let svc = ConcurrencyLimitLayer::new(permits, GlobalKey).layer(flaky());
    let err = svc.clone().oneshot(Request::new(Body::empty())).await;
    assert_eq!(err.unwrap_err(), Flaky);
    let retry = svc.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
}
