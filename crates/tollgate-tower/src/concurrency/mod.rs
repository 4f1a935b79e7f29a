//! [`ConcurrencyLimitLayer`]: at most N requests in flight per key, across
//! every instance that shares the backend.
//!
//! tower's own `ConcurrencyLimit` counts one process (one service clone,
//! even). This one holds a permit of a [`Semaphore`]
//! for each request — on Redis (standalone, Sentinel, Cluster) or in memory
//! — so "2 in flight per API key" holds for the whole fleet. For each
//! request, in the response future:
//!
//! 1. the [key extractor](crate::key) names the key (or lets the request
//!    through unlimited, or refuses it);
//! 2. a permit of that key is taken — without waiting by default, or up to a
//!    [wait bound](tollgate_core::LockOptions::wait);
//! 3. held: the permit's [`FencingToken`](tollgate_core::FencingToken) and
//!    [`LeaseLost`](tollgate_core::LeaseLost) go into the request
//!    extensions and the inner service is called; the permit is renewed
//!    by its watchdog and held until the response body has been sent to the
//!    end or dropped ([`HoldUntil::BodyEnd`], the default here), then
//!    released — however long that takes (see below); when the inner
//!    service fails instead, the release is awaited before its error is
//!    returned;
//! 4. all taken: **429** with `Retry-After` (until the earliest permit
//!    expires, rounded up; 1 when unknown) and
//!    `RateLimit-Policy: "<name>";q=<N>;qu="concurrent-requests"`; gRPC
//!    RESOURCE_EXHAUSTED;
//! 5. the backend unavailable: the semaphore's
//!    [failure policy](tollgate_core::SemaphoreBuilder::on_failure) — let
//!    through without a permit (the default, as for rate limits), **503**
//!    (gRPC UNAVAILABLE), or a permit of a local semaphore with N divided
//!    by the number of instances.
//!
//! **At most N in flight, however long they run.** A request keeps its
//! permit for as long as it is in flight — a handler that works for an hour,
//! an SSE or LLM stream held until its body ends: the layer renews the
//! permit every TTL/3 with no hold cap, and releases it when the request
//! ends. The options' [`max_hold`](tollgate_core::LockOptions::max_hold)
//! (10 minutes by default) and [`renew`](tollgate_core::LockOptions::renew)
//! do not apply here: the cap exists so that a lease its holder forgot does
//! not live forever, and a request in flight is not forgotten — letting its
//! permit lapse would admit N+1 with a healthy Redis, and cutting a healthy
//! stream off at the cap would be no better. The TTL bounds how long the
//! permits of a crashed instance stay taken. To bound how long a request
//! may run, put a timeout around it.
//!
//! So a permit is lost mid-request only through a fault: Redis unreachable
//! or paused past the permit's safe deadline, its key deleted (an operator,
//! `FLUSHALL`, a restart without persistence). A loss is reported — a
//! `tracing` warning and
//! `tollgate_concurrency_requests_total{outcome="lost"}` — and by default
//! the request goes on ([`OnLeaseLost::Continue`]): as under the failure
//! policy's default, a fault of the backend lifts the bound rather than
//! failing work in flight, so from the loss until that request ends one
//! more may be admitted. With [`OnLeaseLost::Cancel`] the bound holds
//! through faults too: the handler is cancelled and answered 503 as the
//! lock layer does, or a body still streaming ends with an error. A holder
//! that dies frees its permits when their TTL passes.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use axum::{body::Body, routing::post, Router};
//! use http::{Request, StatusCode};
//! use tollgate::{LockOptions, MemoryBackend, Semaphore};
//! use tollgate::tower::key::HeaderKey;
//! use tollgate::tower::ConcurrencyLimitLayer;
//! use tower::ServiceExt;
//!
//! // One export per tenant at a time (the tenant from a trusted header).
//! let exports = Semaphore::new(MemoryBackend::new(), 1)?;
//! let app = Router::new().route("/export", post(|| async { "done" })).layer(
//!     ConcurrencyLimitLayer::new(exports.clone(), HeaderKey::new("x-tenant"))
//!         .namespace("export")
//!         .options(LockOptions::new().ttl(Duration::from_secs(10))),
//! );
//! let req = || Request::post("/export").header("x-tenant", "acme").body(Body::empty()).unwrap();
//!
//! assert_eq!(app.clone().oneshot(req()).await?.status(), StatusCode::OK);
//! // While another export of acme runs (here: a permit taken directly)...
//! let key = tollgate::Subject::compound(["export", &tollgate::tower::key::KeyExtractor::extract(
//!     &HeaderKey::new("x-tenant"), &req().into_parts().0)?.unwrap().as_encoded().to_owned()]);
//! let running = exports.try_acquire(key, &LockOptions::new()).await?;
//! let res = app.oneshot(req()).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["ratelimit-policy"], r#""export";q=1;qu="concurrent-requests""#);
//! # drop(running);
//! # Ok(()) }
//! ```

mod layer;

use http::HeaderValue;
use tollgate_core::{LockOptions, Permit, Semaphore, Subject};

use crate::hold::gate::{permit_outcome, Acquired};
use crate::rejection::Rejection;

pub use self::layer::{ConcurrencyLimitLayer, ForPermits};
pub use crate::hold::ResponseFuture;
pub use crate::lock::{HoldUntil, OnLeaseLost};

/// The service made by [`ConcurrencyLimitLayer`]: the inner service runs
/// while one of the key's permits is held (the lock layer's service: a lock
/// is a limit of one).
pub type ConcurrencyLimit<S, K> = crate::hold::Hold<S, K>;

/// The options a request's permit is taken with: `options` renewed, and
/// with no hold cap. The cap is there so that a lease its holder forgot
/// does not live forever; a request in flight is not forgotten, and its
/// permit must live exactly as long as it runs, or N+1 run at once.
pub(crate) fn for_a_request(options: &LockOptions) -> LockOptions {
    options.clone().renew(true).unbounded_hold()
}

/// Takes a permit of `key` the way the layer does, for extractors and
/// custom middleware: `Ok(Some(permit))` when held; `Ok(None)` when the
/// backend is unavailable and the semaphore fails open (go ahead without a
/// permit); otherwise the [`Rejection`] the layer would answer with (429
/// with `Retry-After` and `policy` as `RateLimit-Policy`, 503, 500). The
/// outcome is counted and traced as the layer's.
///
/// Like the layer's, the permit is renewed for as long as it is held,
/// with no hold cap (`options`' [`renew`](LockOptions::renew) and
/// [`max_hold`](LockOptions::max_hold) do not apply): hold it for the
/// request and drop it when the request ends — it is released then, or
/// by its TTL if the process dies.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{LockOptions, MemoryBackend, Semaphore, Subject};
/// use tollgate::tower::concurrency::acquire;
/// use tollgate::tower::headers::concurrency_policy;
///
/// let one = Semaphore::new(MemoryBackend::new(), 1)?;
/// let policy = concurrency_policy("jobs", 1);
/// let held = acquire(&one, Subject::new("k"), &LockOptions::new(), &policy).await.unwrap();
/// assert!(held.is_some());
/// let refused = acquire(&one, Subject::new("k"), &LockOptions::new(), &policy).await.unwrap_err();
/// assert_eq!(refused.status(), 429);
/// # Ok(()) }
/// ```
pub async fn acquire(
    semaphore: &Semaphore,
    key: Subject,
    options: &LockOptions,
    policy: &HeaderValue,
) -> Result<Option<Permit>, Rejection> {
    let result = semaphore
        .acquire(key.clone(), &for_a_request(options))
        .await;
    match permit_outcome(semaphore, policy, &key, result) {
        Acquired::Held(permit) => Ok(Some(permit)),
        Acquired::Pass => Ok(None),
        Acquired::Refused(rejection) => Err(*rejection),
    }
}
