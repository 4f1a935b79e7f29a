//! Sliding window counter: the previous fixed window's count, weighted by how
//! much of it still overlaps the sliding window, plus the current count. The
//! Redis script is `lua/sliding_window_counter.lua`; this file is its twin.

use super::{Outcome, Settle, Slot, Step};

/// One quota's step: `limit` per `period` µs.
pub(crate) fn step(slot: &mut Option<Slot>, req: Step, (limit, period): (u64, u64)) -> Outcome {
    let (mut w, mut e, mut lead) = (req.now / period, req.now % period, 0);
    let (prev, cur) = match slot {
        Some(Slot::Window {
            window,
            previous,
            count,
        }) => {
            if *window == w {
                (*previous, *count)
            } else if *window + 1 == w {
                (*count, 0)
            } else if *window == w + 1 {
                // A clock ahead moved on to the next window: decided as at
                // its start, its times `lead` later (as the script).
                lead = (w + 1) * period - req.now;
                (w, e) = (w + 1, 0);
                (*previous, *count)
            } else {
                (0, 0)
            }
        }
        _ => (0, 0),
    };
    let later = |t: u64| if t > 0 { t + lead } else { 0 };
    let est = cur + (prev as u128 * (period - e) as u128).div_ceil(period as u128) as u64;
    let fits = est + req.cost <= limit;
    if req.commit && fits {
        *slot = Some(Slot::Window {
            window: w,
            previous: prev,
            count: cur + req.cost,
        });
        let next = later(next_unit(prev, cur + req.cost, e, period));
        let reset = 2 * period - e + lead;
        return Outcome::allowed(limit - est - req.cost, reset, reset, next);
    }
    let retry = if fits {
        0
    } else if cur + req.cost <= limit {
        // Later in this window, once the previous window's weight has dropped.
        period - ((limit - cur - req.cost) as u128 * period as u128 / prev as u128) as u64 - e
    } else {
        // In the next window, once this window's weight has dropped.
        period - e + period - ((limit - req.cost) as u128 * period as u128 / cur as u128) as u64
    };
    let reset = if cur > 0 {
        2 * period - e
    } else if prev > 0 {
        period - e
    } else {
        0
    };
    Outcome::current(
        limit.saturating_sub(est),
        later(reset),
        later(retry),
        later(next_unit(prev, cur, e, period)),
    )
}

/// Until the estimate drops by one unit, `e` µs into a window of `period`:
/// while the previous window weighs, when its rounded-up weight k falls to
/// k - 1; else, in the next window, when this window's weight first drops.
fn next_unit(prev: u64, cur: u64, e: u64, period: u64) -> u64 {
    let (prev, cur, e, p) = (prev as u128, cur as u128, e as u128, period as u128);
    let t = if prev > 0 {
        let k = (prev * (p - e)).div_ceil(p);
        p - (k - 1) * p / prev - e
    } else if let Some(drop) = ((cur.saturating_sub(1)) * p).checked_div(cur) {
        p - e + p - drop
    } else {
        0
    };
    t as u64
}

/// The settle. Under the estimate: the window charged gets the difference
/// back, as the current window or as the previous one (still weighed);
/// never below zero; two windows on, nothing is owed; the TTL stays. Over
/// it: the windows rotate as the step rotates them, and the current one
/// counts the difference, never above limit + debt; returns the new TTL.
pub(crate) fn settle(
    slot: &mut Option<Slot>,
    s: Settle,
    (limit, period): (u64, u64),
) -> Option<u64> {
    if s.give() > 0 {
        if let Some(Slot::Window {
            window,
            previous,
            count,
        }) = slot
        {
            let charged = s.at / period;
            if *window == charged {
                *count = count.saturating_sub(s.give());
            } else if *window == charged + 1 {
                *previous = previous.saturating_sub(s.give());
            }
        }
        return None;
    }
    let now_w = s.now / period;
    let (w, prev, cur) = match slot {
        // As stored (one ahead: a clock ahead moved on, as the step reads it).
        Some(Slot::Window {
            window,
            previous,
            count,
        }) if *window == now_w || *window == now_w + 1 => (*window, *previous, *count),
        Some(Slot::Window { window, count, .. }) if *window + 1 == now_w => (now_w, *count, 0),
        _ => (now_w, 0, 0),
    };
    let most = limit.saturating_add(s.debt);
    *slot = Some(Slot::Window {
        window: w,
        previous: prev,
        count: cur.saturating_add(s.owe()).min(cur.max(most)),
    });
    Some((w + 2) * period - s.now)
}
