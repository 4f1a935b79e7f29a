//! A bound for the in-process item: the least a memory check can cost and
//! still answer what tollgate's `check` promises. The state machine is
//! governor's own keyed GCRA (the cheapest keyed limiter known here), on
//! the clock tollgate's stores read (the OS's monotonic clock) or on
//! governor's default TSC clock; the answer is a `Decision` with its figures
//! and charge — a mirror of tollgate's type, field for field, since that
//! one is built only inside tollgate. No keyspace, no operator-plane block,
//! no deny cache, no breaker: what a check must do besides is left out, so
//! whatever tollgate does costs at least this.

use std::cell::Cell;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::KeyedStateStore;
use governor::{Quota as GQuota, RateLimiter as GLimiter};

/// tollgate's `Quota`, field for field.
#[derive(Clone, Copy)]
struct Quota {
    limit: u64,
    period_us: u64,
    burst: Option<u64>,
}

/// tollgate's `QuotaDecision`, field for field.
#[derive(Clone, Copy)]
struct QuotaDecision {
    quota: Quota,
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after: Duration,
    retry_after: Option<Duration>,
    next_after: Duration,
}

/// tollgate's `Charge`, field for field.
#[derive(Clone, Copy)]
struct Charge {
    cost: u64,
    at_micros: u64,
    id: u64,
    span_micros: u64,
    local: bool,
    key: u64,
    slice: u64,
}

/// tollgate's `QuotaDecisions`: one quota inline, several in a `Vec`.
#[derive(Clone)]
enum QuotaDecisions {
    One(QuotaDecision),
    // Never built here; it sizes the type as tollgate's is sized.
    #[allow(dead_code)]
    Many(Vec<QuotaDecision>),
}

/// tollgate's `Decision`, field for field.
#[derive(Clone)]
pub(crate) struct Decision {
    pub(crate) allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after: Duration,
    retry_after: Option<Duration>,
    quotas: QuotaDecisions,
    source: u8,
    charge: Option<Charge>,
    waited: Duration,
}

impl Decision {
    /// The draft-10 `RateLimit` value of the one quota, named `item` (an
    /// sf-string): written into one buffer of its length, as tollgate's is.
    pub(crate) fn ratelimit_value(&self, item: &str) -> http::HeaderValue {
        let QuotaDecisions::One(q) = &self.quotas else {
            unreachable!("one quota")
        };
        let mut r = itoa::Buffer::new();
        let r = r.format(q.remaining);
        let secs = q.next_after.as_secs() + u64::from(q.next_after.subsec_nanos() > 0);
        let mut t = itoa::Buffer::new();
        let t = t.format(secs);
        let mut value = Vec::with_capacity(item.len() + 6 + r.len() + t.len());
        value.extend_from_slice(item.as_bytes());
        value.extend_from_slice(b";r=");
        value.extend_from_slice(r.as_bytes());
        value.extend_from_slice(b";t=");
        value.extend_from_slice(t.as_bytes());
        http::HeaderValue::from_maybe_shared(bytes::Bytes::from(value)).expect("a valid value")
    }

    /// Reads every field, so that none is optimised away.
    pub(crate) fn touch(&self) -> u64 {
        let q = match &self.quotas {
            QuotaDecisions::One(q) => {
                let quota = q.quota.limit ^ q.quota.period_us ^ q.quota.burst.unwrap_or(0);
                let waits = q.reset_after.as_nanos() ^ q.next_after.as_nanos();
                let retry = q.retry_after.map_or(0, |r| r.as_nanos());
                q.remaining ^ q.limit ^ quota ^ u64::from(q.allowed) ^ (waits ^ retry) as u64
            }
            QuotaDecisions::Many(v) => v.len() as u64,
        };
        let c = self.charge.map_or(0, |c| {
            c.cost ^ c.at_micros ^ c.id ^ c.span_micros ^ c.key ^ c.slice ^ u64::from(c.local)
        });
        q ^ c
            ^ u64::from(self.allowed)
            ^ self.limit
            ^ self.remaining
            ^ self.reset_after.as_nanos() as u64
            ^ self.retry_after.map_or(0, |r| r.as_nanos() as u64)
            ^ u64::from(self.source)
            ^ self.waited.as_nanos() as u64
    }
}

/// A keyed governor limiter that reports its state on admission.
pub(crate) type Sketch<K, S, C> = GLimiter<K, S, C, StateInformationMiddleware>;

/// `per_second` with a burst of as many, on `clock`.
pub(crate) fn sketch<K: Hash + Eq + Clone, C: Clock>(
    per_second: u32,
    clock: C,
) -> Sketch<K, governor::state::keyed::DefaultKeyedStateStore<K>, C> {
    let n = NonZeroU32::new(per_second).expect("non-zero");
    GLimiter::dashmap_with_clock(GQuota::per_second(n).allow_burst(n), clock)
        .with_middleware::<StateInformationMiddleware>()
}

thread_local! {
    /// The charge's id: unique per check, as tollgate's.
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
}

/// One check of `subject`, answered as tollgate's `check` answers: an async
/// call taking the subject by value (as `impl Into<Subject>` does), the
/// figures of the one quota and the charge.
pub(crate) async fn check<K, S, C>(
    limiter: &Sketch<K, S, C>,
    per_second: u64,
    subject: &K,
) -> Option<Decision>
where
    K: Hash + Eq + Clone,
    S: KeyedStateStore<K>,
    C: Clock,
{
    decide(limiter, per_second, subject)
}

/// What [`check`] answers, without the call: the least a check in a
/// response future does. Inlined, so that [`check`] builds its answer in
/// place as it would with this body written out.
#[inline(always)]
pub(crate) fn decide<K, S, C>(
    limiter: &Sketch<K, S, C>,
    per_second: u64,
    subject: &K,
) -> Option<Decision>
where
    K: Hash + Eq + Clone,
    S: KeyedStateStore<K>,
    C: Clock,
{
    let subject = subject.clone();
    let snapshot = limiter.check_key(&subject).ok()?;
    let quota = Quota {
        limit: per_second,
        period_us: 1_000_000,
        burst: None,
    };
    let remaining = u64::from(snapshot.remaining_burst_capacity());
    let reset_micros = (per_second - remaining) * quota.period_us / per_second;
    let reset_after = Duration::from_micros(reset_micros);
    let id = NEXT_ID.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    });
    let per = QuotaDecision {
        quota,
        allowed: true,
        limit: per_second,
        remaining,
        reset_after,
        retry_after: None,
        next_after: Duration::ZERO,
    };
    Some(Decision {
        allowed: true,
        limit: per_second,
        remaining,
        reset_after,
        retry_after: None,
        quotas: QuotaDecisions::One(per),
        source: 0,
        charge: Some(Charge {
            cost: 1,
            at_micros: 0,
            id,
            span_micros: reset_micros,
            local: false,
            key: 0,
            slice: 0,
        }),
        waited: Duration::ZERO,
    })
}
