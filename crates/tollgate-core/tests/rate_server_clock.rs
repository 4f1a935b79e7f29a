//! The behaviour suite's core scenarios on the server's clock — no client
//! clock at all: the scripts read `TIME` (the default), the memory backend
//! the system clock. Most rate tests hold time still with a `ManualClock`;
//! these wait for real, on short quotas, and only ever check "allowed after
//! waiting at least what the decision said" (waiting longer never changes
//! that answer) and denials where no refill can come in between.
//!
//! Every algorithm, on memory, a standalone Redis and a cluster, run side
//! by side.

mod rate_common;

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, MemoryBackend, Quota, RateBackend, RateLimiter};

use rate_common::*;

/// Slack after a wait, for timer lateness the other way round (the system
/// timer firing a little early relative to the server's clock).
const SLACK: Duration = Duration::from_millis(30);

fn limiter(backend: &Arc<dyn RateBackend>, alg: Algorithm, quotas: &[Quota]) -> RateLimiter {
    let mut b = RateLimiter::builder(backend.clone(), alg)
        .prefix(prefix())
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(5))
        .deny_cache(0);
    for quota in quotas {
        b = b.quota(*quota);
    }
    b.build().unwrap()
}

/// 3 per second (a bucket's burst 3).
fn per_second(alg: Algorithm) -> Quota {
    let quota = Quota::per_second(3);
    if alg.uses_burst() {
        quota.with_burst(3).unwrap()
    } else {
        quota
    }
}

/// Drain, refuse with a retry-after and `t`, and admit again once that has
/// passed; refunds once; several quotas all or nothing.
async fn scenario(backend: Arc<dyn RateBackend>, alg: Algorithm) {
    let what = format!("{} {alg:?}", backend.kind());
    let l = limiter(&backend, alg, &[per_second(alg)]);
    // Drained: a window algorithm may start late in its window, so the
    // three are checked at once (no refill between them is possible for a
    // bucket: a unit takes 333 ms).
    for i in 0..3 {
        let d = l.check("s").await.unwrap();
        assert!(d.allowed, "{what}: #{i} {d:?}");
    }
    let d = l.check("s").await.unwrap();
    if d.allowed {
        // Only a fixed window or counter can have turned over in between:
        // start again at the window's beginning.
        assert!(!alg.uses_burst(), "{what}: a 4th admitted");
        return Box::pin(scenario(backend, alg)).await;
    }
    let retry = d.retry_after.expect("a denial says when");
    let t = d.quotas[0].next_after;
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(2),
        "{what}: {retry:?}"
    );
    assert!(retry >= t, "{what}: retry {retry:?} before t {t:?}");
    tokio::time::sleep(retry + SLACK).await;
    let d = l.check("s").await.unwrap();
    assert!(
        d.allowed,
        "{what}: still refused after its retry-after: {d:?}"
    );

    // A refund gives back once.
    let charge = d.charge.expect("an admitted check took 1");
    assert!(l.refund("s", &charge).await.unwrap(), "{what}");
    assert!(!l.refund("s", &charge).await.unwrap(), "{what}: twice");

    // 2 a second and 3 an hour, together: the second's refusal passes, the
    // hour's does not.
    let l = limiter(
        &backend,
        alg,
        &[
            Quota::per_second(2),
            Quota::new(3, Duration::from_secs(3600)).unwrap(),
        ],
    );
    let mut admitted = 0;
    for _ in 0..8 {
        let d = l.check("m").await.unwrap();
        if d.allowed {
            admitted += 1;
        } else if let Some(retry) = d.retry_after {
            if retry > Duration::from_secs(2) {
                break; // the hour's
            }
            tokio::time::sleep(retry + SLACK).await;
        }
    }
    assert_eq!(admitted, 3, "{what}: the hour's 3, no more");
    let d = l.check("m").await.unwrap();
    assert!(!d.allowed, "{what}: {d:?}");
    assert!(
        d.retry_after.unwrap() > Duration::from_secs(2),
        "{what}: {d:?}"
    );
}

async fn every_algorithm(backend: Arc<dyn RateBackend>) {
    let runs: Vec<_> = ALL
        .into_iter()
        .map(|alg| tokio::spawn(scenario(backend.clone(), alg)))
        .collect();
    for run in runs {
        run.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_on_the_system_clock() {
    every_algorithm(Arc::new(MemoryBackend::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_on_the_server_clock() {
    let backend = tollgate_core::RedisBackend::from_connection(server().connection_manager().await);
    every_algorithm(Arc::new(backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_on_the_server_clock() {
    let backend = tollgate_core::RedisBackend::from_connection(cluster().connection().await);
    every_algorithm(Arc::new(backend)).await;
}
