//! Settles: correcting an admitted charge to its actual cost, in both
//! directions, exactly once per charge ([`RateLimiter::settle`],
//! [`Settlement`]). A refund is a settle to 0 and takes the same route.

use std::sync::Arc;

use super::charge::key_digest;
use super::{Charge, Decision, DecisionSource, RateLimiter};
use crate::clock::monotonic_micros;
use crate::error::{within, Error, Result};
use crate::failure::is_outage;
use crate::keyspace::Subject;
use crate::quota::Quota;
use crate::store::{Algorithm, SettleRequest};

/// What [`RateLimiter::settle`] did, and the subject's figures after it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settlement {
    /// Whether this call corrected the charge (false: already settled or
    /// refunded, too late, or nothing to do).
    pub applied: bool,
    /// The subject's figures after settling, as a check of cost 0 would see
    /// them (remaining, reset_after, per-quota figures); `allowed` is false
    /// while the subject is in debt.
    pub decision: Decision,
}

/// The settle of `charge` to `actual`, taken under `keys` (its quota keys):
/// its marker sits beside the first key (same hash tag), one per charge,
/// shared by refunds and settles.
pub(super) fn settle_request(
    algorithm: Algorithm,
    quotas: &Arc<[Quota]>,
    max_debt: Option<u64>,
    keys: Vec<String>,
    charge: &Charge,
    actual: u64,
    now_micros: Option<u64>,
) -> SettleRequest {
    // A give-back reaches what still counts: a refund's spans. A debt is
    // owed for as long as the charge or any quota's period could still be
    // counting.
    let spans = algorithm.quota_refund_spans(quotas, charge.cost, charge.span_micros);
    let give_back = spans.iter().copied().fold(charge.span_micros, u64::max);
    let period = quotas.iter().map(|q| q.period_micros()).max().unwrap_or(0);
    let debt = charge.span_micros.max(period);
    let (span_micros, quota_spans_micros) = if actual < charge.cost {
        (give_back, spans)
    } else {
        (debt, Vec::new())
    };
    SettleRequest {
        algorithm,
        marker: format!("{}:r:{:016x}", keys[0], charge.id),
        reset_stamp: reset_stamp_of(&keys),
        keys,
        quotas: Arc::clone(quotas),
        cost: charge.cost,
        actual,
        max_debt,
        now_micros,
        id: charge.id,
        at_micros: charge.at_micros,
        taken_micros: charge.taken_micros,
        span_micros,
        marker_span_micros: give_back.max(debt),
        quota_spans_micros,
    }
}

/// The reset stamp of the subject whose quota keys are `keys`: beside the
/// first (same hash tag), one per limiter and algorithm, as its keys are.
pub(super) fn reset_stamp_of(keys: &[String]) -> String {
    format!("{}:reset", keys[0])
}

impl RateLimiter {
    /// Corrects an admitted charge to `actual` units, exactly once per
    /// charge (a replay changes nothing): for an LLM call, reserve the
    /// estimate with [`check_n`](Self::check_n), then settle to the tokens
    /// the response used.
    ///
    /// Under the estimate, the difference is given back as
    /// [`refund`](Self::refund) gives back (to the window charged, while it
    /// still counts; a bucket while its span lasts). Over it, the subject
    /// goes into debt, at most the limiter's
    /// [`max_debt`](super::RateLimiterBuilder::max_debt) per quota (by
    /// default each quota's capacity), and its checks are refused until the
    /// debt is paid off by time:
    ///
    /// | algorithm | under the estimate | over the estimate |
    /// |---|---|---|
    /// | GCRA | the TAT moves back by the difference's intervals, at most what the schedule still holds of the charge (not before now) | the TAT moves later by the difference's intervals from max(TAT, now), never beyond now + (burst + max_debt) intervals |
    /// | token bucket | the tokens come back, at most those not refilled since (never above the burst) | the tokens go below zero, never below −max_debt |
    /// | fixed window | the window charged gets the difference back | the window current now counts it, never above limit + max_debt |
    /// | sliding window counter | the window charged gets it back (current or previous) | the window current now counts it, never above limit + max_debt |
    /// | sliding window log | the charge's last entries leave the log | entries logged now, never more than limit + max_debt live ones |
    ///
    /// A debt is applied until the longer of the charge's refund span and
    /// the longest quota period has passed since the check; later, and for
    /// a give-back past the refund span, nothing changes
    /// (`applied == false`). A settle to the charge's own cost changes
    /// nothing and leaves the charge open (`applied == false`; a later
    /// settle or refund still applies once). A charge is settled or
    /// refunded once, not both: they share one marker. A charge taken at
    /// or before a [`reset`](Self::reset) of its subject (a reservation:
    /// when it was made, whatever its slot) is not settled either way: its
    /// units went with the reset, and so does its debt.
    ///
    /// On a bucket, a give-back while waiters hold reservations
    /// ([`acquire`](Self::acquire)) behind the charge, or while the subject
    /// is in debt, gives nothing (`applied == false`): the waiters' slots
    /// were fixed by the schedule as it stood, and moving it back would
    /// admit newcomers on top of them. Only the last reservation, given back
    /// before its slot, may return itself. Such a refusal leaves the charge
    /// open: the same give-back, tried again once the waiters have gone,
    /// applies (once). Until then the difference is lost (an
    /// under-admission, never an over-admission).
    ///
    /// The [`Settlement`] carries the subject's figures after settling, as
    /// a check of cost 0 would see them, from the same round trip: what a
    /// response's `RateLimit` headers should say. An operator's block is not
    /// in them (a settle is not refused by one). When something was given
    /// back, the subject leaves the local deny cache.
    ///
    /// Errors: [`Error::InvalidConfig`] for a charge taken for another
    /// subject or by another limiter (nothing changes); a backend failure,
    /// the limiter's timeout, or [`Error::CircuitOpen`] while the circuit
    /// breaker skips a failing backend. The failure policy does not apply,
    /// and retrying is safe. A charge the outage fallback took is settled
    /// on that fallback.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{MemoryBackend, Quota, RateLimiter};
    ///
    /// // 1000 tokens a minute, a burst of 1000.
    /// let tokens = RateLimiter::token_bucket(MemoryBackend::new(), Quota::per_minute(1000))?;
    /// // Reserve the request's max_tokens...
    /// let d = tokens.check_n("key-1", 300).await?;
    /// let charge = d.charge.expect("admitted");
    /// // ...and settle to what the response used.
    /// let s = tokens.settle("key-1", &charge, 120).await?;
    /// assert!(s.applied);
    /// assert_eq!(s.decision.remaining, 880);
    /// assert!(!tokens.settle("key-1", &charge, 120).await?.applied, "exactly once");
    ///
    /// // Over the estimate: the subject owes the difference.
    /// let d = tokens.check_n("key-2", 900).await?;
    /// let s = tokens.settle("key-2", &d.charge.expect("admitted"), 1500).await?;
    /// assert!(s.applied && !s.decision.allowed, "in debt");
    /// assert!(tokens.check("key-2").await?.is_denied());
    /// # Ok(()) }
    /// ```
    pub async fn settle(
        &self,
        subject: impl Into<Subject>,
        charge: &Charge,
        actual: u64,
    ) -> Result<Settlement> {
        self.settle_charge(subject.into(), charge, actual).await
    }

    /// [`settle`](Self::settle), and [`refund`](Self::refund) as a settle to 0.
    pub(super) async fn settle_charge(
        &self,
        subject: Subject,
        charge: &Charge,
        actual: u64,
    ) -> Result<Settlement> {
        let inner = &self.inner;
        if charge.local {
            let Some(fallback) = &inner.fallback else {
                return Err(Error::InvalidConfig(
                    "this charge was taken by another limiter's outage fallback".into(),
                ));
            };
            let own = Charge {
                local: false,
                ..*charge
            };
            let mut settled = Box::pin(fallback.settle_charge(subject, &own, actual)).await?;
            settled.decision.source = DecisionSource::Fallback;
            return Ok(settled);
        }
        let keys = self.keys_for(&subject);
        if key_digest(&keys[0]) != charge.key {
            return Err(Error::InvalidConfig(
                "this charge was taken for another subject or by another limiter".into(),
            ));
        }
        if charge.slice != 0 {
            return self.settle_served(subject, charge, actual).await;
        }
        let gives = actual < charge.cost;
        if let (true, Some(cache)) = (gives, &inner.deny_cache) {
            cache.remove(&keys[0]);
            // A denial of a check already on its way may be decided before
            // the give-back lands and answered after it: not cached.
            cache.forget();
        }
        let now = self.settle_clock();
        let request = settle_request(
            inner.algorithm,
            &inner.quotas,
            inner.max_debt,
            keys,
            charge,
            actual,
            now,
        );
        let done = match inner.backend.settle_rate_now(&request) {
            Some(done) => done,
            // While the circuit is open the backend is skipped, as for a
            // check: the charge stays, and nobody waits a timeout for it.
            None if !inner.breaker.admits() => Err(Error::CircuitOpen),
            None => {
                let done = within(inner.timeout, inner.backend.settle_rate(&request)).await;
                match &done {
                    Err(e) if is_outage(e) => inner.breaker.failure(monotonic_micros()),
                    _ => inner.breaker.success(),
                }
                done
            }
        };
        let policy = inner.keyspace.policy();
        let reply = match done {
            Ok(reply) => reply,
            Err(e) => {
                tracing::warn!(policy, error = %e, "settle failed");
                return Err(e);
            }
        };
        if reply.applied {
            if let (true, Some(cache)) = (gives, &inner.deny_cache) {
                // Again once applied: a denial decided before the settle
                // may have been cached while it was on its way.
                cache.remove(&request.keys[0]);
                cache.forget();
            }
            let direction = if gives { "give_back" } else { "debt" };
            tracing::debug!(policy, subject = %subject.digest(), cost = charge.cost, actual, direction, "settled");
            #[cfg(feature = "metrics")]
            metrics::counter!("tollgate_settles_total", "policy" => policy.to_owned(), "direction" => direction)
                .increment(1);
        } else {
            tracing::debug!(policy, subject = %subject.digest(), cost = charge.cost, actual, "settle not applied: already settled or refunded, too late, or nothing to do");
        }
        let decision = Decision::from_outcomes(
            inner.algorithm,
            &inner.quotas,
            &reply.reply.outcomes,
            reply.reply.allowed,
            DecisionSource::Backend,
        );
        Ok(Settlement {
            applied: reply.applied,
            decision,
        })
    }
}
