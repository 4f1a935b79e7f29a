//! The LockLayer suite on the in-memory backend.

mod common;

lock_suite!(common::lock_memory);

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate_core::{LockOptions, Locker, MemoryBackend};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::LockLayer;
use tower::{service_fn, Layer, ServiceExt};

/// A handler that blocks its thread past the lease's safe deadline (the
/// watchdog, on the same thread, cannot signal the loss in time) is not
/// answered as done under the lock: the layer reads the deadline itself,
/// and answers 503 — another holder could meanwhile take the lock.
#[tokio::test(flavor = "current_thread")]
async fn a_handler_that_outlives_the_deadline_unseen_gets_503() {
    let locker = Locker::new(MemoryBackend::new());
    let other = locker.clone();
    let svc = LockLayer::new(locker, HeaderKey::new("x-res").plain())
        .options(LockOptions::new().ttl(Duration::from_millis(50)))
        .layer(service_fn(move |_: Request<String>| {
            let other = other.clone();
            async move {
                std::thread::sleep(Duration::from_millis(120));
                // The lock expired meanwhile: someone else can take it.
                let second = other.try_acquire("r", &LockOptions::new()).await;
                assert!(second.is_ok(), "a second holder: {second:?}");
                Ok::<_, Infallible>(Response::new(String::from("done")))
            }
        }));
    let req = Request::builder()
        .header("x-res", "r")
        .body(String::new())
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
}
