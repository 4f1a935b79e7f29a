//! [`RateLimiterBuilder`] and the constructors of [`RateLimiter`]: every
//! setting is checked once, here, before any round trip.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::deny_cache::DenyCache;
use super::lease::{Leases, QuotaLeases};
use super::limiter::{Inner, Operated, RateLimiter, BLOCK_KIND, DEFAULT_TIMEOUT};
use super::refund::unclaimed;
use super::{Algorithm, Quota, MAX_LOG_LIMIT};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::failure::breaker::Breaker;
use crate::failure::{FailurePolicy, DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_THRESHOLD};
use crate::keyspace::{hex, Keyspace, DEFAULT_PREFIX};
use crate::store::RateBackend;

const DEFAULT_DENY_CACHE: usize = 10_000;

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
            max_debt: None,
            register: true,
            leases: None,
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
    max_debt: Option<u64>,
    /// Whether it registers itself (the operator plane's own rebuilt
    /// limiters and local fallbacks do not).
    register: bool,
    /// Quota leases of hot subjects, when opted in.
    leases: Option<QuotaLeases>,
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

    /// Names the policy. Limiters with the same prefix, name and algorithm
    /// share counters (keys carry the algorithm: another algorithm under
    /// the same name keeps its own); by default the name is derived from the
    /// algorithm and quotas, so differently configured limiters never share
    /// them.
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

    /// The most a [`settle`](RateLimiter::settle) over the estimate may put
    /// a subject into debt, in units, per quota (default: each quota's
    /// capacity — the burst for buckets, the limit for windows). 0 forgives
    /// every overrun: a settle then only gives back. At most
    /// [`MAX_LOG_LIMIT`](super::MAX_LOG_LIMIT) for the sliding log (one
    /// entry per unit owed) and 2^40 for the others; a bucket's debt also
    /// ends at most 2^40 µs (about 12 days) ahead, and sooner on a quota
    /// whose rate divides a µs into more than 2^11 parts (2^51 of them:
    /// about 2.6 days for 10 007 per minute).
    pub fn max_debt(mut self, units: u64) -> Self {
        self.max_debt = Some(units);
        self
    }

    /// Leases quota for hot subjects ([`QuotaLeases`]): a subject this
    /// instance checks often is answered from units taken on the backend
    /// in one call, without a round trip per check. Token bucket, GCRA and
    /// fixed window only (the sliding windows are refused at build). On a
    /// backend without leases ([`RateBackend::supports_leases`](crate::RateBackend::supports_leases)),
    /// every check is an ordinary one. Off by default.
    pub fn quota_leases(mut self, leases: QuotaLeases) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Not written into the operator plane's registry (it still hears
    /// admin actions and honours blocks).
    pub(crate) fn unregistered(mut self) -> Self {
        self.register = false;
        self
    }

    /// Checks the configuration and builds the limiter.
    pub fn build(self) -> Result<RateLimiter> {
        // The first read of the clock calibrates it: here, never in a check.
        crate::clock::start();
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
            if self.algorithm.uses_burst() {
                q.check_bucket_exact()?;
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
        if let Some(leases) = &self.leases {
            leases.validate(self.algorithm)?;
        }
        let name = match self.name {
            Some(n) => n,
            None => default_name(self.algorithm, &self.quotas),
        };
        let keyspace = Keyspace::new(self.prefix, name)?;
        let fallback = match self.policy {
            FailurePolicy::Fallback { instances } => {
                let n = u64::from(instances.get());
                let mut b = RateLimiter::builder(self.backend.local_rate(), self.algorithm)
                    .prefix(keyspace.prefix())
                    .name(keyspace.policy())
                    .deny_cache(0)
                    .unregistered();
                // Each instance's share of the debt, as of the quota.
                if let Some(debt) = self.max_debt {
                    b = b.max_debt(debt / n);
                }
                for q in &self.quotas {
                    let share = fallback_share(q, n)?;
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
        let quotas: Arc<[Quota]> = self.quotas.into();
        let deny_cache = (self.deny_cache > 0).then(|| Arc::new(DenyCache::new(self.deny_cache)));
        let unclaimed = unclaimed(
            Arc::clone(&self.backend),
            self.algorithm,
            Arc::clone(&quotas),
            self.clock.clone(),
            deny_cache.clone(),
            keyspace.policy().to_owned(),
        );
        let operated = self.backend.admin().map(|store| Operated {
            store,
            tally: Arc::default(),
            block_head: keyspace.head_of(BLOCK_KIND),
        });
        let leases = match self.leases {
            // A backend without leases checks every subject as usual.
            Some(settings) if self.backend.supports_leases() => {
                let mut b = RateLimiter::builder(Arc::clone(&self.backend), self.algorithm)
                    .prefix(keyspace.prefix())
                    .name(keyspace.policy())
                    .timeout(self.timeout)
                    .deny_cache(0)
                    .unregistered();
                if let Some(clock) = &self.clock {
                    b.clock = Some(Arc::clone(clock));
                }
                if let Some(debt) = self.max_debt {
                    b = b.max_debt(debt);
                }
                for q in quotas.iter() {
                    b = b.quota(*q);
                }
                let returner = b.build()?;
                Some(Leases::new(
                    settings,
                    self.algorithm,
                    Arc::clone(&quotas),
                    returner,
                ))
            }
            _ => None,
        };
        let timing = self.clock.clone().or_else(|| self.backend.decision_clock());
        let limiter = RateLimiter {
            inner: Arc::new(Inner {
                backend: self.backend,
                algorithm: self.algorithm,
                quotas,
                key_head: keyspace.head_of(self.algorithm.short_name()),
                keyspace,
                timing,
                clock: self.clock,
                timeout: self.timeout,
                policy: self.policy,
                fallback,
                max_debt: self.max_debt.map(|d| {
                    d.min(match self.algorithm {
                        Algorithm::SlidingWindowLog => super::MAX_LOG_LIMIT,
                        _ => 1 << 40,
                    })
                }),
                breaker: Breaker::new(self.breaker.0, self.breaker.1),
                deny_cache,
                unclaimed,
                operated,
                leases,
            }),
        };
        limiter.operate(self.register);
        Ok(limiter)
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

/// One instance's share of `q` over `n` instances: the limit divided by
/// `n` over the same period; a limit below `n`, one unit over a period
/// `n / limit` times as long (at most ten years), since one unit per period
/// each would let the instances admit `n` times a small limit.
fn fallback_share(q: &Quota, n: u64) -> Result<Quota> {
    if q.limit() >= n {
        return Quota::new(q.limit() / n, q.period());
    }
    let stretched = (u128::from(q.period_micros()) * u128::from(n)).div_ceil(u128::from(q.limit()));
    let micros = u64::try_from(stretched)
        .unwrap_or(u64::MAX)
        .min(crate::quota::MAX_PERIOD_MICROS);
    Quota::new(1, Duration::from_micros(micros))
}
