//! [`PendingCheck`]: a check that needs a round trip, and the round trip
//! itself (bounded by the limiter's timeout).

use std::fmt;
use std::time::Instant;

use super::deny_cache::Sent;
use super::lease::{self, Taking};
use super::limiter::RateLimiter;
use super::Decision;
use crate::clock::monotonic_micros;
use crate::error::{Error, Result};
use crate::keyspace::Subject;
use crate::store::RateRequest;

/// A check that needs a round trip: see [`RateLimiter::try_check_now`].
#[must_use = "a pending check does nothing until it is sent"]
pub struct PendingCheck {
    pub(super) limiter: RateLimiter,
    pub(super) subject: Subject,
    pub(super) prepared: Prepared,
}

pub(super) struct Prepared {
    pub(super) request: RateRequest,
    /// Local time before sending, for the deny cache.
    pub(super) sent: Sent,
    /// The quota lease this check takes, if it takes one.
    pub(super) lease: Option<Taking>,
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
        if let Some(cache) = &inner.deny_cache {
            self.prepared.sent = Sent {
                at: now_micros.unwrap_or_else(monotonic_micros),
                forgets: cache.forgets(),
            };
        }
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
    /// The round trip, bounded by the timeout.
    pub(super) async fn send(&self, mut prepared: Prepared, subject: &Subject) -> Result<Decision> {
        let inner = &self.inner;
        prepared.request.deadline = Instant::now().checked_add(inner.timeout);
        // Only a round trip can come back after its caller left: a check
        // decided in process carries no hook (no reference count per check).
        prepared.request.unclaimed = Some(inner.unclaimed.clone());
        let outcome = {
            // A span per round trip (none in process): what a trace of a
            // slow request shows.
            let span = tracing::debug_span!(
                "tollgate.rate.check",
                policy = inner.keyspace.policy(),
                store = inner.backend.kind(),
                cost = prepared.request.cost,
            );
            let call = lease::check(&prepared.lease, &*inner.backend, &prepared.request);
            let mut call = tracing::Instrument::instrument(call, span);
            // A backend that answers on the first poll needs no timer (and
            // then none is required of the runtime).
            match futures_util::poll!(&mut call) {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => tokio::time::timeout(inner.timeout, call)
                    .await
                    .unwrap_or(Err(Error::Timeout(inner.timeout))),
            }
        };
        self.conclude(subject, prepared.sent, &prepared.request, outcome)
            .map(|d| Taking::charged(&prepared.lease, d))
    }
}
