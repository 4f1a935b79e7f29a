//! [`PendingCheck`]: a check that needs a round trip, and
//! [`RateLimiter::try_check_now`], which decides at once or makes one.

use std::fmt;

use super::limiter::{Prepared, RateLimiter};
use super::Decision;
use crate::error::Result;
use crate::keyspace::Subject;

/// A check that needs a round trip: see [`RateLimiter::try_check_now`].
#[must_use = "a pending check does nothing until it is sent"]
pub struct PendingCheck {
    limiter: RateLimiter,
    subject: Subject,
    prepared: Prepared,
}

impl PendingCheck {
    /// Sends the check (one round trip, bounded by the limiter's timeout)
    /// and decides, applying the failure policy as
    /// [`RateLimiter::check_n`] does. The decision is timed when it is sent.
    ///
    /// Send it promptly: when the circuit breaker is half-open, this check
    /// may be the one probe of the backend, and dropping it unsent keeps
    /// the circuit open for another cooldown.
    pub async fn send(mut self) -> Result<Decision> {
        // It may be sent a while after it was made: time it now.
        let inner = &self.limiter.inner;
        let now_micros = inner.timing.as_ref().map(|c| c.now_micros());
        self.prepared.request.now_micros = now_micros;
        self.prepared.sent = self.limiter.sent(now_micros);
        self.limiter.send(self.prepared, &self.subject).await
    }
}

impl fmt::Debug for PendingCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingCheck")
            .field("subject", &self.subject)
            .field("cost", &self.prepared.request.cost)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// Decides at once when no round trip is needed: on an in-process
    /// backend ([`MemoryBackend`](crate::MemoryBackend)), from the deny cache, for a cost that can
    /// never fit, or while the circuit is open. Otherwise returns the
    /// [`PendingCheck`] to [`send`](PendingCheck::send).
    ///
    /// [`check_n`](Self::check_n) is this followed by `send`; middleware uses
    /// the two halves to skip allocating a future when the answer is ready.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{MemoryBackend, Quota, RateLimiter, Subject};
    ///
    /// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_second(1))?;
    /// let alice = Subject::new("alice");
    /// let decision = match limiter.try_check_now(&alice, 1) {
    ///     Ok(decided) => decided?,
    ///     Err(pending) => pending.send().await?,
    /// };
    /// assert!(decision.allowed);
    /// // The memory backend always answers at once.
    /// assert!(!limiter.try_check_now(&alice, 1).expect("in process")?.allowed);
    /// # Ok(()) }
    /// ```
    #[allow(clippy::result_large_err)] // the Err is the work left to do, not a failure
    pub fn try_check_now(
        &self,
        subject: &Subject,
        cost: u64,
    ) -> std::result::Result<Result<Decision>, PendingCheck> {
        self.start(subject, cost, 0)
            .map_err(|prepared| PendingCheck {
                limiter: self.clone(),
                subject: subject.clone(),
                prepared,
            })
    }
}
