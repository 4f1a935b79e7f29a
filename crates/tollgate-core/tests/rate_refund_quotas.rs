//! Refunds on a bucket limiter with several quotas: each quota takes its
//! refund for as long as it can still be owed one — 10 a second beside 100
//! an hour, a refund 150 ms after the check gives the hour its unit back,
//! although the second's bucket has long refilled (before, the strictest
//! quota's deadline stopped them all) — and never after its own refill of
//! the cost, when it may have regained the unit already. Token bucket and
//! GCRA, on memory, a standalone Redis and a cluster.

mod rate_common;

use std::time::Duration;

use tollgate_core::{Algorithm, ManualClock, Quota};

use rate_common::*;

fn quotas() -> [Quota; 2] {
    [Quota::per_second(10), Quota::per_hour(100)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bucket_quota_takes_its_refund_while_it_is_owed() {
    for kind in KINDS {
        for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::new(1_700_000_000_000_000);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &quotas(), &p, &clock);

            // A slow handler: refunded 150 ms after the check.
            let d = l.check("s").await.unwrap();
            assert_eq!(d.quotas[1].remaining, 99, "{what}");
            clock.advance(Duration::from_millis(150));
            assert!(l.refund("s", &d.charge.unwrap()).await.unwrap(), "{what}");
            let peek = l.check_n("s", 0).await.unwrap();
            assert_eq!(
                peek.quotas[1].remaining, 100,
                "{what}: the hour's unit back"
            );
            assert_eq!(peek.quotas[0].remaining, 10, "{what}: never above capacity");

            // Past the hour quota's own refill of the cost (36 s), nothing.
            let d = l.check("s").await.unwrap();
            clock.advance(Duration::from_secs(36));
            assert!(!l.refund("s", &d.charge.unwrap()).await.unwrap(), "{what}");
            let peek = l.check_n("s", 0).await.unwrap();
            assert_eq!(
                peek.quotas[1].remaining, 100,
                "{what}: refilled, not refunded"
            );

            // Two units of the hour used, then one refunded 10 s later: the
            // second's quota is past its span (it refilled), the hour's not.
            l.check("s").await.unwrap();
            let d = l.check("s").await.unwrap();
            clock.advance(Duration::from_secs(10));
            assert!(l.refund("s", &d.charge.unwrap()).await.unwrap(), "{what}");
            let peek = l.check_n("s", 0).await.unwrap();
            assert_eq!(peek.quotas[0].remaining, 10, "{what}");
            assert_eq!(peek.quotas[1].remaining, 99, "{what}");
        }
    }
}

/// While the circuit breaker skips a dead Redis, a refund is skipped too
/// (the charge stays) instead of waiting out the timeout each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_is_skipped_while_the_circuit_is_open() {
    let mut server = tollgate_testkit::RedisServer::start().unwrap();
    let backend = tollgate_core::RedisBackend::from_connection(server.connection_manager().await);
    let l = tollgate_core::RateLimiter::builder(backend, Algorithm::SlidingWindowLog)
        .quota(Quota::per_minute(3))
        .failure_policy(tollgate_core::FailurePolicy::Deny)
        .circuit_breaker(1, Duration::from_secs(600))
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let charge = l.check("s").await.unwrap().charge.unwrap();
    server.stop();
    assert!(l.check("s").await.is_err(), "the outage opens the circuit");
    let e = l.refund("s", &charge).await.unwrap_err();
    assert!(matches!(e, tollgate_core::Error::CircuitOpen), "{e}");
}
