//! The failure policy against a real Redis that is paused (SIGSTOP), killed
//! and restarted under traffic.

mod common;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get as route_get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::StatusCode;
use tollgate_core::{Algorithm, Decision, Error, FailurePolicy, Quota, RateLimiter, RedisBackend};
use tollgate_testkit::RedisServer;
use tollgate_tower::rejection::{Rejection, RejectionReason};
use tollgate_tower::RateLimitLayer;

use common::{get, problem_detail, send, unique, Reply};

/// Generous: far above the 100–300 ms timeouts used here, far below a hang.
const BOUND: Duration = Duration::from_secs(5);

async fn echo(decision: Option<Extension<Decision>>) -> String {
    match decision {
        Some(Extension(d)) => format!("{:?}", d.source),
        None => "unlimited".to_owned(),
    }
}

async fn bounded_send(app: &Router) -> Reply {
    tokio::time::timeout(BOUND, send(app, get("/")))
        .await
        .expect("a request waited on a failing backend past the bound")
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new().route("/", route_get(echo)).layer(layer)
}

async fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(&server.url()).await.unwrap()
}

/// Polls until the backend decides again (the connection manager reconnects
/// on its own): recovery without restarting the service.
async fn wait_for_backend(app: &Router) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = bounded_send(app).await;
        if r.status == StatusCode::OK && r.body == "Backend" {
            assert!(r.header("ratelimit").is_some());
            return;
        }
        assert!(Instant::now() < deadline, "no recovery: last reply {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn allow_is_the_default_and_answers_within_the_timeout_while_redis_is_paused() {
    let server = RedisServer::start().unwrap();
    let app = app(RateLimitLayer::new(
        RateLimiter::builder(backend(&server).await, Algorithm::Gcra)
            .quota(Quota::per_hour(1000))
            .name(unique("allow"))
            .timeout(Duration::from_millis(200))
            .circuit_breaker(3, Duration::from_millis(300))
            .build()
            .unwrap(),
    ));
    let r = bounded_send(&app).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "Backend"));

    server.pause();
    for _ in 0..8 {
        let r = bounded_send(&app).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "FailOpen");
        // No made-up figures on a fail-open decision: the policy only.
        assert_eq!(r.header("ratelimit"), None);
        assert!(r.header("ratelimit-policy").is_some());
    }
    server.resume();
    wait_for_backend(&app).await;
}

#[tokio::test]
async fn deny_answers_503_while_redis_is_down_and_recovers_after_restart() {
    let mut server = RedisServer::start().unwrap();
    let app = app(RateLimitLayer::new(
        RateLimiter::builder(backend(&server).await, Algorithm::FixedWindow)
            .quota(Quota::per_hour(1000))
            .name(unique("deny"))
            .failure_policy(FailurePolicy::Deny)
            .timeout(Duration::from_millis(200))
            .circuit_breaker(3, Duration::from_millis(200))
            .build()
            .unwrap(),
    ));
    assert_eq!(bounded_send(&app).await.body, "Backend");

    server.stop();
    for _ in 0..5 {
        let r = bounded_send(&app).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
        assert_eq!(problem_detail(&r), "rate limiter unavailable");
    }
    server.restart().unwrap();
    wait_for_backend(&app).await;
}

#[tokio::test]
async fn deny_answers_503_while_redis_is_paused() {
    let server = RedisServer::start().unwrap();
    let app = app(RateLimitLayer::new(
        RateLimiter::builder(backend(&server).await, Algorithm::TokenBucket)
            .quota(Quota::per_hour(1000))
            .name(unique("deny-pause"))
            .failure_policy(FailurePolicy::Deny)
            .timeout(Duration::from_millis(150))
            .build()
            .unwrap(),
    ));
    assert_eq!(bounded_send(&app).await.body, "Backend");
    server.pause();
    let r = bounded_send(&app).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    server.resume();
    wait_for_backend(&app).await;
}

#[tokio::test]
async fn fallback_uses_the_local_limiter_with_a_share_of_the_limit() {
    let mut server = RedisServer::start().unwrap();
    let app = app(RateLimitLayer::new(
        RateLimiter::builder(backend(&server).await, Algorithm::FixedWindow)
            .quota(Quota::per_hour(4))
            .name(unique("fallback"))
            .failure_policy(FailurePolicy::Fallback {
                instances: NonZeroU32::new(2).unwrap(),
            })
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    ));
    assert_eq!(bounded_send(&app).await.body, "Backend");
    server.stop();
    // Two instances share the limit of 4: this one admits 2 on its own.
    for _ in 0..2 {
        let r = bounded_send(&app).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "Fallback"));
        // The local limiter's figures are real: they are reported, with
        // the share they count against as the policy.
        assert!(r.header("ratelimit").is_some());
        let policy = r.header("ratelimit-policy").unwrap();
        assert!(policy.contains(";q=2;"), "{policy}");
    }
    let r = bounded_send(&app).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.header("retry-after").is_some());
    server.restart().unwrap();
    wait_for_backend(&app).await;
}

#[tokio::test]
async fn the_circuit_breaker_stops_waiting_on_a_dead_redis() {
    let server = RedisServer::start().unwrap();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = Arc::clone(&seen);
    let app = app(RateLimitLayer::new(
        RateLimiter::builder(backend(&server).await, Algorithm::Gcra)
            .quota(Quota::per_hour(1000))
            .name(unique("breaker"))
            .failure_policy(FailurePolicy::Deny)
            .timeout(Duration::from_millis(300))
            .circuit_breaker(3, Duration::from_secs(60))
            .build()
            .unwrap(),
    )
    .responder(move |rej: &Rejection, _: &http::request::Parts| {
        let kind = match (rej.reason(), rej.error()) {
            (RejectionReason::Unavailable, Some(Error::Timeout(_))) => "timeout",
            (RejectionReason::Unavailable, Some(Error::CircuitOpen)) => "open",
            (RejectionReason::Unavailable, _) => "other",
            _ => "not unavailable",
        };
        record.lock().unwrap().push(kind.to_owned());
        let mut res = rej.default_response();
        *res.body_mut() = Bytes::from(kind);
        res
    }));
    assert_eq!(bounded_send(&app).await.body, "Backend");
    server.pause();
    for _ in 0..3 {
        let r = bounded_send(&app).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "timeout")
        );
    }
    // Open: no request waits for Redis any more. 20 requests that each
    // waited for the 300 ms timeout would take 6 s.
    let start = Instant::now();
    for _ in 0..20 {
        let r = bounded_send(&app).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "open")
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "an open circuit still waited: {:?}",
        start.elapsed()
    );
    assert_eq!(seen.lock().unwrap().len(), 23);
    server.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_keeps_flowing_while_redis_is_killed_and_restarted() {
    let mut server = RedisServer::start().unwrap();
    let app = app(RateLimitLayer::new(
        RateLimiter::builder(backend(&server).await, Algorithm::SlidingWindowCounter)
            .quota(Quota::per_hour(100_000))
            .name(unique("restart"))
            .circuit_breaker(3, Duration::from_millis(200))
            .build()
            .unwrap(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let traffic = {
        let (app, stop, log) = (app.clone(), Arc::clone(&stop), Arc::clone(&log));
        tokio::spawn(async move {
            // Bounded in count, and stops once told to.
            for _ in 0..20_000 {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let r = bounded_send(&app).await;
                assert_eq!(r.status, StatusCode::OK, "{r:?}");
                log.lock().unwrap().push(r.body);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let wait_for = |what: &'static str| {
        let log = Arc::clone(&log);
        async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let seen = {
                    let mut log = log.lock().unwrap();
                    let seen = log.iter().any(|s| s == what);
                    log.clear();
                    seen
                };
                if seen {
                    return;
                }
                assert!(Instant::now() < deadline, "traffic never saw {what}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for("Backend").await;
    tokio::task::block_in_place(|| server.stop());
    wait_for("FailOpen").await;
    tokio::task::block_in_place(|| server.restart()).unwrap();
    wait_for("Backend").await;
    stop.store(true, Ordering::Release);
    traffic.await.unwrap();
}
