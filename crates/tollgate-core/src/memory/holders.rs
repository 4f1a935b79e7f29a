//! The Rust twin of `lua/lock_holders.lua` and `lua/lock_break.lua`: who
//! holds what under a prefix, and breaking a stuck holder.

use std::time::Duration;

use super::state::MemoryLocks;
use crate::store::{parse_lock_key, LockHolder, LockKeys};

impl MemoryLocks {
    /// Every described holder of a lock or permits under `prefix` at `now`.
    pub(crate) fn holders(&self, prefix: &str, now: u64) -> Vec<LockHolder> {
        let state = self.lock();
        let mut out = Vec::new();
        for (key, h) in &state.held {
            let (Some((name, subject)), Some(who)) = (parse_lock_key(prefix, key), &h.who) else {
                continue;
            };
            if h.expires_at <= now {
                continue;
            }
            // The fence key while it lives (a Redlock raises it), else the
            // one the acquire drew, as the script reads them.
            let fence = state
                .fences
                .get(&format!("{key}:fence"))
                .filter(|f| f.expires_at > now)
                .map_or(who.fence, |f| f.value);
            let mut holder = LockHolder::new(name, subject, false, fence);
            holder.holder.clone_from(&who.holder);
            holder.held = Duration::from_micros(now.saturating_sub(who.since));
            holder.ttl = Duration::from_micros(h.expires_at - now);
            out.push(holder);
        }
        for (key, set) in &state.permits {
            let Some((name, subject)) = parse_lock_key(prefix, key) else {
                continue;
            };
            if set.expires_at <= now {
                continue;
            }
            for (weight, expires_at, who) in set.holders.values() {
                if *expires_at <= now {
                    continue;
                }
                let mut holder = LockHolder::new(name, subject, true, who.fence);
                holder.holder.clone_from(&who.holder);
                holder.weight = *weight;
                holder.held = Duration::from_micros(now.saturating_sub(who.since));
                holder.ttl = Duration::from_micros(expires_at - now);
                out.push(holder);
            }
        }
        out
    }

    /// Removes whoever holds `keys` (a lock, or every permit of the name),
    /// keeping the fence, and tells waiters; how many holders went.
    pub(crate) fn break_holders(&self, keys: &LockKeys, now: u64) -> u32 {
        let removed = {
            let mut state = self.lock();
            // Only a lock (a holder with a description, as a lock's value
            // on Redis has): an idempotency record's lease stays.
            if let Some(h) = Self::live(&mut state, &keys.lock, now) {
                if h.who.is_some() {
                    state.held.remove(&keys.lock);
                    1
                } else {
                    0
                }
            } else if let Some(set) = state.permits.get_mut(&keys.lock) {
                set.expire(now);
                let n = set.holders.len() as u32;
                set.holders.clear();
                set.used = 0;
                if set.is_empty() {
                    state.permits.remove(&keys.lock);
                }
                n
            } else {
                0
            }
        };
        if removed > 0 {
            self.notify(&keys.channel);
        }
        removed
    }
}
