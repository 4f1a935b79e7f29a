//! The Rust twins of the rate-limit scripts: each algorithm's step and
//! settle over a key's [`Slot`], figure for figure what `lua/<name>.lua`
//! and `lua/<name>_settle.lua` do on Redis, and the exact arithmetic they
//! share.

use std::collections::VecDeque;

use super::{fixed_window, gcra, sliding_window_counter, sliding_window_log, token_bucket};
use crate::quota::{Interval, Quota};
use crate::store::{Algorithm, Outcome};

/// The twins of an algorithm's scripts.
pub(crate) trait Twin {
    /// Whether one committing [`step`](Twin::step) decides exactly as a
    /// peek followed, when the peek admits, by a committing step: true of
    /// the algorithms whose step commits exactly when its peek would report
    /// no wait (`retry_after` 0 ⟺ the cost fits), and otherwise reports
    /// the peek's figures. A single-quota check then steps once.
    /// The sliding windows keep the peek.
    fn commit_decides(&self) -> bool;

    /// The twin of the script, for one quota.
    fn step(
        &self,
        slot: &mut Option<Slot>,
        now: u64,
        cost: u64,
        q: &Quota,
        commit: bool,
    ) -> Outcome;

    /// [`step`](Twin::step) with the quota's [`params`](Algorithm::params)
    /// already made: a check that steps one quota twice (a peek, then the
    /// commit) reduces its interval once.
    fn step_with(&self, slot: &mut Option<Slot>, req: Step, params: (u64, Interval)) -> Outcome;

    /// The twin of the settle script's part for one quota (before its
    /// cost-0 check): the new TTL (µs) when the state was rewritten with
    /// one, `None` to keep it (or when the slot was emptied).
    fn settle(&self, slot: &mut Option<Slot>, s: Settle, q: &Quota) -> Option<u64>;
}

impl Twin for Algorithm {
    fn commit_decides(&self) -> bool {
        matches!(
            self,
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::FixedWindow
        )
    }

    fn step(
        &self,
        slot: &mut Option<Slot>,
        now: u64,
        cost: u64,
        q: &Quota,
        commit: bool,
    ) -> Outcome {
        let req = Step {
            now,
            cost,
            commit,
            wait: 0,
        };
        self.step_with(slot, req, self.params(q))
    }

    fn step_with(&self, slot: &mut Option<Slot>, req: Step, (a, b): (u64, Interval)) -> Outcome {
        // The windows' periods are whole µs (`per_micro` is 1).
        match self {
            Algorithm::FixedWindow => fixed_window::step(slot, req, (a, b.ticks)),
            Algorithm::SlidingWindowLog => sliding_window_log::step(slot, req, (a, b.ticks)),
            Algorithm::SlidingWindowCounter => {
                sliding_window_counter::step(slot, req, (a, b.ticks))
            }
            Algorithm::TokenBucket => token_bucket::step(slot, req, (a, b)),
            Algorithm::Gcra => gcra::step(slot, req, (a, b)),
        }
    }

    fn settle(&self, slot: &mut Option<Slot>, s: Settle, q: &Quota) -> Option<u64> {
        let (a, b) = self.params(q);
        match self {
            Algorithm::FixedWindow => fixed_window::settle(slot, s, (a, b.ticks)),
            Algorithm::SlidingWindowLog => sliding_window_log::settle(slot, s, (a, b.ticks)),
            Algorithm::SlidingWindowCounter => {
                sliding_window_counter::settle(slot, s, (a, b.ticks))
            }
            Algorithm::TokenBucket => token_bucket::settle(slot, s, (a, b)),
            Algorithm::Gcra => gcra::settle(slot, s, (a, b)),
        }
    }
}

/// A settle as an algorithm's twin sees it: the charge of `cost` units
/// taken at `at`, corrected to `actual` at `now`, with at most `debt`
/// units of debt for this quota.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settle {
    pub(crate) now: u64,
    pub(crate) at: u64,
    pub(crate) cost: u64,
    pub(crate) actual: u64,
    pub(crate) debt: u64,
    /// How long after `at` this quota's give-back may still give (µs):
    /// when the charge would have refilled (a bucket).
    pub(crate) span: u64,
}

/// The furthest ahead of now a debt may move a bucket's instant, in units
/// of 1/`per` µs: 2^40 µs (about 12 days), and at most 2^51 units, so that
/// the instant is read back (none is read 2^52 units or more from now), as
/// `settle_prelude.lua`'s `most_ahead`.
pub(crate) fn most_ahead(per: u64) -> i128 {
    ((1i128 << 40) * i128::from(per)).min(1 << 51)
}

impl Settle {
    /// Units to give back (under the estimate).
    pub(crate) fn give(&self) -> u64 {
        self.cost.saturating_sub(self.actual)
    }

    /// A bucket's give-back in units of `1/per` µs of its instant: at most
    /// what the schedule still holds of the charge — the part time has
    /// refilled already was used (`still_held` in `lua/settle_prelude.lua`).
    pub(crate) fn give_held(&self, interval: i128, per: u64) -> i128 {
        let left = i128::from(self.at) + i128::from(self.span) - i128::from(self.now);
        if left <= 0 {
            return 0;
        }
        (i128::from(self.give()) * interval).min(left * i128::from(per))
    }

    /// Units owed (over the estimate).
    pub(crate) fn owe(&self) -> u64 {
        self.actual.saturating_sub(self.cost)
    }
}

/// An instant as the buckets store it, exactly: whole microseconds (`floor`,
/// signed: a fresh bucket's empty instant may precede the epoch under a fake
/// clock) plus `frac` units of `1/per_micro` µs, `0 ≤ frac < per_micro`.
/// Kept relative to now in those units (`rel`), the scripts' arithmetic
/// stays far below 2^53; only whole microseconds are ever absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Instant {
    pub(crate) micros: i64,
    pub(crate) frac: u64,
}

impl Instant {
    /// `rel` units of `1/per` µs after `now` (negative: before).
    pub(crate) fn at(now: u64, rel: i128, per: u64) -> Instant {
        let per = i128::from(per);
        Instant {
            micros: (i128::from(now) + div_euclid(rel, per)) as i64,
            frac: rem_euclid(rel, per) as u64,
        }
    }

    /// How far after `now` this instant lies, in units of `1/per` µs.
    pub(crate) fn rel(self, now: u64, per: u64) -> i128 {
        (i128::from(self.micros) - i128::from(now)) * i128::from(per) + i128::from(self.frac)
    }
}

/// `units` of `1/per` µs in whole microseconds, rounded up (never early):
/// every figure a bucket reports.
pub(crate) fn ceil_micros(units: i128, per: u64) -> u64 {
    let per = i128::from(per);
    // Floor division plus one unless exact: ceil for negatives too.
    let q = div_euclid(units, per) + i128::from(rem_euclid(units, per) != 0);
    q.max(0) as u64
}

/// `a.div_euclid(b)`, in 64 bits when both fit (the usual case): the same
/// quotient, without the 128-bit division routine, which dominated a memory
/// check's arithmetic (issue #15). Panics as `i128::div_euclid` does.
#[inline]
pub(crate) fn div_euclid(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        // A whole-µs interval (`per_micro` 1, the usual case): a hardware
        // division costs more than the rest of the step.
        (_, Ok(1)) => a,
        // i64::MIN / -1 overflows in 64 bits (not in 128): left to i128.
        (Ok(a), Ok(b)) if b != -1 => i128::from(a.div_euclid(b)),
        _ => a.div_euclid(b),
    }
}

/// `a.rem_euclid(b)`, in 64 bits when both fit (see [`div_euclid`]).
#[inline]
pub(crate) fn rem_euclid(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (_, Ok(1)) => 0,
        (Ok(a), Ok(b)) if b != -1 => i128::from(a.rem_euclid(b)),
        _ => a.rem_euclid(b),
    }
}

/// Units until one more unit is available, `room` units of room (negative:
/// a debt) into a quota of `interval` units per unit: room must reach the
/// next whole interval, and at least one (`unit_after` of the scripts).
#[inline]
pub(crate) fn unit_after(room: i128, interval: i128) -> i128 {
    if room < 0 {
        interval - room
    } else {
        interval - rem_euclid(room, interval)
    }
}

/// One request as an algorithm's in-memory step sees it: `cost` units at
/// `now` (µs). With `commit`, an admitted cost is taken (written to the
/// slot); without, the step only reports the figures as they stand. The
/// quota's side is the pair of [`Algorithm::params`], named by each step
/// after its own script. `wait` (µs, 0 for none): how long a committing step
/// of a bucket may reserve ahead ([`RateRequest::max_wait_micros`]).
///
/// [`RateRequest::max_wait_micros`]: crate::store::RateRequest::max_wait_micros
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub(crate) now: u64,
    pub(crate) cost: u64,
    pub(crate) commit: bool,
    pub(crate) wait: u64,
}

/// A bucket's admission at its slot `wait` µs ahead, as the scripts reply
/// it: the figures as of the slot, the wait as the retry-after, and the
/// state living until the slot plus its own TTL.
pub(crate) fn reserved(mut o: Outcome, wait: u64) -> Outcome {
    o.retry_after_micros = wait;
    o.ttl_micros += wait;
    o
}

/// State of one key in the memory backend.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    /// A settle's marker, or a placeholder while an entry is stepped.
    Marker,
    /// GCRA's TAT or the token bucket's empty instant.
    At(Instant),
    /// Fixed window (previous unused) or sliding counter.
    Window {
        window: u64,
        previous: u64,
        count: u64,
    },
    /// Sliding log, sorted.
    Log(VecDeque<u64>),
    /// A subject's reset stamp: when it was reset (µs, the settles' clock).
    Reset(u64),
}
