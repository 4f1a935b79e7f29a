//! The state of the memory store's locks, permits and idempotency records,
//! behind one mutex: what the twins of the lock, permit and record scripts
//! read and write.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast;

use crate::store::StoredResponse;

/// How many release notifications a slow subscriber may fall behind before
/// it is told to resync.
const EVENT_CAPACITY: usize = 1024;

/// Locks held in memory.
pub(crate) struct MemoryLocks {
    state: Mutex<State>,
    pub(crate) events: broadcast::Sender<String>,
}

#[derive(Default)]
pub(crate) struct State {
    /// Lock key → holder.
    pub(crate) held: HashMap<String, Holder>,
    /// Fence key → last fence and its expiry.
    pub(crate) fences: HashMap<String, Fence>,
    /// Semaphore (and fair lock) key → its holders and queue.
    pub(crate) permits: HashMap<String, PermitSet>,
    /// Idempotency record key → the record.
    pub(crate) records: HashMap<String, Record>,
    /// Release marker key ([`LockKeys::release_marker`]) → its expiry (µs):
    /// the tokens that released a lock or permits lately.
    pub(crate) released: HashMap<String, u64>,
    ops: u64,
    next_sweep: u64,
}

pub(crate) struct Holder {
    pub(crate) token: String,
    /// Expiry on the backend clock, µs.
    pub(crate) expires_at: u64,
    /// Who holds it (what the lock's value carries after the token on
    /// Redis); `None` for an idempotency record's lease, as there.
    pub(crate) who: Option<Who>,
}

/// A holder's description: its fence, since when (µs, the backend's
/// clock) and `host:pid` — the description key of `permit_acquire.lua`, or
/// what follows the token in a lock's value.
#[derive(Clone)]
pub(crate) struct Who {
    pub(crate) fence: u64,
    pub(crate) since: u64,
    pub(crate) holder: String,
}

pub(crate) struct Fence {
    pub(crate) value: u64,
    pub(crate) expires_at: u64,
}

impl Default for MemoryLocks {
    fn default() -> Self {
        MemoryLocks {
            state: Mutex::new(State::default()),
            events: broadcast::channel(EVENT_CAPACITY).0,
        }
    }
}

impl fmt::Debug for MemoryLocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("MemoryLocks")
            .field("held", &s.held.len())
            .field("fences", &s.fences.len())
            .field("released", &s.released.len())
            .finish()
    }
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

impl MemoryLocks {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // Entries are replaced whole, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live holder of `key` at `now`, dropping an expired one.
    pub(crate) fn live<'a>(state: &'a mut State, key: &str, now: u64) -> Option<&'a mut Holder> {
        if state.held.get(key).is_some_and(|h| h.expires_at <= now) {
            state.held.remove(key);
        }
        state.held.get_mut(key)
    }

    pub(crate) fn sweep(state: &mut State, now: u64) {
        state.ops += 1;
        if state.ops >= state.next_sweep {
            state.held.retain(|_, h| h.expires_at > now);
            state.fences.retain(|_, f| f.expires_at > now);
            Self::sweep_permits(state, now);
            state.records.retain(|_, r| r.expires_at > now);
            state.released.retain(|_, expires_at| *expires_at > now);
            let live = state.held.len()
                + state.fences.len()
                + state.permits.len()
                + state.records.len()
                + state.released.len();
            state.next_sweep = state.ops + (live as u64).max(1024);
        }
    }

    /// Sweeps permit names with nothing live left.
    pub(crate) fn sweep_permits(state: &mut State, now: u64) {
        state.permits.retain(|_, set| {
            set.expire(now);
            set.expire_tickets(now);
            !set.is_empty()
        });
    }
}

/// One permit name: its holders and, when fair, its queue. Mirrors the
/// sorted sets of the scripts (a holder of weight k is k members there).
#[derive(Default)]
pub(crate) struct PermitSet {
    /// Owner token → (weight, expiry µs, who).
    pub(crate) holders: HashMap<String, (u32, u64, Who)>,
    /// Permits held (the sum of the weights).
    pub(crate) used: u32,
    /// The holders key's TTL (µs): the longest any holder was given.
    pub(crate) expires_at: u64,
    /// (arrival µs, ticket): ZRANGE's order, ties by the ticket's bytes.
    pub(crate) queue: BTreeSet<(u64, String)>,
    /// Ticket → (arrival µs, expiry µs).
    pub(crate) tickets: HashMap<String, (u64, u64)>,
    /// The queue keys' TTL (µs).
    pub(crate) queue_expires_at: u64,
}

impl PermitSet {
    /// Drops expired holders (ZREMRANGEBYSCORE … now), and the whole set
    /// once its key's TTL has passed.
    pub(crate) fn expire(&mut self, now: u64) {
        if self.expires_at <= now {
            self.holders.clear();
        }
        if self.queue_expires_at <= now {
            self.queue.clear();
            self.tickets.clear();
        }
        self.holders.retain(|_, (_, exp, _)| *exp > now);
        self.used = self.holders.values().map(|(w, _, _)| *w).sum();
    }

    /// Drops tickets whose expiry passed.
    pub(crate) fn expire_tickets(&mut self, now: u64) {
        let queue = &mut self.queue;
        self.tickets.retain(|t, (arrival, exp)| {
            let live = *exp > now;
            if !live {
                queue.remove(&(*arrival, t.clone()));
            }
            live
        });
    }

    /// µs until `need` more permits are free: the need-th earliest expiry
    /// counting each holder `weight` times; `None` when there is none.
    pub(crate) fn wait(&self, need: u32, now: u64) -> Option<u64> {
        let mut expiries: Vec<(u64, u32)> =
            self.holders.values().map(|(w, e, _)| (*e, *w)).collect();
        expiries.sort_unstable();
        let mut seen = 0;
        for (exp, w) in expiries {
            seen += w;
            if seen >= need {
                return Some(exp - now);
            }
        }
        None
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }
}

/// One record: in flight (no response yet) or completed.
pub(crate) struct Record {
    pub(crate) fingerprint: String,
    pub(crate) fence: u64,
    /// When it was claimed (µs, the backend's clock), for the operator.
    pub(crate) claimed_at: u64,
    pub(crate) done: Option<StoredResponse>,
    pub(crate) expires_at: u64,
}
