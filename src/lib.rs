//! # tollgate
//!
//! Correct, fast coordination on Redis: rate limiters (fixed window, sliding
//! window log, sliding window counter, token bucket, GCRA — each one atomic
//! Lua script and one round trip per decision) and fenced distributed locks,
//! as tower middleware, axum extractors and a plain async API. The same API
//! runs on standalone Redis, Sentinel and Cluster (Redlock for locks), and on
//! an embedded in-memory backend with the same behaviour in one process.
//!
//! This crate re-exports [`tollgate_core`] at its root; the tower middleware is
//! in [`tower`] (feature `tower`, on by default) and the axum extractors in
//! [`axum`] (feature `axum`, on by default).
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
#![forbid(unsafe_code)]

pub use tollgate_core::*;

/// tower middleware: `RateLimitLayer`, `LockLayer` and key extractors.
#[cfg(feature = "tower")]
pub mod tower {
    pub use tollgate_tower::*;
}

/// axum extractors: `HeldLock` and handler-level rate limits.
#[cfg(feature = "axum")]
pub mod axum {
    pub use tollgate_axum::*;
}
