//! A limiter with quota leases behind the layer: requests answered from a
//! slice are settled from the response and given back by `count_if` like
//! any other (the store ends up charged exactly what the responses said).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use tollgate_core::{
    Algorithm, ManualClock, MemoryBackend, Quota, QuotaLeases, RateLimiter, RateLimiterBuilder,
};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::rate_limit::CostHeader;
use tollgate_tower::RateLimitLayer;
use tower::{service_fn, Layer, ServiceExt};

const CAP: u64 = 100_000;

/// A limiter with leases that stay (hot after 5 checks) and a peer of the
/// same policy without them, on one memory store.
fn pair() -> (RateLimiter, RateLimiter) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryBackend::with_clock(clock.clone());
    let build = |b: RateLimiterBuilder| {
        b.quota(Quota::per_hour(CAP))
            .name("tower-leases")
            .clock(clock.clone())
    };
    let leases = QuotaLeases::default()
        .hot_checks(5)
        .target(Duration::from_secs(60))
        .max_age(Duration::from_secs(60));
    let leased = build(RateLimiter::builder(store.clone(), Algorithm::FixedWindow))
        .quota_leases(leases)
        .build()
        .unwrap();
    let peer = build(RateLimiter::builder(store, Algorithm::FixedWindow))
        .build()
        .unwrap();
    (leased, peer)
}

/// Answers with the request's `x-use` as `x-tokens-used`, and 500 when
/// `x-fail` is set.
async fn answer(req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let mut res = Response::new(Body::empty());
    if let Some(used) = req.headers().get("x-use") {
        res.headers_mut().insert("x-tokens-used", used.clone());
    }
    if req.headers().contains_key("x-fail") {
        *res.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    }
    Ok(res)
}

fn request(extra: (&str, &str)) -> Request<Body> {
    Request::post("/")
        .header("x-api-key", "hot")
        .header(extra.0, extra.1)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn served_requests_are_settled_from_the_response() {
    let (limiter, peer) = pair();
    let svc = RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key").plain())
        .settle_from(CostHeader::new("x-tokens-used"))
        .layer(service_fn(answer));
    for _ in 0..100 {
        let res = svc.clone().oneshot(request(("x-use", "3"))).await.unwrap();
        assert!(res.status().is_success(), "{res:?}");
    }
    limiter.return_leases().await;
    assert_eq!(peer.check_n("hot", 0).await.unwrap().remaining, CAP - 300);
}

#[tokio::test]
async fn served_requests_that_do_not_count_are_given_back() {
    let (limiter, peer) = pair();
    let svc = RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key").plain())
        .count_if(|status: http::StatusCode| status.is_success())
        .layer(service_fn(answer));
    for i in 0..100 {
        let extra = if i % 2 == 0 {
            ("x-fail", "1")
        } else {
            ("x-ok", "1")
        };
        svc.clone().oneshot(request(extra)).await.unwrap();
    }
    limiter.return_leases().await;
    assert_eq!(peer.check_n("hot", 0).await.unwrap().remaining, CAP - 50);
}
