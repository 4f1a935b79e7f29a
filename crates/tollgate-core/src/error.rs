//! The one error type of tollgate-core.

use std::time::Duration;

/// Everything that can go wrong in a check, an acquire or a construction.
///
/// Configuration mistakes ([`Error::InvalidQuota`], [`Error::InvalidConfig`],
/// [`Error::CostExceedsCapacity`]) are reported before any round trip; backend
/// trouble ([`Error::Backend`], [`Error::Timeout`], [`Error::CircuitOpen`]) is
/// what the failure policy of a limiter acts on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The quota can never admit anything, or its numbers overflow.
    #[error("invalid quota: {0}")]
    InvalidQuota(String),
    /// A builder was given a value that cannot work (prefix with braces, …).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The request costs more than the quota can ever hold; it can never be
    /// admitted, so it is refused without touching the backend.
    #[error("cost {cost} exceeds the capacity {capacity} of the quota; it can never be admitted")]
    CostExceedsCapacity {
        /// The cost that was asked for.
        cost: u64,
        /// The most the quota can ever admit at once.
        capacity: u64,
    },
    /// The backend answered with an error or the connection failed.
    #[error("backend error: {0}")]
    Backend(#[from] redis::RedisError),
    /// The backend answered something the script cannot have returned.
    #[error("unexpected reply from the backend: {0}")]
    Protocol(String),
    /// The backend did not answer within the configured bound.
    #[error("backend did not answer within {0:?}")]
    Timeout(Duration),
    /// Recent checks failed repeatedly, so this one did not wait for the
    /// backend at all; the circuit closes again on its own after a short pause.
    #[error("backend circuit is open after repeated failures")]
    CircuitOpen,
    /// A lock could not be acquired within the wait bound.
    #[error("lock {name:?} is held by someone else")]
    Busy {
        /// The lock's name.
        name: String,
        /// How long the current holder's lease still runs, when known.
        retry_after: Option<Duration>,
    },
}

impl Error {
    /// True for errors that come from the backend being unavailable or slow
    /// (not from configuration or from a limit being reached).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Error::Backend(_) | Error::Timeout(_) | Error::CircuitOpen | Error::Protocol(_)
        )
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
