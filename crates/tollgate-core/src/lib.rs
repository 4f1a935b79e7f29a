//! tollgate-core: rate limiters and fenced locks on Redis, with an in-memory
//! twin.
//!
//! - [`RateLimiter`] runs one of five algorithms ([`Algorithm`]) over a
//!   [`RateBackend`]: one atomic Lua script and one round trip per decision on
//!   Redis (checks waiting together share one call: [`Coalescing`]), the same
//!   semantics in memory.
//! - [`Quota`] says how much per how long; [`Decision`] is the answer.
//! - [`Locker`] hands out fenced [`Lease`]s over a [`LockBackend`] (Redis or
//!   memory), with renewal, loss detection and pub/sub hand-off;
//!   [`Locker::redlock`] does the same over several independent masters.
//!   See [`lock`].
//! - Keys follow [`keyspace`]'s rules, so they are safe on Redis Cluster.
//!
//! See the `tollgate` crate for the tower middleware and axum extractors.
#![forbid(unsafe_code)]

pub mod backend;
mod clock;
mod error;
pub mod idempotency;
pub mod keyspace;
pub mod lock;
pub mod rate;

#[cfg(feature = "sentinel")]
pub use backend::SentinelConnection;
pub use backend::{Coalescing, MemoryBackend, RateBackend, RedisBackend};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{BackendError, Error, Result};
pub use keyspace::{Keyspace, Subject};
pub use lock::{
    FencingToken, Lease, LeaseLost, LockBackend, LockOptions, Locker, LockerBuilder, Permit,
    Semaphore, SemaphoreBuilder,
};
pub use rate::{
    Algorithm, Charge, Decision, DecisionSource, FailurePolicy, PendingCheck, Quota, QuotaDecision,
    QuotaDecisions, RateLimiter, RateLimiterBuilder,
};
pub use rate::{Plan, PlanTable, PlanTableBuilder, Plans};
