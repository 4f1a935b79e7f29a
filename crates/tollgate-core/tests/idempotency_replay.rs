//! A completion sent again after its reply was lost (the cluster client
//! retries a command whose connection broke) tells the truth: stored.
//! Before, the replay found the lease gone and answered "no longer ours",
//! as for a claim that really was lost. A complete with another fence, or
//! after another claim took the key, still answers `false` and changes
//! nothing. On memory, a standalone Redis and a cluster.

mod rate_common;

use std::time::Duration;

use tollgate_core::idempotency::{
    ClaimReply, ClaimRequest, Fingerprint, IdempotencyBackend, IdempotencyStore, StoredResponse,
};
use tollgate_core::{FencingToken, MemoryBackend, RedisBackend, Subject};

use rate_common::*;

const TTL: Duration = Duration::from_secs(30);

async fn claim<B: IdempotencyBackend + Clone>(
    backend: &B,
    store: &IdempotencyStore,
    key: &Subject,
    token: &str,
) -> ClaimReply {
    let request = ClaimRequest::new(
        store.keys_for(key),
        token.to_owned(),
        TTL,
        Duration::from_secs(120),
        Duration::from_secs(600),
        Fingerprint::of(b"payload"),
    );
    backend.claim(&request).await.unwrap()
}

async fn replays<B: IdempotencyBackend + Clone>(backend: B) {
    let store = IdempotencyStore::builder(backend.clone())
        .prefix(prefix())
        .build()
        .unwrap();
    let key = Subject::new("order-1");
    let keys = store.keys_for(&key);
    let ClaimReply::Claimed { fence } = claim(&backend, &store, &key, "first").await else {
        panic!("a fresh key is claimed");
    };
    let response = StoredResponse::new(201, vec![], b"done".to_vec());
    let complete = |token: &'static str, fence: FencingToken| {
        let (backend, keys, response) = (backend.clone(), keys.clone(), response.clone());
        async move {
            backend
                .complete(&keys, token, fence, &response, Duration::from_secs(600))
                .await
                .unwrap()
        }
    };
    assert!(complete("first", fence).await, "stored");
    assert!(complete("first", fence).await, "the replay says stored too");
    // Another claim's fence, or another token with a wrong fence: no.
    let other = FencingToken(fence.get() + 1);
    assert!(!complete("first", other).await);
    assert!(!complete("someone", other).await);
    // The stored response is the first one, and stays.
    match claim(&backend, &store, &key, "later").await {
        ClaimReply::Completed { response: r, .. } => assert_eq!(r, response),
        other => panic!("{other:?}"),
    }

    // A claim whose lease was lost and taken over: its complete is refused,
    // replayed or not, and the newer claim's record is left alone.
    let key = Subject::new("order-2");
    let keys2 = store.keys_for(&key);
    let ClaimReply::Claimed { fence: old } = claim(&backend, &store, &key, "old").await else {
        panic!("claimed");
    };
    assert!(backend.release_lock(&keys2.lease, "old").await.unwrap());
    let ClaimReply::Claimed { fence: new } = claim(&backend, &store, &key, "new").await else {
        panic!("claimed after the loss");
    };
    assert!(new > old);
    for _ in 0..2 {
        let stale = backend
            .complete(&keys2, "old", old, &response, Duration::from_secs(600))
            .await
            .unwrap();
        assert!(!stale, "a lost claim stores nothing");
    }
    assert!(matches!(
        claim(&backend, &store, &key, "third").await,
        ClaimReply::InFlight { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    replays(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone() {
    replays(RedisBackend::from_connection(
        server().connection_manager().await,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_backend() {
    replays(RedisBackend::from_connection(cluster().connection().await)).await;
}
