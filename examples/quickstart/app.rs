//! The quickstart's application: backend selection and the router. Kept in
//! its own file so the end-to-end tests under `tests/` run exactly this
//! router (`#[path = "../examples/quickstart/app.rs"] mod app;`).

use std::time::Duration;

use axum::extract::Path;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tollgate::axum::{HeldLock, LockResource};
use tollgate::tower::key::{PathParam, PeerIp};
use tollgate::tower::RateLimitLayer;
use tollgate::{
    Algorithm, LockBackend, LockOptions, Locker, Quota, RateBackend, RateLimiter, Subject,
};

/// `POST /jobs/{id}` locks the job `{id}`.
struct Job;

impl<S> LockResource<S> for Job {
    /// `job:<id>`: the kind of resource, then the path's `{id}`.
    type Key = (Subject, PathParam);

    fn key(_: &S) -> Self::Key {
        (Subject::new("job"), PathParam::new("id"))
    }

    fn options(_: &S) -> LockOptions {
        // No waiting: a job that is running elsewhere is answered 409 at once.
        // The watchdog renews the lease while the job runs; a crashed holder's
        // lock expires after 10 s.
        LockOptions::new().ttl(Duration::from_secs(10))
    }
}

async fn hello() -> &'static str {
    "hello"
}

async fn run_job(Path(id): Path<String>, lock: HeldLock<Job>) -> Json<Value> {
    // The work. A real job would pass `lock.fence()` to every write, and stop
    // when `lock.lost()` resolves.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fence = lock.fence().get();
    // Release before answering, so that the client's next request finds the
    // job free. (Dropping the guard releases it too — also when the handler
    // panics or the client goes away — but in the background, possibly just
    // after the response has left. If Redis does not answer, the lock
    // expires at its TTL.)
    let _ = lock.release().await;
    Json(json!({ "job": id, "fence": fence }))
}

/// The router on `backend`:
///
/// - `GET /` → `hello`, limited per client IP by a token bucket of capacity
///   5 that refills one token every 2 seconds (shared by every instance on
///   the same backend);
/// - `POST /jobs/{id}` → holds the job's lock for 500 ms of work and answers
///   `{"job":"<id>","fence":<n>}`; 409 while another request holds it.
pub(crate) fn router<B>(backend: B) -> Router
where
    B: RateBackend + LockBackend + Clone,
{
    let quota = Quota::new(1, Duration::from_secs(2)).and_then(|q| q.with_burst(5));
    let limiter = RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
        .quota(quota.expect("a valid quota"))
        .name("quickstart")
        .build()
        .expect("a valid limiter");
    let limit = RateLimitLayer::new(limiter).key(PeerIp::new());
    Router::new()
        // route_layer: a wrong method is a plain 405 and takes no token.
        .route("/", get(hello).route_layer(limit))
        .route("/jobs/{id}", post(run_job))
        .with_state(Locker::new(backend))
}
