//! A completion sent again after its reply was lost (the cluster client
//! retries a command whose connection broke) tells the truth: stored.
//! Before, the replay found the lease gone and answered "no longer ours",
//! as for a claim that really was lost. A complete with another fence, or
//! after another claim took the key, still answers `false` and changes
//! nothing. And a completion that fails (applied or not) is sent again by
//! the store, and never releases the claim of a handler that finished.
//! On memory, a standalone Redis and a cluster.

mod rate_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt};
use tollgate_core::idempotency::{
    Claim, ClaimReply, ClaimRequest, Claimed, Fingerprint, IdempotencyBackend, IdempotencyStore,
    RecordKeys, StoredResponse,
};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, ReleaseEvents};
use tollgate_core::{
    BackendError, FencingToken, LockBackend, LockOptions, MemoryBackend, RedisBackend, Result,
    Subject,
};
use tollgate_testkit::eventually;

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

// ---------------------------------------------------------------------------
// A completion that fails

/// How a [`Faulty`] backend's failing completes fail.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The script never ran: a reset connection, `READONLY` mid-failover.
    NotApplied,
    /// The script ran, its reply was lost.
    ReplyLost,
    /// The script ran, and its reply was lost after the lease's watchdog
    /// had tried a renewal (which finds the lease the script deleted).
    ReplyLostAfterRenewal,
}

/// A real backend whose first `failures` completes fail as an outage, as
/// `fault` says; everything else goes straight through.
#[derive(Clone, Debug)]
struct Faulty<B> {
    inner: B,
    fault: Fault,
    failures: Arc<AtomicUsize>,
    attempts: Arc<AtomicUsize>,
    extends: Arc<AtomicUsize>,
}

impl<B> Faulty<B> {
    fn new(inner: B, fault: Fault, failures: usize) -> Self {
        Faulty {
            inner,
            fault,
            failures: Arc::new(AtomicUsize::new(failures)),
            attempts: Arc::new(AtomicUsize::new(0)),
            extends: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }
}

impl<B: LockBackend> LockBackend for Faulty<B> {
    fn acquire_lock<'a>(&'a self, r: &'a AcquireRequest) -> BoxFuture<'a, Result<AcquireReply>> {
        self.inner.acquire_lock(r)
    }
    fn release_lock<'a>(&'a self, k: &'a LockKeys, t: &'a str) -> BoxFuture<'a, Result<bool>> {
        self.inner.release_lock(k, t)
    }
    fn extend_lock<'a>(
        &'a self,
        k: &'a LockKeys,
        t: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend_lock(k, t, ttl)
    }
    fn raise_fence<'a>(
        &'a self,
        k: &'a LockKeys,
        t: &'a str,
        f: FencingToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        self.inner.raise_fence(k, t, f, ttl)
    }
    fn release_events(&self, prefix: &str) -> Option<BoxFuture<'static, Result<ReleaseEvents>>> {
        self.inner.release_events(prefix)
    }
    fn local_lock(&self) -> Arc<dyn LockBackend> {
        self.inner.local_lock()
    }
    fn lock_kind(&self) -> &'static str {
        self.inner.lock_kind()
    }
}

impl<B: IdempotencyBackend> IdempotencyBackend for Faulty<B> {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<ClaimReply>> {
        self.inner.claim(request)
    }

    fn complete<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
        response: &'a StoredResponse,
        record_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        async move {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let fail = self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if !fail {
                return self
                    .inner
                    .complete(keys, token, fence, response, record_ttl)
                    .await;
            }
            if let Fault::ReplyLost | Fault::ReplyLostAfterRenewal = self.fault {
                self.inner
                    .complete(keys, token, fence, response, record_ttl)
                    .await?;
            }
            if let Fault::ReplyLostAfterRenewal = self.fault {
                let renewals = self.extends.load(Ordering::SeqCst);
                eventually(Duration::from_secs(5), "a renewal", || async {
                    (self.extends.load(Ordering::SeqCst) > renewals).then_some(())
                })
                .await;
            }
            Err(BackendError::outage("connection reset by peer").into())
        }
        .boxed()
    }

    fn abandon<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<bool>> {
        self.inner.abandon(keys, token, fence)
    }
}

async fn claimed(store: &IdempotencyStore, key: &Subject) -> Claimed {
    match store.claim(key.clone(), Fingerprint::of(b"payload")).await {
        Ok(Claim::Claimed(c)) => c,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// A completion that fails once (applied or not) is sent again and stores
/// the response: `complete` answers `true`, and the next claim replays it
/// instead of running the handler a second time.
async fn a_failed_completion_is_retried<B: IdempotencyBackend + Clone>(backend: B) {
    for fault in [Fault::NotApplied, Fault::ReplyLost] {
        let faulty = Faulty::new(backend.clone(), fault, 1);
        let store = IdempotencyStore::builder(faulty.clone())
            .prefix(prefix())
            .build()
            .unwrap();
        let key = Subject::new("order-1");
        let claim = claimed(&store, &key).await;
        let response = StoredResponse::new(201, vec![], b"done once".to_vec());
        let stored = claim.complete(&response).await;
        assert!(matches!(stored, Ok(true)), "{fault:?}: {stored:?}");
        assert_eq!(faulty.attempts(), 2, "{fault:?}");
        match store.claim(key, Fingerprint::of(b"payload")).await {
            Ok(Claim::Completed(r)) => assert_eq!(r, response, "{fault:?}"),
            other => panic!("{fault:?}: expected the stored response, got {other:?}"),
        }
    }
}

/// A completion that stored, but whose reply was lost after the lease's
/// watchdog found the lease gone (the script deletes it when it stores),
/// is sent again all the same and tells the truth: stored. The fenced
/// replay is safe whether or not the lease is still held.
async fn a_stored_completion_is_not_reported_failed<B: IdempotencyBackend + Clone>(backend: B) {
    let faulty = Faulty::new(backend, Fault::ReplyLostAfterRenewal, 1);
    let store = IdempotencyStore::builder(faulty.clone())
        .prefix(prefix())
        .timeout(Duration::from_secs(2))
        .lease(LockOptions::new().ttl(Duration::from_millis(600)))
        .build()
        .unwrap();
    let key = Subject::new("order-1");
    let claim = claimed(&store, &key).await;
    let response = StoredResponse::new(201, vec![], b"stored once".to_vec());
    let stored = claim.complete(&response).await;
    assert!(matches!(stored, Ok(true)), "stored, but told {stored:?}");
    assert_eq!(faulty.attempts(), 2);
    match store.claim(key, Fingerprint::of(b"payload")).await {
        Ok(Claim::Completed(r)) => assert_eq!(r, response),
        other => panic!("expected the stored response, got {other:?}"),
    }
}

/// A completion that keeps failing is retried until the lease's safe
/// deadline, then given up — and its claim is not released: the handler
/// finished, so a retry is told "in flight" until the lease expires, and
/// only then may it run again.
async fn an_unstored_completion_is_not_released<B: IdempotencyBackend + Clone>(backend: B) {
    let faulty = Faulty::new(backend, Fault::NotApplied, usize::MAX);
    let ttl = Duration::from_secs(2);
    let store = IdempotencyStore::builder(faulty.clone())
        .prefix(prefix())
        .lease(LockOptions::new().ttl(ttl))
        .build()
        .unwrap();
    let key = Subject::new("order-1");
    let claim = claimed(&store, &key).await;
    let start = Instant::now();
    let response = StoredResponse::new(201, vec![], b"never stored".to_vec());
    let err = claim.complete(&response).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(faulty.attempts() > 1, "never retried");
    assert!(start.elapsed() < ttl * 2, "retried {:?}", start.elapsed());
    match store.claim(key.clone(), Fingerprint::of(b"payload")).await {
        Ok(Claim::InFlight { .. }) => {}
        other => panic!("the unstored claim was released: {other:?}"),
    }
    let again = eventually(ttl * 5, "the lease's expiry", || async {
        match store.claim(key.clone(), Fingerprint::of(b"payload")).await {
            Ok(Claim::Claimed(c)) => Some(c),
            Ok(Claim::InFlight { .. }) => None,
            other => panic!("expected Claimed or InFlight, got {other:?}"),
        }
    })
    .await;
    assert!(again.abandon().await.unwrap());
}

/// A completion dropped before it was first polled (a `select!` whose
/// other branch was ready first, a task cancelled before it ran) does not
/// release the claim either: the handler has run, so a retry is told the
/// key is in flight rather than running it again.
#[tokio::test(flavor = "current_thread")]
async fn a_completion_dropped_unpolled_is_not_released() {
    let store = IdempotencyStore::builder(MemoryBackend::new())
        .prefix(prefix())
        .build()
        .unwrap();
    let key = Subject::new("order-1");
    let claim = claimed(&store, &key).await;
    let response = StoredResponse::new(201, vec![], b"ran once".to_vec());
    drop(claim.complete(&response));
    // Anything a drop spawned runs now (one thread: before this task).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    match store.claim(key, Fingerprint::of(b"payload")).await {
        Ok(Claim::InFlight { .. }) => {}
        other => panic!("the claim of a handler that ran was released: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_failed_completion() {
    a_failed_completion_is_retried(MemoryBackend::new()).await;
    a_stored_completion_is_not_reported_failed(MemoryBackend::new()).await;
    an_unstored_completion_is_not_released(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_failed_completion() {
    let backend = RedisBackend::from_connection(server().connection_manager().await);
    a_failed_completion_is_retried(backend.clone()).await;
    a_stored_completion_is_not_reported_failed(backend.clone()).await;
    an_unstored_completion_is_not_released(backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failed_completion() {
    let backend = RedisBackend::from_connection(cluster().connection().await);
    a_failed_completion_is_retried(backend.clone()).await;
    a_stored_completion_is_not_reported_failed(backend.clone()).await;
    an_unstored_completion_is_not_released(backend).await;
}
