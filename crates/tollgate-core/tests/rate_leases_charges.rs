//! Quota leases and what a decision carries: the `Backend` enum.

use std::time::Duration;

use tollgate_core::{Algorithm, Backend, DecisionSource, Quota, QuotaLeases, RateLimiter};

/// Hot after 5 checks in 100 ms, a slice of up to a minute of the rate,
/// living a minute.
fn long_leases() -> QuotaLeases {
    QuotaLeases::default()
        .hot_checks(5)
        .target(Duration::from_secs(60))
        .max_age(Duration::from_secs(60))
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
