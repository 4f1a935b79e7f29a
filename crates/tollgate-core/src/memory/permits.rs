//! The Rust twin of `lua/permit_*.lua` for the memory backend: the same
//! decisions, wait hints and fences, timed by the backend's clock (µs).

use super::state::{micros, MemoryLocks, State, Who};
use crate::error::{Error, Result};
use crate::store::{shape, AcquireReply, AcquireRequest, LockKeys};

/// Redis answers WRONGTYPE when a lock and a permit name share a key (a
/// fair and an unfair `Locker` on one name): so does the twin.
fn wrong_type(state: &State, key: &str, now: u64) -> Result<()> {
    // An expired lock not swept yet is gone on Redis: not in the way.
    if state.held.get(key).is_some_and(|h| h.expires_at > now) {
        return Err(Error::Backend(crate::error::BackendError::new(format!(
            "WRONGTYPE: {key} holds a lock, not permits"
        ))));
    }
    Ok(())
}

/// Milliseconds rounded up, as the script's `math.ceil(µs / 1000)`.
fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

impl MemoryLocks {
    /// Whether the holders key of permits exists on Redis at `now`: it has
    /// members (expired ones too, until a script purges them) and its TTL
    /// has not passed. An empty or expired set is gone there.
    pub(crate) fn permits_key_exists(state: &State, key: &str, now: u64) -> bool {
        state
            .permits
            .get(key)
            .is_some_and(|set| set.expires_at > now && !set.holders.is_empty())
    }

    pub(crate) fn acquire_permits(&self, req: &AcquireRequest, now: u64) -> Result<AcquireReply> {
        let (limit, weight, fair) = shape(&req.keys)?;
        let mut guard = self.lock();
        let state = &mut *guard;
        MemoryLocks::sweep(state, now);
        wrong_type(state, &req.keys.lock, now)?;
        let set = state.permits.entry(req.keys.lock.clone()).or_default();
        set.expire(now);
        let ttl = micros(req.ttl);
        let ticket = req.ticket.as_ref().filter(|_| fair);
        if !set.holders.contains_key(&req.token) {
            if fair {
                set.expire_tickets(now);
                if let Some((ticket, tttl)) = ticket {
                    let tttl = micros(*tttl);
                    let arrival = match set.tickets.get(ticket) {
                        Some((arrival, _)) => *arrival,
                        None => {
                            set.queue.insert((now, ticket.clone()));
                            now
                        }
                    };
                    set.tickets
                        .insert(ticket.clone(), (arrival, now.saturating_add(tttl)));
                    // As long as the longest-lived ticket (PEXPIRE only
                    // when it lengthens the keys' TTL).
                    set.queue_expires_at = set.queue_expires_at.max(now.saturating_add(tttl));
                    if set.queue.first().map(|(_, t)| t) != Some(ticket) {
                        return Ok(AcquireReply::Held { pttl: None });
                    }
                } else if !set.queue.is_empty() {
                    return Ok(AcquireReply::Held { pttl: None });
                }
            }
            let free = limit.saturating_sub(set.used);
            if free < weight {
                let pttl = set
                    .wait(weight - free, now)
                    .map(|us| std::time::Duration::from_millis(ceil_ms(us)));
                return Ok(AcquireReply::Held { pttl });
            }
        }
        let expiry = now.saturating_add(ttl);
        // The fence is filled in below, once it is drawn (as the script
        // writes the description last).
        let who = Who {
            fence: 0,
            since: now,
            holder: req.holder.clone(),
        };
        let previous = set.holders.insert(req.token.clone(), (weight, expiry, who));
        if previous.is_none() {
            set.used += weight;
        }
        set.expires_at = set.expires_at.max(expiry);
        if let Some((ticket, _)) = ticket {
            if let Some((arrival, _)) = set.tickets.remove(ticket) {
                set.queue.remove(&(arrival, ticket.clone()));
            }
        }
        let next_in_line = fair && !set.queue.is_empty() && set.used < limit;
        let fence = MemoryLocks::next_fence(state, req, now);
        if let Some((_, _, who)) = state
            .permits
            .get_mut(&req.keys.lock)
            .and_then(|set| set.holders.get_mut(&req.token))
        {
            who.fence = fence.get();
        }
        if next_in_line {
            self.notify(&req.keys.channel);
        }
        Ok(AcquireReply::Acquired { fence })
    }

    pub(crate) fn release_permits(&self, keys: &LockKeys, token: &str, now: u64) -> Result<bool> {
        shape(keys)?;
        let (removed, dequeued, replayed) = {
            let mut state = self.lock();
            let Some(set) = state.permits.get_mut(&keys.lock) else {
                return Ok(MemoryLocks::released_by(&state, keys, token, now));
            };
            set.expire(now);
            let removed = set.holders.remove(token).is_some_and(|(w, _, _)| {
                set.used -= w;
                true
            });
            let dequeued = match set.tickets.remove(token) {
                Some((arrival, _)) => set.queue.remove(&(arrival, token.to_owned())),
                None => false,
            };
            if set.is_empty() {
                state.permits.remove(&keys.lock);
            }
            // Idempotent per token, as `permit_release.lua`: a release
            // leaves a marker that a replay finds.
            let replayed = if removed {
                MemoryLocks::remember_release(&mut state, keys, token, now);
                false
            } else {
                MemoryLocks::released_by(&state, keys, token, now)
            };
            (removed, dequeued, replayed)
        };
        if removed || dequeued {
            self.notify(&keys.channel);
        }
        Ok(removed || replayed)
    }

    pub(crate) fn extend_permits(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl: std::time::Duration,
        now: u64,
    ) -> Result<bool> {
        shape(keys)?;
        let mut state = self.lock();
        let Some(set) = state.permits.get_mut(&keys.lock) else {
            return Ok(false);
        };
        set.expire(now);
        match set.holders.get_mut(token) {
            Some((_, exp, _)) => {
                *exp = now.saturating_add(micros(ttl));
                set.expires_at = set.expires_at.max(*exp);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub(crate) fn permits_in_use(&self, keys: &LockKeys, now: u64) -> Result<u32> {
        shape(keys)?;
        let mut state = self.lock();
        Ok(state.permits.get_mut(&keys.lock).map_or(0, |set| {
            set.expire(now);
            set.used
        }))
    }
}
