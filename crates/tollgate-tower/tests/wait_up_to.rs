//! Waiting for a slot (`RateLimitLayer::wait_up_to`): a request the limit
//! would admit within the wait reserves its slot at once and reaches the
//! inner service when the slot comes; a longer wait is refused as without
//! waiting (429, honest `Retry-After`); a request dropped while it waits
//! gives its slot back. Every scenario runs on memory, a standalone Redis
//! and a 3-master cluster; time comes from a `ManualClock`, advanced by
//! the test, so a waiter is released only when the test says.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tollgate_core::{Algorithm, ManualClock, Quota, RateLimiter};
use tollgate_testkit::eventually;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::RateLimitLayer;

use common::suite::{clock, Backend};
use common::{send, unique, Reply};

/// One request a second, one at a time (GCRA, a burst of 1).
fn one_a_second(backend: &Backend, clock: &ManualClock) -> RateLimiter {
    RateLimiter::builder(backend.clone(), Algorithm::Gcra)
        .quota(Quota::per_minute(60).with_burst(1).unwrap())
        .name(unique("wait"))
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// An app behind `layer` that counts the requests reaching its handler.
fn app(layer: RateLimitLayer<HeaderKey>) -> (Router, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    let app = Router::new()
        .route(
            "/",
            get(move || {
                count.fetch_add(1, Ordering::SeqCst);
                async { "ok" }
            }),
        )
        .layer(layer);
    (app, served)
}

fn req(key: &str) -> Request<Body> {
    Request::get("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

/// Waits until the key's schedule is `secs` ahead: the reservations made
/// so far (a check of cost 0 sees them; it takes nothing).
async fn reserved_until(limiter: &RateLimiter, key: &str, secs: u64) {
    let what = format!("the schedule {secs} s ahead");
    eventually(Duration::from_secs(10), &what, || async {
        let d = limiter.check_n(key, 0).await.unwrap();
        (d.reset_after == Duration::from_secs(secs)).then_some(())
    })
    .await;
}

fn spawn_request(app: &Router, key: &str) -> tokio::task::JoinHandle<Reply> {
    let (app, req) = (app.clone(), req(key));
    tokio::spawn(async move { send(&app, req).await })
}

/// Up to 2.5 s of waiting at one a second: the second and third requests
/// wait for their slots (1 s and 2 s away) and are served when each comes,
/// in order; the fourth (3 s away) is refused at once with an honest
/// `Retry-After` and the problem body of any 429.
async fn a_request_waits_for_its_slot(backend: Backend) {
    let clock = clock();
    let limiter = one_a_second(&backend, &clock);
    let (app, served) = app(RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key").plain())
        .wait_up_to(Duration::from_millis(2500)));
    let key = unique("key");
    assert_eq!(send(&app, req(&key)).await.status, StatusCode::OK);
    let second = spawn_request(&app, &key);
    reserved_until(&limiter, &key, 2).await;
    let third = spawn_request(&app, &key);
    reserved_until(&limiter, &key, 3).await;

    let refused = send(&app, req(&key)).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert!((2..=3).contains(&refused.retry_after()), "{refused:?}");
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    // The refusal took nothing.
    reserved_until(&limiter, &key, 3).await;
    assert_eq!(served.load(Ordering::SeqCst), 1, "the waiters are waiting");

    clock.advance(Duration::from_secs(1));
    let r = second.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert!(!third.is_finished(), "the third slot is a second later");
    clock.advance(Duration::from_secs(1));
    let r = third.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(served.load(Ordering::SeqCst), 3);
}

/// A request dropped while it waits gives its slot back: the next waiter
/// gets that slot (1 s away, within its 1.5 s) instead of the one after.
async fn a_dropped_waiter_gives_its_slot_back(backend: Backend) {
    let clock = clock();
    let limiter = one_a_second(&backend, &clock);
    let (app, served) = app(RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key").plain())
        .wait_up_to(Duration::from_millis(1500)));
    let key = unique("key");
    assert_eq!(send(&app, req(&key)).await.status, StatusCode::OK);
    let dropped = spawn_request(&app, &key);
    reserved_until(&limiter, &key, 2).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    reserved_until(&limiter, &key, 1).await;

    let next = spawn_request(&app, &key);
    reserved_until(&limiter, &key, 2).await;
    clock.advance(Duration::from_secs(1));
    let r = match tokio::time::timeout(Duration::from_secs(10), next).await {
        Ok(r) => r.unwrap(),
        Err(_) => {
            let d = limiter.check_n(&*key, 0).await;
            panic!("still waiting 10 s after its slot came: {d:?}")
        }
    };
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "the dropped one never ran"
    );
}

/// Shadow mode never refuses, so it never waits either: a request over
/// the limit goes through at once, taking nothing.
async fn shadow_mode_never_waits(backend: Backend) {
    let clock = clock();
    let limiter = one_a_second(&backend, &clock);
    let (app, served) = app(RateLimitLayer::new(limiter.clone())
        .key(HeaderKey::new("x-api-key").plain())
        .wait_up_to(Duration::from_secs(5))
        .shadow(true));
    let key = unique("key");
    for _ in 0..3 {
        assert_eq!(send(&app, req(&key)).await.status, StatusCode::OK);
    }
    assert_eq!(served.load(Ordering::SeqCst), 3);
    reserved_until(&limiter, &key, 1).await;
}

on_every_backend!(memory, redis, cluster; [
    a_request_waits_for_its_slot,
    a_dropped_waiter_gives_its_slot_back,
    shadow_mode_never_waits,
]);
