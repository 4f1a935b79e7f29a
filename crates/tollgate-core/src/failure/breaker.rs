//! [`Breaker`]: a limiter's circuit breaker, so a dead backend costs no
//! latency: after repeated failures the backend is skipped for a cooldown,
//! then one check probes it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use std::future::Future;

use super::is_outage;
use crate::clock::monotonic_micros;
use crate::error::{Error, Result};

/// Skips the backend after repeated failures, for a short cooldown.
pub(crate) struct Breaker {
    threshold: u32,
    cooldown_us: u64,
    failures: AtomicU32,
    open_until: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        // The first read of the clock calibrates it: now, not in a failure.
        crate::clock::start();
        Breaker {
            threshold,
            cooldown_us: cooldown.as_micros() as u64,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    /// Whether a call may go to the backend now. When the cooldown is over,
    /// exactly one caller probes (and pushes the deadline out for the rest).
    pub(crate) fn admits(&self) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return true; // closed: no clock read on the hot path
        }
        let now = monotonic_micros();
        now >= until
            && self
                .open_until
                .compare_exchange(
                    until,
                    now + self.cooldown_us,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Runs `call` unless the backend is being skipped (then
    /// [`Error::CircuitOpen`] at once), and counts its outcome: an outage
    /// is a failure, anything else (an answer, an error about the request's
    /// own data) a success.
    pub(crate) async fn call<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        if !self.admits() {
            return Err(Error::CircuitOpen);
        }
        let result = call.await;
        match &result {
            Err(e) if is_outage(e) => self.failure(monotonic_micros()),
            _ => self.success(),
        }
        result
    }

    pub(crate) fn success(&self) {
        // Read first: on the hot path nothing needs writing, and a store on
        // every check would bounce the cache line between cores.
        if self.failures.load(Ordering::Acquire) != 0 {
            self.failures.store(0, Ordering::Release);
        }
        if self.open_until.load(Ordering::Acquire) != 0 {
            self.open_until.store(0, Ordering::Release);
        }
    }

    pub(crate) fn failure(&self, now: u64) {
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if n >= self.threshold {
            self.open_until
                .store((now + self.cooldown_us).max(1), Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_the_threshold_then_probes_once() {
        let b = Breaker::new(2, Duration::from_secs(60));
        assert!(b.admits());
        b.failure(monotonic_micros());
        assert!(b.admits(), "below the threshold");
        b.failure(monotonic_micros());
        assert!(!b.admits(), "open for the cooldown");
        b.open_until.store(1, Ordering::Release); // cooldown over
        assert!(b.admits());
        assert!(!b.admits(), "only one probe per cooldown");
        b.success();
        assert!(b.admits());
        b.failure(monotonic_micros());
        assert!(b.admits(), "a success resets the count");
    }
}
