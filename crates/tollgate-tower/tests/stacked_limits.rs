//! Limits stacked as layers (a broad one outside, a narrow one inside) are
//! not one atomic check, but the outer one never keeps a unit for a request
//! the inner one refused: its refusal is marked `Refused`, and the outer
//! layer gives its charge back before the answer leaves. A 429 the handler
//! answers itself still counts. Every
//! scenario runs on memory, a standalone Redis and a 3-master cluster; time
//! comes from a `ManualClock`.

#[macro_use]
mod common;

use axum::body::Body;
use axum::routing::get as route_get;
use axum::Router;
use http::{Request, StatusCode};
use tollgate_core::Algorithm;
use tollgate_tower::key::{GlobalKey, HeaderKey};
use tollgate_tower::rejection::{Refused, Rejection, RejectionReason};
use tollgate_tower::RateLimitLayer;

use common::suite::{clock, Backend};
use common::{left, limiter, send, unique};

fn from(user: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

/// A broad limit (10 a minute for everyone) outside a narrow one (1 a
/// minute per user): the narrow one's refusals leave the broad one whole,
/// for every algorithm, with the `count_if` path and without it; the
/// response's `RateLimit` shows the broad figure after the give-back.
async fn an_inner_refusal_costs_the_outer_limit_nothing(backend: Backend) {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        for counting in [false, true] {
            let clock = clock();
            let broad = limiter(&backend, alg, 10, &clock);
            let narrow = limiter(&backend, alg, 1, &clock);
            let mut outer = RateLimitLayer::new(broad.clone()).key(GlobalKey);
            if counting {
                outer = outer.count_if(|status: StatusCode| status != StatusCode::NOT_FOUND);
            }
            let app = Router::new()
                .route("/", route_get(|| async { "ok" }))
                .layer(RateLimitLayer::new(narrow).key(HeaderKey::new("x-user").plain()))
                .layer(outer);
            let user = unique("user");
            let first = send(&app, from(&user)).await;
            assert_eq!(first.status, StatusCode::OK, "{alg:?}");
            for i in 0..3 {
                let r = send(&app, from(&user)).await;
                assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{alg:?} {i}");
                // Both limits' items: the broad one as it stands after
                // giving the refused request's unit back.
                let items: Vec<&str> = r
                    .headers
                    .get_all("ratelimit")
                    .iter()
                    .map(|v| v.to_str().unwrap())
                    .collect();
                assert_eq!(items.len(), 2, "{alg:?}: {items:?}");
                assert!(items[0].contains(";r=0;"), "{alg:?}: {items:?}");
                assert!(items[1].contains(";r=9;"), "{alg:?} {counting}: {items:?}");
            }
            assert_eq!(left(&broad, "global").await, 9, "{alg:?} {counting}");
        }
    }
}

/// A 429 the handler answers itself is a response like any other: it
/// counts on the limit outside (only a tollgate rate limit's refusal,
/// marked `Refused`, is given back).
async fn a_handlers_own_429_still_counts(backend: Backend) {
    let clock = clock();
    let broad = limiter(&backend, Algorithm::Gcra, 10, &clock);
    let app = Router::new()
        .route("/", route_get(|| async { StatusCode::TOO_MANY_REQUESTS }))
        .layer(RateLimitLayer::new(broad.clone()).key(GlobalKey));
    for _ in 0..3 {
        let r = send(&app, from("anyone")).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(left(&broad, "global").await, 7);
}

on_every_backend!(memory, redis, cluster; [
    an_inner_refusal_costs_the_outer_limit_nothing,
    a_handlers_own_429_still_counts,
]);

/// Every refusal tollgate answers with is marked, the default response
/// and a custom responder's alike.
#[test]
fn refusals_are_marked() {
    let res = Rejection::busy(None).default_response();
    let refused = res.extensions().get::<Refused>().unwrap();
    assert_eq!(refused.reason(), RejectionReason::Busy);
    assert!(!refused.by_a_rate_limit());
}
