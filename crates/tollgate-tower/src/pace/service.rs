//! [`Pace`]: the service, and what all its clones share: taking a slot of
//! the budget before a call, and learning from the call's response.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use http::response::Parts;
use http::{Request, Response};
use tollgate_core::{Charge, Error, RateLimiter, Subject};
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
        let deadline = Instant::now() + self.max_wait;
        loop {
            let decision = match self.limiter.check_n(subject.clone(), cost).await {
                Ok(d) => d,
                Err(e @ Error::CostExceedsCapacity { .. }) => {
                    tracing::info!(
                        target: "tollgate_tower::pace",
                        policy = self.policy(), subject = %subject.digest(), cost, error = %e,
                        "call refused: it costs more than the budget holds"
                    );
                    return Err(Throttled::new(None).into());
                }
                Err(e) => {
                    tracing::warn!(
                        target: "tollgate_tower::pace",
                        policy = self.policy(), subject = %subject.digest(), cost, error = %e,
                        "call refused: the budget is unavailable"
                    );
                    return Err(Unavailable::new(e).into());
                }
            };
            if decision.allowed {
                tracing::debug!(
                    target: "tollgate_tower::pace",
                    policy = self.policy(), subject = %subject.digest(), cost,
                    remaining = decision.remaining, "call admitted"
                );
                return Ok(decision.charge);
            }
            // Refused now (the quota, or a block the upstream asked for):
            // wait it out when it ends within the time left.
            let wait = decision.retry_after.unwrap_or(Duration::from_millis(1));
            let left = deadline.saturating_duration_since(Instant::now());
            if wait > left {
                tracing::info!(
                    target: "tollgate_tower::pace",
                    policy = self.policy(), subject = %subject.digest(), cost,
                    retry_after = ?wait, "call throttled: no slot within the wait allowed"
                );
                return Err(Throttled::new(Some(wait)).into());
            }
            tokio::time::sleep(wait).await;
        }
    }
}

impl Slot {
    /// Learns from the response before it is handed back: blocks the budget
    /// fleet-wide for as long as the upstream asks, and settles the charge
    /// to the cost the response reports. Neither ever fails the call.
    pub(crate) async fn learn<B>(self, response: Response<B>) -> Response<B> {
        let (parts, body) = response.into_parts();
        let shared = &self.shared;
        let block = async {
            if !shared.learn {
                return;
            }
            let Some(wait) = upstream_wait(&parts, SystemTime::now()) else {
                return;
            };
            let duration = wait.min(shared.max_block);
            let blocking = shared.limiter.block(&self.subject, duration);
            let done = tokio::time::timeout(BLOCK_TIMEOUT, blocking)
                .await
                .unwrap_or(Err(Error::Timeout(BLOCK_TIMEOUT)));
            match done {
                Ok(()) => tracing::info!(
                    target: "tollgate_tower::pace",
                    policy = shared.policy(), subject = %self.subject.digest(),
                    status = parts.status.as_u16(), asked = ?wait, blocked_for = ?duration,
                    "the upstream asked to wait: budget blocked fleet-wide"
                ),
                Err(e) => tracing::warn!(
                    target: "tollgate_tower::pace",
                    policy = shared.policy(), subject = %self.subject.digest(),
                    status = parts.status.as_u16(), asked = ?wait, error = %e,
                    "the upstream asked to wait, but the budget could not be blocked"
                ),
            }
        };
        block.await;
        Response::from_parts(parts, body)
    }

    /// Whether [`learn`](Self::learn) has anything to do.
    pub(crate) fn learns(&self) -> bool {
        self.shared.learn || (self.shared.settle_from.is_some() && self.charge.is_some())
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
    ResB: Send + 'static,
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
