//! [`RateBackend`]: one rate-limit decision or settle, as a store makes it,
//! and the vocabulary the two sides share ([`Algorithm`], [`Outcome`]).

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use smallvec::SmallVec;

use super::{AdminBackend, Quotas};
use crate::error::Result;
use crate::quota::{Interval, Quota};

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
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ];

    /// A short stable name, used in default policy names, metrics and in
    /// every key the algorithm writes (see [`RateLimiter::keys_for`](crate::RateLimiter::keys_for)).
    pub fn short_name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindowLog => "swl",
            Algorithm::SlidingWindowCounter => "swc",
            Algorithm::TokenBucket => "tb",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Its name in words, as the registry and the admin API give it
    /// (`"sliding_window_log"`).
    pub fn long_name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
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

    /// The most one request may cost under `q`.
    pub fn capacity(&self, q: &Quota) -> u64 {
        // `params(q).0`, without reducing the interval (a gcd per call).
        if self.uses_burst() {
            q.burst()
        } else {
            q.limit()
        }
    }
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

/// One rate-limit decision to make: the keys (one per quota, one hash tag),
/// the quotas, the cost, and optionally the time.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RateRequest {
    /// The algorithm to run.
    pub algorithm: Algorithm,
    /// One key per quota, all sharing one hash tag; then, when operators'
    /// blocks apply, the subject's block key (same tag): a subject blocked
    /// there is refused until the block ends ([`RateReply::blocked`]). It
    /// is empty when the store said no block may exist
    /// ([`AdminBackend::may_block`]).
    pub keys: Vec<String>,
    /// The quotas, in the same order as `keys` (one inline, several shared
    /// with the limiter).
    pub quotas: Quotas,
    /// Units this request takes.
    pub cost: u64,
    /// The time of the decision (µs since the epoch), or `None` for the
    /// backend's own clock (Redis `TIME`).
    pub now_micros: Option<u64>,
    /// Whether `now_micros` was read from the store's own clock (its
    /// [`RateBackend::decision_clock`]): a store that keeps its entries'
    /// lifetimes on that clock need not read it again. `false` is always
    /// safe.
    pub store_clock: bool,
    /// A random value that makes log entries unique.
    pub nonce: u64,
    /// How long the caller may wait for a slot (µs); 0 for a plain check.
    /// A token bucket or GCRA admits a cost that fits only later, within
    /// this wait, at its slot (a reservation: taken now, for then), and
    /// replies it admitted with the wait as every quota's
    /// [`Outcome::retry_after_micros`] and the other figures as of the slot
    /// (see [`RateReply::wait_micros`]). The windows ignore it.
    pub max_wait_micros: u64,
    /// When its caller stops waiting (this process's clock). A store that
    /// answers across a network passes it on, so that a check decided after
    /// it takes nothing: its caller was answered without it.
    pub deadline: Option<std::time::Instant>,
    /// How to give back an admission its caller never received (it stopped
    /// waiting while the reply was on its way). A store whose reply can
    /// come after its caller gave up hands such an admission to it.
    pub unclaimed: Option<Unclaimed>,
}

/// Gives back an admission whose caller had stopped waiting when its reply
/// came (its timeout, a dropped future): that caller was answered by the
/// failure policy, so the check must take nothing. The limiter sets it on
/// each request; it refunds the charge (at most once, as any refund).
#[derive(Clone)]
pub struct Unclaimed(Arc<GiveBack>);

/// What an [`Unclaimed`] runs: the refund of one reply to one request.
type GiveBack = dyn Fn(&RateRequest, &RateReply) -> BoxFuture<'static, ()> + Send + Sync;

impl Unclaimed {
    /// Gives back with `f`, called with the request and the store's reply.
    pub fn new(
        f: impl Fn(&RateRequest, &RateReply) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        Unclaimed(Arc::new(f))
    }

    /// What gives back `reply` to `request`, when it admitted and took
    /// something (else nothing to do). A reservation's reply is given as
    /// the store sent it: its wait says when its units were taken.
    pub fn give_back(request: &RateRequest, reply: &RateReply) -> Option<BoxFuture<'static, ()>> {
        let this = request.unclaimed.as_ref()?;
        (reply.allowed && request.cost > 0).then(|| (this.0)(request, reply))
    }
}

impl fmt::Debug for Unclaimed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Unclaimed")
    }
}

/// A settle of one admitted check, for every quota: the charge corrected
/// from `cost` to `actual` units, at most once per charge (see
/// [`RateLimiter::settle`](crate::RateLimiter::settle); a refund is a settle
/// to 0).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SettleRequest {
    /// The algorithm that charged.
    pub algorithm: Algorithm,
    /// The marker that makes the settle apply at most once (same hash tag);
    /// a refund and a settle of one charge share it.
    pub marker: String,
    /// One key per quota, as the check's (no block key: a settle is not
    /// refused by a block).
    pub keys: Vec<String>,
    /// The subject's reset stamp ([`AdminBackend::reset`](crate::store::AdminBackend::reset)):
    /// a charge taken at or before it is not settled.
    pub reset_stamp: String,
    /// The quotas, as the check's.
    pub quotas: Arc<[Quota]>,
    /// Units the check took.
    pub cost: u64,
    /// Units it should have taken: less gives the difference back, more
    /// puts the subject into debt (up to `max_debt`).
    pub actual: u64,
    /// The most debt a quota may carry (units), or `None` for each quota's
    /// capacity (burst for buckets, limit for windows).
    pub max_debt: Option<u64>,
    /// The time of the settle (µs), or `None` for the backend's own clock.
    pub now_micros: Option<u64>,
    /// The check's id (its log entries carry it).
    pub id: u64,
    /// When the check was decided (µs, the backend's clock): a
    /// reservation's slot.
    pub at_micros: u64,
    /// When its units were taken: `at_micros` less a reservation's wait.
    /// A charge taken at or before a reset of its subject is not settled.
    pub taken_micros: u64,
    /// How long after `at_micros` the settle can still be applied (µs):
    /// for a give-back the longest of the quotas' refund spans, for a debt
    /// the longer of that and the longest quota period.
    pub span_micros: u64,
    /// How long after `at_micros` the marker lives (µs): the longest
    /// horizon of either direction, at least `span_micros`, so that a
    /// charge settled once stays settled whichever way a replay goes.
    pub marker_span_micros: u64,
    /// Per quota, how long after `at_micros` a give-back may still reach
    /// it (µs); empty when every quota's span is `span_micros` (the
    /// windows, and every debt). A token bucket's or GCRA's quota stops one
    /// its own time after the check, however long the others' run.
    pub quota_spans_micros: Vec<u64>,
}

/// A backend's answer to a [`SettleRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettleReply {
    /// Whether the settle changed the charge (false: the marker was there,
    /// it came too late, or `actual` equals `cost`).
    pub applied: bool,
    /// The subject's figures after settling, as a check of cost 0 reports
    /// them (its block aside).
    pub reply: RateReply,
}

impl SettleReply {
    /// A reply from its parts.
    pub fn new(applied: bool, reply: RateReply) -> Self {
        Self { applied, reply }
    }
}

/// A backend's answer to a quota lease ([`RateBackend::lease_rate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseReply {
    /// Units taken on every quota (0: none leased; the reply is then an
    /// ordinary check's of the request's cost).
    pub granted: u64,
    /// The take's reply, as a check of `granted` units (of the request's
    /// cost, when none were leased) replies it.
    pub reply: RateReply,
}

impl LeaseReply {
    /// A reply from its parts.
    pub fn new(granted: u64, reply: RateReply) -> Self {
        Self { granted, reply }
    }
}

/// How many units a quota lease asks for ([`RateBackend::lease_rate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSize {
    /// The most units to take (what is available, up to this).
    pub want: u64,
    /// The fewest worth taking, at least the request's cost: with fewer
    /// available, the call is an ordinary check of the request's cost.
    pub least: u64,
}

/// One [`Outcome`] per quota, the first held inline: a single-quota reply
/// allocates nothing.
pub type Outcomes = SmallVec<[Outcome; 1]>;

/// A backend's answer to a [`RateRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateReply {
    /// Whether every quota admitted the cost (and it was taken).
    pub allowed: bool,
    /// One outcome per quota.
    pub outcomes: Outcomes,
    /// The time the backend decided at (µs since the epoch): a refund of
    /// this decision gives back to the window charged then.
    pub now_micros: u64,
}

impl RateReply {
    /// A reply from its parts, decided at time 0 (see [`at`](Self::at)).
    pub fn new(allowed: bool, outcomes: impl Into<Outcomes>) -> Self {
        Self {
            allowed,
            outcomes: outcomes.into(),
            now_micros: 0,
        }
    }

    /// The refusal of a blocked subject, `left_micros` before the block
    /// ends: every quota refuses for that long, whatever it holds.
    pub fn blocked(quotas: usize, left_micros: u64) -> Self {
        let outcome = Outcome::from_reply(0, left_micros, left_micros, left_micros);
        Self::new(false, (0..quotas).map(|_| outcome).collect::<Outcomes>())
    }

    /// The reply, decided at `now_micros`.
    pub fn at(mut self, now_micros: u64) -> Self {
        self.now_micros = now_micros;
        self
    }

    /// How long until the slot of an admission reserved ahead (µs; see
    /// [`RateRequest::max_wait_micros`]): every quota's retry-after, which
    /// an admission for now leaves at 0. 0 for a denial.
    pub fn wait_micros(&self) -> u64 {
        match self.outcomes.first() {
            Some(o) if self.allowed => o.retry_after_micros,
            _ => 0,
        }
    }

    /// A reservation as the admission it is at its slot: decided then, no
    /// wait left (`None` for an admission for now or a denial).
    pub(crate) fn at_slot(&self) -> Option<RateReply> {
        let wait = self.wait_micros();
        (wait > 0).then(|| {
            let mut r = self.clone();
            r.now_micros = r.now_micros.saturating_add(wait);
            for o in &mut r.outcomes {
                o.retry_after_micros = 0;
            }
            r
        })
    }
}

/// Where rate-limit state lives. Implemented by [`RedisBackend`](crate::RedisBackend) and
/// [`MemoryBackend`](crate::MemoryBackend); a decision is atomic across all its keys.
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

    /// Corrects one admitted check to its actual cost, at most once per
    /// [`SettleRequest::marker`], and reports the figures after it. The
    /// default refuses (a backend written before settles existed).
    fn settle_rate<'a>(&'a self, request: &'a SettleRequest) -> BoxFuture<'a, Result<SettleReply>> {
        let _ = request;
        Box::pin(async {
            Err(crate::error::Error::InvalidConfig(
                "this rate-limit backend does not support settles or refunds".into(),
            ))
        })
    }

    /// The settle at once when no I/O is needed, like
    /// [`check_rate_now`](Self::check_rate_now). The default is `None`.
    fn settle_rate_now(&self, request: &SettleRequest) -> Option<Result<SettleReply>> {
        let _ = request;
        None
    }

    /// Whether this backend takes quota leases ([`lease_rate`](Self::lease_rate)):
    /// a limiter on one that does not checks every subject as usual. The
    /// default is `false`.
    fn supports_leases(&self) -> bool {
        false
    }

    /// A quota lease: in one atomic step, takes what is available of the
    /// request's quotas up to `size.want` units (a check of that many), or,
    /// when fewer than `size.least` are available, is an ordinary check of
    /// the request's `cost` and grants nothing (`granted == 0`). The request
    /// is a check's (its `cost` is what the caller needs now, at most
    /// `size.least`; its wait is ignored). The default refuses.
    fn lease_rate<'a>(
        &'a self,
        request: &'a RateRequest,
        size: LeaseSize,
    ) -> BoxFuture<'a, Result<LeaseReply>> {
        let _ = (request, size);
        Box::pin(async {
            Err(crate::error::Error::InvalidConfig(
                "this rate-limit backend does not support quota leases".into(),
            ))
        })
    }

    /// The lease at once when no I/O is needed, like
    /// [`check_rate_now`](Self::check_rate_now). The default is `None`.
    fn lease_rate_now(&self, request: &RateRequest, size: LeaseSize) -> Option<Result<LeaseReply>> {
        let _ = (request, size);
        None
    }

    /// A store in this process to decide on while this one is down: the
    /// local limiter of [`FailurePolicy::Fallback`](crate::FailurePolicy::Fallback).
    fn local_rate(&self) -> Arc<dyn RateBackend>;

    /// A short name for logs: `"memory"`, `"redis"`, ….
    fn kind(&self) -> &'static str;

    /// The clock this store decides by, when it is in this process and
    /// answers every check at once: a limiter without a clock of its own
    /// reads it once per check, passes the reading as the request's time
    /// (what the store would have read) and times its deny cache by it
    /// too. The default is none: the store times its decisions itself.
    fn decision_clock(&self) -> Option<Arc<dyn crate::clock::Clock>> {
        None
    }

    /// The operator plane of this store, if it has one: where a limiter
    /// registers, hears admin actions and reports whom it throttles. The
    /// default is none (a store of your own is not administered).
    fn admin(&self) -> Option<Arc<dyn AdminBackend>> {
        None
    }
}

impl<T: RateBackend + ?Sized> RateBackend for Arc<T> {
    fn check_rate<'a>(&'a self, request: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        (**self).check_rate(request)
    }

    fn check_rate_now(&self, request: &RateRequest) -> Option<Result<RateReply>> {
        (**self).check_rate_now(request)
    }

    fn settle_rate<'a>(&'a self, request: &'a SettleRequest) -> BoxFuture<'a, Result<SettleReply>> {
        (**self).settle_rate(request)
    }

    fn settle_rate_now(&self, request: &SettleRequest) -> Option<Result<SettleReply>> {
        (**self).settle_rate_now(request)
    }

    fn supports_leases(&self) -> bool {
        (**self).supports_leases()
    }

    fn lease_rate<'a>(
        &'a self,
        request: &'a RateRequest,
        size: LeaseSize,
    ) -> BoxFuture<'a, Result<LeaseReply>> {
        (**self).lease_rate(request, size)
    }

    fn lease_rate_now(&self, request: &RateRequest, size: LeaseSize) -> Option<Result<LeaseReply>> {
        (**self).lease_rate_now(request, size)
    }

    fn local_rate(&self) -> Arc<dyn RateBackend> {
        (**self).local_rate()
    }

    fn kind(&self) -> &'static str {
        (**self).kind()
    }

    fn decision_clock(&self) -> Option<Arc<dyn crate::clock::Clock>> {
        (**self).decision_clock()
    }

    fn admin(&self) -> Option<Arc<dyn AdminBackend>> {
        (**self).admin()
    }
}
