//! Waiting and hand-off: a release wakes its waiter, the wait bound holds,
//! and an acquire or release dropped mid-flight leaves no lock behind.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tollgate_core::{Error, FencingToken, Lease, LockOptions, Locker};

use super::{prefix, Acquirer, Delayed, Fixture, Watched};

/// Releases `lease` once its waiter (`wait`, which reports when it got the
/// lock and the lease's fence, over `watched`) has been refused once, so it
/// waits: the waiter gets the lock only after the release, within 2 s of it
/// (long before its fallback poll), with a higher fence.
pub(crate) async fn release_wakes_waiter(
    lease: Lease,
    watched: &Watched,
    wait: JoinHandle<(Instant, FencingToken)>,
) {
    watched.refused(1).await;
    assert!(
        !wait.is_finished(),
        "the waiter got the lock while it was held"
    );
    let fence = lease.fence();
    let released = Instant::now();
    assert!(lease.release().await.unwrap());
    let (woke, next) = wait.await.unwrap();
    assert!(
        woke >= released,
        "the waiter got the lock while it was held"
    );
    let took = woke.duration_since(released);
    assert!(
        took < Duration::from_secs(2),
        "the waiter took {took:?} after the release"
    );
    assert!(next > fence);
}

/// A waiter wakes on the release notification, long before its fallback poll
/// (here at least 5 s) would.
pub(crate) async fn waiter_wakes_on_release<F: Fixture>(f: &F) {
    let prefix = prefix("wake");
    let holder = f.builder().await.prefix(&prefix).build().unwrap();
    let watched = Watched::new(f.backend().await);
    let waiter = Locker::builder(watched.clone())
        .prefix(&prefix)
        .poll_interval(Duration::from_secs(10))
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = holder.try_acquire("job", &opts).await.unwrap();
    let wait = tokio::spawn({
        let waiter = waiter.clone();
        let opts = opts.clone().wait(Duration::from_secs(20));
        async move {
            let lease = waiter.acquire("job", &opts).await.unwrap();
            (Instant::now(), lease.fence())
        }
    });
    release_wakes_waiter(lease, &watched, wait).await;
    f.assert_no_immortal_keys();
}

/// `acquire` gives up with Busy once its bound passes, and `try_acquire`
/// never waits.
pub(crate) async fn wait_bound_is_honoured<F: Fixture>(f: &F) {
    let prefix = prefix("bound");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let b = f.builder().await.prefix(&prefix).build().unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let _held = a.try_acquire("x", &opts).await.unwrap();

    let start = Instant::now();
    let err = b
        .acquire("x", &opts.clone().wait(Duration::from_millis(400)))
        .await
        .unwrap_err();
    let took = start.elapsed();
    match err {
        Error::Busy { name, retry_after } => {
            assert_eq!(name, "x");
            let r = retry_after.expect("the holder's TTL");
            assert!(r > Duration::ZERO && r <= Duration::from_secs(30), "{r:?}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(400),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "overslept: {took:?}");

    let start = Instant::now();
    let err = b
        .try_acquire("x", &opts.clone().wait(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }));
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// Tries `try_acquire(name)` on `locker` every 20 ms for up to `within`;
/// panics with the time it took otherwise.
pub(crate) async fn acquire_within<L: Acquirer>(
    locker: &L,
    name: &str,
    opts: &LockOptions,
    within: Duration,
) -> Lease {
    let start = Instant::now();
    loop {
        match locker.try_acquire_boxed(name, opts).await {
            Ok(lease) => return lease,
            Err(Error::Busy { .. }) if start.elapsed() < within => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("still not acquired after {:?}: {e:?}", start.elapsed()),
        }
    }
}

/// An acquire dropped after its request reached the backend but before the
/// reply came back (a `timeout`, a client that went away while middleware
/// waited) leaves no lock behind: the attempt completes in its own task and
/// releases what it got, long before the 30 s TTL.
pub(crate) async fn dropped_acquire_leaves_no_lock<F: Fixture>(f: &F) {
    let prefix = prefix("dropacq");
    let slow = Locker::builder(Delayed {
        inner: f.backend().await,
        acquire_reply: Duration::from_millis(200),
        extend_reply: Duration::ZERO,
        release_send: Duration::ZERO,
    })
    .prefix(&prefix)
    .build()
    .unwrap();
    let other = f.builder().await.prefix(&prefix).build().unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));

    for waiting in [false, true] {
        let call = async {
            if waiting {
                slow.acquire("a", &opts.clone().wait(Duration::from_secs(10)))
                    .await
            } else {
                slow.try_acquire("a", &opts).await
            }
        };
        let dropped = tokio::time::timeout(Duration::from_millis(50), call).await;
        assert!(dropped.is_err(), "the delayed acquire finished early");
        let start = Instant::now();
        let lease = acquire_within(&other, "a", &opts, Duration::from_secs(3)).await;
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(lease.release().await.unwrap());
    }
    f.assert_no_immortal_keys();
}

/// A release dropped before its round trip completed still releases the
/// lock (renewal has stopped, so it would otherwise block everyone until its
/// TTL).
pub(crate) async fn dropped_release_still_releases<F: Fixture>(f: &F) {
    let prefix = prefix("droprel");
    let slow = Locker::builder(Delayed {
        inner: f.backend().await,
        acquire_reply: Duration::ZERO,
        extend_reply: Duration::ZERO,
        release_send: Duration::from_millis(200),
    })
    .prefix(&prefix)
    .build()
    .unwrap();
    let other = f.builder().await.prefix(&prefix).build().unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = slow.try_acquire("r", &opts).await.unwrap();
    let lost = lease.lost();
    let dropped = tokio::time::timeout(Duration::from_millis(50), lease.release()).await;
    assert!(dropped.is_err(), "the delayed release finished early");
    lost.await;
    let next = acquire_within(&other, "r", &opts, Duration::from_secs(3)).await;
    assert!(next.release().await.unwrap());
    f.assert_no_immortal_keys();
}
