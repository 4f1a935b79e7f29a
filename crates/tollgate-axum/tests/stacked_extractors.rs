//! Two `RateLimited` extractors on one handler, as two layers stack: the
//! request one of them refuses does not count on the other (the first
//! gives its charge back), and an admitted response reports both limits.

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::{Request, StatusCode};
use tollgate::axum::{RateLimitPolicy, RateLimited};
use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter, Subject};
use tower::ServiceExt;

#[derive(Clone)]
struct Limits {
    user: RateLimiter,
    ip: RateLimiter,
}

/// Ten per minute per user.
struct PerUser;

impl RateLimitPolicy<Limits> for PerUser {
    type Key = Subject;

    fn limiter(state: &Limits) -> RateLimiter {
        state.user.clone()
    }

    fn key(_: &Limits) -> Subject {
        Subject::new("user-1")
    }
}

/// One per minute per address.
struct PerIp;

impl RateLimitPolicy<Limits> for PerIp {
    type Key = Subject;

    fn limiter(state: &Limits) -> RateLimiter {
        state.ip.clone()
    }

    fn key(_: &Limits) -> Subject {
        Subject::new("10.0.0.1")
    }
}

async fn handler(
    user: RateLimited<PerUser>,
    ip: RateLimited<PerIp>,
) -> (RateLimited<PerUser>, RateLimited<PerIp>, &'static str) {
    (user, ip, "ok")
}

#[tokio::test]
async fn a_refusal_by_the_second_does_not_count_on_the_first() {
    let backend = MemoryBackend::new();
    let limiter = |name: &str, n| {
        RateLimiter::builder(backend.clone(), Algorithm::FixedWindow)
            .quota(Quota::per_minute(n))
            .name(name)
            .build()
            .unwrap()
    };
    let limits = Limits {
        user: limiter("per-user", 10),
        ip: limiter("per-ip", 1),
    };
    let app = Router::new()
        .route("/orders", post(handler))
        .with_state(limits.clone());
    let req = || Request::post("/orders").body(Body::empty()).unwrap();

    let ok = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let policies: Vec<_> = ok.headers().get_all("ratelimit-policy").iter().collect();
    assert_eq!(policies.len(), 2, "{policies:?}");
    assert_eq!(ok.headers().get_all("ratelimit").iter().count(), 2);

    let refused = app.oneshot(req()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The user's budget counts the request served, not the one refused.
    let left = limits.user.check_n("user-1", 0).await.unwrap();
    assert_eq!(left.remaining, 9, "{left:?}");
}
