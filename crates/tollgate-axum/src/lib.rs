//! axum extractors for tollgate.
//!
//! - [`HeldLock<R>`] acquires a fenced lock for a resource named by the
//!   request (typically a path parameter) before the handler runs, and holds
//!   it for as long as the handler holds the guard. The
//!   [`Locker`](tollgate_core::Locker) comes from the router's state through
//!   [`FromRef`](axum_core::extract::FromRef); the resource type `R`
//!   implements [`LockResource`] (the key extractor that names it, its TTL,
//!   wait bound and renewal) — [`RouteParams`] needs no impl.
//!   When the guard is dropped — the handler returns, panics, or is cancelled
//!   because the client went away — the lock is released without blocking.
//! - [`HeldPermit<R>`] holds one of a key's N concurrency permits for the
//!   handler (a [`Semaphore`](tollgate_core::Semaphore) from the state; `R`
//!   implements [`PermitResource`]): at most N such handlers run at once
//!   per key across every instance. It answers exactly as a
//!   `ConcurrencyLimitLayer` with the same namespace.
//! - [`RateLimited<P>`] limits one handler without a layer: `P` implements
//!   [`RateLimitPolicy`] (which limiter, which key, what cost).
//! - [`RateLimitStatus`] reads the decision a `RateLimitLayer` of
//!   `tollgate-tower` made for this request, for handlers that show the
//!   remaining budget.
//!
//! Every extractor fails with [`Rejection`], the same type and the same
//! answers as the tower layers (see
//! [`tollgate::tower::rejection`](tollgate_tower::rejection) for the table): 409 + `Retry-After` for a
//! busy lock, 429 + `Retry-After` for a rate limit, 413 for a cost the limit
//! can never admit, the key extractor's status when the request lacks what
//! the key is made of, 503 + `Retry-After: 1` when the backend is
//! unavailable, 500 with a message naming the missing piece for
//! misconfiguration. Every HTTP body is an RFC 9457
//! `application/problem+json` document; gRPC requests get gRPC-shaped
//! answers.
//!
//! With feature `admin`, `admin::AdminRouter` serves the operator plane
//! (the admin JSON API and a live dashboard page) as a `Router`.
//!
//! ```
//! use axum::{routing::post, Router};
//! use tollgate::{Locker, MemoryBackend};
//! use tollgate::tower::key::RouteParams;
//! use tollgate::axum::HeldLock;
//!
//! /// One lock per job id: `HeldLock<RouteParams>` locks the route and its
//! /// path parameters, with no impl to write.
//! async fn run_job(lock: HeldLock<RouteParams>) -> String {
//!     // ... work guarded by the lock; pass `lock.fence()` to the storage ...
//!     format!("fence {}", lock.fence())
//! }
//!
//! let locker = Locker::new(MemoryBackend::new());
//! let app: Router = Router::new()
//!     .route("/jobs/{id}", post(run_job))
//!     .with_state(locker);
//! # let _ = app;
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
mod limit;
mod lock;
mod permit;

pub use limit::{RateLimitPolicy, RateLimitStatus, RateLimited};
pub use lock::{HeldLock, LockResource};
pub use permit::{HeldPermit, PermitResource};
pub use tollgate_tower::key::RouteParams;
pub use tollgate_tower::rejection::{Rejection, RejectionReason};
