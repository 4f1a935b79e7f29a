//! Fixed window aligned to the epoch. The Redis script is
//! `lua/fixed_window.lua`; this file is its twin for the memory backend.

use super::{Outcome, Slot};

/// The Lua script, after the shared prelude.
pub(crate) const SCRIPT: &str = concat!(
    include_str!("../../lua/rate_prelude.lua"),
    include_str!("../../lua/fixed_window.lua")
);

/// One quota's step: `limit` per `period` µs.
pub(crate) fn step(
    slot: &mut Option<Slot>,
    now: u64,
    cost: u64,
    limit: u64,
    period: u64,
    commit: bool,
) -> Outcome {
    let w = now / period;
    let count = match slot {
        Some(Slot::Window { window, count, .. }) if *window == w => *count,
        _ => 0,
    };
    let reset = (w + 1) * period - now;
    let fits = count + cost <= limit;
    if commit && fits {
        *slot = Some(Slot::Window {
            window: w,
            previous: 0,
            count: count + cost,
        });
        return Outcome::allowed(limit - count - cost, reset, reset);
    }
    Outcome::current(
        limit.saturating_sub(count),
        reset,
        if fits { 0 } else { reset },
    )
}
