//! Settling from the response (`RateLimitLayer::settle_from`): the request's
//! cost is the estimate the check reserves, the response's actual cost
//! corrects it before the response leaves, and the response's `RateLimit`
//! says what is left after settling — the same figure the store then gives
//! a check of cost 0. With `count_if`, a response that does not count is
//! given back whole and shows the figures after that refund. Every scenario
//! runs on memory, a standalone Redis and a 3-master cluster; time comes
//! from a `ManualClock` and stands still, so every figure is exact.

#[macro_use]
mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Extension, Router};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tollgate_core::{Algorithm, Decision, Quota, RateLimiter, Subject};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::rate_limit::{ActualCost, CostExtension, CostHeader};
use tollgate_tower::RateLimitLayer;
use tower::{service_fn, Layer};

use common::suite::{clock, Backend};
use common::{left, limiter};
use common::{send, unique, Reply};

/// The estimate: the request's `x-max-tokens`.
fn estimate(req: &Parts) -> u64 {
    req.headers["x-max-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A request of `key` reserving `max` and answered as using `used` (no
/// `x-use` header when `None`: the response says nothing).
fn chat(key: &str, max: u64, used: Option<u64>) -> Request<Body> {
    let mut req = Request::post("/chat")
        .header("x-api-key", key)
        .header("x-max-tokens", max);
    if let Some(used) = used {
        req = req.header("x-use", used);
    }
    req.body(Body::empty()).unwrap()
}

/// Answers with the request's `x-use` as `x-tokens-used`.
async fn answer(req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let mut res = Response::new(Body::empty());
    if let Some(used) = req.headers().get("x-use") {
        res.headers_mut().insert("x-tokens-used", used.clone());
    }
    Ok(res)
}

/// The `r=` of the reply's one `RateLimit` member.
fn r(reply: &Reply) -> u64 {
    let v = reply.expect_header("ratelimit");
    let r = v.split(';').find_map(|p| p.strip_prefix("r="));
    r.unwrap_or_else(|| panic!("no r= in {v:?}"))
        .parse()
        .unwrap()
}

/// 1000 tokens a minute on a token bucket: each response's `RateLimit` is
/// the budget less what the responses said, whatever was reserved; under,
/// at and over the estimate; a response that says nothing keeps its
/// estimate; a debt refuses the next request with the wait that pays it.
async fn headers_show_what_is_left_after_settling(backend: Backend) {
    let clock = clock();
    let tokens = limiter(&backend, Algorithm::TokenBucket, 1000, &clock);
    let svc = RateLimitLayer::new(tokens.clone())
        .key(HeaderKey::new("x-api-key").plain())
        .cost(estimate)
        .settle_from(CostHeader::new("x-tokens-used"))
        .quota_unit("tokens")
        .layer(service_fn(answer));
    let key = unique("key");
    let policy = format!(
        r#""{}";q=1000;qu="tokens";w=60"#,
        tokens.keyspace().policy()
    );
    let mut expected = 1000;
    for (max, used) in [
        (300, Some(120)),
        (500, Some(500)),
        (200, Some(0)),
        (100, None),
        (10, Some(1)),
    ] {
        let res = send(&svc, chat(&key, max, used)).await;
        assert_eq!(res.status, StatusCode::OK, "{res:?}");
        assert_eq!(res.expect_header("ratelimit-policy"), policy);
        expected -= used.unwrap_or(max);
        assert_eq!(r(&res), expected, "{max} reserved, {used:?} used: {res:?}");
        assert_eq!(left(&tokens, &key).await, expected);
    }
    // 279 left: 50 reserved, 300 used. 21 owed: r=0, and the next request
    // waits for the debt and its own token (22 at 60 ms each).
    assert_eq!(expected, 279);
    let res = send(&svc, chat(&key, 50, Some(300))).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(r(&res), 0, "{res:?}");
    let res = send(&svc, chat(&key, 1, Some(1))).await;
    assert_eq!(res.status, StatusCode::TOO_MANY_REQUESTS, "{res:?}");
    assert_eq!(res.retry_after(), 2, "{res:?}");
    clock.advance(Duration::from_millis(22 * 60));
    let res = send(&svc, chat(&key, 1, Some(1))).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(r(&res), 0, "{res:?}");
}

/// On every algorithm: 5 reserved, 2 used, and both the header and the
/// store say 8 of 10 are left; another request that uses 0 leaves 8.
async fn every_algorithm_settles_under_the_estimate(backend: Backend) {
    let clock = clock();
    for alg in Algorithm::ALL {
        let limiter = limiter(&backend, alg, 10, &clock);
        let svc = RateLimitLayer::new(limiter.clone())
            .key(HeaderKey::new("x-api-key").plain())
            .cost(estimate)
            .settle_from(CostHeader::new("x-tokens-used"))
            .layer(service_fn(answer));
        let key = unique("key");
        for used in [2, 0] {
            let res = send(&svc, chat(&key, 5, Some(used))).await;
            assert_eq!(res.status, StatusCode::OK, "{alg:?}: {res:?}");
            assert_eq!(r(&res), 8, "{alg:?}: {res:?}");
            assert_eq!(left(&limiter, &key).await, 8, "{alg:?}");
        }
    }
}

/// With `count_if`, a response that does not count is given back whole
/// whatever cost it says, and its header shows the figures after that
/// refund; one that counts is settled to its cost.
async fn a_response_that_does_not_count_is_given_back_whole(backend: Backend) {
    let clock = clock();
    let limiter = limiter(&backend, Algorithm::Gcra, 100, &clock);
    let app = Router::new()
        .route(
            "/chat",
            post(|req: Request<Body>| async move {
                let status = if req.headers().contains_key("x-fail") {
                    StatusCode::BAD_GATEWAY
                } else {
                    StatusCode::OK
                };
                let mut res = status.into_response();
                res.extensions_mut().insert(ActualCost(7));
                res
            }),
        )
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key").plain())
                .cost(estimate)
                .count_if(|s: StatusCode| !s.is_server_error())
                .settle_from(CostExtension),
        );
    let key = unique("key");
    let mut failing = chat(&key, 30, None);
    failing.headers_mut().insert("x-fail", "1".parse().unwrap());
    let res = send(&app, failing).await;
    assert_eq!(res.status, StatusCode::BAD_GATEWAY, "{res:?}");
    assert_eq!(r(&res), 100, "{res:?}");
    assert_eq!(left(&limiter, &key).await, 100);
    let res = send(&app, chat(&key, 30, None)).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(r(&res), 93, "{res:?}");
    assert_eq!(left(&limiter, &key).await, 93);
}

/// A handler that settles its charge itself leaves nothing for the layer:
/// a charge is settled once, and the header shows the handler's figure.
async fn a_charge_is_settled_once(backend: Backend) {
    let clock = clock();
    let limiter = limiter(&backend, Algorithm::TokenBucket, 100, &clock);
    let own = limiter.clone();
    let app = Router::new()
        .route(
            "/chat",
            post(
                move |Extension(d): Extension<Decision>, req: Request<Body>| {
                    let own = own.clone();
                    async move {
                        let key = req.headers()["x-api-key"].to_str().unwrap().to_owned();
                        let charge = d.charge.expect("admitted with a charge");
                        let settled = own.settle(Subject::new(key), &charge, 10).await.unwrap();
                        assert!(settled.applied);
                        // Then it reports another cost: too late.
                        ([("x-tokens-used", "50")], "")
                    }
                },
            ),
        )
        .layer(
            RateLimitLayer::new(limiter.clone())
                .key(HeaderKey::new("x-api-key").plain())
                .cost(estimate)
                .settle_from(CostHeader::new("x-tokens-used")),
        );
    let key = unique("key");
    let res = send(&app, chat(&key, 30, None)).await;
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(r(&res), 90, "{res:?}");
    assert_eq!(left(&limiter, &key).await, 90);
}

/// Shadow mode settles what it admitted, and lets a refused request through
/// with the check's figures and nothing to settle.
async fn shadow_mode_settles_what_it_admitted(backend: Backend) {
    let clock = clock();
    let limiter = limiter(&backend, Algorithm::TokenBucket, 100, &clock);
    let svc = RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key").plain())
        .cost(estimate)
        .settle_from(CostHeader::new("x-tokens-used"))
        .shadow(true)
        .layer(service_fn(answer));
    let key = unique("key");
    let res = send(&svc, chat(&key, 90, Some(60))).await;
    assert_eq!((res.status, r(&res)), (StatusCode::OK, 40), "{res:?}");
    // 50 reserved of 40 left: would be refused, goes through, takes nothing.
    let res = send(&svc, chat(&key, 50, Some(10))).await;
    assert_eq!((res.status, r(&res)), (StatusCode::OK, 40), "{res:?}");
    assert_eq!(left(&limiter, &key).await, 40);
}

/// An estimate of 0 (the work's size unknown until it is done) is not a
/// free pass: every algorithm charges what the response reports.
async fn an_estimate_of_zero_is_settled_too(backend: Backend) {
    let clock = clock();
    for alg in Algorithm::ALL {
        let limiter = limiter(&backend, alg, 100, &clock);
        let svc = RateLimitLayer::new(limiter.clone())
            .key(HeaderKey::new("x-api-key").plain())
            .cost(|_: &Parts| 0)
            .settle_from(CostHeader::new("x-tokens-used"))
            .layer(service_fn(answer));
        let key = unique("key");
        for left_after in [70, 40] {
            let res = send(&svc, chat(&key, 0, Some(30))).await;
            assert_eq!(res.status, StatusCode::OK, "{alg:?}: {res:?}");
            assert_eq!(r(&res), left_after, "{alg:?}: {res:?}");
            assert_eq!(left(&limiter, &key).await, left_after, "{alg:?}");
        }
    }
}

on_every_backend!(memory, redis, cluster; [
    an_estimate_of_zero_is_settled_too,
    headers_show_what_is_left_after_settling,
    every_algorithm_settles_under_the_estimate,
    a_response_that_does_not_count_is_given_back_whole,
    a_charge_is_settled_once,
    shadow_mode_settles_what_it_admitted,
]);

/// Redis dies while the handler runs: the settle cannot be made, and the
/// response still goes out, with the headers of the check (no hang, no
/// panic; bounded here at 30 s, far above the limiter's 200 ms timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_settle_keeps_the_response_and_its_headers() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let conn = server.connection_manager().await;
    let server = Arc::new(std::sync::Mutex::new(server));
    let backend: Backend = Arc::new(tollgate_core::RedisBackend::from_connection(conn));
    let limiter = RateLimiter::builder(backend, Algorithm::TokenBucket)
        .quota(Quota::per_minute(100))
        .name(unique("dies"))
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let stop = Arc::clone(&server);
    let app = Router::new()
        .route(
            "/chat",
            post(move || async move {
                stop.lock().unwrap().stop();
                ([("x-tokens-used", "1")], "answered")
            }),
        )
        .layer(
            RateLimitLayer::new(limiter)
                .cost(estimate)
                .settle_from(CostHeader::new("x-tokens-used")),
        );
    let res = tokio::time::timeout(Duration::from_secs(30), send(&app, chat("k", 40, None)))
        .await
        .expect("the response comes although the settle cannot be made");
    assert_eq!(res.status, StatusCode::OK, "{res:?}");
    assert_eq!(res.body, "answered");
    // The check's figures: 40 reserved of 100 (the refill since is < 1).
    assert_eq!(r(&res), 60, "{res:?}");
}
