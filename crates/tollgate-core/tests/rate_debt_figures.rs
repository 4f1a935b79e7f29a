//! A subject in debt after a settle over the estimate: `next_after` (the
//! `t` of the `RateLimit` header, what the pace layer blocks for) is when
//! a unit is available again, not when the debt shrinks by one — from the
//! settle's figures, a single check's and a lean batch's alike.

mod rate_common;

use std::time::Duration;

use futures_util::future::join_all;
use rate_common::{prefix, server};
use tollgate_core::{Algorithm, Backend, MemoryBackend, Quota, RateLimiter, RedisBackend};

/// 1000 a minute (one unit each 60 ms): 900 taken, settled to 1500 — 500
/// owed, so nothing is available for 500 × 60 ms = 30 s, and more.
async fn in_debt(backend: Backend, algorithm: Algorithm) {
    let l = RateLimiter::builder(backend, algorithm)
        .quota(Quota::per_minute(1000))
        .prefix(prefix())
        .name("debt")
        .deny_cache(0)
        .build()
        .unwrap();
    let d = l.check_n("s", 900).await.unwrap();
    assert!(d.allowed);
    let charge = d.charge.unwrap();
    let settled = l.settle("s", &charge, 1500).await.unwrap();
    assert!(settled.applied);
    let at_least = Duration::from_secs(30);
    let next = settled.decision.quotas[0].next_after;
    assert!(next >= at_least, "{algorithm:?}, settle: {next:?}");
    for together in [1, 4] {
        for d in join_all((0..together).map(|_| l.check("s"))).await {
            let d = d.unwrap();
            assert!(!d.allowed, "{d:?}");
            let next = d.quotas[0].next_after;
            assert!(
                next >= at_least,
                "{algorithm:?}, {together} together: {d:?}"
            );
            assert!(next <= d.retry_after.unwrap(), "{d:?}");
        }
    }
}

#[tokio::test]
async fn in_memory() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        in_debt(MemoryBackend::new().into(), algorithm).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let backend = RedisBackend::connect(&server().url()).await.unwrap();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        in_debt(backend.clone().into(), algorithm).await;
    }
}
