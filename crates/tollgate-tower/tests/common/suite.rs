//! The behaviour suite every backend runs (memory, standalone Redis, Redis
//! Cluster). Time comes from a `ManualClock`, so every figure is exact and
//! nothing depends on the machine's speed.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get as route_get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tollgate_core::{Algorithm, Decision, ManualClock, Quota, RateBackend, RateLimiter};
#[cfg(feature = "axum")]
use tollgate_tower::key::{ClientIp, RouteKey};
use tollgate_tower::key::{GlobalKey, HeaderKey};
use tollgate_tower::rejection::Rejection;
use tollgate_tower::RateLimitLayer;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[cfg(feature = "axum")]
use super::get_from;
use super::{get, problem_detail, send, unique};

pub type Backend = Arc<dyn RateBackend>;

/// An instant on an hour boundary, so fixed windows start fresh.
pub const T0_MICROS: u64 = 472_222 * 3_600 * 1_000_000;

pub fn clock() -> ManualClock {
    ManualClock::new(T0_MICROS)
}

async fn ok() -> &'static str {
    "ok"
}

async fn echo(decision: Option<Extension<Decision>>) -> String {
    match decision {
        Some(Extension(d)) => format!("{:?} remaining={}", d.source, d.remaining),
        None => "unlimited".to_owned(),
    }
}

/// Exact draft-10 headers; Retry-After in whole seconds, rounded up, never 0.
pub async fn headers_exact(backend: Backend) {
    let clock = clock();
    let name = unique("hdr");
    let app = Router::new()
        .route("/", route_get(ok))
        .layer(RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::TokenBucket)
                .quota(Quota::per_minute(2))
                .name(&name)
                .clock(clock.clone())
                .build()
                .unwrap(),
        ));
    let policy = format!(r#""{name}";q=2;w=60"#);

    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "ok");
    assert_eq!(r.header("ratelimit-policy"), Some(policy.as_str()));
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{name}";r=1;t=30"#).as_str())
    );
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.header("x-ratelimit-limit"), None);

    // Drained: t is when the next unit comes (30 s), not when the bucket
    // is full again (60 s) — draft-10's "until additional quota".
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{name}";r=0;t=30"#).as_str())
    );

    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("30"));
    assert_eq!(r.header("ratelimit-policy"), Some(policy.as_str()));
    // Retry-After never points earlier than t: both 30.
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{name}";r=0;t=30"#).as_str())
    );
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        problem["type"],
        tollgate_tower::rejection::QUOTA_EXCEEDED,
        "{problem}"
    );
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["detail"], "rate limit exceeded; retry in 30 s");
    assert_eq!(problem["violated-policies"], serde_json::json!([name]));

    // 29.5 s left: rounded up to 30.
    clock.advance(Duration::from_millis(500));
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("30"));
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{name}";r=0;t=30"#).as_str())
    );

    // 1 µs left: 1, never 0.
    clock.advance(Duration::from_micros(29_499_999));
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));

    clock.advance(Duration::from_micros(1));
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

/// Legacy `X-RateLimit-*` on request, and headers off on request.
pub async fn legacy_headers_and_headers_off(backend: Backend) {
    let clock = clock();
    let app = Router::new().route("/", route_get(ok)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend.clone(), Algorithm::FixedWindow)
                .quota(Quota::per_minute(3))
                .name(unique("legacy"))
                .clock(clock.clone())
                .build()
                .unwrap(),
        )
        .legacy_headers(true),
    );
    let r = send(&app, get("/")).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("60"));
    assert!(r.header("ratelimit").is_some());

    let app = Router::new().route("/", route_get(ok)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::FixedWindow)
                .quota(Quota::per_minute(1))
                .name(unique("off"))
                .clock(clock.clone())
                .build()
                .unwrap(),
        )
        .headers(false),
    );
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.header("ratelimit-policy"), None);
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("60"));
    assert_eq!(r.header("ratelimit"), None);
}

/// Two quotas in one check: the strictest decides, both are reported.
pub async fn multi_quota(backend: Backend) {
    let clock = clock();
    let name = unique("multi");
    let app = Router::new()
        .route("/", route_get(ok))
        .layer(RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::FixedWindow)
                .quota(Quota::per_minute(3))
                .quota(Quota::per_hour(5))
                .name(&name)
                .clock(clock.clone())
                .build()
                .unwrap(),
        ));
    let items = |a: u64, ta: u64, b: u64, tb: u64| {
        format!(r#""{name}-q0";r={a};t={ta}, "{name}-q1";r={b};t={tb}"#)
    };
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(format!(r#""{name}-q0";q=3;w=60, "{name}-q1";q=5;w=3600"#).as_str())
    );
    assert_eq!(r.header("ratelimit"), Some(items(2, 60, 4, 3600).as_str()));
    send(&app, get("/")).await;
    let r = send(&app, get("/")).await;
    assert_eq!(r.header("ratelimit"), Some(items(0, 60, 2, 3600).as_str()));

    // The minute quota refuses; the refusal takes nothing from the hour.
    clock.advance(Duration::from_secs(10));
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("50"));
    assert_eq!(r.header("ratelimit"), Some(items(0, 50, 2, 3590).as_str()));

    clock.advance(Duration::from_secs(50));
    assert_eq!(send(&app, get("/")).await.status, StatusCode::OK);
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), Some(items(1, 60, 0, 3540).as_str()));

    // Now the hour quota is the strictest.
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("3540"));
}

/// A per-request cost from a closure; a denied request takes nothing; a cost
/// that can never fit is 413 without Retry-After.
pub async fn cost_closure(backend: Backend) {
    let clock = clock();
    let name = unique("cost");
    let app = Router::new().route("/", route_get(ok)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::FixedWindow)
                .quota(Quota::per_hour(10))
                .name(&name)
                .clock(clock)
                .build()
                .unwrap(),
        )
        .cost(|req: &http::request::Parts| {
            req.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        }),
    );
    let with_cost = |c: u64| {
        Request::get("/")
            .header("x-cost", c.to_string())
            .body(Body::empty())
            .unwrap()
    };
    let r = send(&app, with_cost(4)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{name}";r=6;t=3600"#).as_str())
    );
    let r = send(&app, with_cost(7)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{name}";r=6;t=3600"#).as_str())
    );
    let r = send(&app, with_cost(6)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit"),
        Some(format!(r#""{name}";r=0;t=3600"#).as_str())
    );

    let r = send(&app, with_cost(11)).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(format!(r#""{name}";q=10;w=3600"#).as_str())
    );
    assert_eq!(
        problem_detail(&r),
        "request cost 11 exceeds the rate limit's capacity 10; it can never be admitted"
    );
}

/// tokio-rs/axum#2634: tower's RateLimit is per clone, so under axum it
/// limits nothing. Here N concurrent requests through one Router with a
/// limit of 5 admit exactly 5.
pub async fn shared_across_clones(backend: Backend) {
    let app = Router::new()
        .route("/", route_get(ok))
        .layer(RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::FixedWindow)
                .quota(Quota::per_hour(5))
                .name(unique("2634"))
                .clock(clock())
                .build()
                .unwrap(),
        ));
    let tasks: Vec<_> = (0..40)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(get("/")).await.unwrap().status() })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(admitted, 5);
}

/// Shadow mode decides and reports but never refuses.
pub async fn shadow_mode(backend: Backend) {
    let name = unique("shadow");
    let app = Router::new().route("/", route_get(echo)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&name)
                .clock(clock())
                .build()
                .unwrap(),
        )
        .shadow(true),
    );
    for i in 0..5 {
        let r = send(&app, get("/")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("retry-after"), None);
        assert!(r.header("ratelimit").unwrap().contains(";r=0;"), "{r:?}");
        assert!(
            r.body.starts_with("Backend") || r.body.starts_with("DenyCache"),
            "{}",
            r.body
        );
        if i == 0 {
            assert_eq!(r.body, "Backend remaining=0");
        }
    }
    // Key errors are not refused either.
    let app = Router::new().route("/", route_get(echo)).layer(
        RateLimitLayer::gcra(
            Arc::new(tollgate_core::MemoryBackend::new()),
            Quota::per_hour(1),
        )
        .key(HeaderKey::new("x-api-key"))
        .shadow(true),
    );
    assert_eq!(send(&app, get("/")).await.status, StatusCode::OK);
}

/// `route_layer`: only matched routes are limited, per route with RouteKey.
// Keys by axum's `MatchedPath` / `ConnectInfo`: the crate's `axum` feature.
#[cfg(feature = "axum")]
pub async fn route_layer_per_route(backend: Backend) {
    let name = unique("route");
    let app = Router::new()
        .route("/a/{id}", route_get(ok))
        .route("/b", route_get(ok))
        .route_layer(
            RateLimitLayer::new(
                RateLimiter::builder(backend, Algorithm::FixedWindow)
                    .quota(Quota::per_hour(1))
                    .name(&name)
                    .clock(clock())
                    .build()
                    .unwrap(),
            )
            .key(RouteKey::new()),
        );
    assert_eq!(send(&app, get("/a/1")).await.status, StatusCode::OK);
    // Same matched route `/a/{id}`, other id: same key.
    assert_eq!(
        send(&app, get("/a/2")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, get("/b")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, get("/b")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Unmatched requests never reach a route layer.
    assert_eq!(send(&app, get("/nope")).await.status, StatusCode::NOT_FOUND);
    assert_eq!(send(&app, get("/nope")).await.status, StatusCode::NOT_FOUND);
}

/// `tower::ServiceBuilder` around a plain service; the inner error type
/// passes through unchanged.
pub async fn service_builder(backend: Backend) {
    #[derive(Debug, PartialEq)]
    struct MyError;
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::SlidingWindowLog)
                .quota(Quota::per_hour(2))
                .name(unique("sb"))
                .clock(clock())
                .build()
                .unwrap(),
        ))
        .service(service_fn(|req: Request<Body>| async move {
            if req.uri().path() == "/fail" {
                Err(MyError)
            } else {
                Ok(Response::new(http_body_util::Full::new(Bytes::from(
                    "inner",
                ))))
            }
        }));
    let res = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let err = svc.clone().oneshot(get("/fail")).await.unwrap_err();
    assert_eq!(err, MyError);
    let res = svc.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A key extractor's "not limited" and its errors.
pub async fn key_outcomes(backend: Backend) {
    let app = Router::new().route("/", route_get(echo)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend.clone(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(unique("keys"))
                .clock(clock())
                .build()
                .unwrap(),
        )
        .key(HeaderKey::new("x-api-key")),
    );
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(problem_detail(&r), "missing x-api-key header");
    let with_key = |k: &str| {
        Request::get("/")
            .header("x-api-key", k)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, with_key("a")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, with_key("a")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, with_key("b")).await.status, StatusCode::OK);

    // Optional: requests without the header are not limited (and carry no headers).
    let app = Router::new().route("/", route_get(echo)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(unique("keys-opt"))
                .clock(clock())
                .build()
                .unwrap(),
        )
        .key(HeaderKey::new("x-api-key").optional()),
    );
    for _ in 0..3 {
        let r = send(&app, get("/")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "unlimited");
        assert_eq!(r.header("ratelimit"), None);
    }
}

/// A custom responder replaces the default rejection.
pub async fn custom_responder(backend: Backend) {
    let app = Router::new().route("/", route_get(ok)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(unique("resp"))
                .clock(clock())
                .build()
                .unwrap(),
        )
        .responder(|rej: &Rejection, head: &http::request::Parts| {
            let mut res = Response::new(Bytes::from_static(b"{\"error\":\"slow down\"}"));
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            if let Some(d) = rej.decision() {
                res.headers_mut().insert(
                    "x-wait-ms",
                    d.retry_after
                        .unwrap()
                        .as_millis()
                        .to_string()
                        .parse()
                        .unwrap(),
                );
            }
            res.headers_mut()
                .insert("x-path", head.uri.path().parse().unwrap());
            res
        }),
    );
    send(&app, get("/")).await;
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.body, "{\"error\":\"slow down\"}");
    assert_eq!(r.header("x-wait-ms"), Some("3600000"));
    assert_eq!(r.header("x-path"), Some("/"));
    assert_eq!(r.header("retry-after"), None);
}

/// A client that is not behind a trusted proxy cannot choose its key by
/// sending X-Forwarded-For.
// Keys by axum's `MatchedPath` / `ConnectInfo`: the crate's `axum` feature.
#[cfg(feature = "axum")]
pub async fn trusted_proxy_spoofing(backend: Backend) {
    let app = Router::new().route("/", route_get(ok)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(unique("xff"))
                .clock(clock())
                .build()
                .unwrap(),
        )
        .key(ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap()),
    );
    let spoof = |fake: &str| {
        let mut req = get_from("/", "203.0.113.5:40000");
        req.headers_mut()
            .insert("x-forwarded-for", fake.parse().unwrap());
        req
    };
    assert_eq!(send(&app, spoof("1.1.1.1")).await.status, StatusCode::OK);
    // A fresh fake address each time: still the same key (the peer's).
    assert_eq!(
        send(&app, spoof("2.2.2.2")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, spoof("3.3.3.3")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Through the trusted proxy, each client has its own key...
    let via_proxy = |xff: &str| {
        let mut req = get_from("/", "10.0.0.2:5000");
        req.headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
        req
    };
    assert_eq!(
        send(&app, via_proxy("198.51.100.1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, via_proxy("198.51.100.2")).await.status,
        StatusCode::OK
    );
    // ...and a client behind it cannot escape by prepending fakes.
    assert_eq!(
        send(&app, via_proxy("9.9.9.9, 198.51.100.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The spoofer's address, forwarded by the proxy, is the same key as before.
    assert_eq!(
        send(&app, via_proxy("203.0.113.5")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// IPv6 clients are grouped by /64: rotating through a /64 does not help.
// Keys by axum's `MatchedPath` / `ConnectInfo`: the crate's `axum` feature.
#[cfg(feature = "axum")]
pub async fn ipv6_grouping(backend: Backend) {
    let app = Router::new().route("/", route_get(ok)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(unique("v6"))
                .clock(clock())
                .build()
                .unwrap(),
        )
        .key(tollgate_tower::key::PeerIp::new()),
    );
    let from = |ip: &str| get_from("/", &format!("[{ip}]:443"));
    assert_eq!(
        send(&app, from("2001:db8:1:2::1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, from("2001:db8:1:2:dead:beef:0:1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, from("2001:db8:1:3::1")).await.status,
        StatusCode::OK
    );
}

/// The decision reaches the handler through the request extensions.
pub async fn decision_in_extensions(backend: Backend) {
    let app = Router::new().route("/", route_get(echo)).layer(
        RateLimitLayer::new(
            RateLimiter::builder(backend, Algorithm::SlidingWindowCounter)
                .quota(Quota::per_hour(3))
                .name(unique("ext"))
                .clock(clock())
                .build()
                .unwrap(),
        )
        .key(GlobalKey),
    );
    assert_eq!(send(&app, get("/")).await.body, "Backend remaining=2");
    assert_eq!(send(&app, get("/")).await.body, "Backend remaining=1");
}

/// Generates one `#[tokio::test]` per suite function for a backend.
#[macro_export]
macro_rules! backend_suite {
    ($backend:path) => {
        $crate::backend_suite!(@tests $backend;
            headers_exact, legacy_headers_and_headers_off, multi_quota, cost_closure,
            shadow_mode, service_builder, key_outcomes, custom_responder,
            decision_in_extensions);
        #[cfg(feature = "axum")]
        mod by_peer {
            use super::*;
            $crate::backend_suite!(@tests $backend;
                route_layer_per_route, trusted_proxy_spoofing, ipv6_grouping);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shared_across_clones() {
            common::suite::shared_across_clones($backend().await).await;
        }
    };
    (@tests $backend:path; $($name:ident),+) => {
        $(
            #[tokio::test]
            async fn $name() {
                common::suite::$name($backend().await).await;
            }
        )+
    };
}
