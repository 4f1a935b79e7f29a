//! Backends: where the state lives.
//!
//! [`RedisBackend`] runs each decision as one Lua script on Redis (standalone,
//! Sentinel, Cluster, or any multiplexed `ConnectionLike`); [`MemoryBackend`]
//! runs the Rust twin of each script in this process. Both implement
//! [`RateBackend`] (and the lock backend of [`crate::lock`]), and the same
//! behaviour suite runs against both.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::rate::{Algorithm, Outcome, Quota};

pub(crate) mod coalesce;
pub(crate) mod memory;
pub(crate) mod pubsub;
pub(crate) mod redis;
mod redis_rate;
#[cfg(feature = "sentinel")]
pub(crate) mod sentinel;
pub(crate) mod version;

pub use self::coalesce::Coalescing;
pub use self::memory::MemoryBackend;
pub use self::redis::RedisBackend;
#[cfg(feature = "sentinel")]
pub use self::sentinel::SentinelConnection;

/// One rate-limit decision to make: the keys (one per quota, one hash tag),
/// the quotas, the cost, and optionally the time.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RateRequest {
    /// The algorithm to run.
    pub algorithm: Algorithm,
    /// One key per quota, all sharing one hash tag.
    pub keys: Vec<String>,
    /// The quotas, in the same order as `keys` (shared with the limiter:
    /// no copy per check).
    pub quotas: Arc<[Quota]>,
    /// Units this request takes.
    pub cost: u64,
    /// The time of the decision (µs since the epoch), or `None` for the
    /// backend's own clock (Redis `TIME`).
    pub now_micros: Option<u64>,
    /// A random value that makes log entries unique.
    pub nonce: u64,
}

/// A refund of one admitted check, for every quota (see
/// [`RateLimiter::refund`](crate::RateLimiter::refund)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RefundRequest {
    /// The algorithm that charged.
    pub algorithm: Algorithm,
    /// The marker that makes the refund apply at most once (same hash tag).
    pub marker: String,
    /// One key per quota, as the check's.
    pub keys: Vec<String>,
    /// The quotas, as the check's.
    pub quotas: Arc<[Quota]>,
    /// Units to give back.
    pub cost: u64,
    /// The time of the refund (µs), or `None` for the backend's own clock.
    pub now_micros: Option<u64>,
    /// The check's id (its log entries carry it).
    pub id: u64,
    /// When the check was decided (µs, the backend's clock).
    pub at_micros: u64,
    /// How long after `at_micros` a refund can still change anything (µs):
    /// the longest of the quotas' spans.
    pub span_micros: u64,
    /// Per quota, how long after `at_micros` its refund may still give
    /// (µs); empty when every quota's span is `span_micros` (the windows).
    /// A token bucket's or GCRA's quota stops one its own time after the
    /// check, however long the others' run.
    pub quota_spans_micros: Vec<u64>,
}

/// A backend's answer to a [`RateRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateReply {
    /// Whether every quota admitted the cost (and it was taken).
    pub allowed: bool,
    /// One outcome per quota.
    pub outcomes: Vec<Outcome>,
    /// The time the backend decided at (µs since the epoch): a refund of
    /// this decision gives back to the window charged then.
    pub now_micros: u64,
}

impl RateReply {
    /// A reply from its parts, decided at time 0 (see [`at`](Self::at)).
    pub fn new(allowed: bool, outcomes: Vec<Outcome>) -> Self {
        Self {
            allowed,
            outcomes,
            now_micros: 0,
        }
    }

    /// The reply, decided at `now_micros`.
    pub fn at(mut self, now_micros: u64) -> Self {
        self.now_micros = now_micros;
        self
    }
}

/// Where rate-limit state lives. Implemented by [`RedisBackend`] and
/// [`MemoryBackend`]; a decision is atomic across all its keys.
pub trait RateBackend: Send + Sync + fmt::Debug + 'static {
    /// Makes one decision, atomically, in one round trip.
    fn check_rate<'a>(&'a self, request: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>>;

    /// Makes the decision at once when no I/O is needed (an in-process
    /// backend), or returns `None` to go through [`check_rate`](Self::check_rate).
    /// The default is `None`.
    fn check_rate_now(&self, request: &RateRequest) -> Option<Result<RateReply>> {
        let _ = request;
        None
    }

    /// Gives back what one admitted check took, at most once per
    /// [`RefundRequest::marker`]: `Ok(true)` when given back. The default
    /// refuses (a backend written before refunds existed).
    fn refund_rate<'a>(&'a self, request: &'a RefundRequest) -> BoxFuture<'a, Result<bool>> {
        let _ = request;
        Box::pin(async {
            Err(crate::Error::InvalidConfig(
                "this rate-limit backend does not support refunds".into(),
            ))
        })
    }

    /// The refund at once when no I/O is needed, like
    /// [`check_rate_now`](Self::check_rate_now). The default is `None`.
    fn refund_rate_now(&self, request: &RefundRequest) -> Option<Result<bool>> {
        let _ = request;
        None
    }

    /// A short name for logs: `"memory"`, `"redis"`, ….
    fn kind(&self) -> &'static str;
}

impl<T: RateBackend + ?Sized> RateBackend for Arc<T> {
    fn check_rate<'a>(&'a self, request: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        (**self).check_rate(request)
    }

    fn check_rate_now(&self, request: &RateRequest) -> Option<Result<RateReply>> {
        (**self).check_rate_now(request)
    }

    fn refund_rate<'a>(&'a self, request: &'a RefundRequest) -> BoxFuture<'a, Result<bool>> {
        (**self).refund_rate(request)
    }

    fn refund_rate_now(&self, request: &RefundRequest) -> Option<Result<bool>> {
        (**self).refund_rate_now(request)
    }

    fn kind(&self) -> &'static str {
        (**self).kind()
    }
}
