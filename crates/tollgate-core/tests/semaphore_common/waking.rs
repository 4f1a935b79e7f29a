//! Wake-ups of weighted waiters: a release serves a waiter the freed
//! permits fit, whatever else waits in the same process.

use std::time::Duration;

use tollgate_core::{LockOptions, Semaphore};

use super::{prefix, sem, SemFixture, Watched};

/// A weight-3 and then a weight-1 waiter of one process wait on a full
/// semaphore of 3; another process frees one permit. The weight-1 waiter
/// has it within 5 s, far below the 15 to 30 s of its fallback poll: the
/// wake-up reached a waiter that can use it, not only the weight-3 one
/// (which finds too few and sleeps on). The weight-3 waiter gets its three
/// once they are all free.
pub(crate) async fn a_light_waiter_is_woken_beside_a_heavy_one<F: SemFixture>(f: &F) {
    let prefix = prefix("wake-weighted");
    let holder = sem(f, &prefix, 3).await;
    let watched = Watched::new(f.backend().await);
    let waiters = Semaphore::builder(watched.clone(), 3)
        .prefix(&prefix)
        .poll_interval(Duration::from_secs(30))
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let wait = opts.clone().wait(Duration::from_secs(50));

    // A first wait starts the waiters' release subscription; with it up,
    // they sleep until a notification or the 30 s poll (without it they
    // would poll every 50 ms, and the test would prove nothing).
    let warm = waiters.acquire("warm", &wait).await.unwrap();
    watched.subscribed(1).await;
    assert!(warm.release().await.unwrap());

    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(holder.try_acquire("w", &opts).await.unwrap());
    }
    let heavy = tokio::spawn({
        let (waiters, wait) = (waiters.clone(), wait.clone());
        async move { waiters.acquire_weighted("w", 3, &wait).await }
    });
    // Refused once each, in this order: both wait, the heavy one first.
    watched.refused(1).await;
    let light = tokio::spawn({
        let (waiters, wait) = (waiters.clone(), wait.clone());
        async move { waiters.acquire("w", &wait).await }
    });
    watched.refused(2).await;

    let freed = held.pop().unwrap();
    let fence = freed.fence();
    assert!(freed.release().await.unwrap());
    let got = tokio::time::timeout(Duration::from_secs(5), light)
        .await
        .expect("the weight-1 waiter was not woken by the release of a permit it fits")
        .unwrap()
        .unwrap();
    assert!(got.fence() > fence);
    assert!(!heavy.is_finished(), "3 permits taken while 1 was free");
    assert_eq!(holder.in_use("w").await.unwrap(), 3);

    assert!(got.release().await.unwrap());
    for p in held {
        assert!(p.release().await.unwrap());
    }
    let all = tokio::time::timeout(Duration::from_secs(5), heavy)
        .await
        .expect("the weight-3 waiter was not woken when its permits came free")
        .unwrap()
        .unwrap();
    assert_eq!(holder.in_use("w").await.unwrap(), 3);
    assert!(all.release().await.unwrap());
    f.assert_no_immortal_keys();
}
