//! The lock behaviour suite, generic over a backend fixture, instantiated by
//! `lock_memory.rs`, `lock_standalone.rs` and `lock_cluster.rs` with
//! [`behaviour_suite!`]. Real Redis only (the test kit's processes).
#![allow(dead_code, async_fn_in_trait)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Error, LockOptions, Locker, LockerBuilder, MemoryBackend, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};

/// A backend under test: hands out lockers on separate connections.
pub(crate) trait Fixture: Sync {
    /// A builder over a fresh connection (a fresh backend handle).
    async fn builder(&self) -> LockerBuilder;
    /// Deletes a key behind every holder's back.
    async fn delete_key(&self, key: &str);
    /// Panics if any key on the backend has no TTL.
    fn assert_no_immortal_keys(&self);
}

pub(crate) struct Memory(pub(crate) MemoryBackend);

impl Fixture for Memory {
    async fn builder(&self) -> LockerBuilder {
        Locker::builder(self.0.clone())
    }
    async fn delete_key(&self, key: &str) {
        assert!(self.0.break_lock(key), "no live lock under {key}");
    }
    fn assert_no_immortal_keys(&self) {}
}

pub(crate) struct Standalone(pub(crate) &'static RedisServer);

impl Fixture for Standalone {
    async fn builder(&self) -> LockerBuilder {
        Locker::builder(RedisBackend::connect(&self.0.url()).await.unwrap())
    }
    async fn delete_key(&self, key: &str) {
        let mut con = self.0.multiplexed().await;
        let n: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(n, 1, "no key {key}");
    }
    fn assert_no_immortal_keys(&self) {
        assert_all_keys_expire(self.0);
    }
}

pub(crate) struct Cluster(pub(crate) &'static RedisCluster);

impl Fixture for Cluster {
    async fn builder(&self) -> LockerBuilder {
        Locker::builder(RedisBackend::connect_cluster(self.0.seeds()).await.unwrap())
    }
    async fn delete_key(&self, key: &str) {
        let mut con = self.0.connection().await;
        let n: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(n, 1, "no key {key}");
    }
    fn assert_no_immortal_keys(&self) {
        for node in self.0.nodes() {
            assert_all_keys_expire(node);
        }
    }
}

/// Every key on `server` has a TTL (PTTL > 0; -2 = expired meanwhile is fine).
pub(crate) fn assert_all_keys_expire(server: &RedisServer) {
    let mut con = server.client().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
        assert!(pttl > 0 || pttl == -2, "key {key} has no TTL (PTTL {pttl})");
    }
}

/// A unique prefix per test, so tests sharing a server never meet.
pub(crate) fn prefix(test: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("t{}-{test}", N.fetch_add(1, Ordering::Relaxed))
}

async fn lockers<F: Fixture>(f: &F, prefix: &str, n: usize) -> Vec<Locker> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(f.builder().await.prefix(prefix).build().unwrap());
    }
    out
}

/// `lockers` lockers (separate connections), `tasks` tasks spread over them,
/// `total` acquisitions of one name, each doing a read-modify-write with a
/// yield in the middle: no overlap, no lost update, and fences strictly
/// increasing in the order the critical sections ran.
pub(crate) async fn contended<F: Fixture>(
    f: &F,
    test: &str,
    n_lockers: usize,
    tasks: usize,
    total: usize,
) {
    let prefix = prefix(test);
    let lockers = lockers(f, &prefix, n_lockers).await;
    let in_cs = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let locker = lockers[t % n_lockers].clone();
        let (in_cs, counter, next, fences, opts) = (
            in_cs.clone(),
            counter.clone(),
            next.clone(),
            fences.clone(),
            opts.clone(),
        );
        handles.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let lease = locker.acquire("counter", &opts).await.unwrap();
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
    eprintln!(
        "{test}: {total} acquisitions, {n_lockers} lockers, {tasks} tasks in {:?}",
        started.elapsed()
    );
    f.assert_no_immortal_keys();
}

/// A waiter wakes on the release notification, long before its fallback poll
/// (here at least 5 s) would.
pub(crate) async fn waiter_wakes_on_release<F: Fixture>(f: &F) {
    let prefix = prefix("wake");
    let holder = f.builder().await.prefix(&prefix).build().unwrap();
    let waiter = f
        .builder()
        .await
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fence = lease.fence();
    let released = Instant::now();
    assert!(lease.release().await.unwrap());
    let (woke, next) = wait.await.unwrap();
    let took = woke.duration_since(released);
    assert!(
        took < Duration::from_secs(2),
        "the waiter took {took:?} after the release"
    );
    assert!(next > fence);
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

/// Instantiates the behaviour suite for a fixture expression and a count of
/// acquisitions for the contended tests.
#[macro_export]
macro_rules! behaviour_suite {
    ($fixture:expr, $total:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fences_strictly_increase_4_clients() {
            lock_common::contended(&$fixture, "fences", 4, 4, $total).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mutual_exclusion_4_lockers_32_tasks() {
            lock_common::contended(&$fixture, "mutex", 4, 32, $total).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiter_wakes_on_release() {
            lock_common::waiter_wakes_on_release(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn wait_bound_is_honoured() {
            lock_common::wait_bound_is_honoured(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn drop_releases() {
            lock_common::drop_releases(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn release_semantics() {
            lock_common::release_semantics(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn deleted_key_is_lost() {
            lock_common::deleted_key_is_lost(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn renewal_and_cap() {
            lock_common::renewal_and_cap(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fill_once_computes_once() {
            lock_common::fill_once_computes_once(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn names_are_independent() {
            lock_common::names_are_independent(&$fixture).await;
        }
    };
}
