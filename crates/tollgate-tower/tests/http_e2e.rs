//! End to end over loopback: a real `axum::serve` (with `ConnectInfo`) and a
//! real HTTP client (hyper-util), on the memory backend and on Redis.

mod common;

#[cfg(feature = "axum")]
use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
#[cfg(feature = "axum")]
use tollgate_core::{Algorithm, Quota, RateBackend, RateLimiter, RedisBackend};
#[cfg(feature = "axum")]
use tollgate_tower::key::PeerIp;
#[cfg(feature = "axum")]
use tollgate_tower::RateLimitLayer;

#[cfg(feature = "axum")]
use common::{suite::clock, unique};

#[cfg(feature = "axum")] // the peer comes from axum's `ConnectInfo`
async fn serve(backend: impl RateBackend, name: &str) -> SocketAddr {
    let app = Router::new().route("/", get(|| async { "hello" })).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::FixedWindow)
                .quota(Quota::per_hour(5))
                .name(name)
                .clock(clock())
                .build()
                .unwrap(),
        )
        .key(PeerIp::new()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// axum#2634 over the network: 30 concurrent requests from one client
/// against a limit of 5 admit exactly 5; the others are 429 with the
/// headers.
#[cfg(feature = "axum")] // the peer comes from axum's `ConnectInfo`
async fn limit_holds_over_the_network(backend: impl RateBackend) {
    let name = unique("e2e");
    let addr = serve(backend, &name).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let tasks: Vec<_> = (0..30)
        .map(|_| {
            let client = client.clone();
            let uri: http::Uri = format!("http://{addr}/").parse().unwrap();
            tokio::spawn(async move {
                let res = client.get(uri).await.unwrap();
                let (parts, body) = res.into_parts();
                let body = body.collect().await.unwrap().to_bytes();
                (parts, body)
            })
        })
        .collect();
    let (mut ok, mut limited) = (0, 0);
    for t in tasks {
        let (parts, body) = t.await.unwrap();
        let h = |n: &str| parts.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            h("ratelimit-policy").as_deref(),
            Some(format!(r#""{name}";q=5;w=3600"#).as_str())
        );
        match parts.status {
            StatusCode::OK => {
                ok += 1;
                assert_eq!(body, "hello");
            }
            StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                assert_eq!(h("retry-after").as_deref(), Some("3600"));
                assert_eq!(
                    h("ratelimit").as_deref(),
                    Some(format!(r#""{name}";r=0;t=3600"#).as_str())
                );
                assert_eq!(
                    h("content-type").as_deref(),
                    Some("application/problem+json")
                );
                let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(problem["detail"], "rate limit exceeded; retry in 3600 s");
                assert_eq!(problem["violated-policies"], serde_json::json!([name]));
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, limited), (5, 25));
}

#[cfg(feature = "axum")] // the peer comes from axum's `ConnectInfo`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_holds_over_the_network_on_memory() {
    limit_holds_over_the_network(tollgate_core::MemoryBackend::new()).await;
}

#[cfg(feature = "axum")] // the peer comes from axum's `ConnectInfo`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_holds_over_the_network_on_redis() {
    let server = common::shared_redis();
    limit_holds_over_the_network(RedisBackend::from_connection(
        server.connection_manager().await,
    ))
    .await;
}

/// `HoldUntil::BodyEnd` over a real connection: the lock is held while the
/// server streams the body and released once hyper has sent its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_until_the_body_ends_over_the_network() {
    use std::sync::Arc;
    use tokio::sync::Semaphore;
    use tollgate_core::{Locker, MemoryBackend};
    use tollgate_tower::lock::HoldUntil;
    use tollgate_tower::LockLayer;

    let gate = Arc::new(Semaphore::new(0));
    let stream_gate = Arc::clone(&gate);
    let app = Router::new()
        .route(
            "/stream",
            get(move || {
                let gate = Arc::clone(&stream_gate);
                async move {
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
                    axum::body::Body::from_stream(chunks)
                }
            }),
        )
        .route("/quick", get(|| async { "quick" }))
        .layer(
            LockLayer::new(
                Locker::new(MemoryBackend::new()),
                tollgate_tower::key::GlobalKey,
            )
            .hold_until(HoldUntil::BodyEnd),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = |p: &str| -> http::Uri { format!("http://{addr}{p}").parse().unwrap() };

    let res = client.get(uri("/stream")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first;");
    // Still streaming: the lock is held.
    let busy = client.get(uri("/quick")).await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    gate.add_permits(1);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last");
    // The end of the body was sent once the release was done.
    let free = client.get(uri("/quick")).await.unwrap();
    assert_eq!(free.status(), StatusCode::OK);
}
