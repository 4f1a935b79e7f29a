//! GCRA (generic cell rate algorithm): a token bucket kept in one instant, the
//! theoretical arrival time. The Redis script is `lua/gcra.lua`; this file is
//! its twin for the memory backend, figure for figure.
//!
//! Time is counted relative to now in units of `1/per_micro` µs, where the
//! emission interval `period / limit` is a whole number of units
//! ([`Interval`]): no rate is rounded.

use super::{
    ceil_micros, div_euclid, most_ahead, reserved, unit_after, Instant, Outcome, Settle, Slot, Step,
};
use crate::quota::Interval;

/// One quota's step. `burst` and the exact emission interval. With
/// `req.commit`, an admitted cost is written back; a cost that fits only
/// within `req.wait` is admitted at its slot, as the step then would.
pub(crate) fn step(slot: &mut Option<Slot>, req: Step, (burst, iv): (u64, Interval)) -> Outcome {
    let (interval, per) = (i128::from(iv.ticks), iv.per_micro);
    let tat = match slot {
        Some(Slot::At(t)) => t.rel(req.now, per).max(0),
        _ => 0,
    };
    let limit_at = i128::from(burst) * interval;
    let nt = tat + i128::from(req.cost) * interval;
    let us = |units: i128| ceil_micros(units, per);
    // Whole intervals of room; negative (a TAT past the limit after the
    // clock stepped back) reads as none, as the script's reply does.
    let units = |room: i128| div_euclid(room, interval).max(0) as u64;
    // One more unit is made available when limit_at - tat reaches the next
    // whole interval (time moves limit_at; the TAT stays), and in debt at
    // least one; none when full.
    let next = |t: i128| {
        if t > 0 {
            us(unit_after(limit_at - t, interval))
        } else {
            0
        }
    };
    if req.commit && nt > limit_at && req.wait > 0 && us(nt - limit_at) <= req.wait {
        let wait = us(nt - limit_at);
        let at_slot = Step {
            now: req.now + wait,
            wait: 0,
            ..req
        };
        return reserved(step(slot, at_slot, (burst, iv)), wait);
    }
    if req.commit && nt <= limit_at {
        *slot = Some(Slot::At(Instant::at(req.now, nt, per)));
        return Outcome::allowed(units(limit_at - nt), us(nt), us(nt), next(nt));
    }
    Outcome::current(units(limit_at - tat), us(tat), us(nt - limit_at), next(tat))
}

/// The settle. Under the estimate: the TAT moves back by the difference's
/// intervals, never before now (a full bucket keeps no state). Over it: the
/// TAT moves later by the difference from max(TAT, now), never beyond now +
/// (burst + debt) intervals. Returns the new TTL.
pub(crate) fn settle(
    slot: &mut Option<Slot>,
    s: Settle,
    (burst, iv): (u64, Interval),
) -> Option<u64> {
    let (interval, per) = (i128::from(iv.ticks), iv.per_micro);
    let tat = match slot {
        Some(Slot::At(t)) => Some(t.rel(s.now, per)),
        _ => None,
    };
    let tat = if s.give() > 0 {
        let give = s.give_held(interval, per);
        if give == 0 {
            return None;
        }
        let tat = tat? - give;
        if tat <= 0 {
            *slot = None;
            return None;
        }
        tat
    } else {
        let tat = tat.unwrap_or(0).max(0);
        let most = ((i128::from(burst) + i128::from(s.debt)) * interval).min(most_ahead(per));
        (tat + i128::from(s.owe()) * interval).min(tat.max(most))
    };
    *slot = Some(Slot::At(Instant::at(s.now, tat, per)));
    Some(ceil_micros(tat, per))
}
