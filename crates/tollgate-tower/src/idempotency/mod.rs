//! [`IdempotencyLayer`]: `Idempotency-Key` as tower middleware, after
//! draft-ietf-httpapi-idempotency-key-header (Stripe's API as the
//! behavioural anchor), on an [`IdempotencyStore`](tollgate_core::idempotency::IdempotencyStore)
//! — the library's own fenced leases, on Redis (standalone, Sentinel,
//! Cluster) or in memory.
//!
//! Only the methods that are not idempotent by nature are handled: `POST`
//! and `PATCH`; every other method passes through untouched. For each such
//! request, in the response future:
//!
//! 1. the `Idempotency-Key` header is read: a structured-field string
//!    (`"8e03978e-…"`) or a bare token, 1 to 255 visible ASCII characters
//!    (spaces allowed inside quotes). Missing (when [required](IdempotencyLayer::required),
//!    the default), malformed, or sent twice: **400**;
//! 2. the record is keyed by the caller (the layer's scope
//!    [key extractor](crate::key): an API key, a user, …), the method, the
//!    route (axum's `MatchedPath`, else the path) and the key — one tenant
//!    never sees another's record;
//! 3. the request body is read, up to [`max_request_body`](IdempotencyLayer::max_request_body)
//!    (1 MiB): larger, **413** and nothing stored. The payload's
//!    fingerprint is a SHA-256 of the method, path and query, content type
//!    and body — of a multipart body, its parts between the delimiters and
//!    its content type without the boundary, which a client draws anew for
//!    every request, retries included;
//! 4. the key is claimed, in one round trip:
//!    - **claimed**: the inner service is called (the claim's
//!      [`FencingToken`](tollgate_core::FencingToken) and
//!      [`LeaseLost`](tollgate_core::LeaseLost) are in the request
//!      extensions, unless a layer outside this one — a `LockLayer` or a
//!      `ConcurrencyLimitLayer` — put its own there: a lock's token, which
//!      fences the resource, stays, while this layer watches its claim;
//!      with [`OnLeaseLost::Continue`](crate::lock::OnLeaseLost::Continue)
//!      the claim's replace it, as the handler must watch the claim) while
//!      the claim's lease is renewed. If the lease is
//!      lost before the inner future has produced the response — Redis
//!      unreachable past the lease's safe deadline, or the hold cap of the
//!      store's [`LockOptions`](tollgate_core::LockOptions::max_hold)
//!      reached (10 minutes by default; a longer handler needs a larger
//!      cap) — the inner future is **dropped** (the handler is cancelled at
//!      its next `.await`), the claim abandoned and the request answered
//!      **503**, before the backend lets the key go: a retry never runs
//!      beside it, and the cancelled run stores nothing
//!      ([`OnLeaseLost::Cancel`](crate::lock::OnLeaseLost::Cancel), the
//!      default; see [`on_lease_lost`](IdempotencyLayer::on_lease_lost)).
//!      Its response is **read to the end** in a task of its own, and
//!      a copy kept up to [`max_stored_body`](IdempotencyLayer::max_stored_body);
//!      when [`store_when`](IdempotencyLayer::store_when) says so
//!      (2xx and 4xx except 408, 409 and 429 by default), it is stored
//!      before the client can tell it is whole: a body of known length
//!      that fits is stored before the client is answered; any other (a
//!      stream of events, an LLM's tokens) reaches the client chunk by
//!      chunk as the handler produces it, and only its end and its
//!      trailers wait for the record. It is stored with every header its
//!      body needs to be read as it was sent ([`REPRESENTATION_HEADERS`]: `Content-Type`,
//!      `Content-Encoding`, `Content-Language`, `Content-Location`,
//!      `Content-Range`, `Content-Disposition`, `Vary`, `ETag`,
//!      `Last-Modified`, `Location`) and the
//!      [allow-listed ones](IdempotencyLayer::replay_headers) (`Link` by
//!      default). A body that grows past `max_stored_body` is copied no
//!      further: the key is completed as not replayable at once, and the
//!      rest streams on. When the status is not stored (for
//!      gRPC, whose HTTP status is always 200: a `grpc-status` other than
//!      0), the inner service fails, the response body fails or the request is
//!      dropped before the handler returned (the client went away), the
//!      claim is abandoned so that a retry runs again. Once the handler has
//!      returned, its response is read and stored even if the client goes
//!      away meanwhile (in a task of its own): a retry replays it. A
//!      completion that fails (a timeout, a reset connection, `READONLY`
//!      during a failover) is sent again while the claim's lease lasts; the
//!      response waits for it at most two of the store's round-trip bounds,
//!      then goes out while it goes on. A response that could not be
//!      stored is never released: retries get **409** while the lease
//!      lasts, and the handler does not run twice meanwhile. A fault that
//!      outlasts the lease (at most its TTL after the last renewal) is
//!      treated as a crash of the holder: the record cannot say whether the
//!      handler ran, and the next claim runs it again. So is a response
//!      whose body is still being read when the hold cap ends the lease;
//!    - **completed**: the stored status, headers, byte-identical body and
//!      trailers (a gRPC call's `grpc-status`, `grpc-message` and
//!      `grpc-status-details-bin`, and allow-listed ones) are replayed with
//!      `Idempotent-Replayed: true` — never the original's `Set-Cookie` or
//!      rate-limit headers. A body compressed inside the
//!      layer replays compressed, with its `Content-Encoding`, whatever the
//!      retry accepts: put a compression layer outside this one to
//!      negotiate per request. A response larger than
//!      [`max_stored_body`](IdempotencyLayer::max_stored_body) is stored as
//!      "completed, not replayable": a retry gets **409** saying so, and
//!      the handler never runs twice for one key while its record lives.
//!      That holds for a gRPC stream past `max_stored_body` whatever its
//!      status (its trailers come after the record is written);
//!    - **in flight**: **409** with `Retry-After` (the holder's remaining
//!      lease, whole seconds, at least 1);
//!    - another payload under the same key: **422**;
//!    - the store unavailable (error or timeout): **503** with
//!      `Retry-After: 1` ([`OnUnavailable::Deny`], the default: idempotency
//!      cannot be promised), or the request runs unprotected
//!      ([`OnUnavailable::PassThrough`]). After repeated outages the
//!      store's circuit breaker answers claims at once, without a round
//!      trip, until a probe finds the backend again
//!      ([`circuit_breaker`](tollgate_core::idempotency::IdempotencyStoreBuilder::circuit_breaker)).
//!
//! The layer's answers are RFC 9457 `application/problem+json` documents
//! (gRPC requests get trailers-only responses); see
//! [`crate::rejection`]. A completion is fenced: one whose claim was
//! superseded (the key claimed again after its lease was lost, while its
//! body was read, or with
//! [`OnLeaseLost::Continue`](crate::lock::OnLeaseLost::Continue)) stores
//! nothing — a newer record is never overwritten — and the response still
//! goes to its client; one whose lease merely expired, with nobody
//! claiming since, still stores, and the retries get its response. A lost
//! claim whose client has gone is given up, its body read no further.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{body::Body, routing::post, Router};
//! use http::{Request, StatusCode};
//! use http_body_util::BodyExt;
//! use tollgate::idempotency::IdempotencyStore;
//! use tollgate::MemoryBackend;
//! use tollgate::tower::key::HeaderKey;
//! use tollgate::tower::IdempotencyLayer;
//! use tower::ServiceExt;
//!
//! let store = IdempotencyStore::new(MemoryBackend::new());
//! let app = Router::new()
//!     .route("/orders", post(|body: String| async move { (StatusCode::CREATED, format!("order for {body}")) }))
//!     .layer(IdempotencyLayer::new(store, HeaderKey::new("x-api-key")));
//! let order = |key: &str, body: &'static str| {
//!     Request::post("/orders")
//!         .header("x-api-key", "tenant-1")
//!         .header("idempotency-key", key)
//!         .body(Body::from(body))
//!         .unwrap()
//! };
//!
//! let first = app.clone().oneshot(order("k-1", "2 apples")).await?;
//! assert_eq!(first.status(), StatusCode::CREATED);
//! let replay = app.clone().oneshot(order("k-1", "2 apples")).await?;
//! assert_eq!(replay.status(), StatusCode::CREATED);
//! assert_eq!(replay.headers()["idempotent-replayed"], "true");
//! assert_eq!(replay.into_body().collect().await?.to_bytes(), "order for 2 apples");
//!
//! // The same key with another payload.
//! let other = app.clone().oneshot(order("k-1", "3 pears")).await?;
//! assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
//! assert_eq!(other.headers()["content-type"], "application/problem+json");
//! # Ok(()) }
//! ```
//!
//! # Observability
//!
//! One `tracing` event per outcome (target `tollgate_tower::idempotency`;
//! records appear only as [`Subject::digest`](tollgate_core::Subject::digest))
//! and, with feature `metrics`, `tollgate_idempotency_requests_total{outcome}`:
//! at the claim `claimed`, `replayed`, `not_replayable`, `in_flight`,
//! `mismatch`, `invalid_key`, `too_large`, `key_error`, `unavailable`,
//! `pass_through`; after a claimed request `stored`, `not_stored` (the
//! status is not stored; the claim is abandoned), `abandoned` (inner
//! error, body error, request dropped mid-handler), `lost` (the claim was
//! lost or superseded: the handler cancelled, or nothing stored) or
//! `unavailable` (the response could
//! not be stored: the key stays in flight until its lease expires).

mod future;
mod holding;
mod layer;
mod pipe;
mod relay;
mod service;
mod shared;

use http::header::{HeaderName, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use tollgate_core::idempotency::Fingerprint;

pub use self::future::ResponseFuture;
pub use self::layer::IdempotencyLayer;
pub use self::service::Idempotency;

/// The request header: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header on a replayed response: `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The longest key accepted, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// What the layer does when the store cannot be reached (an error or a
/// timeout).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnUnavailable {
    /// Answer 503 with `Retry-After: 1` (the default).
    #[default]
    Deny,
    /// Run the request without protection, with a warning.
    PassThrough,
}

/// The default of [`IdempotencyLayer::store_when`]: 2xx and 4xx, except
/// 408, 409 and 429 (worth retrying: they are not the request's outcome).
///
/// ```
/// use http::StatusCode;
/// use tollgate::tower::idempotency::default_store_when;
///
/// assert!(default_store_when(StatusCode::CREATED));
/// assert!(default_store_when(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!default_store_when(StatusCode::TOO_MANY_REQUESTS));
/// assert!(!default_store_when(StatusCode::BAD_GATEWAY));
/// ```
pub fn default_store_when(status: StatusCode) -> bool {
    status.is_success() || (status.is_client_error() && !matches!(status.as_u16(), 408 | 409 | 429))
}

/// The representation headers, listed once, and any extra after them.
macro_rules! representation_headers {
    ($($extra:expr),*) => {
        [
            CONTENT_TYPE,
            http::header::CONTENT_ENCODING,
            http::header::CONTENT_LANGUAGE,
            http::header::CONTENT_LOCATION,
            http::header::CONTENT_RANGE,
            http::header::CONTENT_DISPOSITION,
            http::header::VARY,
            http::header::ETAG,
            http::header::LAST_MODIFIED,
            http::header::LOCATION,
            $($extra),*
        ]
    };
}

/// The headers a stored body needs to be read as it was sent, always stored
/// and replayed whatever [`IdempotencyLayer::replay_headers`] lists: the
/// representation headers (`Content-Type`, `Content-Encoding`,
/// `Content-Language`, `Content-Location`, `Content-Range` and the
/// validators `ETag`, `Last-Modified`), `Vary` (what the body was chosen
/// by), `Content-Disposition` and `Location`. Without them a replay is
/// wrong bytes: a gzipped body without its `Content-Encoding` is garbage to
/// the client.
pub const REPRESENTATION_HEADERS: [HeaderName; 10] = representation_headers!();

/// The headers replayed by default: [`REPRESENTATION_HEADERS`] and `Link`.
pub const DEFAULT_REPLAY_HEADERS: [HeaderName; 11] = representation_headers!(http::header::LINK);

/// Headers never replayed, whatever the allow-list says: cookies, the
/// original's rate-limit headers, and what the server computes per
/// response.
fn never_replayed(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "set-cookie"
            | "set-cookie2"
            | "retry-after"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "idempotent-replayed"
    ) || n.starts_with("ratelimit")
        || n.starts_with("x-ratelimit")
}

/// The `Idempotency-Key` of a request: `Ok(None)` when absent, `Err` with
/// the reason when malformed or repeated.
///
/// The draft makes the key a structured-field string; clients mostly send
/// a bare token. A quoted value is parsed as an RFC 8941 sf-string right
/// here — `sfv` would also accept parameters and the other item types,
/// and the bare form is no sf-item at all (a UUID starting with a digit).
pub(crate) fn parse_key(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    const INVALID: &str = "Idempotency-Key must be 1 to 255 visible ASCII characters, \
                           as a bare token or a quoted string";
    let mut all = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err("send one Idempotency-Key header, not several");
    }
    let raw = value.as_bytes();
    let start = raw.iter().position(|b| *b != b' ').unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|b| *b != b' ')
        .map_or(start, |i| i + 1);
    let raw = &raw[start..end];
    let key = match raw.strip_prefix(b"\"") {
        Some(quoted) => sf_string(quoted).ok_or(INVALID)?,
        None if raw.iter().all(|b| (0x21..=0x7e).contains(b)) => raw.to_vec(),
        None => return Err(INVALID),
    };
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(INVALID);
    }
    String::from_utf8(key).map(Some).map_err(|_| INVALID)
}

/// The content of an sf-string after its opening quote: printable ASCII,
/// `\"` and `\\` escapes, the closing quote last (no parameters).
fn sf_string(rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return None,
            },
            b'"' => return bytes.next().is_none().then_some(out),
            0x20..=0x7e => out.push(b),
            _ => return None,
        }
    }
    None
}

/// The payload's fingerprint: a SHA-256 over the method, path and query,
/// content type and body, each length-prefixed (so no two splits collide).
pub(crate) fn fingerprint(parts: &Parts, body: &[u8]) -> Fingerprint {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let content_type = parts.headers.get(CONTENT_TYPE).map(|v| v.as_bytes());
    let mut h = Sha256::new();
    // Each field behind its length: no two field lists hash alike.
    let mut field = |f: &[u8]| {
        h.update((f.len() as u64).to_be_bytes());
        h.update(f);
    };
    field(parts.method.as_str().as_bytes());
    field(path.as_bytes());
    match content_type.and_then(Multipart::of) {
        // A client draws a new boundary per request, retries included: the
        // payload is the parts between the delimiters, whatever it was.
        Some(multipart) => {
            field(multipart.content_type.as_bytes());
            let mut start = 0;
            for at in memchr::memmem::find_iter(body, &multipart.delimiter) {
                field(&body[start..at]);
                start = at + multipart.delimiter.len();
            }
            field(&body[start..]);
        }
        None => {
            field(content_type.unwrap_or(b"\0none"));
            field(body);
        }
    }
    Fingerprint::from_digest(h.finalize().into())
}

/// A multipart body's content type without its boundary, and its delimiter
/// (`--` and the boundary, RFC 2046).
struct Multipart {
    /// The media type and its other parameters, then `;boundary=` and a NUL,
    /// which no header value holds: it reads as no content type sent.
    content_type: String,
    delimiter: Vec<u8>,
}

impl Multipart {
    fn of(content_type: &[u8]) -> Option<Multipart> {
        let mime: mime::Mime = std::str::from_utf8(content_type).ok()?.parse().ok()?;
        if mime.type_() != mime::MULTIPART {
            return None;
        }
        let boundary = mime.get_param(mime::BOUNDARY)?.as_str();
        if boundary.is_empty() {
            return None;
        }
        let mut canonical = mime.essence_str().to_owned();
        // Each value quoted, so a quoted `;` reads as no second parameter.
        for (name, value) in mime.params().filter(|(n, _)| *n != mime::BOUNDARY) {
            let value = value.as_str().replace('\\', "\\\\").replace('"', "\\\"");
            canonical.push_str(&format!(";{name}=\"{value}\""));
        }
        canonical.push_str(";boundary=\0");
        Some(Multipart {
            content_type: canonical,
            delimiter: [b"--", boundary.as_bytes()].concat(),
        })
    }
}

#[cfg(feature = "metrics")]
pub(crate) fn count(outcome: &'static str) {
    metrics::counter!("tollgate_idempotency_requests_total", "outcome" => outcome).increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn count(_outcome: &'static str) {}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn key(values: &[&[u8]]) -> Result<Option<String>, &'static str> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        parse_key(&h)
    }

    #[test]
    fn keys() {
        let ok = |v: &[u8], k: &str| assert_eq!(key(&[v]), Ok(Some(k.to_owned())), "{v:?}");
        ok(b"abc", "abc");
        ok(b"123e4567-e89b-12d3", "123e4567-e89b-12d3");
        ok(b"\"abc\"", "abc");
        ok(b" \"a b\" ", "a b");
        ok(br#""a\"b\\c""#, r#"a"b\c"#);
        ok(b"a\"b", "a\"b");
        ok(&[b'x'; 255], &"x".repeat(255));
        assert_eq!(key(&[]), Ok(None));
        for bad in [
            &b""[..],
            b"\"\"",
            b"   ",
            &[b'x'; 256],
            b"a b",
            b"a\tb",
            b"a\x80b",
            "é".as_bytes(),
            b"\"abc",
            b"\"abc\";p=1",
            b"\"a\\nb\"",
            b"\"a\tb\"",
        ] {
            assert!(key(&[bad]).is_err(), "{bad:?}");
        }
        assert!(key(&[b"a", b"a"]).is_err());
    }

    #[test]
    fn fingerprints_tell_every_field_apart() {
        let parts = |m: &str, uri: &str, ct: Option<&str>| {
            let mut b = http::Request::builder().method(m).uri(uri);
            if let Some(ct) = ct {
                b = b.header(CONTENT_TYPE, ct);
            }
            b.body(()).unwrap().into_parts().0
        };
        let base = fingerprint(&parts("POST", "/a?x=1", Some("a/b")), b"{}");
        assert_eq!(
            base,
            fingerprint(&parts("POST", "/a?x=1", Some("a/b")), b"{}")
        );
        for other in [
            fingerprint(&parts("PATCH", "/a?x=1", Some("a/b")), b"{}"),
            fingerprint(&parts("POST", "/a?x=2", Some("a/b")), b"{}"),
            fingerprint(&parts("POST", "/a?x=1", Some("a/c")), b"{}"),
            fingerprint(&parts("POST", "/a?x=1", None), b"{}"),
            fingerprint(&parts("POST", "/a?x=1", Some("a/b")), b"{ }"),
        ] {
            assert_ne!(base, other);
        }
    }

    /// Records stored before a deploy are matched after it: the digest of
    /// a payload that is not multipart never changes.
    #[test]
    fn fingerprints_stay_what_they_were() {
        let json = http::Request::post("/orders?x=1")
            .header(CONTENT_TYPE, "application/json")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(
            fingerprint(&json, br#"{"qty":1}"#).to_hex(),
            "782a1f40b0f48eb783d597ebe34990e85b04ca07f7f62abdc23a5195d2468fd5"
        );
        let bare = http::Request::post("/orders")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(
            fingerprint(&bare, b"").to_hex(),
            "42dc03eee54c81c31e8dbbd9eca6b47ea9f9d7f2b9ac0e058673e2956a8787bc"
        );
    }

    /// A multipart payload is its parts: a new boundary (as every client
    /// draws per request) is the same payload; other parts are not.
    #[test]
    fn a_multipart_fingerprint_leaves_the_boundary_out() {
        let form = |boundary: &str, value: &str| {
            let parts = http::Request::post("/upload")
                .header(
                    CONTENT_TYPE,
                    format!("multipart/form-data; boundary={boundary}"),
                )
                .body(())
                .unwrap()
                .into_parts()
                .0;
            let body = format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n{value}\r\n--{boundary}--\r\n"
            );
            fingerprint(&parts, body.as_bytes())
        };
        assert_eq!(form("XyZ1", "1"), form("----WebKitFormBoundary7MA4", "1"));
        assert_ne!(form("XyZ1", "1"), form("XyZ1", "2"));
        // Quoted or not, and whatever case the type is written in.
        let quoted = http::Request::post("/upload")
            .header(CONTENT_TYPE, "Multipart/Form-Data; boundary=\"q q\"")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let body = "--q q\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--q q--\r\n";
        assert_eq!(fingerprint(&quoted, body.as_bytes()), form("XyZ1", "1"));
        // A delimiter is not content: a part holding the text the
        // delimiters are replaced by is another payload.
        assert_ne!(form("XyZ1", "1"), form("XyZ1", "1\r\n--XyZ2"));
        // Not the same as the raw body under a content type without a boundary.
        let bare = http::Request::post("/upload")
            .header(CONTENT_TYPE, "multipart/form-data")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let raw = "\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--\r\n";
        assert_ne!(fingerprint(&bare, raw.as_bytes()), form("XyZ1", "1"));
        // A quoted parameter holding `;` is not two parameters.
        let with = |ct: &str| {
            let parts = http::Request::post("/upload")
                .header(CONTENT_TYPE, ct)
                .body(())
                .unwrap()
                .into_parts()
                .0;
            let body = "--B\r\n\r\n1\r\n--B--\r\n";
            fingerprint(&parts, body.as_bytes())
        };
        assert_ne!(
            with("multipart/mixed; a=\"x;b=y\"; boundary=B"),
            with("multipart/mixed; a=x; b=y; boundary=B")
        );
    }

    #[test]
    fn never_replayed_headers() {
        for n in [
            "set-cookie",
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
        ] {
            assert!(never_replayed(&HeaderName::from_static(n)), "{n}");
        }
        assert!(DEFAULT_REPLAY_HEADERS.iter().all(|n| !never_replayed(n)));
    }

    #[test]
    fn the_default_list_holds_what_the_body_needs() {
        for name in &REPRESENTATION_HEADERS {
            assert!(DEFAULT_REPLAY_HEADERS.contains(name), "{name}");
        }
        assert_eq!(
            DEFAULT_REPLAY_HEADERS.len(),
            REPRESENTATION_HEADERS.len() + 1
        );
    }
}
