//! Counting by outcome: an admitted request's charge is a reservation until
//! its response says whether it counts and what it really cost; one that
//! does not count is given back whole, one that says its cost is settled to
//! it.
//!
//! Reserve-then-refund, never check-then-charge: the check takes the cost
//! before the handler runs, so concurrent requests can never get past the
//! bound (32 concurrent failed logins against "3 failures a minute" admit
//! exactly 3), and what should not count is given back afterwards.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{response, HeaderMap, StatusCode};
use tollgate_core::{Charge, Decision, RateLimiter, Subject};

use super::service::{Entry, Shared};
use super::ResponseCost;
use crate::headers::DecisionHeaders;
use crate::rejection::Refused;

/// Which responses count against the limit; see
/// [`RateLimitLayer::count_if`](super::RateLimitLayer::count_if).
///
/// Implemented for closures `Fn(StatusCode) -> bool`. Implement it yourself
/// to look at the headers too — a gRPC error in a trailers-only response
/// carries its `grpc-status` there:
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tollgate::tower::rate_limit::CountResponse;
///
/// /// Counts only UNAUTHENTICATED (16) answers.
/// struct Unauthenticated;
///
/// impl CountResponse for Unauthenticated {
///     fn counts(&self, _status: StatusCode, headers: &HeaderMap) -> bool {
///         headers.get("grpc-status").is_some_and(|v| v == "16")
///     }
/// }
///
/// let failures = |status: StatusCode| status == StatusCode::UNAUTHORIZED;
/// assert!(failures.counts(StatusCode::UNAUTHORIZED, &HeaderMap::new()));
/// assert!(!failures.counts(StatusCode::OK, &HeaderMap::new()));
/// let mut trailers_only = HeaderMap::new();
/// trailers_only.insert("grpc-status", "16".parse().unwrap());
/// assert!(Unauthenticated.counts(StatusCode::OK, &trailers_only));
/// ```
pub trait CountResponse: Send + Sync + 'static {
    /// Whether a response with this status and these headers counts
    /// against the limit (`false`: its charge is given back).
    fn counts(&self, status: StatusCode, headers: &HeaderMap) -> bool;
}

impl<F> CountResponse for F
where
    F: Fn(StatusCode) -> bool + Send + Sync + 'static,
{
    fn counts(&self, status: StatusCode, _headers: &HeaderMap) -> bool {
        self(status)
    }
}

/// Reads a response's actual cost (a [`ResponseCost`] behind one pointer).
pub(crate) type ActualCostReader = Arc<dyn Fn(&response::Parts) -> Option<u64> + Send + Sync>;

/// How a layer counts by outcome (see `count_if`, `count_unfinished`,
/// `settle_from`).
#[derive(Clone)]
pub(crate) struct Counting {
    /// Which responses count; `None`: all.
    pub(crate) counts: Option<Arc<dyn CountResponse>>,
    /// Whether a request that ends without a response counts.
    pub(crate) unfinished: bool,
    /// What a response says the request really cost; `None`: the estimate
    /// stands.
    pub(crate) actual: Option<ActualCostReader>,
}

impl Default for Counting {
    fn default() -> Self {
        Counting {
            counts: None,
            unfinished: true,
            actual: None,
        }
    }
}

impl fmt::Debug for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counting")
            .field("count_if", &self.counts.is_some())
            .field("unfinished", &self.unfinished)
            .field("settle_from", &self.actual.is_some())
            .finish()
    }
}

impl Counting {
    /// Reads the actual cost with `actual`.
    pub(crate) fn settle_from(&mut self, actual: impl ResponseCost) {
        self.actual = Some(Arc::new(move |res: &response::Parts| {
            actual.actual_cost(res)
        }));
    }

    /// Whether the response's head decides the charge (`count_if`,
    /// `settle_from`) or a request without one is refunded
    /// (`count_unfinished(false)`); else only a refusal by a rate limit
    /// inside this layer gives the charge back.
    fn reads_head(&self) -> bool {
        self.counts.is_some() || !self.unfinished || self.actual.is_some()
    }

    /// Whether a request admitted with `charge` is held until its response:
    /// a charge of 0 units only when the response may say what it cost
    /// (nothing else could change it, and holding it would cost a round
    /// trip per request for nothing).
    pub(crate) fn holds(&self, charge: &Charge) -> bool {
        charge.cost() > 0 || self.actual.is_some()
    }
}

/// Makes the headers of the figures after settling: the layer's shared
/// state and the plan's entry that decided.
pub(crate) struct Report {
    shared: Arc<Shared>,
    selected: Option<Arc<Entry>>,
}

impl Report {
    fn headers(&self, decision: &Decision) -> DecisionHeaders {
        let entry = self.shared.entry(&self.selected);
        self.shared.admitted_headers(entry, decision)
    }
}

/// What an admitted request took, and from whom.
struct Taken {
    limiter: RateLimiter,
    subject: Subject,
    charge: Charge,
}

/// An admitted request's charge while its response is awaited. Settled
/// against the response; dropped unsettled (the response future dropped,
/// the inner service failed), it counts or is refunded as configured.
///
/// It owns the check's subject and the layer's state, moved from the
/// check: every admitted request holds one, and only a settlement (rare)
/// clones what it sends.
pub(crate) struct Reservation {
    shared: Arc<Shared>,
    selected: Option<Arc<Entry>>,
    subject: Subject,
    /// Until settled or given back.
    charge: Option<Charge>,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("charge", &self.charge)
            .finish()
    }
}

impl Reservation {
    /// The reservation of a request admitted with `charge` by the entry
    /// `selected` picks from `shared`, for `subject`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        selected: Option<Arc<Entry>>,
        subject: Subject,
        charge: Charge,
    ) -> Self {
        Reservation {
            shared,
            selected,
            subject,
            charge: Some(charge),
        }
    }

    fn counting(&self) -> &Counting {
        &self.shared.options.counting
    }

    /// The charge, to give back whole; none for a charge of 0 units, which
    /// has nothing to give back (no round trip for it).
    fn charge_to_give_back(&mut self) -> Option<Charge> {
        self.charge.take().filter(|c| c.cost() > 0)
    }

    /// What a settlement of `charge` sends.
    fn taken(&self, charge: Charge) -> Taken {
        Taken {
            limiter: self.shared.entry(&self.selected).limiter.clone(),
            subject: self.subject.clone(),
            charge,
        }
    }

    fn report(&self) -> Report {
        Report {
            shared: Arc::clone(&self.shared),
            selected: self.selected.clone(),
        }
    }

    /// Whether [`settle`](Self::settle) reads more of the response than
    /// its extensions (else [`settle_refused`](Self::settle_refused) is
    /// all it takes, and the response is not taken apart).
    pub(crate) fn reads_head(&self) -> bool {
        self.counting().reads_head()
    }

    /// The refund to await when a rate limit inside this layer refused the
    /// request (its response is marked [`Refused`]): it was not served, so
    /// it does not count here either, whatever `count_if` says.
    pub(crate) fn settle_refused(mut self, extensions: &http::Extensions) -> Option<Settling> {
        if !refused_inside(extensions) {
            return None;
        }
        let charge = self.charge_to_give_back()?;
        Some(Settling::new(self.taken(charge), 0, Some(self.report())))
    }

    /// The settlement to await before the response with head `res` goes
    /// out: the whole charge given back if the response does not count
    /// (or a rate limit inside refused it), else the charge corrected to
    /// the actual cost the response says; `None` when the charge stands as
    /// taken.
    pub(crate) fn settle(mut self, res: &response::Parts) -> Option<Settling> {
        let charge = self.charge.take()?;
        let counting = self.counting();
        let counts = !refused_inside(&res.extensions)
            && match &counting.counts {
                Some(counts) => counts.counts(res.status, &res.headers),
                None => true,
            };
        let actual = if counts {
            counting.actual.as_ref().and_then(|a| a(res))?
        } else {
            0
        };
        // Already what was taken: nothing to correct, no round trip.
        if actual == charge.cost() {
            return None;
        }
        Some(Settling::new(
            self.taken(charge),
            actual,
            Some(self.report()),
        ))
    }

    /// The refund to await before an inner error is returned, if requests
    /// without a response do not count.
    pub(crate) fn fail(mut self) -> Option<Settling> {
        let charge = self.charge_to_give_back()?;
        (!self.counting().unfinished).then(|| Settling::new(self.taken(charge), 0, None))
    }
}

/// Whether a rate limit inside this layer refused the request.
fn refused_inside(extensions: &http::Extensions) -> bool {
    extensions
        .get::<Refused>()
        .is_some_and(Refused::by_a_rate_limit)
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.counting().unfinished {
            return;
        }
        if let Some(charge) = self.charge_to_give_back() {
            // Dropping a settlement under way finishes it in a task.
            drop(Settling::new(self.taken(charge), 0, None));
        }
    }
}

/// A charge being settled (a refund is a settlement to 0). Awaited before
/// the response is returned, so a client that retries at once already
/// sees the quota given back, and the response's `RateLimit` says what is
/// left after it; dropped before it finished, it finishes in a task of its
/// own.
pub(crate) struct Settling {
    settle: Option<Pin<Box<dyn Future<Output = Option<DecisionHeaders>> + Send>>>,
}

impl fmt::Debug for Settling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settling")
            .field("done", &self.settle.is_none())
            .finish()
    }
}

impl Settling {
    fn new(taken: Taken, actual: u64, report: Option<Report>) -> Self {
        let Taken {
            limiter,
            subject,
            charge,
        } = taken;
        // Bounded by the limiter's timeout; a failure leaves the charge as
        // it was taken and the response as it is (never made-up figures).
        let settle = async move {
            match limiter.settle(subject.clone(), &charge, actual).await {
                Ok(settled) => report.map(|r| r.headers(&settled.decision)),
                Err(e) => {
                    tracing::warn!(
                        target: "tollgate_tower::rate_limit",
                        policy = limiter.keyspace().policy(), subject = %subject.digest(),
                        reserved = charge.cost(), actual, error = %e,
                        "settling a charge failed; it stays as reserved"
                    );
                    None
                }
            }
        };
        Settling {
            settle: Some(Box::pin(settle)),
        }
    }

    /// Drives the settlement; ready once it is applied, refused or failed,
    /// with the headers of the figures after it when it told them.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<DecisionHeaders>> {
        let Some(settle) = &mut self.settle else {
            return Poll::Ready(None);
        };
        let headers = std::task::ready!(settle.as_mut().poll(cx));
        self.settle = None;
        Poll::Ready(headers)
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        let Some(settle) = self.settle.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(settle)),
            Err(_) => tracing::warn!(
                target: "tollgate_tower::rate_limit",
                "a settlement was dropped unfinished outside a Tokio runtime; the charge stays as reserved"
            ),
        }
    }
}
