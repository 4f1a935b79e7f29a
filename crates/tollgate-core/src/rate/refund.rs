//! Refunds: giving back what an admitted check took, at most once per charge
//! ([`RateLimiter::refund`], a settle to 0; [`Charge`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use super::charge::charge_of;
use super::deny_cache::DenyCache;
use super::settle::settle_request;
use super::{Charge, Decision, DecisionSource, RateLimiter};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::failure::is_outage;
use crate::keyspace::Subject;
use crate::quota::Quota;
use crate::store::{Algorithm, RateBackend, Unclaimed};

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
    deny_cache: Option<Arc<DenyCache>>,
    policy: String,
) -> Unclaimed {
    Unclaimed::new(move |request, reply| {
        // A reservation is charged at its slot, its units taken now.
        let wait = reply.wait_micros();
        let slot = reply.at_slot();
        let reply = slot.as_ref().unwrap_or(reply);
        let d = Decision::from_outcomes(
            algorithm,
            &quotas,
            &reply.outcomes,
            reply.allowed,
            DecisionSource::Backend,
        );
        let charge = charge_of(algorithm, request, reply, &d).map(|mut c| {
            c.taken_micros = c.at_micros.saturating_sub(wait);
            c
        });
        let refund = charge.map(|c| {
            let now = clock.as_ref().map(|c| c.now_micros());
            // Its quota keys (a block key may follow).
            let keys = request.keys[..quotas.len().min(request.keys.len())].to_vec();
            settle_request(algorithm, &quotas, None, keys, &c, 0, now)
        });
        let (backend, policy) = (Arc::clone(&backend), policy.clone());
        let deny_cache = deny_cache.clone();
        async move {
            let Some(refund) = refund else { return };
            // As every give-back: a denial cached or in flight meanwhile
            // may be stale once it lands.
            let forget = |cache: &DenyCache| {
                cache.remove(&refund.keys[0]);
                cache.forget();
            };
            if let Some(cache) = &deny_cache {
                forget(cache);
            }
            let mut pause = UNCLAIMED_FIRST_PAUSE;
            for _ in 0..UNCLAIMED_TRIES {
                let done = tokio::time::timeout(UNCLAIMED_TIMEOUT, backend.settle_rate(&refund))
                    .await
                    .unwrap_or(Err(Error::Timeout(UNCLAIMED_TIMEOUT)));
                match done {
                    Ok(_) => {
                        if let Some(cache) = &deny_cache {
                            forget(cache);
                        }
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
    /// charge is refunded or settled once, not both. As a settle's
    /// give-back, a token bucket's or GCRA's refund gives nothing while
    /// waiters hold reservations behind the charge or the subject is in
    /// debt (`Ok(false)`, the charge left open for a later try).
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
