//! Quota leases and what a decision carries: `acquire` (never leased) and
//! the `Backend` enum.

use std::time::Duration;

use tollgate_core::{
    Algorithm, Backend, DecisionSource, ManualClock, MemoryBackend, Quota, QuotaLeases,
    RateBackend, RateLimiter,
};

/// Hot after 5 checks in 100 ms, a slice of up to a minute of the rate,
/// living a minute.
fn long_leases() -> QuotaLeases {
    QuotaLeases::default()
        .hot_checks(5)
        .target(Duration::from_secs(60))
        .max_age(Duration::from_secs(60))
}

/// A limiter on `backend` with `leases`, and a peer of the same policy
/// without them (what the store holds, by a check of cost 0).
fn pair(
    backend: impl RateBackend + Clone,
    alg: Algorithm,
    quota: Quota,
    clock: &ManualClock,
    leases: QuotaLeases,
) -> (RateLimiter, RateLimiter) {
    let build = |b: tollgate_core::RateLimiterBuilder| {
        b.quota(quota)
            .name("charges")
            .clock(clock.clone())
            .timeout(Duration::from_secs(5))
    };
    let leased = build(RateLimiter::builder(backend.clone(), alg))
        .quota_leases(leases)
        .build()
        .unwrap();
    let peer = build(RateLimiter::builder(backend, alg)).build().unwrap();
    (leased, peer)
}

/// The `Backend` enum takes leases as its store does: a hot subject is
/// served from a slice, never refused with an error.
#[tokio::test]
async fn the_backend_enum_leases() {
    let limiter = RateLimiter::builder(Backend::memory(), Algorithm::Gcra)
        .quota(Quota::per_hour(10_000))
        .quota_leases(long_leases())
        .build()
        .unwrap();
    let mut served = 0;
    for _ in 0..50 {
        let d = limiter
            .check("hot")
            .await
            .expect("no error for a hot subject");
        assert!(d.allowed);
        served += usize::from(d.source == DecisionSource::Lease);
    }
    assert!(served > 30, "{served} served from slices");
}

/// `acquire` is never answered from a live slice nor takes one (its wait
/// and order are the store's), whether the slice can serve it or not.
#[tokio::test]
async fn acquire_never_leases() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (limiter, _) = pair(
        MemoryBackend::with_clock(clock.clone()),
        Algorithm::TokenBucket,
        Quota::per_hour(100_000),
        &clock,
        long_leases().max_age(Duration::from_millis(50)),
    );
    for _ in 0..10 {
        limiter.check("hot").await.unwrap();
    }
    assert_eq!(
        limiter.check("hot").await.unwrap().source,
        DecisionSource::Lease
    );
    // A live slice that holds the cost.
    let d = limiter
        .acquire("hot", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(d.source, DecisionSource::Backend, "{d:?}");
    // A slice that aged out: the hot subject would take a new one.
    clock.advance(Duration::from_millis(60));
    let d = limiter
        .acquire("hot", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(d.source, DecisionSource::Backend, "{d:?}");
    assert!(d.charge.is_some(), "the store's own charge: {d:?}");
    assert_eq!(
        limiter.check("hot").await.unwrap().source,
        DecisionSource::Backend,
        "the acquire took no slice"
    );
}
