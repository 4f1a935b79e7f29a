//! Permits: the storage of semaphores and fair locks
//! ([`Holders::Permits`](super::Holders::Permits)), as Lua scripts
//! (`lua/permit_*.lua`) and their Rust twin for the memory backend. The
//! lease, watchdog, waiting and fencing around them are the lock's own: a
//! lock is the one-holder case, and none of that is written twice.

pub(crate) mod memory;
pub(crate) mod redis;

/// The largest permit count a name may have. A holder of weight k is k
/// members of a sorted set, so the bound keeps every script call short
/// (the sliding log caps its limit for the same reason).
pub const MAX_PERMITS: u32 = 10_000;

use super::backend::{Holders, LockKeys};
use crate::error::{Error, Result};

/// `(limit, weight, fair)` of a permit name; an error for a lock's keys.
pub(crate) fn shape(keys: &LockKeys) -> Result<(u32, u32, bool)> {
    match keys.holders {
        Holders::Permits {
            limit,
            weight,
            fair,
        } => Ok((limit, weight, fair)),
        Holders::One => Err(Error::InvalidConfig(
            "a lock name was passed to a permit operation".into(),
        )),
    }
}
