//! Many acquirers on one name (mutual exclusion, lost updates, fences in
//! order), fill-once, and names that never block each other.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Error, LockOptions, Locker};

use super::{prefix, Acquirer, Fixture};

async fn lockers<F: Fixture>(f: &F, prefix: &str, n: usize) -> Vec<Locker> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(f.builder().await.prefix(prefix).build().unwrap());
    }
    out
}

/// `lockers` lockers (separate connections), `tasks` tasks spread over them,
/// `total` acquisitions of one name: see [`run_contended`].
pub(crate) async fn contended<F: Fixture>(
    f: &F,
    test: &str,
    n_lockers: usize,
    tasks: usize,
    total: usize,
) {
    let prefix = prefix(test);
    let lockers = lockers(f, &prefix, n_lockers).await;
    let started = Instant::now();
    run_contended(&lockers, tasks, total).await;
    eprintln!(
        "{test}: {total} acquisitions, {n_lockers} lockers, {tasks} tasks in {:?}",
        started.elapsed()
    );
    f.assert_no_immortal_keys();
}

/// `tasks` tasks spread over `lockers`, `total` acquisitions of one name,
/// each doing a read-modify-write with a yield in the middle: no overlap, no
/// lost update, and fences strictly increasing in the order the critical
/// sections ran.
pub(crate) async fn run_contended<L: Acquirer>(lockers: &[L], tasks: usize, total: usize) {
    let in_cs = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let locker = lockers[t % lockers.len()].clone();
        let (in_cs, counter, next, fences, opts) = (
            in_cs.clone(),
            counter.clone(),
            next.clone(),
            fences.clone(),
            opts.clone(),
        );
        handles.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let lease = locker.acquire_boxed("counter", &opts).await.unwrap();
                assert!(!in_cs.swap(true, Ordering::SeqCst), "two holders at once");
                fences.lock().unwrap().push(lease.fence());
                let v = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                in_cs.store(false, Ordering::SeqCst);
                assert!(lease.release().await.unwrap());
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let fences = fences.lock().unwrap();
    assert_eq!(counter.load(Ordering::SeqCst), total as u64, "lost update");
    assert_eq!(fences.len(), total);
    for w in fences.windows(2) {
        assert!(w[1] > w[0], "fence went from {} to {}", w[0], w[1]);
    }
}

/// 50 concurrent callers on a cold key: computed exactly once, all get it.
pub(crate) async fn fill_once_computes_once<F: Fixture>(f: &F) {
    let prefix = prefix("fill");
    let lockers = lockers(f, &prefix, 4).await;
    let cache: Arc<Mutex<Option<u64>>> = Arc::default();
    let computed = Arc::new(AtomicUsize::new(0));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(20));
    let mut handles = Vec::new();
    for i in 0..50 {
        let locker = lockers[i % lockers.len()].clone();
        let (cache, computed, opts) = (cache.clone(), computed.clone(), opts.clone());
        handles.push(tokio::spawn(async move {
            locker
                .fill_once(
                    "report",
                    &opts,
                    || {
                        let v = *cache.lock().unwrap();
                        async move { Ok::<_, Error>(v) }
                    },
                    || async {
                        computed.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok(4242)
                    },
                    |v| {
                        *cache.lock().unwrap() = Some(v);
                        async { Ok(()) }
                    },
                )
                .await
                .unwrap()
        }));
    }
    for h in handles {
        assert_eq!(h.await.unwrap(), 4242);
    }
    assert_eq!(computed.load(Ordering::SeqCst), 1);
    f.assert_no_immortal_keys();
}

/// Different names never block each other, and a lease reports its name,
/// key and a fence from the backend's clock.
pub(crate) async fn names_are_independent<F: Fixture>(f: &F) {
    let prefix = prefix("names");
    let a = f.builder().await.prefix(&prefix).build().unwrap();
    let mut seen = HashSet::new();
    let mut leases = Vec::new();
    for name in ["a", "a:b", "{a}", "", "ä"] {
        let lease = a.try_acquire(name, &LockOptions::new()).await.unwrap();
        assert!(seen.insert(lease.key().to_owned()));
        assert!(lease.key().starts_with(&format!("{prefix}:lock:{{")));
        // Server time in µs is a floor: later than 2020.
        assert!(lease.fence().get() > 1_577_836_800_000_000);
        leases.push(lease);
    }
    assert_eq!(leases[0].name(), "a");
    for l in leases {
        assert!(l.release().await.unwrap());
    }
    f.assert_no_immortal_keys();
}
