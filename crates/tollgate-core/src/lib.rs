//! tollgate-core: rate limiters, fenced locks, semaphores and idempotency
//! records on Redis, with an in-memory twin.
//!
//! - [`RateLimiter`] runs one of five algorithms ([`Algorithm`]) over a
//!   store: one atomic Lua script and one round trip per decision on
//!   Redis (checks waiting together share one call: [`Coalescing`]), the same
//!   semantics in memory.
//! - [`Quota`] says how much per how long; [`Decision`] is the answer.
//! - [`Locker`] hands out fenced [`Lease`]s, with renewal, loss detection
//!   and pub/sub hand-off; [`Locker::redlock`] does the same over several
//!   independent masters. [`Semaphore`] holds N fenced permits per key.
//!   See [`lock`].
//! - [`idempotency`] runs a request once per idempotency key.
//! - [`Backend`] is the store chosen at run time (memory, Redis standalone,
//!   Cluster or Sentinel); [`MemoryBackend`] and [`RedisBackend`] are the two
//!   stores, behind the traits of [`store`].
//! - [`failure`] says what happens when a store is down.
//! - Keys follow [`keyspace`]'s rules, so they are safe on Redis Cluster.
//!
//! See the `tollgate` crate for the tower middleware and axum extractors.
#![forbid(unsafe_code)]

// Layers, each importing only those above it: error, clock, keyspace and
// quota; store (the traits); failure; the capabilities (rate, lock,
// idempotency); the stores (memory, redis); backend (either store).
pub mod admin;
mod backend;
mod clock;
mod error;
pub mod failure;
pub mod idempotency;
pub mod keyspace;
pub mod lock;
mod memory;
mod plane;
mod quota;
pub mod rate;
mod redis;
pub mod store;

pub use backend::Backend;
pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use error::{BackendError, Error, Result};
pub use failure::FailurePolicy;
pub use keyspace::{Keyspace, Subject};
pub use lock::{
    FencingToken, Lease, LeaseLost, LockBackend, LockOptions, Locker, LockerBuilder, Permit,
    Semaphore, SemaphoreBuilder,
};
pub use memory::MemoryBackend;
pub use rate::{
    Algorithm, Charge, Decision, DecisionSource, PendingCheck, Quota, QuotaDecision,
    QuotaDecisions, QuotaLeases, RateLimiter, RateLimiterBuilder, Settlement,
};
pub use rate::{Plan, PlanTable, PlanTableBuilder, Plans};
#[cfg(feature = "sentinel")]
pub use redis::SentinelConnection;
pub use redis::{Coalescing, RedisBackend};
pub use store::RateBackend;
