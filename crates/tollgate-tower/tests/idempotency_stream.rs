//! `IdempotencyLayer` with streaming response bodies, on memory, a
//! standalone Redis and a three-master cluster: a body of unknown length
//! reaches its client as it comes and is replayed whole once it ended; a
//! body larger than `max_stored_body` streams and is recorded as not
//! replayable; a client that goes away mid-body leaves the response to be
//! read and stored, so a retry replays it.
//!
//! Bodies are fed through a channel the test controls, never by sleeps;
//! every wait is bounded.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tollgate_testkit::eventually;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::IdempotencyLayer;
use tower::ServiceExt;

use common::idempotency::{builder, collect as send, store, Kind, BOUND};
use common::unique;

/// A handler whose first run answers 201 with a body fed by the test
/// (`feed`'s sender); later runs answer `again`.
#[derive(Clone)]
struct Streamer {
    runs: Arc<AtomicUsize>,
    feed: Arc<Mutex<Option<mpsc::Receiver<Bytes>>>>,
}

impl Streamer {
    /// The handler, and the sender of its body's chunks (capacity 1: a
    /// second send returns only once the first chunk has been read).
    fn new() -> (Streamer, mpsc::Sender<Bytes>) {
        let (tx, rx) = mpsc::channel(1);
        let s = Streamer {
            runs: Arc::default(),
            feed: Arc::new(Mutex::new(Some(rx))),
        };
        (s, tx)
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

async fn stream(State(s): State<Streamer>) -> Response {
    s.runs.fetch_add(1, Ordering::SeqCst);
    let Some(rx) = s.feed.lock().unwrap().take() else {
        return (StatusCode::CREATED, "again").into_response();
    };
    let chunks = futures::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, Infallible>(chunk), rx))
    });
    (StatusCode::CREATED, Body::from_stream(chunks)).into_response()
}

fn app(layer: IdempotencyLayer<HeaderKey>, s: &Streamer) -> Router {
    Router::new()
        .route("/exports", post(stream))
        .layer(layer)
        .with_state(s.clone())
}

fn req(key: &str) -> Request<Body> {
    Request::post("/exports")
        .header("x-api-key", "t1")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .unwrap()
}

async fn suite(kind: Kind) {
    a_body_too_large_to_store_streams(kind).await;
    a_streamed_body_reaches_its_client_as_it_comes(kind).await;
    a_stalled_client_does_not_hold_the_record_back(kind).await;
    a_body_not_stored_is_read_no_further_once_its_client_left(kind).await;
    a_large_response_that_is_not_stored_lets_a_retry_run(kind).await;
    a_claim_lost_while_its_body_is_read_lets_a_retry_run(kind).await;
    a_request_dropped_after_its_handler_returned_is_stored(kind).await;
}

idempotency_on_every_backend!(suite);

/// Past `max_stored_body`, the layer stops buffering: the client gets the
/// head and the bytes read so far while the handler's body is still open,
/// then the rest as it comes; the key is completed as not replayable.
async fn a_body_too_large_to_store_streams(kind: Kind) {
    let (s, tx) = Streamer::new();
    let layer =
        IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key")).max_stored_body(16);
    let app = app(layer, &s);
    let key = unique("k");
    let first = tokio::spawn(app.clone().oneshot(req(&key)));
    tx.send(Bytes::from_static(b"0123456789")).await.unwrap();
    tx.send(Bytes::from_static(b"abcdefghij")).await.unwrap();
    let res = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the response comes before its body ends")
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 201);
    let mut body = res.into_body();
    let mut got = Vec::new();
    while got.len() < 20 {
        let frame = tokio::time::timeout(BOUND, body.frame())
            .await
            .expect("the bytes read reach the client")
            .expect("the body is still open")
            .unwrap();
        got.extend_from_slice(&frame.into_data().unwrap());
    }
    assert_eq!(got, b"0123456789abcdefghij");

    // Completed already: a retry is refused, the body still streaming.
    let (status, _, problem) = send(&app, req(&key)).await;
    assert_eq!(status, 409);
    let problem = std::str::from_utf8(&problem).unwrap();
    assert!(problem.contains("too large"), "{problem}");

    tx.send(Bytes::from_static(b"-the-rest")).await.unwrap();
    drop(tx);
    let rest = tokio::time::timeout(BOUND, body.collect())
        .await
        .expect("bounded")
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "-the-rest");
    let (status, _, _) = send(&app, req(&key)).await;
    assert_eq!(status, 409);
    assert_eq!(s.runs(), 1, "never twice for one key");
}

/// Sends `POST /exports` with `key`, feeds its handler's body `chunk`, and
/// returns the response's body once that chunk has reached the client (the
/// handler's body still open).
async fn first_chunk(
    app: &Router,
    key: &str,
    tx: &mpsc::Sender<Bytes>,
    chunk: &'static str,
) -> Body {
    let first = tokio::spawn(app.clone().oneshot(req(key)));
    tx.send(Bytes::from_static(chunk.as_bytes())).await.unwrap();
    let res = tokio::time::timeout(BOUND, first)
        .await
        .expect("the response comes before its body ends")
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 201);
    let mut body = res.into_body();
    let frame = tokio::time::timeout(BOUND, body.frame())
        .await
        .expect("the first chunk reaches the client while the body is open")
        .expect("the body is still open")
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), chunk);
    body
}

/// The replay of `key` once its record is stored (409 until then).
async fn replayed(app: &Router, key: &str, what: &str) -> Bytes {
    let (status, headers, body) = eventually(BOUND, what, || async {
        let r = send(app, req(key)).await;
        (r.0 != StatusCode::CONFLICT).then_some(r)
    })
    .await;
    assert_eq!(status, 201);
    assert_eq!(headers["idempotent-replayed"], "true");
    body
}

/// A body of unknown length (a stream of events, an LLM's tokens) reaches
/// its client chunk by chunk while the handler still produces it; a retry
/// meanwhile is told the key is in flight, and once the body has ended it
/// is replayed whole.
async fn a_streamed_body_reaches_its_client_as_it_comes(kind: Kind) {
    let (s, tx) = Streamer::new();
    let layer = IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key"));
    let app = app(layer, &s);
    let key = unique("k");
    let body = first_chunk(&app, &key, &tx, "event: 1\n\n").await;

    let (status, _, problem) = send(&app, req(&key)).await;
    assert_eq!(status, 409, "{kind:?}");
    let problem = std::str::from_utf8(&problem).unwrap();
    assert!(problem.contains("still being processed"), "{problem}");

    tx.send(Bytes::from_static(b"event: 2\n\n")).await.unwrap();
    drop(tx);
    let rest = tokio::time::timeout(BOUND, body.collect())
        .await
        .expect("bounded")
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "event: 2\n\n");
    // The body's end waited for the record: a retry now replays it.
    let (status, headers, replay) = send(&app, req(&key)).await;
    assert_eq!(status, 201, "{kind:?}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replay, "event: 1\n\nevent: 2\n\n");
    assert_eq!(s.runs(), 1, "never twice for one key");
}

/// The handler has returned (its body is being read) when the client goes
/// away: the side effect is done, so the response is still read and stored,
/// and a retry replays it instead of running the handler again.
async fn a_request_dropped_after_its_handler_returned_is_stored(kind: Kind) {
    let (s, tx) = Streamer::new();
    let layer = IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key"));
    let app = app(layer, &s);
    let key = unique("k");
    // The client goes away mid-body.
    drop(first_chunk(&app, &key, &tx, "part1,").await);
    // The body goes on, and ends.
    tx.send(Bytes::from_static(b"part2,")).await.unwrap();
    let _ = tx.send(Bytes::from_static(b"part3")).await;
    drop(tx);
    let body = replayed(&app, &key, "the dropped request's response stored").await;
    assert_eq!(body, "part1,part2,part3");
    assert_eq!(s.runs(), 1, "never twice for one key");
}

/// The body is read at the handler's pace, not the client's: a client that
/// reads one chunk and stalls does not keep the record waiting (its claim's
/// lease could run out meanwhile, and the handler run again).
async fn a_stalled_client_does_not_hold_the_record_back(kind: Kind) {
    let (s, tx) = Streamer::new();
    let layer = IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key"));
    let app = app(layer, &s);
    let key = unique("k");
    let stalled = first_chunk(&app, &key, &tx, "0,").await;
    // Far more chunks than any read-ahead, none read by the client.
    let mut whole = String::from("0,");
    for i in 1..64 {
        let chunk = format!("{i},");
        whole.push_str(&chunk);
        tokio::time::timeout(BOUND, tx.send(Bytes::from(chunk)))
            .await
            .expect("the handler's body is read while its client stalls")
            .unwrap();
    }
    drop(tx);
    let body = replayed(&app, &key, "stored while the client stalls").await;
    assert_eq!(body, whole, "{kind:?}");
    assert_eq!(s.runs(), 1);
    // What waited for the client waited as its bytes, not frame by frame:
    // the 63 unread chunks come as one frame, then the end.
    let mut stalled = stalled;
    let mut frames = Vec::new();
    while let Some(frame) = tokio::time::timeout(BOUND, stalled.frame()).await.unwrap() {
        frames.push(frame.unwrap().into_data().unwrap());
    }
    assert_eq!(frames.len(), 1, "{kind:?}: {frames:?}");
    assert_eq!(frames[0], whole["0,".len()..], "{kind:?}");
}

/// Past `max_stored_body` nothing more is stored: once the client has gone,
/// the handler's body is read no further (a download or an endless stream
/// is not drained for nobody).
async fn a_body_not_stored_is_read_no_further_once_its_client_left(kind: Kind) {
    let (s, tx) = Streamer::new();
    let layer =
        IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key")).max_stored_body(4);
    let app = app(layer, &s);
    let key = unique("k");
    drop(first_chunk(&app, &key, &tx, "0123456789").await);
    // The next chunk finds nobody to read it: the handler's body is dropped.
    let _ = tx.send(Bytes::from_static(b"more")).await;
    tokio::time::timeout(BOUND, tx.closed())
        .await
        .expect("the handler's body is dropped once its client left");
    let (status, _, _) = send(&app, req(&key)).await;
    assert_eq!(status, 409, "completed, not replayable");
    assert_eq!(s.runs(), 1);
}

/// A status that is not stored (a 503) is abandoned whatever its body's
/// length: past `max_stored_body` too, a retry runs again rather than
/// being told the response cannot be replayed.
async fn a_large_response_that_is_not_stored_lets_a_retry_run(kind: Kind) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let unavailable = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { (StatusCode::SERVICE_UNAVAILABLE, "0123456789") }
    };
    let layer =
        IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key")).max_stored_body(4);
    let app = Router::new()
        .route("/exports", post(unavailable))
        .layer(layer);
    let key = unique("k");
    let (status, _, body) = send(&app, req(&key)).await;
    assert_eq!(
        (status, body.as_ref()),
        (StatusCode::SERVICE_UNAVAILABLE, &b"0123456789"[..])
    );
    let (status, _, _) = eventually(BOUND, "the claim abandoned", || async {
        let r = send(&app, req(&key)).await;
        (r.0 != StatusCode::CONFLICT).then_some(r)
    })
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{kind:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "{kind:?}");
}

/// A claim lost while its response is still read (here its hold cap ends
/// it) lets a retry claim the key and run, as after a crash of the holder
/// (the first's completion, fenced, can then never overwrite the retry's
/// record), while the first response still goes on to its client — and is
/// read no further once that client has gone.
async fn a_claim_lost_while_its_body_is_read_lets_a_retry_run(kind: Kind) {
    let (s, tx) = Streamer::new();
    let options = tollgate_core::LockOptions::new()
        .ttl(Duration::from_millis(300))
        .max_hold(Duration::from_secs(1));
    let store = builder(kind).await.lease(options).build().unwrap();
    let app = app(
        IdempotencyLayer::new(store, HeaderKey::new("x-api-key")),
        &s,
    );
    let key = unique("k");
    let mut body = first_chunk(&app, &key, &tx, "0,").await;
    // The handler's body goes on; the claim's hold cap ends the claim.
    let (status, _, again) = eventually(BOUND, "the lost claim let go", || async {
        let r = send(&app, req(&key)).await;
        (r.0 != StatusCode::CONFLICT).then_some(r)
    })
    .await;
    assert_eq!(
        (status, again.as_ref()),
        (StatusCode::CREATED, &b"again"[..]),
        "{kind:?}"
    );
    assert_eq!(s.runs(), 2);
    tx.send(Bytes::from_static(b"1,")).await.unwrap();
    let frame = tokio::time::timeout(BOUND, body.frame())
        .await
        .expect("the first response still reaches its client")
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), "1,");
    // Nothing to store: once its client has gone, the body is read no
    // further (an endless stream is not read for nobody).
    drop(body);
    let _ = tx.send(Bytes::from_static(b"2,")).await;
    tokio::time::timeout(BOUND, tx.closed())
        .await
        .expect("the handler's body is dropped once its client left");
}
