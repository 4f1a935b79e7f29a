//! The in-process store: [`MemoryBackend`], one state (rate-limit entries in
//! shards, locks, permits and idempotency records) and the Rust twins of
//! the Redis scripts over it.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use self::rate::Slot;
use self::state::MemoryLocks;
use crate::clock::{Clock, MonotonicClock};

mod admin;
mod holders;
mod idempotency;
mod lock;
mod permits;
mod rate;
mod state;

const SHARDS: usize = 16;

/// Rate limits and locks in this process's memory.
///
/// Runs the Rust twin of every script, with the same semantics, so a service
/// without Redis behaves like one with it (for a single instance). Checks are
/// atomic (each takes one shard's mutex, chosen by the hash tag, so all keys of
/// one check share it); expired entries are evicted as the map grows, so
/// memory stays bounded by the live keys.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{MemoryBackend, Quota, RateLimiter};
///
/// let limiter = RateLimiter::token_bucket(MemoryBackend::new(), Quota::per_second(2))?;
/// assert!(limiter.check("alice").await?.allowed);
/// assert!(limiter.check("alice").await?.allowed);
/// assert!(!limiter.check("alice").await?.allowed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    shards: Vec<Mutex<Shard>>,
    /// Seeds the shard choice (each map seeds its own hasher).
    seed: u64,
    locks: MemoryLocks,
    admin: admin::MemoryAdmin,
}

#[derive(Default)]
pub(crate) struct Shard {
    /// foldhash, seeded per map: a fifth of SipHash's cost on every check.
    /// Keys are bounded (a long subject becomes a digest), so crafted keys
    /// can at worst crowd one shard of one process.
    map: HashMap<String, Entry, foldhash::fast::RandomState>,
    ops: u64,
    next_sweep: u64,
}

impl Shard {
    /// Counts a check, sweeping expired entries as the map grows.
    fn tick(&mut self, now: u64) {
        self.ops += 1;
        if self.ops >= self.next_sweep {
            self.map.retain(|_, e| e.expires_at > now);
            self.next_sweep = self.ops + (self.map.len() as u64).max(1024);
        }
    }
}

pub(crate) struct Entry {
    slot: Slot,
    /// Expiry on the backend clock, µs.
    expires_at: u64,
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("clock", &self.inner.clock)
            .field("keys", &self.len())
            .finish()
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A backend timed by a [`MonotonicClock`]: the wall clock read once,
    /// then the monotonic one, so a step of the wall clock never expires a
    /// lock or permit before its holder's lease says it may have.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }

    /// A backend timed by `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        MemoryBackend {
            inner: Arc::new(Inner {
                clock: Arc::new(clock),
                shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
                seed: RandomState::new().hash_one(0u8),
                locks: MemoryLocks::default(),
                admin: admin::MemoryAdmin::default(),
            }),
        }
    }

    /// The backend's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The lock state (used by the lock module).
    pub(crate) fn locks(&self) -> &MemoryLocks {
        &self.inner.locks
    }

    /// Number of rate-limit keys held, expired or not yet evicted.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no rate-limit key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired rate-limit key now (it also happens on its own as
    /// the map grows).
    pub fn evict_expired(&self) {
        let now = self.inner.clock.now_micros();
        for s in &self.inner.shards {
            lock(s).map.retain(|_, e| e.expires_at > now);
        }
    }

    /// The shard of a request whose first key is `key`. Every request of a
    /// limiter lists the same keys in the same order (a refund's marker
    /// goes beside them), so a key is always found in its first key's
    /// shard; hashing that key whole saves looking for its hash tag.
    pub(crate) fn shard_for(&self, key: &str) -> &Mutex<Shard> {
        &self.inner.shards[shard_index(self.inner.seed, key.as_bytes())]
    }
}

/// Picks a shard from a request's first key: a multiply-xor hash, cheaper
/// than SipHash. Only lock contention depends on it (each shard's map seeds
/// its own hasher), so it needs no resistance to crafted keys.
pub(crate) fn shard_index(seed: u64, key: &[u8]) -> usize {
    (crate::keyspace::quick_hash(seed, key) >> 32) as usize % SHARDS
}

pub(crate) fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a half-written entry: entries
    // are replaced whole, and the single-quota path's placeholder (taken out
    // while the step runs) reads as fresh state, as a removed entry would. So
    // a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, ManualClock, MemoryBackend, Quota, RateLimiter};

    /// Memory stays bounded by the live keys: expired entries go on their own
    /// as new subjects arrive, without an explicit sweep.
    #[tokio::test]
    async fn expired_entries_are_evicted_as_the_map_grows() {
        let clock = ManualClock::starting_now();
        let backend = MemoryBackend::with_clock(clock.clone());
        for alg in Algorithm::ALL {
            let l = RateLimiter::builder(backend.clone(), alg)
                .quota(Quota::per_second(5))
                .build()
                .unwrap();
            for round in 0..10u64 {
                for i in 0..5_000u64 {
                    l.check(round * 1_000_000 + i).await.unwrap();
                }
                clock.advance(Duration::from_secs(3));
            }
            // Ten rounds of 5 000 subjects; only the latest rounds can remain.
            assert!(
                backend.len() <= 25_000,
                "{alg:?}: {} entries",
                backend.len()
            );
            backend.evict_expired();
            clock.advance(Duration::from_secs(3));
            backend.evict_expired();
            assert_eq!(backend.len(), 0, "{alg:?}");
        }
    }

    /// Concurrent checks on one subject from many threads never over-admit.
    #[test]
    fn concurrent_threads_never_over_admit() {
        let backend = MemoryBackend::with_clock(ManualClock::starting_now());
        let l = RateLimiter::token_bucket(backend, Quota::per_hour(1000)).unwrap();
        let admitted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    for _ in 0..500 {
                        if rt.block_on(l.check("hot")).unwrap().allowed {
                            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.into_inner(), 1000);
    }
}
