//! Fair order: arrival order, waiters that give up or are aborted leave the
//! queue at once, a dead waiter blocks it only until its ticket expires, a
//! try does not jump the queue, a lost notification costs one poll.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, DEFAULT_POLL_INTERVAL};
use tollgate_core::{Error, Lease, LockOptions, Locker, Semaphore};

use super::{busy_after, eventually, prefix, Acquirer, Fixture, SemFixture, Watched};
use crate::lock_common::memory_queue_len;

/// A fair semaphore of 1 or a fair [`Locker`]: the same queue.
pub(crate) trait FairAcquirer: Acquirer + Sized {
    async fn build<F: Fixture>(f: &F, prefix: &str, poll: Duration) -> Self;
    fn keys(&self, name: &str) -> LockKeys;
}

impl FairAcquirer for Semaphore {
    async fn build<F: Fixture>(f: &F, prefix: &str, poll: Duration) -> Self {
        let s = super::builder(f, prefix, 1)
            .await
            .poll_interval(poll)
            .fair()
            .build()
            .unwrap();
        assert!(s.is_fair());
        s
    }
    fn keys(&self, name: &str) -> LockKeys {
        self.keys_for(name)
    }
}

impl FairAcquirer for Locker {
    async fn build<F: Fixture>(f: &F, prefix: &str, poll: Duration) -> Self {
        let l = f
            .builder()
            .await
            .prefix(prefix)
            .poll_interval(poll)
            .fair()
            .build()
            .unwrap();
        assert!(l.is_fair());
        l
    }
    fn keys(&self, name: &str) -> LockKeys {
        self.keys_for(name)
    }
}

/// Waits until `n` waiters are queued on `keys`: by the queue's ZCARD on
/// Redis; on memory (no look inside) by the tickets its callers saw queued
/// and not yet admitted or withdrawn.
async fn queued<F: SemFixture>(f: &F, keys: &LockKeys, n: u64) {
    let queue = keys.queue();
    let memory = f.zcard(&queue).await.is_none();
    eventually(&format!("{n} queued on {queue}"), || async {
        if memory {
            memory_queue_len(&queue) == n
        } else {
            f.zcard(&queue).await == Some(n)
        }
    })
    .await;
}

/// `acq.acquire(name)` in a task.
fn spawn_acquire<A: Acquirer>(
    acq: &A,
    name: &'static str,
    wait: Duration,
) -> JoinHandle<tollgate_core::Result<Lease>> {
    let acq = acq.clone();
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).wait(wait);
    tokio::spawn(async move { acq.acquire_boxed(name, &opts).await })
}

/// A holder, then 5 waiters (separate connections), each queued before the
/// next starts: after the release they take it one by one in arrival order.
pub(crate) async fn arrival_order<A: FairAcquirer, F: SemFixture>(f: &F) {
    let prefix = prefix("order");
    let holder = A::build(f, &prefix, DEFAULT_POLL_INTERVAL).await;
    let keys = holder.keys("q");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = holder.try_acquire_boxed("q", &opts).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for i in 0..5 {
        let waiter = A::build(f, &prefix, DEFAULT_POLL_INTERVAL).await;
        let (order, opts) = (order.clone(), opts.clone().wait(Duration::from_secs(20)));
        handles.push(tokio::spawn(async move {
            let lease = waiter.acquire_boxed("q", &opts).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(lease.release().await.unwrap());
        }));
        queued(f, &keys, i + 1).await;
    }
    // A try does not jump the queue.
    busy_after(holder.try_acquire_boxed("q", &opts).await);
    assert!(lease.release().await.unwrap());
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
    if let Some(n) = f.zcard(&keys.queue()).await {
        assert_eq!(n, 0, "tickets left in the queue");
    }
    f.assert_no_immortal_keys();
}

/// A fair waiter may wait with an endless poll interval (`Duration::MAX`,
/// as an unfair one may): it queues without a panic, its ticket keeps its
/// place, and the release notification hands it the lock.
pub(crate) async fn endless_poll_interval<A: FairAcquirer, F: SemFixture>(f: &F) {
    let prefix = prefix("endless");
    let holder = A::build(f, &prefix, Duration::MAX).await;
    let keys = holder.keys("e");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = holder.try_acquire_boxed("e", &opts).await.unwrap();
    let mut waiter = spawn_acquire(
        &A::build(f, &prefix, Duration::MAX).await,
        "e",
        Duration::MAX,
    );
    tokio::select! {
        _ = queued(f, &keys, 1) => {}
        ended = &mut waiter => panic!("the waiter ended before it queued: {ended:?}"),
    }
    assert!(lease.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter did not get the released lock")
        .unwrap()
        .unwrap();
    assert!(next.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// A waiter that gives up (its wait bound) and one whose task is aborted
/// leave the queue at once: the waiter behind them gets the permit within
/// its 4 s bound, though their tickets would live 21 s and its own fallback
/// poll is 5–10 s away.
pub(crate) async fn leavers_leave_at_once<A: FairAcquirer, F: SemFixture>(f: &F) {
    let prefix = prefix("leave");
    let slow = Duration::from_secs(10);
    let holder = A::build(f, &prefix, slow).await;
    let keys = holder.keys("g");
    let lease = holder
        .try_acquire_boxed("g", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let quitter = spawn_acquire(
        &A::build(f, &prefix, slow).await,
        "g",
        Duration::from_millis(400),
    );
    queued(f, &keys, 1).await;
    let aborted = spawn_acquire(
        &A::build(f, &prefix, slow).await,
        "g",
        Duration::from_secs(20),
    );
    queued(f, &keys, 2).await;
    let patient = spawn_acquire(
        &A::build(f, &prefix, slow).await,
        "g",
        Duration::from_secs(4),
    );
    queued(f, &keys, 3).await;

    busy_after(quitter.await.unwrap());
    queued(f, &keys, 2).await;
    aborted.abort();
    assert!(aborted.await.unwrap_err().is_cancelled());
    queued(f, &keys, 1).await;

    assert!(lease.release().await.unwrap());
    let got = patient
        .await
        .unwrap()
        .expect("a ticket of a waiter that left still blocks the queue");
    assert!(got.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// A waiter that died while queued (a raw attempt with a ticket, never
/// refreshed) blocks the queue until its ticket expires, and no longer: a
/// try fails while it queues even with the permit free, the live waiter
/// behind it is served once the ticket is gone.
pub(crate) async fn dead_waiter_blocks_until_ticket_ttl<A: FairAcquirer, F: SemFixture>(f: &F) {
    let prefix = prefix("deadq");
    let poll = Duration::from_millis(100);
    let holder = A::build(f, &prefix, poll).await;
    let other = A::build(f, &prefix, poll).await;
    let keys = holder.keys("z");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = holder.try_acquire_boxed("z", &opts).await.unwrap();

    let ticket_ttl = Duration::from_millis(1500);
    let dead_at = Instant::now();
    let backend = f.backend().await;
    let dead = AcquireRequest::new(
        keys.clone(),
        "d".repeat(32),
        opts.ttl_duration(),
        Duration::from_secs(3600),
    )
    .with_ticket("e".repeat(32), ticket_ttl);
    let reply = backend.acquire_lock(&dead).await.unwrap();
    // At the head of the queue, but the permit is taken.
    assert!(matches!(reply, AcquireReply::Held { .. }), "{reply:?}");
    queued(f, &keys, 1).await;
    assert!(lease.release().await.unwrap());

    // The permit is free, but someone (dead) queues: a try fails.
    assert_eq!(busy_after(other.try_acquire_boxed("z", &opts).await), None);
    let waiter = spawn_acquire(&other, "z", Duration::from_secs(8));
    queued(f, &keys, 2).await;
    tokio::time::sleep_until((dead_at + ticket_ttl / 2).into()).await;
    assert!(
        !waiter.is_finished(),
        "served ahead of an earlier, live ticket"
    );
    let got = waiter
        .await
        .unwrap()
        .expect("the dead ticket blocked the queue");
    // Not before the ticket expired (the server's clock, so a little slack).
    let served = dead_at.elapsed();
    assert!(
        served + Duration::from_millis(100) >= ticket_ttl,
        "{served:?}"
    );
    assert!(got.release().await.unwrap());
    // The queue is empty again: a try succeeds.
    let again = other.try_acquire_boxed("z", &opts).await.unwrap();
    assert!(again.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// The holder's permits vanish without a release notification (DEL): the
/// head of the queue gets the permit at its next fallback poll — a lost
/// message costs one poll, never a stuck queue. Redis only.
pub(crate) async fn lost_notification_costs_one_poll<F: SemFixture>(f: &F) {
    let prefix = prefix("lostmsg");
    let poll = Duration::from_millis(300);
    let holder = <Semaphore as FairAcquirer>::build(f, &prefix, poll).await;
    let waiter = <Semaphore as FairAcquirer>::build(f, &prefix, poll).await;
    let keys = holder.keys_for("n");
    if f.zcard(&keys.queue()).await.is_none() {
        return; // memory: nothing can be deleted behind the holder's back
    }
    let lease = holder
        .try_acquire("n", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let wait = spawn_acquire(&waiter, "n", Duration::from_secs(5));
    queued(f, &keys, 1).await;
    assert!(f.del(&keys.lock).await);
    let got = wait
        .await
        .unwrap()
        .expect("the queue is stuck without a notification");
    assert!(got.fence() > lease.fence());
    assert!(got.release().await.unwrap());
    assert!(!lease.release().await.unwrap());
    f.assert_no_immortal_keys();
}

/// Waiters with different ticket TTLs (other poll intervals) share one
/// queue: a short-lived ticket that dies must not take the queue's keys
/// with it when it expires, or the earlier, longer-lived waiter loses its
/// place to a later one.
pub(crate) async fn mixed_ticket_ttls_keep_arrival_order<F: SemFixture>(f: &F) {
    let prefix = prefix("mixttl");
    let slow = Duration::from_secs(10); // tickets live 21 s
    let holder = <Semaphore as FairAcquirer>::build(f, &prefix, slow).await;
    let keys = holder.keys_for("x");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = holder.try_acquire("x", &opts).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiter = |s: Semaphore, who: &'static str| {
        let (order, opts) = (order.clone(), opts.clone().wait(Duration::from_secs(20)));
        tokio::spawn(async move {
            let lease = s.acquire("x", &opts).await.unwrap();
            order.lock().unwrap().push(who);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(lease.release().await.unwrap());
        })
    };
    let first = waiter(Semaphore::build(f, &prefix, slow).await, "first");
    queued(f, &keys, 1).await;
    // A waiter with 300 ms tickets queues once and dies.
    let dead = AcquireRequest::new(
        keys.clone(),
        "d".repeat(32),
        opts.ttl_duration(),
        Duration::from_secs(3600),
    )
    .with_ticket("e".repeat(32), Duration::from_millis(300));
    f.backend().await.acquire_lock(&dead).await.unwrap();
    queued(f, &keys, 2).await;
    // Its ticket is gone (300 ms, waited out); the first waiter's (21 s) is
    // not.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let fast = Duration::from_millis(50); // tickets live 1.1 s
    let watched = Watched::new(f.backend().await);
    let fast_sem = Semaphore::builder(watched.clone(), 1)
        .prefix(&prefix)
        .poll_interval(fast)
        .fair()
        .build()
        .unwrap();
    let second = waiter(fast_sem, "second");
    // Released only once the second is queued (refused with a ticket).
    watched.refused(1).await;
    assert!(lease.release().await.unwrap());
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["first", "second"]);
    f.assert_no_immortal_keys();
}

/// Fair names (and so semaphores, which have no Redlock constructor) are
/// refused on a Redlock.
pub(crate) fn redlock_refuses_fair() {
    let masters = [
        tollgate_core::MemoryBackend::new(),
        tollgate_core::MemoryBackend::new(),
        tollgate_core::MemoryBackend::new(),
    ];
    let r = Locker::redlock_builder(masters).fair().build();
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
}
