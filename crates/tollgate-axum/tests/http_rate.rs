//! The rate-limit extractors through a real `axum::serve` on a loopback port
//! and a real HTTP client, against the memory backend and a standalone Redis
//! (the app is `common/`'s; locks are in `http.rs`).

mod common;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use tollgate_core::{FailurePolicy, Quota, RateLimiter, RedisBackend};
use tollgate_testkit::http::loopback::send;
use tollgate_testkit::http::retry_after;
use tollgate_testkit::RedisServer;
use tollgate_tower::RateLimitLayer;

use common::{memory_limiter, memory_locker, problem_detail, serve};

/// `RateLimited<P>`: admitted with headers, then 429 with `Retry-After`,
/// the draft-10 headers and a text body; a missing key is 400.
async fn handler_rate_limit(limiter: RateLimiter) {
    let srv = serve(memory_locker(), limiter).await;
    let user = [("x-user", "ann")];
    let r = send(srv.addr, Method::GET, "/limited", &user).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "left 1");
    let policy = r.headers["ratelimit-policy"].to_str().unwrap().to_owned();
    assert!(policy.ends_with(";q=2;w=60"), "{policy}");
    assert!(
        r.headers["ratelimit"].to_str().unwrap().contains(";r=1;t="),
        "{:?}",
        r.headers["ratelimit"]
    );
    let r = send(srv.addr, Method::GET, "/limited", &user).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "left 0");

    let r = send(srv.addr, Method::GET, "/limited", &user).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let ra = retry_after(&r);
    assert!((1..=30).contains(&ra), "Retry-After {ra}");
    assert_eq!(r.headers["content-type"], "application/problem+json");
    let name = policy.split(';').next().unwrap();
    assert_eq!(
        r.body,
        format!(
            concat!(
                r#"{{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
                r#""title":"Request cannot be satisfied as assigned quota has been exceeded","#,
                r#""status":429,"detail":"rate limit exceeded; retry in {ra} s","#,
                r#""violated-policies":[{name}]}}"#
            ),
            ra = ra,
            name = name
        )
    );
    assert_eq!(r.headers["ratelimit-policy"].to_str().unwrap(), policy);
    assert!(r.headers["ratelimit"].to_str().unwrap().contains(";r=0;t="));

    // Another key has its own budget.
    let r = send(srv.addr, Method::GET, "/limited", &[("x-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::OK);
    // No key: 400.
    let r = send(srv.addr, Method::GET, "/limited", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(problem_detail(&r), "missing x-user header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_handler_rate_limit() {
    handler_rate_limit(memory_limiter()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_handler_rate_limit() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    handler_rate_limit(RateLimiter::token_bucket(backend, Quota::per_minute(2)).unwrap()).await;
}

/// Under `FailurePolicy::Deny`, a dead backend is a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_handler_rate_limit_deny_policy_is_503() {
    let mut server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let limiter = RateLimiter::builder(backend, tollgate_core::Algorithm::TokenBucket)
        .quota(Quota::per_minute(2))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let srv = serve(memory_locker(), limiter).await;
    server.stop();
    let r = send(srv.addr, Method::GET, "/limited", &[("x-user", "ann")]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
}

/// A cost the limit can never admit is 413, answered as a `RateLimitLayer`
/// answers it (status, body, `RateLimit-Policy`, no `Retry-After`), and
/// spends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_beyond_capacity_is_413_like_the_layer() {
    use tower::ServiceExt;

    let limiter = memory_limiter();
    let srv = serve(memory_locker(), limiter.clone()).await;
    let r = send(
        srv.addr,
        Method::GET,
        "/bulk",
        &[("x-user", "ann"), ("x-cost", "5")],
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert_eq!(
        problem_detail(&r),
        "request cost 5 exceeds the rate limit's capacity 2; it can never be admitted"
    );
    assert!(!r.headers.contains_key("retry-after"));
    assert!(!r.headers.contains_key("ratelimit"));
    // Nothing was spent.
    let ok = send(
        srv.addr,
        Method::GET,
        "/bulk",
        &[("x-user", "ann"), ("x-cost", "2")],
    )
    .await;
    assert_eq!((ok.status, ok.body.as_str()), (StatusCode::OK, "left 0"));

    // The layer over the same limiter answers the same.
    let layered = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter).cost(5));
    let res = layered
        .oneshot(Request::get("/").body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), r.status);
    for name in ["content-type", "ratelimit-policy"] {
        assert_eq!(res.headers().get(name), r.headers.get(name), "{name}");
    }
    assert!(r.headers.contains_key("ratelimit-policy"));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, r.body.as_bytes());
}

/// `RateLimitStatus` reads what the layer decided; without the layer it is
/// a 500 naming the layer, and `Option<RateLimitStatus>` is `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_decision_is_readable() {
    let srv = serve(memory_locker(), memory_limiter()).await;
    let r = send(srv.addr, Method::GET, "/status", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "remaining 2");
    assert_eq!(r.headers["ratelimit"], r#""layered";r=2;t=20"#);
    let r = send(srv.addr, Method::GET, "/status", &[]).await;
    assert_eq!(r.body, "remaining 1");

    let r = send(srv.addr, Method::GET, "/unlayered", &[]).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    let detail = problem_detail(&r);
    assert!(detail.contains("RateLimitLayer"), "{detail}");
    // A gRPC request gets the same refusal shaped for gRPC (INTERNAL, in
    // a trailers-only response), as every other extractor answers.
    let r = send(
        srv.addr,
        Method::GET,
        "/unlayered",
        &[("content-type", "application/grpc")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["grpc-status"], "13");
    let r = send(srv.addr, Method::GET, "/maybe", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "None");
}
