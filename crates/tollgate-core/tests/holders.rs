//! Who holds what: every lock and permit carries `host:pid` and since when,
//! so an operator lists the holders from the store alone and breaks a stuck
//! one without letting fences go back — through the store traits, the
//! plain API and the operator's [`Admin`], on memory, a standalone
//! redis-server and a 3-master cluster (real processes).

mod store_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use tollgate_core::admin::{Admin, HolderKind};
use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockHolder, LockKeys, ReleaseEvents};
use tollgate_core::{
    Algorithm, Backend, FencingToken, Keyspace, LockBackend, LockOptions, Locker, ManualClock,
    MemoryBackend, Quota, RateLimiter, Semaphore, Subject,
};
use tollgate_testkit::{eventually, unique, RedisServer};

use store_common::{backend, cluster, server, Kind};

/// The holders under `prefix`, in a stable order.
async fn holders(backend: &Backend, prefix: &str) -> Vec<LockHolder> {
    let mut all = backend.lock_holders(prefix).await.expect("holders");
    all.sort_by(|a, b| (&a.name, &a.subject, a.fence).cmp(&(&b.name, &b.subject, b.fence)));
    all
}

fn pid_suffix() -> String {
    format!(":{}", std::process::id())
}

/// A store that counts acquire attempts.
#[derive(Clone, Debug)]
struct Attempts(Backend, Arc<AtomicUsize>);

impl Attempts {
    fn new(backend: Backend) -> Self {
        Attempts(backend, Arc::default())
    }

    fn count(&self) -> usize {
        self.1.load(Ordering::SeqCst)
    }
}

impl LockBackend for Attempts {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.0.acquire_lock(request).await;
            self.1.fetch_add(1, Ordering::SeqCst);
            reply
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.0.release_lock(keys, token)
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

    fn local_lock(&self) -> Arc<dyn LockBackend> {
        self.0.local_lock()
    }

    fn lock_kind(&self) -> &'static str {
        "attempts"
    }
}

/// Every key under `prefix` has a TTL (-2: expired meanwhile).
fn assert_keys_expire(kind: Kind, prefix: &str) {
    let keys: Vec<(String, &RedisServer)> = match kind {
        Kind::Memory => return,
        Kind::Standalone => keys_on(server(), prefix),
        Kind::Cluster => cluster()
            .nodes()
            .iter()
            .flat_map(|n| keys_on(n, prefix))
            .collect(),
    };
    for (key, node) in keys {
        let pttl = node.cli(&["PTTL", &key]);
        assert!(pttl != "-1", "{key} has no TTL");
    }
}

fn keys_on<'a>(node: &'a RedisServer, prefix: &str) -> Vec<(String, &'a RedisServer)> {
    let mut con = node.client().get_connection().expect("connection");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut con)
        .unwrap_or_default();
    keys.into_iter().map(|k| (k, node)).collect()
}

/// A held lock and held permits are listed with this process as holder,
/// their fences and TTLs, `held` growing; the rate limiter's and the
/// idempotency store's keys beside them are not; released ones go.
async fn held_ones_are_listed(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("held");
    let locker = Locker::builder(backend.clone())
        .prefix(&prefix)
        .build()
        .unwrap();
    let sem = Semaphore::builder(backend.clone(), 3)
        .prefix(&prefix)
        .build()
        .unwrap();
    let ttl = Duration::from_secs(20);
    let opts = LockOptions::new().ttl(ttl);
    let lease = locker.try_acquire("orders", &opts).await.unwrap();
    let one = sem.try_acquire("gpu", &opts).await.unwrap();
    let two = sem.try_acquire_weighted("gpu", 2, &opts).await.unwrap();
    // Neighbours under the same prefix that hold nothing.
    let limiter = RateLimiter::builder(backend.clone(), Algorithm::SlidingWindowLog)
        .quota(Quota::per_minute(5))
        .prefix(&prefix)
        .build()
        .unwrap();
    assert!(limiter.check("orders").await.unwrap().allowed);
    let records = IdempotencyStore::builder(backend.clone())
        .prefix(&prefix)
        .build()
        .unwrap();
    let Claim::Claimed(in_flight) = records
        .claim(Subject::new("k-1"), Fingerprint::of(b"x"))
        .await
        .unwrap()
    else {
        panic!("claimed");
    };

    let listed = holders(&backend, &prefix).await;
    assert_eq!(listed.len(), 3, "{kind:?}: {listed:?}");
    let lock = &listed[0];
    assert_eq!(
        (lock.name.as_str(), lock.subject.as_str()),
        ("lock", "orders")
    );
    assert!(!lock.permits);
    assert_eq!(lock.fence, lease.fence());
    assert_eq!(lock.weight, 1);
    assert!(lock.holder.ends_with(&pid_suffix()), "{}", lock.holder);
    assert!(lock.ttl <= ttl && lock.ttl > ttl / 2, "{:?}", lock.ttl);
    let permits = &listed[1..];
    let mut fences: Vec<_> = permits.iter().map(|h| (h.fence, h.weight)).collect();
    fences.sort();
    assert_eq!(fences, [(one.fence(), 1), (two.fence(), 2)]);
    for p in permits {
        assert_eq!((p.name.as_str(), p.subject.as_str()), ("sem", "gpu"));
        assert!(p.permits);
        assert!(p.holder.ends_with(&pid_suffix()), "{}", p.holder);
        assert!(p.ttl <= ttl && p.ttl > ttl / 2, "{:?}", p.ttl);
    }

    // The operator's view: the same, as the admin API's JSON shows it.
    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    let seen = admin.holders().await.unwrap();
    let summary: Vec<_> = seen
        .iter()
        .map(|h| (h.kind, h.name.as_str(), h.subject.as_str(), h.fence))
        .collect();
    let mut expected = vec![(HolderKind::Lock, "lock", "orders", lease.fence().get())];
    for p in permits {
        expected.push((HolderKind::Permit, "sem", "gpu", p.fence.get()));
    }
    assert_eq!(summary, expected);
    for h in &seen {
        assert!(h.holder.ends_with(&pid_suffix()), "{}", h.holder);
        assert!(h.ttl_ms <= 20_000 && h.ttl_ms > 10_000, "{}", h.ttl_ms);
    }
    let json = serde_json::to_value(&seen[1]).unwrap();
    let fields: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
    let mut wanted = [
        "fence", "held_ms", "holder", "kind", "name", "subject", "ttl_ms",
    ];
    wanted.sort();
    assert_eq!(fields, wanted);
    assert_eq!(json["kind"], "permit");
    assert_eq!(json["subject"], "gpu");

    // Held for longer at each look.
    let first = seen[0].held_ms;
    eventually(Duration::from_secs(3), "held_ms grows", || async {
        let now = admin.holders().await.unwrap();
        (now[0].held_ms > first).then_some(())
    })
    .await;
    let first = lock.held;
    eventually(Duration::from_secs(3), "held grows", || async {
        let now = holders(&backend, &prefix).await;
        (now[0].held > first).then_some(())
    })
    .await;

    assert!(lease.release().await.unwrap());
    assert!(one.release().await.unwrap());
    let left = holders(&backend, &prefix).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!((left[0].fence, left[0].weight), (two.fence(), 2));
    assert!(two.release().await.unwrap());
    assert_eq!(holders(&backend, &prefix).await, []);
    drop(in_flight);
    assert_keys_expire(kind, &prefix);
}

/// Breaking a lock lets another take it at once, with a higher fence; the
/// broken lease learns it at its next renewal, and its release says so.
async fn a_broken_lock_is_free_at_once(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("break");
    let locker = Locker::builder(backend.clone())
        .prefix(&prefix)
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_millis(1500));
    let stuck = locker.try_acquire("job", &opts).await.unwrap();
    assert!(locker.try_acquire("job", &opts).await.is_err());

    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    assert!(admin
        .break_lock("lock", &Subject::new("job"))
        .await
        .unwrap());
    let next = locker
        .try_acquire("job", &opts)
        .await
        .expect("free once broken");
    assert!(next.fence() > stuck.fence());
    let listed = holders(&backend, &prefix).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].fence, next.fence());

    eventually(
        Duration::from_secs(3),
        "the broken lease is lost",
        || async { stuck.is_lost().then_some(()) },
    )
    .await;
    assert!(next.is_held());
    assert!(!stuck.release().await.unwrap());
    assert!(next.release().await.unwrap());
    assert!(!admin
        .break_lock("lock", &Subject::new("job"))
        .await
        .unwrap());
    assert!(!locker.break_lock("job").await.unwrap());
    assert_keys_expire(kind, &prefix);
}

/// Breaking a semaphore name takes every permit; a waiter gets one at once,
/// with a fence above the broken ones; the broken permits are lost.
async fn broken_permits_go_to_the_waiters(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("permits");
    let sem = Semaphore::builder(backend.clone(), 2)
        .prefix(&prefix)
        .build()
        .unwrap();
    // Permits that outlive the test's bound, and a waiter that would not
    // poll within it: only the break's notification can serve it in time.
    let opts = LockOptions::new().ttl(Duration::from_secs(6));
    let a = sem.try_acquire("export", &opts).await.unwrap();
    let b = sem.try_acquire("export", &opts).await.unwrap();
    // The waiter is a semaphore of its own on the same keys, counting its
    // attempts: it is waiting once one was refused.
    let attempts = Attempts::new(backend.clone());
    let waiter = {
        let sem = Semaphore::builder(attempts.clone(), 2)
            .prefix(&prefix)
            .poll_interval(Duration::from_secs(60))
            .build()
            .unwrap();
        let opts = opts.clone().wait(Duration::from_secs(10));
        tokio::spawn(async move { sem.acquire("export", &opts).await })
    };
    eventually(Duration::from_secs(3), "the waiter waits", || async {
        (attempts.count() >= 1).then_some(())
    })
    .await;
    assert!(!waiter.is_finished());

    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    let started = std::time::Instant::now();
    let export = Subject::new("export");
    assert_eq!(admin.break_permits("sem", &export).await.unwrap(), 2);
    let got = waiter.await.unwrap().expect("a permit once broken");
    // Woken by the break, not by a poll (60 s) or the permits' expiry (6 s).
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(got.fence() > a.fence().max(b.fence()));
    eventually(
        Duration::from_secs(8),
        "the broken permits are lost",
        || async { (a.is_lost() && b.is_lost()).then_some(()) },
    )
    .await;
    assert_eq!(sem.in_use("export").await.unwrap(), 1);
    let listed = holders(&backend, &prefix).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].fence, got.fence());
    assert!(got.release().await.unwrap());
    assert_eq!(admin.break_permits("sem", &export).await.unwrap(), 0);
    assert_eq!(sem.break_permits("export").await.unwrap(), 0);
    assert_keys_expire(kind, &prefix);
}

/// A holder that dies (never renews, never releases) leaves the listing
/// when its TTL passes, its description with it.
async fn dead_holders_leave_with_their_ttl(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("dead");
    let ttl = Duration::from_millis(300);
    let lock = LockKeys::new(
        &Keyspace::new(prefix.as_str(), "lock").unwrap(),
        &Subject::new("a"),
    );
    let permits = LockKeys::permits(
        &Keyspace::new(prefix.as_str(), "sem").unwrap(),
        &Subject::new("b"),
        4,
        2,
        true,
    );
    for keys in [&lock, &permits] {
        let mut req =
            AcquireRequest::new(keys.clone(), unique("tok"), ttl, Duration::from_secs(60));
        req.holder = "elsewhere:7".into();
        let reply = backend.acquire_lock(&req).await.unwrap();
        assert!(matches!(reply, AcquireReply::Acquired { .. }), "{reply:?}");
    }
    let listed = holders(&backend, &prefix).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|h| h.holder == "elsewhere:7"));
    assert_eq!(listed[1].weight, 2);
    eventually(Duration::from_secs(3), "dead holders leave", || async {
        holders(&backend, &prefix).await.is_empty().then_some(())
    })
    .await;
    if let Kind::Standalone = kind {
        eventually(Duration::from_secs(3), "descriptions expire", || async {
            let left = keys_on(server(), &prefix);
            (!left.iter().any(|(k, _)| k.contains(":holder:"))).then_some(())
        })
        .await;
    }
    assert_keys_expire(kind, &prefix);
}

/// Names spread over every master of a cluster are all found.
async fn every_name_is_found(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("many");
    let locker = Locker::builder(backend.clone())
        .prefix(&prefix)
        .build()
        .unwrap();
    let mut leases = Vec::new();
    for i in 0..24 {
        leases.push(
            locker
                .try_acquire(format!("n{i}"), &LockOptions::new())
                .await
                .unwrap(),
        );
    }
    let listed = holders(&backend, &prefix).await;
    let mut names: Vec<_> = listed.iter().map(|h| h.subject.clone()).collect();
    names.sort();
    let mut expected: Vec<_> = (0..24).map(|i| format!("n{i}")).collect();
    expected.sort();
    assert_eq!(names, expected);
    if let Kind::Cluster = kind {
        let masters = cluster()
            .nodes()
            .iter()
            .filter(|n| !keys_on(n, &prefix).is_empty())
            .count();
        assert!(masters > 1, "the names live on {masters} master(s)");
    }
    for lease in leases {
        assert!(lease.release().await.unwrap());
    }
}

/// A fair lock is stored as permits: listed as one, broken as a lock.
async fn a_fair_lock_is_listed_and_broken(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("fair");
    let locker = Locker::builder(backend.clone())
        .prefix(&prefix)
        .fair()
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_millis(1500));
    let stuck = locker.try_acquire("queue", &opts).await.unwrap();
    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    let listed = admin.holders().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].kind, listed[0].name.as_str(), listed[0].fence),
        (HolderKind::Permit, "lock", stuck.fence().get())
    );
    assert!(admin
        .break_lock("lock", &Subject::new("queue"))
        .await
        .unwrap());
    let next = locker.try_acquire("queue", &opts).await.unwrap();
    assert!(next.fence() > stuck.fence());
    eventually(
        Duration::from_secs(3),
        "the broken lease is lost",
        || async { stuck.is_lost().then_some(()) },
    )
    .await;
    assert!(next.release().await.unwrap());
    assert_eq!(admin.holders().await.unwrap(), []);
}

/// A named locker's and semaphore's holders are listed, and broken, under
/// their names.
async fn named_ones_go_by_their_names(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("named");
    let generate = Semaphore::builder(backend.clone(), 2)
        .prefix(&prefix)
        .name("generate")
        .build()
        .unwrap();
    let nightly = Locker::builder(backend.clone())
        .prefix(&prefix)
        .name("nightly")
        .build()
        .unwrap();
    let opts = LockOptions::new();
    let permit = generate.try_acquire("key-1", &opts).await.unwrap();
    let lease = nightly.try_acquire("run", &opts).await.unwrap();
    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    let listed: Vec<_> = admin
        .holders()
        .await
        .unwrap()
        .into_iter()
        .map(|h| (h.kind, h.name, h.subject, h.fence))
        .collect();
    assert_eq!(
        listed,
        [
            (
                HolderKind::Permit,
                "generate".into(),
                "key-1".into(),
                permit.fence().get()
            ),
            (
                HolderKind::Lock,
                "nightly".into(),
                "run".into(),
                lease.fence().get()
            ),
        ]
    );
    let key = Subject::new("key-1");
    assert_eq!(admin.break_permits("generate", &key).await.unwrap(), 1);
    assert!(admin
        .break_lock("nightly", &Subject::new("run"))
        .await
        .unwrap());
    assert_eq!(admin.holders().await.unwrap(), []);
    assert_eq!(generate.in_use("key-1").await.unwrap(), 0);
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Kind::Memory).await;
            })*
        }
        mod standalone {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Kind::Standalone).await;
            })*
        }
        mod cluster {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Kind::Cluster).await;
            })*
        }
    };
}

on_every_store!(
    held_ones_are_listed,
    a_broken_lock_is_free_at_once,
    broken_permits_go_to_the_waiters,
    dead_holders_leave_with_their_ttl,
    every_name_is_found,
    a_fair_lock_is_listed_and_broken,
    named_ones_go_by_their_names,
);

/// The fence key survives a break: on a clock that does not move, the next
/// fence is the broken one's + 1 (a fence drawn from the clock alone would
/// equal it).
#[tokio::test]
async fn a_break_keeps_the_fence_key() {
    let clock = ManualClock::starting_now();
    let memory = MemoryBackend::with_clock(clock.clone());
    let locker = Locker::new(memory.clone());
    let sem = Semaphore::new(memory, 2).unwrap();
    let opts = LockOptions::new();
    let stuck = locker.try_acquire("x", &opts).await.unwrap();
    assert!(locker.break_lock("x").await.unwrap());
    let next = locker.try_acquire("x", &opts).await.unwrap();
    assert_eq!(next.fence().get(), stuck.fence().get() + 1);

    let held = sem.try_acquire("y", &opts).await.unwrap();
    assert_eq!(sem.break_permits("y").await.unwrap(), 1);
    let again = sem.try_acquire("y", &opts).await.unwrap();
    assert_eq!(again.fence().get(), held.fence().get() + 1);
}

/// On Redis the fence key is still there after a break.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_leaves_the_fence_key_on_redis() {
    let prefix = unique("fence");
    let locker = Locker::builder(backend(Kind::Standalone).await)
        .prefix(&prefix)
        .build()
        .unwrap();
    let lease = locker.try_acquire("x", &LockOptions::new()).await.unwrap();
    let keys = locker.keys_for("x");
    assert!(locker.break_lock("x").await.unwrap());
    assert_eq!(server().cli(&["EXISTS", &keys.lock]), "0");
    assert_eq!(
        server().cli(&["GET", &keys.fence]),
        lease.fence().to_string()
    );
}
