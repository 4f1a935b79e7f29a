//! [`Locker`], over one backend or a Redlock's quorum of independent
//! instances, and its builder.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::core::Core;
use super::lease::Lease;
use super::options::LockOptions;
use super::settings::Settings;
use crate::error::{Error, Result};
use crate::keyspace::{Keyspace, Subject};
use crate::store::{LockBackend, LockKeys};

/// Fenced locks over one backend — Redis (standalone, Sentinel, Cluster) or
/// memory — or, built with [`Locker::redlock`], over a quorum of
/// independent masters. Cheap to clone; clones share one release
/// subscription (per instance).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::{Error, LockOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let opts = LockOptions::new().ttl(Duration::from_secs(10));
///
/// let lease = locker.try_acquire("invoice-42", &opts).await?;
/// // A second holder is refused at once...
/// assert!(matches!(locker.try_acquire("invoice-42", &opts).await, Err(Error::Busy { .. })));
/// // ...or after its wait bound.
/// let waited = locker.acquire("invoice-42", &opts.clone().wait(Duration::from_millis(20))).await;
/// assert!(matches!(waited, Err(Error::Busy { .. })));
///
/// let fence = lease.fence();
/// lease.release().await?;
/// let next = locker.try_acquire("invoice-42", &opts).await?;
/// assert!(next.fence() > fence);
/// # Ok(()) }
/// ```
///
/// On Redis:
///
/// ```no_run
/// # async fn run() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::{LockOptions, Locker, RedisBackend};
///
/// let locker = Locker::new(RedisBackend::connect("redis://127.0.0.1:6379").await?);
/// let lease = locker
///     .acquire("billing-run", &LockOptions::new().wait(Duration::from_secs(5)))
///     .await?;
/// // ... work, passing lease.fence() to every write ...
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    core: Arc<Core>,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.core, f)
    }
}

impl Locker {
    /// A locker over `backend` with the defaults: prefix `tollgate`, 500 ms
    /// round-trip bound, drift 1 % + 2 ms, default [`LockOptions`].
    pub fn new(backend: impl LockBackend) -> Locker {
        Self::builder(backend)
            .build()
            .expect("the default lock settings are valid")
    }

    /// A builder for a locker over `backend`.
    pub fn builder(backend: impl LockBackend) -> LockerBuilder {
        LockerBuilder::over(vec![Arc::new(backend)], false, Settings::default())
    }

    /// A Redlock: one lock over N independent Redis masters (not replicas, not a
    /// cluster's shards), held when a quorum of N/2 + 1 granted it.
    ///
    /// Each attempt runs on every instance in parallel (each bounded by the
    /// timeout) and stops as soon as a quorum answered or cannot; the lease's
    /// validity is `ttl − elapsed − drift`, and a lease acquired too slowly to be
    /// worth anything is refused and released. Release and renewal go to every
    /// instance. The fencing token is the maximum of the quorum's tokens, and it
    /// is written back to the quorum before the lease is handed out, so the next
    /// quorum (which shares an instance with this one) produces a higher one even
    /// when the instances' clocks disagree — while the fence keys live
    /// ([`LockerBuilder::fence_ttl`]); after a name has been idle longer than
    /// that, fences restart from the instances' clocks.
    ///
    /// # When not to use it
    ///
    /// The default is a single Redis (standalone, Sentinel or Cluster) with
    /// [`Locker::new`] and fencing tokens checked by the resource. Redlock buys
    /// availability across the loss of a minority of masters, but its safety
    /// rests on timing: bounded process pauses, bounded network delay and clocks
    /// that advance at about the same rate. Martin Kleppmann ("How to do
    /// distributed locking", 2016) shows how a GC pause or a clock jump breaks
    /// mutual exclusion without anyone noticing, and argues that a lock needed for
    /// *correctness* must use fencing tokens from a consensus system anyway;
    /// Salvatore Sanfilippo ("Is Redlock safe?") answers that the timing
    /// assumptions are reasonable with monotonic clocks and that the validity
    /// check after the acquire covers delays before it. tollgate follows both:
    /// it checks validity, measures deadlines on the monotonic clock and hands
    /// out fencing tokens — but the resource must still check those tokens, and a
    /// master that restarts without persistence during a hold can grant the lock
    /// twice (run masters with `appendfsync always`, or keep a restarted one out
    /// for longer than the longest TTL). Use Redlock for efficiency across
    /// independent masters, not as the only guard of correctness.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::Error> {
    /// use std::time::Duration;
    /// use tollgate::{LockOptions, Locker, RedisBackend};
    ///
    /// let mut instances = Vec::new();
    /// for url in ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"] {
    ///     instances.push(RedisBackend::connect(url).await?);
    /// }
    /// let redlock = Locker::redlock(instances)?;
    /// assert_eq!(redlock.quorum(), 2);
    /// let lease = redlock
    ///     .acquire("rebalance", &LockOptions::new().wait(Duration::from_secs(1)))
    ///     .await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// `instances` are independent masters (`Arc<dyn LockBackend>` mixes
    /// kinds); at least one, and use an odd number, 3 or 5.
    ///
    /// ```
    /// use tollgate::{Locker, MemoryBackend};
    ///
    /// let redlock = Locker::redlock((0..5).map(|_| MemoryBackend::new()))?;
    /// assert_eq!((redlock.instances(), redlock.quorum()), (5, 3));
    /// assert_eq!(redlock.backend_kind(), "redlock");
    /// assert!(Locker::redlock(Vec::<MemoryBackend>::new()).is_err());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn redlock<B: LockBackend>(instances: impl IntoIterator<Item = B>) -> Result<Locker> {
        Self::redlock_builder(instances).build()
    }

    /// A builder for a Redlock over `instances`; see [`Locker::redlock`].
    pub fn redlock_builder<B: LockBackend>(
        instances: impl IntoIterator<Item = B>,
    ) -> LockerBuilder {
        let backends = instances
            .into_iter()
            .map(|b| Arc::new(b) as Arc<dyn LockBackend>)
            .collect();
        LockerBuilder::over(backends, true, Settings::default())
    }

    /// Acquires the lock `name` (on a quorum of the instances, for a
    /// Redlock), waiting up to `options`' wait bound (no waiting when it has
    /// none). Waiters wake when the holder releases
    /// (through the locker's one release subscription), or poll, at most
    /// every poll interval and when the holder's TTL runs out.
    ///
    /// Errors: [`Error::Busy`] when the bound passes (with a realistic wait
    /// as `retry_after`: the name's typical hold, never beyond the holder's
    /// remaining TTL); [`Error::Backend`] /
    /// [`Error::Timeout`] when the backend fails or is slow (for a Redlock:
    /// when too many instances failed for a quorum; also when an acquire took
    /// so long that the lease would be worthless) — with a wait bound, an
    /// outage or a timeout is retried after a jittered backoff (at most the
    /// poll interval) and reported only once the bound has passed, so a short
    /// blip does not end the wait;
    /// [`Error::InvalidConfig`] for a TTL the drift allowance leaves nothing
    /// of, or a TTL or `max_hold` above
    /// [`MAX_LOCK_DURATION`](super::MAX_LOCK_DURATION).
    ///
    /// Cancel-safe: dropping the future mid-flight never leaves a lock
    /// behind — an attempt already sent completes in its own task, and a
    /// lock it got is released at once.
    pub async fn acquire(&self, name: impl Into<Subject>, options: &LockOptions) -> Result<Lease> {
        self.core.acquire(name.into(), options, true, 1).await
    }

    /// Acquires the lock `name` only if it is free now: never waits, whatever
    /// `options`' wait bound.
    pub async fn try_acquire(
        &self,
        name: impl Into<Subject>,
        options: &LockOptions,
    ) -> Result<Lease> {
        self.core.acquire(name.into(), options, false, 1).await
    }

    /// A double-checked cache fill: returns the cached value if `read` finds
    /// one; otherwise takes the lock `name`, reads again (whoever held the
    /// lock may have filled it), and only then computes the value once,
    /// stores it and releases the lock. Concurrent callers on a cold key
    /// compute it exactly once; the others wait for the lock (up to
    /// `options`' wait bound, or its TTL when it has none) and then read the
    /// stored value.
    ///
    /// `store` should give the cached value a TTL. Errors of the closures are
    /// returned as they are; lock errors are converted with `E: From<Error>`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use std::collections::HashMap;
    /// use std::sync::{Arc, Mutex};
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let cache: Arc<Mutex<HashMap<&str, u64>>> = Arc::default();
    /// let value = locker
    ///     .fill_once(
    ///         "report:2024",
    ///         &LockOptions::new(),
    ///         || async { Ok::<_, tollgate::Error>(cache.lock().unwrap().get("report").copied()) },
    ///         || async { Ok(42) /* the expensive computation */ },
    ///         |v| {
    ///             cache.lock().unwrap().insert("report", v);
    ///             async { Ok(()) }
    ///         },
    ///     )
    ///     .await?;
    /// assert_eq!(value, 42);
    /// # Ok(()) }
    /// ```
    pub async fn fill_once<T, E, R, RF, C, CF, S, SF>(
        &self,
        name: impl Into<Subject>,
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
        let lease = match self.core.acquire(name.into(), &options, true, 1).await {
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

    /// Breaks the lock `name` whoever holds it — an operator's tool for a
    /// holder that is stuck (alive, renewing, doing nothing) — on every
    /// instance of a Redlock. The fence key stays, so the next holder's
    /// fence is still higher than the broken one's (the resource goes on
    /// refusing the old holder's writes); waiters take the lock at once.
    /// The broken holder's [`Lease`] is lost at its next renewal (at most
    /// a third of its TTL later), and its release reports "not held".
    /// `true` when there was a holder.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let stuck = locker.try_acquire("nightly", &LockOptions::new()).await?;
    /// assert!(locker.break_lock("nightly").await?);
    /// let next = locker.try_acquire("nightly", &LockOptions::new()).await?;
    /// assert!(next.fence() > stuck.fence());
    /// assert!(!stuck.release().await?); // no longer its own
    /// assert!(!locker.break_lock("free").await?);
    /// # Ok(()) }
    /// ```
    pub async fn break_lock(&self, name: impl Into<Subject>) -> Result<bool> {
        Ok(self.core.break_holders(&name.into()).await? > 0)
    }

    /// The backend's kind (`"memory"`, `"redis"`, `"cluster"`, …), or
    /// `"redlock"` for a Redlock.
    pub fn backend_kind(&self) -> &'static str {
        self.core.kind()
    }

    /// The number of backend instances: 1, or a Redlock's N.
    pub fn instances(&self) -> usize {
        self.core.instances.len()
    }

    /// How many instances must grant a lock: N/2 + 1 (1 of 1 for a single
    /// backend).
    ///
    /// ```
    /// use tollgate::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// assert_eq!((locker.instances(), locker.quorum()), (1, 1));
    /// let redlock = Locker::redlock((0..3).map(|_| MemoryBackend::new()))?;
    /// assert_eq!((redlock.instances(), redlock.quorum()), (3, 2));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn quorum(&self) -> usize {
        self.core.instances.quorum()
    }

    /// The options configured with [`LockerBuilder::default_options`].
    pub fn default_options(&self) -> &LockOptions {
        &self.core.defaults
    }

    /// Checks `options` against this locker's rules (TTL bounds, the drift
    /// allowance, the hold cap) without a round trip: what `acquire` would
    /// refuse with [`Error::InvalidConfig`], refused now — for middleware
    /// that wants to fail at start-up rather than on every request.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// assert!(locker.check_options(&LockOptions::new()).is_ok());
    /// assert!(locker.check_options(&LockOptions::new().ttl(Duration::from_millis(2))).is_err());
    /// ```
    pub fn check_options(&self, options: &LockOptions) -> Result<()> {
        self.core.first_ttl(options).map(drop)
    }

    /// The keyspace: the prefix and the policy (`lock`, or the
    /// [name](LockerBuilder::name)).
    pub fn keyspace(&self) -> &Keyspace {
        self.core.keyspace()
    }

    /// The keys and channel of the lock `name` (the same on every instance).
    pub fn keys_for(&self, name: impl Into<Subject>) -> LockKeys {
        self.core.keys(&name.into(), 1)
    }

    /// Whether waiters are served in arrival order ([`LockerBuilder::fair`]).
    pub fn is_fair(&self) -> bool {
        self.core.is_fair()
    }
}

async fn release_quietly(lease: Lease) {
    if let Err(e) = lease.release().await {
        tracing::debug!(error = %e, "release after a cache fill failed; the lock expires by its TTL");
    }
}

/// Builds a [`Locker`] over one backend ([`Locker::builder`]) or a Redlock
/// ([`Locker::redlock_builder`]); [`build`](Self::build) checks every setting.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{LockOptions, Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new())
///     .prefix("billing")
///     .default_options(LockOptions::new().ttl(Duration::from_secs(5)))
///     .drift(0.01, Duration::from_millis(2))
///     .timeout(Duration::from_millis(250))
///     .build()?;
/// assert_eq!(locker.keys_for("run").lock, "billing:lock:{run}");
/// assert!(Locker::builder(MemoryBackend::new()).prefix("a{b").build().is_err());
/// # Ok::<(), tollgate::Error>(())
/// ```
///
/// The same builder makes a [`Semaphore`](super::Semaphore)
/// ([`Semaphore::builder`](super::Semaphore::builder), a
/// [`SemaphoreBuilder`](super::SemaphoreBuilder)): a lock is the one-permit
/// case, with the same settings.
#[must_use]
pub struct LockerBuilder<T = Locker> {
    backends: Vec<Arc<dyn LockBackend>>,
    redlock: bool,
    settings: Settings,
    built: PhantomData<fn() -> T>,
}

mod sealed {
    use std::sync::Arc;

    /// The engine a builder made (opaque).
    #[derive(Debug)]
    pub struct Engine(pub(crate) Arc<super::Core>, pub(crate) super::Settings);

    /// What a [`LockerBuilder`](super::LockerBuilder) builds: a `Locker` or
    /// a `Semaphore`, each over the one engine. Sealed.
    pub trait Built: Sized {
        #[doc(hidden)]
        fn from_engine(engine: Engine) -> Self;
    }
}
pub(crate) use sealed::{Built, Engine};

impl Built for Locker {
    fn from_engine(engine: Engine) -> Self {
        Locker { core: engine.0 }
    }
}

impl<T> LockerBuilder<T> {
    pub(crate) fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }

    pub(crate) fn over(
        backends: Vec<Arc<dyn LockBackend>>,
        redlock: bool,
        settings: Settings,
    ) -> Self {
        LockerBuilder {
            backends,
            redlock,
            settings,
            built: PhantomData,
        }
    }
}

impl<T> fmt::Debug for LockerBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockerBuilder");
        if self.redlock {
            d.field("instances", &self.backends.len());
        } else {
            d.field("backend", &self.backends.first().map(|b| b.lock_kind()));
        }
        d.field("settings", &self.settings).finish()
    }
}

impl<T: Built> LockerBuilder<T> {
    /// The key prefix (default `tollgate`); keys are
    /// `<prefix>:lock:{<name>}` (`<prefix>:sem:{<name>}` for a semaphore).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// Names the locker or semaphore: its keys become
    /// `<prefix>:<name>:{<subject>}` instead of `…:lock:…` or `…:sem:…`,
    /// and the operator plane lists and breaks its holders under that name
    /// ([`Admin::holders`](crate::admin::Admin::holders)). Names are
    /// checked by `build`: non-empty, no braces, whitespace or `:`, and not
    /// another kind's default (`lock`, `sem`, the idempotency store's
    /// `idem`). A lock and a semaphore must not share a name: both keep
    /// their holders under `<prefix>:<name>:{<subject>}`.
    ///
    /// ```
    /// use tollgate::{MemoryBackend, Semaphore};
    ///
    /// let exports = Semaphore::builder(MemoryBackend::new(), 2).name("export").build()?;
    /// assert_eq!(exports.keys_for("tenant-7").lock, "tollgate:export:{tenant-7}");
    /// assert!(Semaphore::builder(MemoryBackend::new(), 2).name("a:b").build().is_err());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.settings.name = Some(name.into());
        self
    }

    /// The options returned by `default_options()` (for middleware and
    /// callers that do not bring their own). Checked by `build`.
    pub fn default_options(mut self, options: LockOptions) -> Self {
        self.settings.defaults = options;
        self
    }

    /// The clock-drift allowance subtracted from every TTL when computing
    /// a lease's safe deadline: `ratio × ttl + fixed` (default 1 % + 2 ms).
    /// It absorbs clock-rate differences between this process and the
    /// backend and the lateness of timers; the subtraction saturates, and
    /// TTLs that leave nothing are refused. A memory store's clock is one
    /// of those: it may run up to 0.05 % off the OS clock that times the
    /// lease (see [`MonotonicClock`](crate::MonotonicClock)).
    pub fn drift(mut self, ratio: f64, fixed: Duration) -> Self {
        self.settings.drift_ratio = ratio;
        self.settings.drift_fixed = fixed;
        self
    }

    /// Bounds every round trip to a backend instance (default 500 ms):
    /// a paused or unreachable Redis costs at most this, never a hang.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// The upper bound of a waiter's fallback poll (default 500 ms), used
    /// when no release notification arrives; the poll is also bounded by
    /// the lock's remaining TTL, and jittered. On a [fair](Self::fair)
    /// name it is at most 5 s: each try refreshes the waiter's place in the
    /// queue, which a waiter that died gives up within two of them.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.settings.poll_interval = interval;
        self
    }

    /// How long a fence key outlives the last acquire of its lock
    /// (default 1 hour; between 1 s and one year). Each acquire keeps it
    /// at least 10 × the lock's TTL. After it expires, fences restart
    /// from the server time, which is still above every earlier fence as
    /// long as the server clock does not step back (see the
    /// [module docs](crate::lock)).
    pub fn fence_ttl(mut self, ttl: Duration) -> Self {
        self.settings.fence_ttl = ttl;
        self
    }

    /// Serves waiters in arrival order: a waiter takes the lock (or a
    /// permit) only when everyone who started waiting before it has, or has
    /// given up. Waiters queue under a ticket that each attempt refreshes and
    /// that falls out after `2 × (poll interval + timeout)` (2 s by default;
    /// at most [`MAX_LOCK_DURATION`](super::MAX_LOCK_DURATION)) when not
    /// refreshed, so a waiter that died blocks the queue for at most
    /// that long; a lost release notification costs one fallback poll. A
    /// `try_acquire` does not queue: it succeeds only when nobody waits.
    ///
    /// Every process must agree: a fair name is stored as permits, and an
    /// unfair `Locker` on the same name fails with the backend's `WRONGTYPE`
    /// error rather than ignoring the other's holders. (An unfair
    /// `Semaphore` shares a fair one's storage: it keeps the bound, but does
    /// not queue, so it may overtake the fair waiters.) Not for a Redlock.
    pub fn fair(mut self) -> Self {
        self.settings.fair = true;
        self
    }

    /// Checks the settings and builds the locker (a Redlock needs at least
    /// one instance).
    pub fn build(self) -> Result<T> {
        let settings = self.settings.clone();
        let core = Arc::new(Core::new(self.backends, self.redlock, self.settings)?);
        core.register();
        Ok(T::from_engine(Engine(core, settings)))
    }
}
