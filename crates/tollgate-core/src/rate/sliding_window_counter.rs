//! Sliding window counter: the previous fixed window's count, weighted by how
//! much of it still overlaps the sliding window, plus the current count. The
//! Redis script is `lua/sliding_window_counter.lua`; this file is its twin.

use super::{Outcome, Slot};

/// The Lua script, after the shared prelude.
pub(crate) const SCRIPT: &str = concat!(
    include_str!("../../lua/rate_prelude.lua"),
    include_str!("../../lua/sliding_window_counter.lua")
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
    let e = now - w * period;
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
            } else {
                (0, 0)
            }
        }
        _ => (0, 0),
    };
    let est = cur + (prev as u128 * (period - e) as u128).div_ceil(period as u128) as u64;
    let fits = est + cost <= limit;
    if commit && fits {
        *slot = Some(Slot::Window {
            window: w,
            previous: prev,
            count: cur + cost,
        });
        return Outcome::allowed(limit - est - cost, 2 * period - e, 2 * period - e);
    }
    let retry = if fits {
        0
    } else if cur + cost <= limit {
        // Later in this window, once the previous window's weight has dropped.
        period - ((limit - cur - cost) as u128 * period as u128 / prev as u128) as u64 - e
    } else {
        // In the next window, once this window's weight has dropped.
        period - e + period - ((limit - cost) as u128 * period as u128 / cur as u128) as u64
    };
    let reset = if cur > 0 {
        2 * period - e
    } else if prev > 0 {
        period - e
    } else {
        0
    };
    Outcome::current(limit.saturating_sub(est), reset, retry)
}
