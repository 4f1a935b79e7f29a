//! [`Semaphore`]: at most N holders of a name across every process on the
//! backend, with fenced, renewed, expiring permits.

use std::fmt;
use std::sync::Arc;

use super::core::Core;
use super::lease::Lease;
use super::locker::{Built, Engine, LockerBuilder};
use super::options::LockOptions;
use super::settings::Settings;
use crate::error::{Error, Result};
use crate::failure::breaker::Breaker;
use crate::failure::{
    is_outage, FailurePolicy, DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_THRESHOLD,
};
use crate::keyspace::{Keyspace, Subject};
use crate::store::{LockBackend, LockKeys};

/// A held permit (or several, for a weighted acquire): the same guard as a
/// lock's [`Lease`] — a [`FencingToken`](super::FencingToken), a watchdog
/// that renews it every TTL/3, [`Lease::lost`], release on drop without
/// blocking, and an idempotent [`Lease::release`].
pub type Permit = Lease;

/// Builds a [`Semaphore`]: the [`LockerBuilder`] of a lock, with a permit
/// count ([`Semaphore::builder`]).
pub type SemaphoreBuilder = LockerBuilder<Semaphore>;

/// A distributed semaphore: at most `permits` holders of each name at
/// once, across every process that shares the backend (standalone Redis,
/// Sentinel, Cluster, or one process's memory).
///
/// - **Permits expire.** Each is stored with an expiry on the server clock
///   and renewed by the holder's watchdog; a holder that dies (a SIGKILL, a
///   partition) frees its permits when their TTL passes — no janitor, no
///   orphaned permits. Every key written has a TTL.
/// - **Fenced.** Each permit carries a [`FencingToken`](super::FencingToken),
///   strictly increasing per name across all holders (the lock's rule).
/// - **Waiting is cheap.** Waiters wake on the release notifications of the
///   lock's one subscription per semaphore, with a fallback poll; with
///   [`LockerBuilder::fair`] they are served in arrival order, and a waiter
///   that died blocks the others for at most its ticket's TTL. A release
///   wakes one waiter of its name in each process — or all of them while
///   one of them waits for several permits, so that freed permits reach a
///   waiter they fit at once (a weight-1 waiter is never left to its
///   fallback poll behind a weight-3 one that one free permit cannot serve).
/// - **Weighted.** [`acquire_weighted`](Self::acquire_weighted) takes k of N
///   at once, all or nothing; k > N is
///   [`Error::PermitsExceedLimit`](crate::Error::PermitsExceedLimit).
///
/// A lock is the one-permit case: a `Semaphore` runs on the same engine as a
/// [`Locker`](super::Locker) (options, timeouts, drift, the watchdog).
/// Semaphores are not offered over a Redlock: each master would admit up to
/// N, and N·M/(M/2 + 1) holders can each win a quorum of M masters (3 holders
/// of a 2-permit semaphore on 3 masters), so the bound would not hold.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::{Error, LockOptions, MemoryBackend, Semaphore};
///
/// let exports = Semaphore::new(MemoryBackend::new(), 2)?;
/// let opts = LockOptions::new().ttl(Duration::from_secs(5));
///
/// let a = exports.try_acquire("tenant-7", &opts).await?;
/// let b = exports.try_acquire("tenant-7", &opts).await?;
/// assert!(b.fence() > a.fence());
/// // A third is refused (or waits, with `opts.wait(..)` and `acquire`).
/// assert!(matches!(exports.try_acquire("tenant-7", &opts).await, Err(Error::Busy { .. })));
/// // Another name has its own permits.
/// let _other = exports.try_acquire("tenant-8", &opts).await?;
/// assert_eq!(exports.in_use("tenant-7").await?, 2);
///
/// a.release().await?;
/// let _c = exports.try_acquire("tenant-7", &opts).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    core: Arc<Core>,
    /// Skips a backend that failed repeatedly, so a dead Redis costs no
    /// round-trip timeout per acquire (the limiter's breaker: 5 failures,
    /// then one probe a second).
    breaker: Arc<Breaker>,
    failure: FailurePolicy,
    /// [`FailurePolicy::Fallback`]: this process's share of the permits, in
    /// memory, used while the backend is unavailable.
    fallback: Option<Arc<Core>>,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("engine", &self.core)
            .field("on_failure", &self.failure)
            .finish()
    }
}

impl Built for Semaphore {
    fn from_engine(Engine(core, settings): Engine) -> Self {
        let failure = settings.failure;
        let fallback = match failure {
            FailurePolicy::Fallback { instances } => {
                let share = (settings.permits.unwrap_or(1) / instances.get()).max(1);
                let local = Settings {
                    permits: Some(share),
                    ..settings
                };
                let backends = vec![core.instances.backends()[0].local_lock()];
                // The same settings as the engine that was just built, with
                // fewer permits: they cannot be refused.
                Core::new(backends, false, local).ok().map(Arc::new)
            }
            _ => None,
        };
        Semaphore {
            core,
            breaker: Arc::new(Breaker::new(
                DEFAULT_BREAKER_THRESHOLD,
                DEFAULT_BREAKER_COOLDOWN,
            )),
            failure,
            fallback,
        }
    }
}

impl LockerBuilder<Semaphore> {
    /// What an acquire does when the backend fails (an error, a timeout):
    ///
    /// - [`FailurePolicy::Allow`] (the default, as for rate limiters): the
    ///   error is returned, and [`Semaphore::fails_open`] says it should be
    ///   let through without a permit — what the tower layer and the axum
    ///   extractor do;
    /// - [`FailurePolicy::Deny`]: the error is returned and refused (503);
    /// - [`FailurePolicy::Fallback`]: a permit of a local in-memory
    ///   semaphore with `permits / instances` permits (at least 1), so N
    ///   instances together stay near the global bound instead of N times it;
    ///   a weight above the local share is refused as busy, never discounted.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use std::num::NonZeroU32;
    /// use tollgate::{FailurePolicy, LockOptions, RedisBackend, Semaphore};
    ///
    /// // A Redis nobody listens on: every acquire falls back to memory.
    /// let dead = RedisBackend::connect_lazy("redis://127.0.0.1:1")?;
    /// let exports = Semaphore::builder(dead, 8)
    ///     .on_failure(FailurePolicy::Fallback { instances: NonZeroU32::new(4).unwrap() })
    ///     .build()?;
    /// let opts = LockOptions::new();
    /// let _a = exports.try_acquire("t", &opts).await?;
    /// let _b = exports.try_acquire("t", &opts).await?;
    /// assert!(exports.try_acquire("t", &opts).await.is_err()); // 8 / 4 = 2 here
    /// # Ok(()) }
    /// ```
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.settings_mut().failure = policy;
        self
    }
}

impl Semaphore {
    /// A semaphore of `permits` per name over `backend`, with the lock's
    /// defaults (prefix `tollgate`, keys `tollgate:sem:{<name>}`). Errors for
    /// 0 or more than [`MAX_PERMITS`](super::MAX_PERMITS) permits.
    pub fn new(backend: impl LockBackend, permits: u32) -> Result<Semaphore> {
        Self::builder(backend, permits).build()
    }

    /// A builder: the [`LockerBuilder`] settings (prefix, timeout, drift,
    /// poll interval, fence TTL, default options, [`fair`](LockerBuilder::fair)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{MemoryBackend, Semaphore};
    ///
    /// let gpus = Semaphore::builder(MemoryBackend::new(), 4)
    ///     .prefix("render")
    ///     .timeout(Duration::from_millis(200))
    ///     .fair()
    ///     .build()?;
    /// assert_eq!((gpus.permits(), gpus.is_fair()), (4, true));
    /// assert_eq!(gpus.keys_for("farm").lock, "render:sem:{farm}");
    /// assert!(Semaphore::new(MemoryBackend::new(), 0).is_err());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn builder(backend: impl LockBackend, permits: u32) -> SemaphoreBuilder {
        let settings = Settings {
            permits: Some(permits),
            ..Settings::default()
        };
        LockerBuilder::over(vec![Arc::new(backend)], false, settings)
    }

    /// Takes one permit of `name`, waiting up to `options`' wait bound (no
    /// waiting when it has none). Errors as [`Locker::acquire`](super::Locker::acquire):
    /// [`Error::Busy`](crate::Error::Busy) when none came free in time (with
    /// the time until the earliest permit expires, when known), backend
    /// errors and timeouts, invalid options. Cancel-safe.
    pub async fn acquire(&self, name: impl Into<Subject>, options: &LockOptions) -> Result<Permit> {
        self.take(name.into(), options, true, 1).await
    }

    /// One acquire on the backend, or on the local fallback when the
    /// backend is unavailable and the policy says so.
    async fn take(
        &self,
        name: Subject,
        options: &LockOptions,
        wait: bool,
        weight: u32,
    ) -> Result<Permit> {
        // Refused as such before the breaker is asked: skipping a dead backend
        // must not turn a request that can never be granted into an outage
        // (which fails open) or into a local permit's refusal.
        self.core.check_weight(weight)?;
        self.core.first_ttl(options)?;
        let started = std::time::Instant::now();
        let result = self
            .breaker
            .call(self.core.acquire(name.clone(), options, wait, weight))
            .await;
        match (result, self.fallback.as_ref()) {
            (Err(e), Some(local)) if is_outage(&e) => {
                tracing::debug!(error = %e, "semaphore backend unavailable; taking a local permit");
                if weight > local.permits().unwrap_or(1) {
                    // Never discounted to the local share: refused.
                    return Err(Error::Busy {
                        name: name.as_encoded().to_owned(),
                        retry_after: None,
                    });
                }
                // The wait bound is the whole acquire's: the local share gets
                // what the backend's attempt left of it.
                let left = options
                    .wait_bound()
                    .map(|w| w.saturating_sub(started.elapsed()));
                match left {
                    Some(left) if wait && left.is_zero() => {
                        local.acquire(name, options, false, weight).await
                    }
                    Some(left) if wait => {
                        let options = options.clone().wait(left);
                        local.acquire(name, &options, wait, weight).await
                    }
                    _ => local.acquire(name, options, wait, weight).await,
                }
            }
            (other, _) => other,
        }
    }

    /// Whether a request that failed with `error` should go ahead without a
    /// permit: the backend is unavailable and the policy is
    /// [`FailurePolicy::Allow`].
    pub fn fails_open(&self, error: &Error) -> bool {
        self.failure == FailurePolicy::Allow && is_outage(error)
    }

    /// The failure policy ([`SemaphoreBuilder::on_failure`]).
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// Takes one permit of `name` only if one is free now.
    pub async fn try_acquire(
        &self,
        name: impl Into<Subject>,
        options: &LockOptions,
    ) -> Result<Permit> {
        self.take(name.into(), options, false, 1).await
    }

    /// Takes `weight` permits of `name` at once (all or nothing), waiting up
    /// to `options`' bound. A weight above the permit count can never be
    /// granted: [`Error::PermitsExceedLimit`](crate::Error::PermitsExceedLimit)
    /// before any round trip.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{Error, LockOptions, MemoryBackend, Semaphore};
    ///
    /// let memory = Semaphore::new(MemoryBackend::new(), 10)?; // 10 GiB
    /// let opts = LockOptions::new();
    /// let big = memory.try_acquire_weighted("node-1", 8, &opts).await?;
    /// assert!(matches!(memory.try_acquire_weighted("node-1", 3, &opts).await, Err(Error::Busy { .. })));
    /// assert!(matches!(
    ///     memory.try_acquire_weighted("node-1", 11, &opts).await,
    ///     Err(Error::PermitsExceedLimit { requested: 11, limit: 10 })
    /// ));
    /// drop(big);
    /// # Ok(()) }
    /// ```
    pub async fn acquire_weighted(
        &self,
        name: impl Into<Subject>,
        weight: u32,
        options: &LockOptions,
    ) -> Result<Permit> {
        self.take(name.into(), options, true, weight).await
    }

    /// [`acquire_weighted`](Self::acquire_weighted) without waiting.
    pub async fn try_acquire_weighted(
        &self,
        name: impl Into<Subject>,
        weight: u32,
        options: &LockOptions,
    ) -> Result<Permit> {
        self.take(name.into(), options, false, weight).await
    }

    /// How many permits of `name` are held now (one round trip; expired
    /// holders are not counted).
    pub async fn in_use(&self, name: impl Into<Subject>) -> Result<u32> {
        self.core.in_use(&name.into()).await
    }

    /// How many permits of `name` are free now: `permits() − in_use(name)`.
    pub async fn available(&self, name: impl Into<Subject>) -> Result<u32> {
        Ok(self.permits().saturating_sub(self.in_use(name).await?))
    }

    /// Takes every permit of `name` from whoever holds them — an operator's
    /// tool for stuck holders. Fences never go back (the fence key stays);
    /// waiters take the freed permits at once, a fair queue keeping its
    /// order; each broken holder's [`Permit`] is lost at its next renewal.
    /// Returns how many holders lost their permits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, MemoryBackend, Semaphore};
    ///
    /// let exports = Semaphore::new(MemoryBackend::new(), 2)?;
    /// let opts = LockOptions::new();
    /// let a = exports.try_acquire("tenant-7", &opts).await?;
    /// let _b = exports.try_acquire("tenant-7", &opts).await?;
    /// assert_eq!(exports.break_permits("tenant-7").await?, 2);
    /// assert_eq!(exports.in_use("tenant-7").await?, 0);
    /// let c = exports.try_acquire("tenant-7", &opts).await?;
    /// assert!(c.fence() > a.fence());
    /// # Ok(()) }
    /// ```
    pub async fn break_permits(&self, name: impl Into<Subject>) -> Result<u32> {
        self.core.break_holders(&name.into()).await
    }

    /// The permit count per name.
    pub fn permits(&self) -> u32 {
        self.core.permits().unwrap_or(1)
    }

    /// Whether waiters are served in arrival order.
    pub fn is_fair(&self) -> bool {
        self.core.is_fair()
    }

    /// The backend's kind (`"memory"`, `"redis"`, `"cluster"`, …).
    pub fn backend_kind(&self) -> &'static str {
        self.core.kind()
    }

    /// The options configured with [`LockerBuilder::default_options`].
    pub fn default_options(&self) -> &LockOptions {
        &self.core.defaults
    }

    /// Checks `options` as [`Locker::check_options`](super::Locker::check_options) does.
    pub fn check_options(&self, options: &LockOptions) -> Result<()> {
        self.core.first_ttl(options).map(drop)
    }

    /// The keyspace: the prefix and the policy (`sem`, or the
    /// [name](LockerBuilder::name)).
    pub fn keyspace(&self) -> &Keyspace {
        self.core.keyspace()
    }

    /// The keys and channel of `name` (for a holder of one permit).
    pub fn keys_for(&self, name: impl Into<Subject>) -> LockKeys {
        self.core.keys(&name.into(), 1)
    }
}
