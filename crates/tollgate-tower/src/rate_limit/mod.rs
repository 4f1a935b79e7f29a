//! [`RateLimitLayer`]: rate limiting as tower middleware.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tollgate::{MemoryBackend, Quota};
//! use tollgate::tower::key::PeerIp;
//! use tollgate::tower::RateLimitLayer;
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(10)).key(PeerIp::new()));
//! # let _ = app;
//! ```
//!
//! # What the middleware does
//!
//! For each request, in the response future (never in `poll_ready`, which
//! only asks the inner service):
//!
//! 1. the [key extractor](crate::key) yields a key, "not limited" (the
//!    request passes straight through) or an error (answered with the
//!    error's status);
//! 2. the [cost](RequestCost) is computed (default 1);
//! 3. the limiter decides, in one round trip for all quotas;
//! 4. admitted: the inner service is called with the [`Decision`] in the
//!    request extensions, and the response gets the `RateLimit-Policy` and
//!    `RateLimit` headers (draft-ietf-httpapi-ratelimit-headers-10);
//!    refused: a [`Rejection`](crate::rejection::Rejection) — 429 with
//!    `Retry-After` (whole seconds, rounded up, never 0), the same headers
//!    and a quota-exceeded problem+json body, or, for gRPC requests, a trailers-only
//!    response with `grpc-status: 8` (RESOURCE_EXHAUSTED) and the retry
//!    information in metadata, never an HTTP 429.
//!
//! A cost larger than the limit can ever admit is answered **413** (no
//! `Retry-After`: waiting cannot help) — gRPC RESOURCE_EXHAUSTED without
//! retry information. When the backend fails, the limiter's
//! [`FailurePolicy`](tollgate_core::FailurePolicy) applies: allow
//! (default; no made-up rate-limit headers on such responses), deny (503,
//! gRPC UNAVAILABLE), or a local fallback limiter. Each check is bounded by
//! the limiter's timeout and a circuit breaker skips a dead backend.
//!
//! # The layer and the limiter
//!
//! The layer wraps a [`RateLimiter`](tollgate_core::RateLimiter) and holds
//! only HTTP concerns: the key, the cost, the headers, shadow mode, the
//! protocol and the responder. Everything about the limit itself — quotas,
//! name, prefix, timeout, failure policy, circuit breaker, deny cache,
//! clock — is set on [`RateLimiter::builder`](tollgate_core::RateLimiter::builder),
//! and `RateLimitLayer::new(limiter)` takes the result. The algorithm
//! constructors ([`RateLimitLayer::token_bucket`], …) are sugar for a
//! limiter with one quota and the defaults.
//!
//! # Plans
//!
//! [`RateLimitLayer::plans`] chooses the limiter per request: a
//! [`PlanSelector`] names the request's plan in a
//! [`Plans`](tollgate_core::Plans) table from the head (a closure,
//! [`PlanHeader`], [`PlanExtension`]), and that plan's limiter decides,
//! with its own keys and its own `RateLimit-Policy`; the
//! [`Plan`](tollgate_core::Plan) joins the [`Decision`] in the request
//! extensions. A replaced table applies from the next request on. Over one
//! limiter ([`RateLimitLayer::new`]) no table is read at all.
//!
//! # Counting by outcome
//!
//! [`RateLimitLayer::count_if`] counts only some responses — failed logins,
//! say — and gives the others their charge back; the check still reserves
//! the cost before the handler runs, so concurrent requests never get past
//! the bound. [`RateLimitLayer::count_unfinished`] decides for requests
//! that end without a response. Handlers can refund themselves with the
//! [`Charge`](tollgate_core::Charge) in the [`Decision`] and
//! [`RateLimiter::refund`](tollgate_core::RateLimiter::refund).
//!
//! [`Decision`]: tollgate_core::Decision

mod actual;
mod future;
mod layer;
mod outcome;
mod plan;
mod service;

use http::request::Parts;

pub use self::actual::{ActualCost, CostExtension, CostHeader, ResponseCost};
pub use self::future::ResponseFuture;
pub use self::layer::RateLimitLayer;
pub use self::outcome::CountResponse;
pub use self::plan::{PlanExtension, PlanHeader, PlanSelector};
pub use self::service::RateLimit;

/// How much of the limit a request uses, from its head.
///
/// Implemented by `u64` (a constant cost; the default is `1`) and by
/// closures `Fn(&Parts) -> u64`:
///
/// ```
/// use http::{request::Parts, Request};
/// use tollgate::tower::rate_limit::RequestCost;
///
/// // Bulk endpoints cost one unit per item.
/// let cost = |req: &Parts| -> u64 {
///     req.headers
///         .get("x-batch-size")
///         .and_then(|v| v.to_str().ok()?.parse().ok())
///         .unwrap_or(1)
/// };
/// let (req, ()) = Request::post("/bulk").header("x-batch-size", "25").body(()).unwrap().into_parts();
/// assert_eq!(cost.cost(&req), 25);
/// assert_eq!(3u64.cost(&req), 3);
/// ```
pub trait RequestCost: Clone + Send + Sync + 'static {
    /// The cost of the request with head `req`.
    fn cost(&self, req: &Parts) -> u64;
}

impl RequestCost for u64 {
    fn cost(&self, _req: &Parts) -> u64 {
        *self
    }
}

impl<F> RequestCost for F
where
    F: Fn(&Parts) -> u64 + Clone + Send + Sync + 'static,
{
    fn cost(&self, req: &Parts) -> u64 {
        self(req)
    }
}
