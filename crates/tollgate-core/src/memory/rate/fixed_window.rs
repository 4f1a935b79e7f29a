//! Fixed window aligned to the epoch. The Redis script is
//! `lua/fixed_window.lua`; this file is its twin for the memory store.

use super::{Outcome, Refund, Slot, Step};

/// One quota's step: `limit` per `period` µs.
pub(crate) fn step(slot: &mut Option<Slot>, req: Step, (limit, period): (u64, u64)) -> Outcome {
    let w = req.now / period;
    let count = match slot {
        Some(Slot::Window { window, count, .. }) if *window == w => *count,
        _ => 0,
    };
    let reset = (w + 1) * period - req.now;
    let fits = count + req.cost <= limit;
    if req.commit && fits {
        *slot = Some(Slot::Window {
            window: w,
            previous: 0,
            count: count + req.cost,
        });
        return Outcome::allowed(limit - count - req.cost, reset, reset, reset);
    }
    Outcome::current(
        limit.saturating_sub(count),
        reset,
        if fits { 0 } else { reset },
        reset,
    )
}

/// The refund: the window charged gets the cost back (never below zero);
/// once it has passed, nothing is owed. The TTL stays.
pub(crate) fn refund(slot: &mut Option<Slot>, r: Refund, (_, period): (u64, u64)) -> Option<u64> {
    if let Some(Slot::Window { window, count, .. }) = slot {
        if *window == r.at / period {
            *count = count.saturating_sub(r.cost);
        }
    }
    None
}
