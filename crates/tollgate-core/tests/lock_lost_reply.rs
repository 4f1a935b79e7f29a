//! Releases whose reply is really lost (issue #16, defect 3): the server
//! holding the name is frozen (SIGSTOP) with the release in its socket, the
//! caller gives up, the server thaws and runs it, and the caller's retry of
//! the same release reports "released" — the truth — on a standalone Redis
//! and on a Redis Cluster (the node that owns the name's slot), for a lock
//! and for permits. The marker that makes the retry truthful lives at most
//! [`RELEASE_MARKER_TTL`]. Redlock: a release replayed on every instance
//! still reports the quorum held it. An extend to a shorter TTL whose
//! reply is lost ends the lease's trust when that TTL would.

mod lock_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_common::replay::{token, Name, Replaying};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, RELEASE_MARKER_TTL};
use tollgate_core::{LockBackend, LockOptions, Locker, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};

/// Acquires `name`'s keys with token `a`, freezes `node` while a release is
/// sent, gives up on it after 200 ms, thaws `node`, waits until the release
/// has run, and retries it: released. Then checks the marker's TTL.
async fn lost_reply_then_retry(backend: &RedisBackend, node: &RedisServer, keys: &LockKeys) {
    let (ttl, fence_ttl) = (Duration::from_secs(30), Duration::from_secs(300));
    let a = AcquireRequest::new(keys.clone(), token('a'), ttl, fence_ttl);
    assert!(matches!(
        backend.acquire_lock(&a).await.unwrap(),
        AcquireReply::Acquired { .. }
    ));
    // A token that never held it: not held. (This also loads the script, so
    // the release below is one EVALSHA, not a NOSCRIPT then an EVAL that
    // the caller, having given up, would never send.)
    assert!(!backend.release_lock(keys, &token('b')).await.unwrap());
    node.pause();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        backend.release_lock(keys, &a.token),
    )
    .await;
    node.resume();
    assert!(
        gave_up.is_err(),
        "the release answered from a frozen server"
    );
    // The release was in the server's socket: it runs now, unanswered.
    let deadline = Instant::now() + Duration::from_secs(5);
    while node.cli(&["EXISTS", &keys.lock]) != "0" {
        assert!(Instant::now() < deadline, "the release never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut retried = None;
    for _ in 0..50 {
        // A connection the freeze broke may fail once: retry it too.
        match backend.release_lock(keys, &a.token).await {
            Ok(r) => {
                retried = Some(r);
                break;
            }
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert_eq!(retried, Some(true), "the retried release reported not held");
    let marker = keys.release_marker(&a.token);
    let pttl: i64 = node.cli(&["PTTL", &marker]).parse().unwrap();
    let most = RELEASE_MARKER_TTL.as_millis() as i64;
    assert!(pttl > 0 && pttl <= most, "marker {marker}: PTTL {pttl}");
    assert!(!backend.release_lock(keys, &token('b')).await.unwrap());
}

/// The kinds of names: a lock, plain and weighted permits, a fair name.
const NAMES: [Option<(u32, u32, bool)>; 4] = [
    None,
    Some((3, 1, false)),
    Some((4, 2, false)),
    Some((1, 1, true)),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_lost_reply() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    for permits in NAMES {
        let keys = Name::new("lost", permits).keys();
        lost_reply_then_retry(&backend, &server, &keys).await;
    }
    lock_common::assert_all_keys_expire(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lost_reply() {
    let cluster = RedisCluster::start().unwrap();
    let backend = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    for permits in NAMES {
        let keys = Name::new("lost", permits).keys();
        // The node that owns the name's slot answers, the others redirect.
        let owner = cluster
            .nodes()
            .iter()
            .find(|n| !n.cli(&["EXISTS", &keys.lock]).starts_with("MOVED"))
            .unwrap();
        lost_reply_then_retry(&backend, owner, &keys).await;
    }
    for node in cluster.nodes() {
        lock_common::assert_all_keys_expire(node);
    }
}

/// Redlock over three servers whose every release is replayed: the holder
/// is told the quorum held its lock; a lost lease is still told it was not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_release_survives_a_replay() {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let mut replaying = Vec::new();
    let mut plain = Vec::new();
    for s in &servers {
        let b: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(&s.url()).await.unwrap());
        replaying.push(Arc::new(Replaying(b.clone())) as Arc<dyn LockBackend>);
        plain.push(b);
    }
    let replaying = Locker::redlock(replaying).unwrap();
    let plain = Locker::redlock(plain).unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = replaying.try_acquire("r", &opts).await.unwrap();
    assert!(lease.release().await.unwrap(), "told it had lost the lock");
    let next = plain.try_acquire("r", &opts).await.unwrap();

    let short = LockOptions::new()
        .ttl(Duration::from_millis(150))
        .renew(false);
    let lost = replaying.try_acquire("s", &short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taker = plain.try_acquire("s", &opts).await.unwrap();
    assert!(
        !lost.release().await.unwrap(),
        "released someone else's lock"
    );
    assert!(taker.release().await.unwrap() && next.release().await.unwrap());
    for s in &servers {
        lock_common::assert_all_keys_expire(s);
    }
}

/// An `extend` to a shorter TTL whose reply is lost (it came after the
/// round trip's bound) may still have been applied: the lease must stop
/// trusting itself when the shorter TTL ends, not at its old deadline —
/// by then another holder can have the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_extend_whose_reply_is_lost_ends_trust_early() {
    let server = RedisServer::start().unwrap();
    let slow = tollgate_testkit::ReplyDelay::start(&server.addr())
        .await
        .unwrap();
    let prefix = tollgate_testkit::unique("short");
    let late = Locker::builder(RedisBackend::connect(&slow.url()).await.unwrap())
        .prefix(&prefix)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let direct = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .prefix(&prefix)
        .build()
        .unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30)).renew(false);
    let lease = late.try_acquire("job", &options).await.unwrap();
    // Loads the script: the extend below is one EVALSHA, not a NOSCRIPT
    // whose late reply would stop it before it is sent.
    assert!(lease.extend(Duration::from_secs(30)).await.unwrap());
    slow.set(Duration::from_secs(2));
    assert!(lease.extend(Duration::from_millis(300)).await.is_err());
    // The shorter TTL was applied: the lock is free once it ends.
    let other = tollgate_testkit::eventually(Duration::from_secs(5), "the lock expires", || {
        let (direct, options) = (&direct, &options);
        async move { direct.try_acquire("job", options).await.ok() }
    })
    .await;
    assert!(other.is_held());
    assert!(!lease.is_held(), "two leases trust themselves at once");
    // And the loss is reported then, not at the old deadline.
    tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("the loss is reported when the shorter TTL ends");
}
