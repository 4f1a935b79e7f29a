//! The lock behaviour suite, generic over a backend fixture, instantiated by
//! `lock_memory.rs`, `lock_standalone.rs` and `lock_cluster.rs` with
//! [`behaviour_suite!`]. Real Redis only (the test kit's processes).
#![allow(dead_code, async_fn_in_trait)]

pub(crate) mod replay;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt};
use tokio::task::JoinHandle;
use tollgate_core::lock::{
    AcquireReply, AcquireRequest, LockKeys, ReleaseEvents, MAX_LOCK_DURATION,
};
use tollgate_core::{
    Error, FencingToken, Keyspace, Lease, LockBackend, LockOptions, Locker, LockerBuilder,
    MemoryBackend, RedisBackend, Subject,
};
use tollgate_testkit::{RedisCluster, RedisServer};

/// A backend under test: hands out lockers on separate connections.
pub(crate) trait Fixture: Sync {
    /// A fresh backend handle (a fresh connection).
    async fn backend(&self) -> Arc<dyn LockBackend>;
    /// A builder over a fresh connection (a fresh backend handle).
    async fn builder(&self) -> LockerBuilder {
        Locker::builder(self.backend().await)
    }
    /// Deletes a key behind every holder's back.
    async fn delete_key(&self, key: &str);
    /// Panics if any key on the backend has no TTL.
    fn assert_no_immortal_keys(&self);
}

pub(crate) struct Memory(pub(crate) MemoryBackend);

impl Fixture for Memory {
    async fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(Queues(self.0.clone()))
    }
    async fn delete_key(&self, key: &str) {
        assert!(self.0.break_lock(key), "no live lock under {key}");
    }
    fn assert_no_immortal_keys(&self) {}
}

/// The memory backend's fair queues as its callers saw them (it has no look
/// inside, where Redis has ZCARD): queue key → the tickets refused and not
/// yet admitted or withdrawn. A ticket that expires unrefreshed stays
/// counted.
fn memory_queues() -> std::sync::MutexGuard<'static, HashMap<String, HashSet<String>>> {
    static Q: std::sync::OnceLock<Mutex<HashMap<String, HashSet<String>>>> =
        std::sync::OnceLock::new();
    Q.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// How many tickets `queue` holds on the memory backend (see [`Queues`]).
pub(crate) fn memory_queue_len(queue: &str) -> u64 {
    memory_queues().get(queue).map_or(0, |q| q.len() as u64)
}

/// The memory backend, recording its fair queues ([`memory_queue_len`]).
#[derive(Debug)]
struct Queues(MemoryBackend);

impl LockBackend for Queues {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.0.acquire_lock(request).await;
            if let (Some((ticket, _)), Ok(r)) = (&request.ticket, &reply) {
                let mut queues = memory_queues();
                let queue = queues.entry(request.keys.queue()).or_default();
                match r {
                    AcquireReply::Held { .. } => {
                        queue.insert(ticket.clone());
                    }
                    _ => {
                        queue.remove(ticket);
                    }
                }
            }
            reply
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        async move {
            let released = self.0.release_lock(keys, token).await;
            if let Some(queue) = memory_queues().get_mut(&keys.queue()) {
                queue.remove(token);
            }
            released
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

    fn lock_kind(&self) -> &'static str {
        self.0.lock_kind()
    }
}

pub(crate) struct Standalone(pub(crate) &'static RedisServer);

impl Fixture for Standalone {
    async fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect(&self.0.url()).await.unwrap())
    }
    async fn delete_key(&self, key: &str) {
        delete_one(&mut self.0.multiplexed().await, key).await;
    }
    fn assert_no_immortal_keys(&self) {
        assert_all_keys_expire(self.0);
    }
}

pub(crate) struct Cluster(pub(crate) &'static RedisCluster);

impl Fixture for Cluster {
    async fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect_cluster(self.0.seeds()).await.unwrap())
    }
    async fn delete_key(&self, key: &str) {
        delete_one(&mut self.0.connection().await, key).await;
    }
    fn assert_no_immortal_keys(&self) {
        for node in self.0.nodes() {
            assert_all_keys_expire(node);
        }
    }
}

/// Deletes `key` over `con`; panics unless it existed.
async fn delete_one(con: &mut impl redis::aio::ConnectionLike, key: &str) {
    let n: i64 = redis::cmd("DEL").arg(key).query_async(con).await.unwrap();
    assert_eq!(n, 1, "no key {key}");
}

/// What the shared scenarios need of a [`Locker`] (over one backend or a
/// Redlock's instances).
pub(crate) trait Acquirer: Clone + Send + Sync + 'static {
    fn acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>>;
    fn try_acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>>;
}

impl Acquirer for Locker {
    fn acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>> {
        self.acquire(name, opts).boxed()
    }
    fn try_acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>> {
        self.try_acquire(name, opts).boxed()
    }
}

/// Every key on `server` has a TTL (PTTL ≥ 0: 0 is a key in its last
/// millisecond, such as one of the many short-lived release markers; -2 =
/// expired meanwhile is fine; -1 = immortal is not).
pub(crate) fn assert_all_keys_expire(server: &RedisServer) {
    let mut con = server.client().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
        assert!(
            pttl >= 0 || pttl == -2,
            "key {key} has no TTL (PTTL {pttl})"
        );
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

/// A backend that forwards to another, with a slow network: an acquire's
/// reply arrives `acquire_reply` after the acquire was applied, and a release
/// is applied only `release_send` after it was sent. A caller that gives up
/// in between has left its request on the backend.
#[derive(Debug)]
pub(crate) struct Delayed {
    pub(crate) inner: Arc<dyn LockBackend>,
    pub(crate) acquire_reply: Duration,
    pub(crate) release_send: Duration,
}

impl LockBackend for Delayed {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.inner.acquire_lock(request).await;
            tokio::time::sleep(self.acquire_reply).await;
            reply
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        async move {
            tokio::time::sleep(self.release_send).await;
            self.inner.release_lock(keys, token).await
        }
        .boxed()
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.extend_lock(keys, token, ttl)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, tollgate_core::Result<ReleaseEvents>>> {
        self.inner.release_events(channel_prefix)
    }

    fn lock_kind(&self) -> &'static str {
        self.inner.lock_kind()
    }
}

/// A backend that forwards to another and counts the acquires it answered
/// "held by someone else": a test waits for a waiter's refused attempt (the
/// waiter has then looked, found the name taken, and waits) instead of
/// sleeping and hoping it got that far. Clones share the count, so one count
/// can watch every instance of a Redlock.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    inner: Arc<dyn LockBackend>,
    refused: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Watched {
    pub(crate) fn new(inner: Arc<dyn LockBackend>) -> Self {
        Watched {
            inner,
            refused: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// Another backend counted with this one.
    pub(crate) fn also(&self, inner: Arc<dyn LockBackend>) -> Self {
        Watched {
            inner,
            refused: self.refused.clone(),
        }
    }

    /// Acquires refused so far.
    pub(crate) fn refusals(&self) -> u64 {
        *self.refused.borrow()
    }

    /// Waits (up to 10 s) until at least `n` acquires were refused.
    pub(crate) async fn refused(&self, n: u64) {
        let mut rx = self.refused.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&c| c >= n))
            .await
            .unwrap_or_else(|_| panic!("{} acquires refused, not {n}", self.refusals()))
            .unwrap();
    }
}

impl LockBackend for Watched {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.inner.acquire_lock(request).await;
            if let Ok(AcquireReply::Held { .. }) = reply {
                self.refused.send_modify(|c| *c += 1);
            }
            reply
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.release_lock(keys, token)
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.extend_lock(keys, token, ttl)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, tollgate_core::Result<ReleaseEvents>>> {
        self.inner.release_events(channel_prefix)
    }

    fn permits_in_use<'a>(
        &'a self,
        keys: &'a LockKeys,
    ) -> BoxFuture<'a, tollgate_core::Result<u32>> {
        self.inner.permits_in_use(keys)
    }

    fn lock_kind(&self) -> &'static str {
        self.inner.lock_kind()
    }
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

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_acquire_leaves_no_lock() {
            lock_common::dropped_acquire_leaves_no_lock(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_release_still_releases() {
            lock_common::dropped_release_still_releases(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn acquire_is_idempotent() {
            lock_common::acquire_is_idempotent(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn huge_durations_are_refused_not_panics() {
            lock_common::huge_durations_are_refused_not_panics(&$fixture).await;
        }
    };
}
