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
//! # Stacked limits
//!
//! Limits of one subject belong in one limiter (several quotas: admitted
//! only if every one admits, taken from all at once). Limits of different
//! subjects — every client's IP outside, each user inside — stack as
//! layers, and then a request the inner limit refuses does not count on the
//! outer one: every refusal tollgate answers carries
//! [`Refused`](crate::rejection::Refused) in its extensions, and a layer
//! whose inner service answers a rate limit's refusal gives its own charge
//! back (whatever `count_if` says) before the answer leaves, so its
//! `RateLimit` item shows the figure after the give-back (a token bucket
//! or GCRA keeps a charge that later reservations wait behind, as any
//! refund does). Other refusals
//! (a lock, a concurrency limit, the handler's own 429) count as responses.
//!
//! # Settling the real cost, waiting for a slot
//!
//! A request whose cost is known only from its response — an LLM call's
//! tokens — reserves an estimate from its head ([`RequestCost`]), and
//! [`RateLimitLayer::settle_from`] corrects the charge to what the response
//! says ([`ResponseCost`]: a [`CostHeader`], the [`ActualCost`] a handler
//! puts in the response's extensions) before the response leaves; the
//! response's `RateLimit` says what is left after settling. A refund
//! (`count_if`) is a settlement to 0, and its response shows the figures
//! after it too.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{body::Body, routing::post, Router};
//! use http::{request::Parts, Request};
//! use tollgate::{Algorithm, ManualClock, MemoryBackend, Quota, RateLimiter};
//! use tollgate::tower::key::HeaderKey;
//! use tollgate::tower::rate_limit::CostHeader;
//! use tollgate::tower::RateLimitLayer;
//! use tower::ServiceExt;
//!
//! // 1000 tokens a minute per API key.
//! let tokens = RateLimiter::builder(MemoryBackend::new(), Algorithm::TokenBucket)
//!     .quota(Quota::per_minute(1000))
//!     .name("tokens")
//!     .clock(ManualClock::new(1_800_000_000_000_000)) // time stands still here
//!     .build()?;
//! // The estimate is the request's `x-max-tokens`, the actual cost the
//! // response's `x-tokens-used`.
//! let max_tokens = |req: &Parts| -> u64 {
//!     let v = req.headers.get("x-max-tokens").and_then(|v| v.to_str().ok()?.parse().ok());
//!     v.unwrap_or(1000)
//! };
//! let layer = RateLimitLayer::new(tokens)
//!     .key(HeaderKey::new("x-api-key"))
//!     .cost(max_tokens)
//!     .settle_from(CostHeader::new("x-tokens-used"))
//!     .quota_unit("tokens");
//! let app = Router::new()
//!     .route("/chat", post(|| async { ([("x-tokens-used", "120")], "Hello!") }))
//!     .layer(layer);
//!
//! let req = Request::post("/chat").header("x-api-key", "k1").header("x-max-tokens", "300");
//! let res = app.oneshot(req.body(Body::empty())?).await?;
//! // 300 reserved, 120 used: 880 left.
//! assert_eq!(res.headers()["ratelimit"], r#""tokens";r=880;t=1"#);
//! # Ok(()) }
//! ```
//!
//! [`RateLimitLayer::wait_up_to`] lets a request wait for its slot instead
//! of a 429 when the wait fits ([`RateLimiter::acquire`](tollgate_core::RateLimiter::acquire)):
//! on a token bucket or GCRA the slot is reserved on the store at once, so
//! waiters across instances are served in order and never over-admitted,
//! and a request whose client goes away while it waits gives the slot back
//! (while no other waiter is reserved behind it). The window algorithms
//! reserve nothing: a waiter checks again when its retry-after has passed,
//! unordered.
//!
//! [`Decision`]: tollgate_core::Decision

mod actual;
mod charging;
mod counts;
mod future;
mod layer;
mod outcome;
mod plan;
mod service;

use http::request::Parts;

pub(crate) use self::actual::decimal;
pub use self::actual::{ActualCost, CostExtension, CostHeader, ResponseCost};
pub use self::counts::{count_decision, count_key_error};
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
