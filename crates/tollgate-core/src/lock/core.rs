//! The engine of a [`Locker`](super::Locker), for one backend or a Redlock
//! alike: settings checked once, the wait loop over acquire attempts (made
//! by [`Instances`]), the lease hand-out, and the cache fill.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::instances::{Attempt, Instances};
use super::lease::Lease;
use super::options::{LockOptions, MAX_LOCK_DURATION};
use super::settings::{
    Settings, FENCE_TTL_TTLS, IDEMPOTENCY_POLICY, LOCK_POLICY, SEMAPHORE_POLICY,
};
use super::util::{instant_after, join, new_token, unit_random};
use super::waiters::Waiters;
use crate::error::{Error, Result};
use crate::failure::is_outage;
use crate::keyspace::{Keyspace, Subject};
use crate::store::{Holders, LockBackend, LockKeys};

/// Poll bound when no release subscription is established.
const POLL_WITHOUT_PUBSUB: Duration = Duration::from_millis(50);

/// The longest a fair waiter goes without trying again, whatever the poll
/// interval (an endless one relies on release notices): each try refreshes
/// its ticket, whose TTL follows from it, so a waiter that died at the head
/// of the queue holds the others back for seconds, not for as long as the
/// poll interval.
const FAIR_REFRESH: Duration = Duration::from_secs(5);

/// The pause after a split vote: uniform in [1 ms, max(5 ms, 4 × the
/// attempt's duration)].
fn split_pause(attempt: Duration) -> Duration {
    let span = (attempt * 4).max(Duration::from_millis(5));
    Duration::from_millis(1) + span.mul_f64(unit_random())
}

/// The first pause of a bounded wait after a backend error; it doubles per
/// consecutive error, up to the poll interval.
const ERROR_BACKOFF_START: Duration = Duration::from_millis(10);

/// The engine behind a `Locker`: its settings, checked once, over its
/// instances; the wait loop, the lease hand-out and the cache fill.
pub(crate) struct Core {
    pub(crate) instances: Arc<Instances>,
    keyspace: Keyspace,
    pub(crate) defaults: LockOptions,
    poll_interval: Duration,
    fence_ttl: Duration,
    /// `None`: a lock; `Some(n)`: a semaphore of n permits.
    permits: Option<u32>,
    /// Waiters are served in arrival order (a queue of expiring tickets).
    fair: bool,
    /// A bounded wait rides out backend errors until its bound. Not for a
    /// semaphore whose failure policy answers at once (allow or fall back):
    /// waiting out an outage would cost every request the whole bound.
    ride_out: bool,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.instances;
        let mut d = f.debug_struct(if i.is_redlock() { "Redlock" } else { "Locker" });
        if i.is_redlock() {
            d.field("instances", &i.len()).field("quorum", &i.quorum());
        } else {
            d.field("backend", &self.kind());
        }
        if let Some(n) = self.permits {
            d.field("permits", &n);
        }
        d.field("keyspace", &self.keyspace)
            .field("fair", &self.fair)
            .field("defaults", &self.defaults)
            .field("timeout", &i.timeout)
            .finish_non_exhaustive()
    }
}

/// What every attempt of one `acquire` call shares (moved into its tasks).
struct AcquireCtx {
    keys: LockKeys,
    /// A fair waiter's ticket and its TTL: the same for every attempt, so
    /// the waiter keeps its place in the queue.
    ticket: Option<(String, Duration)>,
    /// Held by each attempt from before it is spawned until it ends; leaving
    /// the queue takes it too, so an attempt still in flight when the waiter
    /// gives up cannot queue the ticket again after it was taken out.
    in_flight: Arc<tokio::sync::Mutex<()>>,
    name: String,
    options: LockOptions,
    first_ttl: Duration,
    fence_ttl: Duration,
    handle: Handle,
}

impl Core {
    pub(crate) fn new(
        backends: Vec<Arc<dyn LockBackend>>,
        redlock: bool,
        s: Settings,
    ) -> Result<Self> {
        if backends.is_empty() {
            return Err(Error::InvalidConfig(
                "a lock needs at least one backend instance".into(),
            ));
        }
        if !(s.drift_ratio.is_finite() && (0.0..1.0).contains(&s.drift_ratio)) {
            return Err(Error::InvalidConfig(format!(
                "the drift ratio must be in [0, 1), got {}",
                s.drift_ratio
            )));
        }
        if s.timeout.is_zero() || s.poll_interval.is_zero() {
            return Err(Error::InvalidConfig(
                "the lock timeout and poll interval must be positive".into(),
            ));
        }
        if s.fence_ttl < Duration::from_secs(1) || s.fence_ttl > MAX_LOCK_DURATION {
            return Err(Error::InvalidConfig(format!(
                "the fence TTL must be between 1 s and {MAX_LOCK_DURATION:?} (the default is 1 hour), got {:?}",
                s.fence_ttl
            )));
        }
        if redlock && (s.fair || s.permits.is_some()) {
            // Each master admits up to N, and a holder needs N/2 + 1 of M
            // masters: up to N·M / (M/2 + 1) holders (3 for N = 2, M = 3)
            // each win a quorum, so the bound would not hold for N > 1.
            return Err(Error::InvalidConfig(
                "semaphores and fair locks run on one backend (standalone, Sentinel or \
                 Cluster), not on a Redlock: a quorum per holder does not keep N permits"
                    .into(),
            ));
        }
        if let Some(n) = s.permits {
            if n == 0 || n > super::MAX_PERMITS {
                return Err(Error::InvalidConfig(format!(
                    "a semaphore has 1 to {} permits, got {n}",
                    super::MAX_PERMITS
                )));
            }
        }
        let default = match s.permits {
            Some(_) => SEMAPHORE_POLICY,
            None => s.policy,
        };
        if let Some(name) = &s.name {
            // Another kind's default policy would put this one on its keys.
            let taken = [LOCK_POLICY, SEMAPHORE_POLICY, IDEMPOTENCY_POLICY];
            if name != default && taken.contains(&name.as_str()) {
                return Err(Error::InvalidConfig(format!(
                    "{name:?} is the default name of another kind (locks `{LOCK_POLICY}`, \
                     semaphores `{SEMAPHORE_POLICY}`, idempotency `{IDEMPOTENCY_POLICY}`): \
                     their keys would be shared"
                )));
            }
        }
        let policy = s.name.as_deref().unwrap_or(default);
        if policy.contains(':') {
            // The operator's listing tells a lock's key from a rate
            // limiter's (`<policy>:<algorithm>:{…}`) by it.
            return Err(Error::InvalidConfig(format!(
                "a lock's or semaphore's name holds no ':', got {policy:?}"
            )));
        }
        let keyspace = Keyspace::new(s.prefix.clone(), policy)?;
        let channel_prefix = format!("{}:{}:", keyspace.prefix(), keyspace.policy());
        // A fair name wakes every local waiter on a release: only the head of
        // the queue may take the permit, and a wake-one could pick another.
        let waiters = Waiters::new(channel_prefix, s.fair);
        let instances = Instances::new(backends, redlock, &s, waiters);
        let core = Core {
            instances: Arc::new(instances),
            keyspace,
            defaults: s.defaults,
            poll_interval: s.poll_interval,
            fence_ttl: s.fence_ttl,
            permits: s.permits,
            fair: s.fair,
            ride_out: s.permits.is_none() || s.failure == crate::rate::FailurePolicy::Deny,
        };
        core.first_ttl(&core.defaults)?;
        Ok(core)
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.instances.kind()
    }

    /// A semaphore on one store with an operator plane registers itself
    /// (name, permits) for as long as it lives; locks do not (their
    /// holders are listed from their keys).
    pub(crate) fn register(self: &Arc<Self>) {
        if let Some(permits) = self.permits {
            self.keep_registered(crate::plane::views::Registered::Semaphore {
                name: self.keyspace.policy().to_owned(),
                permits,
            });
        }
    }

    /// Keeps `entry` in the registry of the one store this engine runs on,
    /// if that store has an operator plane, for as long as it lives.
    pub(crate) fn keep_registered(self: &Arc<Self>, entry: crate::plane::views::Registered) {
        let [backend] = self.instances.backends() else {
            return;
        };
        let Some(store) = backend.lock_admin() else {
            return;
        };
        let alive = Arc::downgrade(self);
        crate::plane::registry::keep_registered(
            store,
            self.keyspace.prefix().to_owned(),
            entry,
            move || alive.strong_count() > 0,
        );
    }

    pub(crate) fn keyspace(&self) -> &Keyspace {
        &self.keyspace
    }

    /// The semaphore's permit count (`None` for a lock).
    pub(crate) fn permits(&self) -> Option<u32> {
        self.permits
    }

    pub(crate) fn is_fair(&self) -> bool {
        self.fair
    }

    /// The keys of `subject` for a holder of `weight` permits.
    pub(crate) fn keys(&self, subject: &Subject, weight: u32) -> LockKeys {
        match (self.permits, self.fair) {
            (None, false) => LockKeys::new(&self.keyspace, subject),
            (None, true) => LockKeys::permits(&self.keyspace, subject, 1, 1, true),
            (Some(n), fair) => LockKeys::permits(&self.keyspace, subject, n, weight, fair),
        }
    }

    /// Checks a weight against the permit count.
    pub(crate) fn check_weight(&self, weight: u32) -> Result<()> {
        let limit = self.permits.unwrap_or(1);
        if weight == 0 {
            return Err(Error::InvalidConfig(
                "a holder takes at least 1 permit".into(),
            ));
        }
        if weight > limit {
            return Err(Error::PermitsExceedLimit {
                requested: weight,
                limit,
            });
        }
        Ok(())
    }

    /// How long a fair waiter's ticket lives unless refreshed: two rounds of
    /// (the refresh interval + round trip), so a live waiter always
    /// refreshes it in time and a dead one blocks the queue for at most
    /// this long. Saturating and capped.
    fn ticket_ttl(&self) -> Duration {
        self.refresh_interval()
            .saturating_add(self.instances.timeout)
            .saturating_mul(2)
            .min(MAX_LOCK_DURATION)
    }

    /// The longest a waiter goes without trying: the poll interval, at
    /// most [`FAIR_REFRESH`] on a fair name.
    fn refresh_interval(&self) -> Duration {
        if self.fair {
            self.poll_interval.min(FAIR_REFRESH)
        } else {
            self.poll_interval
        }
    }

    /// A lease on a lock that a script other than the lock's own acquire
    /// granted (the idempotency store's claim): renewed, lost and released
    /// like any other.
    pub(crate) fn lease_for(
        &self,
        subject: &Subject,
        token: String,
        fence: super::FencingToken,
        start: std::time::Instant,
        options: &LockOptions,
    ) -> Result<Lease> {
        let handle = Handle::try_current().map_err(|_| {
            Error::InvalidConfig("locks need a tokio runtime (timers, the watchdog)".into())
        })?;
        let granted = super::instances::Granted {
            token,
            fence,
            start,
        };
        Ok(Lease::start(
            self.instances.clone(),
            subject.as_encoded().to_owned(),
            self.keys(subject, 1),
            granted,
            options,
            self.first_ttl(options)?,
            handle,
        ))
    }

    /// The round-trip bound of every call.
    pub(crate) fn timeout(&self) -> Duration {
        self.instances.timeout
    }

    /// Permits of `subject` in use now (semaphores and fair locks).
    pub(crate) async fn in_use(&self, subject: &Subject) -> Result<u32> {
        let keys = self.keys(subject, 1);
        if keys.holders == Holders::One {
            return Err(Error::InvalidConfig(
                "permits are counted for semaphores and fair locks".into(),
            ));
        }
        let backend = &self.instances.backends()[0];
        tokio::time::timeout(self.instances.timeout, backend.permits_in_use(&keys))
            .await
            .map_err(|_| Error::Timeout(self.instances.timeout))?
    }

    /// Removes whoever holds `subject` on every instance, keeping the fence
    /// keys (an operator's break); the most holders one instance removed.
    /// An error only when no instance answered.
    pub(crate) async fn break_holders(&self, subject: &Subject) -> Result<u32> {
        let keys = self.keys(subject, 1);
        let timeout = self.instances.timeout;
        let replies = futures_util::future::join_all(self.instances.backends().iter().map(|b| {
            let keys = &keys;
            async move {
                tokio::time::timeout(timeout, b.break_holders(keys))
                    .await
                    .unwrap_or(Err(Error::Timeout(timeout)))
            }
        }))
        .await;
        let (mut removed, mut error) = (None, None);
        for reply in replies {
            match reply {
                Ok(n) => removed = Some(removed.unwrap_or(0).max(n)),
                Err(e) => error = error.or(Some(e)),
            }
        }
        match (removed, error) {
            (None, Some(e)) => Err(e),
            (removed, _) => {
                let removed = removed.unwrap_or(0);
                if removed > 0 {
                    self.instances.waiters.wake(&keys.channel);
                }
                Ok(removed)
            }
        }
    }

    /// The TTL of the first acquire (cut to `max_hold`), checked.
    pub(crate) fn first_ttl(&self, options: &LockOptions) -> Result<Duration> {
        let ttl = options.ttl_duration();
        let first = match options.max_hold_duration() {
            Some(cap) if cap.is_zero() || cap > MAX_LOCK_DURATION => {
                return Err(Error::InvalidConfig(format!(
                    "max_hold must be positive and at most {MAX_LOCK_DURATION:?} \
                     (unbounded_hold() renews without a cap), got {cap:?}"
                )))
            }
            Some(cap) => ttl.min(cap),
            None => ttl,
        };
        self.instances.check_ttl(ttl)?;
        self.instances.check_ttl(first)?;
        Ok(first)
    }

    /// The fence key's TTL for a lock of `ttl`: the configured one, but at
    /// least [`FENCE_TTL_TTLS`] × `ttl`.
    fn fence_ttl_for(&self, ttl: Duration) -> Duration {
        self.fence_ttl.max(ttl.saturating_mul(FENCE_TTL_TTLS))
    }

    /// How long a waiter sleeps when no notification comes: jittered, at most
    /// the poll interval (short when no subscription is up), and bounded by
    /// the lock's remaining TTL (an expiring lock publishes nothing).
    fn pause(&self, pttl: Option<Duration>) -> Duration {
        let cap = if self.instances.waiters.live() {
            self.refresh_interval()
        } else {
            self.refresh_interval().min(POLL_WITHOUT_PUBSUB)
        };
        let jittered = cap.mul_f64(0.5 + 0.5 * unit_random());
        let bounded = match pttl {
            Some(p) => jittered.min(
                p + Duration::from_millis(1)
                    + Duration::from_micros((2000.0 * unit_random()) as u64),
            ),
            None => jittered,
        };
        bounded.max(Duration::from_millis(1))
    }

    /// The pause after the `errors`-th consecutive transient error of a
    /// bounded wait: 10 ms doubling per error, capped at the refresh
    /// interval (a fair waiter's ticket must not expire while it sleeps),
    /// jittered to [½, 1] of that so waiters do not retry in step.
    fn error_backoff(&self, errors: u32) -> Duration {
        let doubled = ERROR_BACKOFF_START.saturating_mul(1 << errors.saturating_sub(1).min(16));
        let cap = doubled.min(self.refresh_interval());
        cap.mul_f64(0.5 + 0.5 * unit_random())
            .max(Duration::from_millis(1))
    }

    /// One acquire attempt and, when it succeeds, the lease — in a task of
    /// its own. If the caller is dropped mid-flight (a `timeout` around
    /// `acquire`, a client that disconnects while middleware waits), the task
    /// still completes: a lock it created becomes a lease that is dropped
    /// with the task's output, which releases it at once instead of leaving
    /// an ownerless lock until its TTL.
    async fn attempt_detached(self: &Arc<Self>, a: &Arc<AcquireCtx>) -> Result<Attempt<Lease>> {
        let (core, a) = (self.clone(), a.clone());
        let running = a.in_flight.clone().lock_owned().await;
        let task = a.handle.clone().spawn(async move {
            let _running = running;
            Ok(
                match core
                    .instances
                    .attempt(&a.keys, a.first_ttl, a.fence_ttl, a.ticket.as_ref())
                    .await?
                {
                    Attempt::Acquired(g) => Attempt::Acquired(Lease::start(
                        core.instances.clone(),
                        a.name.clone(),
                        a.keys.clone(),
                        g,
                        &a.options,
                        a.first_ttl,
                        a.handle.clone(),
                    )),
                    Attempt::Held(pttl) => Attempt::Held(pttl),
                    Attempt::Split(elapsed) => Attempt::Split(elapsed),
                    Attempt::Refused(elapsed) => Attempt::Refused(elapsed),
                },
            )
        });
        join(task).await
    }

    /// Acquires `weight` of `subject`'s permits (1 for a lock), waiting up
    /// to `options`' bound when `wait`.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        subject: Subject,
        options: &LockOptions,
        wait: bool,
        weight: u32,
    ) -> Result<Lease> {
        self.check_weight(weight)?;
        let first_ttl = self.first_ttl(options)?;
        let handle = Handle::try_current().map_err(|_| {
            Error::InvalidConfig("locks need a tokio runtime (timers, the watchdog)".into())
        })?;
        let bound = if wait { options.wait_bound() } else { None };
        // A fair waiter queues under one ticket for its whole wait; a try
        // does not queue (it is admitted only when nobody waits).
        let ticket = match (self.fair, bound) {
            (true, Some(_)) => Some((new_token()?, self.ticket_ttl())),
            _ => None,
        };
        let ctx = Arc::new(AcquireCtx {
            ticket,
            in_flight: Arc::default(),
            keys: self.keys(&subject, weight),
            name: subject.as_encoded().to_owned(),
            fence_ttl: self.fence_ttl_for(options.ttl_duration()),
            options: options.clone(),
            first_ttl,
            handle,
        });
        // The wait a refusal suggests: the name's typical hold, within the
        // holder's remaining lease.
        let hold_times = &self.instances.hold_times;
        let busy = |pttl: Option<Duration>| Error::Busy {
            name: ctx.name.clone(),
            retry_after: pttl.map(|p| hold_times.hint(&ctx.keys.lock, p)),
        };
        let Some(bound) = bound else {
            return match self.attempt_detached(&ctx).await? {
                Attempt::Acquired(lease) => Ok(lease),
                Attempt::Held(pttl) => Err(busy(pttl)),
                Attempt::Split(_) => Err(busy(None)),
                Attempt::Refused(elapsed) => Err(Error::Timeout(elapsed)),
            };
        };
        // `None`: waits forever (the bound does not fit in an Instant).
        let until = Instant::now().checked_add(bound);
        let instances = &self.instances;
        instances
            .waiters
            .start(instances.backends(), instances.timeout);
        let waiter = instances.waiters.register(&ctx.keys.channel, weight);
        // Leaves the queue however the wait ends without the permit (the
        // bound, an error, the caller dropping this future).
        let mut queued = ctx.ticket.as_ref().map(|(ticket, _)| QueueTicket {
            instances: instances.clone(),
            keys: ctx.keys.clone(),
            ticket: ticket.clone(),
            handle: ctx.handle.clone(),
            in_flight: ctx.in_flight.clone(),
        });
        // Consecutive transient errors of this wait (for the backoff).
        let mut errors = 0u32;
        // What the last attempt ended with; `None` before the first.
        let mut previous: Option<Error> = None;
        loop {
            let notified = waiter.notified();
            tokio::pin!(notified);
            // Registered before the attempt: a release during it is not missed.
            notified.as_mut().enable();
            // The first attempt always gets its answer (a free lock is taken
            // whatever the bound); a later one still in flight at the bound
            // is left to its task, which releases what it takes, and the
            // wait ends then with what the attempt before it said.
            let attempt = match (until, previous.take()) {
                (Some(u), Some(before)) => {
                    match tokio::time::timeout_at(u.into(), self.attempt_detached(&ctx)).await {
                        Ok(attempt) => attempt,
                        Err(_) => return Err(before),
                    }
                }
                _ => self.attempt_detached(&ctx).await,
            };
            // A split vote or a refusal retries after a random pause that
            // notifications do not cut short: contenders that woke together
            // must not retry together, or they split the votes forever.
            let attempt = match attempt {
                // A blip in the backend does not end a bounded wait: retry
                // after a jittered backoff, and report the error only when the
                // bound has passed.
                Err(e) if is_outage(&e) && self.ride_out => {
                    errors = errors.saturating_add(1);
                    Err(e)
                }
                Err(e) => return Err(e),
                Ok(a) => {
                    errors = 0;
                    Ok(a)
                }
            };
            let (pause, interruptible, last) = match attempt {
                Err(e) => (self.error_backoff(errors), false, e),
                Ok(Attempt::Acquired(lease)) => {
                    if let Some(mut q) = queued.take() {
                        // The script took the ticket out with the permit.
                        q.ticket.clear();
                    }
                    if self.permits.is_some_and(|n| n > 1) && !self.fair {
                        // Permits may be left (a heavier holder released):
                        // pass the wake-up on; a waiter that finds none sleeps.
                        instances.waiters.pass_on(&ctx.keys.channel);
                    }
                    return Ok(lease);
                }
                Ok(Attempt::Held(pttl)) => (self.pause(pttl), true, busy(pttl)),
                Ok(Attempt::Split(elapsed)) => (split_pause(elapsed), false, busy(None)),
                Ok(Attempt::Refused(elapsed)) => {
                    (split_pause(Duration::ZERO), false, Error::Timeout(elapsed))
                }
            };
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) {
                return Err(last);
            }
            previous = Some(last);
            let wake = instant_after(now, pause);
            let wake = until.map_or(wake, |u| wake.min(u));
            if interruptible {
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(wake.into()) => {}
                }
            } else {
                tokio::time::sleep_until(wake.into()).await;
            }
        }
    }
}

/// A fair waiter's place in the queue: dropped without the permit, it takes
/// the ticket out (in the background) so the next in line need not wait for
/// the ticket to expire.
struct QueueTicket {
    instances: Arc<Instances>,
    keys: LockKeys,
    ticket: String,
    handle: Handle,
    in_flight: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        let (instances, keys) = (self.instances.clone(), self.keys.clone());
        let ticket = std::mem::take(&mut self.ticket);
        if ticket.is_empty() {
            return;
        }
        let in_flight = self.in_flight.clone();
        self.handle.spawn(async move {
            // After an attempt still in flight: it would queue the ticket again.
            let _done = in_flight.lock().await;
            if let Err(e) = instances.release_here(&keys, &ticket).await {
                tracing::debug!(error = %e, "leaving the queue failed; the ticket expires by its TTL");
            }
        });
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
