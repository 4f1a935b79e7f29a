//! Bad input end to end: a real `axum::serve` on loopback, requests written
//! byte for byte on a `TcpStream` (bytes hyper's client would refuse to
//! send), and a real Redis whose keys are listed afterwards (`SCAN`).
//!
//! For each of CR, LF, NUL and obs-fold in a key header, non-UTF-8 bytes,
//! a 1 MiB header, braces, empty values and spoofed `X-Forwarded-For` /
//! `Forwarded`: the answer is a whole HTTP response with a clear status
//! (the server's 400 or 431, or the key extractor's 401 or the layer's
//! 400), the server keeps serving, and the keys written under the test's
//! prefix are exactly those of the subjects that should have been charged
//! (computed with `RateLimiter::keys_for`) — a brace never becomes a hash
//! tag and a spoofed address never becomes a key.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::{Algorithm, Quota, RateLimiter, RedisBackend, Subject};
#[cfg(feature = "axum")]
use tollgate_tower::key::{ClientIp, ForwardedHeader};
use tollgate_tower::key::{GlobalKey, HeaderKey};
use tollgate_tower::{IdempotencyLayer, RateLimitLayer};

use common::{shared_redis, unique};

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
/// The trusted proxy: connections bound to this loopback address.
#[cfg(feature = "axum")]
const PROXY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
const MIB: usize = 1 << 20;

async fn backend() -> RedisBackend {
    RedisBackend::from_connection(shared_redis().connection_manager().await)
}

async fn limiter(prefix: &str) -> RateLimiter {
    RateLimiter::builder(backend().await, Algorithm::FixedWindow)
        .quota(Quota::per_hour(1000))
        .prefix(prefix)
        .name("bad-input")
        .build()
        .unwrap()
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((LOCAL, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Writes `method path` with `headers` (raw bytes, written as given) and
/// `body` from `from`, and returns the status of the answer; panics if no
/// whole status line comes back within 10 s (a hang, or a connection
/// dropped by a panicking task).
async fn raw(
    addr: SocketAddr,
    from: IpAddr,
    method_path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> StatusCode {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let mut req = format!(
        "{method_path} HTTP/1.1\r\nhost: tollgate.test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (name, value) in headers {
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    let (mut rd, mut wr) = stream.into_split();
    // Written while the answer is read: a server that answers 431 early
    // stops reading, and the rest of the write may fail.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&req).await;
        wr
    });
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 4096];
        loop {
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "{method_path}: no answer within 10 s");
    drop(writer.await);
    let head = String::from_utf8_lossy(&buf[..buf.len().min(12)]).into_owned();
    let code = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("{method_path}: not an HTTP answer: {head:?}"));
    StatusCode::from_u16(code).unwrap()
}

/// Whether `key` is the operator plane's own bookkeeping under `prefix`
/// (the registry, the admin version stamp, a limiter's traffic counts or
/// throttled list): written by the limiters themselves, never from a request.
fn operator_plane_key(prefix: &str, key: &str) -> bool {
    let Some(rest) = key.strip_prefix(prefix).and_then(|k| k.strip_prefix(':')) else {
        return false;
    };
    rest == "registry"
        || rest == "admin:version"
        || rest.starts_with("traffic:{")
        || rest.starts_with("throttled:{")
}

/// Every key under `prefix:` on the shared Redis that a request wrote (the
/// operator plane's own keys left out).
async fn keys_under(prefix: &str) -> BTreeSet<String> {
    let mut conn = shared_redis().connection_manager().await;
    let mut cursor = 0u64;
    let mut out = BTreeSet::new();
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        for k in keys {
            let k = String::from_utf8(k).expect("keys are text");
            if !operator_plane_key(prefix, &k) {
                out.insert(k);
            }
        }
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

/// Redis Cluster's hash tag of `key`.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

/// Each key has exactly one `{` and one `}`, around the tag.
fn assert_one_tag(keys: &BTreeSet<String>) {
    for k in keys {
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
        assert!(hash_tag(k).is_some(), "{k}");
    }
}

/// A header value, the status it gets, and the subject it charges.
type HeaderCase<'a> = (&'a [u8], StatusCode, Option<&'a [u8]>);

/// `HeaderKey` (plain) on Redis: CR, LF, NUL, obs-fold, non-UTF-8, 1 MiB,
/// braces and empty values in `X-Api-Key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_key_bad_bytes_write_only_the_right_keys() {
    let prefix = unique("bad-hk");
    let l = limiter(&prefix).await;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(l.clone()).key(HeaderKey::new("x-api-key").plain()));
    let addr = serve(app).await;

    let big = vec![b'a'; MIB];
    // (value, status, the subject charged)
    let cases: Vec<HeaderCase> = vec![
        (b"plain-key", StatusCode::OK, Some(b"plain-key")),
        (b"\xff\xfe\x80", StatusCode::OK, Some(b"\xff\xfe\x80")),
        (b"{evil}", StatusCode::OK, Some(b"{evil}")),
        (b"a}{b", StatusCode::OK, Some(b"a}{b")),
        (b"{}", StatusCode::OK, Some(b"{}")),
        (b"x:{y}:z%7B", StatusCode::OK, Some(b"x:{y}:z%7B")),
        (b"", StatusCode::UNAUTHORIZED, None),
        (b"   ", StatusCode::UNAUTHORIZED, None),
        (b"a\rb", StatusCode::BAD_REQUEST, None),
        (b"a\x00b", StatusCode::BAD_REQUEST, None),
        (b"a\nb", StatusCode::BAD_REQUEST, None),
        (b"a\r\n b", StatusCode::BAD_REQUEST, None),
        // A CR LF ends the field: what follows is a header of its own, and
        // the key is what came before.
        (
            b"first\r\nx-api-key: second",
            StatusCode::OK,
            Some(b"first"),
        ),
        (b"c\r\nx-injected: {1}", StatusCode::OK, Some(b"c")),
        (&big, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, None),
    ];
    let mut expected = BTreeSet::new();
    for (value, status, subject) in &cases {
        let got = raw(addr, LOCAL, "GET /", &[("x-api-key", value)], b"").await;
        let shown = String::from_utf8_lossy(&value[..value.len().min(40)]).into_owned();
        assert_eq!(got, *status, "x-api-key: {shown:?}");
        if let Some(s) = subject {
            expected.extend(l.keys_for(&Subject::new(s)));
        }
    }
    // Still serving.
    let ok = raw(addr, LOCAL, "GET /", &[("x-api-key", b"after")], b"").await;
    assert_eq!(ok, StatusCode::OK);
    expected.extend(l.keys_for(&Subject::new("after")));

    let written = keys_under(&prefix).await;
    assert_eq!(written, expected);
    assert_one_tag(&written);
    for k in &written {
        let tag = hash_tag(k).unwrap();
        assert!(!tag.contains(['{', '}', ' ', '\r', '\n']), "{k}");
    }
}

/// `ClientIp` behind the trusted proxy 127.0.0.2 on Redis: spoofed
/// `X-Forwarded-For` and `Forwarded` from an untrusted peer, garbage and
/// smuggled hops through the proxy.
#[cfg(feature = "axum")] // the peer comes from axum's `ConnectInfo`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarding_headers_never_become_the_key() {
    let (xff_prefix, fwd_prefix) = (unique("bad-xff"), unique("bad-fwd"));
    let (xff, fwd) = (limiter(&xff_prefix).await, limiter(&fwd_prefix).await);
    let trusted = ClientIp::trusted_proxies([PROXY.to_string()]).unwrap();
    let xff_addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(xff.clone()).key(trusted.clone())),
    )
    .await;
    let fwd_addr =
        serve(Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::new(fwd.clone()).key(trusted.header(ForwardedHeader::Forwarded)),
        ))
        .await;

    // (from, header, value, the client charged)
    let xff_cases: Vec<(IpAddr, &str, &[u8], &str)> = vec![
        (LOCAL, "x-forwarded-for", b"6.6.6.6", "127.0.0.1"),
        (LOCAL, "x-forwarded-for", b"6.6.6.6, 127.0.0.2", "127.0.0.1"),
        (LOCAL, "x-forwarded-for", b"{evil}", "127.0.0.1"),
        (LOCAL, "x-forwarded-for", b"\xff\xfe", "127.0.0.1"),
        (LOCAL, "x-real-ip", b"6.6.6.6", "127.0.0.1"),
        (LOCAL, "forwarded", b"for=6.6.6.6", "127.0.0.1"),
        (
            PROXY,
            "x-forwarded-for",
            b"6.6.6.6, 203.0.113.9",
            "203.0.113.9",
        ),
        (
            PROXY,
            "x-forwarded-for",
            b"\", 198.51.100.7",
            "198.51.100.7",
        ),
        (
            PROXY,
            "x-forwarded-for",
            b"\xff{x}, 198.51.100.8",
            "198.51.100.8",
        ),
        (
            PROXY,
            "x-forwarded-for",
            b"6.6.6.6, unknown{x}",
            "127.0.0.2",
        ),
        (PROXY, "x-forwarded-for", b"", "127.0.0.2"),
    ];
    let mut expected = BTreeSet::new();
    for (from, name, value, client) in &xff_cases {
        let got = raw(xff_addr, *from, "GET /", &[(name, value)], b"").await;
        assert_eq!(got, StatusCode::OK, "{from} {name}: {value:?}");
        expected.extend(xff.keys_for(&Subject::from(client.parse::<IpAddr>().unwrap())));
    }
    // A bare CR is refused by the server before any key is read.
    let got = raw(
        xff_addr,
        PROXY,
        "GET /",
        &[("x-forwarded-for", b"6.6.6.6\r, 1.1.1.1")],
        b"",
    )
    .await;
    assert_eq!(got, StatusCode::BAD_REQUEST);

    let fwd_cases: Vec<(IpAddr, &[u8], &str)> = vec![
        (LOCAL, b"for=6.6.6.6", "127.0.0.1"),
        (PROXY, b"for=6.6.6.6, for=203.0.113.10", "203.0.113.10"),
        // A quoted value the proxy copied from the client cannot smuggle a for=.
        (
            PROXY,
            b"host=\"a;for=6.6.6.6;b=\";for=203.0.113.11",
            "203.0.113.11",
        ),
        (PROXY, b"for=\"x, for=203.0.113.12", "203.0.113.12"),
        (PROXY, b"for=\"{6.6.6.6}\"", "127.0.0.2"),
    ];
    let mut expected_fwd = BTreeSet::new();
    for (from, value, client) in &fwd_cases {
        let got = raw(fwd_addr, *from, "GET /", &[("forwarded", value)], b"").await;
        assert_eq!(got, StatusCode::OK, "{from} forwarded: {value:?}");
        expected_fwd.extend(fwd.keys_for(&Subject::from(client.parse::<IpAddr>().unwrap())));
    }

    let (written, written_fwd) = (keys_under(&xff_prefix).await, keys_under(&fwd_prefix).await);
    assert_eq!(written, expected);
    assert_eq!(written_fwd, expected_fwd);
    for k in written.iter().chain(&written_fwd) {
        assert!(
            !k.contains("6.6.6.6"),
            "a spoofed address became a key: {k}"
        );
    }
    assert_one_tag(&written);
    assert_one_tag(&written_fwd);
}

/// Percent-decodes one escaped part of a key's tag.
fn unescape(part: &str) -> Vec<u8> {
    let b = part.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            match u8::from_str_radix(hex, 16) {
                Ok(v) => {
                    out.push(v);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b[i]),
            }
        } else {
            out.push(b[i]);
        }
        i += 1;
    }
    out
}

/// `IdempotencyLayer` on Redis: braces in the key stay inside the record's
/// tag; CR, non-UTF-8, empty and 1 MiB keys are refused and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_bad_bytes_write_only_the_right_records() {
    let prefix = unique("bad-idem");
    let store = IdempotencyStore::builder(backend().await)
        .prefix(&prefix)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/orders", post(|| async { (StatusCode::CREATED, "made") }))
        .layer(IdempotencyLayer::new(store, GlobalKey));
    let addr = serve(app).await;

    let big = vec![b'k'; MIB];
    let cases: Vec<(&[u8], StatusCode)> = vec![
        (b"{evil}", StatusCode::CREATED),
        (b"\"a{b}c\"", StatusCode::CREATED),
        (b"}{", StatusCode::CREATED),
        (b"\xff\xfe", StatusCode::BAD_REQUEST),
        (b"", StatusCode::BAD_REQUEST),
        (b"\"unterminated", StatusCode::BAD_REQUEST),
        (b"a\rb", StatusCode::BAD_REQUEST),
        (&big, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
    ];
    for (value, status) in &cases {
        let got = raw(
            addr,
            LOCAL,
            "POST /orders",
            &[("idempotency-key", value)],
            b"{}",
        )
        .await;
        let shown = String::from_utf8_lossy(&value[..value.len().min(40)]).into_owned();
        assert_eq!(got, *status, "idempotency-key: {shown:?}");
    }

    let written = keys_under(&prefix).await;
    assert_one_tag(&written);
    // One tag per accepted key, and each tag holds that key as an escaped
    // part (the braces are content, not a tag of their own).
    let tags: BTreeSet<&str> = written.iter().map(|k| hash_tag(k).unwrap()).collect();
    let accepted: [&[u8]; 3] = [b"{evil}", b"a{b}c", b"}{"];
    assert_eq!(tags.len(), accepted.len(), "{written:?}");
    for key in accepted {
        let holders: Vec<&&str> = tags
            .iter()
            .filter(|t| t.split(':').any(|part| unescape(part) == key))
            .collect();
        assert_eq!(holders.len(), 1, "{key:?} in {tags:?}");
    }
}
