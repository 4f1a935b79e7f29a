//! Rate limiting: [`Quota`], [`Decision`], the five algorithms and
//! [`RateLimiter`].
//!
//! | algorithm | shape | trade-off |
//! |---|---|---|
//! | [`Algorithm::FixedWindow`] | a counter per epoch-aligned window | cheapest; allows up to 2× the limit across a window edge |
//! | [`Algorithm::SlidingWindowLog`] | one entry per admitted unit | exact; memory and CPU grow with the limit (capped at [`MAX_LOG_LIMIT`]) |
//! | [`Algorithm::SlidingWindowCounter`] | previous + current window, weighted | close to exact at the cost of two counters; never more than the limit per fixed window and never more than 2× in any sliding period |
//! | [`Algorithm::TokenBucket`] | tokens refilled continuously up to a capacity | controlled bursts (the quota's burst) over a sustained rate; one integer per key |
//! | [`Algorithm::Gcra`] | theoretical arrival time | the same admissions as the token bucket, phrased as a schedule; one integer per key |
//!
//! Every algorithm is one atomic Lua script (one `EVALSHA` round trip per
//! decision; under load, several decisions per call of a batch script made
//! of the same code, see [`Coalescing`](crate::Coalescing)), timed by the Redis server unless a client [`Clock`](crate::Clock)
//! is configured, and every key it writes has a TTL. A denied request consumes
//! nothing. Several quotas on one subject are checked together, all or nothing.
//!
//! An admitted check's [`Charge`] can be corrected once to its actual cost
//! ([`RateLimiter::settle`]; [`RateLimiter::refund`] is a settle to 0).
//! Under the estimate every algorithm gives the difference back as a refund
//! does; over it the subject owes the difference, at most
//! [`max_debt`](RateLimiterBuilder::max_debt) per quota (default: its
//! capacity), and is refused until time pays it off:
//!
//! | algorithm | a settle over the estimate |
//! |---|---|
//! | [`Algorithm::FixedWindow`] | the window current at the settle counts the difference, never above limit + max_debt |
//! | [`Algorithm::SlidingWindowLog`] | the difference is logged at the settle's instant, never more than limit + max_debt live entries |
//! | [`Algorithm::SlidingWindowCounter`] | the window current at the settle counts the difference, never above limit + max_debt |
//! | [`Algorithm::TokenBucket`] | the tokens go below zero, never below −max_debt |
//! | [`Algorithm::Gcra`] | the TAT moves later by the difference's intervals, never beyond now + (burst + max_debt) intervals |
//!
//! [`RateLimiter::acquire`] waits for a slot instead of a refusal: a token
//! bucket or GCRA reserves the earliest slot within the wait on the store in
//! the check's one round trip (the same script, one argument more, read only
//! when the cost does not fit now; coalesced checks carry it in the batch
//! too), so waiters across the fleet are served in reservation order; the
//! windows wait out a retry-after that fits and check again (no order
//! across the fleet).

use std::time::Duration;

mod acquire;
pub(crate) mod admin;
pub(crate) mod builder;
mod charge;
mod deny_cache;
mod lease;
mod limiter;
mod pending;
pub mod plans;
mod quota_decisions;
mod refund;
mod settle;

pub use builder::RateLimiterBuilder;

/// The largest limit the sliding window log accepts: it keeps one entry per
/// admitted unit, and memory and CPU grow with the limit. Larger limits
/// belong to the sliding window counter.
pub const MAX_LOG_LIMIT: u64 = 10_000;
pub use crate::failure::FailurePolicy;
pub use crate::quota::Quota;
pub use crate::store::{Algorithm, Outcome};
pub use charge::Charge;
pub use lease::QuotaLeases;
pub use limiter::{RateLimiter, DEFAULT_TIMEOUT};
pub use pending::PendingCheck;
pub use plans::{Plan, PlanTable, PlanTableBuilder, Plans};
pub use quota_decisions::QuotaDecisions;
pub use settle::Settlement;

impl Algorithm {
    /// How long after an admitted check (`d`) its refund can still give
    /// back (µs). A window: its period (the counter's previous window weighs
    /// for a second one); the scripts give only to the window charged. A
    /// bucket: until it would be full again — the charge's tokens may have
    /// come back by refill after that, and a bucket cannot tell, so a later
    /// refund gives nothing rather than tokens it already regained.
    /// Per quota, how long after the check a refund of `cost` may still
    /// give back to it (µs), given the charge's `span` (its
    /// [`refund_span`](Self::refund_span)); empty for the windows, whose
    /// span is one for all. A bucket quota is full again no sooner than its
    /// strictest sibling (`span`) nor than the cost's own refill
    /// (`cost × period / limit`): the later of the two is still safe, and
    /// lets a slow quota (100 an hour beside 10 a second) take its refund
    /// long after the fast one has refilled.
    pub(crate) fn quota_refund_spans(&self, quotas: &[Quota], cost: u64, span: u64) -> Vec<u64> {
        match self {
            Algorithm::TokenBucket | Algorithm::Gcra => quotas
                .iter()
                .map(|q| {
                    let refill = u128::from(cost) * u128::from(q.period_micros())
                        / u128::from(q.limit().max(1));
                    span.max(u64::try_from(refill).unwrap_or(u64::MAX))
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    pub(crate) fn refund_span(&self, d: &Decision) -> u64 {
        let micros = |t: Duration| u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
        let windows = d.quotas.iter().map(|q| q.quota.period_micros());
        match self {
            Algorithm::SlidingWindowCounter => windows.max().unwrap_or(0).saturating_mul(2),
            Algorithm::FixedWindow | Algorithm::SlidingWindowLog => windows.max().unwrap_or(0),
            Algorithm::TokenBucket | Algorithm::Gcra => d
                .quotas
                .iter()
                .map(|q| micros(q.reset_after))
                .min()
                .unwrap_or(0),
        }
    }
}

/// One quota's part of a [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaDecision {
    /// The quota.
    pub quota: Quota,
    /// Whether this quota alone would admit the request.
    pub allowed: bool,
    /// The most this quota admits at once (burst for buckets, limit for windows).
    pub limit: u64,
    /// Units left.
    pub remaining: u64,
    /// Time until the quota is back to full.
    pub reset_after: Duration,
    /// Time until this quota could admit the request; `None` when it does.
    /// Never earlier than [`next_after`](Self::next_after).
    pub retry_after: Option<Duration>,
    /// Time until more of this quota is made available (draft-10's `t`):
    /// the next unit of a token bucket or GCRA, the end of a fixed window,
    /// the next unit that fits a sliding window log or counter; zero when
    /// the quota is full (a fixed window: its end).
    pub next_after: Duration,
}

/// Where a [`Decision`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecisionSource {
    /// The backend decided.
    Backend,
    /// The local deny cache repeated an earlier denial that has not expired.
    DenyCache,
    /// The backend failed and the policy admitted the request.
    FailOpen,
    /// The backend failed and the local fallback limiter decided.
    Fallback,
    /// Served from this instance's quota lease of the subject (units taken
    /// on the backend before; see [`QuotaLeases`]).
    Lease,
}

/// The answer to one check: admitted or not, and the figures to report.
///
/// With several quotas, the top-level figures are the strictest quota's (the
/// one that denies with the longest wait, or, when admitted, the one with the
/// fewest units left); every quota is listed in [`Decision::quotas`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The strictest quota's limit (burst for buckets).
    pub limit: u64,
    /// Units left under the strictest quota.
    pub remaining: u64,
    /// Time until the strictest quota is back to full.
    pub reset_after: Duration,
    /// When denied, how long to wait before retrying: never zero, rounded up.
    pub retry_after: Option<Duration>,
    /// Every quota, in configuration order (a slice; one quota is held
    /// without an allocation).
    pub quotas: QuotaDecisions,
    /// Where the decision came from (the backend, a failure policy, a cache).
    pub source: DecisionSource,
    /// What an admitted check took, for [`RateLimiter::refund`] and
    /// [`RateLimiter::settle`]; `None` when denied, or when a failure
    /// policy admitted without taking anything. A check of cost 0 has a
    /// charge of 0 units (a settle can charge what the work cost).
    pub charge: Option<Charge>,
    /// How long [`RateLimiter::acquire`] waited before this decision (for
    /// its slot, or for a retry-after that fit); zero for a check.
    pub waited: Duration,
}

impl Decision {
    #[inline]
    pub(crate) fn from_outcomes(
        algorithm: Algorithm,
        quotas: &[Quota],
        outcomes: &[Outcome],
        allowed: bool,
        source: DecisionSource,
    ) -> Self {
        // Collected inline for one quota: no allocation per decision.
        let per: QuotaDecisions = quotas
            .iter()
            .zip(outcomes)
            .map(|(q, o)| QuotaDecision {
                quota: *q,
                allowed: o.retry_after_micros == 0,
                limit: algorithm.capacity(q),
                remaining: o.remaining,
                reset_after: Duration::from_micros(o.reset_after_micros),
                // A wait shorter than the quota's own `t` would invite a
                // retry before anything was made available.
                retry_after: (o.retry_after_micros > 0)
                    .then(|| Duration::from_micros(o.retry_after_micros.max(o.next_after_micros))),
                next_after: Duration::from_micros(o.next_after_micros),
            })
            .collect();
        let strictest = match &per[..] {
            [only] => *only,
            several if allowed => *several
                .iter()
                .min_by_key(|d| (d.remaining, std::cmp::Reverse(d.reset_after)))
                .expect("at least one quota"),
            several => *several
                .iter()
                .max_by_key(|d| d.retry_after)
                .expect("at least one quota"),
        };
        Decision {
            allowed,
            limit: strictest.limit,
            remaining: strictest.remaining,
            reset_after: strictest.reset_after,
            retry_after: if allowed {
                None
            } else {
                Some(strictest.retry_after.unwrap_or(Duration::from_micros(1)))
            },
            quotas: per,
            source,
            charge: None,
            waited: Duration::ZERO,
        }
    }

    /// Whether the request was denied.
    pub fn is_denied(&self) -> bool {
        !self.allowed
    }
}
