//! The engine of a [`Locker`](super::Locker), for one backend or a Redlock
//! alike: settings checked once, the wait loop over acquire attempts (made
//! by [`Instances`]), the lease hand-out, and the cache fill.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::backend::{LockBackend, LockKeys};
use super::instances::{Attempt, Instances};
use super::lease::Lease;
use super::options::{LockOptions, MAX_LOCK_DURATION};
use super::settings::{Settings, FENCE_TTL_TTLS};
use super::util::{instant_after, join, unit_random};
use super::waiters::Waiters;
use crate::error::{Error, Result};
use crate::keyspace::{Keyspace, Subject};

/// Poll bound when no release subscription is established.
const POLL_WITHOUT_PUBSUB: Duration = Duration::from_millis(50);

/// The pause after a split vote: uniform in [1 ms, max(5 ms, 4 × the
/// attempt's duration)].
fn split_pause(attempt: Duration) -> Duration {
    let span = (attempt * 4).max(Duration::from_millis(5));
    Duration::from_millis(1) + span.mul_f64(unit_random())
}

/// The engine behind a `Locker`: its settings, checked once, over its
/// instances; the wait loop, the lease hand-out and the cache fill.
pub(crate) struct Core {
    pub(crate) instances: Arc<Instances>,
    keyspace: Keyspace,
    pub(crate) defaults: LockOptions,
    poll_interval: Duration,
    fence_ttl: Duration,
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
        d.field("keyspace", &self.keyspace)
            .field("defaults", &self.defaults)
            .field("timeout", &i.timeout)
            .finish_non_exhaustive()
    }
}

/// What every attempt of one `acquire` call shares (moved into its tasks).
struct AcquireCtx {
    keys: LockKeys,
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
        let keyspace = Keyspace::new(s.prefix.clone(), "lock")?;
        let channel_prefix = format!("{}:{}:", keyspace.prefix(), keyspace.policy());
        let instances = Instances::new(backends, redlock, &s, Waiters::new(channel_prefix));
        let core = Core {
            instances: Arc::new(instances),
            keyspace,
            defaults: s.defaults,
            poll_interval: s.poll_interval,
            fence_ttl: s.fence_ttl,
        };
        core.first_ttl(&core.defaults)?;
        Ok(core)
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.instances.kind()
    }

    pub(crate) fn keyspace(&self) -> &Keyspace {
        &self.keyspace
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
            self.poll_interval
        } else {
            self.poll_interval.min(POLL_WITHOUT_PUBSUB)
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

    /// One acquire attempt and, when it succeeds, the lease — in a task of
    /// its own. If the caller is dropped mid-flight (a `timeout` around
    /// `acquire`, a client that disconnects while middleware waits), the task
    /// still completes: a lock it created becomes a lease that is dropped
    /// with the task's output, which releases it at once instead of leaving
    /// an ownerless lock until its TTL.
    async fn attempt_detached(self: &Arc<Self>, a: &Arc<AcquireCtx>) -> Result<Attempt<Lease>> {
        let (core, a) = (self.clone(), a.clone());
        let task = a.handle.clone().spawn(async move {
            Ok(
                match core
                    .instances
                    .attempt(&a.keys, a.first_ttl, a.fence_ttl)
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

    /// Acquires `subject`, waiting up to `options`' bound when `wait`.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        subject: Subject,
        options: &LockOptions,
        wait: bool,
    ) -> Result<Lease> {
        let first_ttl = self.first_ttl(options)?;
        let handle = Handle::try_current().map_err(|_| {
            Error::InvalidConfig("locks need a tokio runtime (timers, the watchdog)".into())
        })?;
        let ctx = Arc::new(AcquireCtx {
            keys: LockKeys::new(&self.keyspace, &subject),
            name: subject.as_encoded().to_owned(),
            fence_ttl: self.fence_ttl_for(options.ttl_duration()),
            options: options.clone(),
            first_ttl,
            handle,
        });
        let busy = |pttl| Error::Busy {
            name: ctx.name.clone(),
            retry_after: pttl,
        };
        let bound = if wait { options.wait_bound() } else { None };
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
        let waiter = instances.waiters.register(&ctx.keys.channel);
        loop {
            let notified = waiter.notified();
            tokio::pin!(notified);
            // Registered before the attempt: a release during it is not missed.
            notified.as_mut().enable();
            // A split vote or a refusal retries after a random pause that
            // notifications do not cut short: contenders that woke together
            // must not retry together, or they split the votes forever.
            let (pause, interruptible, last) = match self.attempt_detached(&ctx).await? {
                Attempt::Acquired(lease) => return Ok(lease),
                Attempt::Held(pttl) => (self.pause(pttl), true, busy(pttl)),
                Attempt::Split(elapsed) => (split_pause(elapsed), false, busy(None)),
                Attempt::Refused(elapsed) => {
                    (split_pause(Duration::ZERO), false, Error::Timeout(elapsed))
                }
            };
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) {
                return Err(last);
            }
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

    /// See [`Locker::fill_once`](super::Locker::fill_once).
    pub(crate) async fn fill_once<T, E, R, RF, C, CF, S, SF>(
        self: &Arc<Self>,
        subject: Subject,
        options: &LockOptions,
        read: R,
        compute: C,
        store: S,
    ) -> Result<T, E>
    where
        T: Clone,
        E: From<Error>,
        R: Fn() -> RF,
        RF: Future<Output = Result<Option<T>, E>>,
        C: FnOnce() -> CF,
        CF: Future<Output = Result<T, E>>,
        S: FnOnce(T) -> SF,
        SF: Future<Output = Result<(), E>>,
    {
        if let Some(v) = read().await? {
            return Ok(v);
        }
        let mut options = options.clone();
        if options.wait_bound().is_none() {
            let ttl = options.ttl_duration();
            options = options.wait(ttl);
        }
        let lease = match self.acquire(subject, &options, true).await {
            Ok(lease) => lease,
            Err(busy @ Error::Busy { .. }) => {
                // The holder may have filled it just now.
                return match read().await? {
                    Some(v) => Ok(v),
                    None => Err(busy.into()),
                };
            }
            Err(e) => return Err(e.into()),
        };
        // Double check: whoever held the lock before us may have filled it.
        if let Some(v) = read().await? {
            release_quietly(lease).await;
            return Ok(v);
        }
        let value = compute().await?;
        store(value.clone()).await?;
        release_quietly(lease).await;
        Ok(value)
    }
}

async fn release_quietly(lease: Lease) {
    if let Err(e) = lease.release().await {
        tracing::debug!(error = %e, "release after a cache fill failed; the lock expires by its TTL");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::settings::DEFAULT_FENCE_TTL;
    use crate::MemoryBackend;

    fn core(redlock: bool, n: usize) -> Core {
        let backends = (0..n)
            .map(|_| Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>)
            .collect();
        Core::new(backends, redlock, Settings::default()).unwrap()
    }

    #[test]
    fn durations_are_bounded() {
        let c = core(false, 1);
        assert!(c.instances.check_ttl(MAX_LOCK_DURATION).is_ok());
        for ttl in [MAX_LOCK_DURATION + Duration::from_millis(1), Duration::MAX] {
            assert!(matches!(
                c.instances.check_ttl(ttl),
                Err(Error::InvalidConfig(_))
            ));
            assert!(c.first_ttl(&LockOptions::new().ttl(ttl)).is_err());
            assert!(c
                .first_ttl(&LockOptions::new().max_hold(ttl).ttl(Duration::from_secs(1)))
                .is_err());
        }
        assert!(c
            .first_ttl(&LockOptions::new().max_hold(Duration::ZERO))
            .is_err());
        let now = Instant::now();
        assert_eq!(
            instant_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        // Never a panic, and never earlier than a year on.
        assert!(instant_after(now, Duration::MAX) >= now + MAX_LOCK_DURATION);
    }

    #[test]
    fn fence_keys_live_an_hour_and_at_least_ten_ttls() {
        let c = core(false, 1);
        assert_eq!(DEFAULT_FENCE_TTL, Duration::from_secs(3600));
        assert_eq!(c.fence_ttl_for(Duration::from_secs(30)), DEFAULT_FENCE_TTL);
        assert_eq!(
            c.fence_ttl_for(Duration::from_secs(600)),
            Duration::from_secs(6000)
        );
        assert_eq!(
            c.fence_ttl_for(MAX_LOCK_DURATION),
            MAX_LOCK_DURATION * FENCE_TTL_TTLS
        );
        assert_eq!(c.fence_ttl_for(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn settings_are_checked() {
        let one = || vec![Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>];
        let bad = [
            Settings {
                drift_ratio: f64::NAN,
                ..Settings::default()
            },
            Settings {
                timeout: Duration::ZERO,
                ..Settings::default()
            },
            Settings {
                fence_ttl: Duration::from_millis(10),
                ..Settings::default()
            },
            Settings {
                fence_ttl: Duration::MAX,
                ..Settings::default()
            },
            Settings {
                defaults: LockOptions::new().ttl(Duration::MAX),
                ..Settings::default()
            },
            Settings {
                defaults: LockOptions::new().ttl(Duration::from_millis(1)),
                ..Settings::default()
            },
            Settings {
                prefix: "a b".into(),
                ..Settings::default()
            },
        ];
        for s in bad {
            assert!(Core::new(one(), false, s.clone()).is_err(), "{s:?}");
        }
        assert!(Core::new(Vec::new(), true, Settings::default()).is_err());
    }

    #[test]
    fn pauses_are_bounded() {
        for _ in 0..100 {
            let p = split_pause(Duration::from_millis(10));
            assert!(p >= Duration::from_millis(1) && p <= Duration::from_millis(41));
        }
        let c = core(false, 1);
        for _ in 0..100 {
            // No subscription yet: short polls, bounded by the holder's PTTL.
            let p = c.pause(None);
            assert!(p <= POLL_WITHOUT_PUBSUB && p >= POLL_WITHOUT_PUBSUB / 2);
            let p = c.pause(Some(Duration::from_millis(3)));
            assert!(p <= Duration::from_millis(6), "{p:?}");
        }
    }
}
