//! The quota lease script and its memory twin decide alike: one limiter on
//! the memory store and one on Redis, both on one client clock and the same
//! lease settings, get the same sequence of checks, and every decision
//! (served from a slice or not, its figures) is the same on both.

use std::time::Duration;

use tollgate_core::{
    Algorithm, FailurePolicy, ManualClock, MemoryBackend, Quota, QuotaLeases, RateBackend,
    RateLimiter, RedisBackend,
};
use tollgate_testkit::RedisServer;

/// Slices that end only when used up (cost 1: none is ever given back, so
/// no background settle races the checks).
fn leases() -> QuotaLeases {
    QuotaLeases::default()
        .hot_checks(8)
        .target(Duration::from_millis(40))
        .max_age(Duration::from_secs(3600))
}

fn limiter(
    backend: impl RateBackend,
    alg: Algorithm,
    quotas: &[Quota],
    clock: &ManualClock,
) -> RateLimiter {
    let mut b = RateLimiter::builder(backend, alg)
        .prefix("twins")
        .clock(clock.clone())
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(5))
        .quota_leases(leases());
    for q in quotas {
        b = b.quota(*q);
    }
    b.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_script_and_its_memory_twin_decide_alike() {
    let server = RedisServer::start().unwrap();
    let quota_sets = [
        vec![Quota::per_second(200)],
        vec![
            Quota::per_second(200),
            Quota::new(500, Duration::from_secs(10)).unwrap(),
        ],
    ];
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        for quotas in &quota_sets {
            // Mid-window, so the run crosses a fixed window's end.
            let clock = ManualClock::new(1_700_000_000_300_000);
            let memory = limiter(
                MemoryBackend::with_clock(clock.clone()),
                alg,
                quotas,
                &clock,
            );
            let redis = RedisBackend::connect(&server.url()).await.unwrap();
            let redis = limiter(redis, alg, quotas, &clock);
            let subject = format!("s-{}-{}", alg.short_name(), quotas.len());
            let mut leased = 0;
            for i in 0..1500u64 {
                let m = memory.check(subject.as_str()).await.unwrap();
                let r = redis.check(subject.as_str()).await.unwrap();
                let fields = |d: &tollgate_core::Decision| {
                    (
                        d.allowed,
                        d.remaining,
                        d.reset_after,
                        d.retry_after,
                        d.source,
                    )
                };
                assert_eq!(fields(&m), fields(&r), "{alg:?} {quotas:?} check {i}");
                assert_eq!(m.quotas, r.quotas, "{alg:?} {quotas:?} check {i}");
                leased += usize::from(m.source == tollgate_core::DecisionSource::Lease);
                // Bursts of checks, then pauses: the subject turns hot and
                // cold again; the windows and buckets move on.
                let step = if i % 100 < 60 { 500 } else { 4_000 };
                clock.advance(Duration::from_micros(step));
            }
            assert!(
                leased > 100,
                "{alg:?} {quotas:?}: {leased} served from slices"
            );
        }
    }
}
