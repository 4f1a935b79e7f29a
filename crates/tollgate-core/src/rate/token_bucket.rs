//! Token bucket kept in one integer: the instant the bucket was last empty.
//! The Redis script is `lua/token_bucket.lua`; this file is its twin for the
//! memory backend, figure for figure.

use super::{Outcome, Refund, Slot, Step};

/// The Lua script, after the shared prelude.
pub(crate) const SCRIPT: &str = rate_script!("token_bucket");
/// Its refund script.
pub(crate) const REFUND: &str = refund_script!("token_bucket");

/// One quota's step. `capacity` tokens, one token every `interval` µs. With
/// `req.commit`, admitted tokens are taken.
pub(crate) fn step(
    slot: &mut Option<Slot>,
    req: Step,
    (capacity, interval): (u64, u64),
) -> Outcome {
    let full = capacity * interval;
    // Signed: a fresh bucket's empty instant lies `full` before now, which may
    // precede the epoch under a fake clock.
    let now_i = req.now as i128;
    let floor = now_i - full as i128;
    let empty_at = match slot {
        Some(Slot::Int(t)) => (*t as i128).max(floor),
        _ => floor,
    };
    let tokens = ((now_i - empty_at).max(0) / interval as i128) as u64;
    let after = empty_at + (req.cost * interval) as i128;
    // The next token comes when the time since the empty instant reaches a
    // whole interval; none while the bucket is full.
    let next = |empty: i128, left: u64| {
        if left < capacity {
            interval - ((now_i - empty) % interval as i128) as u64
        } else {
            0
        }
    };
    if req.commit && tokens >= req.cost {
        let reset = (after + full as i128 - now_i) as u64;
        *slot = Some(Slot::Int(after as i64));
        return Outcome::allowed(
            tokens - req.cost,
            reset,
            reset,
            next(after, tokens - req.cost),
        );
    }
    let retry = if tokens < req.cost {
        (after - now_i).max(0) as u64
    } else {
        0
    };
    Outcome::current(
        tokens,
        (empty_at + full as i128 - now_i).max(0) as u64,
        retry,
        next(empty_at, tokens),
    )
}

/// The refund: the tokens go back, never above the capacity (a full bucket
/// keeps no state). Returns the new TTL.
pub(crate) fn refund(
    slot: &mut Option<Slot>,
    r: Refund,
    (capacity, interval): (u64, u64),
) -> Option<u64> {
    let Some(Slot::Int(empty_at)) = slot else {
        return None;
    };
    let full = i128::from(capacity * interval);
    let empty_at = i128::from(*empty_at) - i128::from(r.cost * interval);
    let now = i128::from(r.now);
    if empty_at <= now - full {
        *slot = None;
        return None;
    }
    *slot = Some(Slot::Int(empty_at as i64));
    Some((empty_at + full - now) as u64)
}
