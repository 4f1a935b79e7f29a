//! [`LockLayer`]: a per-resource fenced mutex around the inner service.
//!
//! For each request, in the response future:
//!
//! 1. the [key extractor](crate::key) names the resource (or says "not
//!    locked": the request passes straight through; or refuses it);
//! 2. the lock for that resource is acquired — without waiting by default,
//!    or up to the wait bound of the layer's [`LockOptions`](tollgate_core::LockOptions::wait);
//! 3. held: the lease's [`FencingToken`] goes into the request extensions
//!    (the handler passes it to the resource, which refuses lower tokens),
//!    with a [`LeaseLost`] future the handler may watch itself, and the
//!    inner service is called; the lease is renewed by its watchdog
//!    while the inner future runs (and, with [`HoldUntil::BodyEnd`], until
//!    the response body ends), then released — and the release is awaited
//!    before the response (or the inner service's error) is returned, so
//!    the next request finds the lock free;
//! 4. busy: **409** with `Retry-After` from the holder's remaining TTL
//!    (rounded up), gRPC ABORTED with retry information; the backend down:
//!    **503**, gRPC UNAVAILABLE.
//!
//! If the lease is lost while the inner future runs (Redis paused past the
//! lease's safe deadline, the lock deleted or taken), the inner future is
//! **dropped** — the handler is cancelled at its next `.await` — and the
//! request is answered **503** (gRPC ABORTED); see [`OnLeaseLost`].
//!
//! Before reaching for a lock, prefer a unique constraint, an idempotency
//! key or a single-writer design (see
//! [`tollgate::lock`](tollgate_core::lock)); a lock protects data only
//! together with the fencing token.
//!
//! ```
//! # // `PathParam` needs the `axum` feature: without it, nothing runs.
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! # #[cfg(feature = "axum")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{body::Body, extract::Path, routing::post, Extension, Router};
//! use http::{Request, StatusCode};
//! use tollgate::{FencingToken, Locker, MemoryBackend};
//! use tollgate::tower::key::PathParam;
//! use tollgate::tower::LockLayer;
//! use tower::ServiceExt;
//!
//! async fn import(Path(id): Path<u32>, Extension(fence): Extension<FencingToken>) -> String {
//!     // ... write to the store with `fence`; the store refuses lower fences ...
//!     format!("imported {id} with fence {fence}")
//! }
//!
//! // One import per account at a time.
//! let app = Router::new()
//!     .route("/accounts/{id}/import", post(import))
//!     .layer(LockLayer::new(Locker::new(MemoryBackend::new()), PathParam::new("id")).namespace("import"));
//!
//! let res = app
//!     .oneshot(Request::post("/accounts/7/import").body(Body::empty())?)
//!     .await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! # Ok(()) }
//! ```
//!
//! # Options
//!
//! The lease is taken with the locker's default [`LockOptions`](tollgate_core::LockOptions)
//! (TTL 30 s, renewed, no waiting, a hold cap of max(20 × TTL, 10 min)),
//! or with [`LockLayer::options`]: those are checked against the locker
//! when given, so an invalid TTL is an error at startup
//! ([`LockLayer::try_options`]) rather than a 500 on every request.

mod layer;

pub use self::layer::{ForLock, LockLayer};
pub use crate::hold::ResponseFuture;

/// The locking service made by [`LockLayer`]: the inner service runs while
/// the resource's lease is held (the service a concurrency limit uses too —
/// a lock is a limit of one).
pub type Lock<S, K> = crate::hold::Hold<S, K>;
// Re-exported so handlers can name what the middleware puts in the request
// extensions without another import.
pub use tollgate_core::{FencingToken, LeaseLost};

/// How long the lease is held.
///
/// ```
/// use tollgate::tower::lock::HoldUntil;
/// assert_eq!(HoldUntil::default(), HoldUntil::Response);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HoldUntil {
    /// Until the inner service's future has produced the response (the
    /// default): the handler's work is protected, streaming the body is not.
    #[default]
    Response,
    /// Until the response body has been sent to the end (or dropped): for
    /// handlers whose work happens while the body streams.
    BodyEnd,
}

/// What happens when the lease is lost while the request is being handled
/// (by [`LockLayer`], the concurrency limit and the
/// [idempotency layer](crate::IdempotencyLayer::on_lease_lost)).
///
/// ```
/// use tollgate::tower::lock::OnLeaseLost;
/// assert_eq!(OnLeaseLost::default(), OnLeaseLost::Cancel);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLeaseLost {
    /// Drop the inner future (cancelling the handler) and answer 503 — or,
    /// while a body held with [`HoldUntil::BodyEnd`] streams, end the body
    /// with an error; a gRPC response's, with trailers saying ABORTED (the
    /// default).
    #[default]
    Cancel,
    /// Let the handler finish; it can watch the [`LeaseLost`] in the
    /// request extensions itself, and its writes must carry the fence.
    Continue,
}
