//! tower middleware for tollgate, shaped like tower-http.
//!
//! - [`rate_limit`]: [`RateLimitLayer`] → [`RateLimit`](rate_limit::RateLimit):
//!   rate limits on Redis or in memory, with IETF draft-10 `RateLimit` /
//!   `RateLimit-Policy` headers, 429 + `Retry-After` (or gRPC
//!   RESOURCE_EXHAUSTED) rejections, a failure policy, shadow mode, tracing
//!   and metrics.
//! - [`lock`]: [`LockLayer`] → [`Lock`](lock::Lock): a per-resource fenced
//!   mutex around the inner service.
//! - [`concurrency`]: [`ConcurrencyLimitLayer`] →
//!   [`ConcurrencyLimit`](concurrency::ConcurrencyLimit): at most N requests
//!   in flight per key across every instance (a fenced semaphore).
//! - [`idempotency`]: [`IdempotencyLayer`] →
//!   [`Idempotency`](idempotency::Idempotency): `Idempotency-Key` per the
//!   IETF draft — the first request runs, a retry gets the stored response
//!   (`Idempotent-Replayed: true`), 409 while in flight, 422 for another
//!   payload, 400 for a missing or malformed key — on fenced leases.
//! - [`pace`]: [`PaceLayer`] → [`Pace`](pace::Pace): for clients —
//!   outbound calls wait for a slot of a budget the fleet shares, settle
//!   to the cost their response reports, and a 429 with `Retry-After` (or
//!   an exhausted `RateLimit`) blocks the budget on every instance.
//! - [`key`]: [`KeyExtractor`](key::KeyExtractor), the one way a request
//!   is keyed (by the layers here and by `tollgate-axum`'s extractors), and
//!   the built-in keys (global, peer IP, client IP behind trusted proxies,
//!   header, request extension, route, path parameters, compounds).
//! - [`rejection`]: [`Rejection`], the one model of a
//!   refused request, and the table from reason to HTTP status and gRPC
//!   code; a custom responder can replace the default responses.
//! - [`hold`]: the service and future shared by the lock and concurrency
//!   layers.
//! - [`headers`]: the draft-10 `RateLimit` / `RateLimit-Policy` formatter.
//! - [`grpc`]: [`Protocol`](grpc::Protocol) and trailers-only gRPC
//!   responses.
//!
//! Services are `Clone + Send + Sync`, checks run in the response future
//! (never in `poll_ready`), the inner service's error type passes through
//! unchanged (axum needs `Infallible`) and every rejection is a response.
//! The rate limit keeps the inner service's body type and writes its
//! rejections in it ([`RejectionBody`]: axum's and tonic's bodies, `Full`,
//! the boxed bodies), so an admitted response passes through untouched.
//! The layers that hold a lock, a permit or a record while the body streams
//! answer with [`ResponseBody<B>`](ResponseBody), which wraps the inner
//! body; axum routers and tonic servers accept both as they are.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter};
//! use tollgate::tower::RateLimitLayer;
//! use tower::ServiceExt;
//!
//! let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::TokenBucket)
//!     .quota(Quota::per_minute(1))
//!     .name("demo")
//!     .build()?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter));
//!
//! let res = app.clone().oneshot(Request::new(Body::empty())).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["ratelimit-policy"], r#""demo";q=1;w=60"#);
//! assert_eq!(res.headers()["ratelimit"], r#""demo";r=0;t=60"#);
//!
//! let res = app.oneshot(Request::new(Body::empty())).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! // Whole seconds, rounded up: never 0.
//! let wait: u64 = res.headers()["retry-after"].to_str()?.parse()?;
//! assert!((1..=60).contains(&wait));
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! - `axum`: [`key::PeerIp`] and [`key::ClientIp`] read axum's
//!   `ConnectInfo<SocketAddr>`, [`key::RouteKey`] and [`key::PathParam`]
//!   read `MatchedPath`, and [`Rejection`] is axum's
//!   `IntoResponse`. Off by default, so tonic-only users do not build axum;
//!   the `tollgate` facade turns it on with its own `axum` feature.
//! - `grpc`: a [`RateLimitLayer`] on a tonic server (its rejections are
//!   written in tonic's body type, [`RejectionBody`]), and the key
//!   extractors read tonic's `TcpConnectInfo`. The gRPC shape of a
//!   rejection (status 200, `grpc-status`) is chosen from the request's
//!   `content-type` whatever the features (see [`grpc::Protocol`]): the
//!   lock, concurrency and idempotency layers answer gRPC calls so without
//!   it.
//! - `metrics`: counters through the `metrics` facade:
//!   `tollgate_decisions_total{policy, outcome, source}` (outcome `allowed`,
//!   `denied`, `shadow_denied`, `too_costly`, `unavailable`, `key_error`;
//!   source `backend`, `deny_cache`, `fail_open`, `fallback`, `lease` —
//!   served from a quota lease —, `none`) and
//!   `tollgate_lock_requests_total{outcome}` (`acquired`, `busy`,
//!   `unavailable`, `lost`, `error`, `key_error`) and
//!   `tollgate_concurrency_requests_total{outcome}` (the same, plus
//!   `fail_open`) and `tollgate_idempotency_requests_total{outcome}` (see
//!   [`idempotency`]).
//!
//! # Observability
//!
//! One `tracing` event per decision (target `tollgate_tower::rate_limit`,
//! `tollgate_tower::lock`, `tollgate_tower::concurrency` or
//! `tollgate_tower::idempotency`): admissions at DEBUG, denials, busy locks,
//! keys in flight and mismatches at INFO, backend failures and lost leases
//! at WARN. Subjects appear only
//! as [`Subject::digest`](tollgate_core::Subject::digest), never raw: they
//! may be IP addresses or API keys.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod body;
pub mod concurrency;
pub mod grpc;
pub mod headers;
pub mod hold;
pub mod idempotency;
pub mod key;
pub mod lock;
mod middleware;
pub mod pace;
pub mod rate_limit;
pub mod rejection;

pub use body::{BoxError, ResponseBody};
pub use concurrency::ConcurrencyLimitLayer;
pub use idempotency::IdempotencyLayer;
pub use lock::LockLayer;
pub use pace::PaceLayer;
pub use rate_limit::RateLimitLayer;
pub use rejection::{Rejection, RejectionBody, RejectionReason};
