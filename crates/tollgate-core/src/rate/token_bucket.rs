//! Token bucket kept in one integer: the instant the bucket was last empty.
//! The Redis script is `lua/token_bucket.lua`; this file is its twin for the
//! memory backend, figure for figure.

use super::{Outcome, Slot};

/// The Lua script.
pub(crate) const SCRIPT: &str = include_str!("../../lua/token_bucket.lua");

/// One quota's step. `capacity` tokens, one token every `interval` µs. With
/// `commit`, admitted tokens are taken.
pub(crate) fn step(
    slot: &mut Option<Slot>,
    now: u64,
    cost: u64,
    capacity: u64,
    interval: u64,
    commit: bool,
) -> Outcome {
    let full = capacity * interval;
    // Signed: a fresh bucket's empty instant lies `full` before now, which may
    // precede the epoch under a fake clock.
    let floor = now as i128 - full as i128;
    let empty_at = match slot {
        Some(Slot::Int(t)) => (*t as i128).max(floor),
        _ => floor,
    };
    let tokens = ((now as i128 - empty_at) / interval as i128) as u64;
    let after = empty_at + (cost * interval) as i128;
    if tokens < cost {
        let reset = (empty_at + full as i128 - now as i128) as u64;
        return Outcome::denied(tokens, reset, (after - now as i128) as u64);
    }
    let reset = (after + full as i128 - now as i128) as u64;
    if commit {
        // Stored as an integer like the script does; a negative instant is only
        // possible with a fake clock near the epoch and clamps to zero.
        *slot = Some(Slot::Int(after.max(0) as u64));
    }
    Outcome::allowed(tokens - cost, reset, reset)
}
