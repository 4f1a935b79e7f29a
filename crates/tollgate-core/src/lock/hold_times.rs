//! [`HoldTimes`]: how long holders of a name keep it, as this process has
//! seen them release it, so a refusal can hint a realistic wait instead of
//! the holder's whole lease.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How many names are remembered per shard; past it, one is forgotten for
/// each new one.
const NAMES_PER_SHARD: usize = 64;
/// Shards, so releases and refusals of different names rarely share a lock.
const SHARDS: usize = 16;

/// A moving average of recent hold times per lock or permit name.
pub(crate) struct HoldTimes {
    /// Name (its lock key) → the average hold (µs), by shard.
    recent: [Mutex<HashMap<String, u64>>; SHARDS],
}

impl Default for HoldTimes {
    fn default() -> Self {
        HoldTimes {
            recent: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

impl HoldTimes {
    /// The shard that keeps `name`.
    fn shard(&self, name: &str) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        let i = crate::keyspace::quick_hash(0, name.as_bytes()) as usize % SHARDS;
        self.recent[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A lease of `name` was released after being held for `held`.
    pub(crate) fn record(&self, name: &str, held: Duration) {
        let held = u64::try_from(held.as_micros()).unwrap_or(u64::MAX);
        let mut recent = self.shard(name);
        if let Some(avg) = recent.get_mut(name) {
            // An exponential average weighting the newest hold by 1/4: it
            // follows a change of workload within a few releases.
            *avg = avg.saturating_mul(3).saturating_add(held) / 4;
            return;
        }
        if recent.len() >= NAMES_PER_SHARD {
            if let Some(old) = recent.keys().next().cloned() {
                recent.remove(&old);
            }
        }
        recent.insert(name.to_owned(), held);
    }

    /// The wait to suggest to someone refused `name` while its holder's
    /// lease has `remaining` left: the name's typical hold when one was
    /// seen here, never beyond `remaining` (the holder cannot keep it
    /// longer without renewing); `remaining` itself otherwise.
    pub(crate) fn hint(&self, name: &str, remaining: Duration) -> Duration {
        match self.shard(name).get(name) {
            Some(&avg) => remaining.min(Duration::from_micros(avg)),
            None => remaining,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_follows_recent_holds_within_the_lease() {
        let h = HoldTimes::default();
        let lease = Duration::from_secs(30);
        assert_eq!(h.hint("job", lease), lease, "nothing seen yet");
        h.record("job", Duration::from_millis(500));
        assert_eq!(h.hint("job", lease), Duration::from_millis(500));
        assert_eq!(
            h.hint("job", Duration::from_millis(200)),
            Duration::from_millis(200)
        );
        h.record("job", Duration::from_millis(900));
        assert_eq!(h.hint("job", lease), Duration::from_millis(600));
        assert_eq!(h.hint("other", lease), lease, "per name");
    }

    #[test]
    fn names_stay_bounded() {
        let h = HoldTimes::default();
        for i in 0..SHARDS * NAMES_PER_SHARD * 2 {
            h.record(&format!("n{i}"), Duration::from_millis(1));
        }
        for shard in &h.recent {
            assert_eq!(shard.lock().unwrap().len(), NAMES_PER_SHARD);
        }
    }
}
