//! The lock behaviour suite on the memory backend, plus memory-only cases
//! (expiry by the backend's clock).

mod lock_common;

use std::sync::OnceLock;
use std::time::Duration;

use lock_common::Memory;
use tollgate_core::{Error, LockOptions, Locker, ManualClock, MemoryBackend};

fn memory() -> Memory {
    static M: OnceLock<MemoryBackend> = OnceLock::new();
    Memory(M.get_or_init(MemoryBackend::new).clone())
}

behaviour_suite!(memory(), 10_000);
replay_suite!(memory());

/// Expiry follows the backend's clock: once it passes the TTL, another
/// locker takes the lock and the holder's next renewal finds it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_by_the_backend_clock_is_loss() {
    let clock = ManualClock::starting_now();
    let backend = MemoryBackend::with_clock(clock.clone());
    let a = Locker::new(backend.clone());
    let b = Locker::new(backend.clone());
    let opts = LockOptions::new().ttl(Duration::from_millis(300));
    let lease = a.try_acquire("m", &opts).await.unwrap();
    assert!(matches!(
        b.try_acquire("m", &opts).await,
        Err(Error::Busy { .. })
    ));
    clock.advance(Duration::from_secs(1));
    let taken = b.try_acquire("m", &opts).await.unwrap();
    assert!(taken.fence() > lease.fence());
    tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .unwrap();
    assert!(lease.is_lost());
    assert!(taken.is_held());
    assert!(!lease.release().await.unwrap());
    assert!(taken.release().await.unwrap());
}

/// Fences stay strictly increasing even when the clock stands still.
#[tokio::test]
async fn fences_increase_with_a_frozen_clock() {
    let backend = MemoryBackend::with_clock(ManualClock::new(5));
    let locker = Locker::new(backend);
    let mut last = None;
    for _ in 0..100 {
        let lease = locker.try_acquire("f", &LockOptions::new()).await.unwrap();
        assert!(last < Some(lease.fence()));
        last = Some(lease.fence());
        lease.release().await.unwrap();
    }
    assert_eq!(last.unwrap().get(), 104);
}

/// TTLs the drift allowance would eat are refused up front (no underflow).
#[tokio::test]
async fn tiny_ttls_are_refused_not_underflowed() {
    let locker = Locker::new(MemoryBackend::new());
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(500),
        Duration::from_millis(2),
    ] {
        let err = locker
            .try_acquire("t", &LockOptions::new().ttl(ttl))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{ttl:?}: {err:?}");
    }
    let lease = locker
        .try_acquire(
            "t",
            &LockOptions::new()
                .ttl(Duration::from_millis(5))
                .renew(false),
        )
        .await
        .unwrap();
    assert!(lease.remaining() <= Duration::from_millis(5));
    assert!(Locker::builder(MemoryBackend::new())
        .drift(1.5, Duration::ZERO)
        .build()
        .is_err());
}

/// A lease dropped outside any runtime (after it ended) does not panic; its
/// lock simply expires.
#[test]
fn drop_without_a_runtime_is_harmless() {
    let backend = MemoryBackend::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let lease = rt.block_on(async {
        Locker::new(backend.clone())
            .try_acquire("nr", &LockOptions::new().ttl(Duration::from_millis(50)))
            .await
            .unwrap()
    });
    drop(rt);
    drop(lease);
}

/// A release is remembered for RELEASE_MARKER_TTL on the backend's clock: a
/// replay within it reports released, one after it not held (the marker is
/// gone, as its key expires on Redis), for locks and permits alike.
#[tokio::test]
async fn a_release_is_remembered_for_the_marker_ttl() {
    use lock_common::replay::{token, Name};
    use tollgate_core::lock::{AcquireReply, AcquireRequest, RELEASE_MARKER_TTL};
    use tollgate_core::LockBackend;

    let clock = ManualClock::starting_now();
    let backend = MemoryBackend::with_clock(clock.clone());
    for permits in [None, Some((2, 1, false)), Some((1, 1, true))] {
        let keys = Name::new("marker", permits).keys();
        let ttl = Duration::from_secs(30);
        let a = AcquireRequest::new(keys.clone(), token('a'), ttl, ttl * 10);
        let reply = backend.acquire_lock(&a).await.unwrap();
        assert!(matches!(reply, AcquireReply::Acquired { .. }), "{reply:?}");
        assert!(backend.release_lock(&keys, &a.token).await.unwrap());
        clock.advance(RELEASE_MARKER_TTL - Duration::from_millis(1));
        assert!(backend.release_lock(&keys, &a.token).await.unwrap());
        clock.advance(Duration::from_millis(2));
        assert!(!backend.release_lock(&keys, &a.token).await.unwrap());
    }
}

/// An extension to a short TTL whose reply comes after that TTL's safe
/// deadline never reports the lease held: by then it was lost (a lost
/// lease stays lost), so `extend` says `false` or fails, never `true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_answered_after_its_deadline_is_not_a_hold() {
    let locker = Locker::new(lock_common::Delayed {
        inner: std::sync::Arc::new(MemoryBackend::new()),
        acquire_reply: Duration::ZERO,
        extend_reply: Duration::from_millis(80),
        release_send: Duration::ZERO,
    });
    let opts = LockOptions::new().ttl(Duration::from_secs(10)).renew(false);
    let lease = locker.try_acquire("late", &opts).await.unwrap();
    let extended = lease.extend(Duration::from_millis(20)).await;
    assert!(!matches!(extended, Ok(true)), "{extended:?}");
    assert!(lease.is_lost());
}
