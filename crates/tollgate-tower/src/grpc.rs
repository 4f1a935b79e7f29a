//! gRPC-shaped rejections: which requests get them ([`Protocol`]), their
//! status codes ([`GrpcCode`]) and the trailers-only response itself.
//!
//! gRPC clients must never see an HTTP 429: tonic maps it to UNAVAILABLE
//! and hides the retry information. A gRPC request is answered with a
//! trailers-only gRPC response instead: HTTP 200, `grpc-status`,
//! `grpc-message`, and, with a wait, `retry-after` plus a
//! `google.rpc.RetryInfo` in `grpc-status-details-bin`.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use prost::Message;

use crate::headers::retry_after_secs;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// Which wire protocol rejections are shaped for.
///
/// ```
/// use tollgate::tower::grpc::Protocol;
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

    /// The content type a gRPC-shaped answer to a request with `headers`
    /// carries, or `None` when it gets an HTTP one: a gRPC-Web request's
    /// own (`application/grpc-web+proto`, `-text`, …), which its client
    /// checks; else `application/grpc`.
    pub(crate) fn grpc_content_type(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        if !self.is_grpc(headers) {
            return None;
        }
        let web = headers
            .get(CONTENT_TYPE)
            .filter(|v| v.as_bytes().starts_with(b"application/grpc-web"));
        Some(
            web.cloned()
                .unwrap_or(HeaderValue::from_static("application/grpc")),
        )
    }
}

/// gRPC status codes used by tollgate's rejections (see
/// [`RejectionReason`](crate::rejection::RejectionReason) for which reason
/// gets which).
///
/// ```
/// use tollgate::tower::grpc::GrpcCode;
/// assert_eq!(GrpcCode::Aborted.code(), 10);
/// assert_eq!(GrpcCode::ResourceExhausted.code(), 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GrpcCode {
    /// 3
    InvalidArgument,
    /// 7
    PermissionDenied,
    /// 8
    ResourceExhausted,
    /// 9
    FailedPrecondition,
    /// 10
    Aborted,
    /// 13
    Internal,
    /// 14
    Unavailable,
    /// 16
    Unauthenticated,
}

impl GrpcCode {
    /// The numeric code.
    pub fn code(self) -> u8 {
        match self {
            GrpcCode::InvalidArgument => 3,
            GrpcCode::PermissionDenied => 7,
            GrpcCode::ResourceExhausted => 8,
            GrpcCode::FailedPrecondition => 9,
            GrpcCode::Aborted => 10,
            GrpcCode::Internal => 13,
            GrpcCode::Unavailable => 14,
            GrpcCode::Unauthenticated => 16,
        }
    }

    /// The code matching an HTTP status a key extractor answered with:
    /// 400 and 413 → INVALID_ARGUMENT, 401 → UNAUTHENTICATED, 403 →
    /// PERMISSION_DENIED, 409 → ABORTED, 429 → RESOURCE_EXHAUSTED, 503 →
    /// UNAVAILABLE, anything else → INTERNAL.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::tower::grpc::GrpcCode;
    /// assert_eq!(GrpcCode::from_http(StatusCode::UNAUTHORIZED), GrpcCode::Unauthenticated);
    /// ```
    pub fn from_http(status: StatusCode) -> Self {
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

/// `google.rpc.Status` (google/rpc/status.proto).
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo` (google/rpc/error_details.proto).
#[derive(Clone, PartialEq, Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// A `google.rpc.Status { code, message, details: [RetryInfo] }`, encoded.
pub(crate) fn status_with_retry_info(code: u8, message: &str, wait: Duration) -> Vec<u8> {
    let retry = RetryInfo {
        retry_delay: Some(ProtoDuration {
            seconds: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
            nanos: wait.subsec_nanos() as i32,
        }),
    };
    RpcStatus {
        code: i32::from(code),
        message: message.to_owned(),
        details: vec![Any {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".to_owned(),
            value: retry.encode_to_vec(),
        }],
    }
    .encode_to_vec()
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and `%`
/// (the gRPC HTTP/2 protocol spec).
const GRPC_MESSAGE_ESCAPES: &AsciiSet = &CONTROLS.add(b'%');

/// A trailers-only gRPC response: HTTP 200, `content_type`
/// (`application/grpc`, or a gRPC-Web request's own), `grpc-status`,
/// `grpc-message`, `extra` as metadata and, with a wait,
/// `retry-after` (seconds, rounded up) and a `google.rpc.RetryInfo` in
/// `grpc-status-details-bin`.
pub(crate) fn trailers_only(
    content_type: HeaderValue,
    code: GrpcCode,
    message: &str,
    retry: Option<Duration>,
    extra: &HeaderMap,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let h = res.headers_mut();
    h.extend(extra.clone());
    h.insert(CONTENT_TYPE, content_type);
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code.code())));
    let encoded = utf8_percent_encode(message, GRPC_MESSAGE_ESCAPES).to_string();
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        h.insert(GRPC_MESSAGE, v);
    }
    if let Some(wait) = retry {
        h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
        let details = status_with_retry_info(code.code(), message, wait);
        let details = base64::engine::general_purpose::STANDARD_NO_PAD.encode(details);
        if let Ok(v) = HeaderValue::from_str(&details) {
            h.insert(GRPC_STATUS_DETAILS, v);
        }
    }
    res
}

/// The trailers that end a gRPC response's stream with `code` and
/// `message` (where an HTTP body could only break off).
pub(crate) fn status_trailers(code: GrpcCode, message: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code.code())));
    let encoded = utf8_percent_encode(message, GRPC_MESSAGE_ESCAPES).to_string();
    if let Ok(v) = HeaderValue::from_str(&encoded) {
        h.insert(GRPC_MESSAGE, v);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let decoded = RpcStatus::decode(s.as_slice()).unwrap();
        assert_eq!(decoded.code, 8);
        let retry = RetryInfo::decode(decoded.details[0].value.as_slice()).unwrap();
        assert_eq!(
            retry.retry_delay,
            Some(ProtoDuration {
                seconds: 2,
                nanos: 5
            })
        );
    }

    fn grpc() -> HeaderValue {
        HeaderValue::from_static("application/grpc")
    }

    #[test]
    fn grpc_message_encoding() {
        let res = trailers_only(
            grpc(),
            GrpcCode::Internal,
            "a b%c\né",
            None,
            &HeaderMap::new(),
        );
        assert_eq!(res.headers()[GRPC_MESSAGE], "a b%25c%0A%C3%A9");
    }

    #[test]
    fn details_are_unpadded_base64() {
        let res = trailers_only(
            grpc(),
            GrpcCode::ResourceExhausted,
            "slow down",
            Some(Duration::from_millis(1500)),
            &HeaderMap::new(),
        );
        let details = res.headers()[GRPC_STATUS_DETAILS].to_str().unwrap();
        assert!(!details.ends_with('='));
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(details)
            .unwrap();
        assert_eq!(
            RpcStatus::decode(bytes.as_slice()).unwrap().message,
            "slow down"
        );
        assert_eq!(res.headers()[RETRY_AFTER], "2");
    }
}
