//! Sliding window log: one entry per admitted unit, exact. The Redis script is
//! `lua/sliding_window_log.lua`; this file is its twin for the memory store.

use std::collections::VecDeque;

use super::{Outcome, Settle, Slot, Step};

/// One quota's step: `limit` per `period` µs.
pub(crate) fn step(slot: &mut Option<Slot>, req: Step, (limit, period): (u64, u64)) -> Outcome {
    if !matches!(slot, Some(Slot::Log(_))) {
        *slot = Some(Slot::Log(VecDeque::new()));
    }
    let Some(Slot::Log(log)) = slot else {
        unreachable!("just set")
    };
    // Entries at or before now - period have left the window (kept sorted).
    let cutoff = i128::from(req.now) - i128::from(period);
    let gone = log.partition_point(|&t| i128::from(t) <= cutoff);
    log.drain(..gone);
    let count = log.len() as u64;
    let fits = count + req.cost <= limit;
    if req.commit && fits {
        // The oldest entry before logging, as the script reads it (an entry
        // logged by a clock ahead stays the oldest); this check's own when
        // the log was empty.
        let next = match (count, req.cost) {
            (0, 0) => 0,
            (0, _) => period,
            _ => oldest_leaves(log, period, req.now),
        };
        let at = log.partition_point(|&t| t <= req.now);
        for _ in 0..req.cost {
            log.insert(at, req.now);
        }
        return Outcome::allowed(limit - count - req.cost, period, period, next);
    }
    let reset = log
        .back()
        .map_or(0, |&t| (t + period).saturating_sub(req.now));
    let retry = if fits {
        0
    } else {
        // The entry whose expiry frees enough room for this cost.
        (log[(count + req.cost - limit - 1) as usize] + period).saturating_sub(req.now)
    };
    Outcome::current(
        limit.saturating_sub(count),
        reset,
        retry,
        oldest_leaves(log, period, req.now),
    )
}

/// Until the oldest entry leaves the window (more room is made available
/// then); 0 for an empty log.
fn oldest_leaves(log: &VecDeque<u64>, period: u64, now: u64) -> u64 {
    log.front().map_or(0, |&t| (t + period).saturating_sub(now))
}

/// The settle. Under the estimate: the charge's last entries leave the
/// log. The script removes them by the charge's id; here entries carry only
/// their time, and the charge's are those logged at its instant — any of
/// them is the same entry; the TTL stays. Over it: the log drops what left
/// the window and gains the difference's entries at now, never more than
/// limit + debt live ones; returns the new TTL when it gained any.
pub(crate) fn settle(
    slot: &mut Option<Slot>,
    s: Settle,
    (limit, period): (u64, u64),
) -> Option<u64> {
    if s.give() > 0 {
        if let Some(Slot::Log(log)) = slot {
            let from = log.partition_point(|&t| t < s.at);
            let to = log.partition_point(|&t| t <= s.at);
            let gone = (to - from).min(usize::try_from(s.give()).unwrap_or(usize::MAX));
            log.drain(from..from + gone);
            if log.is_empty() {
                *slot = None;
            }
        }
        return None;
    }
    let mut log = match slot.take() {
        Some(Slot::Log(log)) => log,
        _ => VecDeque::new(),
    };
    // As the step's trim: entries at or before now - period have left.
    let cutoff = i128::from(s.now) - i128::from(period);
    let gone = log.partition_point(|&t| i128::from(t) <= cutoff);
    log.drain(..gone);
    let room = limit
        .saturating_add(s.debt)
        .saturating_sub(log.len() as u64);
    let added = s.owe().min(room);
    let at = log.partition_point(|&t| t <= s.now);
    for _ in 0..added {
        log.insert(at, s.now);
    }
    if !log.is_empty() {
        *slot = Some(Slot::Log(log));
    }
    (added > 0).then_some(period)
}
