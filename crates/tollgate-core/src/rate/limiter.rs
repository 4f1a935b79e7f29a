//! [`RateLimiter`]: a policy (algorithm, quotas, keyspace) over a backend, with
//! a failure policy, a bounded timeout, a circuit breaker and a deny cache.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::{Algorithm, Decision, Outcome, Quota, MAX_LOG_LIMIT};
use crate::backend::{MemoryBackend, RateBackend, RateReply, RateRequest};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::keyspace::{hex, Keyspace, Subject, DEFAULT_PREFIX};

/// Default bound on one check's round trip.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_BREAKER_THRESHOLD: u32 = 5;
const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(1);
const DEFAULT_DENY_CACHE: usize = 10_000;

/// What a limiter does when its backend fails (error, timeout, open circuit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit the request (the default): a limiter outage is not a service outage.
    #[default]
    Allow,
    /// Refuse the request: `check` returns the error (503 over HTTP).
    Deny,
    /// Decide with a local in-memory limiter whose limits are divided by the
    /// number of instances, so N instances together stay near the global
    /// rate instead of N times it.
    Fallback {
        /// How many instances share the global limit.
        instances: NonZeroU32,
    },
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

/// A rate-limit policy over a backend. Cheap to clone; clones share state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate_core::Error> {
/// use tollgate_core::{Algorithm, MemoryBackend, Quota, RateLimiter};
///
/// // 10 per second AND 100 per hour, checked together.
/// let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::SlidingWindowCounter)
///     .quota(Quota::per_second(10))
///     .quota(Quota::per_hour(100))
///     .name("api")
///     .build()?;
/// let d = limiter.check_n("alice", 3).await?;
/// assert!(d.allowed);
/// assert_eq!(d.quotas.len(), 2);
/// assert_eq!(d.remaining, 7);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn RateBackend>,
    algorithm: Algorithm,
    quotas: Arc<[Quota]>,
    keyspace: Keyspace,
    clock: Option<Arc<dyn Clock>>,
    timeout: Duration,
    policy: FailurePolicy,
    fallback: Option<RateLimiter>,
    breaker: Breaker,
    deny_cache: Option<DenyCache>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("algorithm", &self.inner.algorithm)
            .field("quotas", &self.inner.quotas)
            .field("keyspace", &self.inner.keyspace)
            .field("backend", &self.inner.backend.kind())
            .field("policy", &self.inner.policy)
            .finish()
    }
}

macro_rules! constructor {
    ($(#[$doc:meta])* $name:ident, $alg:expr) => {
        $(#[$doc])*
        pub fn $name(backend: impl RateBackend, quota: Quota) -> Result<Self> {
            Self::builder(backend, $alg).quota(quota).build()
        }
    };
}

impl RateLimiter {
    /// A builder for a limiter running `algorithm` on `backend`.
    pub fn builder(backend: impl RateBackend, algorithm: Algorithm) -> RateLimiterBuilder {
        RateLimiterBuilder {
            backend: Arc::new(backend),
            algorithm,
            quotas: Vec::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
            name: None,
            clock: None,
            timeout: DEFAULT_TIMEOUT,
            policy: FailurePolicy::Allow,
            breaker: (DEFAULT_BREAKER_THRESHOLD, DEFAULT_BREAKER_COOLDOWN),
            deny_cache: DEFAULT_DENY_CACHE,
        }
    }

    constructor!(
        /// A fixed-window limiter with one quota.
        fixed_window, Algorithm::FixedWindow);
    constructor!(
        /// A sliding-window-log limiter with one quota.
        sliding_window_log, Algorithm::SlidingWindowLog);
    constructor!(
        /// A sliding-window-counter limiter with one quota.
        sliding_window_counter, Algorithm::SlidingWindowCounter);
    constructor!(
        /// A token-bucket limiter with one quota (capacity = the quota's burst).
        token_bucket, Algorithm::TokenBucket);
    constructor!(
        /// A GCRA limiter with one quota.
        gcra, Algorithm::Gcra);

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// The quotas, in configuration order.
    pub fn quotas(&self) -> &[Quota] {
        &self.inner.quotas
    }

    /// The keyspace (prefix and policy name).
    pub fn keyspace(&self) -> &Keyspace {
        &self.inner.keyspace
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.inner.policy
    }

    /// The backend's kind (`"memory"`, `"redis"`, `"cluster"`).
    pub fn backend_kind(&self) -> &'static str {
        self.inner.backend.kind()
    }

    /// The keys a check of `subject` touches, one per quota.
    pub fn keys_for(&self, subject: &Subject) -> Vec<String> {
        let ks = &self.inner.keyspace;
        if self.inner.quotas.len() == 1 {
            vec![ks.key(subject, None)]
        } else {
            (0..self.inner.quotas.len())
                .map(|i| ks.key(subject, Some(&format!("q{i}"))))
                .collect()
        }
    }

    /// Checks one unit for `subject`.
    pub async fn check(&self, subject: impl Into<Subject>) -> Result<Decision> {
        self.check_n(subject, 1).await
    }

    /// Checks `cost` units for `subject`, all quotas together: admitted only
    /// if every quota admits it, and then taken from every quota.
    ///
    /// Errors: [`Error::CostExceedsCapacity`] when the cost can never fit
    /// (before any round trip); backend errors only under
    /// [`FailurePolicy::Deny`].
    pub async fn check_n(&self, subject: impl Into<Subject>, cost: u64) -> Result<Decision> {
        let subject = subject.into();
        match self.start(&subject, cost) {
            Ok(decided) => decided,
            Err(prepared) => self.send(prepared, &subject).await,
        }
    }

    /// Decides at once when no round trip is needed: on an in-process
    /// backend ([`MemoryBackend`]), from the deny cache, for a cost that can
    /// never fit, or while the circuit is open. Otherwise returns the
    /// [`PendingCheck`] to [`send`](PendingCheck::send).
    ///
    /// [`check_n`](Self::check_n) is this followed by `send`; middleware uses
    /// the two halves to skip allocating a future when the answer is ready.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate_core::Error> {
    /// use tollgate_core::{MemoryBackend, Quota, RateLimiter, Subject};
    ///
    /// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_second(1))?;
    /// let alice = Subject::new("alice");
    /// let decision = match limiter.try_check_now(&alice, 1) {
    ///     Ok(decided) => decided?,
    ///     Err(pending) => pending.send().await?,
    /// };
    /// assert!(decision.allowed);
    /// // The memory backend always answers at once.
    /// assert!(!limiter.try_check_now(&alice, 1).expect("in process")?.allowed);
    /// # Ok(()) }
    /// ```
    #[allow(clippy::result_large_err)] // the Err is the work left to do, not a failure
    pub fn try_check_now(
        &self,
        subject: &Subject,
        cost: u64,
    ) -> std::result::Result<Result<Decision>, PendingCheck> {
        self.start(subject, cost).map_err(|prepared| PendingCheck {
            limiter: self.clone(),
            subject: subject.clone(),
            prepared,
        })
    }

    /// Everything up to the round trip; `Err` carries the request to send.
    fn start(
        &self,
        subject: &Subject,
        cost: u64,
    ) -> std::result::Result<Result<Decision>, Prepared> {
        let inner = &self.inner;
        for q in inner.quotas.iter() {
            let capacity = inner.algorithm.capacity(q);
            if cost > capacity {
                return Ok(Err(Error::CostExceedsCapacity { cost, capacity }));
            }
        }
        let keys = self.keys_for(subject);
        // Only the deny cache needs the local time (as of before the request
        // is sent); skip the clock read without one.
        let sent_at = if inner.deny_cache.is_some() {
            self.local_now()
        } else {
            0
        };
        if let Some(cache) = &inner.deny_cache {
            if let Some(d) = cache.get(&keys[0], cost, sent_at) {
                tracing::debug!(policy = inner.keyspace.policy(), subject = %subject.digest(), "denied from the local deny cache");
                return Ok(Ok(d));
            }
        }
        if !inner.breaker.admits() {
            return Ok(self.on_failure(subject, cost, Error::CircuitOpen));
        }
        let request = RateRequest {
            algorithm: inner.algorithm,
            keys,
            quotas: Arc::clone(&inner.quotas),
            cost,
            now_micros: inner.clock.as_ref().map(|c| c.now_micros()),
            // Only the log's members need a nonce; skip the syscall elsewhere.
            nonce: if inner.algorithm == Algorithm::SlidingWindowLog {
                random_u64()
            } else {
                0
            },
        };
        match inner.backend.check_rate_now(&request) {
            Some(outcome) => Ok(self.conclude(subject, sent_at, &request, outcome)),
            None => Err(Prepared { request, sent_at }),
        }
    }

    /// The round trip, bounded by the timeout.
    async fn send(&self, prepared: Prepared, subject: &Subject) -> Result<Decision> {
        let inner = &self.inner;
        let outcome = {
            let mut call = inner.backend.check_rate(&prepared.request);
            // A backend that answers on the first poll needs no timer (and
            // then none is required of the runtime).
            match futures_util::poll!(&mut call) {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => tokio::time::timeout(inner.timeout, call)
                    .await
                    .unwrap_or(Err(Error::Timeout(inner.timeout))),
            }
        };
        self.conclude(subject, prepared.sent_at, &prepared.request, outcome)
    }

    /// Turns the backend's answer (or failure) into a decision.
    fn conclude(
        &self,
        subject: &Subject,
        sent_at: u64,
        request: &RateRequest,
        outcome: Result<RateReply>,
    ) -> Result<Decision> {
        let inner = &self.inner;
        let reply = match outcome {
            Ok(reply) if reply.outcomes.len() == inner.quotas.len() => {
                inner.breaker.success();
                reply
            }
            Ok(reply) => {
                inner.breaker.failure(monotonic_micros());
                let e = Error::Protocol(format!(
                    "{} outcomes for {} quotas",
                    reply.outcomes.len(),
                    inner.quotas.len()
                ));
                return self.on_failure(subject, request.cost, e);
            }
            Err(e) => {
                // Only an unreachable or overloaded backend trips the
                // breaker; an error about one key's data (WRONGTYPE, …)
                // says nothing about the others.
                if is_outage(&e) {
                    inner.breaker.failure(monotonic_micros());
                } else {
                    inner.breaker.success();
                }
                return self.on_failure(subject, request.cost, e);
            }
        };
        let d = Decision::from_outcomes(
            inner.algorithm,
            &inner.quotas,
            &reply.outcomes,
            reply.allowed,
            DecisionSource::Backend,
        );
        if reply.allowed {
            tracing::trace!(policy = inner.keyspace.policy(), subject = %subject.digest(), remaining = d.remaining, "admitted");
        } else {
            // Middleware reports decisions at info; the plain API at debug.
            tracing::debug!(policy = inner.keyspace.policy(), subject = %subject.digest(), retry_after = ?d.retry_after, "rate limited");
            if let Some(cache) = &inner.deny_cache {
                cache.insert(&request.keys[0], request.cost, sent_at, &d);
            }
        }
        Ok(d)
    }

    fn on_failure(&self, subject: &Subject, cost: u64, error: Error) -> Result<Decision> {
        let inner = &self.inner;
        if matches!(error, Error::CircuitOpen) {
            // Once per check while the circuit is open: keep it out of warn.
            tracing::debug!(policy = inner.keyspace.policy(), failure_policy = ?inner.policy, "rate-limit backend skipped: circuit open");
        } else {
            tracing::warn!(policy = inner.keyspace.policy(), error = %error, failure_policy = ?inner.policy, "rate-limit backend failed");
        }
        match inner.policy {
            FailurePolicy::Allow => {
                let outcomes: Vec<Outcome> = inner
                    .quotas
                    .iter()
                    .map(|q| Outcome::from_reply(inner.algorithm.capacity(q), 0, 0))
                    .collect();
                Ok(Decision::from_outcomes(
                    inner.algorithm,
                    &inner.quotas,
                    &outcomes,
                    true,
                    DecisionSource::FailOpen,
                ))
            }
            FailurePolicy::Deny => Err(error),
            FailurePolicy::Fallback { .. } => {
                let fallback = inner.fallback.as_ref().expect("built with the policy");
                // The local share is smaller than the global quota: a cost
                // that fits globally must not become "can never fit" here.
                let most = fallback
                    .quotas()
                    .iter()
                    .map(|q| fallback.algorithm().capacity(q))
                    .min()
                    .unwrap_or(cost);
                match fallback.start(subject, cost.min(most)) {
                    Ok(decided) => decided.map(|mut d| {
                        d.source = DecisionSource::Fallback;
                        d
                    }),
                    // The fallback runs on a MemoryBackend, which always
                    // answers in process: this arm is never taken.
                    Err(_) => {
                        debug_assert!(false, "the fallback limiter must answer in process");
                        Err(error)
                    }
                }
            }
        }
    }

    fn local_now(&self) -> u64 {
        match &self.inner.clock {
            Some(c) => c.now_micros(),
            None => monotonic_micros(),
        }
    }
}

/// A check that needs a round trip: see [`RateLimiter::try_check_now`].
#[must_use = "a pending check does nothing until it is sent"]
pub struct PendingCheck {
    limiter: RateLimiter,
    subject: Subject,
    prepared: Prepared,
}

struct Prepared {
    request: RateRequest,
    /// Local time before sending, for the deny cache.
    sent_at: u64,
}

impl PendingCheck {
    /// Sends the check (one round trip, bounded by the limiter's timeout)
    /// and decides, applying the failure policy as
    /// [`RateLimiter::check_n`] does. The decision is timed when it is sent.
    ///
    /// Send it promptly: when the circuit breaker is half-open, this check
    /// may be the one probe of the backend, and dropping it unsent keeps
    /// the circuit open for another cooldown.
    pub async fn send(mut self) -> Result<Decision> {
        // It may be sent a while after it was made: time it now.
        let inner = &self.limiter.inner;
        if let Some(clock) = &inner.clock {
            self.prepared.request.now_micros = Some(clock.now_micros());
        }
        if inner.deny_cache.is_some() {
            self.prepared.sent_at = self.limiter.local_now();
        }
        self.limiter.send(self.prepared, &self.subject).await
    }
}

impl fmt::Debug for PendingCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingCheck")
            .field("subject", &self.subject)
            .field("cost", &self.prepared.request.cost)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RateLimiter`]; every setting is checked by [`build`](Self::build).
#[must_use]
pub struct RateLimiterBuilder {
    backend: Arc<dyn RateBackend>,
    algorithm: Algorithm,
    quotas: Vec<Quota>,
    prefix: String,
    name: Option<String>,
    clock: Option<Arc<dyn Clock>>,
    timeout: Duration,
    policy: FailurePolicy,
    breaker: (u32, Duration),
    deny_cache: usize,
}

impl fmt::Debug for RateLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiterBuilder")
            .field("algorithm", &self.algorithm)
            .field("quotas", &self.quotas)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl RateLimiterBuilder {
    /// Adds a quota; all quotas are checked together, all or nothing.
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// The key prefix (default `tollgate`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Names the policy. Limiters with the same prefix and name share
    /// counters; by default the name is derived from the algorithm and quotas,
    /// so differently configured limiters never share them.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Times decisions with `clock` instead of the backend's clock (Redis
    /// `TIME`): for managed Redis that forbids `TIME` in scripts, and tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Bounds each round trip (default 100 ms); past it the failure policy applies.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What to do when the backend fails (default: allow).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// After `threshold` consecutive failures, skip the backend for `cooldown`
    /// (then let one probe through). Default: 5 failures, 1 s.
    pub fn circuit_breaker(mut self, threshold: u32, cooldown: Duration) -> Self {
        self.breaker = (threshold.max(1), cooldown);
        self
    }

    /// Remember up to `capacity` denied subjects locally until their own
    /// retry-after, so a flood from a blocked subject costs no round trip.
    /// An entry never outlives the wait the backend announced, so it never
    /// denies what the backend would admit. 0 turns it off; default 10 000.
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// Checks the configuration and builds the limiter.
    pub fn build(self) -> Result<RateLimiter> {
        if self.quotas.is_empty() {
            return Err(Error::InvalidConfig(
                "a limiter needs at least one quota".into(),
            ));
        }
        for q in &self.quotas {
            if q.has_explicit_burst() && !self.algorithm.uses_burst() {
                return Err(Error::InvalidQuota(format!(
                    "{q:?}: a burst applies to the token bucket and GCRA, not the {}",
                    self.algorithm
                )));
            }
            if self.algorithm == Algorithm::SlidingWindowLog && q.limit() > MAX_LOG_LIMIT {
                return Err(Error::InvalidQuota(format!(
                    "{q:?}: the sliding window log keeps one entry per request and accepts limits up to {MAX_LOG_LIMIT}; use the sliding window counter"
                )));
            }
            if self.algorithm == Algorithm::SlidingWindowCounter
                && q.limit()
                    .checked_mul(q.period_micros())
                    .is_none_or(|p| p > (1 << 53) - q.period_micros())
            {
                return Err(Error::InvalidQuota(format!(
                    "{q:?}: limit × period in µs must stay below 2^53 for exact arithmetic"
                )));
            }
        }
        let name = match self.name {
            Some(n) => n,
            None => default_name(self.algorithm, &self.quotas),
        };
        let keyspace = Keyspace::new(self.prefix, name)?;
        let fallback = match self.policy {
            FailurePolicy::Fallback { instances } => {
                let n = u64::from(instances.get());
                let mut b = RateLimiter::builder(MemoryBackend::new(), self.algorithm)
                    .prefix(keyspace.prefix())
                    .name(keyspace.policy())
                    .deny_cache(0);
                for q in &self.quotas {
                    let share = Quota::new((q.limit() / n).max(1), q.period())?;
                    let share = if q.has_explicit_burst() {
                        share.with_burst((q.burst() / n).max(1))?
                    } else {
                        share
                    };
                    b = b.quota(share);
                }
                Some(b.build()?)
            }
            _ => None,
        };
        Ok(RateLimiter {
            inner: Arc::new(Inner {
                backend: self.backend,
                algorithm: self.algorithm,
                quotas: self.quotas.into(),
                keyspace,
                clock: self.clock,
                timeout: self.timeout,
                policy: self.policy,
                fallback,
                breaker: Breaker::new(self.breaker.0, self.breaker.1),
                deny_cache: (self.deny_cache > 0).then(|| DenyCache::new(self.deny_cache)),
            }),
        })
    }
}

fn default_name(algorithm: Algorithm, quotas: &[Quota]) -> String {
    let mut h = Sha256::new();
    h.update(algorithm.short_name());
    for q in quotas {
        h.update(format!(
            "|{}/{}/{}",
            q.limit(),
            q.period_micros(),
            q.burst()
        ));
    }
    format!("{}-{}", algorithm.short_name(), hex(&h.finalize()[..4]))
}

/// Whether an error means the backend is unreachable or overloaded (what the
/// circuit breaker is for), as opposed to an error about one request's data.
fn is_outage(e: &Error) -> bool {
    match e {
        Error::Timeout(_) | Error::CircuitOpen => true,
        Error::Backend(b) => b.is_outage(),
        _ => false,
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // The OS CSPRNG; if it ever fails, fall back to a time-derived nonce
    // (a collision only merges two log entries of the same microsecond).
    if getrandom::fill(&mut b).is_err() {
        return monotonic_micros() ^ 0x9E37_79B9_7F4A_7C15;
    }
    u64::from_le_bytes(b)
}

/// Microseconds on this process's monotonic clock.
pub(crate) fn monotonic_micros() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Skips the backend after repeated failures, for a short cooldown.
struct Breaker {
    threshold: u32,
    cooldown_us: u64,
    failures: AtomicU32,
    open_until: AtomicU64,
}

impl Breaker {
    fn new(threshold: u32, cooldown: Duration) -> Self {
        Breaker {
            threshold,
            cooldown_us: cooldown.as_micros() as u64,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    /// Whether a call may go to the backend now. When the cooldown is over,
    /// exactly one caller probes (and pushes the deadline out for the rest).
    fn admits(&self) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true; // closed: no clock read on the hot path
        }
        let now = monotonic_micros();
        now >= until
            && self
                .open_until
                .compare_exchange(
                    until,
                    now + self.cooldown_us,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    fn success(&self) {
        // Read first: on the hot path nothing needs writing, and a store on
        // every check would bounce the cache line between cores.
        if self.failures.load(Ordering::Acquire) != 0 {
            self.failures.store(0, Ordering::Release);
        }
        if self.open_until.load(Ordering::Acquire) != 0 {
            self.open_until.store(0, Ordering::Release);
        }
    }

    fn failure(&self, now: u64) {
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= self.threshold {
            self.open_until
                .store((now + self.cooldown_us).max(1), Ordering::Release);
        }
    }
}

/// Denied subjects and until when (local clock), bounded: sharded so
/// concurrent checks rarely contend, and swept only when an entry can have
/// expired, so a full cache costs O(1) per denial.
struct DenyCache {
    shard_capacity: usize,
    shards: Vec<Mutex<DenyShard>>,
    hasher: std::hash::RandomState,
    /// The latest `until` ever inserted: once it has passed, every entry
    /// has run out (nobody is denied), and a lookup costs one atomic load
    /// instead of a hash and a lock.
    latest_until: AtomicU64,
}

#[derive(Default)]
struct DenyShard {
    map: HashMap<String, CachedDenial>,
    /// The earliest `until` of any entry: no sweep can free room before it.
    earliest: u64,
}

struct CachedDenial {
    until: u64,
    cost: u64,
    decision: Decision,
}

const DENY_SHARDS: usize = 16;

impl DenyCache {
    fn new(capacity: usize) -> Self {
        DenyCache {
            shard_capacity: capacity.div_ceil(DENY_SHARDS).max(1),
            shards: (0..DENY_SHARDS).map(|_| Mutex::default()).collect(),
            hasher: std::hash::RandomState::new(),
            latest_until: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, DenyShard> {
        use std::hash::BuildHasher;
        let i = self.hasher.hash_one(key) as usize % DENY_SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &str, cost: u64, now: u64) -> Option<Decision> {
        if now >= self.latest_until.load(Ordering::Relaxed) {
            return None;
        }
        let mut shard = self.shard(key);
        let entry = shard.map.get(key)?;
        if now >= entry.until {
            shard.map.remove(key);
            return None;
        }
        // A smaller cost may fit sooner than the cached wait: ask the backend.
        if cost < entry.cost {
            return None;
        }
        let mut d = entry.decision.clone();
        let left = Duration::from_micros(entry.until - now);
        d.retry_after = Some(left);
        d.reset_after = d.reset_after.max(left);
        d.source = DecisionSource::DenyCache;
        Some(d)
    }

    fn insert(&self, key: &str, cost: u64, sent_at: u64, d: &Decision) {
        let Some(retry) = d.retry_after else { return };
        // Measured from before the request was sent: never later than the
        // backend's own deadline.
        let until = sent_at + retry.as_micros() as u64;
        let mut shard = self.shard(key);
        if shard.map.len() >= self.shard_capacity && !shard.map.contains_key(key) {
            if sent_at < shard.earliest {
                return; // full of live entries: skip, at O(1)
            }
            shard.map.retain(|_, e| e.until > sent_at);
            shard.earliest = shard.map.values().map(|e| e.until).min().unwrap_or(0);
            if shard.map.len() >= self.shard_capacity {
                return;
            }
        }
        shard.earliest = if shard.map.is_empty() {
            until
        } else {
            shard.earliest.min(until)
        };
        shard.map.insert(
            key.to_owned(),
            CachedDenial {
                until,
                cost,
                decision: d.clone(),
            },
        );
        self.latest_until.fetch_max(until, Ordering::Relaxed);
    }
}
