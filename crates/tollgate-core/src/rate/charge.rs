//! [`Charge`]: the receipt of an admitted check, which a settle or a refund
//! corrects (at most once per charge), and how a check gets one.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use super::Decision;
use crate::clock::monotonic_micros;
use crate::store::{Algorithm, RateReply, RateRequest};

/// What one admitted check took: the receipt [`RateLimiter::refund`](super::RateLimiter::refund) gives
/// back against. Found in [`Decision::charge`](super::Decision::charge).
///
/// A refund needs more than a cost: a window gives back to the window that
/// was charged (so the instant of the check), a log removes the check's own
/// entries (so its id), and a refund retried after a lost reply must not be
/// applied twice (so, again, its id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub(crate) cost: u64,
    /// The instant the backend decided at (µs, the backend's clock): a
    /// reservation's slot.
    pub(crate) at_micros: u64,
    /// When the units were taken: `at_micros` less a reservation's wait.
    pub(crate) taken_micros: u64,
    /// Unique per check: the log's member prefix and the refund's marker.
    pub(crate) id: u64,
    /// How long after `at_micros` a refund can still give back (µs).
    pub(crate) span_micros: u64,
    /// Taken by the outage fallback's local limiter, not the backend.
    pub(crate) local: bool,
    /// The digest of the key it was taken under ([`key_digest`]): a charge
    /// refunds only its own subject on its own limiter.
    pub(crate) key: u64,
    /// The quota lease slice it was served from (0: none), whose units a
    /// settle or refund corrects while the slice lives.
    pub(crate) slice: u64,
}

impl Charge {
    /// The units taken.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The check's id: a refund is applied at most once per id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The instant the check was decided at (µs since the epoch, on the
    /// backend's clock).
    pub fn at_micros(&self) -> u64 {
        self.at_micros
    }

    /// The same charge, for `cost` of its units at most: a partial refund
    /// (never more than was taken).
    pub fn part(mut self, cost: u64) -> Charge {
        self.cost = self.cost.min(cost);
        self
    }
}

/// A digest of a check's first key (its limiter and subject): cheap on
/// every admission; it tells apart keys, not adversaries.
pub(crate) fn key_digest(key: &str) -> u64 {
    crate::keyspace::quick_hash(0, key.as_bytes())
}

/// A fresh id for a check: a random base per process (so processes sharing a
/// backend do not collide) plus a counter (so one process never repeats, and
/// no syscall per check). Each thread takes its counts in blocks, so checks
/// on many cores do not all write one shared counter.
pub(crate) fn next_id() -> u64 {
    static BASE: LazyLock<u64> = LazyLock::new(|| {
        let mut b = [0u8; 8];
        // The OS CSPRNG; if it ever fails, a time-derived base (a collision
        // needs the same subject and counter in two processes).
        match getrandom::fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => monotonic_micros() ^ 0x9E37_79B9_7F4A_7C15,
        }
    });
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        /// This thread's next count and the end of its block.
        static BLOCK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    }
    // A thread being torn down takes one count at a time.
    let count = BLOCK
        .try_with(|b| {
            let (mut next, mut end) = b.get();
            if next == end {
                next = NEXT.fetch_add(ID_BLOCK, Ordering::Relaxed);
                end = next + ID_BLOCK;
            }
            b.set((next + 1, end));
            next
        })
        .unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed));
    BASE.wrapping_add(count)
}

/// How many ids a thread takes at once.
const ID_BLOCK: u64 = 1024;

/// The charge an admission took (none for a denial). A cost of 0 has one
/// too, of 0 units: a settle can still charge what the work turned out to
/// cost (an estimate of 0 is not a free pass); its refund is a no-op.
pub(super) fn charge_of(
    algorithm: Algorithm,
    request: &RateRequest,
    reply: &RateReply,
    d: &Decision,
) -> Option<Charge> {
    reply.allowed.then(|| Charge {
        cost: request.cost,
        at_micros: reply.now_micros,
        taken_micros: reply.now_micros,
        id: request.nonce,
        span_micros: algorithm.refund_span(d),
        local: false,
        key: key_digest(&request.keys[0]),
        slice: 0,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Ids taken on many threads at once, across their blocks, never repeat.
    #[test]
    fn ids_never_repeat_across_threads() {
        let per_thread = 3 * ID_BLOCK as usize + 7;
        let taken: Vec<Vec<u64>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..per_thread).map(|_| next_id()).collect()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let all: HashSet<u64> = taken.iter().flatten().copied().collect();
        assert_eq!(all.len(), 4 * per_thread);
    }
}
