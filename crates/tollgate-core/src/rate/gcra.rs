//! GCRA (generic cell rate algorithm): a token bucket kept in one integer, the
//! theoretical arrival time. The Redis script is `lua/gcra.lua`; this file is
//! its twin for the memory backend, figure for figure.

use super::{Outcome, Refund, Slot, Step};

/// The Lua script, after the shared prelude.
pub(crate) const SCRIPT: &str = rate_script!("gcra");
/// Its refund script.
pub(crate) const REFUND: &str = refund_script!("gcra");

/// One quota's step. `burst` and `interval` are the quota's burst and
/// emission interval in µs. With `req.commit`, an admitted cost is written back.
pub(crate) fn step(slot: &mut Option<Slot>, req: Step, (burst, interval): (u64, u64)) -> Outcome {
    let tat = match slot {
        Some(Slot::Int(t)) => u64::try_from(*t).unwrap_or(0).max(req.now),
        _ => req.now,
    };
    let limit_at = req.now + burst * interval;
    let nt = tat + req.cost * interval;
    let retry = nt.saturating_sub(limit_at);
    // One more unit is made available when limit_at - tat reaches the next
    // whole interval (time moves limit_at; the TAT stays); none when full.
    let next = |t: u64| {
        if t > req.now {
            interval - limit_at.saturating_sub(t) % interval
        } else {
            0
        }
    };
    if req.commit && retry == 0 {
        *slot = Some(Slot::Int(nt as i64));
        return Outcome::allowed(
            (limit_at - nt) / interval,
            nt - req.now,
            nt - req.now,
            next(nt),
        );
    }
    Outcome::current(
        limit_at.saturating_sub(tat) / interval,
        tat - req.now,
        retry,
        next(tat),
    )
}

/// The refund: the TAT moves back by the cost's intervals, never before now
/// (a full bucket keeps no state). Returns the new TTL.
pub(crate) fn refund(slot: &mut Option<Slot>, r: Refund, (_, interval): (u64, u64)) -> Option<u64> {
    let Some(Slot::Int(tat)) = slot else {
        return None;
    };
    let tat = i128::from(*tat) - i128::from(r.cost * interval);
    if tat <= i128::from(r.now) {
        *slot = None;
        return None;
    }
    *slot = Some(Slot::Int(tat as i64));
    Some((tat - i128::from(r.now)) as u64)
}
