//! `IdempotencyLayer`: the draft's statuses on memory, a standalone Redis
//! and a three-master cluster — a first run and a byte-identical replay,
//! 422 for another payload, 409 while in flight, 400 for bad keys, 413 for a
//! big body, a 5xx or a dropped request abandoned so a retry runs, exactly
//! one handler run under concurrent retries, scopes kept apart — and a dead
//! Redis with either `OnUnavailable`.
//!
//! Handlers are held in flight with a `tokio::sync::Notify` the test
//! releases, never by sleeps; every wait is bounded. The promises at the
//! edges (a failed completion, a lost claim, the headers a replay needs)
//! are in `idempotency/edges.rs`.

mod common;
#[path = "idempotency/edges.rs"]
mod edges;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tokio::sync::Notify;
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::RedisBackend;
use tollgate_testkit::eventually;
use tollgate_tower::idempotency::OnUnavailable;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::IdempotencyLayer;

use common::idempotency::{collect, store, Kind, BOUND};
use common::unique;

/// What the handler shares with the test: how often it ran, how many runs
/// were ever under way at once, and a gate that holds requests sent with
/// `x-hold`.
#[derive(Clone, Default)]
struct Handler {
    runs: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
    most_active: Arc<AtomicUsize>,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

impl Handler {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Runs under way now (a cancelled run is over when it is dropped).
    fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// The most runs ever under way at once.
    fn most_active(&self) -> usize {
        self.most_active.load(Ordering::SeqCst)
    }

    /// Counts a run as under way until the guard is dropped.
    fn start(&self) -> Running {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_active.fetch_max(now, Ordering::SeqCst);
        Running(Arc::clone(&self.active))
    }
}

/// One run under way; see [`Handler::start`].
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers `x-status` (default 201) with an order id unique per run, the
/// body echoed, allow-listed headers and headers that must never replay.
async fn order(State(h): State<Handler>, headers: HeaderMap, body: Bytes) -> Response {
    let _running = h.start();
    let n = h.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if headers.contains_key("x-hold") {
        h.entered.notify_one();
        h.release.notified().await;
    }
    let status = headers
        .get("x-status")
        .map_or(201, |v| v.to_str().unwrap().parse().unwrap());
    let body = format!(
        r#"{{"order":"{n}-{}","echo":{}}}"#,
        unique("o"),
        String::from_utf8_lossy(&body)
    );
    let mut res = (StatusCode::from_u16(status).unwrap(), body).into_response();
    let h = res.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    h.insert("location", format!("/orders/{n}").parse().unwrap());
    h.insert("set-cookie", HeaderValue::from_static("session=secret"));
    h.insert("ratelimit", HeaderValue::from_static(r#""api";r=9;t=1"#));
    h.insert("x-internal", HeaderValue::from_static("1"));
    res
}

fn app(layer: IdempotencyLayer<HeaderKey>, handler: &Handler) -> Router {
    Router::new()
        .route("/orders", post(order).get(|| async { "list" }))
        .route("/refunds", post(order))
        .layer(layer)
        .with_state(handler.clone())
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn assert_problem(&self, status: u16) {
        assert_eq!(self.status, status, "{:?}", self.body);
        assert_eq!(self.headers["content-type"], "application/problem+json");
        let body = std::str::from_utf8(&self.body).unwrap();
        assert!(
            body.contains(&format!(r#""status":{status},"detail":""#)),
            "{body}"
        );
    }

    fn retry_after(&self) -> u64 {
        self.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }
}

async fn send(app: &Router, req: Request<Body>) -> Reply {
    let (status, headers, body) = collect(app, req).await;
    Reply {
        status,
        headers,
        body,
    }
}

/// `POST path` from `tenant` with `key` (raw bytes; none when `None`).
fn req(path: &str, tenant: &str, key: Option<&[u8]>, body: &str) -> Request<Body> {
    let mut b = Request::post(path)
        .header("x-api-key", tenant)
        .header("content-type", "application/json");
    if let Some(key) = key {
        b = b.header("idempotency-key", HeaderValue::from_bytes(key).unwrap());
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

fn with(mut req: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
    req.headers_mut().insert(name, value.parse().unwrap());
    req
}

/// The app behind a default layer on `kind`, and its handler.
async fn default_app(kind: Kind) -> (Handler, Router) {
    let h = Handler::default();
    let app = app(
        IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key")),
        &h,
    );
    (h, app)
}

/// Sends `POST /orders` with `key` and body "1", held in its handler: returns
/// once the handler has been entered (`h.release` lets it go on).
async fn held(app: &Router, h: &Handler, key: &str) -> tokio::task::JoinHandle<Reply> {
    let app = app.clone();
    let r = with(
        req("/orders", "t1", Some(key.as_bytes()), "1"),
        "x-hold",
        "1",
    );
    let first = tokio::spawn(async move { send(&app, r).await });
    tokio::time::timeout(BOUND, h.entered.notified())
        .await
        .unwrap();
    first
}

/// Every check, on one backend.
async fn suite(kind: Kind) {
    first_run_and_byte_identical_replay(kind).await;
    another_payload_is_422(kind).await;
    a_multipart_retry_with_a_new_boundary_replays(kind).await;
    in_flight_is_409_with_retry_after(kind).await;
    bad_keys_are_400(kind).await;
    a_big_body_is_413_and_nothing_is_stored(kind).await;
    failures_are_abandoned_so_a_retry_runs(kind).await;
    a_dropped_request_is_abandoned(kind).await;
    concurrent_retries_run_the_handler_once(kind).await;
    scopes_and_routes_are_apart(kind).await;
    a_response_too_large_to_store_is_not_replayed(kind).await;
    other_methods_and_optional_keys_pass_through(kind).await;
    edges::a_failed_completion_runs_the_handler_once(kind).await;
    edges::a_lost_claim_cancels_the_handler_and_stores_nothing(kind).await;
    edges::a_lost_claim_continues_when_told(kind).await;
    edges::replays_carry_what_the_body_needs(kind).await;
    edges::a_failed_grpc_call_is_not_stored(kind).await;
    edges::a_grpc_call_replays_with_its_trailers(kind).await;
}

idempotency_on_every_backend!(suite);

async fn first_run_and_byte_identical_replay(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let key = unique("k");
    let first = send(
        &app,
        req("/orders", "t1", Some(key.as_bytes()), r#"{"qty":1}"#),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    // The first response is the handler's own, whole.
    assert_eq!(first.headers["set-cookie"], "session=secret");
    assert!(first.headers.contains_key("ratelimit"));
    assert!(!first.headers.contains_key("idempotent-replayed"));

    for _ in 0..2 {
        let replay = send(
            &app,
            req("/orders", "t1", Some(key.as_bytes()), r#"{"qty":1}"#),
        )
        .await;
        assert_eq!(replay.status, StatusCode::CREATED);
        assert_eq!(replay.body, first.body, "byte-identical");
        assert_eq!(replay.headers["idempotent-replayed"], "true");
        assert_eq!(replay.headers["content-type"], "application/json");
        assert_eq!(replay.headers["location"], first.headers["location"]);
        for never in ["set-cookie", "ratelimit", "x-internal"] {
            assert!(!replay.headers.contains_key(never), "{never} replayed");
        }
    }
    // A quoted key is the same key.
    let quoted = format!("\"{key}\"");
    let replay = send(
        &app,
        req("/orders", "t1", Some(quoted.as_bytes()), r#"{"qty":1}"#),
    )
    .await;
    assert_eq!(replay.body, first.body);
    assert_eq!(h.runs(), 1, "{kind:?}");
}

async fn another_payload_is_422(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let key = unique("k");
    let k = Some(key.as_bytes());
    assert_eq!(send(&app, req("/orders", "t1", k, "1")).await.status, 201);
    send(&app, req("/orders", "t1", k, "2"))
        .await
        .assert_problem(422);
    // The query and the content type are part of the payload too.
    send(&app, req("/orders?x=1", "t1", k, "1"))
        .await
        .assert_problem(422);
    let other_type = with(req("/orders", "t1", k, "1"), "content-type", "text/plain");
    send(&app, other_type).await.assert_problem(422);
    assert_eq!(h.runs(), 1);
}

/// A client draws a new multipart boundary for every request, its retries
/// too: the same parts under a new boundary are the same payload.
async fn a_multipart_retry_with_a_new_boundary_replays(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let key = unique("k");
    let form = |boundary: &str, qty: &str| {
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"qty\"\r\n\r\n{qty}\r\n--{boundary}--\r\n"
        );
        let r = req("/orders", "t1", Some(key.as_bytes()), "");
        let r = with(
            r,
            "content-type",
            &format!("multipart/form-data; boundary={boundary}"),
        );
        r.map(|_| Body::from(body))
    };
    let first = send(&app, form("a1b2", "1")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{kind:?}");
    let retry = send(&app, form("----retry9z", "1")).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{kind:?}");
    assert_eq!(retry.headers["idempotent-replayed"], "true");
    assert_eq!(retry.body, first.body);
    send(&app, form("c3d4", "2")).await.assert_problem(422);
    assert_eq!(h.runs(), 1, "{kind:?}");
}

async fn in_flight_is_409_with_retry_after(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let key = unique("k");
    let first = held(&app, &h, &key).await;
    let busy = send(&app, req("/orders", "t1", Some(key.as_bytes()), "1")).await;
    busy.assert_problem(409);
    assert!((1..=30).contains(&busy.retry_after()), "{:?}", busy.headers);
    // Another payload while in flight: still the wrong payload.
    send(&app, req("/orders", "t1", Some(key.as_bytes()), "2"))
        .await
        .assert_problem(422);
    h.release.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    let replay = send(&app, req("/orders", "t1", Some(key.as_bytes()), "1")).await;
    assert_eq!(replay.body, first.body);
    assert_eq!(h.runs(), 1);
}

async fn bad_keys_are_400(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let long = "k".repeat(256);
    let bad: [&[u8]; 8] = [
        b"",
        b"\"\"",
        long.as_bytes(),
        b"a\tb",
        b"a b",
        "clé".as_bytes(),
        b"\xff\xfe",
        b"\"unterminated",
    ];
    for key in bad {
        let r = send(&app, req("/orders", "t1", Some(key), "1")).await;
        r.assert_problem(400);
        assert!(std::str::from_utf8(&r.body)
            .unwrap()
            .contains("Idempotency-Key"));
    }
    send(&app, req("/orders", "t1", None, "1"))
        .await
        .assert_problem(400);
    let mut twice = req("/orders", "t1", Some(b"a"), "1");
    twice
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("a"));
    send(&app, twice).await.assert_problem(400);
    assert_eq!(h.runs(), 0);
    // 255 visible characters are a key.
    let max = format!("{}-{}", unique("k"), "k".repeat(255));
    let max = &max.as_bytes()[..255];
    assert_eq!(
        send(&app, req("/orders", "t1", Some(max), "1"))
            .await
            .status,
        201
    );
}

async fn a_big_body_is_413_and_nothing_is_stored(kind: Kind) {
    let h = Handler::default();
    let layer = IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key"))
        .max_request_body(1024);
    let app = app(layer, &h);
    let key = unique("k");
    let big = "x".repeat(1025);
    // Streamed without a length, and announced by Content-Length.
    send(&app, req("/orders", "t1", Some(key.as_bytes()), &big))
        .await
        .assert_problem(413);
    let announced = with(
        req("/orders", "t1", Some(key.as_bytes()), &big),
        "content-length",
        "1025",
    );
    send(&app, announced).await.assert_problem(413);
    assert_eq!(h.runs(), 0);
    let fits = "x".repeat(1024);
    assert_eq!(
        send(&app, req("/orders", "t1", Some(key.as_bytes()), &fits))
            .await
            .status,
        201
    );
    assert_eq!(h.runs(), 1);
}

async fn failures_are_abandoned_so_a_retry_runs(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let key = unique("k");
    let k = Some(key.as_bytes());
    for status in ["500", "503", "429", "409"] {
        let r = send(&app, with(req("/orders", "t1", k, "1"), "x-status", status)).await;
        assert_eq!(r.status.as_str(), status);
    }
    assert_eq!(h.runs(), 4, "none of them stored");
    let ok = send(&app, req("/orders", "t1", k, "1")).await;
    assert_eq!(ok.status, 201);
    // A stored 4xx replays as it was.
    let key = unique("k");
    let k = Some(key.as_bytes());
    let r = send(&app, with(req("/orders", "t1", k, "1"), "x-status", "404")).await;
    assert_eq!(r.status, 404);
    let replay = send(&app, req("/orders", "t1", k, "1")).await;
    assert_eq!((replay.status, replay.body), (r.status, r.body));
    assert_eq!(h.runs(), 6);
}

async fn a_dropped_request_is_abandoned(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let key = unique("k");
    let first = held(&app, &h, &key).await;
    // The client goes away: the future is dropped mid-handler.
    first.abort();
    let _ = first.await;
    let retried = eventually(BOUND, "the dropped claim is abandoned", || async {
        let r = send(&app, req("/orders", "t1", Some(key.as_bytes()), "1")).await;
        (r.status == 201).then_some(r)
    })
    .await;
    assert!(!retried.headers.contains_key("idempotent-replayed"));
    assert_eq!(h.runs(), 2);
}

async fn concurrent_retries_run_the_handler_once(kind: Kind) {
    let (h, app) = default_app(kind).await;
    for _ in 0..3 {
        let before = h.runs();
        let key = unique("k");
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (app, key) = (app.clone(), key.clone());
                tokio::spawn(async move {
                    send(
                        &app,
                        req("/orders", "t1", Some(key.as_bytes()), r#"{"a":1}"#),
                    )
                    .await
                })
            })
            .collect();
        let mut bodies = Vec::new();
        for t in tasks {
            let r = t.await.unwrap();
            match r.status.as_u16() {
                201 => bodies.push(r.body),
                409 => assert!(r.retry_after() >= 1),
                other => panic!("unexpected {other}: {:?}", r.body),
            }
        }
        assert_eq!(h.runs(), before + 1, "{kind:?}: one run per key");
        assert!(!bodies.is_empty());
        assert!(bodies.iter().all(|b| *b == bodies[0]), "one response");
        let replay = send(
            &app,
            req("/orders", "t1", Some(key.as_bytes()), r#"{"a":1}"#),
        )
        .await;
        assert_eq!(replay.body, bodies[0]);
    }
}

async fn scopes_and_routes_are_apart(kind: Kind) {
    let (h, app) = default_app(kind).await;
    let key = unique("k");
    let k = Some(key.as_bytes());
    let a = send(&app, req("/orders", "tenant-a", k, "1")).await;
    let b = send(&app, req("/orders", "tenant-b", k, "1")).await;
    let refund = send(&app, req("/refunds", "tenant-a", k, "1")).await;
    for r in [&a, &b, &refund] {
        assert_eq!(r.status, 201);
        assert!(!r.headers.contains_key("idempotent-replayed"));
    }
    assert_ne!(a.body, b.body);
    assert_eq!(h.runs(), 3);
    // Another tenant's payload under the same key is no mismatch of yours.
    let b2 = send(&app, req("/orders", "tenant-b", k, "1")).await;
    assert_eq!(b2.body, b.body);
    // A missing scope key answers as the key extractor does.
    let mut anonymous = req("/orders", "x", k, "1");
    anonymous.headers_mut().remove("x-api-key");
    assert_eq!(send(&app, anonymous).await.status, 401);

    // Under an optional scope, a caller whose scope is "-" is not the
    // callers without one.
    let h = Handler::default();
    let layer = IdempotencyLayer::new(
        store(kind).await,
        HeaderKey::new("x-api-key").optional().plain(),
    );
    let app = crate::app(layer, &h);
    let key = unique("k");
    let k = Some(key.as_bytes());
    let mut unscoped = req("/orders", "x", k, "1");
    unscoped.headers_mut().remove("x-api-key");
    let unscoped = send(&app, unscoped).await;
    let dash = send(&app, req("/orders", "-", k, "1")).await;
    for r in [&unscoped, &dash] {
        assert_eq!(r.status, 201);
        assert!(!r.headers.contains_key("idempotent-replayed"));
    }
    assert_eq!(h.runs(), 2);
    let mut again = req("/orders", "x", k, "1");
    again.headers_mut().remove("x-api-key");
    assert_eq!(send(&app, again).await.body, unscoped.body);
    assert_eq!(
        send(&app, req("/orders", "-", k, "1")).await.body,
        dash.body
    );
    assert_eq!(h.runs(), 2);
}

async fn a_response_too_large_to_store_is_not_replayed(kind: Kind) {
    let h = Handler::default();
    let layer =
        IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key")).max_stored_body(16);
    let app = app(layer, &h);
    let key = unique("k");
    let first = send(&app, req("/orders", "t1", Some(key.as_bytes()), "1")).await;
    assert_eq!(first.status, 201);
    assert!(first.body.len() > 16, "returned whole to its client");
    let retry = send(&app, req("/orders", "t1", Some(key.as_bytes()), "1")).await;
    retry.assert_problem(409);
    assert!(!retry.headers.contains_key("retry-after"));
    assert!(std::str::from_utf8(&retry.body)
        .unwrap()
        .contains("too large"));
    assert_eq!(h.runs(), 1, "never twice for one key");
}

async fn other_methods_and_optional_keys_pass_through(kind: Kind) {
    let h = Handler::default();
    let layer = IdempotencyLayer::new(store(kind).await, HeaderKey::new("x-api-key"));
    let app = app(layer.clone(), &h);
    let get = Request::get("/orders").body(Body::empty()).unwrap();
    let r = send(&app, get).await;
    assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"list"[..]));
    let optional = self::app(layer.required(false), &h);
    for _ in 0..2 {
        let r = send(&optional, req("/orders", "t1", None, "1")).await;
        assert_eq!(r.status, 201);
    }
    assert_eq!(h.runs(), 2, "no key, no protection");
}

/// A Redis that is not there: every round trip fails fast.
fn dead_store() -> IdempotencyStore {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let backend = RedisBackend::connect_lazy(&format!("redis://127.0.0.1:{port}")).unwrap();
    IdempotencyStore::builder(backend)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_dead_redis_denies_by_default() {
    let h = Handler::default();
    let app = app(
        IdempotencyLayer::new(dead_store(), HeaderKey::new("x-api-key")),
        &h,
    );
    let r = send(&app, req("/orders", "t1", Some(b"k"), "1")).await;
    r.assert_problem(503);
    assert_eq!(r.retry_after(), 1);
    assert_eq!(h.runs(), 0);
}

#[tokio::test]
async fn a_dead_redis_passes_through_when_told() {
    let h = Handler::default();
    let layer = IdempotencyLayer::new(dead_store(), HeaderKey::new("x-api-key"))
        .on_unavailable(OnUnavailable::PassThrough);
    let app = app(layer, &h);
    for _ in 0..2 {
        let r = send(&app, req("/orders", "t1", Some(b"k"), "1")).await;
        assert_eq!(r.status, 201);
        assert!(!r.headers.contains_key("idempotent-replayed"));
        // Unprotected: the response streams as the handler made it.
        assert_eq!(r.headers["set-cookie"], "session=secret");
    }
    assert_eq!(h.runs(), 2);
}

/// Under a `LockLayer` outside it, the handler's `FencingToken` (and
/// `LeaseLost`) is the lock's, which fences the resource — not the
/// idempotency claim's, which is the layer's own business.
#[tokio::test]
async fn a_lock_outside_keeps_its_fencing_token() {
    use axum::Extension;
    use tollgate_core::admin::Admin;
    use tollgate_core::{FencingToken, Locker, MemoryBackend};
    use tollgate_tower::LockLayer;

    let backend = MemoryBackend::new();
    let admin = Admin::new(backend.clone());
    // The handler answers its token and the fence the lock's holder has.
    let fenced = move |Extension(token): Extension<FencingToken>| {
        let admin = admin.clone();
        async move {
            let holders = admin.holders().await.unwrap();
            let lock = holders
                .iter()
                .find(|h| h.name == "lock")
                .expect("the lock held");
            format!("{} {}", token.get(), lock.fence)
        }
    };
    let app = Router::new()
        .route("/orders", post(fenced))
        .layer(IdempotencyLayer::new(
            IdempotencyStore::new(backend.clone()),
            HeaderKey::new("x-api-key"),
        ))
        .layer(LockLayer::new(
            Locker::new(backend),
            HeaderKey::new("x-api-key"),
        ));
    let key = unique("k");
    let reply = send(&app, req("/orders", "t1", Some(key.as_bytes()), "1")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let body = std::str::from_utf8(&reply.body).unwrap();
    let (token, lock) = body.split_once(' ').unwrap();
    assert_eq!(token, lock, "the handler's token is the lock's");
}

/// With `OnLeaseLost::Continue` the handler must watch its claim itself:
/// behind a `ConcurrencyLimitLayer` (whose permit puts its own token in the
/// request) it still gets the claim's `FencingToken` and `LeaseLost`.
#[tokio::test]
async fn a_handler_that_continues_gets_the_claims_token() {
    use axum::Extension;
    use tollgate_core::admin::Admin;
    use tollgate_core::{FencingToken, MemoryBackend, Semaphore};
    use tollgate_tower::lock::OnLeaseLost;
    use tollgate_tower::ConcurrencyLimitLayer;

    let backend = MemoryBackend::new();
    let admin = Admin::new(backend.clone());
    // The handler answers its token and the fence of the claim in flight.
    let fenced = move |Extension(token): Extension<FencingToken>| {
        let admin = admin.clone();
        async move {
            let claims = admin.idempotency_in_flight().await.unwrap();
            format!("{} {}", token.get(), claims[0].fence)
        }
    };
    let app = Router::new()
        .route("/orders", post(fenced))
        .layer(
            IdempotencyLayer::new(
                IdempotencyStore::new(backend.clone()),
                HeaderKey::new("x-api-key"),
            )
            .on_lease_lost(OnLeaseLost::Continue),
        )
        .layer(ConcurrencyLimitLayer::new(
            Semaphore::new(backend, 2).unwrap(),
            HeaderKey::new("x-api-key"),
        ));
    let key = unique("k");
    let reply = send(&app, req("/orders", "t1", Some(key.as_bytes()), "1")).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let body = std::str::from_utf8(&reply.body).unwrap();
    let (token, claim) = body.split_once(' ').unwrap();
    assert_eq!(token, claim, "the handler's token is the claim's");
}
