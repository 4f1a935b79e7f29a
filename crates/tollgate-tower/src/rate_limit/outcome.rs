//! Counting by outcome: an admitted request's charge is a reservation until
//! its response says whether it counts; one that does not is refunded.
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

use http::{HeaderMap, StatusCode};
use tollgate_core::{Charge, RateLimiter, Subject};

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

/// How a layer counts by outcome (see `count_if`, `count_unfinished`).
#[derive(Clone)]
pub(crate) struct Counting {
    /// Which responses count; `None`: all.
    pub(crate) counts: Option<Arc<dyn CountResponse>>,
    /// Whether a request that ends without a response counts.
    pub(crate) unfinished: bool,
}

impl Default for Counting {
    fn default() -> Self {
        Counting {
            counts: None,
            unfinished: true,
        }
    }
}

impl fmt::Debug for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counting")
            .field("count_if", &self.counts.is_some())
            .field("unfinished", &self.unfinished)
            .finish()
    }
}

impl Counting {
    /// Whether anything can be given back: only then does an admitted
    /// request hold a reservation (the default path clones nothing).
    pub(crate) fn refunds(&self) -> bool {
        self.counts.is_some() || !self.unfinished
    }

    /// The reservation of a request admitted with `charge` by `limiter`.
    pub(crate) fn reserve(
        &self,
        limiter: &RateLimiter,
        subject: &Subject,
        charge: Charge,
    ) -> Reservation {
        Reservation {
            taken: Some(Taken {
                limiter: limiter.clone(),
                subject: subject.clone(),
                charge,
            }),
            counting: self.clone(),
        }
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
pub(crate) struct Reservation {
    taken: Option<Taken>,
    counting: Counting,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("charge", &self.taken.as_ref().map(|t| t.charge))
            .finish()
    }
}

impl Reservation {
    /// The refund to await before the response goes out, if the response
    /// does not count.
    pub(crate) fn settle(mut self, status: StatusCode, headers: &HeaderMap) -> Option<Refunding> {
        let taken = self.taken.take()?;
        let counts = match &self.counting.counts {
            Some(counts) => counts.counts(status, headers),
            None => true,
        };
        (!counts).then(|| Refunding::new(taken))
    }

    /// The refund to await before an inner error is returned, if requests
    /// without a response do not count.
    pub(crate) fn fail(mut self) -> Option<Refunding> {
        let taken = self.taken.take()?;
        (!self.counting.unfinished).then(|| Refunding::new(taken))
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(taken) = self.taken.take() {
            if !self.counting.unfinished {
                // Dropping a refund under way finishes it in a task.
                drop(Refunding::new(taken));
            }
        }
    }
}

/// A refund under way. Awaited before the response is returned, so a
/// client that retries at once already sees the quota given back; dropped
/// before it finished, it finishes in a task of its own.
pub(crate) struct Refunding {
    refund: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl fmt::Debug for Refunding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refunding")
            .field("done", &self.refund.is_none())
            .finish()
    }
}

impl Refunding {
    fn new(taken: Taken) -> Self {
        let Taken {
            limiter,
            subject,
            charge,
        } = taken;
        // Bounded by the limiter's timeout; a failure is logged by the
        // limiter and the request keeps its charge (never a made-up refund).
        let refund = async move {
            let _ = limiter.refund(subject, &charge).await;
        };
        Refunding {
            refund: Some(Box::pin(refund)),
        }
    }

    /// Drives the refund; ready once it is applied, refused or failed.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(refund) = &mut self.refund {
            std::task::ready!(refund.as_mut().poll(cx));
            self.refund = None;
        }
        Poll::Ready(())
    }
}

impl Drop for Refunding {
    fn drop(&mut self) {
        let Some(refund) = self.refund.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(refund)),
            Err(_) => tracing::warn!(
                target: "tollgate_tower::rate_limit",
                "a refund was dropped unfinished outside a Tokio runtime; the charge stays"
            ),
        }
    }
}
