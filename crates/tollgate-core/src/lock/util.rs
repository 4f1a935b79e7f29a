//! Small helpers every lock module uses: jitter, deadlines that never
//! overflow, owner tokens, and awaiting the tasks that acquires and releases
//! run in. A leaf: it imports no other lock module but the options.

use std::time::{Duration, Instant};

use super::options::MAX_LOCK_DURATION;
use crate::error::{BackendError, Error, Result};
use crate::keyspace::hex;

/// A uniform random number in [0, 1) from the OS CSPRNG (for jitter).
pub(crate) fn unit_random() -> f64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// `at + d`, never panicking: a duration too long for the clock is cut to
/// [`MAX_LOCK_DURATION`] (user durations are checked against that bound
/// before they get here; only the poll interval is not), and if even that
/// overflows, `at` itself (the deadline is then already due).
pub(crate) fn instant_after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(MAX_LOCK_DURATION))
        .unwrap_or(at)
}

/// The error of a lock task that the runtime dropped (it is shutting down).
pub(crate) fn runtime_gone() -> Error {
    Error::Backend(BackendError::outage(
        "the tokio runtime shut down during a lock operation",
    ))
}

/// Awaits a lock task: its result, its panic, or [`runtime_gone`].
pub(crate) async fn join<T>(task: tokio::task::JoinHandle<Result<T>>) -> Result<T> {
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(runtime_gone()),
    }
}

/// A fresh 128-bit owner token from the OS CSPRNG, hex.
pub(crate) fn new_token() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| {
        // An outage, as before the error was opaque: it was an I/O error.
        Error::Backend(BackendError::outage(format!(
            "the OS random source failed: {e}"
        )))
    })?;
    Ok(hex(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
