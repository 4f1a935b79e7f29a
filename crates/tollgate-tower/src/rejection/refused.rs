//! [`Refused`]: the mark a refusal's response carries in its extensions.

use super::{Middleware, RejectionReason};

/// In the extensions of every response that tollgate makes to refuse a
/// request (a layer's answer, a custom responder's, an extractor's
/// rejection): why, and which kind of middleware refused it.
///
/// An outer [`RateLimitLayer`](crate::RateLimitLayer) reads it: a request
/// that a rate limit inside it refused was not served, so the outer limit
/// gives back what it charged for it (two limits stacked never burn the
/// outer one's unit on the inner one's refusal).
///
/// ```
/// use tollgate::tower::rejection::{Refused, Rejection, RejectionReason};
///
/// let res = Rejection::busy(None).default_response();
/// let refused = res.extensions().get::<Refused>().expect("marked");
/// assert_eq!(refused.reason(), RejectionReason::Busy);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    reason: RejectionReason,
    middleware: Option<Middleware>,
}

impl Refused {
    pub(super) fn new(reason: RejectionReason, middleware: Option<Middleware>) -> Self {
        Refused { reason, middleware }
    }

    /// Why the request was refused.
    pub fn reason(&self) -> RejectionReason {
        self.reason
    }

    /// Which kind of middleware refused it, when known.
    pub fn middleware(&self) -> Option<Middleware> {
        self.middleware
    }

    /// Whether a rate limit refused it (over its limit): what an outer
    /// rate limit gives its charge back for.
    pub fn by_a_rate_limit(&self) -> bool {
        self.reason == RejectionReason::RateLimited
    }
}
