//! One rejection model: a tower layer and an axum extractor that refuse a
//! request for the same reason answer with the same status, headers and
//! body — over HTTP and gRPC, on memory, standalone Redis and a cluster.
//!
//! Each case puts a layer route and an extractor route side by side on one
//! router, over the same limiter or locker, and compares the two answers
//! byte for byte. (A lost lease is the layer's alone: an extractor does not
//! cancel its handler, so that reason has no extractor twin.)

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::extract::FromRef;
use axum::routing::{get, post};
use axum::Router;
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tollgate_axum::{
    HeldLock, HeldPermit, LockResource, PermitResource, RateLimitPolicy, RateLimited,
};
use tollgate_core::{
    Algorithm, FailurePolicy, LockBackend, LockOptions, Locker, ManualClock, MemoryBackend, Quota,
    RateBackend, RateLimiter, RedisBackend, Semaphore, Subject,
};
use tollgate_testkit::{RedisCluster, RedisServer};
use tollgate_tower::key::{HeaderKey, PathParam, PeerIp};
use tollgate_tower::{ConcurrencyLimitLayer, LockLayer, RateLimitLayer};
use tower::ServiceExt;

#[derive(Clone, FromRef)]
struct State {
    limiter: RateLimiter,
    locker: Locker,
    semaphore: Semaphore,
}

/// One in flight per `{id}`, namespaced `slots` (as the layer below).
struct Slot;

impl PermitResource<State> for Slot {
    type Key = PathParam;

    fn key(_: &State) -> PathParam {
        PathParam::new("id")
    }

    fn namespace(_: &State) -> Option<&'static str> {
        Some("slots")
    }
}

/// Per `x-user`, on the state's limiter; `x-cost` units.
struct PerUser;

impl RateLimitPolicy<State> for PerUser {
    type Key = HeaderKey;

    fn limiter(state: &State) -> RateLimiter {
        state.limiter.clone()
    }

    fn key(_: &State) -> HeaderKey {
        HeaderKey::new("x-user").plain()
    }

    fn cost(parts: &Parts, _: &State) -> u64 {
        cost(parts)
    }
}

/// Per socket peer (absent in these in-process requests: a 500 key error).
struct PerPeer;

impl RateLimitPolicy<State> for PerPeer {
    type Key = PeerIp;

    fn limiter(state: &State) -> RateLimiter {
        state.limiter.clone()
    }

    fn key(_: &State) -> PeerIp {
        PeerIp::new()
    }
}

/// One lock per `{id}`.
struct Job;

impl LockResource<State> for Job {
    type Key = PathParam;

    fn key(_: &State) -> PathParam {
        PathParam::new("id")
    }

    fn options(_: &State) -> LockOptions {
        LockOptions::new()
    }
}

fn cost(parts: &Parts) -> u64 {
    parts
        .headers
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// A limiter of 2 per minute on a fixed client clock (so both answers
/// carry the same `t=`), with the deny policy (so an outage is a 503).
fn limiter(backend: impl RateBackend) -> RateLimiter {
    RateLimiter::builder(backend, Algorithm::FixedWindow)
        .quota(Quota::per_minute(2))
        .name("parity")
        .prefix(format!("parity{}", tollgate_testkit::unique("")))
        .clock(ManualClock::new(1_800_000_030_000_000))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(200))
        .circuit_breaker(1_000, Duration::from_millis(1))
        .build()
        .unwrap()
}

/// One permit per key, refusing when the backend is down (deny policy).
fn semaphore(backend: impl LockBackend) -> Semaphore {
    Semaphore::builder(backend, 1)
        .prefix(format!("parity{}", tollgate_testkit::unique("")))
        .timeout(Duration::from_millis(200))
        .on_failure(FailurePolicy::Deny)
        .build()
        .unwrap()
}

fn app(limiter: RateLimiter, locker: Locker, semaphore: Semaphore) -> Router {
    let by_user = RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-user").plain())
        .cost(cost);
    let by_peer = RateLimitLayer::new(limiter.clone()).key(PeerIp::new());
    let lock = LockLayer::new(locker.clone(), PathParam::new("id"));
    let slots =
        ConcurrencyLimitLayer::new(semaphore.clone(), PathParam::new("id")).namespace("slots");
    Router::new()
        .route("/layer/limit", get(|| async { "ok" }).layer(by_user))
        .route("/ext/limit", get(|_: RateLimited<PerUser>| async { "ok" }))
        .route("/layer/peer", get(|| async { "ok" }).layer(by_peer))
        .route("/ext/peer", get(|_: RateLimited<PerPeer>| async { "ok" }))
        .route("/layer/jobs/{id}", post(|| async { "ran" }).layer(lock))
        .route("/ext/jobs/{id}", post(|_: HeldLock<Job>| async { "ran" }))
        .route("/layer/slots/{id}", post(|| async { "ran" }).layer(slots))
        .route(
            "/ext/slots/{id}",
            post(|_: HeldPermit<Slot>| async { "ran" }),
        )
        .with_state(State {
            limiter,
            locker,
            semaphore,
        })
}

/// Status, every header (in order) and the body.
type Answer = (StatusCode, Vec<(String, String)>, Vec<u8>);

async fn answer(app: &Router, req: Request<Body>) -> Answer {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    let body = res.into_body().collect().await.unwrap().to_bytes().to_vec();
    (status, headers, body)
}

/// The layer's and the extractor's answers to `path` (under `/layer` and
/// `/ext`), over HTTP and gRPC, are equal; returns the HTTP one.
async fn same_answer(app: &Router, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut http = None;
    for grpc in [false, true] {
        let req = |prefix: &str| {
            let mut b = Request::builder()
                .method(method)
                .uri(format!("/{prefix}{path}"));
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            if grpc {
                b = b.header("content-type", "application/grpc");
            }
            b.body(Body::empty()).unwrap()
        };
        let layer = answer(app, req("layer")).await;
        let ext = answer(app, req("ext")).await;
        assert_eq!(layer, ext, "{method} {path} (grpc: {grpc})");
        if grpc {
            assert_eq!(layer.0, StatusCode::OK, "gRPC answers are trailers-only");
        } else {
            http = Some(layer);
        }
    }
    http.unwrap()
}

fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
    a.1.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The `detail` of an answer's body, after checking the body is an
/// `about:blank` problem document of the answer's status.
fn problem_detail(a: &Answer) -> String {
    assert_eq!(header(a, "content-type"), Some("application/problem+json"));
    let v: serde_json::Value = serde_json::from_slice(&a.2)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&a.2)));
    assert_eq!(v["type"], "about:blank", "{v}");
    assert_eq!(v["title"], a.0.canonical_reason().unwrap(), "{v}");
    assert_eq!(v["status"], a.0.as_u16(), "{v}");
    let detail = v["detail"].as_str();
    detail
        .unwrap_or_else(|| panic!("no detail in {v}"))
        .to_owned()
}

/// Every reason both can give, on a live backend.
async fn parity<B>(backend: B)
where
    B: RateBackend + LockBackend + Clone,
{
    let locker = Locker::new(backend.clone());
    let semaphore = semaphore(backend.clone());
    let app = app(limiter(backend), locker.clone(), semaphore.clone());

    // Rate limited: 429, Retry-After, the draft headers.
    let user = [("x-user", "alice")];
    for path in ["/layer/limit", "/ext/limit"] {
        let ok = answer(
            &app,
            Request::get(path)
                .header("x-user", "alice")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(ok.0, StatusCode::OK);
    }
    let limited = same_answer(&app, "GET", "/limit", &user).await;
    assert_eq!(limited.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&limited, "retry-after"), Some("30"));
    assert_eq!(
        header(&limited, "ratelimit-policy"),
        Some(r#""parity";q=2;w=60"#)
    );
    assert_eq!(header(&limited, "ratelimit"), Some(r#""parity";r=0;t=30"#));
    // draft-10's quota-exceeded problem, naming the policy.
    assert_eq!(
        header(&limited, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        std::str::from_utf8(&limited.2).unwrap(),
        concat!(
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
            r#""title":"Request cannot be satisfied as assigned quota has been exceeded","#,
            r#""status":429,"detail":"rate limit exceeded; retry in 30 s","#,
            r#""violated-policies":["parity"]}"#
        )
    );

    // A cost beyond capacity: 413, the policy, no Retry-After.
    let costly = same_answer(&app, "GET", "/limit", &[("x-user", "bob"), ("x-cost", "3")]).await;
    assert_eq!(costly.0, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&costly, "retry-after"), None);
    assert_eq!(
        header(&costly, "ratelimit-policy"),
        Some(r#""parity";q=2;w=60"#)
    );
    assert_eq!(
        problem_detail(&costly),
        "request cost 3 exceeds the rate limit's capacity 2; it can never be admitted"
    );

    // No key: the extractor's status and message.
    let unkeyed = same_answer(&app, "GET", "/limit", &[]).await;
    assert_eq!(unkeyed.0, StatusCode::UNAUTHORIZED);
    assert_eq!(problem_detail(&unkeyed), "missing x-user header");
    let no_peer = same_answer(&app, "GET", "/peer", &[]).await;
    assert_eq!(no_peer.0, StatusCode::INTERNAL_SERVER_ERROR);
    problem_detail(&no_peer);

    // Busy: 409 with the holder's remaining lease, rounded up.
    let holder = locker
        .try_acquire(
            Subject::new("7"),
            &LockOptions::new().ttl(Duration::from_millis(20_500)),
        )
        .await
        .unwrap();
    let busy = same_answer(&app, "POST", "/jobs/7", &[]).await;
    assert_eq!(busy.0, StatusCode::CONFLICT);
    let wait: u64 = header(&busy, "retry-after").unwrap().parse().unwrap();
    assert!((20..=21).contains(&wait), "Retry-After {wait}");
    assert_eq!(
        problem_detail(&busy),
        format!("resource is busy; retry in {wait} s")
    );
    holder.release().await.unwrap();

    // Too many in flight: 429 until the holder's permit expires, rounded
    // up, and the concurrency policy.
    let holder = semaphore
        .try_acquire(
            Subject::compound(["slots", "9"]),
            &LockOptions::new().ttl(Duration::from_millis(20_500)),
        )
        .await
        .unwrap();
    let full = same_answer(&app, "POST", "/slots/9", &[]).await;
    assert_eq!(full.0, StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = header(&full, "retry-after").unwrap().parse().unwrap();
    assert!((20..=21).contains(&wait), "Retry-After {wait}");
    assert_eq!(
        header(&full, "ratelimit-policy"),
        Some(r#""slots";q=1;qu="concurrent-requests""#)
    );
    assert_eq!(
        problem_detail(&full),
        format!("too many requests in flight; retry in {wait} s")
    );
    // Another key is free, through either.
    for path in ["/layer/slots/10", "/ext/slots/10"] {
        let ok = answer(&app, Request::post(path).body(Body::empty()).unwrap()).await;
        assert_eq!(ok.0, StatusCode::OK, "{path}");
    }
    holder.release().await.unwrap();
}

/// An unreachable backend under the deny policy: 503 + `Retry-After: 1`
/// from both, for limits and for locks.
async fn unavailable_parity(backend: RedisBackend) {
    let locker = Locker::builder(backend.clone())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let app = app(limiter(backend.clone()), locker, semaphore(backend));
    let limit = same_answer(&app, "GET", "/limit", &[("x-user", "carol")]).await;
    assert_eq!(limit.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&limit, "retry-after"), Some("1"));
    assert_eq!(problem_detail(&limit), "rate limiter unavailable");
    let lock = same_answer(&app, "POST", "/jobs/8", &[]).await;
    assert_eq!(lock.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&lock, "retry-after"), Some("1"));
    assert_eq!(problem_detail(&lock), "lock service unavailable");
    let slots = same_answer(&app, "POST", "/slots/1", &[]).await;
    assert_eq!(slots.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&slots, "retry-after"), Some("1"));
}

fn dead_redis() -> RedisBackend {
    // A port that was free a moment ago: nothing answers there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    RedisBackend::connect_lazy(&format!("redis://127.0.0.1:{port}")).unwrap()
}

#[tokio::test]
async fn memory_layers_and_extractors_answer_alike() {
    parity(MemoryBackend::new()).await;
}

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start().expect("start redis-server"))
}

#[tokio::test]
async fn standalone_layers_and_extractors_answer_alike() {
    parity(RedisBackend::connect(&server().url()).await.unwrap()).await;
}

#[tokio::test]
async fn cluster_layers_and_extractors_answer_alike() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    parity(
        RedisBackend::connect_cluster(cluster.seeds())
            .await
            .unwrap(),
    )
    .await;
}

#[tokio::test]
async fn unavailable_backends_answer_alike() {
    unavailable_parity(dead_redis()).await;
}
