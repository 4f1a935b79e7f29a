//! [`MemoryBackend`]: the same behaviour in one process, no Redis.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::{RateBackend, RateReply, RateRequest, RefundRequest};
use crate::clock::{Clock, SystemClock};
use crate::error::Result;
use crate::lock::memory::MemoryLocks;
use crate::rate::{Algorithm, Outcome, Quota, Refund, Slot, Step};

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
/// # async fn main() -> Result<(), tollgate_core::Error> {
/// use tollgate_core::{MemoryBackend, Quota, RateLimiter};
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
    /// Seeds the shard choice (the maps themselves use SipHash).
    seed: u64,
    locks: MemoryLocks,
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Entry>,
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

struct Entry {
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
    /// A backend timed by the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A backend timed by `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock) -> Self {
        MemoryBackend {
            inner: Arc::new(Inner {
                clock: Arc::new(clock),
                shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
                seed: RandomState::new().hash_one(0u8),
                locks: MemoryLocks::default(),
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

    fn shard_for(&self, key: &str) -> &Mutex<Shard> {
        // Keys of one check share a hash tag, so they share a shard.
        let tag = crate::keyspace::hash_tag(key);
        &self.inner.shards[shard_index(self.inner.seed, tag.as_bytes())]
    }

    fn check_now(&self, req: &RateRequest) -> RateReply {
        let now = req
            .now_micros
            .unwrap_or_else(|| self.inner.clock.now_micros());
        let Some(first) = req.keys.first() else {
            return RateReply::new(true, Vec::new());
        };
        let mut shard = lock(self.shard_for(first));
        shard.tick(now);
        if let ([key], [q]) = (&req.keys[..], &req.quotas[..]) {
            let (allowed, outcome) =
                Self::check_one(&mut shard, key, q, req.algorithm, req.cost, now);
            return RateReply::new(allowed, vec![outcome]).at(now);
        }
        // Each key's live entry is taken out whole, keeping its owned key so
        // that putting it back allocates nothing.
        let mut held: Vec<(Option<String>, u64)> = Vec::with_capacity(req.keys.len());
        let mut slots: Vec<Option<Slot>> = Vec::with_capacity(req.keys.len());
        for k in &req.keys {
            match shard.map.remove_entry(k) {
                Some((owned, e)) if e.expires_at > now => {
                    held.push((Some(owned), e.expires_at));
                    slots.push(Some(e.slot));
                }
                Some((owned, _expired)) => {
                    held.push((Some(owned), 0));
                    slots.push(None);
                }
                None => {
                    held.push((None, 0));
                    slots.push(None);
                }
            }
        }
        let alg = req.algorithm;
        let mut outcomes: Vec<_> = slots
            .iter_mut()
            .zip(req.quotas.iter())
            .map(|(slot, q)| alg.step(slot, now, req.cost, q, false))
            .collect();
        let allowed = outcomes.iter().all(|o| o.retry_after_micros == 0);
        if allowed {
            outcomes = slots
                .iter_mut()
                .zip(req.quotas.iter())
                .map(|(slot, q)| alg.step(slot, now, req.cost, q, true))
                .collect();
        }
        for (((key, slot), outcome), (owned, old_expiry)) in
            req.keys.iter().zip(slots).zip(&outcomes).zip(held)
        {
            let Some(slot) = slot else { continue };
            if matches!(&slot, Slot::Log(l) if l.is_empty()) {
                continue;
            }
            // An admitted write sets a fresh TTL; a denied check keeps the old
            // one, exactly as the scripts leave the key untouched.
            let expires_at = if allowed {
                now + outcome.ttl_micros.max(1)
            } else {
                old_expiry
            };
            if expires_at > now {
                let key = owned.unwrap_or_else(|| key.clone());
                shard.map.insert(key, Entry { slot, expires_at });
            }
        }
        RateReply::new(allowed, outcomes).at(now)
    }
}

impl MemoryBackend {
    /// The refund scripts' twin: the marker first (at most once per charge,
    /// living as long as the refund could matter), then each quota's refund
    /// on its live entry.
    fn refund_now(&self, req: &RefundRequest) -> bool {
        let now = req
            .now_micros
            .unwrap_or_else(|| self.inner.clock.now_micros());
        let until = req.at_micros.saturating_add(req.span_micros);
        if until <= now {
            return false;
        }
        let mut shard = lock(self.shard_for(&req.marker));
        if shard
            .map
            .get(&req.marker)
            .is_some_and(|e| e.expires_at > now)
        {
            return false;
        }
        shard.map.insert(
            req.marker.clone(),
            Entry {
                slot: Slot::Marker,
                expires_at: until,
            },
        );
        let r = Refund {
            now,
            cost: req.cost,
            at: req.at_micros,
        };
        for (i, (key, q)) in req.keys.iter().zip(req.quotas.iter()).enumerate() {
            // A quota whose own span has passed may have refilled: nothing.
            let span = req
                .quota_spans_micros
                .get(i)
                .copied()
                .unwrap_or(req.span_micros);
            if req.at_micros.saturating_add(span) <= now {
                continue;
            }
            let Some(entry) = shard.map.get_mut(key).filter(|e| e.expires_at > now) else {
                continue;
            };
            let mut slot = Some(std::mem::replace(&mut entry.slot, Slot::Marker));
            let ttl = req.algorithm.refund(&mut slot, r, q);
            match slot {
                Some(slot) => {
                    entry.slot = slot;
                    if let Some(ttl) = ttl {
                        entry.expires_at = now + ttl.max(1);
                    }
                }
                None => {
                    shard.map.remove(key);
                }
            }
        }
        true
    }

    /// A single-quota check of `key`, whose hash tag is `tag`, without a
    /// [`RateRequest`]: what [`check_now`](Self::check_now) decides for
    /// one key and one quota, for a limiter that knows its backend is this
    /// one (no key vector, no reply vector: issue #15). Returns whether it
    /// was admitted, the outcome, and the time it was decided at.
    pub(crate) fn check_single(
        &self,
        alg: Algorithm,
        key: &str,
        tag: &str,
        q: &Quota,
        cost: u64,
        now: Option<u64>,
    ) -> (bool, Outcome, u64) {
        let now = now.unwrap_or_else(|| self.inner.clock.now_micros());
        // The shard shard_for(key) picks, from the tag the caller knows.
        let shard = &self.inner.shards[shard_index(self.inner.seed, tag.as_bytes())];
        debug_assert!(std::ptr::eq(shard, self.shard_for(key)), "{key}");
        let mut shard = lock(shard);
        shard.tick(now);
        let (allowed, outcome) = Self::check_one(&mut shard, key, q, alg, cost, now);
        (allowed, outcome, now)
    }

    /// [`check_now`](Self::check_now) for one quota (the common case): the
    /// same steps on the entry in place (one lookup, no vectors).
    fn check_one(
        shard: &mut Shard,
        key: &str,
        q: &Quota,
        alg: Algorithm,
        cost: u64,
        now: u64,
    ) -> (bool, Outcome) {
        let params = alg.params(q);
        let peek = Step {
            now,
            cost,
            commit: false,
        };
        let commit = Step {
            commit: true,
            ..peek
        };
        // A peek, then the commit when it admits (as check_now steps every
        // quota); one committing step where that is the same.
        let step = |slot: &mut Option<Slot>| {
            if alg.commit_decides() {
                let outcome = alg.step_with(slot, commit, params);
                return (outcome.retry_after_micros == 0, outcome);
            }
            let outcome = alg.step_with(slot, peek, params);
            if outcome.retry_after_micros == 0 {
                (true, alg.step_with(slot, commit, params))
            } else {
                (false, outcome)
            }
        };
        if let Some(entry) = shard.map.get_mut(key) {
            let expired = entry.expires_at <= now;
            let mut slot = (!expired).then(|| std::mem::replace(&mut entry.slot, Slot::Marker));
            let (allowed, outcome) = step(&mut slot);
            // As in check_now: an admitted write sets a fresh TTL, a denial
            // keeps the old one; an empty log or a lapsed entry is dropped.
            let expires_at = if allowed {
                now + outcome.ttl_micros.max(1)
            } else {
                entry.expires_at
            };
            match slot {
                Some(slot)
                    if expires_at > now && !matches!(&slot, Slot::Log(l) if l.is_empty()) =>
                {
                    entry.slot = slot;
                    entry.expires_at = expires_at;
                }
                _ => {
                    shard.map.remove(key);
                }
            }
            return (allowed, outcome);
        }
        let mut slot = None;
        let (allowed, outcome) = step(&mut slot);
        if allowed {
            if let Some(slot) = slot {
                if !matches!(&slot, Slot::Log(l) if l.is_empty()) {
                    let expires_at = now + outcome.ttl_micros.max(1);
                    shard.map.insert(key.to_owned(), Entry { slot, expires_at });
                }
            }
        }
        (allowed, outcome)
    }
}

/// Picks a shard from a hash tag: a multiply-xor hash, cheaper than SipHash.
/// Only lock contention depends on it (each shard's map keeps SipHash), so
/// it needs no resistance to crafted keys.
fn shard_index(seed: u64, tag: &[u8]) -> usize {
    let mut h = seed;
    let mut mix = |word: u64| {
        h = (h ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
    };
    // Whole words read directly (a copy of unknown length is a memcpy
    // call); the tail zero-padded, as before.
    let words = tag.chunks_exact(8);
    let tail = words.remainder();
    for word in words {
        mix(u64::from_le_bytes(word.try_into().expect("8 bytes")));
    }
    if !tail.is_empty() {
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        mix(u64::from_le_bytes(word));
    }
    (h >> 32) as usize % SHARDS
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a half-written entry: entries
    // are replaced whole, and the single-quota path's placeholder (taken out
    // while the step runs) reads as fresh state, as a removed entry would. So
    // a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RateBackend for MemoryBackend {
    fn check_rate<'a>(&'a self, req: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        let reply = self.check_now(req);
        async move { Ok(reply) }.boxed()
    }

    fn check_rate_now(&self, req: &RateRequest) -> Option<Result<RateReply>> {
        Some(Ok(self.check_now(req)))
    }

    fn refund_rate<'a>(&'a self, req: &'a RefundRequest) -> BoxFuture<'a, Result<bool>> {
        let done = self.refund_now(req);
        async move { Ok(done) }.boxed()
    }

    fn refund_rate_now(&self, req: &RefundRequest) -> Option<Result<bool>> {
        Some(Ok(self.refund_now(req)))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
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
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowLog,
            Algorithm::SlidingWindowCounter,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ] {
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
