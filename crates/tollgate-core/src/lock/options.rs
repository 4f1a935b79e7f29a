//! [`LockOptions`] and [`FencingToken`].

use std::time::Duration;

/// The default lease TTL: 30 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The floor of the default hold cap: 10 minutes (see
/// [`LockOptions::max_hold`]).
pub const DEFAULT_MAX_HOLD_FLOOR: Duration = Duration::from_secs(10 * 60);

/// The default hold cap is this many TTLs, when that is more than
/// [`DEFAULT_MAX_HOLD_FLOOR`].
pub const DEFAULT_MAX_HOLD_TTLS: u32 = 20;

/// The longest TTL, hold cap, fence TTL or extension a lock accepts: 365
/// days. Longer values are refused with
/// [`Error::InvalidConfig`](crate::Error::InvalidConfig) before any round
/// trip (a "forever" lock is what the TTL exists to prevent; use
/// [`LockOptions::unbounded_hold`] to renew without a cap).
pub const MAX_LOCK_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The cap on the total hold time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MaxHold {
    /// `max(20 × ttl, 10 min)`, following the TTL.
    Default,
    /// Set with [`LockOptions::max_hold`].
    Fixed(Duration),
    /// [`LockOptions::unbounded_hold`].
    Unbounded,
}

/// How to take one lock: TTL, how long to wait, renewal, and a cap on the
/// total hold time. Builder style; the default is a 30 s TTL renewed by the
/// watchdog, no waiting, and a hold cap of `max(20 × ttl, 10 min)` (10
/// minutes with the default TTL).
///
/// ```
/// use std::time::Duration;
/// use tollgate::LockOptions;
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .max_hold(Duration::from_secs(60));
/// assert_eq!(opts.ttl_duration(), Duration::from_secs(10));
/// assert_eq!(opts.wait_bound(), Some(Duration::from_secs(2)));
/// assert!(opts.renews());
/// assert_eq!(opts.max_hold_duration(), Some(Duration::from_secs(60)));
///
/// let defaults = LockOptions::default();
/// assert_eq!(defaults.ttl_duration(), Duration::from_secs(30));
/// assert_eq!(defaults.wait_bound(), None);
/// assert_eq!(defaults.max_hold_duration(), Some(Duration::from_secs(600)));
/// // Long TTLs get a proportionally longer default cap: 20 × ttl.
/// let long = LockOptions::new().ttl(Duration::from_secs(3600));
/// assert_eq!(long.max_hold_duration(), Some(Duration::from_secs(20 * 3600)));
/// // No cap only when asked for.
/// assert_eq!(LockOptions::new().unbounded_hold().max_hold_duration(), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    wait: Option<Duration>,
    renew: bool,
    max_hold: MaxHold,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            wait: None,
            renew: true,
            max_hold: MaxHold::Default,
        }
    }
}

impl LockOptions {
    /// The defaults: TTL 30 s, no waiting, renewal on, hold cap
    /// `max(20 × ttl, 10 min)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the lock lives on the backend unless renewed. With renewal
    /// on, it is also how long the lock outlives a crashed holder. At least
    /// 1 ms (and more than the drift allowance), at most
    /// [`MAX_LOCK_DURATION`]; checked at acquire.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`Locker::acquire`](crate::Locker::acquire) may wait for the
    /// lock before it gives up with [`Error::Busy`](crate::Error::Busy).
    /// `Duration::ZERO` means no waiting; [`Duration::MAX`] (or any bound too
    /// far in the future for the clock) waits forever.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = (!wait.is_zero()).then_some(wait);
        self
    }

    /// Whether the watchdog renews the lease every TTL/3 while it is held
    /// (default on). Off, the lease ends at its TTL and `lost()` resolves then.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Caps the total hold time: the watchdog never extends the lease past
    /// `max_hold` after the acquire (and the first TTL is cut to it), so a
    /// stuck or forgotten holder cannot keep the lock forever; the lease is
    /// then lost (`lost()` resolves) shortly before the cap.
    ///
    /// The default cap is `max(20 × ttl, 10 min)`: long enough for ordinary
    /// critical sections, short enough that a leaked lease frees its lock
    /// within minutes. Work that legitimately runs longer sets its own cap,
    /// or opts out with [`unbounded_hold`](Self::unbounded_hold). Positive, at
    /// most [`MAX_LOCK_DURATION`]; checked at acquire.
    ///
    /// A concurrency limit's permits (the tower layer, the axum
    /// `HeldPermit`) live exactly as long as their request instead: a
    /// request in flight is not forgotten, and a permit lapsing under it
    /// would let one more in.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = MaxHold::Fixed(max_hold);
        self
    }

    /// No cap on the total hold time: the watchdog renews the lease for as
    /// long as it is held. A holder that hangs (or a lease leaked in a
    /// long-lived structure) then keeps the lock until its process exits.
    pub fn unbounded_hold(mut self) -> Self {
        self.max_hold = MaxHold::Unbounded;
        self
    }

    /// The TTL.
    pub fn ttl_duration(&self) -> Duration {
        self.ttl
    }

    /// The wait bound; `None` means no waiting.
    pub fn wait_bound(&self) -> Option<Duration> {
        self.wait
    }

    /// Whether the watchdog renews the lease.
    pub fn renews(&self) -> bool {
        self.renew
    }

    /// The cap on the total hold time: the one set with
    /// [`max_hold`](Self::max_hold), else the default `max(20 × ttl, 10
    /// min)` (at most [`MAX_LOCK_DURATION`]); `None` after
    /// [`unbounded_hold`](Self::unbounded_hold).
    pub fn max_hold_duration(&self) -> Option<Duration> {
        match self.max_hold {
            MaxHold::Default => Some(
                self.ttl
                    .saturating_mul(DEFAULT_MAX_HOLD_TTLS)
                    .max(DEFAULT_MAX_HOLD_FLOOR)
                    .min(MAX_LOCK_DURATION),
            ),
            MaxHold::Fixed(cap) => Some(cap),
            MaxHold::Unbounded => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_hold_cap_is_finite_and_follows_the_ttl() {
        let secs = Duration::from_secs;
        let cap = |o: LockOptions| o.max_hold_duration();
        assert_eq!(cap(LockOptions::new()), Some(secs(600)));
        // Short TTLs: the 10-minute floor.
        assert_eq!(
            cap(LockOptions::new().ttl(Duration::from_millis(50))),
            Some(secs(600))
        );
        assert_eq!(cap(LockOptions::new().ttl(secs(30))), Some(secs(600)));
        // Long TTLs: 20 × ttl.
        assert_eq!(cap(LockOptions::new().ttl(secs(31))), Some(secs(620)));
        assert_eq!(cap(LockOptions::new().ttl(secs(3600))), Some(secs(72_000)));
        // The default follows a TTL set after it, and never overflows.
        assert_eq!(
            cap(LockOptions::new().ttl(secs(3600)).ttl(secs(60))),
            Some(secs(1200))
        );
        assert_eq!(
            cap(LockOptions::new().ttl(Duration::MAX)),
            Some(MAX_LOCK_DURATION)
        );
        // An explicit cap wins, whatever the order; opting out is explicit.
        assert_eq!(
            cap(LockOptions::new().max_hold(secs(5)).ttl(secs(3600))),
            Some(secs(5))
        );
        assert_eq!(cap(LockOptions::new().unbounded_hold()), None);
        assert_eq!(
            cap(LockOptions::new().unbounded_hold().max_hold(secs(7))),
            Some(secs(7))
        );
        assert_ne!(LockOptions::new(), LockOptions::new().unbounded_hold());
    }
}
