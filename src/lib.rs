//! # tollgate
//!
//! Correct, fast coordination on Redis: rate limiters (fixed window, sliding
//! window log, sliding window counter, token bucket, GCRA — each one atomic
//! Lua script and one round trip per decision) and fenced distributed locks,
//! as tower middleware, axum extractors and a plain async API. The same API
//! runs on standalone Redis, Sentinel and Cluster (Redlock for locks), and on
//! an embedded in-memory backend with the same behaviour in one process.
//!
//! Start here: every path below is under `tollgate::`, so an app needs no
//! other tollgate crate in its `Cargo.toml`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! use tollgate::{MemoryBackend, Quota, RateLimiter};
//!
//! let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_second(10))?;
//! let decision = limiter.check("user-42").await?;
//! assert!(decision.allowed);
//! # Ok(()) }
//! ```
//!
//! An application that runs on memory in development and on Redis in
//! production names the store in its environment:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! use tollgate::{Backend, Locker, Quota, RateLimiter};
//!
//! let backend = Backend::from_env().await?; // memory unless REDIS_URL etc. is set
//! let limiter = RateLimiter::gcra(backend.clone(), Quota::per_second(10))?;
//! let locker = Locker::new(backend);
//! # let _ = (limiter, locker);
//! # Ok(()) }
//! ```
//!
//! # What is where
//!
//! Always available (no feature needed):
//!
//! - **Rate limits**: a [`RateLimiter`] runs one [`Algorithm`] over a
//!   [`Quota`] and answers with a [`Decision`]. Quotas chosen per request
//!   (free, pro, …): [`Plans`] and [`PlanTable`], see [`rate::plans`].
//!   Giving back what an admitted check took: [`RateLimiter::refund`] with
//!   the decision's [`Charge`]. More in [`rate`].
//! - **Locks**: a [`Locker`] hands out fenced [`Lease`]s; the protected
//!   resource checks each lease's [`FencingToken`]. Redlock over independent
//!   masters: [`Locker::redlock`]. Read [`lock`] before taking one.
//! - **Concurrency**: a [`Semaphore`] hands out [`Permit`]s, at most N per
//!   key across every process.
//! - **Idempotency**: an [`IdempotencyStore`](idempotency::IdempotencyStore)
//!   runs the first request with a key and stores its response for the
//!   retries; see [`idempotency`].
//! - **Stores**: [`Backend`] is the one an application picks at run time
//!   ([`Backend::from_env`]: `REDIS_CLUSTER`, `REDIS_SENTINELS`, `REDIS_URL`,
//!   else memory), and every capability accepts it; behind it,
//!   [`MemoryBackend`] (one process: tests, single instances) and
//!   [`RedisBackend`] (standalone and Cluster). The traits a store
//!   implements are in [`store`]; what happens when it is down, in
//!   [`failure`]. Key layout and subjects: [`keyspace`], [`Subject`].
#![cfg_attr(
    feature = "sentinel",
    doc = "  Sentinel (feature `sentinel`): [`RedisBackend::sentinel`] and [`SentinelConnection`]."
)]
#![cfg_attr(not(feature = "sentinel"), doc = "  Sentinel: feature `sentinel`.")]
//!
#![cfg_attr(
    feature = "tower",
    doc = "\
With feature `tower` (on by default), in [`tower`]:

- **Middleware**: [`RateLimitLayer`](tower::RateLimitLayer),
  [`LockLayer`](tower::LockLayer),
  [`ConcurrencyLimitLayer`](tower::ConcurrencyLimitLayer) and
  [`IdempotencyLayer`](tower::IdempotencyLayer), keyed by a
  [`KeyExtractor`](tower::key::KeyExtractor) from [`tower::key`]; every
  refusal is a [`Rejection`](tower::Rejection).
- **Client middleware**: [`PaceLayer`](tower::PaceLayer) paces outbound
  calls against a budget the fleet shares and stops the fleet when the
  upstream says stop."
)]
#![cfg_attr(
    not(feature = "tower"),
    doc = "- **Middleware** (`RateLimitLayer`, `LockLayer`, `ConcurrencyLimitLayer`, \
`IdempotencyLayer`): feature `tower`, off in this build."
)]
//!
#![cfg_attr(
    feature = "axum",
    doc = "\
With feature `axum` (on by default), in [`axum`]:

- **Extractors**: [`HeldLock`](axum::HeldLock) and
  [`HeldPermit`](axum::HeldPermit) hold a lock or a permit for a handler,
  [`RateLimited`](axum::RateLimited) limits one handler without a layer and
  [`RateLimitStatus`](axum::RateLimitStatus) reads a layer's decision."
)]
#![cfg_attr(
    not(feature = "axum"),
    doc = "- **Extractors** (`HeldLock`, `HeldPermit`, `RateLimited`): feature `axum`, \
off in this build."
)]
//!
//! # Features
//!
//! | feature | default | enables |
//! |---|---|---|
//! | `tower` | yes | the tower middleware in `tollgate::tower` |
//! | `axum` | yes | the axum extractors in `tollgate::axum` (and `tower`); key extractors that read axum's `ConnectInfo` and `MatchedPath`; rejections as axum responses |
//! | `admin` | yes | `tollgate::admin::AdminRouter`: the admin JSON API and the dashboard page as an axum `Router` (and `axum`) |
//! | `grpc` | no | a rate limit on a tonic server (its rejections written in tonic's body type); key extractors read tonic's peer address (and `tower`) |
//! | `metrics` | no | decision counters through the `metrics` facade (and `tower`) |
//! | `sentinel` | no | `RedisBackend::sentinel`: a master behind Redis Sentinel, followed across failovers |
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub use tollgate_core::*;

// Named again (it is in the glob above) only to carry the feature badge on
// docs.rs: tollgate-core's own item has none.
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use tollgate_core::SentinelConnection;

#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower {
    //! tower middleware, shaped like tower-http: each layer wraps any
    //! `Service<http::Request<B>>` (axum routers, tonic servers, hyper
    //! services), checks in the response future and answers every refusal
    //! with a response (`429`, `409`, `503`, … or the matching gRPC status);
    //! the client layer [`PaceLayer`] wraps an HTTP client instead and ends
    //! a refused call with an error.
    //!
    //! - [`RateLimitLayer`]: a rate limit per key, with the IETF draft
    //!   `RateLimit` / `RateLimit-Policy` headers and `Retry-After`; plans
    //!   per request ([`RateLimitLayer::plans`]), cost per request and
    //!   counting only some responses ([`rate_limit`]).
    //! - [`LockLayer`]: a fenced lock per resource around the inner service;
    //!   the handler gets the [`FencingToken`](crate::FencingToken) ([`lock`]).
    //! - [`ConcurrencyLimitLayer`]: at most N requests in flight per key
    //!   across every instance, on a [`Semaphore`](crate::Semaphore)
    //!   ([`concurrency`]).
    //! - [`IdempotencyLayer`]: `Idempotency-Key` handling — the first request
    //!   runs, a retry gets the stored response — on an
    //!   [`IdempotencyStore`](crate::idempotency::IdempotencyStore)
    //!   ([`idempotency`]).
    //! - [`PaceLayer`]: for clients — outbound calls wait for a slot of a
    //!   budget the whole fleet shares, and an upstream's 429 with
    //!   `Retry-After` (or an exhausted `RateLimit`) blocks that budget on
    //!   every instance ([`pace`]).
    //! - [`key`]: what a request is limited or locked under: the
    //!   [`KeyExtractor`](key::KeyExtractor) trait and the built-in keys
    //!   ([`GlobalKey`](key::GlobalKey), [`PeerIp`](key::PeerIp),
    //!   [`ClientIp`](key::ClientIp) behind trusted proxies,
    //!   [`HeaderKey`](key::HeaderKey), [`RouteKey`](key::RouteKey), path
    //!   parameters with feature `axum`, compounds).
    //! - [`Rejection`] and [`RejectionReason`]: the one model of a refused
    //!   request and its HTTP status or gRPC code ([`rejection`]); the rate
    //!   limit writes it in the inner body type ([`RejectionBody`]), the
    //!   layers that hold a lease while the body streams in a
    //!   [`ResponseBody`].
    //! - [`headers`]: the `RateLimit` header formatter; [`grpc`]: gRPC
    //!   detection and trailers-only responses.
    //!
    //! With feature `metrics`, the layers count their outcomes through the
    //! `metrics` facade: `tollgate_decisions_total`,
    //! `tollgate_lock_requests_total`, `tollgate_concurrency_requests_total`
    //! and `tollgate_idempotency_requests_total`.
    //!
    //! ```
    //! use axum::{routing::get, Router};
    //! use tollgate::tower::key::HeaderKey;
    //! use tollgate::tower::RateLimitLayer;
    //! use tollgate::{MemoryBackend, Quota};
    //!
    //! // Ten requests per second per API key; more gets a 429 with `Retry-After`.
    //! let layer = RateLimitLayer::token_bucket(MemoryBackend::new(), Quota::per_second(10))
    //!     .key(HeaderKey::new("x-api-key"));
    //! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    //! # let _ = app;
    //! ```
    pub use tollgate_tower::*;
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum {
    //! axum extractors: coordination for one handler, without a layer.
    //!
    //! - [`HeldLock<R>`](HeldLock): a fenced lock on the resource the request
    //!   names (typically a path parameter), held while the handler holds
    //!   the guard; the [`Locker`](crate::Locker) comes from the router's
    //!   state and `R` implements [`LockResource`] ([`RouteParams`] needs no
    //!   impl).
    //! - [`HeldPermit<R>`](HeldPermit): one of a key's N concurrency permits,
    //!   from a [`Semaphore`](crate::Semaphore) in the state; `R` implements
    //!   [`PermitResource`]. It answers as a
    //!   [`ConcurrencyLimitLayer`](crate::tower::ConcurrencyLimitLayer) does.
    //! - [`RateLimited<P>`](RateLimited): a rate limit for one handler; `P`
    //!   implements [`RateLimitPolicy`] (which limiter, which key, what
    //!   cost).
    //! - [`RateLimitStatus`]: the decision a
    //!   [`RateLimitLayer`](crate::tower::RateLimitLayer) made for this
    //!   request, for handlers that show the remaining budget.
    //!
    //! Every extractor fails with [`Rejection`], with the same answers as the
    //! layers in [`tower`](crate::tower) (see
    //! [`tower::rejection`](crate::tower::rejection)).
    //!
    //! ```
    //! use axum::{routing::post, Router};
    //! use tollgate::axum::{HeldLock, RouteParams};
    //! use tollgate::{Locker, MemoryBackend};
    //!
    //! /// One lock per job id: the route and its path parameters name it.
    //! async fn run_job(lock: HeldLock<RouteParams>) -> String {
    //!     // ... work guarded by the lock; pass `lock.fence()` to the storage ...
    //!     format!("fence {}", lock.fence())
    //! }
    //!
    //! let app: Router = Router::new()
    //!     .route("/jobs/{id}", post(run_job))
    //!     .with_state(Locker::new(MemoryBackend::new()));
    //! # let _ = app;
    //! ```
    pub use tollgate_axum::*;
}

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin {
    //! The operator plane: [`Admin`] (inspect, reset, block and unblock
    //! subjects, who is throttled, who holds what, fleet-wide) and, with
    //! feature `admin`, [`AdminRouter`]: the admin JSON API and a live
    //! dashboard page as an axum `Router` to mount where the application
    //! likes.
    //!
    //! ```
    //! use axum::Router;
    //! use tollgate::admin::{Admin, AdminRouter};
    //! use tollgate::MemoryBackend;
    //!
    //! # fn main() -> Result<(), tollgate::Error> {
    //! let admin = AdminRouter::new(Admin::new(MemoryBackend::new()), "s3cret-admin-token")?;
    //! // The dashboard at /admin/, the API at /admin/api/*.
    //! let app: Router = Router::new().merge(admin.mount_at("/admin"));
    //! # let _ = app;
    //! # Ok(()) }
    //! ```
    pub use tollgate_axum::admin::*;
    pub use tollgate_core::admin::*;
}
