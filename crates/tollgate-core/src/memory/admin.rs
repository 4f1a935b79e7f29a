//! The operator plane in memory: [`AdminBackend`] for [`MemoryBackend`].
//! One process is the whole fleet: the admin channel calls this process's
//! listeners at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::{self, BoxFuture};
use futures_util::FutureExt;

use super::rate::Slot;
use super::{lock, Entry, MemoryBackend};
use crate::error::Result;
use crate::store::{millis_ceil, AdminBackend, AdminListener, DenialCount, Listeners};

/// A registry's fields: each one's value and how many owners wrote it.
type Registry = BTreeMap<String, (String, usize)>;

/// The operator plane's state of one [`MemoryBackend`].
#[derive(Default)]
pub(crate) struct MemoryAdmin {
    /// Block key → its end (µs, the backend's clock).
    blocks: Mutex<HashMap<String, u64>>,
    /// How many blocks exist: a check reads the map only when some do.
    block_count: AtomicUsize,
    /// The earliest end of any block (µs; `u64::MAX` for none).
    earliest_end: AtomicU64,
    registries: Mutex<HashMap<String, Registry>>,
    listeners: Mutex<HashMap<String, Listeners>>,
    versions: Mutex<HashMap<String, u64>>,
    throttled: Mutex<HashMap<String, Denials>>,
    traffic: Mutex<HashMap<String, Seconds>>,
}

/// A throttled list: its subjects, and when it expires (µs, the backend's
/// clock) — a list per window would otherwise be kept forever.
#[derive(Default)]
struct Denials {
    expires_at: u64,
    subjects: BTreeMap<String, DenialCount>,
}

/// A traffic key's counts: second → (admitted, refused).
type Seconds = BTreeMap<u64, (u64, u64)>;

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while these are held.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryBackend {
    /// What is left of the block `key` now (µs, on the backend's clock,
    /// read only when some block exists), if any. Expired blocks are swept
    /// once the earliest of them has ended, so that no check takes the
    /// blocks' lock for a block nobody checks again.
    pub(crate) fn block_left(&self, key: &str) -> Option<u64> {
        let admin = &self.inner.admin;
        if admin.block_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = self.now();
        let mut blocks = guard(&admin.blocks);
        if admin.earliest_end.load(Ordering::Relaxed) <= now {
            blocks.retain(|_, ends| *ends > now);
            admin.earliest_end.store(
                blocks.values().copied().min().unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            admin.block_count.store(blocks.len(), Ordering::Relaxed);
        }
        blocks
            .get(key)
            .map(|ends| ends.saturating_sub(now))
            .filter(|left| *left > 0)
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_micros()
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> BoxFuture<'a, Result<T>> {
    future::ready(Ok(value)).boxed()
}

impl AdminBackend for MemoryBackend {
    fn in_process(&self) -> bool {
        true
    }

    fn may_block(&self) -> bool {
        self.inner.admin.block_count.load(Ordering::Relaxed) > 0
    }

    fn register<'a>(
        &'a self,
        key: &'a str,
        field: &'a str,
        value: &'a str,
        _ttl: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        let mut registries = guard(&self.inner.admin.registries);
        let entry = registries
            .entry(key.to_owned())
            .or_default()
            .entry(field.to_owned())
            .or_insert_with(|| (String::new(), 0));
        *entry = (value.to_owned(), entry.1 + 1);
        ready(())
    }

    fn registered<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<(String, String)>>> {
        let all = guard(&self.inner.admin.registries)
            .get(key)
            .map(|r| r.iter().map(|(f, (v, _))| (f.clone(), v.clone())).collect())
            .unwrap_or_default();
        ready(all)
    }

    fn unregister<'a>(&'a self, key: &'a str, field: &'a str) -> BoxFuture<'a, Result<()>> {
        let mut registries = guard(&self.inner.admin.registries);
        if let Some(fields) = registries.get_mut(key) {
            if let Some((_, owners)) = fields.get_mut(field) {
                *owners = owners.saturating_sub(1);
                if *owners == 0 {
                    fields.remove(field);
                }
            }
            if fields.is_empty() {
                registries.remove(key);
            }
        }
        ready(())
    }

    fn reset<'a>(
        &'a self,
        keys: &'a [String],
        stamp: &'a str,
        now_micros: Option<u64>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        // A request's keys live in its first key's shard, and so does the
        // stamp its settles read (`lua/rate_reset.lua`'s twin).
        if let Some(first) = keys.first() {
            // The stamp is on the settles' clock; it lives on the store's.
            let (now, store_now) = self.times(now_micros, false);
            let mut shard = lock(self.shard_for(first));
            for k in keys {
                shard.map.remove(k);
            }
            let ttl = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX).max(1);
            let (mut at, mut expires_at) = (now, store_now.saturating_add(ttl));
            if let Some(Entry {
                slot: Slot::Reset(before),
                expires_at: until,
            }) = shard.map.get(stamp)
            {
                if *until > store_now {
                    at = at.max(*before);
                    expires_at = expires_at.max(*until);
                }
            }
            let slot = Slot::Reset(at);
            shard
                .map
                .insert(stamp.to_owned(), Entry { slot, expires_at });
        }
        ready(())
    }

    fn set_block<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        at_least: bool,
    ) -> BoxFuture<'a, Result<Duration>> {
        let admin = &self.inner.admin;
        let now = self.now();
        // Whole ms, at least one, as Redis's PX takes it.
        let ends = now.saturating_add(millis_ceil(ttl).max(1).saturating_mul(1000));
        let mut blocks = guard(&admin.blocks);
        let ends = match blocks.get(key) {
            Some(&current) if at_least => current.max(ends),
            _ => ends,
        };
        blocks.insert(key.to_owned(), ends);
        admin.earliest_end.fetch_min(ends, Ordering::Relaxed);
        admin.block_count.store(blocks.len(), Ordering::Relaxed);
        ready(Duration::from_micros(ends - now))
    }

    fn unblock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<()>> {
        let admin = &self.inner.admin;
        let mut blocks = guard(&admin.blocks);
        blocks.remove(key);
        admin.block_count.store(blocks.len(), Ordering::Relaxed);
        ready(())
    }

    fn block_left<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Duration>>> {
        let left = MemoryBackend::block_left(self, key).map(Duration::from_micros);
        ready(left)
    }

    fn announce<'a>(
        &'a self,
        channel: &'a str,
        version_key: &'a str,
        message: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        *guard(&self.inner.admin.versions)
            .entry(version_key.to_owned())
            .or_default() += 1;
        let listeners = guard(&self.inner.admin.listeners)
            .get(channel)
            .map(Listeners::snapshot)
            .unwrap_or_default();
        // A listener whose limiter is gone says so: it is dropped.
        let gone: Vec<AdminListener> = listeners.into_iter().filter(|l| !l(message)).collect();
        if !gone.is_empty() {
            if let Some(list) = guard(&self.inner.admin.listeners).get_mut(channel) {
                list.drop_gone(&gone);
            }
        }
        ready(())
    }

    fn version<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64>> {
        let v = guard(&self.inner.admin.versions)
            .get(key)
            .copied()
            .unwrap_or(0);
        ready(v)
    }

    fn watch(&self, channel: &str, _version_key: &str, listener: AdminListener) {
        guard(&self.inner.admin.listeners)
            .entry(channel.to_owned())
            .or_default()
            .add(listener);
    }

    fn add_denials<'a>(
        &'a self,
        key: &'a str,
        counts: &'a [DenialCount],
        ttl: Duration,
        keep: usize,
    ) -> BoxFuture<'a, Result<()>> {
        let now = self.now();
        let mut all = guard(&self.inner.admin.throttled);
        // Expired lists go as a store's keys would (a few per limiter).
        all.retain(|_, l| l.expires_at > now);
        let entry = all.entry(key.to_owned()).or_default();
        // Every write sets the TTL again, as the script's PEXPIRE does.
        entry.expires_at = now.saturating_add(u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX));
        let list = &mut entry.subjects;
        for c in counts {
            let e = list
                .entry(c.subject.clone())
                .or_insert_with(|| DenialCount {
                    denied: 0,
                    ..c.clone()
                });
            e.denied += c.denied;
            e.last_denied_ms = e.last_denied_ms.max(c.last_denied_ms);
            if c.label.is_some() {
                e.label.clone_from(&c.label);
            }
        }
        if list.len() > keep {
            let mut by_denials: Vec<(u64, String)> = list
                .values()
                .map(|c| (c.denied, c.subject.clone()))
                .collect();
            by_denials.sort_unstable_by(|a, b| b.cmp(a));
            for (_, s) in by_denials.into_iter().skip(keep) {
                list.remove(&s);
            }
        }
        ready(())
    }

    fn add_traffic<'a>(
        &'a self,
        key: &'a str,
        second: u64,
        admitted: u64,
        refused: u64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        let mut all = guard(&self.inner.admin.traffic);
        let seconds = all.entry(key.to_owned()).or_default();
        let e = seconds.entry(second).or_default();
        e.0 += admitted;
        e.1 += refused;
        // Kept as long as a store would keep it.
        let oldest = second.saturating_sub(ttl.as_secs());
        seconds.retain(|s, _| *s >= oldest);
        ready(())
    }

    fn traffic<'a>(
        &'a self,
        key: &'a str,
        from: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<Vec<(u64, u64, u64)>>> {
        let counts = guard(&self.inner.admin.traffic)
            .get(key)
            .map(|s| {
                s.range(from..=to.max(from))
                    .map(|(s, (a, r))| (*s, *a, *r))
                    .collect()
            })
            .unwrap_or_default();
        ready(counts)
    }

    fn top_denials<'a>(
        &'a self,
        key: &'a str,
        n: usize,
    ) -> BoxFuture<'a, Result<Vec<DenialCount>>> {
        let now = self.now();
        let mut top: Vec<DenialCount> = guard(&self.inner.admin.throttled)
            .get(key)
            .filter(|l| l.expires_at > now)
            .map(|l| l.subjects.values().cloned().collect())
            .unwrap_or_default();
        // Ties as Redis's ZREVRANGE gives them: the later subject first.
        top.sort_by(|a, b| b.denied.cmp(&a.denied).then(b.subject.cmp(&a.subject)));
        top.truncate(n);
        ready(top)
    }
}

#[cfg(test)]
mod tests {
    use super::guard;
    use crate::{Algorithm, MemoryBackend, Quota, RateLimiter};

    /// Limiters built and dropped by the thousand (per tenant, per test)
    /// leave no more than a few listeners behind on the store that outlives
    /// them.
    #[tokio::test]
    async fn dropped_limiters_leave_no_listener() {
        let backend = MemoryBackend::new();
        let build = || {
            RateLimiter::builder(backend.clone(), Algorithm::Gcra)
                .quota(Quota::per_second(1))
                .build()
                .unwrap()
        };
        for _ in 0..1000 {
            drop(build());
        }
        let _kept = build();
        let listeners: usize = guard(&backend.inner.admin.listeners)
            .values()
            .map(|l| l.len())
            .sum();
        // Dead ones are dropped once the list has doubled: a few at most.
        assert!(listeners <= 17, "{listeners}");
    }
}
