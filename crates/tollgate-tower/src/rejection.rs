//! [`Rejection`]: one model for every refused request, whether a tower layer
//! or an axum extractor refused it.
//!
//! One table ([`RejectionReason::status`], [`RejectionReason::grpc_code`])
//! decides the status; one function ([`Rejection::default_response`]) builds
//! the response. A layer and an extractor refusing a request for the same
//! reason therefore answer with the same status, headers and body (an
//! `about:blank` problem unless the table names another type):
//!
//! | reason | HTTP | gRPC | `Retry-After` |
//! |---|---|---|---|
//! | [`RateLimited`](RejectionReason::RateLimited) | 429 ([`QUOTA_EXCEEDED`] problem) | RESOURCE_EXHAUSTED | the decision's wait, ≥ 1 s |
//! | [`CostExceedsCapacity`](RejectionReason::CostExceedsCapacity) | 413 | RESOURCE_EXHAUSTED | none: waiting cannot help |
//! | [`Unavailable`](RejectionReason::Unavailable) | 503 | UNAVAILABLE | 1 |
//! | [`Busy`](RejectionReason::Busy) | 409 | ABORTED | the name's typical hold, within the holder's remaining lease (see [`Error::Busy`]), or 1 when unknown |
//! | [`TooManyInFlight`](RejectionReason::TooManyInFlight) | 429 | RESOURCE_EXHAUSTED | the name's typical hold, within the earliest permit's expiry, or 1 when unknown |
//! | [`LeaseLost`](RejectionReason::LeaseLost) | 503 | ABORTED | none |
//! | [`Key`](RejectionReason::Key) | the extractor's status | matching code | none |
//! | [`Internal`](RejectionReason::Internal) | 500 | INTERNAL | none |
//! | [`IdempotencyConflict`](RejectionReason::IdempotencyConflict) | 409 | ABORTED | in flight: the holder's remaining lease, or 1 |
//! | [`IdempotencyMismatch`](RejectionReason::IdempotencyMismatch) | 422 | FAILED_PRECONDITION | none |
//! | [`InvalidIdempotencyKey`](RejectionReason::InvalidIdempotencyKey) | 400 | INVALID_ARGUMENT | none |
//! | [`PayloadTooLarge`](RejectionReason::PayloadTooLarge) | 413 | RESOURCE_EXHAUSTED | none |
//!
//! `Retry-After` is whole seconds, rounded up, never 0. Every HTTP body,
//! whichever layer or extractor refused, is an RFC 9457
//! `application/problem+json` document whose `detail` is the
//! [message](Rejection::message):
//!
//! - a rate limit's 429 is draft-ietf-httpapi-ratelimit-headers-10's
//!   quota-exceeded problem: `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//!   "title":…,"status":429,"detail":<the message>,"violated-policies":[<names>]}`,
//!   the names those of the `RateLimit-Policy` items whose quota denied
//!   ([`Rejection::violated_policies`]);
//! - every other reason is an `about:blank` problem, the form the
//!   idempotency-key draft shows: `{"type":"about:blank","title":<the
//!   status' reason phrase>,"status":<status>,"detail":<the message>}`.
//!
//! gRPC requests get a trailers-only response (see [`crate::grpc`]).

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use tollgate_core::{Decision, Error, RateLimiter};

use crate::grpc::{trailers_only, GrpcCode, Protocol};
use crate::headers::{retry_after_secs, DecisionHeaders, RateLimitHeaders, RATELIMIT_POLICY};
use crate::key::KeyError;

mod body;
mod idempotency;
mod problem;
mod refused;

pub use body::RejectionBody;
pub use refused::Refused;

/// The problem type of a rate limit's 429 body: draft-10's quota-exceeded
/// (its `violated-policies` member names the denying policies).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{MemoryBackend, Quota, RateLimiter};
/// use tollgate::tower::rejection::{Rejection, QUOTA_EXCEEDED};
///
/// let limiter = RateLimiter::builder(MemoryBackend::new(), tollgate::Algorithm::FixedWindow)
///     .quota(Quota::per_minute(1))
///     .name("api")
///     .build()?;
/// limiter.check("k").await?;
/// let res = Rejection::rate_limited(&limiter, limiter.check("k").await?).default_response();
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// let body = std::str::from_utf8(res.body()).unwrap();
/// assert!(body.starts_with(&format!(r#"{{"type":"{QUOTA_EXCEEDED}","#)));
/// assert!(body.ends_with(r#","violated-policies":["api"]}"#));
/// # Ok(()) }
/// ```
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Why a request was refused. New reasons may be added: match with a
/// wildcard arm.
///
/// ```
/// use http::StatusCode;
/// use tollgate::tower::grpc::GrpcCode;
/// use tollgate::tower::rejection::RejectionReason;
///
/// assert_eq!(RejectionReason::Busy.status(), StatusCode::CONFLICT);
/// assert_eq!(RejectionReason::RateLimited.grpc_code(), GrpcCode::ResourceExhausted);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionReason {
    /// The rate limit is exhausted.
    RateLimited,
    /// The request costs more than the limit can ever admit.
    CostExceedsCapacity {
        /// The request's cost.
        cost: u64,
        /// The most the limit admits at once.
        capacity: u64,
    },
    /// The backend is unavailable (and the failure policy denies).
    Unavailable,
    /// The lock is held by someone else beyond the wait bound.
    Busy,
    /// Every permit of a concurrency limit is taken (beyond the wait bound).
    TooManyInFlight,
    /// The lease of a lock, a permit or an idempotency claim was lost while
    /// the request was being handled.
    LeaseLost,
    /// The request could not be keyed (a missing header, …): the key
    /// extractor's status.
    Key {
        /// The status the key extractor chose.
        status: StatusCode,
    },
    /// The middleware is misconfigured or failed unexpectedly.
    Internal,
    /// The request's `Idempotency-Key` is in flight (or its completed
    /// response could not be stored, so it cannot be replayed).
    IdempotencyConflict,
    /// The `Idempotency-Key` was used with another payload.
    IdempotencyMismatch,
    /// The `Idempotency-Key` is missing (where required) or malformed.
    InvalidIdempotencyKey,
    /// The request body is larger than the middleware accepts.
    PayloadTooLarge,
}

impl RejectionReason {
    /// The HTTP status for this reason.
    pub fn status(&self) -> StatusCode {
        match self {
            RejectionReason::RateLimited | RejectionReason::TooManyInFlight => {
                StatusCode::TOO_MANY_REQUESTS
            }
            RejectionReason::CostExceedsCapacity { .. } | RejectionReason::PayloadTooLarge => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            RejectionReason::Unavailable | RejectionReason::LeaseLost => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            RejectionReason::Busy | RejectionReason::IdempotencyConflict => StatusCode::CONFLICT,
            RejectionReason::Key { status } => *status,
            RejectionReason::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            RejectionReason::IdempotencyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            RejectionReason::InvalidIdempotencyKey => StatusCode::BAD_REQUEST,
        }
    }

    /// The gRPC status code for this reason.
    pub fn grpc_code(&self) -> GrpcCode {
        match self {
            RejectionReason::RateLimited
            | RejectionReason::TooManyInFlight
            | RejectionReason::CostExceedsCapacity { .. }
            | RejectionReason::PayloadTooLarge => GrpcCode::ResourceExhausted,
            RejectionReason::Unavailable => GrpcCode::Unavailable,
            RejectionReason::Busy
            | RejectionReason::LeaseLost
            | RejectionReason::IdempotencyConflict => GrpcCode::Aborted,
            RejectionReason::Key { status } => GrpcCode::from_http(*status),
            RejectionReason::Internal => GrpcCode::Internal,
            RejectionReason::IdempotencyMismatch => GrpcCode::FailedPrecondition,
            RejectionReason::InvalidIdempotencyKey => GrpcCode::InvalidArgument,
        }
    }
}

/// Which kind of middleware refused a request; it words the message of an
/// unavailable backend.
///
/// ```
/// use tollgate::tower::rejection::Middleware;
/// assert_ne!(Middleware::RateLimit, Middleware::Lock);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Middleware {
    /// A rate limit (layer or extractor).
    RateLimit,
    /// A lock (layer or extractor).
    Lock,
    /// A concurrency limit (layer or extractor).
    ConcurrencyLimit,
    /// Idempotency keys.
    Idempotency,
}

/// A refused request: why ([`reason`](Rejection::reason)), the message,
/// the wait to announce, the rate-limit headers, and the decision or error
/// behind it. tower layers answer with [`default_response`](Self::default_response)
/// (or a custom responder's answer); with the `axum` feature it is also
/// axum's `IntoResponse`, so extractors return it as their rejection.
///
/// ```
/// use std::time::Duration;
/// use tollgate::tower::rejection::{Rejection, RejectionReason};
///
/// let r = Rejection::busy(Some(Duration::from_millis(1200)));
/// assert_eq!(r.reason(), RejectionReason::Busy);
/// assert_eq!(r.retry_after(), Some(Duration::from_secs(2)));
/// let res = r.default_response();
/// assert_eq!(res.status(), 409);
/// assert_eq!(res.headers()["retry-after"], "2");
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// assert_eq!(
///     std::str::from_utf8(res.body()).unwrap(),
///     r#"{"type":"about:blank","title":"Conflict","status":409,"detail":"resource is busy; retry in 2 s"}"#
/// );
/// ```
pub struct Rejection {
    reason: RejectionReason,
    middleware: Option<Middleware>,
    message: Cow<'static, str>,
    retry_after: Option<Duration>,
    headers: HeaderMap,
    decision: Option<Box<Decision>>,
    /// A rate limit's denying policies, for the problem body.
    violated: Vec<String>,
    error: Option<Error>,
    /// Shaped for gRPC: the response's content type (the request's
    /// gRPC-Web one, else `application/grpc`).
    grpc: Option<HeaderValue>,
}

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("reason", &self.reason)
            .field("middleware", &self.middleware)
            .field("message", &self.message)
            .field("retry_after", &self.retry_after)
            .field("violated_policies", &self.violated)
            .field("error", &self.error)
            .field("grpc", &self.grpc.is_some())
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

/// A wait announced in whole seconds: rounded up, at least one.
fn whole_secs(wait: Duration) -> Duration {
    Duration::from_secs(retry_after_secs(wait))
}

impl Rejection {
    fn new(
        reason: RejectionReason,
        middleware: Option<Middleware>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Rejection {
            reason,
            middleware,
            message: message.into(),
            retry_after: None,
            headers: HeaderMap::new(),
            decision: None,
            violated: Vec::new(),
            error: None,
            grpc: None,
        }
    }

    /// The rate limit is reached, as `decision` of `limiter` says: 429 with
    /// `Retry-After`, the `RateLimit-Policy` / `RateLimit` headers and a
    /// [`QUOTA_EXCEEDED`] problem body naming the denying policies.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{MemoryBackend, Quota, RateLimiter};
    /// use tollgate::tower::rejection::{Rejection, RejectionReason};
    ///
    /// let limiter = RateLimiter::token_bucket(MemoryBackend::new(), Quota::per_minute(1))?;
    /// limiter.check("k").await?;
    /// let r = Rejection::rate_limited(&limiter, limiter.check("k").await?);
    /// assert_eq!(r.reason(), RejectionReason::RateLimited);
    /// assert_eq!(r.violated_policies(), [limiter.keyspace().policy()]);
    /// assert_eq!(r.default_response().status(), 429);
    /// # Ok(()) }
    /// ```
    pub fn rate_limited(limiter: &RateLimiter, decision: Decision) -> Self {
        let headers = DecisionHeaders::new(&RateLimitHeaders::new(limiter), &decision, true, false);
        Self::limited(decision, headers)
    }

    /// A denial with the headers a layer already formatted.
    pub(crate) fn limited(decision: Decision, mut headers: DecisionHeaders) -> Self {
        let wait = whole_secs(decision.retry_after.unwrap_or_default());
        let mut r = Self::new(
            RejectionReason::RateLimited,
            Some(Middleware::RateLimit),
            format!("rate limit exceeded; retry in {} s", wait.as_secs()),
        );
        r.retry_after = Some(wait);
        r.violated = std::mem::take(&mut headers.violated);
        r.headers = headers.into_map();
        r.decision = Some(Box::new(decision));
        r
    }

    /// The request costs `cost`, more than the limit can ever admit
    /// (`capacity`): 413, without `Retry-After`.
    ///
    /// ```
    /// use tollgate::tower::rejection::Rejection;
    ///
    /// let r = Rejection::cost_exceeds_capacity(50, 10);
    /// assert_eq!(r.default_response().status(), 413);
    /// assert_eq!(r.message(), "request cost 50 exceeds the rate limit's capacity 10; it can never be admitted");
    /// ```
    pub fn cost_exceeds_capacity(cost: u64, capacity: u64) -> Self {
        Self::new(
            RejectionReason::CostExceedsCapacity { cost, capacity },
            Some(Middleware::RateLimit),
            format!(
                "request cost {cost} exceeds the rate limit's capacity {capacity}; it can never be admitted"
            ),
        )
    }

    /// The lock is held by someone else whose lease runs `retry_after`
    /// more, when known: 409 with `Retry-After` (1 when the wait is unknown:
    /// the lock may be free any moment).
    pub fn busy(retry_after: Option<Duration>) -> Self {
        let wait = whole_secs(retry_after.unwrap_or_default());
        let mut r = Self::new(
            RejectionReason::Busy,
            Some(Middleware::Lock),
            format!("resource is busy; retry in {} s", wait.as_secs()),
        );
        r.retry_after = Some(wait);
        r
    }

    /// Every permit is taken; the earliest holder's permit expires in
    /// `retry_after`, when known: 429 with `Retry-After` (1 when unknown)
    /// and `policy` as `RateLimit-Policy` (with `qu="concurrent-requests"`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::tower::rejection::Rejection;
    ///
    /// let r = Rejection::too_many_in_flight(Some(Duration::from_millis(300)), None);
    /// let res = r.default_response();
    /// assert_eq!(res.status(), 429);
    /// assert_eq!(res.headers()["retry-after"], "1");
    /// ```
    pub fn too_many_in_flight(retry_after: Option<Duration>, policy: Option<HeaderValue>) -> Self {
        let wait = whole_secs(retry_after.unwrap_or_default());
        let mut r = Self::new(
            RejectionReason::TooManyInFlight,
            Some(Middleware::ConcurrencyLimit),
            format!("too many requests in flight; retry in {} s", wait.as_secs()),
        );
        r.retry_after = Some(wait);
        if let Some(policy) = policy {
            r.headers.insert(RATELIMIT_POLICY, policy);
        }
        r
    }

    /// The backend of `middleware` is unavailable: 503 with `Retry-After: 1`.
    ///
    /// ```
    /// use tollgate::Error;
    /// use tollgate::tower::rejection::{Middleware, Rejection};
    ///
    /// let r = Rejection::unavailable(Middleware::Lock, Some(Error::CircuitOpen));
    /// assert_eq!(r.message(), "lock service unavailable");
    /// assert_eq!(r.default_response().headers()["retry-after"], "1");
    /// ```
    pub fn unavailable(middleware: Middleware, error: Option<Error>) -> Self {
        let message = match middleware {
            Middleware::RateLimit => "rate limiter unavailable",
            Middleware::Lock => "lock service unavailable",
            Middleware::ConcurrencyLimit => "concurrency limiter unavailable",
            Middleware::Idempotency => {
                "idempotency store unavailable; the request cannot be processed safely now"
            }
        };
        let mut r = Self::new(RejectionReason::Unavailable, Some(middleware), message);
        r.retry_after = Some(Duration::from_secs(1));
        r.error = error;
        r
    }

    /// The lease was lost while the request was handled; the handler was
    /// cancelled: 503 (gRPC ABORTED).
    pub fn lease_lost() -> Self {
        Self::new(
            RejectionReason::LeaseLost,
            Some(Middleware::Lock),
            "lock lost while handling the request; the request was cancelled",
        )
    }

    /// A concurrency permit was lost while the request was handled, and the
    /// layer cancels on loss: 503 (gRPC ABORTED), as [`lease_lost`](Self::lease_lost).
    pub fn permit_lost() -> Self {
        Self::new(
            RejectionReason::LeaseLost,
            Some(Middleware::ConcurrencyLimit),
            "concurrency permit lost while handling the request; the request was cancelled",
        )
    }

    /// The request could not be keyed: the key error's status and message.
    pub fn key(error: KeyError) -> Self {
        let status = error.status();
        Self::new(
            RejectionReason::Key { status },
            None,
            error.message().to_owned(),
        )
    }

    /// The request lacks what its key is made of: 400 with `message`.
    ///
    /// ```
    /// use tollgate::tower::rejection::Rejection;
    /// assert_eq!(Rejection::bad_request("missing x-api-key").default_response().status(), 400);
    /// ```
    pub fn bad_request(message: impl Into<Cow<'static, str>>) -> Self {
        Self::key(KeyError::bad_request(message))
    }

    /// The server is misconfigured: 500 with `message` (say what to add).
    ///
    /// ```
    /// use tollgate::tower::rejection::Rejection;
    /// assert_eq!(Rejection::misconfigured("add the layer").default_response().status(), 500);
    /// ```
    pub fn misconfigured(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(RejectionReason::Internal, None, message)
    }

    /// The rejection for `error`, raised by `middleware`: busy, unavailable,
    /// a cost beyond capacity, or internal for anything else.
    pub fn from_error(middleware: Middleware, error: Error) -> Self {
        let mut r = match &error {
            Error::Busy { retry_after, .. } => Rejection::busy(*retry_after),
            e if e.is_unavailable() => return Rejection::unavailable(middleware, Some(error)),
            Error::CostExceedsCapacity { cost, capacity } => {
                Rejection::cost_exceeds_capacity(*cost, *capacity)
            }
            e => Self::new(
                RejectionReason::Internal,
                Some(middleware),
                format!("tollgate is misconfigured: {e}"),
            ),
        };
        r.error = Some(error);
        r
    }

    /// The rejection for an error of `limiter`'s check: as
    /// [`from_error`](Self::from_error), plus the `RateLimit-Policy` header
    /// on a 413, as a `RateLimitLayer` sends it.
    pub fn limiter_error(limiter: &RateLimiter, error: Error) -> Self {
        Self::from_limiter_error(&RateLimitHeaders::new(limiter), error)
    }

    /// The error of `limiter`'s check as a rejection, with the
    /// `RateLimit-Policy` header on a 413 (as the layer sends it).
    pub(crate) fn from_limiter_error(formatter: &RateLimitHeaders, error: Error) -> Self {
        let mut r = Rejection::from_error(Middleware::RateLimit, error);
        if let RejectionReason::CostExceedsCapacity { .. } = r.reason {
            formatter.apply_fixed(&mut r.headers);
        }
        r
    }

    /// The same rejection without rate-limit headers (a layer with headers
    /// off).
    pub(crate) fn without_headers(mut self) -> Self {
        self.headers.clear();
        self
    }

    /// Shapes the response for gRPC (a trailers-only response) when
    /// `protocol` says so for a request with `headers`. A gRPC-Web request
    /// is answered in its own content type (`application/grpc-web+proto`,
    /// `application/grpc-web-text`, …), which its client checks.
    pub fn for_protocol(mut self, protocol: Protocol, headers: &HeaderMap) -> Self {
        self.grpc = protocol.grpc_content_type(headers);
        self
    }

    /// Why the request was refused.
    pub fn reason(&self) -> RejectionReason {
        self.reason
    }

    /// The HTTP status of the response ([`RejectionReason::status`]).
    pub fn status(&self) -> StatusCode {
        self.reason.status()
    }

    /// Which kind of middleware refused it, when known.
    pub fn middleware(&self) -> Option<Middleware> {
        self.middleware
    }

    /// The message sent as the problem body's `detail` (HTTP) or as
    /// `grpc-message` (gRPC).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The wait announced in `Retry-After`, in whole seconds.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The rate-limit headers the response carries besides `Retry-After`
    /// and `content-type`.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The rate-limit decision behind a [`RejectionReason::RateLimited`].
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_deref()
    }

    /// The names of the policies whose quota denied a
    /// [`RejectionReason::RateLimited`] (the `RateLimit-Policy` items'
    /// names), as the problem body's `violated-policies` lists them; empty
    /// for other reasons.
    pub fn violated_policies(&self) -> &[String] {
        &self.violated
    }

    /// The backend error behind this rejection, if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    /// Whether the response is shaped for gRPC.
    pub fn is_grpc(&self) -> bool {
        self.grpc.is_some()
    }

    /// The mark its response carries in the extensions.
    pub fn refused(&self) -> Refused {
        Refused::new(self.reason, self.middleware)
    }

    /// The response tollgate sends for this rejection, marked [`Refused`]
    /// in its extensions.
    pub fn default_response(&self) -> Response<Bytes> {
        let mut res = if let Some(content_type) = &self.grpc {
            trailers_only(
                content_type.clone(),
                self.reason.grpc_code(),
                &self.message,
                self.retry_after,
                &self.headers,
            )
        } else {
            self.problem_response()
        };
        res.extensions_mut().insert(self.refused());
        res
    }

    /// The HTTP answer: the status, an RFC 9457 problem document, the
    /// `Retry-After` and the rate-limit headers.
    fn problem_response(&self) -> Response<Bytes> {
        let status = self.reason.status();
        let violated = (self.reason == RejectionReason::RateLimited).then_some(&self.violated[..]);
        let body = problem::document(status, &self.message, violated);
        let mut res = Response::new(Bytes::from(body));
        *res.status_mut() = status;
        let h = res.headers_mut();
        if let Some(wait) = self.retry_after {
            h.insert(RETRY_AFTER, HeaderValue::from(wait.as_secs()));
        }
        h.extend(self.headers.clone());
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(problem::CONTENT_TYPE),
        );
        res
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum_core::response::IntoResponse for Rejection {
    fn into_response(self) -> axum_core::response::Response {
        // Like axum's own rejections, each one is traced.
        tracing::event!(
            target: "tollgate::rejection",
            tracing::Level::TRACE,
            status = self.reason.status().as_u16(),
            reason = ?self.reason,
            "rejecting request",
        );
        self.default_response().map(axum_core::body::Body::from)
    }
}

#[cfg(test)]
mod tests;
