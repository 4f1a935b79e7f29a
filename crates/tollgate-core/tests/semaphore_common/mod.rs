//! The semaphore behaviour suite, generic over the lock suite's fixtures
//! (memory, standalone, cluster), instantiated by `semaphore.rs` with
//! `semaphore_suite!`. Fair order and queue cases are in [`fair`].
#![allow(dead_code, async_fn_in_trait)]

pub(crate) mod fair;
pub(crate) mod faults;
pub(crate) mod waking;

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt};
use tollgate_core::lock::{AcquireReply, AcquireRequest};
use tollgate_core::{Error, LockOptions, Semaphore, SemaphoreBuilder};

pub(crate) use crate::lock_common::{
    prefix, Acquirer, Cluster, Fixture, Memory, Standalone, Watched,
};

/// What the semaphore scenarios need beyond the lock suite's [`Fixture`]:
/// a look at the raw keys, where the backend allows it.
pub(crate) trait SemFixture: Fixture {
    /// `ZCARD key`; `None` when the backend cannot be inspected (memory).
    async fn zcard(&self, key: &str) -> Option<u64>;
    /// Deletes `key` behind every holder's back; `false` when the backend
    /// cannot (memory: the scenarios use its clock instead).
    async fn del(&self, key: &str) -> bool;
}

impl SemFixture for Memory {
    async fn zcard(&self, _key: &str) -> Option<u64> {
        None
    }
    async fn del(&self, _key: &str) -> bool {
        false
    }
}

async fn zcard_over(con: &mut impl redis::aio::ConnectionLike, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query_async(con).await.unwrap()
}

async fn del_over(con: &mut impl redis::aio::ConnectionLike, key: &str) -> bool {
    let n: i64 = redis::cmd("DEL").arg(key).query_async(con).await.unwrap();
    assert_eq!(n, 1, "no key {key}");
    true
}

impl SemFixture for Standalone {
    async fn zcard(&self, key: &str) -> Option<u64> {
        Some(zcard_over(&mut self.0.multiplexed().await, key).await)
    }
    async fn del(&self, key: &str) -> bool {
        del_over(&mut self.0.multiplexed().await, key).await
    }
}

impl SemFixture for Cluster {
    async fn zcard(&self, key: &str) -> Option<u64> {
        Some(zcard_over(&mut self.0.connection().await, key).await)
    }
    async fn del(&self, key: &str) -> bool {
        del_over(&mut self.0.connection().await, key).await
    }
}

impl Acquirer for Semaphore {
    fn acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<tollgate_core::Lease>> {
        self.acquire(name, opts).boxed()
    }
    fn try_acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<tollgate_core::Lease>> {
        self.try_acquire(name, opts).boxed()
    }
}

/// A semaphore builder over a fresh connection, with `prefix`.
pub(crate) async fn builder<F: Fixture>(f: &F, prefix: &str, permits: u32) -> SemaphoreBuilder {
    Semaphore::builder(f.backend().await, permits).prefix(prefix)
}

/// A semaphore of `permits` over a fresh connection, with `prefix`.
pub(crate) async fn sem<F: Fixture>(f: &F, prefix: &str, permits: u32) -> Semaphore {
    builder(f, prefix, permits).await.build().unwrap()
}

/// Polls `check` every 10 ms until it is true; panics after 5 s with `what`.
pub(crate) async fn eventually<Fut: Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> Fut,
) {
    let until = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(Instant::now() < until, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) fn busy_after(r: tollgate_core::Result<tollgate_core::Lease>) -> Option<Duration> {
    match r {
        Err(Error::Busy { retry_after, .. }) => retry_after,
        other => panic!("expected Busy, got {other:?}"),
    }
}

/// 3 permits, 4 semaphores on separate connections, `tasks` tasks and
/// `total` acquisitions with a wait: the holders inside (counted outside
/// tollgate) never exceed 3 and do reach 3; every fence is unique.
pub(crate) async fn bound_under_contention<F: SemFixture>(
    f: &F,
    fair: bool,
    tasks: usize,
    total: usize,
) {
    let prefix = prefix(if fair { "bound-fair" } else { "bound" });
    let mut sems = Vec::new();
    for _ in 0..4 {
        let b = builder(f, &prefix, 3).await;
        sems.push(if fair { b.fair() } else { b }.build().unwrap());
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let sem = sems[t % sems.len()].clone();
        let (inside, most, next, fences, opts) = (
            inside.clone(),
            most.clone(),
            next.clone(),
            fences.clone(),
            opts.clone(),
        );
        handles.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let permit = sem.acquire("pool", &opts).await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= 3, "{now} holders of 3 permits");
                most.fetch_max(now, Ordering::SeqCst);
                fences.lock().unwrap().push(permit.fence());
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(permit.release().await.unwrap());
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    eprintln!(
        "bound (fair: {fair}): {total} acquisitions, {tasks} tasks in {:?}",
        started.elapsed()
    );
    assert_eq!(most.load(Ordering::SeqCst), 3, "never 3 holders at once");
    {
        let fences = fences.lock().unwrap();
        assert_eq!(fences.len(), total);
        let unique = fences.iter().collect::<HashSet<_>>().len();
        assert_eq!(unique, total, "a fence repeated");
    }
    assert_eq!(sems[0].in_use("pool").await.unwrap(), 0);
    f.assert_no_immortal_keys();
}

/// try_acquire refuses when full (Busy with the time to the earliest
/// expiry), names are independent, counts follow, release frees, a second
/// release of a token (a replay) reports released again and frees nothing
/// more, another token's is refused, drop releases, an expired permit's
/// release is false and leaves the others alone, a retried acquire (same
/// token) counts once.
pub(crate) async fn try_acquire_and_release<F: SemFixture>(f: &F) {
    let prefix = prefix("try");
    let a = sem(f, &prefix, 3).await;
    let b = sem(f, &prefix, 3).await;
    assert_eq!((a.permits(), a.is_fair()), (3, false));
    let ttl = Duration::from_secs(30);
    let opts = LockOptions::new().ttl(ttl);
    let p1 = a.try_acquire("t", &opts).await.unwrap();
    let p2 = b.try_acquire("t", &opts).await.unwrap();
    let p3 = a.try_acquire("t", &opts).await.unwrap();
    assert!(p1.fence() < p2.fence() && p2.fence() < p3.fence());
    assert!(p1.is_held() && p2.is_held() && p3.is_held());
    assert_eq!(a.in_use("t").await.unwrap(), 3);
    assert_eq!(b.available("t").await.unwrap(), 0);
    let r = busy_after(b.try_acquire("t", &opts).await).expect("a retry hint");
    assert!(r > Duration::ZERO && r <= ttl, "{r:?}");
    // A wait that ends without a permit is Busy too.
    busy_after(
        b.acquire("t", &opts.clone().wait(Duration::from_millis(200)))
            .await,
    );

    // Another name has its own permits.
    let other = b.try_acquire("u", &opts).await.unwrap();
    assert_eq!(a.in_use("u").await.unwrap(), 1);
    assert_eq!(a.available("u").await.unwrap(), 2);
    assert_eq!(a.in_use("t").await.unwrap(), 3);
    assert!(other.release().await.unwrap());
    assert_eq!(a.in_use("u").await.unwrap(), 0);

    // Release frees one; the next holder gets a higher fence.
    assert!(p2.release().await.unwrap());
    assert_eq!(a.in_use("t").await.unwrap(), 2);
    assert_eq!(a.available("t").await.unwrap(), 1);
    let p4 = b.try_acquire("t", &opts).await.unwrap();
    assert!(p4.fence() > p3.fence());

    // Drop releases (in the background): a waiter gets it long before the
    // 30 s TTL could have freed it.
    drop(p1);
    let p5 = b
        .acquire("t", &opts.clone().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(p5.fence() > p4.fence());
    for p in [p3, p4, p5] {
        assert!(p.release().await.unwrap());
    }
    assert_eq!(a.in_use("t").await.unwrap(), 0);

    // The storage: a second release of one token (a replay after a lost
    // reply) reports released and frees nothing more; a token that never
    // held any is refused; a retried acquire (the same token) is granted
    // again and counted once.
    let backend = f.backend().await;
    let keys = a.keys_for("raw");
    let token = "a".repeat(32);
    let req = AcquireRequest::new(keys.clone(), token.clone(), ttl, ttl * 10);
    let AcquireReply::Acquired { fence } = backend.acquire_lock(&req).await.unwrap() else {
        panic!("not acquired");
    };
    let AcquireReply::Acquired { fence: again } = backend.acquire_lock(&req).await.unwrap() else {
        panic!("the retry was refused");
    };
    assert!(again > fence);
    assert_eq!(a.in_use("raw").await.unwrap(), 1);
    let other = b.try_acquire("raw", &opts).await.unwrap();
    assert!(backend.release_lock(&keys, &token).await.unwrap());
    assert_eq!(a.in_use("raw").await.unwrap(), 1);
    assert!(
        backend.release_lock(&keys, &token).await.unwrap(),
        "a replayed release reported not held"
    );
    assert!(!backend.release_lock(&keys, &"b".repeat(32)).await.unwrap());
    assert_eq!(a.in_use("raw").await.unwrap(), 1, "a replay freed another");
    assert!(other.release().await.unwrap());
    assert_eq!(a.in_use("raw").await.unwrap(), 0);

    // An expired permit: release is false, the holder after it keeps its own.
    let short = LockOptions::new()
        .ttl(Duration::from_millis(200))
        .renew(false);
    let gone = a.try_acquire_weighted("e", 3, &short).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), gone.lost())
        .await
        .unwrap();
    let now = b
        .acquire("e", &opts.clone().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(
        !gone.release().await.unwrap(),
        "released someone else's permit"
    );
    assert_eq!(a.in_use("e").await.unwrap(), 1);
    assert!(now.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// Weighted: 8 of 10, then 3 refused and 2 granted; a waiter for 3 is not
/// served by 2 free permits, only when enough are; 11 can never be granted
/// and 0 is not a weight.
pub(crate) async fn weighted<F: SemFixture>(f: &F) {
    let prefix = prefix("weighted");
    let a = sem(f, &prefix, 10).await;
    let watched = Watched::new(f.backend().await);
    let b = Semaphore::builder(watched.clone(), 10)
        .prefix(&prefix)
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let big = a.try_acquire_weighted("w", 8, &opts).await.unwrap();
    assert_eq!(b.in_use("w").await.unwrap(), 8);
    let r = busy_after(b.try_acquire_weighted("w", 3, &opts).await).expect("a retry hint");
    assert!(r > Duration::ZERO && r <= Duration::from_secs(30), "{r:?}");
    let small = b.try_acquire_weighted("w", 2, &opts).await.unwrap();
    assert!(small.fence() > big.fence());
    assert_eq!(a.in_use("w").await.unwrap(), 10);
    busy_after(b.try_acquire("w", &opts).await);

    for k in [11, 12, u32::MAX] {
        match b.try_acquire_weighted("w", k, &opts).await {
            Err(Error::PermitsExceedLimit { requested, limit }) => {
                assert_eq!((requested, limit), (k, 10));
            }
            other => panic!("weight {k}: {other:?}"),
        }
    }
    let waited = b
        .acquire_weighted("w", 11, &opts.clone().wait(Duration::from_secs(10)))
        .await;
    assert!(
        matches!(waited, Err(Error::PermitsExceedLimit { .. })),
        "{waited:?}"
    );
    for r in [
        b.try_acquire_weighted("w", 0, &opts).await,
        b.acquire_weighted("w", 0, &opts.clone().wait(Duration::from_secs(1)))
            .await,
    ] {
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    }

    // All or nothing while waiting: 2 free permits do not serve a 3. The
    // waiter is refused with none free, so waits; the release (of b's own
    // permits) wakes it, and its next attempt, with 2 free, is refused too.
    let before = watched.refusals();
    let waiter = tokio::spawn({
        let b = b.clone();
        let opts = opts.clone().wait(Duration::from_secs(10));
        async move { b.acquire_weighted("w", 3, &opts).await }
    });
    watched.refused(before + 1).await;
    assert!(small.release().await.unwrap());
    watched.refused(before + 2).await;
    assert!(!waiter.is_finished(), "3 permits granted with 2 free");
    assert_eq!(a.in_use("w").await.unwrap(), 8);
    assert!(big.release().await.unwrap());
    let three = waiter.await.unwrap().unwrap();
    assert_eq!(a.in_use("w").await.unwrap(), 3);
    // The whole weight can be taken by one holder.
    let seven = a.try_acquire_weighted("w", 7, &opts).await.unwrap();
    assert_eq!(a.available("w").await.unwrap(), 0);
    assert!(three.release().await.unwrap());
    assert!(seven.release().await.unwrap());
    let all = a.try_acquire_weighted("w", 10, &opts).await.unwrap();
    assert!(all.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// Holders that die (never released, never renewed) free their permits
/// when their TTL passes: nobody releases them.
pub(crate) async fn dead_holder_frees_by_ttl<F: SemFixture>(f: &F) {
    let prefix = prefix("dead");
    let a = sem(f, &prefix, 2).await;
    let b = sem(f, &prefix, 2).await;
    let ttl = Duration::from_millis(400);
    let dying = LockOptions::new().ttl(ttl).renew(false);
    for _ in 0..2 {
        std::mem::forget(a.try_acquire("d", &dying).await.unwrap());
    }
    assert_eq!(b.in_use("d").await.unwrap(), 2);
    let r = busy_after(b.try_acquire("d", &dying).await).expect("a retry hint");
    assert!(r <= ttl, "{r:?}");
    let live = LockOptions::new().ttl(Duration::from_secs(10));
    let p = b
        .acquire("d", &live.clone().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    // Both dead permits are gone, not just one.
    eventually("the second dead permit expires", || async {
        b.in_use("d").await.unwrap() == 1
    })
    .await;
    let q = b.try_acquire("d", &live).await.unwrap();
    assert!(p.release().await.unwrap() && q.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// A waiter wakes on the release notification: its fallback poll (30 to
/// 60 s away) is far beyond the 5 s we give it, so only a notification can
/// hand it the permit in time. (Its wait bound is long: a waiter makes a
/// last attempt when its bound runs out, which would take a free permit.)
pub(crate) async fn waiter_wakes_on_release<F: SemFixture>(f: &F, fair: bool) {
    let prefix = prefix(if fair { "wake-fair" } else { "wake" });
    let fairly = |b: SemaphoreBuilder| if fair { b.fair() } else { b };
    let holder = fairly(builder(f, &prefix, 2).await).build().unwrap();
    let watched = Watched::new(f.backend().await);
    let waiter = fairly(Semaphore::builder(watched.clone(), 2).prefix(&prefix))
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let p1 = holder.try_acquire("w", &opts).await.unwrap();
    let p2 = holder.try_acquire("w", &opts).await.unwrap();
    let wait = tokio::spawn({
        let opts = opts.clone().wait(Duration::from_secs(50));
        async move { waiter.acquire("w", &opts).await }
    });
    // Refused once, it waits.
    watched.refused(1).await;
    assert!(!wait.is_finished(), "took a permit while none was free");
    let fence = p2.fence();
    assert!(p2.release().await.unwrap());
    // Woken, it has the permit within milliseconds; polling, not for 30 s.
    let got = tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("not woken by the release")
        .unwrap()
        .unwrap();
    assert!(got.fence() > fence);
    assert_eq!(holder.in_use("w").await.unwrap(), 2);
    assert!(got.release().await.unwrap() && p1.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// The watchdog keeps permits (weighted too) past several TTLs; permits
/// removed behind the holder's back are reported by lost().
pub(crate) async fn renewal_and_loss<F: SemFixture>(f: &F) {
    let prefix = prefix("renew");
    let a = sem(f, &prefix, 3).await;
    let b = sem(f, &prefix, 3).await;
    let ttl = Duration::from_millis(300);
    let opts = LockOptions::new().ttl(ttl);
    let one = a.try_acquire("r", &opts).await.unwrap();
    let two = a.try_acquire_weighted("r", 2, &opts).await.unwrap();
    tokio::time::sleep(ttl * 4).await;
    assert!(
        one.is_held() && two.is_held(),
        "renewal did not keep the permits"
    );
    // Still held on the backend (an unrenewed permit would have expired).
    assert_eq!(b.in_use("r").await.unwrap(), 3);
    busy_after(b.try_acquire("r", &opts).await);

    if f.del(&a.keys_for("r").lock).await {
        let deleted = Instant::now();
        for p in [&one, &two] {
            tokio::time::timeout(Duration::from_secs(5), p.lost())
                .await
                .expect("lost() never resolved");
            assert!(p.is_lost() && !p.is_held());
        }
        // The next renewal is at ttl/3; this bound only guards against hangs.
        assert!(deleted.elapsed() < ttl + Duration::from_secs(1));
        assert_eq!(b.in_use("r").await.unwrap(), 0);
        assert!(!one.release().await.unwrap());
        assert!(!two.release().await.unwrap());
    } else {
        // Memory: the permits cannot be deleted; expiry by the backend's
        // clock is covered by memory_clock_expiry_is_loss.
        assert!(one.release().await.unwrap() && two.release().await.unwrap());
    }
    f.assert_no_immortal_keys();
}

/// A fair and an unfair locker on one name fail with an error (the storage
/// types differ) rather than both holding.
pub(crate) async fn fair_and_unfair_do_not_mix<F: SemFixture>(f: &F) {
    let prefix = prefix("mix");
    let fair = f.builder().await.prefix(&prefix).fair().build().unwrap();
    let plain = f.builder().await.prefix(&prefix).build().unwrap();
    assert!(fair.is_fair() && !plain.is_fair());
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let waiting = opts.clone().wait(Duration::from_millis(500));
    let check = |r: tollgate_core::Result<tollgate_core::Lease>| match r {
        Ok(_) => panic!("both a fair and an unfair locker hold the name"),
        Err(Error::Busy { .. }) => panic!("Busy, not an error: the mix is not reported"),
        Err(_) => {}
    };

    let held = fair.try_acquire("m", &opts).await.unwrap();
    check(plain.try_acquire("m", &opts).await);
    check(plain.acquire("m", &waiting).await);
    assert!(held.is_held());
    assert!(held.release().await.unwrap());

    let held = plain.try_acquire("m", &opts).await.unwrap();
    check(fair.try_acquire("m", &opts).await);
    check(fair.acquire("m", &waiting).await);
    assert!(held.release().await.unwrap());

    // A Semaphore and a Locker never share keys (policy `sem` vs `lock`).
    let s = sem(f, &prefix, 1).await;
    let lock = plain.try_acquire("m", &opts).await.unwrap();
    let permit = s.try_acquire("m", &opts).await.unwrap();
    assert_ne!(lock.key(), permit.key());
    assert!(lock.release().await.unwrap() && permit.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// The mix is refused only while the other kind's holder lives: once a
/// holder that never released (it crashed) has expired, the name is free
/// for either kind, as on Redis, where its key is gone.
pub(crate) async fn fair_and_unfair_after_expiry<F: SemFixture>(f: &F) {
    let prefix = prefix("mix-expired");
    let fair = f.builder().await.prefix(&prefix).fair().build().unwrap();
    let plain = f.builder().await.prefix(&prefix).build().unwrap();
    let crashed = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .renew(false);
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    for (first, second) in [(&fair, &plain), (&plain, &fair)] {
        let stale = first.try_acquire("x", &crashed).await.unwrap();
        eventually("the other kind takes the name after the expiry", || async {
            match second.try_acquire("x", &opts).await {
                Ok(lease) => {
                    assert!(lease.release().await.unwrap());
                    true
                }
                Err(Error::Busy { .. }) => panic!("Busy, not an error: the mix is not reported"),
                Err(_) => false,
            }
        })
        .await;
        // It expired: dropping it releases nothing.
        drop(stale);
    }
    f.assert_no_immortal_keys();
}
