//! The [idempotency layer](crate::idempotency)'s rejections (see the
//! [table](super)).

use std::borrow::Cow;
use std::time::Duration;

use http::StatusCode;

use super::{whole_secs, Middleware, Rejection, RejectionReason};

impl Rejection {
    /// The `Idempotency-Key` is in flight, its holder's lease running
    /// `retry_after` more when known: 409 with `Retry-After` (1 when
    /// unknown).
    ///
    /// ```
    /// use tollgate::tower::rejection::Rejection;
    /// let res = Rejection::idempotency_in_flight(None).default_response();
    /// assert_eq!(res.status(), 409);
    /// assert_eq!(res.headers()["retry-after"], "1");
    /// assert_eq!(res.headers()["content-type"], "application/problem+json");
    /// ```
    pub fn idempotency_in_flight(retry_after: Option<Duration>) -> Self {
        let wait = whole_secs(retry_after.unwrap_or_default());
        let mut r = Self::new(
            RejectionReason::IdempotencyConflict,
            Some(Middleware::Idempotency),
            format!(
                "a request with this Idempotency-Key is still being processed; retry in {} s",
                wait.as_secs()
            ),
        );
        r.retry_after = Some(wait);
        r
    }

    /// The `Idempotency-Key`'s request completed, but its response was not
    /// stored (too large): 409, no `Retry-After`.
    pub fn idempotency_not_replayable(status: u16) -> Self {
        Self::new(
            RejectionReason::IdempotencyConflict,
            Some(Middleware::Idempotency),
            format!(
                "the request with this Idempotency-Key was already processed (status {status}), \
                 but its response was too large to store and cannot be replayed"
            ),
        )
    }

    /// The claim on the `Idempotency-Key` was lost while its handler ran,
    /// and the handler was cancelled: 503 (gRPC ABORTED), no `Retry-After`.
    /// Nothing was stored, so a retry runs the request.
    ///
    /// ```
    /// use tollgate::tower::rejection::Rejection;
    /// let res = Rejection::idempotency_claim_lost().default_response();
    /// assert_eq!(res.status(), 503);
    /// assert_eq!(res.headers()["content-type"], "application/problem+json");
    /// ```
    pub fn idempotency_claim_lost() -> Self {
        Self::new(
            RejectionReason::LeaseLost,
            Some(Middleware::Idempotency),
            "the claim on this Idempotency-Key was lost while the request was handled; \
             the request was cancelled and may be retried",
        )
    }

    /// The `Idempotency-Key` was used with another payload: 422.
    pub fn idempotency_mismatch() -> Self {
        Self::new(
            RejectionReason::IdempotencyMismatch,
            Some(Middleware::Idempotency),
            "this Idempotency-Key was already used with a different request payload",
        )
    }

    /// The `Idempotency-Key` is missing or malformed: 400 with `message`.
    pub fn invalid_idempotency_key(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(
            RejectionReason::InvalidIdempotencyKey,
            Some(Middleware::Idempotency),
            message,
        )
    }

    /// The request body exceeds `limit` bytes: 413, no `Retry-After`.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            RejectionReason::PayloadTooLarge,
            Some(Middleware::Idempotency),
            format!("the request body exceeds {limit} bytes"),
        )
    }

    /// The request body could not be read: 400.
    pub(crate) fn unreadable_body() -> Self {
        Self::new(
            RejectionReason::Key {
                status: StatusCode::BAD_REQUEST,
            },
            Some(Middleware::Idempotency),
            "the request body could not be read",
        )
    }
}
