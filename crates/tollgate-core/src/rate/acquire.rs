//! Waiting for a slot instead of a refusal: [`RateLimiter::acquire`].

use std::time::Duration;

use super::{Charge, Decision, DecisionSource, RateLimiter};
use crate::error::{within, Result};
use crate::keyspace::Subject;

/// The longest wait a store is asked to reserve (µs, about 12 days): the
/// scripts' arithmetic stays exact far below it.
const MOST_WAIT_MICROS: u64 = 1 << 40;

/// With a configured [`Clock`](crate::Clock), how often a waiter reads it
/// again: such a clock may jump (a test's manual clock), so it is polled
/// rather than trusted to run at the speed of the timer.
const CLOCK_POLL: Duration = Duration::from_millis(10);

impl RateLimiter {
    /// Admitted now, or at the earliest instant the quota allows when that
    /// is within `max_wait` (the slot is reserved on the store at decision
    /// time; this future resolves when the slot comes), else the denial with
    /// the honest retry-after. Dropping the future before its slot comes
    /// gives the slot back.
    ///
    /// What each algorithm does:
    /// - **token bucket, GCRA**: one round trip reserves the slot. The store
    ///   takes the cost for the earliest instant every quota admits it (a
    ///   GCRA schedule, a bucket's empty instant, may lie up to `max_wait`
    ///   ahead), so waiters across the fleet are served in the order they
    ///   reserved, at the spacing the quotas allow, and never over-admitted.
    ///   Several quotas: all or nothing, and the wait is the longest of
    ///   theirs (each quota is charged as the request finds it at the slot).
    /// - **fixed window, sliding log, sliding counter**: no reservation. A
    ///   denial whose retry-after fits in what is left of `max_wait` is
    ///   waited out and checked again (a round trip per try): waiters are
    ///   not ordered across the fleet, and one may be refused at a contended
    ///   boundary though a slot came within its wait.
    ///
    /// A subject blocked by an operator ([`block`](Self::block)) whose
    /// block ends within `max_wait` is waited for and checked again; so is
    /// one blocked while a bucket's waiter waited for its slot (at the slot
    /// it reads the block — one round trip, only after a wait — and,
    /// blocked, gives the slot back first). The
    /// local deny cache never refuses a wait that fits: a bucket goes to the
    /// store to reserve, a window waits out the cached retry-after (what the
    /// store would say) without a round trip.
    ///
    /// The returned decision is the admission as it stands at its slot
    /// (remaining, reset and per-quota figures then; its
    /// [`charge`](Decision::charge) counts from the slot). A denial takes
    /// nothing, and its `retry_after` is when a plain check would be
    /// admitted — longer than what is left of `max_wait` (all of it, unless
    /// part was spent waiting for a slot that another caller took).
    ///
    /// The limiter's timeout bounds each round trip, not the wait. On an
    /// outage the failure policy answers as for [`check_n`](Self::check_n),
    /// without waiting (a fallback's denial is returned as it is).
    ///
    /// Cancel-safe: dropped before its slot, the reservation is refunded
    /// (at most once, as any refund, by a task on the current Tokio runtime),
    /// so the next acquire can take it — while it is the last in line. A
    /// waiter that leaves with others reserved behind it keeps its slot
    /// taken (nothing is given back): moving the line's end back would put
    /// the next arrival on the last waiter's slot. That slot passes unused
    /// (an under-admission of its cost, never an over-admission). For the
    /// same reason a [`refund`](Self::refund) or a [`settle`](Self::settle)
    /// under the estimate of a charge with waiters behind it gives nothing.
    ///
    /// Errors: as [`check_n`](Self::check_n) ([`Error::CostExceedsCapacity`](crate::Error::CostExceedsCapacity)
    /// before any round trip, an outage under [`FailurePolicy::Deny`](crate::FailurePolicy::Deny), …).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use std::time::Duration;
    /// use tollgate::{MemoryBackend, Quota, RateLimiter};
    ///
    /// // 20 a second, one at a time: a slot every 50 ms.
    /// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_second(20).with_burst(1)?)?;
    /// assert!(limiter.acquire("alice", 1, Duration::ZERO).await?.allowed);
    /// // The next slot is 50 ms away: refused without a wait, admitted with one.
    /// assert!(limiter.acquire("alice", 1, Duration::from_millis(10)).await?.is_denied());
    /// assert!(limiter.acquire("alice", 1, Duration::from_millis(100)).await?.allowed);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(
        &self,
        subject: impl Into<Subject>,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision> {
        let subject = subject.into();
        let micros = |t: Duration| u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
        let until = self.local_now().saturating_add(micros(max_wait));
        let mut waited = Duration::ZERO;
        loop {
            let left = until.saturating_sub(self.local_now());
            let mut d = self
                .check_for_slot(&subject, cost, left.min(self.most_wait()))
                .await?;
            // The store's reply says how far ahead a reservation's slot is;
            // the decision says how long this acquire waited in all.
            let slot_in = std::mem::replace(&mut d.waited, waited);
            if d.allowed {
                if slot_in.is_zero() {
                    return Ok(d);
                }
                let held = Held {
                    limiter: self,
                    subject: &subject,
                    charge: d.charge,
                };
                // On a configured clock the slot is an instant of it (the
                // charge's); else the wait runs from the reply, never early.
                let slot = d.charge.filter(|_| self.inner.clock.is_some());
                match slot {
                    Some(c) => self.wait_for_clock(c.at_micros()).await,
                    None => self.wait(slot_in).await,
                }
                waited += slot_in;
                // A block set while it waited (an operator, or an upstream's
                // stop learnt by another instance) holds at its slot too: the
                // slot goes back, and the block is waited out or refused.
                if self.blocked_at_slot(&subject).await {
                    held.give_back().await;
                    continue;
                }
                held.keep();
                d.waited = waited;
                return Ok(d);
            }
            // Only the store's own refusals are waited out: a failure
            // policy's answer is final, as for a check.
            if !matches!(
                d.source,
                DecisionSource::Backend | DecisionSource::DenyCache
            ) {
                return Ok(d);
            }
            match d.retry_after {
                Some(retry) if micros(retry) <= until.saturating_sub(self.local_now()) => {
                    self.wait(retry).await;
                    waited += retry;
                }
                _ => return Ok(d),
            }
        }
    }

    /// The longest wait a store is asked to reserve (µs): 2^40, and no
    /// further than 2^51 units of any quota's 1/per µs, so that a reserved
    /// instant is read back (none is read 2^52 units or more from now).
    pub(super) fn most_wait(&self) -> u64 {
        let inner = &self.inner;
        inner
            .quotas
            .iter()
            .map(|q| (1u64 << 51) / inner.algorithm.params(q).1.per_micro.max(1))
            .fold(MOST_WAIT_MICROS, u64::min)
    }

    /// Whether `subject` is blocked now, on a store that holds blocks (one
    /// read of its block key, bounded by the limiter's timeout); a failed
    /// read keeps the reserved slot.
    async fn blocked_at_slot(&self, subject: &Subject) -> bool {
        if !self
            .inner
            .operated
            .as_ref()
            .is_some_and(|op| op.store.may_block())
        {
            return false;
        }
        // Bounded as every round trip of a check: a store that hangs lets
        // the slot be kept, not the waiter hang.
        match within(self.inner.timeout, self.blocked_for(subject)).await {
            Ok(left) => left.is_some(),
            Err(e) => {
                tracing::debug!(policy = self.inner.keyspace.policy(), error = %e, "could not read the block at a reserved slot");
                false
            }
        }
    }

    /// Waits `span` on the limiter's time: the timer, or a configured clock
    /// read until it has moved on that far (never earlier).
    async fn wait(&self, span: Duration) {
        let Some(clock) = &self.inner.clock else {
            tokio::time::sleep(span).await;
            return;
        };
        let micros = u64::try_from(span.as_micros()).unwrap_or(u64::MAX);
        self.wait_for_clock(clock.now_micros().saturating_add(micros))
            .await;
    }

    /// Waits until the configured clock reads `until` (at once without one).
    async fn wait_for_clock(&self, until: u64) {
        let Some(clock) = &self.inner.clock else {
            return;
        };
        loop {
            let now = clock.now_micros();
            if now >= until {
                return;
            }
            let left = Duration::from_micros(until - now);
            tokio::time::sleep(left.min(CLOCK_POLL)).await;
        }
    }
}

/// A reservation not yet come: dropped before [`keep`](Held::keep), it
/// refunds its charge.
struct Held<'a> {
    limiter: &'a RateLimiter,
    subject: &'a Subject,
    charge: Option<Charge>,
}

impl Held<'_> {
    /// The slot came: the charge stays.
    fn keep(mut self) {
        self.charge = None;
    }

    /// The slot came during a block: given back now, before waiting on.
    /// The charge stays held until the refund has answered: dropped
    /// meanwhile, the guard sends it again (a charge is refunded once).
    async fn give_back(mut self) {
        let Some(charge) = self.charge else {
            return;
        };
        if let Err(e) = self.limiter.refund(self.subject.clone(), &charge).await {
            tracing::warn!(policy = self.limiter.keyspace().policy(), error = %e, "a slot that came during a block could not be given back");
        }
        self.charge = None;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(charge) = self.charge.take() else {
            return;
        };
        // Without a runtime (it is shutting down) nothing can be sent: the
        // slot then passes unused.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (limiter, subject) = (self.limiter.clone(), self.subject.clone());
        runtime.spawn(async move {
            if let Err(e) = limiter.refund(subject, &charge).await {
                tracing::warn!(policy = limiter.keyspace().policy(), error = %e, "a dropped waiter's slot could not be given back");
            }
        });
    }
}
