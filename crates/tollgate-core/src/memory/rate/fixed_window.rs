//! Fixed window aligned to the epoch. The Redis script is
//! `lua/fixed_window.lua`; this file is its twin for the memory store.

use super::{Outcome, Settle, Slot, Step};

/// One quota's step: `limit` per `period` µs.
pub(crate) fn step(slot: &mut Option<Slot>, req: Step, (limit, period): (u64, u64)) -> Outcome {
    let (w, count) = current(slot, req.now / period);
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

/// The window that counts at window `now_w` and its count: the stored one
/// if it is this window or the next (a clock ahead wrote it: it counts, as
/// the script reads it; one further ahead is another period's), else
/// `now_w`, empty.
fn current(slot: &Option<Slot>, now_w: u64) -> (u64, u64) {
    match slot {
        Some(Slot::Window { window, count, .. }) if *window == now_w || *window == now_w + 1 => {
            (*window, *count)
        }
        _ => (now_w, 0),
    }
}

/// The settle. Under the estimate: the window charged gets the difference
/// back (never below zero); once it has passed, nothing is owed, and the
/// TTL stays. Over it: the window current now counts the difference, never
/// above limit + debt; returns the new TTL.
pub(crate) fn settle(
    slot: &mut Option<Slot>,
    s: Settle,
    (limit, period): (u64, u64),
) -> Option<u64> {
    if s.give() > 0 {
        if let Some(Slot::Window { window, count, .. }) = slot {
            if *window == s.at / period {
                *count = count.saturating_sub(s.give());
            }
        }
        return None;
    }
    let (w, count) = current(slot, s.now / period);
    let most = limit.saturating_add(s.debt);
    *slot = Some(Slot::Window {
        window: w,
        previous: 0,
        count: count.saturating_add(s.owe()).min(count.max(most)),
    });
    Some((w + 1) * period - s.now)
}
