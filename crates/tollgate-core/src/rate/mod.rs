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

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// An algorithm's script: its arguments (`lua/rate_args.lua`), the shared
/// prelude, then `lua/<name>.lua`. Every script is sent whole (one `EVALSHA`
/// each), so each carries the prelude; this is the one place that says so.
macro_rules! rate_script {
    ($name:literal) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            include_str!(concat!("../../lua/", $name, ".lua"))
        )
    };
}

/// An algorithm's refund script: the arguments, the shared prelude, the
/// refund prelude, then `lua/<name>_refund.lua`.
macro_rules! refund_script {
    ($name:literal) => {
        concat!(
            include_str!("../../lua/rate_args.lua"),
            include_str!("../../lua/rate_prelude.lua"),
            include_str!("../../lua/refund_prelude.lua"),
            include_str!(concat!("../../lua/", $name, "_refund.lua"))
        )
    };
}

/// An algorithm's script as a function of the batch script: the body of
/// `lua/<name>.lua`, unchanged, taking `KEYS` and `ARGV` as arguments.
macro_rules! batch_function {
    ($name:literal) => {
        concat!(
            "local function ",
            $name,
            "(KEYS, ARGV)\n",
            include_str!(concat!("../../lua/", $name, ".lua")),
            "\nend\n"
        )
    };
}

/// The batch script (`lua/rate_batch.lua`): many checks, any algorithms,
/// one call. Its five functions are the single scripts' own bodies, so a
/// coalesced decision runs the very code a single call does.
pub(crate) const BATCH_SCRIPT: &str = concat!(
    "local now, cost, n\n",
    include_str!("../../lua/rate_prelude.lua"),
    batch_function!("fixed_window"),
    batch_function!("sliding_window_log"),
    batch_function!("sliding_window_counter"),
    batch_function!("token_bucket"),
    batch_function!("gcra"),
    "local decide = {fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra}\n",
    include_str!("../../lua/rate_batch.lua"),
);

pub(crate) mod breaker;
pub(crate) mod builder;
mod deny_cache;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
mod limiter;
pub mod plans;
mod quota;
mod quota_decisions;
mod refund;
pub(crate) mod sliding_window_counter;
pub(crate) mod sliding_window_log;
pub(crate) mod token_bucket;

pub use builder::RateLimiterBuilder;
pub use limiter::{FailurePolicy, PendingCheck, RateLimiter, DEFAULT_TIMEOUT};
pub use plans::{Plan, PlanTable, PlanTableBuilder, Plans};
pub use quota::Quota;
pub use quota_decisions::QuotaDecisions;
pub use refund::Charge;
pub(crate) use refund::Refund;
pub use sliding_window_log::MAX_LOG_LIMIT;

/// Which rate-limit algorithm a limiter runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// A counter per epoch-aligned window.
    FixedWindow,
    /// An exact log of admissions in the last period.
    SlidingWindowLog,
    /// Weighted previous window plus current window.
    SlidingWindowCounter,
    /// Continuous refill up to a capacity.
    TokenBucket,
    /// Generic cell rate algorithm.
    Gcra,
}

impl Algorithm {
    /// A short stable name, used in default policy names, metrics and in
    /// every key the algorithm writes (see [`RateLimiter::keys_for`]).
    pub fn short_name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindowLog => "swl",
            Algorithm::SlidingWindowCounter => "swc",
            Algorithm::TokenBucket => "tb",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether the algorithm uses the quota's burst.
    pub fn uses_burst(&self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }

    /// The two arguments the script takes for a quota: (limit, period) for
    /// the windows, (burst, exact emission interval) for the buckets.
    pub(crate) fn params(&self, q: &Quota) -> (u64, Interval) {
        if self.uses_burst() {
            let (ticks, per_micro) = q.interval_fraction();
            (q.burst(), Interval { ticks, per_micro })
        } else {
            (q.limit(), Interval::micros(q.period_micros()))
        }
    }

    /// Whether one committing [`step`](Self::step) decides exactly as a
    /// peek followed, when the peek admits, by a committing step: true of
    /// the algorithms whose step commits exactly when its peek would report
    /// no wait (`retry_after` 0 ⟺ the cost fits), and otherwise reports
    /// the peek's figures. A single-quota check then steps once (issue #15).
    /// The sliding windows keep the peek.
    pub(crate) fn commit_decides(&self) -> bool {
        matches!(
            self,
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::FixedWindow
        )
    }

    /// The most one request may cost under `q`.
    pub fn capacity(&self, q: &Quota) -> u64 {
        // `params(q).0`, without reducing the interval (a gcd per call).
        if self.uses_burst() {
            q.burst()
        } else {
            q.limit()
        }
    }

    /// The in-memory twin of the script, for one quota.
    pub(crate) fn step(
        &self,
        slot: &mut Option<Slot>,
        now: u64,
        cost: u64,
        q: &Quota,
        commit: bool,
    ) -> Outcome {
        self.step_with(slot, Step { now, cost, commit }, self.params(q))
    }

    /// [`step`](Self::step) with the quota's [`params`](Self::params)
    /// already made: a check that steps one quota twice (a peek, then the
    /// commit) reduces its interval once.
    pub(crate) fn step_with(
        &self,
        slot: &mut Option<Slot>,
        req: Step,
        (a, b): (u64, Interval),
    ) -> Outcome {
        // The windows' periods are whole µs (`per_micro` is 1).
        match self {
            Algorithm::FixedWindow => fixed_window::step(slot, req, (a, b.ticks)),
            Algorithm::SlidingWindowLog => sliding_window_log::step(slot, req, (a, b.ticks)),
            Algorithm::SlidingWindowCounter => {
                sliding_window_counter::step(slot, req, (a, b.ticks))
            }
            Algorithm::TokenBucket => token_bucket::step(slot, req, (a, b)),
            Algorithm::Gcra => gcra::step(slot, req, (a, b)),
        }
    }
}

impl Algorithm {
    /// The in-memory twin of the refund script, for one quota: the new TTL
    /// (µs) when the state was rewritten with one, `None` to keep it (or
    /// when the slot was emptied).
    pub(crate) fn refund(&self, slot: &mut Option<Slot>, r: Refund, q: &Quota) -> Option<u64> {
        let (a, b) = self.params(q);
        match self {
            Algorithm::FixedWindow => fixed_window::refund(slot, r, (a, b.ticks)),
            Algorithm::SlidingWindowLog => sliding_window_log::refund(slot, r, (a, b.ticks)),
            Algorithm::SlidingWindowCounter => {
                sliding_window_counter::refund(slot, r, (a, b.ticks))
            }
            Algorithm::TokenBucket => token_bucket::refund(slot, r, (a, b)),
            Algorithm::Gcra => gcra::refund(slot, r, (a, b)),
        }
    }

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

/// A quota's time argument, exactly: `ticks` units of `1/per_micro` µs. A
/// window's period is whole microseconds (`per_micro` 1); a bucket's emission
/// interval is the reduced fraction `period / limit`
/// ([`Quota::interval_fraction`]), so no rate is rounded.
///
/// It goes to a script as one argument, `"<ticks>"` or `"<ticks>/<per_micro>"`
/// (the same count as a plain number, so the backends send it unchanged);
/// the scripts' `interval_of` reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interval {
    pub(crate) ticks: u64,
    pub(crate) per_micro: u64,
}

impl Interval {
    fn micros(us: u64) -> Interval {
        Interval {
            ticks: us,
            per_micro: 1,
        }
    }
}

impl redis::ToRedisArgs for Interval {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        if self.per_micro == 1 {
            self.ticks.write_redis_args(out);
        } else {
            out.write_arg_fmt(format_args!("{}/{}", self.ticks, self.per_micro));
        }
    }
}

/// An instant as the buckets store it, exactly: whole microseconds (`floor`,
/// signed: a fresh bucket's empty instant may precede the epoch under a fake
/// clock) plus `frac` units of `1/per_micro` µs, `0 ≤ frac < per_micro`.
/// Kept relative to now in those units (`rel`), the scripts' arithmetic
/// stays far below 2^53; only whole microseconds are ever absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Instant {
    pub(crate) micros: i64,
    pub(crate) frac: u64,
}

impl Instant {
    /// `rel` units of `1/per` µs after `now` (negative: before).
    pub(crate) fn at(now: u64, rel: i128, per: u64) -> Instant {
        let per = i128::from(per);
        Instant {
            micros: (i128::from(now) + div_euclid(rel, per)) as i64,
            frac: rem_euclid(rel, per) as u64,
        }
    }

    /// How far after `now` this instant lies, in units of `1/per` µs.
    pub(crate) fn rel(self, now: u64, per: u64) -> i128 {
        (i128::from(self.micros) - i128::from(now)) * i128::from(per) + i128::from(self.frac)
    }
}

/// `units` of `1/per` µs in whole microseconds, rounded up (never early):
/// every figure a bucket reports.
pub(crate) fn ceil_micros(units: i128, per: u64) -> u64 {
    let per = i128::from(per);
    // Floor division plus one unless exact: ceil for negatives too.
    let q = div_euclid(units, per) + i128::from(rem_euclid(units, per) != 0);
    q.max(0) as u64
}

/// `a.div_euclid(b)`, in 64 bits when both fit (the usual case): the same
/// quotient, without the 128-bit division routine, which dominated a memory
/// check's arithmetic (issue #15). Panics as `i128::div_euclid` does.
#[inline]
pub(crate) fn div_euclid(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        // i64::MIN / -1 overflows in 64 bits (not in 128): left to i128.
        (Ok(a), Ok(b)) if b != -1 => i128::from(a.div_euclid(b)),
        _ => a.div_euclid(b),
    }
}

/// `a.rem_euclid(b)`, in 64 bits when both fit (see [`div_euclid`]).
#[inline]
pub(crate) fn rem_euclid(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) if b != -1 => i128::from(a.rem_euclid(b)),
        _ => a.rem_euclid(b),
    }
}

/// One request as an algorithm's in-memory step sees it: `cost` units at
/// `now` (µs). With `commit`, an admitted cost is taken (written to the
/// slot); without, the step only reports the figures as they stand. The
/// quota's side is the pair of [`Algorithm::params`], named by each step
/// after its own script.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub(crate) now: u64,
    pub(crate) cost: u64,
    pub(crate) commit: bool,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::FixedWindow => "fixed window",
            Algorithm::SlidingWindowLog => "sliding window log",
            Algorithm::SlidingWindowCounter => "sliding window counter",
            Algorithm::TokenBucket => "token bucket",
            Algorithm::Gcra => "GCRA",
        })
    }
}

/// State of one key in the memory backend.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    /// A refund's marker, or a placeholder while an entry is stepped.
    Marker,
    /// GCRA's TAT or the token bucket's empty instant.
    At(Instant),
    /// Fixed window (previous unused) or sliding counter.
    Window {
        window: u64,
        previous: u64,
        count: u64,
    },
    /// Sliding log, sorted.
    Log(VecDeque<u64>),
}

/// What one quota said about one request, in microseconds; the common form of
/// a script's reply and of its Rust twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Units left after this request (before it, when denied).
    pub remaining: u64,
    /// Microseconds until the quota is back to full.
    pub reset_after_micros: u64,
    /// Microseconds until this request could be admitted; 0 when admitted.
    pub retry_after_micros: u64,
    /// Microseconds until more of the quota is made available (draft-10's
    /// `t`): the next unit of a bucket, the end of a fixed window, the next
    /// unit that fits a sliding window; 0 when the quota is full (for a
    /// fixed window, its end).
    pub next_after_micros: u64,
    /// Microseconds the written state must live (memory backend only).
    pub(crate) ttl_micros: u64,
}

impl Outcome {
    pub(crate) fn allowed(remaining: u64, reset: u64, ttl: u64, next: u64) -> Self {
        Outcome {
            remaining,
            reset_after_micros: reset,
            retry_after_micros: 0,
            next_after_micros: next,
            ttl_micros: ttl,
        }
    }

    /// The figures as they stand, without taking the cost; `retry` is 0
    /// when this quota alone would admit the cost.
    pub(crate) fn current(remaining: u64, reset: u64, retry: u64, next: u64) -> Self {
        Outcome {
            remaining,
            reset_after_micros: reset,
            retry_after_micros: retry,
            next_after_micros: next,
            ttl_micros: 0,
        }
    }

    /// Builds an outcome from a script's four figures.
    pub fn from_reply(
        remaining: u64,
        reset_after_micros: u64,
        retry_after_micros: u64,
        next_after_micros: u64,
    ) -> Self {
        Outcome {
            remaining,
            reset_after_micros,
            retry_after_micros,
            next_after_micros,
            ttl_micros: 0,
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
    /// What an admitted check took, for [`RateLimiter::refund`]; `None` when
    /// denied, for a cost of 0, or when a failure policy admitted without
    /// taking anything.
    pub charge: Option<Charge>,
}

impl Decision {
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
        }
    }

    /// Whether the request was denied.
    pub fn is_denied(&self) -> bool {
        !self.allowed
    }
}

#[cfg(test)]
mod step_tests;
