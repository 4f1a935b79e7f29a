//! Quota leases and what a decision carries: a take that finds too few
//! units (an ordinary check), `acquire` (never leased) and the `Backend`
//! enum.

use std::time::Duration;

use tollgate_core::{
    Algorithm, Backend, DecisionSource, ManualClock, MemoryBackend, Quota, QuotaLeases,
    RateBackend, RateLimiter, RedisBackend,
};
use tollgate_testkit::{RedisCluster, RedisServer};

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

/// The memory store, a standalone Redis and a 3-master cluster (with the
/// servers, kept running while the test uses them).
async fn stores(clock: &ManualClock) -> ((RedisServer, RedisCluster), [Backend; 3]) {
    let server = RedisServer::start().unwrap();
    let cluster = RedisCluster::start().unwrap();
    let standalone = RedisBackend::connect(&server.url()).await.unwrap();
    let clustered = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    let backends = [
        MemoryBackend::with_clock(clock.clone()).into(),
        standalone.into(),
        clustered.into(),
    ];
    ((server, cluster), backends)
}

async fn remaining(peer: &RateLimiter, subject: &str) -> u64 {
    peer.check_n(subject, 0).await.unwrap().remaining
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

/// Fewer units available than a slice's least: the take is an ordinary
/// check of the caller's cost, decided and cached as one (on memory, a
/// standalone Redis and a cluster).
#[tokio::test]
async fn too_few_units_for_a_slice_is_an_ordinary_check() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        // A slice wants up to 80 tokens and at least 20: hot at once.
        let leases = long_leases().hot_checks(1).max_share(1);
        let (limiter, peer) = pair(
            backend,
            Algorithm::TokenBucket,
            Quota::per_hour(80),
            &clock,
            leases,
        );
        peer.check_n("few", 77).await.unwrap();
        for left in (0..3).rev() {
            let d = limiter.check("few").await.unwrap();
            assert!(d.allowed, "{kind}: {d:?}");
            assert_eq!(d.source, DecisionSource::Backend, "{kind}");
            assert_eq!(remaining(&peer, "few").await, left, "{kind}");
        }
        // The denial a plain check gets: one token's wait (45 s), cached.
        let plain = peer.check("few").await.unwrap();
        for _ in 0..3 {
            let d = limiter.check("few").await.unwrap();
            assert!(d.is_denied(), "{kind}: {d:?}");
            assert_eq!(d.retry_after, plain.retry_after, "{kind}");
        }
    }
}
