//! The LockLayer suite every backend runs (memory, standalone Redis, Redis
//! Cluster). No assertion depends on timing: tests wait for events (a
//! handler entered, a response arrived) with generous bounds.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::routing::get as route_get;
use axum::{Extension, Router};
use futures::future::BoxFuture;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, Semaphore};
use tollgate_core::{FencingToken, LockOptions, Locker, Subject};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::lock::HoldUntil;
use tollgate_tower::LockLayer;
use tower::ServiceExt;

use super::{problem_detail, send, Reply, Watched};

/// Far above anything these tests wait for, far below a hang.
pub const BOUND: Duration = Duration::from_secs(15);

/// Deletes the lock at a key, as an operator (or a failover) would.
pub type BreakLock = Box<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>;

/// A locker, the count of its refused acquires, and a way to delete a
/// lock's key behind its holder's back.
pub struct LockEnv {
    pub locker: Locker,
    pub watched: Watched,
    pub break_lock: BreakLock,
}

/// What the handlers report to the test.
#[derive(Clone)]
pub struct Probe {
    pub events: Arc<Mutex<Vec<String>>>,
    pub entered: mpsc::UnboundedSender<String>,
    pub gate: Arc<Semaphore>,
    /// Handlers started and not yet finished or dropped.
    pub running: Arc<AtomicUsize>,
}

pub struct ProbeRx {
    pub probe: Probe,
    pub entered: mpsc::UnboundedReceiver<String>,
}

impl ProbeRx {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        ProbeRx {
            probe: Probe {
                events: Arc::default(),
                entered: tx,
                gate: Arc::new(Semaphore::new(0)),
                running: Arc::default(),
            },
            entered: rx,
        }
    }

    /// Waits until the handler of request `id` has started.
    pub async fn wait_entered(&mut self, id: &str) {
        let got = tokio::time::timeout(BOUND, self.entered.recv())
            .await
            .expect("handler never entered")
            .unwrap();
        assert_eq!(got, id);
    }

    pub fn events(&self) -> Vec<String> {
        self.probe.events.lock().unwrap().clone()
    }

    /// Handlers running now (a dropped one no longer counts).
    pub fn running(&self) -> usize {
        self.probe.running.load(Ordering::SeqCst)
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

/// Logs start and end; with `x-hold`, waits for the gate in between.
async fn work(
    State(p): State<Probe>,
    fence: Option<Extension<FencingToken>>,
    headers: HeaderMap,
) -> String {
    let id = header(&headers, "x-id").unwrap_or("?").to_owned();
    p.running.fetch_add(1, Ordering::SeqCst);
    let _running = Running(Arc::clone(&p.running));
    p.events.lock().unwrap().push(format!("start {id}"));
    let _ = p.entered.send(id.clone());
    if headers.contains_key("x-hold") {
        p.gate.acquire().await.unwrap().forget();
    }
    p.events.lock().unwrap().push(format!("end {id}"));
    match fence {
        Some(Extension(f)) => f.to_string(),
        None => "unlocked".to_owned(),
    }
}

/// A body that sends one chunk, waits for the gate, then ends.
async fn stream(State(p): State<Probe>, headers: HeaderMap) -> Body {
    let id = header(&headers, "x-id").unwrap_or("?").to_owned();
    let _ = p.entered.send(id);
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

/// [`stream`] as a gRPC response's body.
async fn grpc_stream(
    state: State<Probe>,
    headers: HeaderMap,
) -> ([(http::header::HeaderName, &'static str); 1], Body) {
    let body = stream(state, headers).await;
    ([(http::header::CONTENT_TYPE, "application/grpc")], body)
}

pub fn app(layer: LockLayer<HeaderKey>, probe: Probe) -> Router {
    Router::new()
        .route("/work", route_get(work))
        .route("/stream", route_get(stream))
        .route("/grpc-stream", route_get(grpc_stream))
        .with_state(probe)
        .layer(layer)
}

pub fn req(path: &str, resource: &str, id: &str, hold: bool) -> Request<Body> {
    let mut b = Request::get(path)
        .header("x-res", resource)
        .header("x-id", id);
    if hold {
        b = b.header("x-hold", "1");
    }
    b.body(Body::empty()).unwrap()
}

pub fn key() -> HeaderKey {
    HeaderKey::new("x-res").plain()
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

/// A unique resource name.
pub fn resource(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    super::unique(&format!("{tag}{}", N.fetch_add(1, Ordering::Relaxed)))
}

/// Two requests for one resource: one runs, the other gets 409 with
/// Retry-After from the holder's TTL; another resource runs in parallel;
/// after the holder finishes, the lock is free at once.
pub async fn one_runs_the_other_gets_409(env: LockEnv) {
    let mut p = ProbeRx::new();
    let app = app(LockLayer::new(env.locker, key()), p.probe.clone());
    let (r1, r2) = (resource("a"), resource("b"));

    let a = spawn_send(&app, req("/work", &r1, "a", true));
    p.wait_entered("a").await;

    let b = send(&app, req("/work", &r1, "b", false)).await;
    assert_eq!(b.status, StatusCode::CONFLICT, "{b:?}");
    let retry: u64 = b.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    assert_eq!(
        problem_detail(&b),
        format!("resource is busy; retry in {retry} s")
    );

    // Another resource is not blocked by the first.
    let c = send(&app, req("/work", &r2, "c", false)).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");

    p.probe.gate.add_permits(1);
    let a = join(a).await;
    assert_eq!(a.status, StatusCode::OK);
    // Released before A's response was returned: free right away.
    let d = send(&app, req("/work", &r1, "d", false)).await;
    assert_eq!(d.status, StatusCode::OK, "{d:?}");
    let (fa, fd): (u64, u64) = (a.body.parse().unwrap(), d.body.parse().unwrap());
    assert!(fd > fa, "{fa} then {fd}");
    assert!(!p.events().contains(&"start b".to_owned()));
}

/// With a wait bound, the second request waits for the first and then runs.
pub async fn waits_when_configured(env: LockEnv) {
    // B is sent once A holds the lock, and the gate opens only after B's
    // acquire was refused: B can then only succeed by waiting. The control,
    // without a wait, is refused.
    for wait in [true, false] {
        let refused = env.watched.refusals();
        let mut p = ProbeRx::new();
        let options = if wait {
            LockOptions::new().wait(BOUND)
        } else {
            LockOptions::new()
        };
        let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
        let app = app(
            LockLayer::new(env.locker.clone(), key()).options(options),
            p.probe.clone(),
        )
        .layer(tower::util::MapRequestLayer::new(
            move |req: Request<Body>| {
                let _ = arrived_tx.send(header(req.headers(), "x-id").unwrap_or("?").to_owned());
                req
            },
        ));
        let r = resource("w");
        let a = spawn_send(&app, req("/work", &r, "a", true));
        p.wait_entered("a").await;
        assert_eq!(arrived.recv().await.as_deref(), Some("a"));
        let b = spawn_send(&app, req("/work", &r, "b", false));
        assert_eq!(arrived.recv().await.as_deref(), Some("b"));
        let b = if wait {
            env.watched.refused(refused + 1).await;
            assert!(!b.is_finished(), "B waits while A holds the lock");
            Some(b)
        } else {
            // Refused while A still holds the lock.
            let refused = join(b).await;
            assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
            None
        };
        p.probe.gate.add_permits(1);
        assert_eq!(join(a).await.status, StatusCode::OK);
        if let Some(b) = b {
            assert_eq!(join(b).await.status, StatusCode::OK);
            assert_eq!(p.events(), ["start a", "end a", "start b", "end b"]);
        } else {
            assert_eq!(p.events(), ["start a", "end a"]);
        }
    }
}

/// Fences strictly increase across holders of one resource.
pub async fn fences_strictly_increase(env: LockEnv) {
    let p = ProbeRx::new();
    let app = app(LockLayer::new(env.locker, key()), p.probe.clone());
    let r = resource("f");
    let mut last = 0u64;
    for i in 0..10 {
        let reply = send(&app, req("/work", &r, &i.to_string(), false)).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let fence: u64 = reply.body.parse().unwrap();
        assert!(fence > last, "{last} then {fence}");
        last = fence;
    }
}

/// The lock key deleted behind the holder's back: the next renewal finds it
/// gone, the lease is lost, the handler is dropped (it never finishes) and
/// the request is answered 503.
pub async fn lost_lease_cancels_the_handler(env: LockEnv) {
    let mut p = ProbeRx::new();
    let r = resource("lost");
    let lock_key = env.locker.keys_for(Subject::new(&r)).lock;
    let app = app(
        LockLayer::new(env.locker, key())
            .options(LockOptions::new().ttl(Duration::from_millis(1500))),
        p.probe.clone(),
    );
    let a = spawn_send(&app, req("/work", &r, "a", true));
    p.wait_entered("a").await;
    (env.break_lock)(lock_key).await;
    let a = join(a).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
    assert_eq!(
        problem_detail(&a),
        "lock lost while handling the request; the request was cancelled"
    );
    // The handler was dropped (not left running): opening its gate cannot
    // make it finish.
    assert_eq!(p.running(), 0, "the handler was not dropped");
    p.probe.gate.add_permits(10);
    assert_eq!(p.events(), ["start a"]);
}

/// With `HoldUntil::BodyEnd` the lock is held while the body streams, and
/// released once it has ended.
pub async fn held_until_the_body_ends(env: LockEnv) {
    let mut p = ProbeRx::new();
    let app = app(
        LockLayer::new(env.locker, key()).hold_until(HoldUntil::BodyEnd),
        p.probe.clone(),
    );
    let r = resource("body");
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req("/stream", &r, "a", false)))
        .await
        .unwrap()
        .unwrap();
    p.wait_entered("a").await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first;");
    // Headers sent, body still streaming: the lock is still held.
    let b = send(&app, req("/work", &r, "b", false)).await;
    assert_eq!(b.status, StatusCode::CONFLICT);
    p.probe.gate.add_permits(1);
    let rest = tokio::time::timeout(BOUND, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "last");
    let c = send(&app, req("/work", &r, "c", false)).await;
    assert_eq!(c.status, StatusCode::OK, "{c:?}");
}

/// Streams `path` under a `HoldUntil::BodyEnd` lock on `resource`, breaks
/// the lock after the first chunk, and reads the rest of the body.
async fn lose_lease_mid_body(
    env: LockEnv,
    path: &str,
    resource_name: &str,
) -> Result<http_body_util::Collected<bytes::Bytes>, axum::Error> {
    let mut p = ProbeRx::new();
    let r = resource(resource_name);
    let lock_key = env.locker.keys_for(Subject::new(&r)).lock;
    let app = app(
        LockLayer::new(env.locker, key())
            .options(LockOptions::new().ttl(Duration::from_millis(1500)))
            .hold_until(HoldUntil::BodyEnd),
        p.probe.clone(),
    );
    let res = tokio::time::timeout(BOUND, app.clone().oneshot(req(path, &r, "a", false)))
        .await
        .unwrap()
        .unwrap();
    p.wait_entered("a").await;
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first;");
    (env.break_lock)(lock_key).await;
    tokio::time::timeout(BOUND, body.collect()).await.unwrap()
}

/// With `HoldUntil::BodyEnd`, a lease lost while the body streams ends the
/// body with an error: the client sees a broken response, not a complete
/// but truncated one.
pub async fn lost_lease_mid_body_breaks_the_body(env: LockEnv) {
    let rest = lose_lease_mid_body(env, "/stream", "lostbody").await;
    let err = rest.expect_err("the body must break when the lease is lost");
    assert!(err.to_string().contains("lease was lost"), "{err}");
}

/// The same loss on a gRPC response ends its stream with trailers saying
/// ABORTED, the call's status a gRPC client reads (a broken stream would
/// read INTERNAL).
pub async fn lost_lease_mid_grpc_body_ends_aborted(env: LockEnv) {
    let rest = lose_lease_mid_body(env, "/grpc-stream", "lostgrpc")
        .await
        .expect("a gRPC stream ends with its status, not an error");
    let trailers = rest.trailers().expect("trailers");
    assert_eq!(trailers["grpc-status"], "10", "{trailers:?}");
}

/// A key extractor's "not locked" passes through without a lock or fence.
pub async fn unkeyed_requests_pass_unlocked(env: LockEnv) {
    let p = ProbeRx::new();
    let app = Router::new()
        .route("/work", route_get(work))
        .with_state(p.probe.clone())
        .layer(LockLayer::new(
            env.locker,
            HeaderKey::new("x-res").plain().optional(),
        ));
    let r = send(
        &app,
        Request::get("/work")
            .header("x-id", "a")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unlocked"));
}

/// Generates one `#[tokio::test]` per lock suite function for a backend.
#[macro_export]
macro_rules! lock_suite {
    ($env:path) => {
        $crate::lock_suite!(@tests $env;
            one_runs_the_other_gets_409, waits_when_configured, fences_strictly_increase,
            lost_lease_cancels_the_handler, held_until_the_body_ends,
            lost_lease_mid_body_breaks_the_body, lost_lease_mid_grpc_body_ends_aborted,
            unkeyed_requests_pass_unlocked);
    };
    (@tests $env:path; $($name:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                common::lock_suite::$name($env().await).await;
            }
        )+
    };
}
