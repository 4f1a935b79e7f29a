//! Counters through the `metrics` facade (feature `metrics`).

mod common;

use axum::routing::get;
use axum::Router;
use tollgate_core::{Algorithm, MemoryBackend, Quota, RateLimiter};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::RateLimitLayer;

use common::{send, unique};
use tollgate_testkit::metrics::{decisions, recorder};

#[tokio::test]
async fn decisions_are_counted_by_policy_outcome_and_source() {
    recorder();
    let policy = unique("m");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&policy)
                .deny_cache(0)
                .build()
                .unwrap(),
        ));
    send(&app, common::get("/")).await;
    send(&app, common::get("/")).await;
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&policy, "allowed", "backend"), 1);
    assert_eq!(decisions(&policy, "denied", "backend"), 2);

    let shadow = unique("m-shadow");
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&shadow)
                .build()
                .unwrap(),
        )
        .shadow(true),
    );
    send(&app, common::get("/")).await;
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&shadow, "allowed", "backend"), 1);
    assert_eq!(decisions(&shadow, "shadow_denied", "backend"), 1);

    let keyed = unique("m-key");
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&keyed)
                .build()
                .unwrap(),
        )
        .key(HeaderKey::new("x-api-key")),
    );
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&keyed, "key_error", "none"), 1);

    let costly = unique("m-cost");
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&costly)
                .build()
                .unwrap(),
        )
        .cost(2),
    );
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&costly, "too_costly", "none"), 1);
}

/// A decision served from a quota lease is counted as such.
#[tokio::test]
async fn decisions_served_from_a_lease_are_counted_as_such() {
    use std::time::Duration;
    use tollgate_core::{ManualClock, QuotaLeases};

    recorder();
    let policy = unique("m-lease");
    let clock = ManualClock::new(1_700_000_000_000_000);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            RateLimiter::builder(
                MemoryBackend::with_clock(clock.clone()),
                Algorithm::FixedWindow,
            )
            .quota(Quota::per_hour(100_000))
            .name(&policy)
            .clock(clock)
            .quota_leases(
                QuotaLeases::default()
                    .hot_checks(5)
                    .target(Duration::from_secs(60))
                    .max_age(Duration::from_secs(60)),
            )
            .build()
            .unwrap(),
        ));
    for _ in 0..50 {
        send(&app, common::get("/")).await;
    }
    assert!(decisions(&policy, "allowed", "lease") > 0);
    assert_eq!(decisions(&policy, "allowed", "other"), 0);
}

#[tokio::test]
async fn lock_requests_are_counted_by_outcome() {
    let backend = MemoryBackend::new();
    let locker = tollgate_core::Locker::new(backend);
    let app =
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(tollgate_tower::LockLayer::new(
                locker.clone(),
                tollgate_tower::key::GlobalKey,
            ));
    let before = (
        recorder().get("tollgate_lock_requests_total{outcome=acquired}"),
        recorder().get("tollgate_lock_requests_total{outcome=busy}"),
    );
    send(&app, common::get("/")).await;
    let held = locker
        .try_acquire("global", &tollgate_core::LockOptions::new())
        .await
        .unwrap();
    send(&app, common::get("/")).await;
    held.release().await.unwrap();
    // Other tests of this binary may count too: compare with at least.
    assert!(recorder().get("tollgate_lock_requests_total{outcome=acquired}") > before.0);
    assert!(recorder().get("tollgate_lock_requests_total{outcome=busy}") > before.1);
}
