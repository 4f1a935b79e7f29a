//! The errors a paced call ends with when the budget, not the upstream,
//! stops it: [`Throttled`] and [`Unavailable`].

use std::fmt;
use std::time::Duration;

/// The budget has no slot for the call within the layer's
/// [`max_wait`](super::PaceLayer::max_wait) (or the upstream asked the
/// whole fleet to stop for longer): the call was not made.
///
/// Returned boxed as the service's error; find it with `downcast_ref`:
///
/// ```
/// use std::time::Duration;
/// use tollgate::tower::pace::Throttled;
/// use tollgate::tower::BoxError;
///
/// fn retry_in(e: &BoxError) -> Option<Duration> {
///     e.downcast_ref::<Throttled>()?.retry_after()
/// }
/// # let _ = retry_in;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    retry_after: Option<Duration>,
}

impl Throttled {
    pub(crate) fn new(retry_after: Option<Duration>) -> Self {
        Throttled { retry_after }
    }

    /// How long until the budget could take the call; `None` when it never
    /// can (its cost is more than the budget ever holds).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.retry_after {
            Some(wait) => write!(
                f,
                "the call budget has no slot within the wait allowed (one in {wait:?})"
            ),
            None => f.write_str("the call costs more than the budget ever holds"),
        }
    }
}

impl std::error::Error for Throttled {}

/// The budget could not be read (its store failed or timed out) and the
/// limiter's [`FailurePolicy`](tollgate_core::FailurePolicy) is `Deny`: the
/// call was not made. Under `Allow` (the default) such a call goes ahead
/// unpaced instead.
#[derive(Debug)]
pub struct Unavailable {
    source: tollgate_core::Error,
}

impl Unavailable {
    pub(crate) fn new(source: tollgate_core::Error) -> Self {
        Unavailable { source }
    }

    /// The limiter's error.
    pub fn error(&self) -> &tollgate_core::Error {
        &self.source
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the call budget is unavailable: {}", self.source)
    }
}

impl std::error::Error for Unavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
