//! When a store fails: the [`FailurePolicy`] a capability applies, the one
//! rule that says which errors are an outage ([`is_outage`]), and the circuit
//! breaker that skips a dead store.
//!
//! Limiters, lockers, semaphores and idempotency stores all decide "is the
//! store down?" with [`is_outage`]: a timeout, an open circuit, or a backend
//! error marked as an outage (unreachable, overloaded, refusing every
//! request). An error about one request's data — a script error, a key of
//! another type, a reply no script gives — is not: it fails that request
//! under every policy and never trips a breaker, because admitting it would
//! lift that subject's limit for as long as the cause stays.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::error::Error;

pub(crate) mod breaker;

/// What a limiter does when its backend fails (an outage: unreachable,
/// timed out, overloaded or refusing every request, or the circuit open).
/// An error about one request's data is not an outage: it is returned
/// whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit the request (the default): a limiter outage is not a service outage.
    #[default]
    Allow,
    /// Refuse the request: `check` returns the error (503 over HTTP).
    Deny,
    /// Decide with a local in-memory limiter whose limits are divided by the
    /// number of instances, so N instances together stay near the global
    /// rate instead of N times it (a limit below N: one unit each over a
    /// period N / limit times as long; each instance still admits its one
    /// unit at once, so the fleet's burst is at least N). A cost above the local share is denied
    /// (not charged as the share, which would let N instances admit N times
    /// the cost per refill); it fits the global quota, so it is a denial
    /// with a retry-after, not [`Error::CostExceedsCapacity`].
    Fallback {
        /// How many instances share the global limit.
        instances: NonZeroU32,
    },
}

/// How many outages in a row open a circuit breaker.
pub(crate) const DEFAULT_BREAKER_THRESHOLD: u32 = 5;
/// How long an open circuit skips the store before one call probes it.
pub(crate) const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(1);

/// Whether an error means the store is unreachable or overloaded (what a
/// circuit breaker counts and a failure policy acts on), as opposed to an
/// error about one request's data.
///
/// ```
/// use std::time::Duration;
/// use tollgate::failure::is_outage;
/// use tollgate::{BackendError, Error};
///
/// assert!(is_outage(&Error::Timeout(Duration::from_millis(100))));
/// assert!(is_outage(&Error::from(BackendError::outage("connection refused"))));
/// assert!(!is_outage(&Error::from(BackendError::new("WRONGTYPE"))));
/// assert!(!is_outage(&Error::Protocol("a reply no script gives".into())));
/// ```
pub fn is_outage(e: &Error) -> bool {
    match e {
        Error::Timeout(_) | Error::CircuitOpen => true,
        Error::Backend(b) => b.is_outage(),
        _ => false,
    }
}
