//! Counting by outcome (`RateLimitLayer::count_if`, `count_unfinished`):
//! the check reserves before the handler, a response that does not count
//! is refunded before it is returned, concurrent requests never get past
//! the bound, and a request without a response counts or is refunded as
//! configured. Every scenario runs on memory, a standalone Redis and a
//! 3-master cluster; time comes from a `ManualClock`.

#[macro_use]
mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get as route_get, post};
use axum::Router;
use http::{HeaderMap, Request, Response, StatusCode};
use tollgate_core::{Algorithm, PlanTable, Plans, Quota, RateLimiter};
use tollgate_testkit::eventually;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::rate_limit::{CountResponse, PlanHeader};
use tollgate_tower::RateLimitLayer;
use tower::{service_fn, Layer, ServiceExt};

use common::suite::{clock, Backend};
use common::{left, limiter};
use common::{send, unique};

async fn login(body: String) -> StatusCode {
    if body == "open-sesame" {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    }
}

fn attempt(user: &str, password: &str) -> Request<Body> {
    Request::post("/login")
        .header("x-user", user)
        .body(Body::from(password.to_owned()))
        .unwrap()
}

/// Login throttling: 3 failures a minute per user. Successes cost nothing
/// (each refunded before it is answered, and its `RateLimit` says so:
/// `r=3` every time); 32 concurrent failures get exactly 3 tries; then every attempt,
/// the right password too, is refused until the window lets one more.
async fn failed_logins_only(backend: Backend) {
    let clock = clock();
    let logins = limiter(&backend, Algorithm::SlidingWindowLog, 3, &clock);
    let app = Router::new().route("/login", post(login)).layer(
        RateLimitLayer::new(logins.clone())
            .key(HeaderKey::new("x-user").plain())
            .count_if(|status: StatusCode| status == StatusCode::UNAUTHORIZED),
    );
    let user = unique("user");
    for _ in 0..10 {
        let r = send(&app, attempt(&user, "open-sesame")).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert!(r.expect_header("ratelimit").contains(";r=3;"), "{r:?}");
    }
    assert_eq!(left(&logins, &user).await, 3);

    let tries: Vec<_> = (0..32)
        .map(|i| {
            let (app, user) = (app.clone(), user.clone());
            tokio::spawn(async move { send(&app, attempt(&user, &format!("guess-{i}"))).await })
        })
        .collect();
    let (mut unauthorized, mut limited) = (0, 0);
    for t in tries {
        let r = t.await.unwrap();
        match r.status {
            StatusCode::UNAUTHORIZED => unauthorized += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(r.retry_after() >= 1, "{r:?}");
                limited += 1;
            }
            other => panic!("{other}: {r:?}"),
        }
    }
    assert_eq!((unauthorized, limited), (3, 29));
    assert_eq!(left(&logins, &user).await, 0);

    let r = send(&app, attempt(&user, "open-sesame")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.retry_after(), 60, "{r:?}");
    // Another user is not affected.
    let r = send(&app, attempt(&unique("other"), "nope")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{r:?}");

    clock.advance(Duration::from_secs(60));
    let r = send(&app, attempt(&user, "open-sesame")).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(left(&logins, &user).await, 3);
}

/// Not counting 304 and 5xx, on every algorithm: ten 500s and a 304 leave
/// the whole budget, which four 200s then use up.
async fn every_algorithm_refunds_what_does_not_count(backend: Backend) {
    let clock = clock();
    let answer = |req: Request<Body>| async move {
        let status = req.headers()["x-status"].to_str().unwrap().parse::<u16>();
        let mut res = Response::new(Body::empty());
        *res.status_mut() = StatusCode::from_u16(status.unwrap()).unwrap();
        Ok::<_, Infallible>(res)
    };
    let counts = |s: StatusCode| !(s == StatusCode::NOT_MODIFIED || s.is_server_error());
    for alg in Algorithm::ALL {
        let limiter = limiter(&backend, alg, 4, &clock);
        let svc = RateLimitLayer::new(limiter.clone())
            .count_if(counts)
            .layer(service_fn(answer));
        let with = |status: u16| {
            Request::get("/")
                .header("x-status", status)
                .body(Body::empty())
                .unwrap()
        };
        for status in [500, 503, 500, 502, 500, 504, 500, 500, 599, 500, 304] {
            let r = send(&svc, with(status)).await;
            assert_eq!(r.status.as_u16(), status, "{alg:?}: {r:?}");
        }
        assert_eq!(left(&limiter, "global").await, 4, "{alg:?}");
        for _ in 0..4 {
            assert_eq!(
                send(&svc, with(200)).await.status,
                StatusCode::OK,
                "{alg:?}"
            );
        }
        let r = send(&svc, with(500)).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{alg:?}: {r:?}");
        assert_eq!(left(&limiter, "global").await, 0, "{alg:?}");
    }
}

/// A request that ends without a response — the inner service failed, or
/// its future was dropped while the handler ran — counts by default, and
/// is refunded with `count_unfinished(false)`.
async fn unfinished_requests(backend: Backend) {
    let clock = clock();
    for counted in [true, false] {
        // The inner service fails.
        let limiter = limiter(&backend, Algorithm::FixedWindow, 5, &clock);
        let svc = RateLimitLayer::new(limiter.clone())
            .count_unfinished(counted)
            .layer(service_fn(|_: Request<Body>| async {
                Err::<Response<Body>, _>("the inner service failed")
            }));
        let err = svc.clone().oneshot(Request::new(Body::empty())).await;
        assert_eq!(err.unwrap_err(), "the inner service failed");
        let expected = if counted { 4 } else { 5 };
        assert_eq!(
            left(&limiter, "global").await,
            expected,
            "error, counted {counted}"
        );

        // The request is dropped while the handler runs. A control layer
        // on a limiter of its own refunds a dropped request: its refund
        // says the drop has run, for both.
        let limiter = self::limiter(&backend, Algorithm::TokenBucket, 5, &clock);
        let control = self::limiter(&backend, Algorithm::TokenBucket, 5, &clock);
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
        let app = Router::new()
            .route(
                "/",
                route_get(move || async move {
                    entered_tx.send(()).unwrap();
                    std::future::pending::<()>().await;
                }),
            )
            .layer(
                RateLimitLayer::new(limiter.clone())
                    .count_unfinished(counted)
                    .count_if(|_: StatusCode| true),
            )
            .layer(RateLimitLayer::new(control.clone()).count_unfinished(false));
        let request = tokio::spawn(app.oneshot(Request::new(Body::empty())));
        entered.recv().await.unwrap();
        assert_eq!(left(&limiter, "global").await, 4, "reserved while running");
        request.abort();
        assert!(request.await.unwrap_err().is_cancelled());
        if counted {
            // Nothing is given back: not by the time the control's refund,
            // made by the same drop, has landed.
            let control = &control;
            eventually(
                Duration::from_secs(10),
                "the control's refund of the dropped request",
                || async move { (left(control, "global").await == 5).then_some(()) },
            )
            .await;
            assert_eq!(left(&limiter, "global").await, 4);
        } else {
            let limiter = &limiter;
            eventually(
                Duration::from_secs(10),
                "the refund of a dropped request",
                || async move { (left(limiter, "global").await == 5).then_some(()) },
            )
            .await;
        }
    }
}

/// Over plans, a refund goes back to the plan that was charged.
async fn refunds_go_to_the_plan_charged(backend: Backend) {
    let clock = clock();
    let free = limiter(&backend, Algorithm::Gcra, 2, &clock);
    let pro = limiter(&backend, Algorithm::Gcra, 3, &clock);
    let plans = Plans::new(
        PlanTable::builder()
            .plan("free", free.clone())
            .plan("pro", pro.clone())
            .default_plan("free")
            .build()
            .unwrap(),
    );
    let app = Router::new().route("/login", post(login)).layer(
        RateLimitLayer::plans(plans, PlanHeader::new("x-plan"))
            .key(HeaderKey::new("x-user").plain())
            .count_if(|status: StatusCode| status == StatusCode::UNAUTHORIZED),
    );
    let user = unique("user");
    for plan in ["free", "pro", "pro"] {
        let mut req = attempt(&user, "open-sesame");
        req.headers_mut().insert("x-plan", plan.parse().unwrap());
        assert_eq!(send(&app, req).await.status, StatusCode::OK);
        let mut req = attempt(&user, "wrong");
        req.headers_mut().insert("x-plan", plan.parse().unwrap());
        assert_eq!(send(&app, req).await.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(left(&free, &user).await, 1);
    assert_eq!(left(&pro, &user).await, 1);
}

/// Counting on a header: a gRPC-style error in a trailers-only response.
struct GrpcUnauthenticated;

impl CountResponse for GrpcUnauthenticated {
    fn counts(&self, _status: StatusCode, headers: &HeaderMap) -> bool {
        headers.get("grpc-status").is_some_and(|v| v == "16")
    }
}

async fn counting_on_headers(backend: Backend) {
    let clock = clock();
    let limiter = limiter(&backend, Algorithm::SlidingWindowCounter, 3, &clock);
    let svc = RateLimitLayer::new(limiter.clone())
        .count_if(GrpcUnauthenticated)
        .layer(service_fn(|req: Request<Body>| async move {
            let code = req.headers()["x-code"].clone();
            let mut res = Response::new(Body::empty());
            res.headers_mut().insert("grpc-status", code);
            Ok::<_, Infallible>(res)
        }));
    let with = |code: &str| {
        Request::post("/")
            .header("x-code", code)
            .body(Body::empty())
            .unwrap()
    };
    for code in ["0", "5", "0", "16", "0"] {
        assert_eq!(send(&svc, with(code)).await.status, StatusCode::OK);
    }
    assert_eq!(left(&limiter, "global").await, 2);
}

on_every_backend!(memory, redis, cluster; [
    failed_logins_only,
    every_algorithm_refunds_what_does_not_count,
    unfinished_requests,
    refunds_go_to_the_plan_charged,
    counting_on_headers,
]);

/// Redis dies while the handler runs: the refund cannot be made, and the
/// response still goes out (no hang, no panic; bounded here at 30 s, far
/// above the limiter's 200 ms timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_refund_still_answers() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let conn = server.connection_manager().await;
    let server = Arc::new(std::sync::Mutex::new(server));
    let backend: Backend = Arc::new(tollgate_core::RedisBackend::from_connection(conn));
    let limiter = RateLimiter::builder(backend, Algorithm::SlidingWindowLog)
        .quota(Quota::per_minute(3))
        .name(unique("dies"))
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let stop = Arc::clone(&server);
    let app = Router::new()
        .route(
            "/",
            route_get(move || async move {
                stop.lock().unwrap().stop();
                StatusCode::OK
            }),
        )
        .layer(RateLimitLayer::new(limiter).count_if(|s: StatusCode| s != StatusCode::OK));
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        send(&app, Request::new(Body::empty())),
    )
    .await
    .expect("the response comes although the refund cannot be made");
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

/// A request of cost 0 under `count_if` costs its check and nothing more:
/// a response that does not count has nothing to give back, so no settle
/// goes to Redis (one script call per request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_cost_zero_sends_no_settle() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let backend = tollgate_core::RedisBackend::connect(&server.url())
        .await
        .unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_minute(100))
        .deny_cache(0)
        .build()
        .unwrap();
    let svc = RateLimitLayer::new(limiter)
        .cost(|_: &http::request::Parts| 0)
        .count_if(|s: StatusCode| s == StatusCode::UNAUTHORIZED)
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }));
    // The first request loads the script (a NOSCRIPT, then the call).
    let r = send(&svc, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let before = server.command_calls("evalsha");
    for _ in 0..20 {
        let r = send(&svc, Request::get("/").body(Body::empty()).unwrap()).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    assert_eq!(server.command_calls("evalsha") - before, 20);
}
