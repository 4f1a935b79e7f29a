//! `ConcurrencyLimitLayer`: at most N requests in flight per key, on memory,
//! a standalone Redis and a three-master cluster; gRPC answers; the failure
//! policies with Redis paused (SIGSTOP) and down; a permit lost mid-request.
//!
//! Requests are held in flight by handlers waiting on a gate the test opens
//! (a `tokio::sync::Semaphore`), never by sleeps; every wait is bounded.

mod common;
mod concurrency_long;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::routing::get as route_get;
use axum::{Extension, Router};
use futures::FutureExt;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tollgate_core::{
    FailurePolicy, FencingToken, LeaseLost, LockBackend, LockOptions, MemoryBackend, RedisBackend,
    Semaphore, Subject,
};
use tollgate_testkit::{eventually, RedisServer};
use tollgate_tower::concurrency::{HoldUntil, OnLeaseLost};
use tollgate_tower::key::{GlobalKey, HeaderKey, KeyExtractor};
use tollgate_tower::ConcurrencyLimitLayer;
use tower::{Layer, Service, ServiceExt};
use tracing::instrument::WithSubscriber;

use common::{problem_detail, send, unique, Reply};
use concurrency_long::{
    a_handler_keeps_its_permit_past_the_cap, a_handler_keeps_its_permit_with_renewal_off,
    a_streamed_body_keeps_its_permit_past_the_cap,
};

/// Far above anything these tests wait for, far below a hang.
const BOUND: Duration = Duration::from_secs(15);

/// How long a request may take while Redis is paused or down (the
/// semaphores of those tests time out a round trip after 200 ms).
const FAULT_BOUND: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Memory,
    Redis,
    Cluster,
}

/// Semaphores over one backend: each Redis semaphore has its own connection
/// (as another process would); memory ones share one `MemoryBackend`.
struct Env {
    kind: Kind,
    memory: MemoryBackend,
}

impl Env {
    fn new(kind: Kind) -> Self {
        Env {
            kind,
            memory: MemoryBackend::new(),
        }
    }

    async fn backend(&self) -> Arc<dyn LockBackend> {
        match self.kind {
            Kind::Memory => Arc::new(self.memory.clone()),
            Kind::Redis => Arc::new(
                RedisBackend::connect(&common::shared_redis().url())
                    .await
                    .unwrap(),
            ),
            Kind::Cluster => Arc::new(
                RedisBackend::connect_cluster(common::shared_cluster().seeds())
                    .await
                    .unwrap(),
            ),
        }
    }

    async fn semaphore(&self, permits: u32) -> Semaphore {
        Semaphore::new(self.backend().await, permits).unwrap()
    }

    /// Deletes `key` on Redis behind its holders' backs (it must exist).
    async fn delete(&self, key: &str) {
        let n: i64 = match self.kind {
            Kind::Memory => panic!("no DEL on memory"),
            Kind::Redis => {
                let mut conn = common::shared_redis().connection_manager().await;
                redis::cmd("DEL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap()
            }
            Kind::Cluster => {
                let mut conn = common::shared_cluster().connection().await;
                redis::cmd("DEL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(n, 1, "no semaphore at {key}");
    }
}

// ---------------------------------------------------------------------------
// The app: handlers held in flight by a gate the test opens
// ---------------------------------------------------------------------------

/// What the handlers report to the test.
#[derive(Clone)]
struct Probe {
    events: Arc<Mutex<Vec<String>>>,
    entered: mpsc::UnboundedSender<String>,
    gate: Arc<tokio::sync::Semaphore>,
    running: Arc<AtomicUsize>,
    max_running: Arc<AtomicUsize>,
}

struct ProbeRx {
    probe: Probe,
    entered: mpsc::UnboundedReceiver<String>,
}

impl ProbeRx {
    fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        ProbeRx {
            probe: Probe {
                events: Arc::default(),
                entered: tx,
                gate: Arc::new(tokio::sync::Semaphore::new(0)),
                running: Arc::default(),
                max_running: Arc::default(),
            },
            entered: rx,
        }
    }

    /// The next report of a handler (its id on entry, `"<id> lost"` when it
    /// saw its permit lost).
    async fn next(&mut self) -> String {
        tokio::time::timeout(BOUND, self.entered.recv())
            .await
            .expect("no handler reported")
            .unwrap()
    }

    async fn wait_entered(&mut self, id: &str) {
        assert_eq!(self.next().await, id);
    }

    fn events(&self) -> Vec<String> {
        self.probe.events.lock().unwrap().clone()
    }

    fn running(&self) -> usize {
        self.probe.running.load(Ordering::SeqCst)
    }

    fn max_running(&self) -> usize {
        self.probe.max_running.load(Ordering::SeqCst)
    }

    fn open(&self, n: usize) {
        self.probe.gate.add_permits(n);
    }
}

/// Counts a handler out of `running` however it ends (finished or dropped).
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

/// Logs start and end; with `x-watch`, waits until its permit is lost and
/// reports it; with `x-hold`, waits for the gate. Answers with the fence,
/// or `unlimited` when it ran without a permit.
async fn work(
    State(p): State<Probe>,
    fence: Option<Extension<FencingToken>>,
    lost: Option<Extension<LeaseLost>>,
    headers: HeaderMap,
) -> String {
    let id = header(&headers, "x-id").unwrap_or("?").to_owned();
    let now = p.running.fetch_add(1, Ordering::SeqCst) + 1;
    let _running = Running(Arc::clone(&p.running));
    p.max_running.fetch_max(now, Ordering::SeqCst);
    p.events.lock().unwrap().push(format!("start {id}"));
    let _ = p.entered.send(id.clone());
    if headers.contains_key("x-watch") {
        let Extension(lost) = lost.expect("a held permit's LeaseLost in the extensions");
        tokio::time::timeout(BOUND, lost)
            .await
            .expect("the permit was never lost");
        let _ = p.entered.send(format!("{id} lost"));
    }
    if headers.contains_key("x-hold") {
        p.gate.acquire().await.unwrap().forget();
    }
    p.events.lock().unwrap().push(format!("end {id}"));
    match fence {
        Some(Extension(f)) => f.to_string(),
        None => "unlimited".to_owned(),
    }
}

/// A body that sends one chunk, waits for the gate, then ends.
async fn stream(State(p): State<Probe>) -> Body {
    let gate = Arc::clone(&p.gate);
    let chunks = futures::stream::unfold(0u8, move |state| {
        let gate = Arc::clone(&gate);
        async move {
            match state {
                0 => Some((Ok::<_, std::io::Error>("first;"), 1)),
                1 => {
                    gate.acquire().await.unwrap().forget();
                    Some((Ok("last"), 2))
                }
                _ => None,
            }
        }
    });
    Body::from_stream(chunks)
}

fn app<K: KeyExtractor>(layer: ConcurrencyLimitLayer<K>, probe: Probe) -> Router {
    Router::new()
        .route("/work", route_get(work).post(work))
        .route("/stream", route_get(stream))
        .with_state(probe)
        .layer(layer)
}

const HOLD: (&str, &str) = ("x-hold", "1");
const WATCH: (&str, &str) = ("x-watch", "1");
const GRPC: (&str, &str) = ("content-type", "application/grpc");

/// `GET path` with `headers` (`POST` when one of them is gRPC's content type).
fn req(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let grpc = headers.contains(&GRPC);
    let mut b = if grpc {
        Request::post(path)
    } else {
        Request::get(path)
    };
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

fn key() -> HeaderKey {
    HeaderKey::new("x-res").plain()
}

/// The semaphore name the layer uses for `x-res: value` under `namespace`.
fn name_of(namespace: &str, value: &str) -> Subject {
    let parts = Request::get("/")
        .header("x-res", value)
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let subject = key().extract(&parts).unwrap().unwrap();
    Subject::compound([namespace, subject.as_encoded()])
}

fn policy(name: &str, n: u32) -> String {
    format!(r#""{name}";q={n};qu="concurrent-requests""#)
}

fn spawn_send(app: &Router, req: Request<Body>) -> tokio::task::JoinHandle<Reply> {
    let app = app.clone();
    tokio::spawn(async move { send(&app, req).await })
}

async fn join(h: tokio::task::JoinHandle<Reply>) -> Reply {
    tokio::time::timeout(BOUND, h)
        .await
        .expect("request never answered")
        .unwrap()
}

async fn bounded_send(app: &Router, req: Request<Body>) -> Reply {
    tokio::time::timeout(FAULT_BOUND, send(app, req))
        .await
        .expect("a request waited past the bound")
}

fn fence_of(r: &Reply) -> u64 {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body
        .parse()
        .unwrap_or_else(|_| panic!("no fence in {r:?}"))
}

/// Asserts a 429 of the layer and returns its Retry-After.
fn assert_too_many(r: &Reply, policy_header: &str) -> u64 {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    let retry = r.retry_after();
    assert!((1..=30).contains(&retry), "{r:?}");
    assert_eq!(r.expect_header("ratelimit-policy"), policy_header);
    assert_eq!(
        problem_detail(r),
        format!("too many requests in flight; retry in {retry} s")
    );
    retry
}

// ---------------------------------------------------------------------------
// 1. N admitted, the N+1th refused; other keys apart; free afterwards
// ---------------------------------------------------------------------------

async fn n_run_and_the_next_gets_429(env: Env) {
    const N: u32 = 3;
    let semaphore = env.semaphore(N).await;
    let ns = unique("cl");
    let mut p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore.clone(), key()).namespace(&ns),
        p.probe.clone(),
    );
    let (r1, r2) = (unique("k"), unique("k"));

    let held: Vec<_> = (0..N)
        .map(|i| {
            let id = format!("h{i}");
            spawn_send(&app, req("/work", &[("x-res", &r1), ("x-id", &id), HOLD]))
        })
        .collect();
    let mut ids: Vec<String> = Vec::new();
    for _ in 0..N {
        ids.push(p.next().await);
    }
    ids.sort();
    assert_eq!(ids, ["h0", "h1", "h2"]);
    assert_eq!(semaphore.in_use(name_of(&ns, &r1)).await.unwrap(), N);

    let over = send(&app, req("/work", &[("x-res", &r1), ("x-id", "over")])).await;
    assert_too_many(&over, &policy(&ns, N));
    assert!(!p.events().contains(&"start over".to_owned()));

    // Another key has its own permits.
    let other = send(&app, req("/work", &[("x-res", &r2), ("x-id", "other")])).await;
    fence_of(&other);

    p.open(N as usize);
    let mut fences = Vec::new();
    for h in held {
        fences.push(fence_of(&join(h).await));
    }
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), N as usize, "one fence per permit: {fences:?}");

    // Released when each body ended, before the replies were read whole.
    assert_eq!(semaphore.in_use(name_of(&ns, &r1)).await.unwrap(), 0);
    let again: Vec<_> = (0..N)
        .map(|i| {
            let id = format!("again{i}");
            spawn_send(&app, req("/work", &[("x-res", &r1), ("x-id", &id), HOLD]))
        })
        .collect();
    for _ in 0..N {
        p.next().await;
    }
    p.open(N as usize);
    for h in again {
        let f = fence_of(&join(h).await);
        assert!(
            f > *fences.last().unwrap(),
            "fences go up: {fences:?} then {f}"
        );
    }
}

/// 32 requests on one key through two routers (two layers, two semaphores
/// over the same backend), waiting for a permit: never more than N handlers
/// run at once, and all of them run in the end.
async fn never_more_than_n_in_flight(env: Env) {
    const N: usize = 4;
    const REQUESTS: usize = 32;
    let ns = unique("stress");
    let mut p = ProbeRx::new();
    let layer = |s: Semaphore| {
        ConcurrencyLimitLayer::new(s, key())
            .namespace(&ns)
            .options(LockOptions::new().wait(BOUND))
    };
    let one = app(layer(env.semaphore(N as u32).await), p.probe.clone());
    let two = app(layer(env.semaphore(N as u32).await), p.probe.clone());
    let r = unique("hot");
    let handles: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let id = i.to_string();
            let app = if i % 2 == 0 { &one } else { &two };
            spawn_send(app, req("/work", &[("x-res", &r), ("x-id", &id), HOLD]))
        })
        .collect();
    // The first N get in and stay; each one let go makes room for one more.
    for _ in 0..N {
        p.next().await;
    }
    assert_eq!(p.running(), N);
    for _ in N..REQUESTS {
        p.open(1);
        p.next().await;
        assert!(p.running() <= N, "{} running", p.running());
    }
    p.open(N);
    let mut fences = Vec::new();
    for h in handles {
        fences.push(fence_of(&join(h).await));
    }
    assert_eq!(p.max_running(), N, "at most N at once");
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), REQUESTS);
}

// ---------------------------------------------------------------------------
// 2. Held until the body ends (or is dropped); HoldUntil::Response
// ---------------------------------------------------------------------------

async fn held_until_the_body_ends(env: Env) {
    let semaphore = env.semaphore(1).await;
    let ns = unique("body");
    let p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore.clone(), key()).namespace(&ns),
        p.probe.clone(),
    );
    let r = unique("k");
    let name = name_of(&ns, &r);

    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req("/stream", &[("x-res", &r)])))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first;");
    // The response is out, its body still streaming: the permit is held.
    let b = send(&app, req("/work", &[("x-res", &r), ("x-id", "b")])).await;
    assert_too_many(&b, &policy(&ns, 1));
    p.open(1);
    let rest = tokio::time::timeout(BOUND, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "last");
    // The end of the body waited for the release.
    assert_eq!(semaphore.in_use(name.clone()).await.unwrap(), 0);
    fence_of(&send(&app, req("/work", &[("x-res", &r), ("x-id", "c")])).await);

    // A body dropped half-way releases the permit (in the background).
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req("/stream", &[("x-res", &r)])))
        .await
        .unwrap()
        .unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(semaphore.in_use(name.clone()).await.unwrap(), 1);
    drop(body);
    eventually(BOUND, "permit released after the body was dropped", || {
        let (semaphore, name) = (semaphore.clone(), name.clone());
        async move { (semaphore.in_use(name).await.unwrap() == 0).then_some(()) }
    })
    .await;
    fence_of(&send(&app, req("/work", &[("x-res", &r), ("x-id", "d")])).await);

    // HoldUntil::Response: released once the response is out, the body
    // still unread.
    let app = self::app(
        ConcurrencyLimitLayer::new(semaphore.clone(), key())
            .namespace(&ns)
            .hold_until(HoldUntil::Response),
        p.probe.clone(),
    );
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req("/stream", &[("x-res", &r)])))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(semaphore.in_use(name.clone()).await.unwrap(), 0);
    fence_of(&send(&app, req("/work", &[("x-res", &r), ("x-id", "e")])).await);
    p.open(1);
    let all = tokio::time::timeout(BOUND, res.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(all, "first;last");
}

// ---------------------------------------------------------------------------
// 3. gRPC
// ---------------------------------------------------------------------------

/// On the wire: over the limit, a gRPC request is answered HTTP 200 with
/// grpc-status 8 (RESOURCE_EXHAUSTED) in the headers and no body.
async fn grpc_over_the_limit_is_resource_exhausted(env: Env) {
    let semaphore = env.semaphore(1).await;
    let ns = unique("grpc");
    let p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore.clone(), key()).namespace(&ns),
        p.probe.clone(),
    );
    let r = unique("k");
    let held = semaphore
        .try_acquire(name_of(&ns, &r), &LockOptions::new())
        .await
        .unwrap();
    let res = tokio::time::timeout(
        BOUND,
        app.clone().oneshot(req("/work", &[("x-res", &r), GRPC])),
    )
    .await
    .unwrap()
    .unwrap();
    let h = &common::grpc::assert_trailers_only(res, "8").await;
    assert!(
        h["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("too many requests in flight"),
        "{h:?}"
    );
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    assert_eq!(h["ratelimit-policy"], policy(&ns, 1).as_str());
    assert!(p.events().is_empty(), "{:?}", p.events());

    assert!(held.release().await.unwrap());
    let ok = send(&app, req("/work", &[("x-res", &r), GRPC])).await;
    assert!(ok.header("grpc-status").is_none(), "{ok:?}");
    fence_of(&ok);
}

// ---------------------------------------------------------------------------
// 4. Failure policies: Redis paused, Redis down
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Fault {
    Pause,
    Stop,
}

async fn failure_policy(policy_kind: FailurePolicy, fault: Fault) {
    const N: u32 = 4;
    let mut server = RedisServer::start().unwrap();
    let semaphore = Semaphore::builder(RedisBackend::connect(&server.url()).await.unwrap(), N)
        .timeout(Duration::from_millis(200))
        .on_failure(policy_kind)
        .build()
        .unwrap();
    let ns = unique("fail");
    let r = unique("k");
    let name = name_of(&ns, &r);
    let mut p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore, key()).namespace(&ns),
        p.probe.clone(),
    );
    fence_of(&bounded_send(&app, req("/work", &[("x-res", &r), ("x-id", "up")])).await);
    p.wait_entered("up").await;

    match fault {
        Fault::Pause => server.pause(),
        Fault::Stop => tokio::task::block_in_place(|| server.stop()),
    }
    match policy_kind {
        FailurePolicy::Allow => {
            // Let through without a permit: no fence, and not counted.
            let held: Vec<_> = (0..N + 1)
                .map(|i| {
                    let id = format!("a{i}");
                    spawn_send(&app, req("/work", &[("x-res", &r), ("x-id", &id), HOLD]))
                })
                .collect();
            for _ in 0..=N {
                tokio::time::timeout(FAULT_BOUND, p.next())
                    .await
                    .expect("a request waited past the bound");
            }
            assert_eq!(p.running(), N as usize + 1, "unlimited while failing open");
            p.open(N as usize + 1);
            for h in held {
                let a = join(h).await;
                assert_eq!((a.status, a.body.as_str()), (StatusCode::OK, "unlimited"));
            }
        }
        FailurePolicy::Deny => {
            let d = bounded_send(&app, req("/work", &[("x-res", &r), ("x-id", "d")])).await;
            assert_eq!(d.status, StatusCode::SERVICE_UNAVAILABLE, "{d:?}");
            assert_eq!(d.header("retry-after"), Some("1"));
            assert_eq!(problem_detail(&d), "concurrency limiter unavailable");
            assert!(!p.events().contains(&"start d".to_owned()));
        }
        FailurePolicy::Fallback { instances } => {
            assert_eq!(instances.get(), 2);
            let held: Vec<_> = ["f0", "f1"]
                .into_iter()
                .map(|id| spawn_send(&app, req("/work", &[("x-res", &r), ("x-id", id), HOLD])))
                .collect();
            for _ in 0..2 {
                tokio::time::timeout(FAULT_BOUND, p.next())
                    .await
                    .expect("a request waited past the bound");
            }
            // N / instances = 2 local permits.
            let c = bounded_send(&app, req("/work", &[("x-res", &r), ("x-id", "c")])).await;
            assert_eq!(c.status, StatusCode::TOO_MANY_REQUESTS, "{c:?}");
            assert!(c.retry_after() >= 1);
            assert_eq!(c.expect_header("ratelimit-policy"), policy(&ns, N));
            p.open(2);
            for h in held {
                fence_of(&join(h).await);
            }
        }
        other => panic!("no case for {other:?}"),
    }

    match fault {
        Fault::Pause => server.resume(),
        Fault::Stop => tokio::task::block_in_place(|| server.restart()).unwrap(),
    }
    // Recovered without restarting the app: with every permit taken on
    // Redis by another process, the layer refuses (it counts on Redis
    // again, not locally or not at all).
    let other = Semaphore::builder(RedisBackend::connect_lazy(&server.url()).unwrap(), N)
        .timeout(Duration::from_millis(500))
        .on_failure(FailurePolicy::Deny)
        .build()
        .unwrap();
    let mut taken = Vec::new();
    while taken.len() < N as usize {
        let permit = eventually(BOUND, "Redis answers again", || {
            let (other, name) = (other.clone(), name.clone());
            async move { other.try_acquire(name, &LockOptions::new()).await.ok() }
        })
        .await;
        taken.push(permit);
    }
    eventually(BOUND, "the layer counts on Redis again", || {
        let app = app.clone();
        let r = r.clone();
        async move {
            let reply = bounded_send(&app, req("/work", &[("x-res", &r), ("x-id", "rec")])).await;
            (reply.status == StatusCode::TOO_MANY_REQUESTS).then_some(())
        }
    })
    .await;
    for permit in taken {
        assert!(permit.release().await.unwrap());
    }
    fence_of(&bounded_send(&app, req("/work", &[("x-res", &r), ("x-id", "after")])).await);
}

// ---------------------------------------------------------------------------
// 5. A permit lost mid-request
// ---------------------------------------------------------------------------

/// Tests that lose permits run one at a time, so the `lost` counter moves
/// only for the test that looks at it.
static LOSING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[cfg(feature = "metrics")]
mod counters {
    /// `tollgate_concurrency_requests_total{outcome=<outcome>}`.
    pub(crate) fn concurrency(outcome: &str) -> u64 {
        tollgate_testkit::metrics::recorder().get(&format!(
            "tollgate_concurrency_requests_total{{outcome={outcome}}}"
        ))
    }
}

/// Records warnings (`WARN target: message fields…`).
#[derive(Clone, Default)]
struct Warnings {
    lines: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicU64>,
}

struct Line<'a>(&'a mut String);

impl tracing::field::Visit for Line<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        *m.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let m = event.metadata();
        let mut line = format!("{} {}:", m.level(), m.target());
        event.record(&mut Line(&mut line));
        self.lines.lock().unwrap().push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The semaphore key deleted while the handler runs: the watchdog's next
/// renewal finds the permit gone; the loss is reported (warning, counter)
/// and, by default, the handler goes on and its response is sent.
async fn lost_permit_is_reported_and_the_request_goes_on(env: Env) {
    let _one_at_a_time = LOSING.lock().await;
    let semaphore = env.semaphore(2).await;
    let ns = unique("lost");
    let r = unique("k");
    let sem_key = semaphore.keys_for(name_of(&ns, &r)).lock;
    let mut p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore, key())
            .namespace(&ns)
            .options(LockOptions::new().ttl(Duration::from_millis(600))),
        p.probe.clone(),
    );
    #[cfg(feature = "metrics")]
    let before = counters::concurrency("lost");
    let warnings = Warnings::default();
    let a = {
        let app = app.clone();
        let req = req("/work", &[("x-res", &r), ("x-id", "a"), WATCH, HOLD]);
        tokio::spawn(async move { send(&app, req).await }.with_subscriber(warnings.clone()))
    };
    p.wait_entered("a").await;
    env.delete(&sem_key).await;
    // The handler saw its LeaseLost resolve; the layer, polled first in the
    // same task, has reported the loss by then.
    p.wait_entered("a lost").await;
    #[cfg(feature = "metrics")]
    assert_eq!(counters::concurrency("lost"), before + 1);
    let lines = warnings.lines.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("WARN tollgate_tower::concurrency:")
                && l.contains("concurrency permit lost mid-request")
                && l.contains("cancel=false")),
        "{lines:#?}"
    );
    p.open(1);
    let a = join(a).await;
    fence_of(&a);
    assert_eq!(p.events(), ["start a", "end a"]);
    // Reported once, not again when the body (which held it) ends.
    #[cfg(feature = "metrics")]
    assert_eq!(counters::concurrency("lost"), before + 1);
    let lines = warnings.lines.lock().unwrap().clone();
    let reports = lines
        .iter()
        .filter(|l| l.contains("concurrency permit lost mid-request"))
        .count();
    assert_eq!(reports, 1, "{lines:#?}");
}

/// With `OnLeaseLost::Cancel` the handler is dropped at the loss and the
/// request is answered 503.
async fn lost_permit_cancels_when_asked(env: Env) {
    let _one_at_a_time = LOSING.lock().await;
    let semaphore = env.semaphore(2).await;
    let ns = unique("lostc");
    let r = unique("k");
    let sem_key = semaphore.keys_for(name_of(&ns, &r)).lock;
    let mut p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore, key())
            .namespace(&ns)
            .options(LockOptions::new().ttl(Duration::from_millis(600)))
            .on_permit_lost(OnLeaseLost::Cancel),
        p.probe.clone(),
    );
    #[cfg(feature = "metrics")]
    let before = counters::concurrency("lost");
    let a = spawn_send(&app, req("/work", &[("x-res", &r), ("x-id", "a"), HOLD]));
    p.wait_entered("a").await;
    env.delete(&sem_key).await;
    let a = join(a).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(
        problem_detail(&a),
        "concurrency permit lost while handling the request; the request was cancelled"
    );
    // Answered without the gate ever opening: the handler was dropped.
    assert_eq!(p.events(), ["start a"]);
    assert_eq!(p.running(), 0, "the handler was dropped");
    #[cfg(feature = "metrics")]
    assert_eq!(counters::concurrency("lost"), before + 1);
}

/// A permit lost while the response body streams (the default holds it to
/// the body's end): reported as well; by default the body goes on to its
/// end, with `OnLeaseLost::Cancel` it ends with an error.
async fn lost_permit_mid_body(env: Env, on_lost: OnLeaseLost) {
    let _one_at_a_time = LOSING.lock().await;
    let semaphore = env.semaphore(2).await;
    let ns = unique("lostbody");
    let r = unique("k");
    let sem_key = semaphore.keys_for(name_of(&ns, &r)).lock;
    let p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore, key())
            .namespace(&ns)
            .options(LockOptions::new().ttl(Duration::from_millis(600)))
            .on_permit_lost(on_lost),
        p.probe.clone(),
    );
    #[cfg(feature = "metrics")]
    let before = counters::concurrency("lost");
    let warnings = Warnings::default();
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req("/stream", &[("x-res", &r)])))
        .await
        .unwrap()
        .unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first;");
    // The rest is read by a task, so the body is polled while the permit
    // is taken away.
    let rest = tokio::spawn(
        async move { body.collect().await.map(|c| c.to_bytes()) }.with_subscriber(warnings.clone()),
    );
    env.delete(&sem_key).await;
    let cancel = on_lost == OnLeaseLost::Cancel;
    eventually(BOUND, "the loss is reported", || {
        let lines = warnings.lines.lock().unwrap().clone();
        let seen = lines.iter().any(|l| {
            l.starts_with("WARN tollgate_tower::concurrency:")
                && l.contains("concurrency permit lost mid-request")
                && l.contains(&format!("cancel={cancel}"))
        });
        async move { seen.then_some(()) }
    })
    .await;
    #[cfg(feature = "metrics")]
    assert_eq!(counters::concurrency("lost"), before + 1);
    p.open(1);
    let rest = tokio::time::timeout(BOUND, rest).await.unwrap().unwrap();
    match on_lost {
        OnLeaseLost::Cancel => {
            let err = rest.expect_err("the body must break when the permit is lost");
            assert!(err.to_string().contains("lost"), "{err}");
        }
        _ => assert_eq!(rest.unwrap(), "last"),
    }
}

async fn lost_permit_mid_body_continues(env: Env) {
    lost_permit_mid_body(env, OnLeaseLost::Continue).await;
}

async fn lost_permit_mid_body_breaks_the_body_when_cancelling(env: Env) {
    lost_permit_mid_body(env, OnLeaseLost::Cancel).await;
}

// ---------------------------------------------------------------------------
// 6. Key errors and unkeyed requests
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_request_that_cannot_be_keyed_gets_the_extractors_status() {
    let semaphore = Semaphore::new(MemoryBackend::new(), 1).unwrap();
    let p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore, key()),
        p.probe.clone(),
    );
    let r = send(&app, req("/work", &[("x-id", "a")])).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{r:?}");
    assert_eq!(problem_detail(&r), "missing x-res header");
    assert!(r.header("retry-after").is_none());
    assert!(p.events().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_requests_pass_unlimited() {
    let semaphore = Semaphore::new(MemoryBackend::new(), 1).unwrap();
    let mut p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore.clone(), key().optional()),
        p.probe.clone(),
    );
    // Two unkeyed requests in flight at once on a limit of one.
    let a = spawn_send(&app, req("/work", &[("x-id", "a"), HOLD]));
    let b = spawn_send(&app, req("/work", &[("x-id", "b"), HOLD]));
    p.next().await;
    p.next().await;
    assert_eq!(p.running(), 2);
    // They took nothing: a keyed request still gets the one permit.
    let r = unique("k");
    fence_of(&send(&app, req("/work", &[("x-res", &r), ("x-id", "c")])).await);
    p.open(2);
    for h in [a, b] {
        let reply = join(h).await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, "unlimited")
        );
    }
}

// ---------------------------------------------------------------------------
// 7. The service: Clone + Send + Sync; the check runs in the future
// ---------------------------------------------------------------------------

fn assert_clone_send_sync<T: Clone + Send + Sync + 'static>(_: &T) {}
fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn the_check_runs_in_the_response_future_not_in_poll_ready() {
    let semaphore = Semaphore::new(MemoryBackend::new(), 1).unwrap();
    let ns = unique("svc");
    let r = unique("k");
    let name = name_of(&ns, &r);
    let mut svc = ConcurrencyLimitLayer::new(semaphore.clone(), key())
        .namespace(&ns)
        .layer(tower::service_fn(|req: Request<Body>| async move {
            let fence = req.extensions().get::<FencingToken>().copied();
            let body = fence.map_or("unlimited".to_owned(), |f| f.to_string());
            Ok::<_, Infallible>(Response::new(Body::from(body)))
        }));
    assert_clone_send_sync(&svc);
    let request = || req("/", &[("x-res", &r)]);

    // All permits taken: poll_ready is still ready at once.
    let held = semaphore
        .try_acquire(name.clone(), &LockOptions::new())
        .await
        .unwrap();
    svc.ready()
        .now_or_never()
        .expect("poll_ready must not wait for a permit")
        .unwrap();
    let refused = svc.call(request());
    assert_send(&refused);
    let refused = refused.await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    held.release().await.unwrap();

    // Free: calling takes nothing until the future is polled; a future
    // dropped unpolled never takes a permit.
    svc.ready().await.unwrap();
    drop(svc.call(request()));
    svc.ready().await.unwrap();
    let future = svc.call(request());
    assert_eq!(semaphore.in_use(name.clone()).await.unwrap(), 0);
    let res = future.await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // Held until the body has been read to the end.
    assert_eq!(semaphore.in_use(name.clone()).await.unwrap(), 1);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(
        std::str::from_utf8(&body).unwrap().parse::<u64>().is_ok(),
        "{body:?}"
    );
    assert_eq!(semaphore.in_use(name).await.unwrap(), 0);

    // Clones share the limit (it lives in the semaphore, not the service).
    let mut clone = svc.clone();
    let held = semaphore
        .try_acquire(name_of(&ns, &r), &LockOptions::new())
        .await
        .unwrap();
    let res = clone.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(held);
}

#[tokio::test]
async fn without_a_namespace_the_policy_is_named_concurrency() {
    let semaphore = Semaphore::new(MemoryBackend::new(), 2).unwrap();
    let p = ProbeRx::new();
    let app = app(
        ConcurrencyLimitLayer::new(semaphore.clone(), GlobalKey),
        p.probe.clone(),
    );
    let a = semaphore
        .try_acquire("global", &LockOptions::new())
        .await
        .unwrap();
    let b = semaphore
        .try_acquire("global", &LockOptions::new())
        .await
        .unwrap();
    let r = send(&app, req("/work", &[("x-id", "x")])).await;
    assert_too_many(&r, &policy("concurrency", 2));
    drop((a, b));
}

// ---------------------------------------------------------------------------
// gRPC through a real tonic server and client
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_tonic_client_sees_resource_exhausted() {
    use common::grpc::{check, client, retry_after, serve};

    let semaphore = Semaphore::new(MemoryBackend::new(), 1).unwrap();
    let addr = serve(ConcurrencyLimitLayer::new(semaphore.clone(), GlobalKey)).await;
    let mut client = client(addr).await;
    client.check(check()).await.expect("free: admitted");
    let held = semaphore
        .try_acquire("global", &LockOptions::new())
        .await
        .unwrap();
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("too many requests in flight"),
        "{status:?}"
    );
    let retry = retry_after(&status);
    let md = status.metadata();
    assert!((1..=30).contains(&retry));
    assert_eq!(
        md.get("ratelimit-policy").unwrap().to_str().unwrap(),
        policy("concurrency", 1)
    );
    held.release().await.unwrap();
    client.check(check()).await.expect("released: admitted");
}

// ---------------------------------------------------------------------------
// One test per backend
// ---------------------------------------------------------------------------

macro_rules! on {
    ($($kind:ident: $($suite:ident as $test:ident),+;)+) => {
        $($(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                $suite(Env::new(Kind::$kind)).await;
            }
        )+)+
    };
}

on! {
    Memory:
        n_run_and_the_next_gets_429 as n_run_and_the_next_gets_429_on_memory,
        never_more_than_n_in_flight as never_more_than_n_in_flight_on_memory,
        held_until_the_body_ends as held_until_the_body_ends_on_memory,
        a_handler_keeps_its_permit_past_the_cap as handler_past_the_cap_on_memory,
        a_streamed_body_keeps_its_permit_past_the_cap as stream_past_the_cap_on_memory,
        a_handler_keeps_its_permit_with_renewal_off as renewal_off_on_memory,
        grpc_over_the_limit_is_resource_exhausted as grpc_over_the_limit_on_memory;
    Redis:
        n_run_and_the_next_gets_429 as n_run_and_the_next_gets_429_on_redis,
        never_more_than_n_in_flight as never_more_than_n_in_flight_on_redis,
        held_until_the_body_ends as held_until_the_body_ends_on_redis,
        a_handler_keeps_its_permit_past_the_cap as handler_past_the_cap_on_redis,
        a_streamed_body_keeps_its_permit_past_the_cap as stream_past_the_cap_on_redis,
        grpc_over_the_limit_is_resource_exhausted as grpc_over_the_limit_on_redis,
        lost_permit_is_reported_and_the_request_goes_on as lost_permit_continues_on_redis,
        lost_permit_cancels_when_asked as lost_permit_cancels_on_redis,
        lost_permit_mid_body_continues as lost_permit_mid_body_continues_on_redis,
        lost_permit_mid_body_breaks_the_body_when_cancelling as lost_permit_mid_body_cancels_on_redis;
    Cluster:
        n_run_and_the_next_gets_429 as n_run_and_the_next_gets_429_on_cluster,
        never_more_than_n_in_flight as never_more_than_n_in_flight_on_cluster,
        held_until_the_body_ends as held_until_the_body_ends_on_cluster,
        a_handler_keeps_its_permit_past_the_cap as handler_past_the_cap_on_cluster,
        a_streamed_body_keeps_its_permit_past_the_cap as stream_past_the_cap_on_cluster,
        lost_permit_is_reported_and_the_request_goes_on as lost_permit_continues_on_cluster,
        lost_permit_cancels_when_asked as lost_permit_cancels_on_cluster,
        lost_permit_mid_body_continues as lost_permit_mid_body_continues_on_cluster;
}

fn fallback_of_two() -> FailurePolicy {
    FailurePolicy::Fallback {
        instances: std::num::NonZeroU32::new(2).unwrap(),
    }
}

macro_rules! failures {
    ($($test:ident: $policy:expr, $fault:ident;)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                failure_policy($policy, Fault::$fault).await;
            }
        )+
    };
}

failures! {
    redis_paused_allow_passes_without_a_permit: FailurePolicy::Allow, Pause;
    redis_down_allow_passes_without_a_permit: FailurePolicy::Allow, Stop;
    redis_paused_deny_is_503: FailurePolicy::Deny, Pause;
    redis_down_deny_is_503: FailurePolicy::Deny, Stop;
    redis_paused_fallback_admits_n_over_instances: fallback_of_two(), Pause;
    redis_down_fallback_admits_n_over_instances: fallback_of_two(), Stop;
}
