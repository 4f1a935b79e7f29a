//! [`Pace`]: the service, and what all its clones share: taking a slot of
//! the budget before a call, and learning from the call's response.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::response::Parts;
use http::{Request, Response, StatusCode};
use tollgate_core::{Charge, Decision, Error, RateLimiter, Subject};
use tower_service::Service;

use super::error::{Throttled, Unavailable};
use super::future::ResponseFuture;
use super::learn::upstream_wait;
use crate::body::BoxError;
use crate::key::{GlobalKey, KeyExtractor};
use crate::middleware::take_readied;
use crate::rate_limit::RequestCost;

/// How long setting a block may hold a response back: a store that does
/// not answer must not hold every call.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// Reads a response's actual cost (a type-erased
/// [`ResponseCost`](crate::rate_limit::ResponseCost)).
pub(crate) type SettleFrom = Arc<dyn Fn(&Parts) -> Option<u64> + Send + Sync>;

/// What every service made by one layer shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) limiter: RateLimiter,
    pub(crate) max_wait: Duration,
    pub(crate) learn: bool,
    pub(crate) max_block: Duration,
    pub(crate) settle_from: Option<SettleFrom>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pace")
            .field("limiter", &self.limiter)
            .field("max_wait", &self.max_wait)
            .field("learn", &self.learn)
            .field("max_block", &self.max_block)
            .field("settle_from", &self.settle_from.is_some())
            .finish()
    }
}

/// A call that took its slot: what learning from its response needs.
pub(crate) struct Slot {
    pub(crate) shared: Arc<Shared>,
    pub(crate) subject: Subject,
    pub(crate) charge: Option<Charge>,
}

impl Shared {
    fn policy(&self) -> &str {
        self.limiter.keyspace().policy()
    }

    /// Waits for a slot of `cost` units for `subject`, up to `max_wait`:
    /// the charge taken (`None` when nothing was: a cost of 0, or an
    /// outage the failure policy let through), or the error that stops the
    /// call.
    pub(crate) async fn take_slot(
        &self,
        subject: &Subject,
        cost: u64,
    ) -> Result<Option<Charge>, BoxError> {
        // One round trip: a slot now, or the earliest within the wait
        // (reserved, then waited for; a block set meanwhile — by another
        // instance that heard the upstream say stop — holds at the slot
        // too), or a refusal.
        let d = self.acquire(subject, cost, self.max_wait).await?;
        if !d.allowed {
            return Err(self.throttled(subject, cost, d.retry_after));
        }
        Ok(self.admitted(subject, cost, d))
    }

    /// The limiter's acquire, its errors as the call's.
    async fn acquire(
        &self,
        subject: &Subject,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, BoxError> {
        match self.limiter.acquire(subject.clone(), cost, max_wait).await {
            Ok(d) => Ok(d),
            Err(e @ Error::CostExceedsCapacity { .. }) => {
                tracing::info!(
                    target: "tollgate_tower::pace",
                    policy = self.policy(), subject = %subject.digest(), cost, error = %e,
                    "call refused: it costs more than the budget holds"
                );
                Err(Throttled::new(None).into())
            }
            Err(e) => {
                tracing::warn!(
                    target: "tollgate_tower::pace",
                    policy = self.policy(), subject = %subject.digest(), cost, error = %e,
                    "call refused: the budget is unavailable"
                );
                Err(Unavailable::new(e).into())
            }
        }
    }

    fn admitted(&self, subject: &Subject, cost: u64, decision: Decision) -> Option<Charge> {
        tracing::debug!(
            target: "tollgate_tower::pace",
            policy = self.policy(), subject = %subject.digest(), cost,
            remaining = decision.remaining, "call admitted"
        );
        decision.charge
    }

    fn throttled(&self, subject: &Subject, cost: u64, wait: Option<Duration>) -> BoxError {
        tracing::info!(
            target: "tollgate_tower::pace",
            policy = self.policy(), subject = %subject.digest(), cost,
            retry_after = ?wait, "call throttled: no slot within the wait allowed"
        );
        Throttled::new(wait).into()
    }
}

/// What a response taught: how long to block the budget, what the call
/// really cost.
pub(crate) struct Lesson {
    status: StatusCode,
    /// The wait the upstream asked for, and the block it sets (capped).
    block: Option<(Duration, Duration)>,
    actual: Option<(Charge, u64)>,
}

impl Slot {
    /// What the response `res` says, if anything is to be done about it.
    pub(crate) fn lesson(&self, res: &Parts) -> Option<Lesson> {
        let shared = &self.shared;
        let block = shared
            .learn
            .then(|| upstream_wait(res, SystemTime::now()))
            .flatten()
            .map(|wait| (wait, wait.min(shared.max_block)));
        let actual = match (&shared.settle_from, self.charge) {
            (Some(read), Some(charge)) => read(res).map(|actual| (charge, actual)),
            _ => None,
        };
        (block.is_some() || actual.is_some()).then_some(Lesson {
            status: res.status,
            block,
            actual,
        })
    }

    /// Blocks the budget fleet-wide for as long as the upstream asked, and
    /// settles the charge to the cost the response reports. Neither ever
    /// fails the call.
    pub(crate) async fn apply(self, lesson: Lesson) {
        let (shared, subject) = (&self.shared, &self.subject);
        let block = async {
            let Some((asked, duration)) = lesson.block else {
                return;
            };
            // At least: a shorter wait asked later must not lift a longer
            // block (another call's 429, an operator's).
            let blocking = shared.limiter.block_at_least(subject, duration);
            let done = tokio::time::timeout(BLOCK_TIMEOUT, blocking)
                .await
                .unwrap_or(Err(Error::Timeout(BLOCK_TIMEOUT)));
            match done {
                Ok(()) => tracing::info!(
                    target: "tollgate_tower::pace",
                    policy = shared.policy(), subject = %subject.digest(),
                    status = lesson.status.as_u16(), ?asked, blocked_for = ?duration,
                    "the upstream asked to wait: budget blocked fleet-wide"
                ),
                Err(e) => tracing::warn!(
                    target: "tollgate_tower::pace",
                    policy = shared.policy(), subject = %subject.digest(),
                    status = lesson.status.as_u16(), ?asked, error = %e,
                    "the upstream asked to wait, but the budget could not be blocked"
                ),
            }
        };
        let settle = async {
            let Some((charge, actual)) = lesson.actual else {
                return;
            };
            match shared
                .limiter
                .settle(subject.clone(), &charge, actual)
                .await
            {
                Ok(s) => tracing::debug!(
                    target: "tollgate_tower::pace",
                    policy = shared.policy(), subject = %subject.digest(),
                    estimate = charge.cost(), actual, applied = s.applied,
                    remaining = s.decision.remaining, "call settled"
                ),
                Err(e) => tracing::warn!(
                    target: "tollgate_tower::pace",
                    policy = shared.policy(), subject = %subject.digest(),
                    estimate = charge.cost(), actual, error = %e,
                    "the call's charge could not be settled: the estimate stays"
                ),
            }
        };
        futures_util::join!(block, settle);
    }
}

/// The service made by [`PaceLayer`](super::PaceLayer): each call waits
/// for a slot of the shared budget, then goes to the inner service (a
/// client); see the [module docs](super).
#[derive(Debug)]
pub struct Pace<S, K = GlobalKey, C = u64> {
    inner: S,
    shared: Arc<Shared>,
    key: K,
    cost: C,
}

impl<S: Clone, K: Clone, C: Clone> Clone for Pace<S, K, C> {
    fn clone(&self) -> Self {
        Pace {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            key: self.key.clone(),
            cost: self.cost.clone(),
        }
    }
}

impl<S, K, C> Pace<S, K, C> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, key: K, cost: C) -> Self {
        Pace {
            inner,
            shared,
            key,
            cost,
        }
    }

    /// The limiter holding the budget.
    pub fn limiter(&self) -> &RateLimiter {
        &self.shared.limiter
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, K, C, ReqB, ResB> Service<Request<ReqB>> for Pace<S, K, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    K: KeyExtractor,
    C: RequestCost,
    ReqB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let inner = take_readied(&mut self.inner);
        let (parts, body) = req.into_parts();
        let subject = match self.key.extract(&parts) {
            Ok(Some(subject)) => subject,
            Ok(None) => return ResponseFuture::unpaced(inner, Request::from_parts(parts, body)),
            Err(e) => return ResponseFuture::failed(e.into()),
        };
        let cost = self.cost.cost(&parts);
        // Lazy: nothing is taken until the response future is polled.
        ResponseFuture::pacing(
            Arc::clone(&self.shared),
            subject,
            cost,
            inner,
            Request::from_parts(parts, body),
        )
    }
}
