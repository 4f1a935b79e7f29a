//! Rejections and how they are answered, over HTTP and gRPC.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use tollgate_core::{Algorithm, Decision, DecisionSource, Quota, RateLimiter};

use crate::key::KeyError;

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset` (seconds from now, rounded up).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// Largest Integer a structured field may carry (RFC 9651: 15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Whole seconds in `d`, rounded **up**.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `Retry-After` seconds for a wait of `d`: rounded up, and never 0 (a zero
/// invites an immediate retry that is refused again).
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::response::retry_after_secs;
///
/// assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
/// assert_eq!(retry_after_secs(Duration::ZERO), 1);
/// ```
pub fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// The draft-10 `RateLimit-Policy` / `RateLimit` headers of one limiter:
/// one list member per quota, named after the limiter's policy (`-q0`, `-q1`,
/// … with several quotas). `RateLimit-Policy` is fixed per limiter and made
/// once; `RateLimit` is made per decision.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate_core::Error> {
/// use tollgate_core::{MemoryBackend, Quota, RateLimiter};
/// use tollgate_tower::response::RateLimitHeaders;
///
/// let limiter = RateLimiter::builder(MemoryBackend::new(), tollgate_core::Algorithm::FixedWindow)
///     .quota(Quota::per_minute(100))
///     .name("api")
///     .build()?;
/// let headers = RateLimitHeaders::new(&limiter).for_decision(&limiter.check("k").await?);
/// assert_eq!(headers["ratelimit-policy"], r#""api";q=100;w=60"#);
/// assert!(headers["ratelimit"].to_str().unwrap().starts_with(r#""api";r=99;t="#));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitHeaders {
    items: Vec<String>,
    policy: Option<HeaderValue>,
}

impl RateLimitHeaders {
    /// The formatter for `limiter`'s quotas.
    pub fn new(limiter: &RateLimiter) -> Self {
        let policy = limiter.keyspace().policy();
        let quotas = limiter.quotas();
        let items: Vec<String> = if quotas.len() == 1 {
            vec![sf_string(policy)]
        } else {
            (0..quotas.len())
                .map(|i| sf_string(&format!("{policy}-q{i}")))
                .collect()
        };
        let algorithm = limiter.algorithm();
        let header = quotas
            .iter()
            .zip(&items)
            .map(|(q, item)| {
                let mut s = format!("{item};q={}", sf_integer(algorithm.capacity(q)));
                if let Some(w) = window_secs(algorithm, q) {
                    s.push_str(&format!(";w={}", sf_integer(w)));
                }
                s
            })
            .collect::<Vec<_>>()
            .join(", ");
        RateLimitHeaders {
            policy: HeaderValue::from_str(&header).ok(),
            items,
        }
    }

    /// The `RateLimit-Policy` value.
    pub fn policy(&self) -> Option<&HeaderValue> {
        self.policy.as_ref()
    }

    /// `RateLimit-Policy`, and `RateLimit` when the decision has real
    /// figures: a fail-open decision (the backend was unreachable) reports
    /// the policy only, never made-up remaining counts.
    pub fn for_decision(&self, decision: &Decision) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(p) = &self.policy {
            h.insert(RATELIMIT_POLICY, p.clone());
        }
        if let Some(v) = self.ratelimit_value(decision) {
            h.insert(RATELIMIT, v);
        }
        h
    }

    /// The `RateLimit` value, or `None` for a fail-open decision. Written
    /// into one buffer that becomes the header's bytes without a copy (this
    /// runs on every request).
    pub(crate) fn ratelimit_value(&self, decision: &Decision) -> Option<HeaderValue> {
        if decision.source == DecisionSource::FailOpen {
            return None;
        }
        let mut value = Vec::with_capacity(self.items.iter().map(|i| i.len() + 40).sum());
        let mut digits = itoa::Buffer::new();
        for (i, (q, item)) in decision.quotas.iter().zip(&self.items).enumerate() {
            if i > 0 {
                value.extend_from_slice(b", ");
            }
            value.extend_from_slice(item.as_bytes());
            value.extend_from_slice(b";r=");
            value.extend_from_slice(digits.format(sf_integer(q.remaining)).as_bytes());
            value.extend_from_slice(b";t=");
            value.extend_from_slice(
                digits
                    .format(sf_integer(ceil_secs(q.reset_after)))
                    .as_bytes(),
            );
        }
        HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
    }
}

/// The draft-10 headers for one `decision` of `limiter` (see
/// [`RateLimitHeaders`]; keep one of those to format many decisions).
pub fn rate_limit_headers(limiter: &RateLimiter, decision: &Decision) -> HeaderMap {
    RateLimitHeaders::new(limiter).for_decision(decision)
}

/// The `w` parameter: the quota's window in whole seconds, or `None` when
/// it is not a whole number of seconds (`w` has no sub-second precision, so
/// it is left out rather than misstated). For buckets, the time a full
/// burst takes to refill.
pub(crate) fn window_secs(algorithm: Algorithm, q: &Quota) -> Option<u64> {
    let micros = if algorithm.uses_burst() {
        let num = u128::from(q.period_micros()) * u128::from(q.burst());
        let den = u128::from(q.limit());
        if num % den != 0 {
            return None;
        }
        u64::try_from(num / den).ok()?
    } else {
        q.period_micros()
    };
    (micros > 0 && micros % 1_000_000 == 0).then_some(micros / 1_000_000)
}

/// Which wire protocol rejections are shaped for.
///
/// gRPC clients must never see an HTTP 429 (tonic maps it to UNAVAILABLE,
/// hiding the retry information): gRPC requests are answered with a
/// trailers-only gRPC response instead (HTTP 200, `grpc-status`,
/// `grpc-message`, retry metadata).
///
/// ```
/// use tollgate_tower::response::Protocol;
///
/// let grpc = http::HeaderValue::from_static("application/grpc+proto");
/// let mut headers = http::HeaderMap::new();
/// headers.insert(http::header::CONTENT_TYPE, grpc);
/// assert!(Protocol::Auto.is_grpc(&headers));
/// assert!(!Protocol::Http.is_grpc(&headers));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// gRPC when the request's `content-type` starts with
    /// `application/grpc` (gRPC, gRPC-Web), HTTP otherwise (the default).
    #[default]
    Auto,
    /// Always plain HTTP responses.
    Http,
    /// Always gRPC responses.
    Grpc,
}

impl Protocol {
    /// Whether a request with these headers gets gRPC-shaped rejections.
    pub fn is_grpc(&self, headers: &HeaderMap) -> bool {
        match self {
            Protocol::Http => false,
            Protocol::Grpc => true,
            Protocol::Auto => headers
                .get(CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc")),
        }
    }
}

/// gRPC status codes used by tollgate's rejections: RESOURCE_EXHAUSTED for
/// rate limits, UNAVAILABLE for a backend that is down under the deny
/// policy, ABORTED for busy and lost locks, and the codes matching a key
/// extractor's HTTP status (400 and 413 → INVALID_ARGUMENT, 401 →
/// UNAUTHENTICATED, 403 → PERMISSION_DENIED, 409 → ABORTED, 429 →
/// RESOURCE_EXHAUSTED, 503 → UNAVAILABLE, anything else → INTERNAL).
///
/// ```
/// use tollgate_tower::response::GrpcCode;
/// assert_eq!(GrpcCode::Aborted.code(), 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GrpcCode {
    /// 3
    InvalidArgument,
    /// 8
    ResourceExhausted,
    /// 10
    Aborted,
    /// 13
    Internal,
    /// 14
    Unavailable,
    /// 16
    Unauthenticated,
    /// 7
    PermissionDenied,
}

impl GrpcCode {
    /// The numeric code.
    ///
    /// ```
    /// use tollgate_tower::response::GrpcCode;
    /// assert_eq!(GrpcCode::ResourceExhausted.code(), 8);
    /// assert_eq!(GrpcCode::Unavailable.code(), 14);
    /// ```
    pub fn code(self) -> u8 {
        match self {
            GrpcCode::InvalidArgument => 3,
            GrpcCode::PermissionDenied => 7,
            GrpcCode::ResourceExhausted => 8,
            GrpcCode::Aborted => 10,
            GrpcCode::Internal => 13,
            GrpcCode::Unavailable => 14,
            GrpcCode::Unauthenticated => 16,
        }
    }

    fn from_http(status: StatusCode) -> Self {
        match status.as_u16() {
            400 | 413 => GrpcCode::InvalidArgument,
            401 => GrpcCode::Unauthenticated,
            403 => GrpcCode::PermissionDenied,
            409 => GrpcCode::Aborted,
            429 => GrpcCode::ResourceExhausted,
            503 => GrpcCode::Unavailable,
            _ => GrpcCode::Internal,
        }
    }
}

/// Which middleware refused a request.
///
/// ```
/// use tollgate_tower::response::Middleware;
/// assert_ne!(Middleware::RateLimit, Middleware::Lock);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Middleware {
    /// [`RateLimit`](crate::rate_limit::RateLimit).
    RateLimit,
    /// [`Lock`](crate::lock::Lock).
    Lock,
}

/// Why a request was refused.
///
/// ```
/// use http::StatusCode;
/// use tollgate_tower::response::{Reason, Rejection};
///
/// // A responder that only changes the status of busy locks.
/// let responder = |rej: &Rejection<'_>| {
///     let mut res = rej.default_response();
///     if matches!(rej.reason(), Reason::Busy { .. }) && !rej.is_grpc() {
///         *res.status_mut() = StatusCode::LOCKED;
///     }
///     res
/// };
/// # let _ = responder;
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Reason<'a> {
    /// The rate limit is exhausted (default: 429 / RESOURCE_EXHAUSTED).
    Limited(&'a Decision),
    /// The request costs more than the limit can ever admit, so retrying
    /// cannot help (default: 413 without `Retry-After` / RESOURCE_EXHAUSTED
    /// without retry information).
    CostExceedsCapacity {
        /// The request's cost.
        cost: u64,
        /// The most the limit admits at once.
        capacity: u64,
    },
    /// The backend is unavailable and the failure policy is deny (default:
    /// 503 / UNAVAILABLE).
    Unavailable(&'a tollgate_core::Error),
    /// The key extractor refused the request (default: the error's status /
    /// the matching gRPC code).
    Key(&'a KeyError),
    /// The lock is held by another request (default: 409 with `Retry-After`
    /// from the holder's remaining TTL / ABORTED).
    Busy {
        /// How long the current holder's lease still runs, when known.
        retry_after: Option<Duration>,
    },
    /// The lock's lease was lost while the request was being handled; the
    /// handler was cancelled (default: 503 / ABORTED).
    LeaseLost,
    /// Anything else that went wrong in the middleware (default: 500 /
    /// INTERNAL).
    Internal(&'a tollgate_core::Error),
}

/// A refused request, handed to a custom responder.
///
/// It carries the request's head, the [`Reason`], whether the request is
/// gRPC, and the rate-limit headers the default response would carry; a
/// responder may start from [`Rejection::default_response`] and adjust it.
///
/// ```
/// use bytes::Bytes;
/// use http::StatusCode;
/// use tollgate_tower::response::{Reason, Rejection};
///
/// // A JSON body instead of the default text.
/// let responder = |rej: &Rejection<'_>| {
///     let mut res = rej.default_response();
///     if let Reason::Limited(d) = rej.reason() {
///         *res.body_mut() = Bytes::from(format!(r#"{{"error":"slow down","remaining":{}}}"#, d.remaining));
///         res.headers_mut().insert("content-type", "application/json".parse().unwrap());
///     }
///     res
/// };
/// # let _ = responder;
/// ```
pub struct Rejection<'a> {
    parts: &'a http::request::Parts,
    middleware: Middleware,
    reason: Reason<'a>,
    grpc: bool,
    headers: HeaderMap,
}

impl fmt::Debug for Rejection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("method", &self.parts.method)
            .field("uri", &self.parts.uri)
            .field("middleware", &self.middleware)
            .field("reason", &self.reason)
            .field("grpc", &self.grpc)
            .finish()
    }
}

impl<'a> Rejection<'a> {
    pub(crate) fn new(
        parts: &'a http::request::Parts,
        middleware: Middleware,
        reason: Reason<'a>,
        grpc: bool,
        headers: HeaderMap,
    ) -> Self {
        Rejection {
            parts,
            middleware,
            reason,
            grpc,
            headers,
        }
    }

    /// Which middleware refused the request.
    pub fn middleware(&self) -> Middleware {
        self.middleware
    }

    /// Why the request was refused.
    pub fn reason(&self) -> &Reason<'a> {
        &self.reason
    }

    /// The refused request's head (method, URI, headers, extensions).
    pub fn request(&self) -> &http::request::Parts {
        self.parts
    }

    /// Whether the request is answered as gRPC.
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The headers the default response carries besides `content-type`:
    /// `Retry-After`, `RateLimit-Policy`, `RateLimit` and, when enabled, the
    /// legacy `X-RateLimit-*` headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The response tollgate sends by default.
    pub fn default_response(&self) -> Response<Bytes> {
        let (status, grpc_code, message) = match &self.reason {
            Reason::Limited(d) => {
                let wait = d.retry_after.map(retry_after_secs).unwrap_or(1);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    GrpcCode::ResourceExhausted,
                    format!("rate limit exceeded; retry in {wait} s"),
                )
            }
            Reason::CostExceedsCapacity { cost, capacity } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                GrpcCode::ResourceExhausted,
                format!(
                    "request cost {cost} exceeds the rate limit's capacity {capacity}; it can never be admitted"
                ),
            ),
            Reason::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                GrpcCode::Unavailable,
                match self.middleware {
                    Middleware::RateLimit => "rate limiter unavailable".to_owned(),
                    Middleware::Lock => "lock service unavailable".to_owned(),
                },
            ),
            Reason::Key(e) => (e.status(), GrpcCode::from_http(e.status()), e.message().to_owned()),
            Reason::Busy { retry_after } => (
                StatusCode::CONFLICT,
                GrpcCode::Aborted,
                match retry_after {
                    Some(d) => format!("resource is busy; retry in {} s", retry_after_secs(*d)),
                    None => "resource is busy".to_owned(),
                },
            ),
            Reason::LeaseLost => (
                StatusCode::SERVICE_UNAVAILABLE,
                GrpcCode::Aborted,
                "lock lost while handling the request; the request was cancelled".to_owned(),
            ),
            Reason::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                GrpcCode::Internal,
                "internal error in the middleware".to_owned(),
            ),
        };
        if self.grpc {
            let retry = match &self.reason {
                Reason::Limited(d) => d.retry_after,
                Reason::Busy { retry_after } => *retry_after,
                _ => None,
            };
            grpc_response(grpc_code, &message, retry, &self.headers)
        } else {
            let mut res = Response::new(Bytes::from(format!("{message}\n")));
            *res.status_mut() = status;
            res.headers_mut().extend(self.headers.clone());
            res.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            res
        }
    }
}

/// A custom rejection responder (see [`Rejection`]).
pub(crate) type Responder = Arc<dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync>;

pub(crate) fn respond(responder: Option<&Responder>, rejection: &Rejection<'_>) -> Response<Bytes> {
    match responder {
        Some(r) => r(rejection),
        None => rejection.default_response(),
    }
}

/// A trailers-only gRPC response: HTTP 200, `content-type: application/grpc`,
/// `grpc-status`, `grpc-message`, `extra` as metadata and, with a wait,
/// `retry-after` (seconds, rounded up) and a `google.rpc.RetryInfo` in
/// `grpc-status-details-bin`.
fn grpc_response(
    code: GrpcCode,
    message: &str,
    retry: Option<Duration>,
    extra: &HeaderMap,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let h = res.headers_mut();
    h.extend(extra.clone());
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code.code())));
    if let Ok(v) = HeaderValue::from_str(&grpc_percent_encode(message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    if let Some(wait) = retry {
        h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
        let details = status_with_retry_info(code.code(), message, wait);
        if let Ok(v) = HeaderValue::from_str(&base64_no_pad(&details)) {
            h.insert(GRPC_STATUS_DETAILS, v);
        }
    }
    res
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and `%`.
fn grpc_percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push((field << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A `google.rpc.Status { code, message, details: [Any(RetryInfo)] }`,
/// protobuf-encoded by hand (no protobuf dependency for four fields).
pub(crate) fn status_with_retry_info(code: u8, message: &str, wait: Duration) -> Vec<u8> {
    // google.protobuf.Duration { seconds = 1, nanos = 2 }
    let mut duration = Vec::new();
    if wait.as_secs() > 0 {
        duration.push(1 << 3);
        put_varint(&mut duration, wait.as_secs());
    }
    if wait.subsec_nanos() > 0 {
        duration.push(2 << 3);
        put_varint(&mut duration, u64::from(wait.subsec_nanos()));
    }
    // google.rpc.RetryInfo { retry_delay = 1 }
    let mut retry_info = Vec::new();
    put_bytes(&mut retry_info, 1, &duration);
    // google.protobuf.Any { type_url = 1, value = 2 }
    let mut any = Vec::new();
    put_bytes(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    put_bytes(&mut any, 2, &retry_info);
    // google.rpc.Status { code = 1, message = 2, details = 3 }
    let mut status = Vec::new();
    status.push(1 << 3);
    put_varint(&mut status, u64::from(code));
    put_bytes(&mut status, 2, message.as_bytes());
    put_bytes(&mut status, 3, &any);
    status
}

fn base64_no_pad(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A structured-field String: printable ASCII, `"` and `\` escaped; other
/// characters become `_`.
pub(crate) fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// A structured-field Integer, clamped to the 15 digits RFC 9651 allows.
pub(crate) fn sf_integer(n: u64) -> u64 {
    n.min(SF_INTEGER_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_in_whole_seconds_only() {
        let q = Quota::per_minute(100);
        assert_eq!(window_secs(Algorithm::FixedWindow, &q), Some(60));
        assert_eq!(window_secs(Algorithm::TokenBucket, &q), Some(60));
        let q = Quota::per_second(3);
        assert_eq!(window_secs(Algorithm::Gcra, &q), Some(1));
        let q = Quota::per_second(10).with_burst(20).unwrap();
        assert_eq!(window_secs(Algorithm::TokenBucket, &q), Some(2));
        let q = Quota::new(5, Duration::from_millis(500)).unwrap();
        assert_eq!(window_secs(Algorithm::SlidingWindowLog, &q), None);
        let q = Quota::per_second(3).with_burst(2).unwrap();
        assert_eq!(window_secs(Algorithm::Gcra, &q), None);
    }

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64_no_pad(b""), "");
        assert_eq!(base64_no_pad(b"f"), "Zg");
        assert_eq!(base64_no_pad(b"fo"), "Zm8");
        assert_eq!(base64_no_pad(b"foo"), "Zm9v");
        assert_eq!(base64_no_pad(b"foob"), "Zm9vYg");
        assert_eq!(base64_no_pad(b"fooba"), "Zm9vYmE");
        assert_eq!(base64_no_pad(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn varints() {
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
    }

    #[test]
    fn retry_info_encoding() {
        let s = status_with_retry_info(8, "x", Duration::new(2, 5));
        // code 8, message "x"
        assert_eq!(&s[..5], &[0x08, 0x08, 0x12, 0x01, b'x']);
        let tail = [0x0a, 0x04, 0x08, 0x02, 0x10, 0x05];
        assert!(s.ends_with(&tail), "{s:?}");
        assert!(s
            .windows(40)
            .any(|w| w == b"type.googleapis.com/google.rpc.RetryInfo"));
    }

    #[test]
    fn grpc_message_encoding() {
        assert_eq!(grpc_percent_encode("a b%c\né"), "a b%25c%0A%C3%A9");
    }

    #[test]
    fn sf_strings() {
        assert_eq!(sf_string("api"), "\"api\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("é"), "\"_\"");
    }

    #[test]
    fn rounding() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_secs(Duration::from_micros(2_000_001)), 3);
    }
}
