//! What each limiter decided, for the operator plane: how many checks it
//! admitted and refused (per second, fleet-wide) and who it refused most.
//! Each instance counts in memory (no Redis write per decision) and adds
//! its counts to the store once a second: the admitted and refused of that
//! second, and its top denials (a small Space-Saving sketch) to the
//! limiter's throttled list. The operator plane merges every instance's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::within;
use crate::keyspace::Subject;
use crate::store::{AdminBackend, DenialCount};

/// Subjects one instance tracks between flushes (the most denied ones,
/// approximately, as a Space-Saving sketch keeps them).
const TRACKED: usize = 64;
/// How often an instance adds its counts to the store's list.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long a list lives after its last addition.
const LIST_TTL: Duration = Duration::from_secs(2 * 600);
/// Each throttled list covers ten minutes; the operator plane reads the
/// current one and the one before (so a list forgets whom nobody refuses
/// any more, and a new subject is not crowded out by old counts).
pub(crate) const LIST_WINDOW_MS: u64 = 600_000;
/// Subjects a fleet-wide list keeps (the most denied).
const LIST_KEEP: usize = 200;

/// Seconds of traffic a limiter's counts are kept for.
const TRAFFIC_KEPT: Duration = Duration::from_secs(120);
/// The seconds the operator plane averages traffic over (whole seconds
/// before the current one, which is still being counted).
pub(crate) const TRAFFIC_WINDOW: u64 = 5;

/// The store key of a limiter's throttled list for the window holding
/// `at_ms` (its own slot).
pub(crate) fn list_key(prefix: &str, limiter: &str, at_ms: u64) -> String {
    format!(
        "{prefix}:throttled:{{{limiter}}}:{}",
        at_ms / LIST_WINDOW_MS
    )
}

/// The store key of a limiter's traffic counts (its own slot).
pub(crate) fn traffic_key(prefix: &str, limiter: &str) -> String {
    format!("{prefix}:traffic:{{{limiter}}}")
}

/// One limiter's decisions since the last flush.
#[derive(Default)]
pub(crate) struct Tally {
    counts: Mutex<HashMap<String, DenialCount, QuickHash>>,
    admitted: Striped,
    refused: AtomicU64,
    /// The wall clock (ms), as of the last flush tick: a denial's time to
    /// the second without a clock read per denial.
    clock_ms: AtomicU64,
}

/// A count written on one of several cache lines, chosen per thread, so
/// that admissions on many cores do not all write one line (every
/// admitted check counts here); read whole once a second.
#[derive(Default)]
struct Striped([Line; STRIPES]);

/// One cache line's count.
#[derive(Default)]
#[repr(align(64))]
struct Line(AtomicU64);

const STRIPES: usize = 8;

impl Striped {
    fn add_one(&self) {
        thread_local! {
            /// This thread's line: threads take them in turn.
            static LINE: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES
            };
        }
        let line = LINE.try_with(|l| *l).unwrap_or(0);
        self.0[line].0.fetch_add(1, Ordering::Relaxed);
    }

    /// The count since the last take.
    fn take(&self) -> u64 {
        self.0.iter().map(|l| l.0.swap(0, Ordering::Relaxed)).sum()
    }
}

/// The sketch's hasher: a quick word hash. It holds at most [`TRACKED`]
/// subjects, so colliding input cannot make it slow (no SipHash needed).
#[derive(Default, Clone, Copy)]
struct QuickHash;

impl std::hash::BuildHasher for QuickHash {
    type Hasher = QuickHasher;

    fn build_hasher(&self) -> QuickHasher {
        QuickHasher(0)
    }
}

struct QuickHasher(u64);

impl std::hash::Hasher for QuickHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = crate::keyspace::quick_hash(self.0, bytes);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Tally {
    /// Counts one admission.
    pub(crate) fn admitted(&self) {
        self.admitted.add_one();
    }

    /// Counts one denial of `subject`. When the sketch is full, a new
    /// subject takes the place of the least denied one and inherits its
    /// count (Space-Saving): a subject denied often is never lost.
    pub(crate) fn denied(&self, subject: &Subject) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let at = match self.clock_ms.load(Ordering::Relaxed) {
            0 => now_ms(),
            ms => ms,
        };
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = counts.get_mut(subject.as_encoded()) {
            c.denied += 1;
            c.last_denied_ms = at;
            return;
        }
        let mut inherited = 0;
        if counts.len() >= TRACKED {
            if let Some(least) = counts
                .values()
                .min_by_key(|c| c.denied)
                .map(|c| c.subject.clone())
            {
                inherited = counts.remove(&least).map_or(0, |c| c.denied);
            }
        }
        counts.insert(
            subject.as_encoded().to_owned(),
            DenialCount {
                subject: subject.as_encoded().to_owned(),
                denied: inherited + 1,
                last_denied_ms: at,
                label: subject.label().map(str::to_owned),
            },
        );
    }

    fn take(&self) -> Vec<DenialCount> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.drain().map(|(_, c)| c).collect()
    }

    /// Flushes every [`FLUSH_EVERY`] into the limiter's keys under
    /// `prefix` while the limiter lives, from a task on the current runtime
    /// (a limiter built without one reports no tally).
    pub(crate) fn start(
        self: &Arc<Self>,
        store: Arc<dyn AdminBackend>,
        prefix: &str,
        limiter: &str,
    ) {
        let (prefix, limiter) = (prefix.to_owned(), limiter.to_owned());
        let traffic = traffic_key(&prefix, &limiter);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me: Weak<Tally> = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                me.clock_ms.store(now_ms(), Ordering::Relaxed);
                let counts = me.take();
                let admitted = me.admitted.take();
                let refused = me.refused.swap(0, Ordering::Relaxed);
                drop(me);
                if admitted + refused > 0 {
                    let second = now_ms() / 1000;
                    let add = store.add_traffic(&traffic, second, admitted, refused, TRAFFIC_KEPT);
                    // Bounded: a store that stopped answering holds no task
                    // (nor the store) past the next flush.
                    if let Err(e) = within(FLUSH_EVERY, add).await {
                        tracing::debug!(error = %e, "could not add to the traffic counts");
                    }
                }
                if counts.is_empty() {
                    continue;
                }
                let key = list_key(&prefix, &limiter, now_ms());
                let add = store.add_denials(&key, &counts, LIST_TTL, LIST_KEEP);
                if let Err(e) = within(FLUSH_EVERY, add).await {
                    // Lost with the outage: the list shows what came before.
                    tracing::debug!(error = %e, "could not add to the throttled list");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admissions counted on many threads (on their own lines) add up, and
    /// a take starts the count again.
    #[test]
    fn admissions_on_many_threads_add_up() {
        let tally = Tally::default();
        std::thread::scope(|s| {
            for _ in 0..(2 * STRIPES + 3) {
                s.spawn(|| (0..1000).for_each(|_| tally.admitted()));
            }
        });
        assert_eq!(tally.admitted.take(), (2 * STRIPES as u64 + 3) * 1000);
        assert_eq!(tally.admitted.take(), 0);
    }
}
