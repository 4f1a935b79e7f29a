//! The promises at the edges, on every backend: a completion that fails is
//! sent again, so the handler never runs twice; a claim lost while its
//! handler runs cancels the handler, so two never run at once and the lost
//! holder stores nothing; a replay carries every header its body needs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use http::{HeaderName, HeaderValue, StatusCode};
use tollgate_core::{LeaseLost, LockOptions};
use tollgate_testkit::eventually;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::lock::OnLeaseLost;
use tollgate_tower::IdempotencyLayer;
use tower::ServiceExt;

use super::common::idempotency::{builder, collect_whole, failing_completes, store, Kind, BOUND};
use super::common::unique;
use super::{app, held, req, send, with, Handler};

/// The lease of the claims that outlive their cap: renewed every 100 ms,
/// never past 2 s.
fn capped() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(300))
        .max_hold(Duration::from_secs(2))
}

/// A completion that fails once without being applied (a reset
/// connection) is sent again: the retry gets the stored response (or 409
/// while it is being stored), and the handler ran exactly once.
pub(crate) async fn a_failed_completion_runs_the_handler_once(kind: Kind) {
    let (store, attempts) = failing_completes(kind, 1).await;
    let h = Handler::default();
    let app = app(
        IdempotencyLayer::new(store, HeaderKey::new("x-api-key")),
        &h,
    );
    let key = unique("k");
    let order = || req("/orders", "t1", Some(key.as_bytes()), "1");
    let first = send(&app, order()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = eventually(BOUND, "anything but 409 in flight", || async {
        let r = send(&app, order()).await;
        (r.status != StatusCode::CONFLICT).then_some(r)
    })
    .await;
    assert_eq!(h.runs(), 1, "{kind:?}: the handler ran again");
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body, first.body);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

/// A claim lost while its handler runs — here at a short hold cap, as the
/// default 10-minute cap does to a longer handler — cancels the handler:
/// its client gets 503, it never finishes, nothing is stored, and a retry
/// runs it again only after it was dropped: never two at once.
pub(crate) async fn a_lost_claim_cancels_the_handler_and_stores_nothing(kind: Kind) {
    let store = builder(kind).await.lease(capped()).build().unwrap();
    let h = Handler::default();
    let app = app(
        IdempotencyLayer::new(store, HeaderKey::new("x-api-key")),
        &h,
    );
    let key = unique("k");
    let order = || req("/orders", "t1", Some(key.as_bytes()), "1");
    let first = held(&app, &h, &key).await;
    // Before the cap: in flight.
    send(&app, order()).await.assert_problem(409);
    // The send is bounded: a handler left running never answers.
    let first = first
        .await
        .expect("the handler ran on after its claim was lost");
    first.assert_problem(503);
    assert_eq!(h.active(), 0, "the handler was not dropped");
    // Nothing was stored: the retry runs, and its response is the one kept.
    let retried = send(&app, order()).await;
    assert_eq!(retried.status, StatusCode::CREATED, "{:?}", retried.body);
    assert!(!retried.headers.contains_key("idempotent-replayed"));
    let replay = send(&app, order()).await;
    assert_eq!(replay.body, retried.body);
    assert_eq!(h.runs(), 2);
    assert_eq!(h.most_active(), 1, "{kind:?}: two executions at once");
    // Opening the gate cannot make the dropped handler finish.
    h.release.notify_one();
    assert_eq!(h.runs(), 2);
}

/// Runs until its claim's lease is lost, watching the `LeaseLost` the
/// layer put in the request.
async fn watch(State(h): State<Handler>, Extension(lost): Extension<LeaseLost>) -> Response {
    let _running = h.start();
    h.runs.fetch_add(1, Ordering::SeqCst);
    lost.await;
    (StatusCode::CREATED, "finished after the loss").into_response()
}

/// With `OnLeaseLost::Continue` the handler runs on past the loss and its
/// client gets its response; nobody claimed the key since, so the fenced
/// completion still stores, and a retry gets the response replayed rather
/// than running the handler again.
pub(crate) async fn a_lost_claim_continues_when_told(kind: Kind) {
    let store = builder(kind).await.lease(capped()).build().unwrap();
    let layer = IdempotencyLayer::new(store, HeaderKey::new("x-api-key"))
        .on_lease_lost(OnLeaseLost::Continue);
    let h = Handler::default();
    let app = Router::new()
        .route("/watch", post(watch))
        .layer(layer)
        .with_state(h.clone());
    let key = unique("k");
    let r = send(&app, req("/watch", "t1", Some(key.as_bytes()), "1")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.body, "finished after the loss");
    assert_eq!((h.runs(), h.active()), (1, 0));
    let again = send(&app, req("/watch", "t1", Some(key.as_bytes()), "1")).await;
    assert_eq!(
        again.status,
        StatusCode::CREATED,
        "{kind:?}: {:?}",
        again.body
    );
    assert_eq!(again.headers["idempotent-replayed"], "true", "{kind:?}");
    assert_eq!(again.body, "finished after the loss");
    assert_eq!(h.runs(), 1, "{kind:?}: the handler ran again");
}

/// A gzip of `{"order":"gz"}`, as a compression layer inside the
/// idempotency layer would make it.
const GZIP: &[u8] = &[
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xab, 0x56, 0xca, 0x2f, 0x4a, 0x49,
    0x2d, 0x52, 0xb2, 0x52, 0x4a, 0xaf, 0x52, 0xaa, 0x05, 0x00, 0x11, 0xf8, 0x98, 0x4b, 0x0e, 0x00,
    0x00, 0x00,
];

/// The headers that describe a gzipped body (and must come back with it).
const GZIP_HEADERS: [(&str, &str); 8] = [
    ("content-type", "application/json"),
    ("content-encoding", "gzip"),
    ("content-language", "en"),
    ("content-location", "/orders/gz"),
    ("content-disposition", "inline"),
    ("vary", "accept-encoding"),
    ("etag", "\"gz-1\""),
    ("last-modified", "Tue, 15 Nov 1994 08:12:31 GMT"),
];

/// Answers the bytes of [`GZIP`] with [`GZIP_HEADERS`], or (with `x-range`)
/// a 206 of its first 10 bytes.
async fn gzipped(State(h): State<Handler>, headers: http::HeaderMap) -> Response {
    h.runs.fetch_add(1, Ordering::SeqCst);
    let mut res = if headers.contains_key("x-range") {
        let mut res = (StatusCode::PARTIAL_CONTENT, &GZIP[..10]).into_response();
        let range = format!("bytes 0-9/{}", GZIP.len());
        res.headers_mut()
            .insert("content-range", range.parse().unwrap());
        res
    } else {
        (StatusCode::CREATED, GZIP).into_response()
    };
    for (name, value) in GZIP_HEADERS {
        res.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    res.headers_mut()
        .insert("location", HeaderValue::from_static("/orders/gz"));
    res.headers_mut()
        .insert("x-order-id", HeaderValue::from_static("gz"));
    res
}

/// A replay carries every header its body needs — the encoding above all,
/// or the client reads gzip as JSON — with the default allow-list and with
/// one that names only an extra header.
pub(crate) async fn replays_carry_what_the_body_needs(kind: Kind) {
    let only_extra = |layer: IdempotencyLayer<HeaderKey>| {
        layer.replay_headers([HeaderName::from_static("x-order-id")])
    };
    for custom in [false, true] {
        let mut layer = IdempotencyLayer::new(
            builder(kind).await.build().unwrap(),
            HeaderKey::new("x-api-key"),
        );
        if custom {
            layer = only_extra(layer);
        }
        let h = Handler::default();
        let app = Router::new()
            .route("/gzip", post(gzipped))
            .layer(layer)
            .with_state(h.clone());
        for range in [false, true] {
            let key = unique("k");
            let order = || req("/gzip", "t1", Some(key.as_bytes()), "1");
            let ranged = |r| if range { with(r, "x-range", "1") } else { r };
            let first = send(&app, ranged(order())).await;
            let replay = send(&app, ranged(order())).await;
            let what = format!("{kind:?}, custom list {custom}, range {range}");
            assert_eq!(replay.headers["idempotent-replayed"], "true", "{what}");
            assert_eq!(replay.status, first.status, "{what}");
            assert_eq!(replay.body, first.body, "{what}: byte for byte");
            let mut needed: Vec<&str> = GZIP_HEADERS.iter().map(|(n, _)| *n).collect();
            needed.push("location");
            if range {
                needed.push("content-range");
            }
            for name in needed {
                assert!(first.headers.contains_key(name), "{what}: {name}");
                assert_eq!(
                    replay.headers.get(name),
                    first.headers.get(name),
                    "{what}: {name} not replayed"
                );
            }
            assert_eq!(replay.headers.contains_key("x-order-id"), custom, "{what}");
        }
        assert_eq!(h.runs(), 2);
    }
}

/// A gRPC call answers HTTP 200 whatever its outcome: its `grpc-status`
/// says it. A failed call (UNAVAILABLE, trailers-only) is not stored, so a
/// retry runs again; a trailers-only OK replays with its status.
pub(crate) async fn a_failed_grpc_call_is_not_stored(kind: Kind) {
    async fn call(State(h): State<Handler>, headers: http::HeaderMap) -> Response {
        h.runs.fetch_add(1, Ordering::SeqCst);
        let status = headers["x-grpc-status"].clone();
        let mut res = StatusCode::OK.into_response();
        let out = res.headers_mut();
        out.insert("content-type", HeaderValue::from_static("application/grpc"));
        out.insert("grpc-status", status);
        res
    }
    let (h, app) = grpc_app(kind, call).await;
    let key = unique("k");
    let k = Some(key.as_bytes());
    let grpc = |status: &str| with(req("/pkg.Svc/Call", "t1", k, "1"), "x-grpc-status", status);
    // A trailers-only answer ends its stream in its head, as gRPC clients
    // other than tonic require.
    let failed = app.clone().oneshot(grpc("14")).await.unwrap();
    super::common::grpc::assert_trailers_only(failed, "14").await;
    let ok = send(&app, grpc("0")).await;
    assert_eq!(ok.headers["grpc-status"], "0");
    assert_eq!(
        h.runs.load(Ordering::SeqCst),
        2,
        "the failed call was stored"
    );
    let replay = app.clone().oneshot(grpc("0")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    super::common::grpc::assert_trailers_only(replay, "0").await;
    assert_eq!(h.runs.load(Ordering::SeqCst), 2);
}

/// A successful gRPC call ends with trailers (its `grpc-status` 0): it is
/// stored with them, and a retry replays the messages and the trailers —
/// not a 409 saying it cannot be replayed.
pub(crate) async fn a_grpc_call_replays_with_its_trailers(kind: Kind) {
    async fn call(State(h): State<Handler>) -> Response {
        h.runs.fetch_add(1, Ordering::SeqCst);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("grpc-message", HeaderValue::from_static("done"));
        let frames = futures::stream::iter([
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(
                b"\0\0\0\0\x02hi",
            ))),
            Ok(http_body::Frame::trailers(trailers)),
        ]);
        let mut res = Response::new(axum::body::Body::new(http_body_util::StreamBody::new(
            frames,
        )));
        res.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        res
    }
    let (h, app) = grpc_app(kind, call).await;
    let key = unique("k");
    let unary = || req("/pkg.Svc/Call", "t1", Some(key.as_bytes()), "1");
    let (first, data, trailers) = collect_whole(&app, unary()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(trailers["grpc-status"], "0", "{kind:?}");
    let (replay, replayed, again) = collect_whole(&app, unary()).await;
    assert_eq!(replay.status, StatusCode::OK, "{kind:?}");
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.headers["content-type"], "application/grpc");
    assert_eq!(replayed, data, "byte-identical");
    assert_eq!(again["grpc-status"], "0", "{kind:?}");
    assert_eq!(again["grpc-message"], "done");
    assert_eq!(h.runs.load(Ordering::SeqCst), 1, "{kind:?}");
}

/// `call` as the gRPC method `/pkg.Svc/Call` behind a default layer on
/// `kind`, and its handler's state.
async fn grpc_app<H, T>(kind: Kind, call: H) -> (Handler, Router)
where
    H: axum::handler::Handler<T, Handler>,
    T: 'static,
{
    let h = Handler::default();
    let layer = IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key"));
    let app = Router::new()
        .route("/pkg.Svc/Call", post(call))
        .layer(layer)
        .with_state(h.clone());
    (h, app)
}
