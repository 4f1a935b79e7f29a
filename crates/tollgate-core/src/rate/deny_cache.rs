//! [`DenyCache`]: a limiter's local memory of recent denials, so a client
//! that keeps retrying while denied costs no round trip until its wait is
//! over.
//!
//! A cached denial answers only what the store would answer at that
//! instant: the same cost (another cost has another wait), and only until
//! the first figure the store reports can change other than by counting
//! down — the next unit made available (`next_after`), which comes no later
//! than the retry. Until then each remaining count stands and every wait
//! counts down by the time since the reply. An admission of that subject
//! can only follow a lookup that found no entry for its cost, and a lookup
//! for another cost drops the entry: so the figures are those of this
//! limiter's own checks. Other instances' admissions (or a check of this
//! one decided while the denial was on its way back) only make the store
//! stricter than the entry says.
//!
//! Its time is the clock that times the limiter's decisions when there is
//! one (the limiter's own, or that of a store deciding in process, which
//! then counts down exactly as the store does), else this process's
//! monotonic clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{Decision, DecisionSource};

/// Denied subjects and until when (local clock), bounded: sharded so
/// concurrent checks rarely contend, and swept only when an entry can have
/// expired, so a full cache costs O(1) per denial.
pub(crate) struct DenyCache {
    shard_capacity: usize,
    shards: Vec<Mutex<DenyShard>>,
    hasher: std::hash::RandomState,
    /// The latest `until` ever inserted: once it has passed, every entry
    /// has run out (nobody is denied), and a lookup costs one atomic load
    /// instead of a hash and a lock.
    latest_until: AtomicU64,
    /// How many times it was told to forget (a give-back, an operator's
    /// action): a denial of a request sent before the latest may predate
    /// it, so it is not cached.
    forgets: AtomicU64,
}

/// When a check was sent, as its denial is cached: the local time, and the
/// forget count then.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sent {
    pub(crate) at: u64,
    pub(crate) forgets: u64,
}

#[derive(Default)]
struct DenyShard {
    map: HashMap<String, CachedDenial>,
    /// The earliest `until` of any entry: no sweep can free room before it.
    earliest: u64,
}

struct CachedDenial {
    /// Until when it may answer (local clock), measured from before the
    /// request was sent: never past the store's own deadline.
    until: u64,
    /// When the reply came (local clock): waits count down from here, so
    /// they are never shorter than the store's.
    replied_at: u64,
    cost: u64,
    decision: Decision,
}

const DENY_SHARDS: usize = 16;

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> Self {
        DenyCache {
            shard_capacity: capacity.div_ceil(DENY_SHARDS).max(1),
            shards: (0..DENY_SHARDS).map(|_| Mutex::default()).collect(),
            hasher: std::hash::RandomState::new(),
            latest_until: AtomicU64::new(0),
            forgets: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, DenyShard> {
        use std::hash::BuildHasher;
        let i = self.hasher.hash_one(key) as usize % DENY_SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, key: &str, cost: u64, now: u64) -> Option<Decision> {
        if now >= self.latest_until.load(Ordering::Relaxed) {
            return None;
        }
        let mut shard = self.shard(key);
        let entry = shard.map.get(key)?;
        if now >= entry.until {
            shard.map.remove(key);
            return None;
        }
        if cost != entry.cost {
            // Another cost goes to the store, and may take units the cached
            // figures still count: the entry goes, rather than outlive it.
            shard.map.remove(key);
            return None;
        }
        let mut d = entry.decision.clone();
        let elapsed = Duration::from_micros(now.saturating_sub(entry.replied_at));
        let down = |t: Duration| t.saturating_sub(elapsed);
        for q in &mut d.quotas {
            q.reset_after = down(q.reset_after);
            q.next_after = down(q.next_after);
            q.retry_after = q.retry_after.map(|r| down(r).max(Duration::from_micros(1)));
        }
        d.reset_after = down(d.reset_after);
        d.retry_after = d.retry_after.map(|r| down(r).max(Duration::from_micros(1)));
        d.source = DecisionSource::DenyCache;
        Some(d)
    }

    /// Forgets a denial (a refund made room).
    pub(crate) fn remove(&self, key: &str) {
        self.shard(key).map.remove(key);
    }

    /// From now on, denials of requests sent before are not cached: a
    /// give-back or an operator's action may have made them stale while
    /// they were on their way.
    pub(crate) fn forget(&self) {
        self.forgets.fetch_add(1, Ordering::Relaxed);
    }

    /// The forget count, read as a request is sent ([`Sent::forgets`]).
    pub(crate) fn forgets(&self) -> u64 {
        self.forgets.load(Ordering::Relaxed)
    }

    /// Forgets every denial (an operator changed something this instance
    /// may not have heard about).
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            shard.lock().unwrap_or_else(|e| e.into_inner()).map.clear();
        }
    }

    /// Remembers a denial of `cost`: the request was `sent` and answered
    /// at `replied_at` (local clock).
    pub(crate) fn insert(&self, key: &str, cost: u64, sent: Sent, replied_at: u64, d: &Decision) {
        if sent.forgets != self.forgets.load(Ordering::Relaxed) {
            return;
        }
        let sent_at = sent.at;
        let Some(retry) = d.retry_after else { return };
        // The first change the countdown cannot follow: a unit made
        // available (a quota with nothing used has no next unit to wait for).
        let next = d
            .quotas
            .iter()
            .map(|q| q.next_after)
            .filter(|n| !n.is_zero())
            .min()
            .unwrap_or(retry);
        let until = sent_at + retry.min(next).as_micros() as u64;
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
                replied_at,
                cost,
                decision: d.clone(),
            },
        );
        self.latest_until.fetch_max(until, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::Outcome;
    use crate::{Algorithm, Quota};

    fn denial(retry_us: u64) -> Decision {
        Decision::from_outcomes(
            Algorithm::FixedWindow,
            &[Quota::per_second(1)],
            &[Outcome::from_reply(0, retry_us, retry_us, retry_us)],
            false,
            DecisionSource::Backend,
        )
    }

    fn sent(at: u64) -> Sent {
        Sent { at, forgets: 0 }
    }

    fn d_again() -> Decision {
        let mut d = denial(500_000);
        d.quotas[0].next_after = Duration::from_millis(300);
        d
    }

    #[test]
    fn repeats_a_denial_until_it_runs_out() {
        let c = DenyCache::new(100);
        assert!(c.get("a", 1, 0).is_none(), "empty");
        // Sent at 1 ms, answered at 2 ms: retry 500 ms, next unit in 300 ms.
        let mut d = denial(500_000);
        d.quotas[0].next_after = Duration::from_millis(300);
        c.insert("a", 2, sent(1_000), 2_000, &d);
        let d = c.get("a", 2, 102_000).expect("cached");
        assert_eq!(d.source, DecisionSource::DenyCache);
        // Counted down from the reply: never shorter than the store's wait.
        assert_eq!(d.retry_after, Some(Duration::from_micros(400_000)));
        assert_eq!(d.quotas[0].next_after, Duration::from_micros(200_000));
        assert_eq!(d.remaining, 0);
        assert!(c.get("b", 2, 102_000).is_none());
        // Measured from before the request was sent, up to the next unit.
        assert!(c.get("a", 2, 300_999).is_some());
        assert!(c.get("a", 2, 301_000).is_none(), "a unit came back");
        // Another cost asks the store, and the entry goes with it.
        c.insert("a", 2, sent(1_000), 2_000, &d_again());
        assert!(c.get("a", 1, 102_000).is_none(), "another cost asks again");
        assert!(
            c.get("a", 2, 102_000).is_none(),
            "dropped by the other cost"
        );
    }

    /// A denial of a request sent before a forget is not cached; one sent
    /// after is.
    #[test]
    fn a_forget_drops_denials_already_on_their_way() {
        let c = DenyCache::new(100);
        let before = Sent {
            at: 1_000,
            forgets: c.forgets(),
        };
        c.forget();
        c.insert("a", 1, before, 2_000, &denial(500_000));
        assert!(c.get("a", 1, 3_000).is_none(), "sent before the forget");
        let after = Sent {
            at: 1_000,
            forgets: c.forgets(),
        };
        c.insert("a", 1, after, 2_000, &denial(500_000));
        assert!(c.get("a", 1, 3_000).is_some());
    }

    #[test]
    fn allowed_decisions_are_not_cached_and_capacity_is_bounded() {
        let c = DenyCache::new(1);
        let mut allowed = denial(1_000);
        allowed.retry_after = None;
        c.insert("x", 1, sent(0), 0, &allowed);
        assert!(c.get("x", 1, 1).is_none());
        // One entry per shard: many keys never grow it past the shards.
        for i in 0..1_000 {
            c.insert(&format!("k{i}"), 1, sent(0), 0, &denial(1_000_000));
        }
        let held: usize = c.shards.iter().map(|s| s.lock().unwrap().map.len()).sum();
        assert!(held <= DENY_SHARDS, "{held}");
    }
}
