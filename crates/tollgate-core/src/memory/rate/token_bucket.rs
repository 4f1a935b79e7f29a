//! Token bucket kept in one instant: when the bucket was last empty.
//! The Redis script is `lua/token_bucket.lua`; this file is its twin for the
//! memory backend, figure for figure.
//!
//! Time is counted relative to now in units of `1/per_micro` µs, where the
//! refill interval `period / limit` is a whole number of units
//! ([`Interval`]): no rate is rounded. The empty instant is at or before now
//! (≤ 0) while it counts.

use super::{
    ceil_micros, div_euclid, most_ahead, reserved, unit_after, Instant, Outcome, Settle, Slot, Step,
};
use crate::quota::Interval;

/// One quota's step. `capacity` tokens, one token every exact interval.
/// With `req.commit`, admitted tokens are taken; tokens that come only
/// within `req.wait` are taken for their slot, as the step then would.
pub(crate) fn step(slot: &mut Option<Slot>, req: Step, (capacity, iv): (u64, Interval)) -> Outcome {
    let (interval, per) = (i128::from(iv.ticks), iv.per_micro);
    let full = i128::from(capacity) * interval;
    let empty = match slot {
        Some(Slot::At(t)) => t.rel(req.now, per).max(-full),
        _ => -full,
    };
    // Negative when the empty instant lies ahead (the clock stepped back):
    // no tokens, as the script's reply reads it.
    let tokens = div_euclid(-empty, interval);
    let cost = i128::from(req.cost);
    let after = empty + cost * interval;
    let us = |units: i128| ceil_micros(units, per);
    // The next token comes when the time since the empty instant reaches a
    // whole interval, and in debt (the instant ahead) at least one; none
    // while the bucket is full.
    let next = |empty: i128, left: i128| {
        if left < i128::from(capacity) {
            us(unit_after(-empty, interval))
        } else {
            0
        }
    };
    if req.commit && tokens < cost && req.wait > 0 && us(after) <= req.wait {
        let wait = us(after);
        let at_slot = Step {
            now: req.now + wait,
            wait: 0,
            ..req
        };
        return reserved(step(slot, at_slot, (capacity, iv)), wait);
    }
    if req.commit && tokens >= cost {
        let reset = us(after + full);
        *slot = Some(Slot::At(Instant::at(req.now, after, per)));
        return Outcome::allowed(
            (tokens - cost) as u64,
            reset,
            reset,
            next(after, tokens - cost),
        );
    }
    let retry = if tokens < cost { us(after) } else { 0 };
    Outcome::current(
        tokens.max(0) as u64,
        us(empty + full),
        retry,
        next(empty, tokens),
    )
}

/// The settle. Under the estimate: the tokens go back, never above the
/// capacity (a full bucket keeps no state). Over it: the empty instant moves
/// later by the difference, the tokens never below -debt. Returns the new
/// TTL.
pub(crate) fn settle(
    slot: &mut Option<Slot>,
    s: Settle,
    (capacity, iv): (u64, Interval),
) -> Option<u64> {
    let (interval, per) = (i128::from(iv.ticks), iv.per_micro);
    let full = i128::from(capacity) * interval;
    let empty = match slot {
        Some(Slot::At(t)) => Some(t.rel(s.now, per)),
        _ => None,
    };
    let empty = if s.give() > 0 {
        let give = s.give_held(interval, per);
        if give == 0 {
            return None;
        }
        let empty = empty? - give;
        if empty <= -full {
            *slot = None;
            return None;
        }
        empty
    } else {
        let empty = empty.unwrap_or(-full).max(-full);
        let most = (i128::from(s.debt) * interval).min(most_ahead(per) - full);
        (empty + i128::from(s.owe()) * interval).min(empty.max(most))
    };
    *slot = Some(Slot::At(Instant::at(s.now, empty, per)));
    Some(ceil_micros(empty + full, per))
}
