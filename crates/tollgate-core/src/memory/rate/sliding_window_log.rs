//! Sliding window log: one entry per admitted unit, exact. The Redis script is
//! `lua/sliding_window_log.lua`; this file is its twin for the memory store.

use std::collections::VecDeque;

use super::{Outcome, Refund, Slot, Step};

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
        let at = log.partition_point(|&t| t <= req.now);
        for _ in 0..req.cost {
            log.insert(at, req.now);
        }
        let next = oldest_leaves(log, period, req.now);
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

/// The refund: the charge's entries leave the log. The script removes them
/// by the charge's id; here entries carry only their time, and the charge's
/// are those logged at its instant — any of them is the same entry.
pub(crate) fn refund(slot: &mut Option<Slot>, r: Refund, _: (u64, u64)) -> Option<u64> {
    if let Some(Slot::Log(log)) = slot {
        let from = log.partition_point(|&t| t < r.at);
        let to = log.partition_point(|&t| t <= r.at);
        let gone = (to - from).min(r.cost as usize);
        log.drain(from..from + gone);
        if log.is_empty() {
            *slot = None;
        }
    }
    None
}
