//! A lease's life: release and drop, loss when the key goes, renewal and the
//! max-hold cap, an idempotent acquire, and durations beyond the limits.

use std::time::{Duration, Instant};

use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, MAX_LOCK_DURATION};
use tollgate_core::{Error, Keyspace, LockOptions, Subject};

use super::{prefix, Fixture};

/// Dropping a lease releases it: the next acquirer does not wait for the TTL.
pub(crate) async fn drop_releases<F: Fixture>(f: &F) {
    let prefix = prefix("drop");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let b = f.builder().await.prefix(&prefix).build().unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = a.try_acquire("d", &opts).await.unwrap();
    let lost = lease.lost();
    drop(lease);
    // The released lease's lost() resolves too (no select! ever hangs).
    tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .unwrap();
    let start = Instant::now();
    let next = b
        .acquire("d", &opts.clone().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(next.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// release → true and no longer held; a lease whose lock expired and was
/// taken → release false, the new holder is left alone.
pub(crate) async fn release_semantics<F: Fixture>(f: &F) {
    let prefix = prefix("release");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let b = f.builder().await.prefix(&prefix).build().unwrap();

    let lease = a.try_acquire("r", &LockOptions::new()).await.unwrap();
    assert!(lease.is_held());
    let lost = lease.lost();
    assert!(lease.release().await.unwrap());
    tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .unwrap();

    // Short TTL, no renewal: it expires and b takes it.
    let short = LockOptions::new()
        .ttl(Duration::from_millis(200))
        .renew(false);
    let old = a.try_acquire("r", &short).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), old.lost())
        .await
        .unwrap();
    assert!(old.is_lost() && !old.is_held());
    assert_eq!(old.remaining(), Duration::ZERO);
    let new = b
        .acquire("r", &LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(new.fence() > old.fence());
    assert!(!old.extend(Duration::from_secs(5)).await.unwrap());
    assert!(
        !old.release().await.unwrap(),
        "released someone else's lock"
    );
    assert!(new.is_held());
    assert!(matches!(
        a.try_acquire("r", &LockOptions::new()).await,
        Err(Error::Busy { .. })
    ));
    assert!(new.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// The key deleted behind the holder's back → lost at the next renewal.
pub(crate) async fn deleted_key_is_lost<F: Fixture>(f: &F) {
    let prefix = prefix("deleted");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let ttl = Duration::from_millis(900);
    let lease = a
        .try_acquire("k", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    f.delete_key(lease.key()).await;
    let deleted = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("lost() never resolved");
    assert!(lease.is_lost() && !lease.is_held());
    // The next renewal is at ttl/3; this bound only guards against hangs.
    assert!(deleted.elapsed() < ttl + Duration::from_secs(1));
    assert!(!lease.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// The watchdog keeps a short-TTL lease alive far beyond its TTL; the
/// max-hold cap ends it.
pub(crate) async fn renewal_and_cap<F: Fixture>(f: &F) {
    let prefix = prefix("renew");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let b = f.builder().await.prefix(&prefix).build().unwrap();
    let ttl = Duration::from_millis(300);
    let lease = a
        .try_acquire("w", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    tokio::time::sleep(ttl * 4).await;
    assert!(lease.is_held(), "renewal did not keep the lease");
    assert!(matches!(
        b.try_acquire("w", &LockOptions::new()).await,
        Err(Error::Busy { .. })
    ));
    assert!(lease.release().await.unwrap());

    let start = Instant::now();
    let capped = a
        .try_acquire(
            "w",
            &LockOptions::new()
                .ttl(ttl)
                .max_hold(Duration::from_millis(700)),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), capped.lost())
        .await
        .expect("the cap never ended the lease");
    assert!(capped.is_lost());
    // lost() fires at the cap minus the drift allowance; the bound here only
    // guards against a lease that outlives its cap by far.
    assert!(
        start.elapsed() < Duration::from_millis(700) + Duration::from_secs(1),
        "lost long after the cap: {:?}",
        start.elapsed()
    );
    let next = b
        .acquire("w", &LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(next.fence() > capped.fence());
    f.assert_no_immortal_keys();
}

/// The acquire operation is idempotent: the same request twice (a client
/// retrying after a connection error) finds its own lock and gets it, with
/// the same fence, instead of Busy; another token is still refused.
pub(crate) async fn acquire_is_idempotent<F: Fixture>(f: &F) {
    let prefix = prefix("idem");
    let backend = f.backend().await;
    let keys = LockKeys::new(
        &Keyspace::new(prefix.as_str(), "lock").unwrap(),
        &Subject::new("i"),
    );
    let ttl = Duration::from_secs(30);
    let request = AcquireRequest::new(keys.clone(), "a".repeat(32), ttl, ttl * 10);
    let first = backend.acquire_lock(&request).await.unwrap();
    let again = backend.acquire_lock(&request).await.unwrap();
    let AcquireReply::Acquired { fence } = first else {
        panic!("not acquired: {first:?}");
    };
    assert_eq!(again, AcquireReply::Acquired { fence });
    let other = AcquireRequest::new(keys.clone(), "b".repeat(32), ttl, ttl * 10);
    assert!(matches!(
        backend.acquire_lock(&other).await.unwrap(),
        AcquireReply::Held { pttl: Some(p) } if p > Duration::ZERO && p <= ttl
    ));
    assert!(backend.release_lock(&keys, &request.token).await.unwrap());
    // Released: the same token acquires afresh, with a higher fence.
    match backend.acquire_lock(&request).await.unwrap() {
        AcquireReply::Acquired { fence: next } => assert!(next > fence),
        held => panic!("not acquired: {held:?}"),
    }
    assert!(backend.release_lock(&keys, &request.token).await.unwrap());
    f.assert_no_immortal_keys();
}

/// TTLs, caps and extensions beyond MAX_LOCK_DURATION are configuration
/// errors before any round trip (not a panic in Instant arithmetic); an
/// endless wait bound waits, it does not panic.
pub(crate) async fn huge_durations_are_refused_not_panics<F: Fixture>(f: &F) {
    let prefix = prefix("huge");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let too_long = MAX_LOCK_DURATION + Duration::from_secs(1);
    for opts in [
        LockOptions::new().ttl(Duration::MAX),
        LockOptions::new().ttl(too_long),
        LockOptions::new().ttl(Duration::MAX).unbounded_hold(),
        LockOptions::new()
            .ttl(Duration::MAX)
            .max_hold(Duration::from_secs(1)),
        LockOptions::new().max_hold(Duration::MAX),
        LockOptions::new().max_hold(too_long),
    ] {
        for result in [
            a.try_acquire("h", &opts).await,
            a.acquire("h", &opts.clone().wait(Duration::from_secs(1)))
                .await,
        ] {
            assert!(
                matches!(result, Err(Error::InvalidConfig(_))),
                "{opts:?}: {result:?}"
            );
        }
        assert!(f
            .builder()
            .await
            .default_options(opts.clone())
            .build()
            .is_err());
    }
    assert!(f.builder().await.fence_ttl(Duration::MAX).build().is_err());

    // The longest accepted values work.
    let lease = a
        .try_acquire(
            "h",
            &LockOptions::new()
                .ttl(MAX_LOCK_DURATION)
                .max_hold(MAX_LOCK_DURATION),
        )
        .await
        .unwrap();
    assert!(lease.is_held());
    assert!(matches!(
        lease.extend(Duration::MAX).await,
        Err(Error::InvalidConfig(_))
    ));
    assert!(lease.extend(MAX_LOCK_DURATION).await.unwrap());
    assert!(lease.release().await.unwrap());

    // wait(Duration::MAX): waits forever — for a free lock, not at all.
    let forever = LockOptions::new().wait(Duration::MAX);
    let lease = a.acquire("h", &forever).await.unwrap();
    let b = f
        .builder()
        .await
        .prefix(&prefix)
        .poll_interval(Duration::MAX)
        .build()
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(300), b.acquire("h", &forever)).await;
    assert!(waited.is_err(), "{waited:?}");
    assert!(lease.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(5), b.acquire("h", &forever))
        .await
        .expect("the endless waiter did not get the free lock")
        .unwrap();
    assert!(next.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// A refusal hints how long holders of the name typically keep it (as this
/// locker saw them release it), not the holder's whole lease: a 30 s lease
/// for work that takes a few hundred milliseconds hints well under 30 s.
pub(crate) async fn busy_hints_the_typical_hold<F: Fixture>(f: &F) {
    let prefix = prefix("hint");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let unknown = |e: Error| match e {
        Error::Busy { retry_after, .. } => retry_after.expect("the holder's lease"),
        other => panic!("{other}"),
    };
    // Nothing seen yet: the holder's remaining lease.
    let first = a.try_acquire("h", &opts).await.unwrap();
    let hint = unknown(a.try_acquire("h", &opts).await.unwrap_err());
    assert!(hint > Duration::from_secs(20), "{hint:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.release().await.unwrap());
    // One hold of about 300 ms seen: the next refusal hints about that.
    let _second = a.try_acquire("h", &opts).await.unwrap();
    let hint = unknown(a.try_acquire("h", &opts).await.unwrap_err());
    assert!(
        hint >= Duration::from_millis(300) && hint < Duration::from_secs(10),
        "{hint:?}"
    );
}
