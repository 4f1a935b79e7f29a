//! [`Backend`]: one handle over every store, chosen at run time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::memory::MemoryBackend;
use crate::redis::RedisBackend;
use crate::store::{
    AcquireReply, AcquireRequest, AdminBackend, ClaimReply, ClaimRequest, FencingToken,
    IdempotencyBackend, InFlightRecord, LeaseReply, LeaseSize, LockBackend, LockHolder, LockKeys,
    RateBackend, RateReply, RateRequest, RecordKeys, ReleaseEvents, SettleReply, SettleRequest,
    StoredResponse,
};

/// The store an application picked: this process's memory, or Redis
/// (standalone, Cluster or Sentinel). Every capability accepts it, so an
/// application that chooses at run time needs no generics and no enum of
/// its own. Cheap to clone; clones share the connection and the state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{Backend, Locker, Quota, RateLimiter};
///
/// // Memory unless REDIS_URL, REDIS_CLUSTER or REDIS_SENTINELS is set.
/// let backend = Backend::from_env().await?;
/// let limiter = RateLimiter::gcra(backend.clone(), Quota::per_second(10))?;
/// let locker = Locker::new(backend);
/// assert!(limiter.check("alice").await?.allowed);
/// # let _ = locker;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Backend {
    /// This process's memory ([`MemoryBackend`]).
    Memory(MemoryBackend),
    /// Redis, standalone, Cluster or Sentinel ([`RedisBackend`]).
    Redis(RedisBackend),
}

impl Backend {
    /// A store in this process's memory.
    pub fn memory() -> Self {
        Backend::Memory(MemoryBackend::new())
    }

    /// The store the environment names:
    ///
    /// | variable | store |
    /// |---|---|
    /// | `REDIS_CLUSTER` | a Redis Cluster through these comma-separated seeds (`host:port` or URLs); it must be reachable now, to learn its slots |
    /// | `REDIS_SENTINELS` | the master `REDIS_SENTINEL_SERVICE` (default `mymaster`) behind these comma-separated Sentinels (feature `sentinel`) |
    /// | `REDIS_URL` | a standalone Redis, connected lazily: a process starts while Redis is down and recovers when it is back |
    /// | none of them | this process's memory |
    ///
    /// The first one set (and not blank) in that order wins. A malformed
    /// value, an unreachable cluster, or `REDIS_SENTINELS` without the
    /// `sentinel` feature is an error.
    pub async fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok()).await
    }

    /// [`from_env`](Self::from_env) over any source of variables.
    pub async fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let list = |v: String| -> Vec<String> {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        if let Some(seeds) = var("REDIS_CLUSTER") {
            return Ok(Backend::Redis(
                RedisBackend::connect_cluster(list(seeds)).await?,
            ));
        }
        if let Some(sentinels) = var("REDIS_SENTINELS") {
            let service = var("REDIS_SENTINEL_SERVICE").unwrap_or_else(|| "mymaster".into());
            return Self::sentinel(&list(sentinels), &service);
        }
        match var("REDIS_URL") {
            Some(url) => {
                let redis = RedisBackend::connect_lazy(url.trim())?;
                // Connected lazily: the version and eviction checks run once
                // Redis answers, in the background (a warning if it may evict).
                let check = redis.clone();
                tokio::spawn(async move {
                    if let Err(e) = check.check_server_version().await {
                        tracing::warn!(error = %e, "the Redis server could not be checked");
                    }
                });
                Ok(Backend::Redis(redis))
            }
            None => {
                tracing::info!(
                    "no REDIS_CLUSTER, REDIS_SENTINELS or REDIS_URL: state is kept in this \
                     process's memory, not shared with other instances"
                );
                Ok(Self::memory())
            }
        }
    }

    #[cfg(feature = "sentinel")]
    fn sentinel(sentinels: &[String], service: &str) -> Result<Self> {
        Ok(Backend::Redis(RedisBackend::sentinel(sentinels, service)?))
    }

    #[cfg(not(feature = "sentinel"))]
    fn sentinel(_: &[String], _: &str) -> Result<Self> {
        Err(crate::error::Error::InvalidConfig(
            "REDIS_SENTINELS is set, but tollgate was built without the `sentinel` feature".into(),
        ))
    }

    /// `"memory"`, `"redis"`, `"cluster"` or `"sentinel"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Memory(m) => RateBackend::kind(m),
            Backend::Redis(r) => RateBackend::kind(r),
        }
    }

    /// The store behind this handle, as a trait object of each kind.
    fn rate(&self) -> &dyn RateBackend {
        match self {
            Backend::Memory(m) => m,
            Backend::Redis(r) => r,
        }
    }

    /// The operator plane of the store.
    pub(crate) fn admin_store(&self) -> &dyn AdminBackend {
        match self {
            Backend::Memory(m) => m,
            Backend::Redis(r) => r,
        }
    }

    fn idempotency(&self) -> &dyn IdempotencyBackend {
        match self {
            Backend::Memory(m) => m,
            Backend::Redis(r) => r,
        }
    }
}

impl From<MemoryBackend> for Backend {
    fn from(m: MemoryBackend) -> Self {
        Backend::Memory(m)
    }
}

impl From<RedisBackend> for Backend {
    fn from(r: RedisBackend) -> Self {
        Backend::Redis(r)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

impl RateBackend for Backend {
    fn check_rate<'a>(&'a self, request: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        self.rate().check_rate(request)
    }

    fn check_rate_now(&self, request: &RateRequest) -> Option<Result<RateReply>> {
        self.rate().check_rate_now(request)
    }

    fn settle_rate<'a>(&'a self, request: &'a SettleRequest) -> BoxFuture<'a, Result<SettleReply>> {
        self.rate().settle_rate(request)
    }

    fn settle_rate_now(&self, request: &SettleRequest) -> Option<Result<SettleReply>> {
        self.rate().settle_rate_now(request)
    }

    fn supports_leases(&self) -> bool {
        self.rate().supports_leases()
    }

    fn decision_clock(&self) -> Option<Arc<dyn crate::clock::Clock>> {
        self.rate().decision_clock()
    }

    fn lease_rate<'a>(
        &'a self,
        request: &'a RateRequest,
        size: LeaseSize,
    ) -> BoxFuture<'a, Result<LeaseReply>> {
        self.rate().lease_rate(request, size)
    }

    fn lease_rate_now(&self, request: &RateRequest, size: LeaseSize) -> Option<Result<LeaseReply>> {
        self.rate().lease_rate_now(request, size)
    }

    fn local_rate(&self) -> Arc<dyn RateBackend> {
        self.rate().local_rate()
    }

    fn kind(&self) -> &'static str {
        self.rate().kind()
    }

    fn admin(&self) -> Option<Arc<dyn AdminBackend>> {
        self.rate().admin()
    }
}

impl LockBackend for Backend {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<AcquireReply>> {
        self.idempotency().acquire_lock(request)
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, Result<bool>> {
        self.idempotency().release_lock(keys, token)
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.idempotency().extend_lock(keys, token, ttl)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.idempotency()
            .raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, Result<ReleaseEvents>>> {
        self.idempotency().release_events(channel_prefix)
    }

    fn permits_in_use<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        self.idempotency().permits_in_use(keys)
    }

    fn lock_holders<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockHolder>>> {
        self.idempotency().lock_holders(prefix)
    }

    fn break_holders<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        self.idempotency().break_holders(keys)
    }

    fn local_lock(&self) -> Arc<dyn LockBackend> {
        self.idempotency().local_lock()
    }

    fn lock_kind(&self) -> &'static str {
        self.idempotency().lock_kind()
    }

    fn lock_admin(&self) -> Option<Arc<dyn AdminBackend>> {
        self.idempotency().lock_admin()
    }
}

impl IdempotencyBackend for Backend {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<ClaimReply>> {
        self.idempotency().claim(request)
    }

    fn complete<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
        response: &'a StoredResponse,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.idempotency()
            .complete(keys, token, fence, response, ttl)
    }

    fn abandon<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<bool>> {
        self.idempotency().abandon(keys, token, fence)
    }

    fn records_in_flight<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<InFlightRecord>>> {
        self.idempotency().records_in_flight(prefix)
    }
}
