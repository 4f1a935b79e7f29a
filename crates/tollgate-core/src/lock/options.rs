//! [`LockOptions`] and [`FencingToken`].

use std::fmt;
use std::time::Duration;

/// The default lease TTL: 30 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How to take one lock: TTL, how long to wait, renewal, and a cap on the
/// total hold time. Builder style; the default is a 30 s TTL renewed by the
/// watchdog, no waiting and no cap.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::LockOptions;
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
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    wait: Option<Duration>,
    renew: bool,
    max_hold: Option<Duration>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            wait: None,
            renew: true,
            max_hold: None,
        }
    }
}

impl LockOptions {
    /// The defaults: TTL 30 s, no waiting, renewal on, no cap.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the lock lives on the backend unless renewed. With renewal
    /// on, it is also how long the lock outlives a crashed holder.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`Locker::acquire`](crate::Locker::acquire) may wait for the
    /// lock before it gives up with [`Error::Busy`](crate::Error::Busy).
    /// `Duration::ZERO` means no waiting; [`Duration::MAX`] waits forever.
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
    /// stuck holder cannot keep the lock forever.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
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

    /// The cap on the total hold time, if any.
    pub fn max_hold_duration(&self) -> Option<Duration> {
        self.max_hold
    }
}

/// A fencing token: strictly increasing per lock name, across all holders,
/// processes and Redis restarts (see the [module docs](crate::lock) for the
/// guarantee and its assumption). The protected resource remembers the
/// highest token it has seen and refuses writes that carry a lower one.
///
/// ```
/// use tollgate_core::FencingToken;
///
/// let old = FencingToken(1_700_000_000_000_000);
/// let new = FencingToken(1_700_000_000_000_001);
/// assert!(new > old);
/// assert_eq!(new.get(), 1_700_000_000_000_001);
/// assert_eq!(new.to_string(), "1700000000000001");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as an integer.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

impl From<u64> for FencingToken {
    fn from(token: u64) -> FencingToken {
        FencingToken(token)
    }
}
