//! A limiter under the operator plane: it registers itself, hears admin
//! actions (forgetting what it cached about a subject), counts whom it
//! throttles, and offers the actions themselves on the plain API
//! ([`RateLimiter::inspect`], [`reset`](RateLimiter::reset),
//! [`block`](RateLimiter::block), [`unblock`](RateLimiter::unblock)).

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::lease::Revocation;
use super::limiter::{Inner, Operated, BLOCK_KIND};
use super::settle::reset_stamp_of;
use super::RateLimiter;
use crate::error::{within, Error, Result};
use crate::keyspace::Subject;
use crate::plane::notices::{Action, Notice, Notices};
use crate::plane::registry::keep_registered;
use crate::plane::views::{LimiterInfo, QuotaInfo, Registered, SubjectState};
use crate::store::{Quotas, RateRequest, ALIVE, EVERYTHING};

/// The longest block [`RateLimiter::block`] and the operator's tools take
/// (366 days): longer is a typo, not a policy.
pub const LONGEST_BLOCK: Duration = Duration::from_secs(366 * 24 * 3600);

impl RateLimiter {
    /// The key that blocks `subject` on this limiter (same hash tag as its
    /// quota keys).
    pub fn block_key_for(&self, subject: &Subject) -> String {
        self.inner.keyspace.key_of(BLOCK_KIND, subject, None)
    }

    /// The time a settle of this limiter reads as now (µs): its own clock's,
    /// else `None` (the store's), as a reset's stamp must be.
    pub(super) fn settle_clock(&self) -> Option<u64> {
        self.inner.clock.as_ref().map(|c| c.now_micros())
    }

    /// How long after a reset a charge taken before it may still be
    /// settled, at most — every quota's longest horizon (two periods for
    /// the sliding counter, the time to refill a whole bucket), after a
    /// bucket's longest reservation (its slot may lie that far ahead of
    /// the reset) — and a second more: how long a reset's stamp lives.
    fn settle_horizon(&self) -> Duration {
        let inner = &self.inner;
        let longest = inner.quotas.iter().map(|q| {
            let refill = u128::from(inner.algorithm.capacity(q)) * u128::from(q.period_micros())
                / u128::from(q.limit().max(1));
            u128::from(q.period_micros()).saturating_mul(2).max(refill)
        });
        let micros = u64::try_from(longest.max().unwrap_or(0)).unwrap_or(u64::MAX);
        let reserved = if inner.algorithm.uses_burst() {
            self.most_wait()
        } else {
            0
        };
        Duration::from_micros(micros.saturating_add(reserved))
            .saturating_add(Duration::from_secs(1))
    }

    /// Joins the operator plane of its store, if the store has one:
    /// registers (once, in the background), watches the admin channel and
    /// starts flushing its throttled list.
    pub(super) fn operate(&self, register_it: bool) {
        let inner = &self.inner;
        let Some(op) = &inner.operated else { return };
        // The operator plane's own rebuilt limiters and local fallbacks
        // neither register, tally nor listen (their owner does): they only
        // honour blocks, which every check reads from the store.
        if !register_it {
            return;
        }
        let prefix = inner.keyspace.prefix().to_owned();
        let alive: Weak<Inner> = Arc::downgrade(inner);
        keep_registered(
            Arc::clone(&op.store),
            prefix,
            Registered::Limiter(describe(self)),
            move || alive.strong_count() > 0,
        );
        op.tally.start(
            Arc::clone(&op.store),
            inner.keyspace.prefix(),
            inner.keyspace.policy(),
        );
        let notices = Notices::of(inner.keyspace.prefix());
        let me: Weak<Inner> = Arc::downgrade(inner);
        op.store.watch(
            &notices.channel,
            &notices.version_key,
            Arc::new(move |message| match me.upgrade() {
                Some(_) if message == ALIVE => true,
                Some(inner) => {
                    RateLimiter { inner }.hear(message);
                    true
                }
                None => false,
            }),
        );
    }

    /// Forgets what this instance cached about the subject a message names
    /// (everything, when messages may have been missed).
    fn hear(&self, message: &str) {
        let inner = &self.inner;
        if let Some(cache) = &inner.deny_cache {
            cache.forget();
        }
        if message == EVERYTHING {
            if let Some(cache) = &inner.deny_cache {
                cache.clear();
            }
            // Whatever was missed may have been a reset or a block.
            if let Some(leases) = &inner.leases {
                leases.revoke(None, Revocation::Unknown);
            }
            return;
        }
        let Some(notice) = Notice::parse(message) else {
            return;
        };
        if notice.limiter != inner.keyspace.policy() {
            return;
        }
        let Ok(subject) = Subject::from_encoded(&notice.subject) else {
            return;
        };
        if let Some(cache) = &inner.deny_cache {
            cache.remove(&self.keys_for(&subject)[0]);
        }
        // A reset or block ends the subject's quota leases; an unblock
        // leaves none to end.
        if let (Some(leases), Some(why)) = (&inner.leases, revocation(notice.action)) {
            leases.revoke(Some(&subject), why);
        }
        // The local fallback decides while the store is down: it gets the
        // same reset or block (its store is in process: done at once).
        if let Some(fallback) = &inner.fallback {
            if let Some(store) = fallback.inner.backend.admin() {
                let block = fallback.block_key_for(&subject);
                let keys = fallback.keys_for(&subject);
                use futures_util::FutureExt;
                match (notice.action, notice.millis) {
                    (Action::Reset, _) => {
                        let stamp = reset_stamp_of(&keys);
                        let (now, ttl) = (fallback.settle_clock(), fallback.settle_horizon());
                        drop(store.reset(&keys, &stamp, now, ttl).now_or_never());
                    }
                    (Action::Block, Some(ms)) => {
                        let block = store.set_block(&block, Duration::from_millis(ms), false);
                        drop(block.now_or_never());
                    }
                    (Action::Block, None) | (Action::Unblock, _) => {
                        drop(store.unblock(&block).now_or_never())
                    }
                }
            }
        }
        tracing::debug!(policy = inner.keyspace.policy(), subject = %subject.digest(), action = ?notice.action, "heard an admin action");
    }

    /// Ends this instance's quota leases of `subject` at once (the others
    /// hear the action's message).
    fn revoke_leases(&self, subject: &Subject, why: Revocation) {
        if let Some(leases) = &self.inner.leases {
            leases.revoke(Some(subject), why);
        }
    }

    fn operated(&self) -> Result<&Operated> {
        self.inner.operated.as_ref().ok_or_else(|| {
            Error::InvalidConfig(format!(
                "the {} store has no operator plane",
                self.inner.backend.kind()
            ))
        })
    }

    async fn announce(
        &self,
        action: Action,
        subject: &Subject,
        block: Option<Duration>,
    ) -> Result<()> {
        let notices = Notices::of(self.inner.keyspace.prefix());
        let notice = Notice {
            action,
            limiter: self.inner.keyspace.policy().to_owned(),
            subject: subject.as_encoded().to_owned(),
            millis: block.map(|b| u64::try_from(b.as_millis()).unwrap_or(u64::MAX).max(1)),
        };
        tracing::info!(policy = self.inner.keyspace.policy(), subject = subject.as_encoded(), action = ?action, "admin action");
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tollgate_admin_actions_total",
            "policy" => self.inner.keyspace.policy().to_owned(),
            "action" => notice.action.name(),
        )
        .increment(1);
        let store = &self.operated()?.store;
        self.within(store.announce(&notices.channel, &notices.version_key, &notice.to_message()))
            .await
    }

    /// One round trip of an admin action, bounded by the limiter's timeout
    /// or the store's action timeout (5 s), whichever is longer: an operator's request
    /// may wait longer than a check.
    async fn within<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        within(self.inner.timeout.max(crate::store::ACTION_TIMEOUT), call).await
    }

    /// Runs an admin action in a span of its own (OpenTelemetry exports it
    /// through `tracing-opentelemetry`).
    async fn traced<T>(
        &self,
        action: Action,
        subject: &Subject,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "tollgate.admin",
            action = action.name(),
            policy = self.inner.keyspace.policy(),
            subject = subject.as_encoded(),
        );
        work.instrument(span).await
    }

    /// What the store holds for `subject` now: units left, when one more
    /// could be admitted, when every quota is full, and a block's end.
    /// Takes nothing.
    pub async fn inspect(&self, subject: &Subject) -> Result<SubjectState> {
        // A store without an operator plane is refused before any read.
        self.operated()?;
        let d = self.peek(subject).await?;
        let left = self.blocked_for(subject).await?;
        let limit = d
            .quotas
            .iter()
            .min_by_key(|q| q.remaining)
            .map_or(0, |q| q.limit);
        // Until every quota is full: the latest reset of those that are not
        // (a full quota has nothing to reset; a log reports its period as
        // the reset of a cost-0 check on an empty log).
        let reset = d
            .quotas
            .iter()
            .filter(|q| q.remaining < q.limit)
            .map(|q| q.reset_after)
            .max()
            .unwrap_or(Duration::ZERO);
        let ms = |t: Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
        // Until one more unit: the latest of the empty quotas' next units.
        let next_unit = d
            .quotas
            .iter()
            .filter(|q| q.remaining == 0)
            .map(|q| q.next_after.max(Duration::from_micros(1)))
            .max();
        let retry = match (next_unit, left) {
            (r, Some(l)) => Some(r.map_or(l, |r| r.max(l))),
            (r, None) => r,
        };
        Ok(SubjectState {
            limiter: self.inner.keyspace.policy().to_owned(),
            subject: subject.as_encoded().to_owned(),
            remaining: d.remaining,
            limit,
            retry_after_ms: retry.map(|r| ms(r).max(1)),
            reset_after_ms: ms(reset),
            blocked_until_ms: left.map(|l| epoch_ms().saturating_add(ms(l).max(1))),
        })
    }

    /// How long `subject` stays blocked ([`block`](Self::block)), `None`
    /// when it is not: one read of its block key, on the store's clock.
    pub async fn blocked_for(&self, subject: &Subject) -> Result<Option<Duration>> {
        let store = Arc::clone(&self.operated()?.store);
        self.within(store.block_left(&self.block_key_for(subject)))
            .await
    }

    /// Gives `subject` its whole quota back (every instance forgets its
    /// cached denials within a round trip — limiters on this backend or
    /// its clones before this returns — or [`VERSION_POLL`](crate::store::VERSION_POLL)
    /// if it missed the message). A block stays.
    pub async fn reset(&self, subject: &Subject) -> Result<()> {
        self.traced(Action::Reset, subject, async {
            let store = Arc::clone(&self.operated()?.store);
            let keys = self.keys_for(subject);
            let stamp = reset_stamp_of(&keys);
            let (now, ttl) = (self.settle_clock(), self.settle_horizon());
            let written = self.within(store.reset(&keys, &stamp, now, ttl)).await;
            // A write that failed may have landed all the same: the leases
            // go and the others are told whatever its reply said.
            self.revoke_leases(subject, Revocation::Reset);
            let told = self.announce(Action::Reset, subject, None).await;
            written.and(told)
        })
        .await
    }

    /// Refuses `subject` for `duration` whatever its quota holds, on every
    /// instance (with a `Retry-After` of the block's end); a later block
    /// replaces this one. A duration of zero or over a year is refused
    /// with [`Error::InvalidConfig`].
    pub async fn block(&self, subject: &Subject, duration: Duration) -> Result<()> {
        self.set_block(subject, duration, false).await
    }

    /// [`block`](Self::block) for at least `duration`: a block in place
    /// that ends later stays as it is. What pacing an upstream asks for:
    /// a later, shorter wait must not lift an earlier, longer one.
    pub async fn block_at_least(&self, subject: &Subject, duration: Duration) -> Result<()> {
        self.set_block(subject, duration, true).await
    }

    async fn set_block(&self, subject: &Subject, duration: Duration, at_least: bool) -> Result<()> {
        if duration.is_zero() || duration > LONGEST_BLOCK {
            return Err(Error::InvalidConfig(format!(
                "a block of {duration:?}: between 1 ms and a year"
            )));
        }
        self.traced(Action::Block, subject, async {
            let store = Arc::clone(&self.operated()?.store);
            let key = self.block_key_for(subject);
            // Instances copy the block into their local fallback as told:
            // told the block in force, a longer one kept stays longer there.
            let written = self.within(store.set_block(&key, duration, at_least)).await;
            // As for a reset: a failed write may have landed.
            self.revoke_leases(subject, Revocation::Block);
            let in_force = *written.as_ref().unwrap_or(&duration);
            let told = self.announce(Action::Block, subject, Some(in_force)).await;
            written.and(told)
        })
        .await
    }

    /// Lifts a block of `subject` on every instance.
    pub async fn unblock(&self, subject: &Subject) -> Result<()> {
        self.traced(Action::Unblock, subject, async {
            let store = Arc::clone(&self.operated()?.store);
            self.within(store.unblock(&self.block_key_for(subject)))
                .await?;
            self.announce(Action::Unblock, subject, None).await
        })
        .await
    }
}

impl RateLimiter {
    /// A check of cost 0 by the store itself (no cache, no breaker, no
    /// block): the figures as they stand.
    async fn peek(&self, subject: &Subject) -> Result<super::Decision> {
        let inner = &self.inner;
        let request = RateRequest {
            algorithm: inner.algorithm,
            keys: self.keys_for(subject),
            quotas: Quotas::of(&inner.quotas),
            cost: 0,
            now_micros: inner.clock.as_ref().map(|c| c.now_micros()),
            store_clock: false,
            nonce: super::charge::next_id(),
            max_wait_micros: 0,
            deadline: None,
            unclaimed: None,
        };
        let reply = match inner.backend.check_rate_now(&request) {
            Some(reply) => reply?,
            // An operator's read: bounded as the other actions are.
            None => self.within(inner.backend.check_rate(&request)).await?,
        };
        if reply.outcomes.len() != inner.quotas.len() {
            return Err(Error::Protocol(format!(
                "{} outcomes for {} quotas",
                reply.outcomes.len(),
                inner.quotas.len()
            )));
        }
        Ok(super::Decision::from_outcomes(
            inner.algorithm,
            &inner.quotas,
            &reply.outcomes,
            reply.allowed,
            super::DecisionSource::Backend,
        ))
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The description of `limiter`, as the registry holds it.
fn describe(limiter: &RateLimiter) -> LimiterInfo {
    LimiterInfo {
        name: limiter.keyspace().policy().to_owned(),
        algorithm: limiter.algorithm().long_name().to_owned(),
        quotas: limiter
            .quotas()
            .iter()
            .map(|q| QuotaInfo {
                limit: q.limit(),
                period_seconds: q.period_micros().div_ceil(1_000_000),
                period_micros: q.period_micros(),
                burst: q.burst(),
            })
            .collect(),
        traffic: None,
    }
}

/// What an admin action does to its subject's quota leases, if anything.
fn revocation(action: Action) -> Option<Revocation> {
    match action {
        Action::Reset => Some(Revocation::Reset),
        Action::Block => Some(Revocation::Block),
        Action::Unblock => None,
    }
}
