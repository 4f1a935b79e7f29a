//! A claim is cancel-safe: when its round trip outlives the store's timeout
//! (a frozen Redis) or its future is dropped, a reply that arrives later is
//! abandoned, so a retry of the same key claims it at once instead of
//! finding it in flight until the lease's TTL.

use std::time::{Duration, Instant};

use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore};
use tollgate_core::{RedisBackend, Subject};
use tollgate_testkit::{eventually, unique, RedisServer};

/// Far below the default 30 s lease: a claim left ownerless would still be
/// in flight when this bound passes.
const PROMPTLY: Duration = Duration::from_secs(5);

fn key(s: &str) -> Subject {
    Subject::compound(["tenant-1", "POST /orders", s])
}

/// Claims `k` until it is claimed (an in-flight record or a store still
/// recovering is retried), within [`PROMPTLY`]; abandons it.
async fn claim_promptly(store: &IdempotencyStore, k: &Subject) {
    let start = Instant::now();
    let claimed = eventually(PROMPTLY, "the key claimed again", || async {
        match store.claim(k.clone(), Fingerprint::of(b"p")).await {
            Ok(Claim::Claimed(c)) => Some(c),
            Ok(Claim::InFlight { .. }) => None,
            Err(e) if e.is_unavailable() => None,
            other => panic!("expected Claimed, got {other:?}"),
        }
    })
    .await;
    assert!(start.elapsed() < PROMPTLY);
    assert!(claimed.abandon().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_claim_is_abandoned() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let store = IdempotencyStore::builder(backend)
        .prefix(unique("idem-cancel"))
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    // Warm: the connection and the script are loaded.
    let warm = store.claim(key("warm"), Fingerprint::of(b"p")).await;
    let Ok(Claim::Claimed(warm)) = warm else {
        panic!("expected Claimed, got {warm:?}")
    };
    assert!(warm.abandon().await.unwrap());

    // Resumed before the connection's own response timeout (500 ms: the
    // late replies arrive) and after it (they never do).
    for pause in [Duration::from_millis(450), Duration::from_millis(1500)] {
        // The store's timeout fires while the server is frozen; the script
        // runs on resume.
        let timed_out = key(&unique("timed-out"));
        let paused = Instant::now();
        server.pause();
        let err = store
            .claim(timed_out.clone(), Fingerprint::of(b"p"))
            .await
            .unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        // The caller drops the claim future before the store's timeout.
        let dropped = key(&unique("dropped"));
        let cut = tokio::time::timeout(
            Duration::from_millis(50),
            store.claim(dropped.clone(), Fingerprint::of(b"p")),
        )
        .await;
        assert!(cut.is_err(), "the server is frozen: {cut:?}");
        tokio::time::sleep(pause.saturating_sub(paused.elapsed())).await;
        server.resume();

        claim_promptly(&store, &timed_out).await;
        claim_promptly(&store, &dropped).await;
    }
}
