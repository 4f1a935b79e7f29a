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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds on this process's monotonic clock (since its first use):
/// for local deadlines (the breaker, the deny cache), never for decisions.
/// Never 0, which its users read as "unset".
pub(crate) fn monotonic_micros() -> u64 {
    static START: OnceLock<Origin> = OnceLock::new();
    START.get_or_init(Origin::now).elapsed_micros() + 1
}

/// A start on this process's monotonic clock: the time-stamp counter
/// where the kernel keeps its own monotonic clock on it ([`counter`]),
/// else the OS's clock. A counter read costs a fraction of
/// `clock_gettime`, and an in-process check reads the clock every time.
#[derive(Debug, Clone, Copy)]
enum Origin {
    Counter(&'static quanta::Clock, quanta::Instant),
    Os(std::time::Instant),
}

impl Origin {
    fn now() -> Self {
        match counter() {
            Some(clock) => Origin::Counter(clock, clock.now()),
            None => Origin::Os(std::time::Instant::now()),
        }
    }

    fn elapsed_micros(self) -> u64 {
        let elapsed = match self {
            Origin::Counter(clock, start) => clock.now().duration_since(start),
            Origin::Os(start) => start.elapsed(),
        };
        u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
    }
}

/// The time-stamp counter, where this process may read it: only where
/// Linux keeps its own monotonic clock on it (see [`trusts`]). Made once,
/// and calibrated then against the OS's monotonic clock (a spin of at
/// least half a millisecond, at most 200 ms). A clock of its own, not
/// quanta's global one, which a thread may swap for a mock.
fn counter() -> Option<&'static quanta::Clock> {
    static COUNTER: OnceLock<Option<quanta::Clock>> = OnceLock::new();
    COUNTER
        .get_or_init(|| {
            let source = std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            );
            trusts(source).then(quanta::Clock::new)
        })
        .as_ref()
}

/// Whether Linux's current clock `source` is the time-stamp counter. The
/// kernel checks that every CPU's counter agrees before it times itself by
/// them; quanta checks the CPU's flags only, and a core whose counter runs
/// ahead would expire a lock early or refill a bucket twice.
fn trusts(source: std::io::Result<String>) -> bool {
    source.is_ok_and(|source| source.trim() == "tsc")
}

/// Starts this process's clock: its first read calibrates the counter, so
/// a store, limiter or locker makes it when built, never on a request.
pub(crate) fn start() {
    monotonic_micros();
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
/// The monotonic clock is the time-stamp counter where Linux keeps its own
/// monotonic clock on it (its clock source is `tsc`, whose counters the
/// kernel checked agree across CPUs when it chose them), at a fraction of
/// `clock_gettime`'s cost; the OS's monotonic clock elsewhere. The counter
/// is calibrated against the OS's clock on its first read in a process (a
/// spin of at least half a millisecond, at most 200 ms), which building a
/// clock, a limiter or a locker does. Its rate may differ from the OS
/// clock's by that calibration's error and by NTP's slewing of the OS clock
/// (at most 0.05 %): a lock on a memory store keeps its default drift
/// allowance (1 % of the TTL and 2 ms), or at least that much.
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
    origin: Origin,
    origin_micros: u64,
}

impl MonotonicClock {
    /// A clock reading the wall-clock time now, then moving with the
    /// monotonic clock.
    pub fn new() -> Self {
        MonotonicClock {
            origin: Origin::now(),
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
        self.origin_micros
            .saturating_add(self.origin.elapsed_micros())
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant as StdInstant};

    use super::*;

    /// Both kinds of origin, and the clocks made on them, move with the
    /// OS's monotonic clock: each reading is bracketed by two of the OS's,
    /// so a pause between reads widens the bracket instead of failing.
    #[test]
    fn the_monotonic_clocks_keep_the_os_clocks_pace() {
        // The counter's origin even where this process would not read it.
        let quanta: &'static quanta::Clock = Box::leak(Box::new(quanta::Clock::new()));
        let counter = Origin::Counter(quanta, quanta.now());
        let os = Origin::Os(StdInstant::now());
        let clock = MonotonicClock::new();
        let origin = StdInstant::now();
        let since = |at: StdInstant| at.duration_since(origin).as_micros() as u64;
        let read = || {
            let before = StdInstant::now();
            let readings = [
                counter.elapsed_micros(),
                os.elapsed_micros(),
                clock.now_micros(),
                monotonic_micros(),
            ];
            (since(before), readings, since(StdInstant::now()))
        };
        let (lo0, at0, hi0) = read();
        std::thread::sleep(Duration::from_millis(30));
        let (lo1, at1, hi1) = read();
        // What the OS's clock allows, with room for the counter's
        // calibration error (well under 1 %).
        let (least, most) = (lo1 - hi0, hi1 - lo0);
        let slack = 100 + most / 100;
        let names = ["counter", "os", "clock", "local"];
        for ((name, a), b) in names.iter().zip(at0).zip(at1) {
            let span = b - a;
            assert!(
                span + slack >= least && span <= most + slack,
                "{name}: {span} µs, the OS's clock says {least}..={most} µs"
            );
        }
        // And the wall clock's origin is the system time's.
        let system = SystemClock.now_micros();
        assert!(clock.now_micros().abs_diff(system) < 1_000_000);
    }

    /// The counter is read only where the kernel's clock source is it.
    #[test]
    fn the_counter_is_read_only_where_the_kernel_reads_it() {
        assert!(trusts(Ok("tsc\n".into())));
        assert!(trusts(Ok("tsc".into())));
        for other in ["kvm-clock\n", "hpet\n", "acpi_pm", "", "tsc-early"] {
            assert!(!trusts(Ok(other.into())), "{other:?}");
        }
        assert!(!trusts(Err(std::io::ErrorKind::NotFound.into())));
        assert_eq!(
            matches!(Origin::now(), Origin::Counter(..)),
            counter().is_some()
        );
    }

    /// A thread that swaps quanta's global clock for a mock does not move
    /// this process's.
    #[test]
    fn a_mocked_quanta_clock_leaves_ours_alone() {
        let clock = MonotonicClock::new();
        let before = clock.now_micros();
        let (mock, _handle) = quanta::Clock::mock();
        let inside = quanta::with_clock(&mock, || clock.now_micros());
        let after = clock.now_micros();
        assert!(
            before <= inside && inside <= after,
            "{before} {inside} {after}"
        );
        assert!(after - before < 1_000_000, "{before} {after}");
    }
}
