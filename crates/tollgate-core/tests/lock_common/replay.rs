//! Release is idempotent per token (issue #16, defect 3): a release run again
//! after its reply was lost (the cluster client retries the script after a
//! dropped connection) reports "released", the truth, not "not held". A
//! token that never held the name, or whose lease expired and was taken,
//! still gets "not held". For locks and permits (plain, weighted, fair), on
//! every backend; instantiated with [`replay_suite!`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, ReleaseEvents};
use tollgate_core::{FencingToken, Keyspace, LockBackend, LockOptions, Locker, Subject};

use super::{prefix, Fixture};

/// A backend that sends every release twice and answers with the second
/// reply: what a client does that retries after the first reply was lost.
#[derive(Debug)]
pub(crate) struct Replaying(pub(crate) Arc<dyn LockBackend>);

impl LockBackend for Replaying {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        self.0.acquire_lock(request)
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        async move {
            // Applied, but its reply never reached the caller.
            let _lost = self.0.release_lock(keys, token).await?;
            self.0.release_lock(keys, token).await
        }
        .boxed()
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.0.extend_lock(keys, token, ttl)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.0.raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, tollgate_core::Result<ReleaseEvents>>> {
        self.0.release_events(channel_prefix)
    }

    fn permits_in_use<'a>(
        &'a self,
        keys: &'a LockKeys,
    ) -> BoxFuture<'a, tollgate_core::Result<u32>> {
        self.0.permits_in_use(keys)
    }

    fn local_lock(&self) -> std::sync::Arc<dyn LockBackend> {
        self.0.local_lock()
    }

    fn lock_kind(&self) -> &'static str {
        self.0.lock_kind()
    }
}

/// A 128-bit hex token made of one repeated digit.
pub(crate) fn token(c: char) -> String {
    c.to_string().repeat(32)
}

async fn acquired(backend: &dyn LockBackend, req: &AcquireRequest) -> FencingToken {
    match backend.acquire_lock(req).await.unwrap() {
        AcquireReply::Acquired { fence } => fence,
        held => panic!("not acquired: {held:?}"),
    }
}

async fn refused(backend: &dyn LockBackend, req: &AcquireRequest) {
    let reply = backend.acquire_lock(req).await.unwrap();
    assert!(
        matches!(reply, AcquireReply::Held { .. }),
        "acquired: {reply:?}"
    );
}

/// The keys of one name under a fresh prefix: a lock (`None`), or permits
/// `(limit, weight, fair)` taken `weight` at a time.
pub(crate) struct Name {
    keyspace: Keyspace,
    permits: Option<(u32, u32, bool)>,
}

impl Name {
    pub(crate) fn new(test: &str, permits: Option<(u32, u32, bool)>) -> Self {
        let policy = if permits.is_some() { "sem" } else { "lock" };
        Name {
            keyspace: Keyspace::new(prefix(test).as_str(), policy).unwrap(),
            permits,
        }
    }

    /// The keys of a holder of the usual weight.
    pub(crate) fn keys(&self) -> LockKeys {
        self.weighted(|(_, weight, _)| weight)
    }

    /// The keys of a holder that takes every permit (a lock: the same).
    pub(crate) fn whole(&self) -> LockKeys {
        self.weighted(|(limit, _, _)| limit)
    }

    fn weighted(&self, weight: impl Fn((u32, u32, bool)) -> u32) -> LockKeys {
        let subject = Subject::new("r");
        match self.permits {
            None => LockKeys::new(&self.keyspace, &subject),
            Some(p @ (limit, _, fair)) => {
                LockKeys::permits(&self.keyspace, &subject, limit, weight(p), fair)
            }
        }
    }
}

/// On the backend API, for one kind of name: a release replayed reports
/// released, as often as it comes, and leaves the next holder alone; a
/// wrong token, a token never used, an expired lease (taken over or not)
/// report not held.
pub(crate) async fn release_is_idempotent_per_token<F: Fixture>(
    f: &F,
    permits: Option<(u32, u32, bool)>,
) {
    let backend = f.backend().await;
    let b = &*backend;
    let name = Name::new("replay", permits);
    let keys = name.keys();
    let (ttl, fence_ttl) = (Duration::from_secs(30), Duration::from_secs(300));
    let req = |c: char, ttl: Duration| AcquireRequest::new(keys.clone(), token(c), ttl, fence_ttl);
    // A holder of the whole name (every permit).
    let fill = |c: char| AcquireRequest::new(name.whole(), token(c), ttl, fence_ttl);

    // Released, then replayed: released every time.
    let a = req('a', ttl);
    let first = acquired(b, &a).await;
    assert!(b.release_lock(&keys, &a.token).await.unwrap());
    for _ in 0..3 {
        assert!(
            b.release_lock(&keys, &a.token).await.unwrap(),
            "a replayed release reported not held"
        );
    }

    // Someone else took it since: the replay still says released, and
    // takes nothing from the new holder.
    let whole = fill('b');
    let second = acquired(b, &whole).await;
    assert!(second > first);
    assert!(b.release_lock(&keys, &a.token).await.unwrap());
    refused(b, &req('c', ttl)).await;

    // Tokens that never held it: not held, and the holder keeps it.
    for wrong in ['c', 'd'] {
        assert!(
            !b.release_lock(&whole.keys, &token(wrong)).await.unwrap(),
            "released with a token that never held it"
        );
    }
    refused(b, &req('c', ttl)).await;
    assert!(b.release_lock(&whole.keys, &whole.token).await.unwrap());
    assert!(b.release_lock(&whole.keys, &whole.token).await.unwrap());

    // A lease that expired: not held, whether or not it was taken since.
    let short = Duration::from_millis(100);
    let e = req('e', short);
    acquired(b, &e).await;
    tokio::time::sleep(short * 3).await;
    assert!(
        !b.release_lock(&keys, &e.token).await.unwrap(),
        "an expired lease reported released"
    );
    let g = req('f', short);
    acquired(b, &g).await;
    tokio::time::sleep(short * 3).await;
    let taker = fill('9');
    acquired(b, &taker).await;
    for _ in 0..2 {
        assert!(
            !b.release_lock(&keys, &g.token).await.unwrap(),
            "released someone else's lock"
        );
    }
    refused(b, &req('c', ttl)).await;
    assert!(b.release_lock(&taker.keys, &taker.token).await.unwrap());
    f.assert_no_immortal_keys();
}

/// Through a [`Locker`] whose releases are replayed (the cluster client's
/// retry): `release()` reports the lock was still ours, a waiter gets it at
/// once, and a lease that was lost still reports not held.
pub(crate) async fn lease_release_survives_a_replay<F: Fixture>(f: &F) {
    let prefix = prefix("replay-lease");
    let replaying = Locker::builder(Replaying(f.backend().await))
        .prefix(&prefix)
        .build()
        .unwrap();
    let other = f.builder().await.prefix(&prefix).build().unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = replaying.try_acquire("l", &opts).await.unwrap();
    let fence = lease.fence();
    assert!(
        lease.release().await.unwrap(),
        "the holder was told it had lost the lock"
    );
    let next = other.try_acquire("l", &opts).await.unwrap();
    assert!(next.fence() > fence);

    // A lease whose lock was taken away is still told so.
    let short = LockOptions::new()
        .ttl(Duration::from_millis(150))
        .renew(false);
    let lost = replaying.try_acquire("m", &short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taker = other.try_acquire("m", &opts).await.unwrap();
    assert!(
        !lost.release().await.unwrap(),
        "released someone else's lock"
    );
    assert!(taker.is_held() && next.is_held());
    assert!(taker.release().await.unwrap() && next.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// Instantiates the replay cases for a fixture expression.
#[macro_export]
macro_rules! replay_suite {
    ($fixture:expr) => {
        mod replay {
            use super::*;
            use $crate::lock_common::replay as r;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lock_release_is_idempotent_per_token() {
                r::release_is_idempotent_per_token(&$fixture, None).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn permit_release_is_idempotent_per_token() {
                r::release_is_idempotent_per_token(&$fixture, Some((3, 1, false))).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn weighted_permit_release_is_idempotent_per_token() {
                r::release_is_idempotent_per_token(&$fixture, Some((5, 2, false))).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fair_permit_release_is_idempotent_per_token() {
                r::release_is_idempotent_per_token(&$fixture, Some((1, 1, true))).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lease_release_survives_a_replay() {
                r::lease_release_survives_a_replay(&$fixture).await;
            }
        }
    };
}
