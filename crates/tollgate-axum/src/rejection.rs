//! [`Rejection`]: why an extractor of this crate refused a request, as a
//! response.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use axum_core::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, StatusCode};
use tollgate_core::{Decision, Error, RateLimiter};

use tollgate_tower::response::{
    rate_limit_headers, retry_after_secs, RateLimitHeaders, RATELIMIT_POLICY,
};

/// Why a request was refused; [`Rejection::reason`] returns it.
///
/// New reasons may be added, so match with a wildcard arm.
///
/// ```
/// use std::time::Duration;
/// use tollgate_axum::{Rejection, RejectionReason};
///
/// let r = Rejection::from(tollgate_core::Error::Busy {
///     name: "job:42".into(),
///     retry_after: Some(Duration::from_millis(1200)),
/// });
/// match r.reason() {
///     RejectionReason::Busy { retry_after } => assert_eq!(*retry_after, Duration::from_secs(2)),
///     other => panic!("unexpected {other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionReason {
    /// The lock is held by someone else and was not freed within the wait
    /// bound: **409 Conflict** with `Retry-After` (whole seconds, rounded up,
    /// at least 1: the holder's remaining lease when the backend knows it).
    Busy {
        /// The wait announced in `Retry-After`, in whole seconds.
        retry_after: Duration,
    },
    /// The rate limit is reached: **429 Too Many Requests** with
    /// `Retry-After` (whole seconds, rounded up, at least 1) and the
    /// `RateLimit-Policy` / `RateLimit` headers.
    RateLimited {
        /// The wait announced in `Retry-After`, in whole seconds.
        retry_after: Duration,
    },
    /// The backend (Redis) did not answer, answered an error, or its circuit
    /// is open: **503 Service Unavailable** with `Retry-After: 1`.
    Unavailable,
    /// The server is misconfigured (a layer or state the extractor needs is
    /// missing, invalid lock options, …): **500 Internal Server Error** with a
    /// message that says what to add or fix.
    Misconfigured,
    /// The request does not carry what the key or the resource name is made
    /// of (a missing header, …): **400 Bad Request** with a message.
    BadRequest,
    /// The request costs more than the limit can ever admit, so waiting
    /// cannot help: **413 Content Too Large**, without `Retry-After`, with
    /// the `RateLimit-Policy` header (as a `RateLimitLayer` answers it).
    CostExceedsCapacity {
        /// The request's cost.
        cost: u64,
        /// The most the limit admits at once.
        capacity: u64,
    },
    /// The resource or key could not be derived from the request and the
    /// [`LockResource`](crate::LockResource) or
    /// [`RateLimitPolicy`](crate::RateLimitPolicy) answered with its own
    /// response (see [`Rejection::from_response`]), whose status this is.
    Custom {
        /// The status of the response given.
        status: StatusCode,
    },
}

/// Why an extractor of this crate refused a request. Implements
/// [`IntoResponse`]; the answer for each [`RejectionReason`] is documented
/// there. Bodies are the [`message`](Rejection::message) and a newline, as
/// `text/plain` (like the rejections of `tollgate-tower`'s layers).
///
/// ```
/// use axum_core::response::IntoResponse;
/// use http::StatusCode;
/// use tollgate_axum::{Rejection, RejectionReason};
///
/// let r = Rejection::misconfigured("add `.with_state(locker)` to the router");
/// assert_eq!(r.reason(), &RejectionReason::Misconfigured);
/// assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// let response = r.into_response();
/// assert_eq!(response.status(), 500);
/// ```
pub struct Rejection {
    reason: RejectionReason,
    message: Cow<'static, str>,
    decision: Option<Box<Decision>>,
    headers: HeaderMap,
    error: Option<Error>,
    response: Option<Response>,
}

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("reason", &self.reason)
            .field("message", &self.message)
            .field("decision", &self.decision)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl Rejection {
    fn new(reason: RejectionReason, message: impl Into<Cow<'static, str>>) -> Self {
        Rejection {
            reason,
            message: message.into(),
            decision: None,
            headers: HeaderMap::new(),
            error: None,
            response: None,
        }
    }

    /// The lock is held by someone else; the holder's lease runs for
    /// `retry_after` more, when known (409, `Retry-After` rounded up to whole
    /// seconds, at least 1).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_axum::{Rejection, RejectionReason};
    ///
    /// let r = Rejection::busy(None);
    /// assert_eq!(r.reason(), &RejectionReason::Busy { retry_after: Duration::from_secs(1) });
    /// assert_eq!(r.status(), 409);
    /// ```
    pub fn busy(retry_after: Option<Duration>) -> Self {
        let secs = retry_after_secs(retry_after.unwrap_or_default());
        Self::new(
            RejectionReason::Busy {
                retry_after: Duration::from_secs(secs),
            },
            format!("the resource is locked by another request; retry in {secs} s"),
        )
    }

    /// The rate limit is reached, as `decision` of `limiter` says (429 with
    /// `Retry-After` and the `RateLimit-Policy` / `RateLimit` headers, as a
    /// `RateLimitLayer` would send them).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate_core::Error> {
    /// use tollgate_axum::{Rejection, RejectionReason};
    /// use tollgate_core::{MemoryBackend, Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::token_bucket(MemoryBackend::new(), Quota::per_minute(1))?;
    /// limiter.check("k").await?;
    /// let denied = limiter.check("k").await?;
    /// let r = Rejection::rate_limited(&limiter, denied);
    /// assert!(matches!(r.reason(), RejectionReason::RateLimited { .. }));
    /// assert_eq!(r.status(), 429);
    /// # Ok(()) }
    /// ```
    pub fn rate_limited(limiter: &RateLimiter, decision: Decision) -> Self {
        let secs = retry_after_secs(decision.retry_after.unwrap_or_default());
        let mut r = Self::new(
            RejectionReason::RateLimited {
                retry_after: Duration::from_secs(secs),
            },
            format!("rate limit exceeded; retry in {secs} s"),
        );
        r.headers = rate_limit_headers(limiter, &decision);
        r.decision = Some(Box::new(decision));
        r
    }

    /// The backend is unavailable (503); `message` is sent as the body.
    ///
    /// ```
    /// use tollgate_axum::Rejection;
    ///
    /// assert_eq!(Rejection::unavailable("try again").status(), 503);
    /// ```
    pub fn unavailable(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(RejectionReason::Unavailable, message)
    }

    /// The server is misconfigured (500); `message` should say what to add.
    ///
    /// ```
    /// use tollgate_axum::Rejection;
    ///
    /// let r = Rejection::misconfigured("add the `{id}` path parameter to the route");
    /// assert_eq!(r.status(), 500);
    /// assert_eq!(r.message(), "add the `{id}` path parameter to the route");
    /// ```
    pub fn misconfigured(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(RejectionReason::Misconfigured, message)
    }

    /// The request costs `cost`, more than the limit can ever admit
    /// (`capacity`): 413, without `Retry-After`, and the same text as a
    /// `RateLimitLayer`'s 413.
    ///
    /// ```
    /// use tollgate_axum::{Rejection, RejectionReason};
    ///
    /// let r = Rejection::cost_exceeds_capacity(50, 10);
    /// assert_eq!(r.reason(), &RejectionReason::CostExceedsCapacity { cost: 50, capacity: 10 });
    /// assert_eq!(r.status(), 413);
    /// assert_eq!(
    ///     r.message(),
    ///     "request cost 50 exceeds the rate limit's capacity 10; it can never be admitted"
    /// );
    /// ```
    pub fn cost_exceeds_capacity(cost: u64, capacity: u64) -> Self {
        Self::new(
            RejectionReason::CostExceedsCapacity { cost, capacity },
            format!(
                "request cost {cost} exceeds the rate limit's capacity {capacity}; it can never be admitted"
            ),
        )
    }

    /// `Rejection::from(error)` for an error of `limiter`, plus the
    /// `RateLimit-Policy` header on a 413, as a `RateLimitLayer` sends it.
    pub(crate) fn from_limiter_error(limiter: &RateLimiter, error: Error) -> Self {
        let mut r = Rejection::from(error);
        if let RejectionReason::CostExceedsCapacity { .. } = r.reason {
            if let Some(policy) = RateLimitHeaders::new(limiter).policy() {
                r.headers.insert(RATELIMIT_POLICY, policy.clone());
            }
        }
        r
    }

    /// The request lacks what the key or resource is made of (400).
    ///
    /// ```
    /// use tollgate_axum::Rejection;
    ///
    /// assert_eq!(Rejection::bad_request("missing x-api-key").status(), 400);
    /// ```
    pub fn bad_request(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(RejectionReason::BadRequest, message)
    }

    /// Answers with `response` as it is (an axum `PathRejection`, a
    /// `(StatusCode, String)`, …); the reason is
    /// [`RejectionReason::Custom`] with its status.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate_axum::{Rejection, RejectionReason};
    ///
    /// let r = Rejection::from_response((StatusCode::NOT_FOUND, "no such job"));
    /// assert_eq!(r.reason(), &RejectionReason::Custom { status: StatusCode::NOT_FOUND });
    /// ```
    pub fn from_response(response: impl IntoResponse) -> Self {
        let response = response.into_response();
        let mut r = Self::new(
            RejectionReason::Custom {
                status: response.status(),
            },
            response
                .status()
                .canonical_reason()
                .unwrap_or("request refused"),
        );
        r.response = Some(response);
        r
    }

    /// Why the request was refused.
    ///
    /// ```
    /// use tollgate_axum::{Rejection, RejectionReason};
    ///
    /// assert_eq!(Rejection::unavailable("down").reason(), &RejectionReason::Unavailable);
    /// ```
    pub fn reason(&self) -> &RejectionReason {
        &self.reason
    }

    /// The message sent in the body (for [`RejectionReason::Custom`], the
    /// status's reason phrase; the body is the response given).
    ///
    /// ```
    /// use tollgate_axum::Rejection;
    ///
    /// assert_eq!(Rejection::bad_request("missing key").message(), "missing key");
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP status the rejection answers with.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_axum::Rejection;
    ///
    /// assert_eq!(Rejection::busy(Some(Duration::from_secs(3))).status(), 409);
    /// ```
    pub fn status(&self) -> StatusCode {
        match &self.reason {
            RejectionReason::Busy { .. } => StatusCode::CONFLICT,
            RejectionReason::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            RejectionReason::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            RejectionReason::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
            RejectionReason::BadRequest => StatusCode::BAD_REQUEST,
            RejectionReason::CostExceedsCapacity { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RejectionReason::Custom { status } => *status,
        }
    }

    /// The rate-limit decision behind a [`RejectionReason::RateLimited`].
    ///
    /// ```
    /// use tollgate_axum::Rejection;
    ///
    /// assert!(Rejection::busy(None).decision().is_none());
    /// ```
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_deref()
    }

    /// The backend error behind this rejection, if any.
    ///
    /// ```
    /// use tollgate_axum::Rejection;
    ///
    /// let r = Rejection::from(tollgate_core::Error::CircuitOpen);
    /// assert!(r.error().is_some_and(|e| e.is_unavailable()));
    /// assert_eq!(r.status(), 503);
    /// ```
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }
}

impl From<Error> for Rejection {
    /// Maps a tollgate error: [`Error::Busy`] → busy (409); unavailable
    /// backends ([`Error::is_unavailable`]) → 503; a cost the quota can never
    /// admit → 413 (as a `RateLimitLayer` answers it); configuration errors
    /// → 500.
    fn from(error: Error) -> Self {
        let mut r = match &error {
            Error::Busy { retry_after, .. } => Rejection::busy(*retry_after),
            e if e.is_unavailable() => {
                Rejection::unavailable("the coordination backend is unavailable; try again shortly")
            }
            Error::CostExceedsCapacity { cost, capacity } => {
                Rejection::cost_exceeds_capacity(*cost, *capacity)
            }
            e => Rejection::misconfigured(format!("tollgate is misconfigured: {e}")),
        };
        r.error = Some(error);
        r
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        if let Some(response) = self.response {
            return response;
        }
        let status = self.status();
        let mut response = (status, format!("{}\n", self.message)).into_response();
        let h = response.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        match self.reason {
            RejectionReason::Busy { retry_after }
            | RejectionReason::RateLimited { retry_after } => {
                h.insert(RETRY_AFTER, HeaderValue::from(retry_after.as_secs()));
            }
            RejectionReason::Unavailable => {
                h.insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        h.extend(self.headers);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_round_up_and_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
    }

    /// A busy lock's 409 never announces `Retry-After: 0`, also when the
    /// holder's lease is about to run out or its remaining TTL is unknown.
    #[test]
    fn busy_responses_round_up_and_never_announce_zero() {
        let ms = Duration::from_millis;
        for (wait, secs) in [
            (None, "1"),
            (Some(Duration::ZERO), "1"),
            (Some(ms(1)), "1"),
            (Some(ms(1000)), "1"),
            (Some(ms(1001)), "2"),
        ] {
            let error = Error::Busy {
                name: "job".into(),
                retry_after: wait,
            };
            for r in [Rejection::busy(wait), Rejection::from(error)] {
                let res = r.into_response();
                assert_eq!(res.status(), StatusCode::CONFLICT);
                assert_eq!(res.headers()[RETRY_AFTER], secs, "{wait:?}");
            }
        }
    }

    /// A cost the limit can never admit: 413, no `Retry-After`, the text of
    /// a `RateLimitLayer`'s 413.
    #[test]
    fn a_cost_beyond_capacity_is_413_without_retry_after() {
        let res = Rejection::from(Error::CostExceedsCapacity {
            cost: 5,
            capacity: 2,
        })
        .into_response();
        assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(!res.headers().contains_key(RETRY_AFTER));
        assert_eq!(res.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
    }
}
