//! Time sources.
//!
//! By default every decision is timed by the backend: Redis's `TIME` inside the
//! script (so application servers' clocks never matter), or the memory
//! backend's own clock. A [`Clock`] given to a limiter overrides that — for
//! managed Redis that forbids `TIME` in scripts, and for tests that want a fake
//! clock.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Microseconds on this process's monotonic clock (since its first use):
/// for local deadlines (the breaker, the deny cache), never for decisions.
/// Never 0, which its users read as "unset".
pub(crate) fn monotonic_micros() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// A source of wall-clock time in whole microseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;
}

impl<T: Clock + ?Sized> Clock for Arc<T> {
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// The wall clock read once, then this process's monotonic clock: µs
/// since the Unix epoch that never step when the wall clock does (an NTP
/// step, a resumed virtual machine). What an in-process store is timed by
/// by default ([`MemoryBackend::new`](crate::MemoryBackend::new)): its
/// lock and permit expiries then agree with the leases' safe deadlines,
/// which are monotonic, so a wall-clock step never lets a second holder in.
///
/// ```
/// use tollgate::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let (a, b) = (clock.now_micros(), clock.now_micros());
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
    origin_micros: u64,
}

impl MonotonicClock {
    /// A clock reading the wall-clock time now, then moving with the
    /// monotonic clock.
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
            origin_micros: SystemClock.now_micros(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_micros(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.origin_micros.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000_000);
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now_micros(), 2_500_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `micros` microseconds since the epoch.
    pub fn new(micros: u64) -> Self {
        Self(Arc::new(AtomicU64::new(micros)))
    }

    /// A clock starting at the current system time.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_micros())
    }

    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Set the clock to an absolute reading (it may go backwards).
    pub fn set(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
