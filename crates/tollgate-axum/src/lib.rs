//! axum extractors for tollgate.
//!
//! - [`HeldLock<R>`] acquires a fenced lock for a resource named by the
//!   request (typically a path parameter) before the handler runs, and holds
//!   it for as long as the handler holds the guard. The
//!   [`Locker`](tollgate_core::Locker) comes from the router's state through
//!   [`FromRef`](axum_core::extract::FromRef); the resource type `R`
//!   implements [`LockResource`] (its name, its TTL, wait bound and renewal).
//!   When the guard is dropped — the handler returns, panics, or is cancelled
//!   because the client went away — the lock is released without blocking.
//! - [`RateLimited<P>`] limits one handler without a layer: `P` implements
//!   [`RateLimitPolicy`] (which limiter, which key, what cost).
//! - [`RateLimitStatus`] reads the decision a `RateLimitLayer` of
//!   `tollgate-tower` made for this request, for handlers that show the
//!   remaining budget.
//!
//! Every extractor fails with a [`Rejection`] whose [`RejectionReason`] says
//! why, and which answers as documented there: 409 + `Retry-After` for a busy
//! lock, 429 + `Retry-After` for a rate limit, 413 for a cost the limit can
//! never admit, 400 when the request lacks what the key or resource name is
//! made of, 503 when the backend is unavailable, 500 with a message naming
//! the missing piece for misconfiguration.
//!
//! ```
//! use std::time::Duration;
//! use axum::{extract::Path, routing::post, Router};
//! use http::request::Parts;
//! use axum::extract::FromRequestParts;
//! use tollgate_axum::{HeldLock, LockResource, Rejection};
//! use tollgate_core::{LockOptions, Locker, MemoryBackend, Subject};
//!
//! /// One lock per job id, taken from the path `/jobs/{id}`.
//! struct Job;
//!
//! impl<S: Send + Sync> LockResource<S> for Job {
//!     async fn name(parts: &mut Parts, state: &S) -> Result<Subject, Rejection> {
//!         let Path(id) = Path::<String>::from_request_parts(parts, state)
//!             .await
//!             .map_err(Rejection::from_response)?;
//!         Ok(Subject::compound(["job", id.as_str()]))
//!     }
//!
//!     fn options(_: &S) -> LockOptions {
//!         LockOptions::new().ttl(Duration::from_secs(10))
//!     }
//! }
//!
//! async fn run_job(lock: HeldLock<Job>) -> String {
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
#![forbid(unsafe_code)]

mod limit;
mod lock;
mod rejection;

pub use limit::{RateLimitPolicy, RateLimitStatus, RateLimited};
pub use lock::{HeldLock, LockResource};
pub use rejection::{Rejection, RejectionReason};
