//! gRPC: a real tonic server (grpc.health.v1 from tonic-health, no protoc)
//! behind `Server::builder().layer(..)`, called by a real tonic client over
//! loopback. Denials are trailers-only responses with grpc-status 8, never an
//! HTTP 429.

mod common;

use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Quota, RateBackend, RateLimiter, RedisBackend};
use tollgate_testkit::RedisServer;
use tollgate_tower::key::PeerIp;
use tollgate_tower::RateLimitLayer;
use tonic::Code;

use common::grpc::{check, client, retry_after, serve};
use common::unique;

/// `google.rpc.Status.details[0]` is a `google.rpc.RetryInfo`.
fn has_retry_info(details: &[u8]) -> bool {
    details
        .windows(40)
        .any(|w| w == b"type.googleapis.com/google.rpc.RetryInfo")
}

async fn denial_is_resource_exhausted(backend: impl RateBackend) {
    let name = unique("grpc");
    let addr = serve(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::Gcra)
                .quota(Quota::per_hour(2))
                .name(&name)
                .build()
                .unwrap(),
        )
        .key(PeerIp::new()),
    )
    .await;
    let mut client = client(addr).await;
    for remaining in [1, 0] {
        let res = client.check(check()).await.expect("admitted");
        let md = res.metadata();
        assert_eq!(
            md.get("ratelimit-policy").unwrap().to_str().unwrap(),
            format!(r#""{name}";q=2;w=3600"#)
        );
        let rl = md.get("ratelimit").unwrap().to_str().unwrap();
        assert!(
            rl.starts_with(&format!(r#""{name}";r={remaining};t="#)),
            "{rl}"
        );
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("rate limit exceeded; retry in "),
        "{status:?}"
    );
    let retry = retry_after(&status);
    let md = status.metadata();
    assert!((1..=1800).contains(&retry), "{retry}");
    assert!(md
        .get("ratelimit")
        .unwrap()
        .to_str()
        .unwrap()
        .contains(";r=0;"));
    assert!(md.get("ratelimit-policy").is_some());
    assert!(has_retry_info(status.details()), "{:?}", status.details());
}

#[tokio::test]
async fn denial_is_resource_exhausted_on_memory() {
    denial_is_resource_exhausted(tollgate_core::MemoryBackend::new()).await;
}

#[tokio::test]
async fn denial_is_resource_exhausted_on_redis() {
    let server = common::shared_redis();
    denial_is_resource_exhausted(RedisBackend::from_connection(
        server.connection_manager().await,
    ))
    .await;
}

#[tokio::test]
async fn denial_is_resource_exhausted_on_cluster() {
    let cluster = common::shared_cluster();
    denial_is_resource_exhausted(RedisBackend::from_connection(cluster.connection().await)).await;
}

#[tokio::test]
async fn a_cost_that_never_fits_is_resource_exhausted_without_retry_info() {
    let addr = serve(
        RateLimitLayer::gcra(tollgate_core::MemoryBackend::new(), Quota::per_hour(2)).cost(5),
    )
    .await;
    let status = client(addr).await.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("can never be admitted"),
        "{status:?}"
    );
    assert!(status.metadata().get("retry-after").is_none());
    assert!(status.details().is_empty());
}

#[tokio::test]
async fn redis_down_under_deny_is_unavailable() {
    let mut server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let addr = serve(RateLimitLayer::new(
        RateLimiter::builder(backend, Algorithm::FixedWindow)
            .quota(Quota::per_hour(100))
            .name(unique("grpc-deny"))
            .failure_policy(FailurePolicy::Deny)
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    ))
    .await;
    let mut client = client(addr).await;
    client
        .check(check())
        .await
        .expect("admitted while Redis is up");
    server.stop();
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "rate limiter unavailable");
}

#[tokio::test]
async fn key_errors_map_to_grpc_codes() {
    let addr = serve(
        RateLimitLayer::gcra(tollgate_core::MemoryBackend::new(), Quota::per_hour(2))
            .key(tollgate_tower::key::HeaderKey::new("x-api-key")),
    )
    .await;
    let status = client(addr).await.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert_eq!(status.message(), "missing x-api-key header");
}

#[tokio::test]
async fn a_busy_lock_is_aborted_with_retry_information() {
    let locker = tollgate_core::Locker::new(tollgate_core::MemoryBackend::new());
    let addr = serve(tollgate_tower::LockLayer::new(
        locker.clone(),
        tollgate_tower::key::GlobalKey,
    ))
    .await;
    let mut client = client(addr).await;
    client.check(check()).await.expect("free lock: admitted");
    let held = locker
        .try_acquire("global", &tollgate_core::LockOptions::new())
        .await
        .unwrap();
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(
        status.message().starts_with("resource is busy"),
        "{status:?}"
    );
    let retry = retry_after(&status);
    assert!((1..=30).contains(&retry));
    assert!(has_retry_info(status.details()));
    held.release().await.unwrap();
    client.check(check()).await.expect("released: admitted");
}

/// On the wire: a gRPC denial is HTTP 200 with `grpc-status` in the headers
/// and no body (trailers-only), never a 429.
#[tokio::test]
async fn a_grpc_denial_is_trailers_only_http_200() {
    use tower::ServiceExt;
    let app = axum::Router::new()
        .route(
            "/grpc.health.v1.Health/Check",
            axum::routing::post(|| async { "" }),
        )
        .layer(RateLimitLayer::gcra(
            tollgate_core::MemoryBackend::new(),
            Quota::per_hour(1),
        ));
    let req = || {
        http::Request::post("/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    app.clone().oneshot(req()).await.unwrap();
    let res = app.oneshot(req()).await.unwrap();
    let h = common::grpc::assert_trailers_only(res, "8").await;
    assert_eq!(h["retry-after"], "3600");
    assert!(h["grpc-message"]
        .to_str()
        .unwrap()
        .starts_with("rate limit exceeded"));
    assert!(h.contains_key("grpc-status-details-bin"));
}
