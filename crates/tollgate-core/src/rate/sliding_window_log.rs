//! Sliding window log: one entry per admitted unit, exact. The Redis script is
//! `lua/sliding_window_log.lua`; this file is its twin for the memory backend.

use std::collections::VecDeque;

use super::{Outcome, Slot};

/// The Lua script, after the shared prelude.
pub(crate) const SCRIPT: &str = concat!(
    include_str!("../../lua/rate_prelude.lua"),
    include_str!("../../lua/sliding_window_log.lua")
);

/// The largest limit the log accepts: it keeps one entry per admitted unit,
/// and memory and CPU grow with the limit. Larger limits belong to the
/// sliding window counter.
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// One quota's step: `limit` per `period` µs.
pub(crate) fn step(
    slot: &mut Option<Slot>,
    now: u64,
    cost: u64,
    limit: u64,
    period: u64,
    commit: bool,
) -> Outcome {
    if !matches!(slot, Some(Slot::Log(_))) {
        *slot = Some(Slot::Log(VecDeque::new()));
    }
    let Some(Slot::Log(log)) = slot else {
        unreachable!("just set")
    };
    // Entries at or before now - period have left the window (kept sorted).
    let cutoff = i128::from(now) - i128::from(period);
    let gone = log.partition_point(|&t| i128::from(t) <= cutoff);
    log.drain(..gone);
    let count = log.len() as u64;
    let fits = count + cost <= limit;
    if commit && fits {
        let at = log.partition_point(|&t| t <= now);
        for _ in 0..cost {
            log.insert(at, now);
        }
        return Outcome::allowed(limit - count - cost, period, period);
    }
    let reset = log.back().map_or(0, |&t| (t + period).saturating_sub(now));
    let retry = if fits {
        0
    } else {
        // The entry whose expiry frees enough room for this cost.
        (log[(count + cost - limit - 1) as usize] + period).saturating_sub(now)
    };
    Outcome::current(limit.saturating_sub(count), reset, retry)
}
