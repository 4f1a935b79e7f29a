//! [`FencingToken`]: what a lock or a permit hands its holder, and what a
//! listing of holders shows.

use std::fmt;

/// A fencing token: strictly increasing per lock name, across all holders,
/// processes and Redis restarts (see the [module docs](crate::lock) for the
/// guarantee and its assumption). The protected resource remembers the
/// highest token it has seen and refuses writes that carry a lower one.
///
/// ```
/// use tollgate::FencingToken;
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
