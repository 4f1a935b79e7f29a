//! What an instance remembers of revocations ([`Revocations`]: a reset or
//! block of one subject, or of every subject when a message may have been
//! missed) and of the slices that ended ([`Retired`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::keyspace::Subject;

/// Why slices are revoked, which says what becomes of the units they took
/// and of the debts settled over their charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::rate) enum Revocation {
    /// Their subject was reset: the store forgot what they took and owe.
    Reset,
    /// Their subject was blocked: the store still counts their units, so
    /// the unused ones go back and the debts are charged.
    Block,
    /// A message may have been missed (it may have been a reset): their
    /// debts are charged, their unused units are not given back.
    Unknown,
}

/// The most ended slices whose settled charges are remembered; past it,
/// the oldest is forgotten, and a settle replayed after it ended may be
/// applied again on the store.
pub(super) const RETIRED_SLICES: usize = 4096;

/// The served charges settled in slices that have ended, by slice, kept as
/// long as a settle of them could still apply on the store: a settle
/// replayed after its slice ended is refused, as the slice refused it.
#[derive(Default)]
pub(super) struct Retired {
    slices: Mutex<Ended>,
}

/// The ended slices' settled charges and until when each is kept, with
/// the slices in the order they ended (the oldest goes first when full).
#[derive(Default)]
struct Ended {
    by_slice: HashMap<u64, (HashSet<u64>, u64)>,
    order: VecDeque<u64>,
}

impl Retired {
    /// Keeps the charges `settled` in `slice`, which ended at `now`, until
    /// `until`.
    pub(super) fn keep(&self, slice: u64, settled: HashSet<u64>, now: u64, until: u64) {
        if settled.is_empty() {
            return;
        }
        let mut ended = lock(&self.slices);
        let Ended { by_slice, order } = &mut *ended;
        // Those kept long enough, then the oldest while there is no room.
        while let Some(&first) = order.front() {
            let expired = by_slice.get(&first).is_none_or(|(_, kept)| *kept <= now);
            if !expired && by_slice.len() < RETIRED_SLICES {
                break;
            }
            order.pop_front();
            by_slice.remove(&first);
        }
        by_slice.insert(slice, (settled, until));
        order.push_back(slice);
    }

    /// Whether `charge`, served from `slice`, was settled before its slice
    /// ended.
    pub(super) fn settled(&self, slice: u64, charge: u64, now: u64) -> bool {
        lock(&self.slices)
            .by_slice
            .get(&slice)
            .is_some_and(|(ids, kept)| *kept > now && ids.contains(&charge))
    }
}

/// The most subjects whose revocations are told apart; past it, the next
/// one counts as a revocation of every subject (admin actions are rare).
pub(super) const REVOKED_SUBJECTS: usize = 4096;

/// Revocations heard, per subject and of every subject: a reset or block
/// of one subject leaves the others' takes and give-backs alone.
#[derive(Default)]
pub(super) struct Revocations {
    all: AtomicU64,
    /// Per subject: its resets, then its blocks.
    subjects: Mutex<HashMap<String, (u64, u64)>>,
}

/// Where a take or a slice stands in the revocations of its subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Epoch {
    all: u64,
    resets: u64,
    blocks: u64,
}

impl Epoch {
    /// Whether a give-back sent at `now` is void: a reset of its subject
    /// since, or a possibly missed message (it may have been one). A block
    /// leaves the quota counted, so the unused units still go back.
    pub(super) fn voids_give_back(self, now: Epoch) -> bool {
        self.all != now.all || self.resets != now.resets
    }
}

impl Revocations {
    pub(super) fn epoch(&self, subject: &Subject) -> Epoch {
        let (resets, blocks) = lock(&self.subjects)
            .get(subject.as_encoded())
            .copied()
            .unwrap_or((0, 0));
        Epoch {
            all: self.all.load(Ordering::Acquire),
            resets,
            blocks,
        }
    }

    /// Counts a revocation of `subject` (of every subject for `None`).
    pub(super) fn revoke(&self, subject: Option<&Subject>, why: Revocation) {
        let Some(subject) = subject else {
            self.all.fetch_add(1, Ordering::AcqRel);
            return;
        };
        let mut map = lock(&self.subjects);
        if map.len() >= REVOKED_SUBJECTS && !map.contains_key(subject.as_encoded()) {
            map.clear();
            self.all.fetch_add(1, Ordering::AcqRel);
        }
        let counts = map.entry(subject.as_encoded().to_owned()).or_insert((0, 0));
        match why {
            Revocation::Block => counts.1 += 1,
            // A missed message about one subject reads as its reset.
            Revocation::Reset | Revocation::Unknown => counts.0 += 1,
        }
    }
}

/// Locks `m`, taking over a lock poisoned by a panic elsewhere (as the
/// rest of the crate does).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Full, the record forgets the slice that ended first, never the one
    /// that ends now.
    #[test]
    fn a_full_record_forgets_the_oldest_slice() {
        let retired = Retired::default();
        let n = RETIRED_SLICES as u64;
        for slice in 1..=n + 1 {
            retired.keep(slice, HashSet::from([slice * 10]), 5, 1_000);
        }
        assert!(!retired.settled(1, 10, 6), "the oldest is forgotten");
        assert!(retired.settled(2, 20, 6));
        assert!(
            retired.settled(n + 1, (n + 1) * 10, 6),
            "the newest is kept"
        );
        assert!(
            !retired.settled(n + 1, (n + 1) * 10, 1_000),
            "until its time"
        );
    }
}
