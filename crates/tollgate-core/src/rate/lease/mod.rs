//! Quota leases ([`QuotaLeases`]): an instance that sees a subject often
//! takes a slice of its quota from the store in one call and answers that
//! subject's checks from it, in process, until the slice is used up or ages
//! out; then it gives back what it did not use.
//!
//! The slice's units were taken on the store before any is served (by the
//! algorithm's own check, for that many units), so the fleet never admits
//! more than the limiter would. What it may under-admit is bounded by the
//! units held in slices: a slice of `L` units held for up to
//! [`max_age`](QuotaLeases::max_age) keeps those units from every other
//! instance meanwhile, and units a slice still held when its instance lost
//! the store, or that the process took with it (it exited without
//! [`RateLimiter::return_leases`]; dropping the limiter gives them back in
//! the background, best effort), are not given back — they come back as
//! the quota refills or its window ends.
//!
//! A unit is used later than it was taken (up to the slice's age): a burst
//! shifts by at most `max_age`. For the buckets, the admissions up to any
//! instant still never exceed the burst plus what refilled since the first
//! take; a fixed window's slice never outlives the window it was counted in,
//! so no window admits more than its limit. The sliding windows are refused
//! at build ([`Error::InvalidConfig`](crate::Error::InvalidConfig)): they count
//! a unit from the instant it was taken, and serving it later could put more
//! than the limit into some period-long window.

mod book;
mod revoke;
mod sending;
mod take;

use std::time::Duration;

pub(super) use book::{InSlice, Leases};
pub(super) use revoke::Revocation;
pub(super) use take::Taking;

use futures_util::future::BoxFuture;

use book::Served;

use super::{Charge, Decision, RateLimiter, Settlement};
use crate::error::{Error, Result};
use crate::keyspace::Subject;
use crate::store::{Algorithm, RateBackend, RateReply, RateRequest};

/// How a limiter leases quota for its hot subjects (opt in with
/// [`RateLimiterBuilder::quota_leases`](super::RateLimiterBuilder::quota_leases)).
///
/// A subject is hot on an instance when it sees at least
/// [`hot_checks`](Self::hot_checks) of its checks within one 100 ms window;
/// a cold subject never leases. A hot subject's slice is its local rate ×
/// [`target`](Self::target), at most 1/[`max_share`](Self::max_share) of its
/// smallest quota's capacity; the store grants what is available up to that
/// when it is at least a quarter of it, else the call is the check's own
/// (its cost, its decision and retry-after; no slice). A slice serves for at most
/// [`max_age`](Self::max_age), and a fixed window's never past the end of
/// the window its units were counted in.
///
/// A decision served from a slice reports what this instance knows:
/// `remaining` is the units left in its slice, `reset_after` and the
/// quotas' `next_after` are the store's figures as of the take, less the
/// time since; its source is [`DecisionSource::Lease`](super::DecisionSource::Lease).
/// Its charge names the slice: while the slice lives, a
/// [`refund`](RateLimiter::refund) or a settle under the charge puts the
/// units back into it, a settle over the charge takes the difference from
/// it, and what the slice does not hold is owed to the store (a debt, at
/// most [`max_debt`](super::RateLimiterBuilder::max_debt)) when it ends.
/// Once the slice has ended, a settle over the charge is a debt on the
/// store at once, and a give-back is dropped (`applied == false`: an
/// under-admission, never an over-admission). Each served charge is
/// settled at most once, whether its slice lives or has ended: a settle
/// replayed after its slice ended is refused as long as a settle could
/// still apply on the store (for up to 4 096 ended slices that settled
/// charges at once; past that, the oldest may be settled again).
///
/// A check whose take installs no slice (too few units were available: it
/// was an ordinary check of its cost) carries its own charge on the store,
/// as without leases; so does any check decided by the failure policy.
/// [`acquire`](RateLimiter::acquire) never leases nor is served from a
/// slice: its wait and order are the store's.
///
/// A slice taken over a round trip (Redis) is given back by a timer set
/// when it was taken, even when no check comes after it; and, on every
/// store, once per 100 ms window by whichever check comes next (any
/// subject's), which also makes idle trackers evictable. A give-back not yet
/// sent when a reset of its subject (or a possibly missed message) is
/// heard is skipped (the store may have been reset since the take); a
/// block leaves it to land. One already sent when a reset
/// lands may still be applied after it, and a fixed window may then admit
/// up to that slice's unused units more in the window of the reset.
///
/// An operator's reset or block ends the subject's slices on every
/// instance: after a reset nothing of them goes back (the store forgot
/// what they took and owe); after a block, which leaves the quota counted,
/// their unused units go back and their debts are charged. A take still
/// on its way when either lands installs no slice: after a block what it
/// took beyond its check goes back the same way. A possibly
/// missed admin message (it may have been a reset) ends every slice: its
/// debts are charged, its unused units are not given back.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::{Algorithm, MemoryBackend, Quota, QuotaLeases, RateLimiter};
///
/// let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
///     .quota(Quota::per_second(10_000))
///     .quota_leases(QuotaLeases::default().max_age(Duration::from_millis(200)))
///     .build()?;
/// assert!(limiter.check("hot").await?.allowed);
/// limiter.return_leases().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaLeases {
    hot_checks: u32,
    target: Duration,
    max_age: Duration,
    max_share: u32,
    subjects: usize,
}

impl Default for QuotaLeases {
    /// 20 checks in 100 ms make a subject hot; a slice for 50 ms of its
    /// rate, at most 1/8 of the capacity, for at most 250 ms; 4096
    /// subjects tracked.
    fn default() -> Self {
        QuotaLeases {
            hot_checks: 20,
            target: Duration::from_millis(50),
            max_age: Duration::from_millis(250),
            max_share: 8,
            subjects: 4096,
        }
    }
}

impl QuotaLeases {
    /// Checks of one subject within a 100 ms window that make it hot
    /// (at least 1).
    pub fn hot_checks(mut self, checks: u32) -> Self {
        self.hot_checks = checks.max(1);
        self
    }

    /// How long a slice should last at the subject's local rate.
    pub fn target(mut self, target: Duration) -> Self {
        self.target = target;
        self
    }

    /// The longest a slice serves (then its unused units are given back).
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// A slice takes at most 1/`share` of the smallest quota's capacity
    /// (at least 1).
    pub fn max_share(mut self, share: u32) -> Self {
        self.max_share = share.max(1);
        self
    }

    /// The most subjects whose rate an instance tracks (memory stays
    /// bounded; a subject beyond it is checked as a cold one).
    pub fn tracked_subjects(mut self, subjects: usize) -> Self {
        self.subjects = subjects.max(1);
        self
    }

    /// Refuses what cannot lease: the sliding windows, a zero age.
    pub(super) fn validate(&self, algorithm: Algorithm) -> Result<()> {
        if !matches!(
            algorithm,
            Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::Gcra
        ) {
            return Err(Error::InvalidConfig(format!(
                "quota leases need a token bucket, GCRA or fixed window, not the {algorithm}: a sliding window counts a unit from when it was taken, so serving it later could admit more than the limit in some period"
            )));
        }
        if self.max_age.is_zero() || self.target.is_zero() {
            return Err(Error::InvalidConfig(
                "quota leases need a non-zero target and max_age".into(),
            ));
        }
        Ok(())
    }
}

impl RateLimiter {
    /// [`settle`](RateLimiter::settle) of a charge served from a slice: in
    /// the slice while it lives; after, a settle over the charge owes the
    /// difference on the store (a fresh charge of 0 units under the served
    /// charge's id, so a replay is refused there), and a give-back is a
    /// settle that changes nothing (the subject's figures only).
    pub(super) async fn settle_served(
        &self,
        subject: Subject,
        charge: &Charge,
        actual: u64,
    ) -> Result<Settlement> {
        let Some(leases) = &self.inner.leases else {
            return Err(Error::InvalidConfig(
                "this charge was served from another limiter's quota lease".into(),
            ));
        };
        let replayed = match leases.settle_in_slice(&subject, charge, actual, self.cache_now()) {
            InSlice::Settled(done) => return Ok(done),
            InSlice::SettledBefore => true,
            InSlice::Ended => false,
        };
        let owed = Charge {
            cost: 0,
            slice: 0,
            ..*charge
        };
        if replayed {
            // The store's figures (a settle that changes nothing), refused.
            let mut done = Box::pin(self.settle_charge(subject, &owed, 0)).await?;
            done.applied = false;
            return Ok(done);
        }
        let more = actual.saturating_sub(charge.cost);
        Box::pin(self.settle_charge(subject, &owed, more)).await
    }

    /// Answers a check from `subject`'s live slice (`Ok`), or tells whether
    /// the subject is hot enough to lease, with the local time it was
    /// looked up at (`Err`; 0 without leases), for [`begin_lease`](Self::begin_lease).
    pub(super) fn serve_leased(
        &self,
        subject: &Subject,
        cost: u64,
        max_wait_micros: u64,
    ) -> std::result::Result<Decision, (bool, u64)> {
        match &self.inner.leases {
            Some(leases) => {
                let now = self.cache_now();
                match leases.serve(self, subject, cost, max_wait_micros, now) {
                    Served::Yes(d) => Ok(d),
                    Served::No { hot } => Err((hot, now)),
                }
            }
            None => Err((false, 0)),
        }
    }

    /// The take a hot subject's check makes, if any (see [`Leases::begin`]),
    /// at `now`: the local time [`serve_leased`](Self::serve_leased) read.
    pub(super) fn begin_lease(
        &self,
        hot: bool,
        subject: &Subject,
        cost: u64,
        now: u64,
    ) -> Option<Taking> {
        let leases = self.inner.leases.as_ref().filter(|_| hot)?;
        leases.begin(subject, cost, now)
    }
}

/// A check's call at once on a store in process: the take when it leases.
pub(super) fn check_now(
    lease: &Option<Taking>,
    backend: &dyn RateBackend,
    request: &RateRequest,
) -> Option<Result<RateReply>> {
    match lease {
        Some(taking) => taking.call_now(backend, request),
        None => backend.check_rate_now(request),
    }
}

/// A check's round trip: the take when it leases.
pub(super) fn check<'a>(
    lease: &'a Option<Taking>,
    backend: &'a dyn RateBackend,
    request: &'a RateRequest,
) -> BoxFuture<'a, Result<RateReply>> {
    match lease {
        Some(taking) => taking.call(backend, request),
        None => backend.check_rate(request),
    }
}

impl RateLimiter {
    /// Gives back the unused units of every quota lease this instance holds
    /// (one settle per slice), and waits for them and for the give-backs
    /// already on their way (a revoked or aged slice's): call it before the
    /// process stops. Without leases, does nothing. A slice that cannot be
    /// given back (the store is down) is dropped; its units return as the
    /// quota refills.
    pub async fn return_leases(&self) {
        if let Some(leases) = &self.inner.leases {
            leases.return_all(self).await;
        }
    }
}
