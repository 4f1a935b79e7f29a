//! `HeldPermit` held past the permit's hold cap (`LockOptions::max_hold`):
//! the permit is kept for as long as the extractor lives, so "at most N in
//! flight" holds for a handler that runs longer than the cap — on memory,
//! standalone Redis and a cluster.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{FromRef, State};
use axum::routing::post;
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tollgate_axum::{HeldPermit, PermitResource};
use tollgate_core::{LockBackend, LockOptions, MemoryBackend, RedisBackend, Semaphore, Subject};
use tollgate_testkit::{RedisCluster, RedisServer};
use tollgate_tower::key::HeaderKey;
use tower::ServiceExt;

/// Short, so that a permit the cap let lapse would be free within the test.
const TTL: Duration = Duration::from_millis(150);
const CAP: Duration = Duration::from_millis(400);
/// How long the holder runs: several caps and many TTLs.
const PAST_THE_CAP: Duration = Duration::from_millis(1600);
/// Far above anything the test waits for, far below a hang.
const BOUND: Duration = Duration::from_secs(15);

#[derive(Clone, FromRef)]
struct AppState {
    semaphore: Semaphore,
    /// Handlers sent with `x-hold` wait here until the test opens it.
    gate: Arc<tokio::sync::Semaphore>,
    entered: mpsc::UnboundedSender<()>,
}

/// One in flight per `x-res`, with a short TTL and cap.
struct Long;

impl PermitResource<AppState> for Long {
    type Key = HeaderKey;

    fn key(_: &AppState) -> HeaderKey {
        HeaderKey::new("x-res").plain()
    }

    fn namespace(_: &AppState) -> Option<&'static str> {
        Some("long")
    }

    fn options(_: &AppState) -> LockOptions {
        LockOptions::new().ttl(TTL).max_hold(CAP)
    }
}

/// Answers with the fence and whether the permit is still held at the end.
async fn work(State(s): State<AppState>, headers: HeaderMap, permit: HeldPermit<Long>) -> String {
    let _ = s.entered.send(());
    if headers.contains_key("x-hold") {
        s.gate.acquire().await.unwrap().forget();
    }
    format!("{} {}", permit.fence().unwrap(), permit.is_held())
}

fn req(r: &str, hold: bool) -> Request<Body> {
    let b = Request::post("/work").header("x-res", r);
    let b = if hold { b.header("x-hold", "1") } else { b };
    b.body(Body::empty()).unwrap()
}

async fn answer(app: &Router, req: Request<Body>) -> (StatusCode, String) {
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req))
        .await
        .expect("no answer")
        .unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// A handler holding its permit 1.6 s past a 400 ms cap: every other
/// request of the key meanwhile is refused, the holder's permit is still
/// held when it answers, and the key is free afterwards.
async fn held_past_the_cap(backend: impl LockBackend) {
    let semaphore = Semaphore::builder(backend, 1)
        .prefix(tollgate_testkit::unique("permit"))
        .build()
        .unwrap();
    let (entered, mut entries) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let app = Router::new()
        .route("/work", post(work))
        .with_state(AppState {
            semaphore: semaphore.clone(),
            gate: gate.clone(),
            entered,
        });
    let r = tollgate_testkit::unique("k");
    let name = Subject::compound(["long", &r]);

    let start = Instant::now();
    let a = tokio::spawn({
        let app = app.clone();
        let r = r.clone();
        async move { answer(&app, req(&r, true)).await }
    });
    tokio::time::timeout(BOUND, entries.recv())
        .await
        .expect("the holder never ran");
    let mut refusals = 0;
    loop {
        let (status, body) = answer(&app, req(&r, false)).await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "a second request ran beside the holder after {refusals} refusals: {body}"
        );
        assert_eq!(semaphore.in_use(name.clone()).await.unwrap(), 1);
        refusals += 1;
        if Instant::now() >= start + PAST_THE_CAP {
            break;
        }
        // A few probes per TTL: any lapse longer than that is seen.
        tokio::time::sleep(TTL / 3).await;
    }
    assert!(entries.try_recv().is_err(), "only the holder ran");
    gate.add_permits(1);
    let (status, body) = tokio::time::timeout(BOUND, a).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.ends_with(" true"), "held to the end: {body}");
    // Dropped with the handler, released in the background.
    let until = Instant::now() + BOUND;
    while semaphore.in_use(name.clone()).await.unwrap() != 0 {
        assert!(Instant::now() < until, "the permit was never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(answer(&app, req(&r, false)).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_held_permit_outlives_the_cap() {
    held_past_the_cap(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_held_permit_outlives_the_cap() {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    let server = SERVER.get_or_init(|| RedisServer::start().expect("start redis-server"));
    held_past_the_cap(RedisBackend::connect(&server.url()).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_held_permit_outlives_the_cap() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    held_past_the_cap(
        RedisBackend::connect_cluster(cluster.seeds())
            .await
            .unwrap(),
    )
    .await;
}
