//! GCRA (generic cell rate algorithm): a token bucket kept in one integer, the
//! theoretical arrival time. The Redis script is `lua/gcra.lua`; this file is
//! its twin for the memory backend, figure for figure.

use super::{Outcome, Slot};

/// The Lua script, after the shared prelude.
pub(crate) const SCRIPT: &str = concat!(
    include_str!("../../lua/rate_prelude.lua"),
    include_str!("../../lua/gcra.lua")
);

/// One quota's step. `burst` and `interval` are the quota's burst and
/// emission interval in µs. With `commit`, an admitted cost is written back.
pub(crate) fn step(
    slot: &mut Option<Slot>,
    now: u64,
    cost: u64,
    burst: u64,
    interval: u64,
    commit: bool,
) -> Outcome {
    let tat = match slot {
        Some(Slot::Int(t)) => u64::try_from(*t).unwrap_or(0).max(now),
        _ => now,
    };
    let limit_at = now + burst * interval;
    let nt = tat + cost * interval;
    let retry = nt.saturating_sub(limit_at);
    if commit && retry == 0 {
        *slot = Some(Slot::Int(nt as i64));
        return Outcome::allowed((limit_at - nt) / interval, nt - now, nt - now);
    }
    Outcome::current(limit_at.saturating_sub(tat) / interval, tat - now, retry)
}
