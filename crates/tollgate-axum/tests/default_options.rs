//! `HeldLock` and `HeldPermit` take their lock or permit with the options
//! of the `Locker` or `Semaphore` in the state (its builder's
//! `default_options`), as `LockLayer` and `ConcurrencyLimitLayer` on it
//! do, unless their resource says otherwise: here a wait of 10 s, so a busy
//! resource is waited for, not answered 409 or 429 at once.

use std::time::Duration;

use axum::body::Body;
use axum::extract::FromRef;
use axum::routing::post;
use axum::Router;
use http::{Request, StatusCode};
use tollgate_axum::{HeldLock, HeldPermit, LockResource, PermitResource};
use tollgate_core::{LockOptions, Locker, MemoryBackend, Semaphore, Subject};
use tower::ServiceExt;

#[derive(Clone, FromRef)]
struct AppState {
    locker: Locker,
    semaphore: Semaphore,
}

/// One resource, with the options of whatever takes it.
struct Report;

impl LockResource<AppState> for Report {
    type Key = Subject;

    fn key(_: &AppState) -> Subject {
        Subject::new("report")
    }
}

impl PermitResource<AppState> for Report {
    type Key = Subject;

    fn key(_: &AppState) -> Subject {
        Subject::new("report")
    }
}

#[tokio::test]
async fn the_extractors_wait_as_their_lockers_say() {
    let waits = LockOptions::new().wait(Duration::from_secs(10));
    let backend = MemoryBackend::new();
    let state = AppState {
        locker: Locker::builder(backend.clone())
            .default_options(waits.clone())
            .build()
            .unwrap(),
        semaphore: Semaphore::builder(backend, 1)
            .default_options(waits)
            .build()
            .unwrap(),
    };
    let app = Router::new()
        .route("/lock", post(|_: HeldLock<Report>| async { "locked" }))
        .route(
            "/permit",
            post(|_: HeldPermit<Report>| async { "permitted" }),
        )
        .with_state(state.clone());
    let now = LockOptions::new();
    for path in ["/lock", "/permit"] {
        let held = match path {
            "/lock" => state.locker.try_acquire("report", &now).await.unwrap(),
            _ => state.semaphore.try_acquire("report", &now).await.unwrap(),
        };
        let req = Request::post(path).body(Body::empty()).unwrap();
        let mut waiting = tokio::spawn(app.clone().oneshot(req));
        // Still waiting for the resource, not answered at once.
        let early = tokio::time::timeout(Duration::from_millis(300), &mut waiting).await;
        assert!(early.is_err(), "{path}: answered at once: {early:?}");
        held.release().await.unwrap();
        let res = waiting.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
    }
}
