//! Refunds: giving back what an admitted check took, at most once per charge
//! ([`RateLimiter::refund`], a settle to 0; [`Charge`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::FutureExt;

use super::settle::settle_request;
use super::{Decision, DecisionSource, RateLimiter};
use crate::clock::{monotonic_micros, Clock};
use crate::error::{Error, Result};
use crate::failure::is_outage;
use crate::keyspace::Subject;
use crate::quota::Quota;
use crate::store::{Algorithm, RateBackend, RateReply, RateRequest, Unclaimed};

/// What one admitted check took: the receipt [`RateLimiter::refund`] gives
/// back against. Found in [`Decision::charge`](super::Decision::charge).
///
/// A refund needs more than a cost: a window gives back to the window that
/// was charged (so the instant of the check), a log removes the check's own
/// entries (so its id), and a refund retried after a lost reply must not be
/// applied twice (so, again, its id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub(crate) cost: u64,
    /// The instant the backend decided at (µs, the backend's clock).
    pub(crate) at_micros: u64,
    /// Unique per check: the log's member prefix and the refund's marker.
    pub(crate) id: u64,
    /// How long after `at_micros` a refund can still give back (µs).
    pub(crate) span_micros: u64,
    /// Taken by the outage fallback's local limiter, not the backend.
    pub(crate) local: bool,
    /// The digest of the key it was taken under ([`key_digest`]): a charge
    /// refunds only its own subject on its own limiter.
    pub(crate) key: u64,
}

impl Charge {
    /// The units taken.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The check's id: a refund is applied at most once per id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The instant the check was decided at (µs since the epoch, on the
    /// backend's clock).
    pub fn at_micros(&self) -> u64 {
        self.at_micros
    }

    /// The same charge, for `cost` of its units at most: a partial refund
    /// (never more than was taken).
    pub fn part(mut self, cost: u64) -> Charge {
        self.cost = self.cost.min(cost);
        self
    }
}

/// A digest of a check's first key (its limiter and subject): cheap on
/// every admission; it tells apart keys, not adversaries.
pub(crate) fn key_digest(key: &str) -> u64 {
    crate::keyspace::quick_hash(0, key.as_bytes())
}

/// A fresh id for a check: a random base per process (so processes sharing a
/// backend do not collide) plus a counter (so one process never repeats, and
/// no syscall per check).
pub(crate) fn next_id() -> u64 {
    static BASE: LazyLock<u64> = LazyLock::new(|| {
        let mut b = [0u8; 8];
        // The OS CSPRNG; if it ever fails, a time-derived base (a collision
        // needs the same subject and counter in two processes).
        match getrandom::fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => monotonic_micros() ^ 0x9E37_79B9_7F4A_7C15,
        }
    });
    static NEXT: AtomicU64 = AtomicU64::new(0);
    BASE.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The charge an admission took (none for a denial or a cost of 0).
pub(super) fn charge_of(
    algorithm: Algorithm,
    request: &RateRequest,
    reply: &RateReply,
    d: &Decision,
) -> Option<Charge> {
    (reply.allowed && request.cost > 0).then(|| Charge {
        cost: request.cost,
        at_micros: reply.now_micros,
        id: request.nonce,
        span_micros: algorithm.refund_span(d),
        local: false,
        key: key_digest(&request.keys[0]),
    })
}

/// Gives back what an admission took when its caller had stopped waiting
/// before the reply came: that caller was answered by the failure policy,
/// so the check must take nothing (a late reply, e.g. Redis resuming from a
/// pause). A few tries, as the store may still be recovering; a refund is
/// applied at most once, so a retry is safe.
pub(super) fn unclaimed(
    backend: Arc<dyn RateBackend>,
    algorithm: Algorithm,
    quotas: Arc<[Quota]>,
    clock: Option<Arc<dyn Clock>>,
    policy: String,
) -> Unclaimed {
    Unclaimed::new(move |request, reply| {
        let d = Decision::from_outcomes(
            algorithm,
            &quotas,
            &reply.outcomes,
            reply.allowed,
            DecisionSource::Backend,
        );
        let charge = charge_of(algorithm, request, reply, &d);
        let refund = charge.map(|c| {
            let now = clock.as_ref().map(|c| c.now_micros());
            // Its quota keys (a block key may follow).
            let keys = request.keys[..quotas.len().min(request.keys.len())].to_vec();
            settle_request(algorithm, &quotas, None, keys, &c, 0, now)
        });
        let (backend, policy) = (Arc::clone(&backend), policy.clone());
        async move {
            let Some(refund) = refund else { return };
            let mut pause = UNCLAIMED_FIRST_PAUSE;
            for _ in 0..UNCLAIMED_TRIES {
                let done = tokio::time::timeout(UNCLAIMED_TIMEOUT, backend.settle_rate(&refund))
                    .await
                    .unwrap_or(Err(Error::Timeout(UNCLAIMED_TIMEOUT)));
                match done {
                    Ok(_) => {
                        tracing::debug!(policy = %policy, cost = refund.cost, "gave back an admission its caller never received");
                        #[cfg(feature = "metrics")]
                        metrics::counter!("tollgate_unclaimed_refunds_total", "policy" => policy.clone())
                            .increment(1);
                        return;
                    }
                    Err(e) if !is_outage(&e) => {
                        tracing::warn!(policy = %policy, error = %e, "could not give back an admission its caller never received");
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                }
            }
            tracing::warn!(policy = %policy, cost = refund.cost, "an admission its caller never received could not be given back: the store stayed unreachable");
        }
        .boxed()
    })
}

/// How long each try to give back an unclaimed admission may take.
const UNCLAIMED_TIMEOUT: Duration = Duration::from_secs(1);
/// Tries to give back an unclaimed admission, with pauses doubling from
/// the first (0.1 s … 1.6 s: a store back within about 3 s gets it).
const UNCLAIMED_TRIES: u32 = 5;
const UNCLAIMED_FIRST_PAUSE: Duration = Duration::from_millis(100);

impl RateLimiter {
    /// Gives back what an admitted check took, for every quota: a fixed
    /// window or a sliding counter returns the cost to the window that was
    /// charged (nothing once that window no longer counts), a log removes
    /// the check's entries, a token bucket or GCRA gets the tokens back (never
    /// above capacity). Applied at most once per charge: a refund retried
    /// after a timeout or a lost reply returns `Ok(false)` and changes nothing.
    /// It also clears the subject from the local deny cache.
    ///
    /// A refund is [`settle`](Self::settle) to 0 and shares its marker: a
    /// charge is refunded or settled once, not both.
    ///
    /// Returns whether the refund was applied (it gave back whatever of the
    /// charge still counted): `false` for a charge already refunded or settled, older
    /// than the longest quota's span (a window's period, two for the
    /// counter, a bucket's refill from empty), or of cost 0.
    ///
    /// Errors: [`Error::InvalidConfig`] for a charge taken for another
    /// subject or by another limiter (nothing is given back); a backend
    /// failure, the limiter's timeout, or
    /// [`Error::CircuitOpen`] while the circuit breaker skips a failing
    /// backend (refunds feed the breaker like checks). The failure policy
    /// does not apply: nothing is decided, and the charge stays. Retrying is
    /// safe.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter};
    ///
    /// // Login throttling: count failed attempts only.
    /// let logins = RateLimiter::sliding_window_log(MemoryBackend::new(), Quota::per_minute(3))?;
    /// let d = logins.check("alice").await?;
    /// assert_eq!(d.remaining, 2);
    /// // The password was right: this attempt does not count.
    /// let charge = d.charge.expect("an admitted check took 1");
    /// assert!(logins.refund("alice", &charge).await?);
    /// assert!(!logins.refund("alice", &charge).await?, "at most once");
    /// assert_eq!(logins.check("alice").await?.remaining, 2);
    /// # Ok(()) }
    /// ```
    pub async fn refund(&self, subject: impl Into<Subject>, charge: &Charge) -> Result<bool> {
        if charge.cost == 0 {
            return Ok(false);
        }
        // Taken by a fallback this limiter does not have: nothing of ours.
        if charge.local && self.inner.fallback.is_none() {
            return Ok(false);
        }
        // A refund is a settle to 0: one route, one marker per charge.
        let settled = self.settle_charge(subject.into(), charge, 0).await?;
        Ok(settled.applied)
    }
}
