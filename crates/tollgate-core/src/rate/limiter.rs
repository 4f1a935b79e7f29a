//! [`RateLimiter`]: a policy (algorithm, quotas, keyspace) over a backend, with
//! a failure policy, a bounded timeout, a circuit breaker ([`Breaker`]) and a
//! deny cache ([`DenyCache`]).

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::charge::{charge_of, next_id};
use super::deny_cache::{DenyCache, Sent};
use super::lease::{self, Taking};
use super::{Algorithm, Decision, DecisionSource, Outcome, Quota};
use crate::clock::{monotonic_micros, Clock};
use crate::error::{within, Error, Result};
use crate::failure::breaker::Breaker;
use crate::failure::{is_outage, FailurePolicy};
use crate::keyspace::{Keyspace, Subject};
use crate::plane::tally::Tally;
use crate::store::{AdminBackend, Quotas, RateBackend, RateReply, RateRequest, Unclaimed};

/// Default bound on one check's round trip.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// A rate-limit policy over a backend. Cheap to clone; clones share state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter};
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
    pub(super) inner: Arc<Inner>,
}

/// The kind in a block key's name (`<prefix>:<name>:block:{<subject>}`).
pub(super) const BLOCK_KIND: &str = "block";

/// What a limiter keeps for the operator plane.
pub(super) struct Operated {
    pub(super) store: Arc<dyn AdminBackend>,
    pub(super) tally: Arc<Tally>,
    /// `<prefix>:<name>:block:{`: a subject's block key is this, the
    /// subject and `}`.
    pub(super) block_head: String,
}

pub(super) struct Inner {
    pub(super) backend: Arc<dyn RateBackend>,
    pub(super) algorithm: Algorithm,
    pub(super) quotas: Arc<[Quota]>,
    pub(super) keyspace: Keyspace,
    pub(super) clock: Option<Arc<dyn Clock>>,
    /// What times a decision: `clock`, else the clock of a store that
    /// decides in process ([`RateBackend::decision_clock`]); `None`: the
    /// store's own time (Redis `TIME`).
    pub(super) timing: Option<Arc<dyn Clock>>,
    /// `<prefix>:<name>:<algorithm>:{`: a one-quota key is this, the
    /// subject and `}`.
    pub(super) key_head: String,
    pub(super) timeout: Duration,
    pub(super) policy: FailurePolicy,
    pub(super) fallback: Option<RateLimiter>,
    /// The most debt a settle leaves per quota; `None`: each quota's capacity.
    pub(super) max_debt: Option<u64>,
    pub(super) breaker: Breaker,
    /// Shared with the give-back of unclaimed admissions, which clears it.
    pub(super) deny_cache: Option<Arc<DenyCache>>,
    /// Gives back admissions whose callers had stopped waiting.
    pub(super) unclaimed: Unclaimed,
    /// The operator plane of the store, if it has one.
    pub(super) operated: Option<Operated>,
    /// Quota leases of hot subjects, when opted in.
    pub(super) leases: Option<super::lease::Leases>,
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

impl RateLimiter {
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

    /// The keys a check of `subject` touches, one per quota:
    /// `<prefix>:<name>:<algorithm>:{<subject>}`, with `:q<i>` after the
    /// hash tag when there are several quotas. The algorithm's
    /// [short name](Algorithm::short_name) is part of every key, so limiters
    /// that share a name but not an algorithm never read each other's state.
    ///
    /// ```
    /// use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter, Subject};
    ///
    /// let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
    ///     .quota(Quota::per_second(10))
    ///     .prefix("app")
    ///     .name("api")
    ///     .build()?;
    /// assert_eq!(limiter.keys_for(&Subject::new("alice")), ["app:api:gcra:{alice}"]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn keys_for(&self, subject: &Subject) -> Vec<String> {
        let (ks, kind) = (&self.inner.keyspace, self.inner.algorithm.short_name());
        if self.inner.quotas.len() == 1 {
            vec![ks.key_of(kind, subject, None)]
        } else {
            (0..self.inner.quotas.len())
                .map(|i| ks.key_of(kind, subject, Some(&format!("q{i}"))))
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
    /// (before any round trip); an outage only under
    /// [`FailurePolicy::Deny`]; an error about this request's data (a
    /// script error, a reply no script gives) under every policy — it is
    /// not an outage, so no policy admits it.
    pub async fn check_n(&self, subject: impl Into<Subject>, cost: u64) -> Result<Decision> {
        let subject = subject.into();
        match self.start(&subject, cost, 0) {
            Ok(decided) => decided,
            Err(prepared) => self.send(prepared, &subject).await,
        }
    }

    /// [`check_n`](Self::check_n) that a token bucket or GCRA may admit at
    /// a slot up to `max_wait_micros` ahead (see [`RateLimiter::acquire`]).
    pub(super) async fn check_for_slot(
        &self,
        subject: &Subject,
        cost: u64,
        max_wait_micros: u64,
    ) -> Result<Decision> {
        match self.start(subject, cost, max_wait_micros) {
            Ok(decided) => decided,
            Err(prepared) => self.send(prepared, subject).await,
        }
    }

    /// The round trip, bounded by the timeout.
    pub(super) async fn send(&self, mut prepared: Prepared, subject: &Subject) -> Result<Decision> {
        let inner = &self.inner;
        prepared.request.deadline = Instant::now().checked_add(inner.timeout);
        // Only a round trip can come back after its caller left: a check
        // decided in process carries no hook (no reference count per check).
        prepared.request.unclaimed = Some(inner.unclaimed.clone());
        let outcome = {
            // A span per round trip (none in process): what a trace of a
            // slow request shows. Built only when a subscriber may take
            // debug spans: with none, tracing's `log` bridge (on with axum's
            // default `tower-log`) would record and log it for nothing.
            let span = if tracing::level_enabled!(tracing::Level::DEBUG) {
                tracing::debug_span!(
                    "tollgate.rate.check",
                    policy = inner.keyspace.policy(),
                    store = inner.backend.kind(),
                    cost = prepared.request.cost,
                )
            } else {
                tracing::Span::none()
            };
            let call = lease::check(&prepared.lease, &*inner.backend, &prepared.request);
            within(inner.timeout, tracing::Instrument::instrument(call, span)).await
        };
        let mut decision = self.conclude(subject, prepared.sent, &prepared.request, outcome);
        // The store is done with them: the keys go to this thread's spares.
        return_keys(prepared.request.keys);
        Taking::charge(&prepared.lease, &mut decision);
        decision
    }

    /// Everything up to the round trip; `Err` carries the request to send.
    // Moved, not boxed: a box would cost an allocation per round trip.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub(super) fn start(
        &self,
        subject: &Subject,
        cost: u64,
        max_wait_micros: u64,
    ) -> std::result::Result<Result<Decision>, Prepared> {
        let inner = &self.inner;
        for q in inner.quotas.iter() {
            let capacity = inner.algorithm.capacity(q);
            if cost > capacity {
                return Ok(Err(Error::CostExceedsCapacity { cost, capacity }));
            }
        }
        // A subject with a live quota lease is answered from it.
        let (hot, leased_at) = match self.serve_leased(subject, cost, max_wait_micros) {
            Ok(d) => {
                // Served from a slice: an admission the operator plane counts.
                if let Some(op) = &inner.operated {
                    op.tally.admitted();
                }
                return Ok(Ok(d));
            }
            Err(hot) => hot,
        };
        let keys = take_keys(inner, subject);
        // The clock that times the decision (the limiter's, else an
        // in-process store's) is the deny cache's too: read once.
        let now_micros = inner.timing.as_ref().map(|c| c.now_micros());
        let sent = self.sent(now_micros);
        if let Some(cache) = &inner.deny_cache {
            // A bucket reserves a wait that fits on the store: a cached
            // denial answers only a wait longer than the caller's.
            let reserves = max_wait_micros > 0 && inner.algorithm.uses_burst();
            let fits = |d: &Decision| {
                d.retry_after
                    .is_some_and(|r| r.as_micros() <= u128::from(max_wait_micros))
            };
            if let Some(d) = cache
                .get(&keys[0], cost, sent.at)
                .filter(|d| !(reserves && fits(d)))
            {
                tracing::debug!(policy = inner.keyspace.policy(), subject = %subject.digest(), "denied from the local deny cache");
                if let Some(op) = &inner.operated {
                    op.tally.denied(subject);
                }
                return_keys(keys);
                return Ok(Ok(d));
            }
        }
        if !inner.breaker.admits() {
            return_keys(keys);
            return Ok(self.on_failure(subject, cost, Error::CircuitOpen));
        }
        let lease = self.begin_lease(hot, subject, cost, leased_at);
        let mut keys = keys;
        add_block_key(inner, subject, &mut keys);
        let request = RateRequest {
            algorithm: inner.algorithm,
            keys,
            quotas: Quotas::of(&inner.quotas),
            cost,
            now_micros,
            // A limiter with no clock of its own times checks by its store's.
            store_clock: inner.clock.is_none(),
            // The log's member prefix, and every charge's refund id.
            nonce: next_id(),
            max_wait_micros,
            deadline: None,
            unclaimed: None,
        };
        match lease::check_now(&lease, &*inner.backend, &request) {
            Some(outcome) => {
                let mut decision = self.conclude(subject, sent, &request, outcome);
                return_keys(request.keys);
                Taking::charge(&lease, &mut decision);
                Ok(decision)
            }
            None => Err(Prepared {
                request,
                sent,
                lease,
            }),
        }
    }

    /// Turns the backend's answer (or failure) into a decision.
    #[inline]
    pub(super) fn conclude(
        &self,
        subject: &Subject,
        sent: Sent,
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
                let e = Error::Protocol(format!(
                    "{} outcomes for {} quotas",
                    reply.outcomes.len(),
                    inner.quotas.len()
                ));
                return self.on_error(subject, request.cost, e);
            }
            Err(e) => return self.on_error(subject, request.cost, e),
        };
        Ok(self.decided(subject, sent, request, &reply))
    }

    /// The decision from the store's reply to `request`, one outcome per
    /// quota: the charge of an admission, the deny cache entry of a denial
    /// (under the first key).
    #[inline]
    fn decided(
        &self,
        subject: &Subject,
        sent: Sent,
        request: &RateRequest,
        reply: &RateReply,
    ) -> Decision {
        let inner = &self.inner;
        // A reservation is decided as the admission it is at its slot.
        let wait = reply.wait_micros();
        let slot = reply.at_slot();
        let reply = slot.as_ref().unwrap_or(reply);
        let mut d = Decision::from_outcomes(
            inner.algorithm,
            &inner.quotas,
            &reply.outcomes,
            reply.allowed,
            DecisionSource::Backend,
        );
        d.charge = charge_of(inner.algorithm, request, reply, &d);
        if let Some(c) = &mut d.charge {
            // Charged at its slot, taken now.
            c.taken_micros = c.at_micros.saturating_sub(wait);
        }
        // A reservation's wait until its slot: `acquire` waits it out.
        d.waited = Duration::from_micros(wait);
        if reply.allowed {
            if let Some(op) = &inner.operated {
                op.tally.admitted();
            }
            tracing::trace!(policy = inner.keyspace.policy(), subject = %subject.digest(), remaining = d.remaining, "admitted");
        } else {
            // Middleware reports decisions at info; the plain API at debug.
            tracing::debug!(policy = inner.keyspace.policy(), subject = %subject.digest(), retry_after = ?d.retry_after, "rate limited");
            if let Some(op) = &inner.operated {
                op.tally.denied(subject);
            }
            if let Some(cache) = &inner.deny_cache {
                let replied_at = self.cache_now();
                cache.insert(&request.keys[0], request.cost, sent, replied_at, &d);
            }
        }
        d
    }

    /// A failed round trip. Only an outage (unreachable, overloaded, or
    /// refusing every request) trips the breaker and gets the failure
    /// policy. An error about one request's data (a script error, a wrong
    /// key type, a reply no script gives) says nothing about other subjects
    /// and is returned under every policy: admitting it would lift the
    /// limit of that subject for as long as the data stays (issue #16).
    fn on_error(&self, subject: &Subject, cost: u64, error: Error) -> Result<Decision> {
        let inner = &self.inner;
        if is_outage(&error) {
            inner.breaker.failure(monotonic_micros());
            return self.on_failure(subject, cost, error);
        }
        inner.breaker.success();
        tracing::warn!(policy = inner.keyspace.policy(), subject = %subject.digest(), error = %error, "rate-limit check failed on this subject's data; not admitted");
        Err(error)
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
                    .map(|q| Outcome::from_reply(inner.algorithm.capacity(q), 0, 0, 0))
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
                let most = fallback
                    .quotas()
                    .iter()
                    .map(|q| fallback.algorithm().capacity(q))
                    .min()
                    .unwrap_or(cost);
                // A cost above the local share is denied, never discounted:
                // charging it as the share would let N instances admit
                // N × cost per refill. It is a denial (429, Retry-After), not
                // `CostExceedsCapacity` (413, "waiting cannot help"): it fits
                // the global quota, so it may pass once the backend is back.
                // Its denial reports the local state: a peek, which takes nothing.
                let oversized = cost > most;
                match fallback.start(subject, if oversized { 0 } else { cost }, 0) {
                    Ok(decided) if oversized => decided.map(|d| deny_oversized(cost, d)),
                    Ok(decided) => decided.map(|mut d| {
                        d.source = DecisionSource::Fallback;
                        // Refunded to the fallback, where it was taken.
                        if let Some(c) = &mut d.charge {
                            c.local = true;
                        }
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

    /// When a check timed `now_micros` (by [`Inner::timing`]) is sent, as
    /// the deny cache caches the denial it brings back; nothing without one.
    pub(super) fn sent(&self, now_micros: Option<u64>) -> Sent {
        match &self.inner.deny_cache {
            Some(cache) => Sent {
                at: now_micros.unwrap_or_else(monotonic_micros),
                forgets: cache.forgets(),
            },
            None => Sent::default(),
        }
    }

    /// The deny cache's and the quota leases' time: the clock that times
    /// decisions (a slice then ages as the store's windows move), else
    /// this process's monotonic clock.
    pub(super) fn cache_now(&self) -> u64 {
        match &self.inner.timing {
            Some(c) => c.now_micros(),
            None => monotonic_micros(),
        }
    }

    pub(super) fn local_now(&self) -> u64 {
        match &self.inner.clock {
            Some(c) => c.now_micros(),
            None => monotonic_micros(),
        }
    }
}

thread_local! {
    /// This thread's spare key lists: a check writes its keys into one and
    /// gives it back once decided (in process, or after its round trip), so
    /// checks allocate no keys, however many are in flight.
    static KEYS: RefCell<Vec<Vec<String>>> = const { RefCell::new(Vec::new()) };
}

/// Spare key lists a thread keeps (as many checks in flight as a lean
/// batch holds by default).
const SPARE_KEY_LISTS: usize = 64;

/// A check ready for its round trip.
pub(super) struct Prepared {
    pub(super) request: RateRequest,
    /// Local time before sending, for the deny cache.
    pub(super) sent: Sent,
    /// The quota lease this check takes, if it takes one.
    pub(super) lease: Option<Taking>,
}

/// The keys of `subject` under `inner`'s keyspace (as
/// [`RateLimiter::keys_for`]), in one of this thread's spare lists, taken
/// out while the check runs (give it back with [`return_keys`]); a new one
/// when none is spare.
fn take_keys(inner: &Inner, subject: &Subject) -> Vec<String> {
    let spare = KEYS.try_with(|k| k.try_borrow_mut().ok()?.pop());
    let mut keys = spare.ok().flatten().unwrap_or_default();
    let (ks, kind, n) = (
        &inner.keyspace,
        inner.algorithm.short_name(),
        inner.quotas.len(),
    );
    // A store with an operator plane also reads the subject's block key,
    // last: its place is kept here, written by `add_block_key`.
    let total = n + usize::from(inner.operated.is_some());
    keys.resize_with(total, String::new);
    keys.truncate(total);
    if n == 1 {
        keys[0].clear();
        Keyspace::write_key_after(&inner.key_head, subject, &mut keys[0]);
    } else {
        for (i, key) in keys[..n].iter_mut().enumerate() {
            *key = ks.key_of(kind, subject, Some(&format!("q{i}")));
        }
    }
    keys
}

/// After the quota keys, the subject's block key, which every check
/// script reads when the store has an operator plane (added only once the
/// check goes to the store: a deny-cache answer needs none).
fn add_block_key(inner: &Inner, subject: &Subject, keys: &mut [String]) {
    let Some(op) = &inner.operated else {
        return;
    };
    let key = &mut keys[inner.quotas.len()];
    key.clear();
    // An in-process store that holds no block reads none: left empty.
    if op.store.may_block() {
        Keyspace::write_key_after(&op.block_head, subject, key);
    }
}

fn return_keys(keys: Vec<String>) {
    // A thread being torn down keeps none.
    let _ = KEYS.try_with(|k| {
        if let Ok(mut spare) = k.try_borrow_mut() {
            if spare.len() < SPARE_KEY_LISTS {
                spare.push(keys);
            }
        }
    });
}

/// The fallback's denial of a cost above its local share, from a peek `d`
/// of the local state: every quota that cannot hold `cost` denies it, with
/// one period of that quota as the retry-after (when the backend may be back).
fn deny_oversized(cost: u64, mut d: Decision) -> Decision {
    for q in &mut d.quotas {
        if cost > q.limit {
            q.allowed = false;
            let wait = q.quota.period().max(Duration::from_micros(1));
            q.retry_after = Some(wait);
            q.next_after = q.next_after.min(wait);
        }
    }
    let strictest = d
        .quotas
        .iter()
        .filter(|q| !q.allowed)
        .max_by_key(|q| q.retry_after)
        .copied();
    if let Some(s) = strictest {
        d.allowed = false;
        d.limit = s.limit;
        d.remaining = s.remaining;
        d.reset_after = s.reset_after;
        d.retry_after = s.retry_after;
    }
    d.source = DecisionSource::Fallback;
    // A peek's charge of 0 units: nothing of this refusal to settle.
    if !d.allowed {
        d.charge = None;
    }
    d
}
