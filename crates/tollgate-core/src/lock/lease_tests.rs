//! Unit tests of `lease.rs`.

use super::*;
use crate::{Locker, MemoryBackend};

/// The cap a lease was given, measured from `before` the acquire call.
fn cap(lease: &Lease, before: Instant) -> Option<Duration> {
    lease
        .shared
        .hold_until
        .map(|until| until.saturating_duration_since(before))
}

#[tokio::test]
async fn leases_are_capped_by_default() {
    let locker = Locker::new(MemoryBackend::new());
    let slack = Duration::from_secs(1);
    let within = |got: Option<Duration>, want: Duration| {
        let got = got.expect("no hold cap");
        // Measured from before the acquire was sent, which is after
        // `before`.
        assert!(got >= want && got < want + slack, "{got:?} vs {want:?}");
    };

    let before = Instant::now();
    let lease = locker.try_acquire("a", &LockOptions::new()).await.unwrap();
    within(cap(&lease, before), Duration::from_secs(600));

    let before = Instant::now();
    let short = LockOptions::new().ttl(Duration::from_millis(50));
    let lease = locker.try_acquire("b", &short).await.unwrap();
    within(cap(&lease, before), Duration::from_secs(600));

    let before = Instant::now();
    let long = LockOptions::new().ttl(Duration::from_secs(3600));
    let lease = locker.try_acquire("c", &long).await.unwrap();
    within(cap(&lease, before), Duration::from_secs(20 * 3600));

    let unbounded = LockOptions::new().unbounded_hold();
    let lease = locker.try_acquire("d", &unbounded).await.unwrap();
    assert_eq!(lease.shared.hold_until, None);
}

/// Reaching the cap (here a short explicit one, the default works the
/// same) ends the lease while it is renewed and never released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_never_releases_is_cut_off_at_the_cap() {
    let locker = Locker::new(MemoryBackend::new());
    let opts = LockOptions::new()
        .ttl(Duration::from_millis(60))
        .max_hold(Duration::from_millis(300));
    let start = Instant::now();
    let lease = locker.try_acquire("never", &opts).await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("the cap never ended the lease");
    assert!(lease.is_lost());
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(2),
        "{took:?}"
    );
}
