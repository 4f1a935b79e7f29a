//! The lock behaviour suite on a standalone redis-server, plus fault cases:
//! SIGSTOP, restart without persistence, renewal after release, one
//! subscription per locker, no pub/sub.

mod lock_common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lock_common::{assert_all_keys_expire, Standalone};
use tollgate_core::{Error, LockOptions, Locker, RedisBackend};
use tollgate_testkit::RedisServer;

fn server() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(|| RedisServer::start().expect("redis-server"))
}

behaviour_suite!(Standalone(server()), 10_000);
replay_suite!(Standalone(server()));

/// SIGSTOP while a lease is held: lost() resolves before the TTL has run out
/// (measured from before the acquire), and no call hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_is_loss_before_ttl() {
    let server = RedisServer::start().unwrap();
    let locker = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        // A generous drift allowance so a noisy test machine's timer lateness
        // cannot push lost() past the TTL.
        .drift(0.2, Duration::from_millis(10))
        .build()
        .unwrap();
    let ttl = Duration::from_millis(1500);
    let before = Instant::now();
    let lease = locker
        .try_acquire("stop", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    server.pause();
    tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("lost() never resolved");
    let lost_at = before.elapsed();
    assert!(lost_at < ttl, "lost() only after {lost_at:?}");
    assert!(lease.is_lost() && !lease.is_held());

    // Calls are bounded while Redis is frozen.
    let start = Instant::now();
    let err = locker
        .try_acquire("other", &LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    let err = lease.release().await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    server.resume();
    let again = locker
        .acquire("stop", &LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(again.release().await.unwrap());
    assert_all_keys_expire(&server);
}

/// Fences keep increasing after Redis restarts without persistence (the
/// fence key is gone; the server time is the floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_survive_a_restart_without_persistence() {
    let mut server = RedisServer::start().unwrap();
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let mut last = None;
    for _ in 0..200 {
        let lease = locker.try_acquire("f", &LockOptions::new()).await.unwrap();
        assert!(last < Some(lease.fence()));
        last = Some(lease.fence());
        assert!(lease.release().await.unwrap());
    }
    let before = last.unwrap();
    server.restart().unwrap();
    assert_eq!(server.cli(&["DBSIZE"]), "0");
    // The connection manager reconnects; the first call may see the old
    // connection die.
    let mut lease = None;
    for _ in 0..50 {
        match locker.try_acquire("f", &LockOptions::new()).await {
            Ok(l) => {
                lease = Some(l);
                break;
            }
            Err(e) => {
                assert!(e.is_unavailable(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let lease = lease.expect("no acquire after the restart");
    assert!(lease.fence() > before, "{} <= {before}", lease.fence());
    assert!(lease.release().await.unwrap());
    assert_all_keys_expire(&server);
}

fn commandstat(server: &RedisServer, command: &str) -> u64 {
    server.command_calls(command)
}

/// Renewal stops at release: no PEXPIRE reaches Redis afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_renewal_after_release() {
    let server = RedisServer::start().unwrap();
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let ttl = Duration::from_millis(150);
    let lease = locker
        .try_acquire("r", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    let during = commandstat(&server, "pexpire");
    assert!(during >= 2, "the watchdog did not renew ({during})");
    assert!(lease.release().await.unwrap());
    let at_release = commandstat(&server, "pexpire");
    tokio::time::sleep(ttl * 4).await;
    assert_eq!(
        commandstat(&server, "pexpire"),
        at_release,
        "renewed after release"
    );

    // The same after a drop.
    let lease = locker
        .try_acquire("r", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    drop(lease);
    // The drop's release has run once the key is gone (a renewing watchdog
    // would keep it).
    tollgate_testkit::eventually(
        Duration::from_secs(5),
        "the dropped lease's key is gone",
        || async { (server.cli(&["EXISTS", &locker.keys_for("r").lock]) == "0").then_some(()) },
    )
    .await;
    let at_drop = commandstat(&server, "pexpire");
    tokio::time::sleep(ttl * 4).await;
    assert_eq!(
        commandstat(&server, "pexpire"),
        at_drop,
        "renewed after drop"
    );
    assert_eq!(server.cli(&["EXISTS", &locker.keys_for("r").lock]), "0");
}

/// Clients with a pattern subscription (`PUBSUB NUMPAT` counts distinct
/// patterns since Redis 7: one however many clients subscribe to it).
fn numpat(server: &RedisServer) -> usize {
    server
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("psub=") && f != "psub=0")
        })
        .count()
}

/// Waiters of one locker share one subscription, and it ends with the locker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscription_per_locker() {
    let server = RedisServer::start().unwrap();
    let holder = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let watched = lock_common::Watched::new(std::sync::Arc::new(
        RedisBackend::connect(&server.url()).await.unwrap(),
    ));
    let locker = Locker::new(watched.clone());
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let mut held = Vec::new();
    for i in 0..8 {
        held.push(holder.try_acquire(format!("n{i}"), &opts).await.unwrap());
    }
    let mut waiters = Vec::new();
    for i in 0..32 {
        let locker = locker.clone();
        let opts = opts.clone().wait(Duration::from_secs(20));
        waiters.push(tokio::spawn(async move {
            locker.acquire(format!("n{}", i % 8), &opts).await.map(drop)
        }));
    }
    // Every waiter has been refused, so waits (a waiter registers before it
    // first tries, and a subscription is asked for as it registers): one
    // was asked for, for all 32, and it comes up.
    watched.refused(32).await;
    assert_eq!(
        watched.subscriptions_asked(),
        1,
        "one pattern subscription for 32 waiters"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while numpat(&server) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(numpat(&server), 1);
    for lease in held {
        assert!(lease.release().await.unwrap());
    }
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    assert_eq!(numpat(&server), 1);
    drop(locker);
    let deadline = Instant::now() + Duration::from_secs(5);
    while numpat(&server) != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(numpat(&server), 0, "the subscription outlived its locker");
    assert_all_keys_expire(&server);
}

/// Without a pub/sub client, waiters poll and still get the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_without_pubsub_polls() {
    let conn = server().connection_manager().await;
    let a = Locker::builder(RedisBackend::from_connection(conn.clone()))
        .prefix("nopubsub")
        .build()
        .unwrap();
    let watched =
        lock_common::Watched::new(std::sync::Arc::new(RedisBackend::from_connection(conn)));
    let b = Locker::builder(watched.clone())
        .prefix("nopubsub")
        .build()
        .unwrap();
    let lease = a.try_acquire("p", &LockOptions::new()).await.unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire("p", &LockOptions::new().wait(Duration::from_secs(10)))
            .await
            .map(|l| l.fence())
    });
    // Refused once, it waits (and can only poll: no notification comes).
    watched.refused(1).await;
    assert!(!waiter.is_finished(), "acquired while held");
    let fence = lease.fence();
    assert!(lease.release().await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    assert!(next > fence);
    assert!(matches!(
        a.try_acquire("p", &LockOptions::new().ttl(Duration::from_micros(10)))
            .await,
        Err(Error::InvalidConfig(_))
    ));
}

/// A single-instance acquire slower than the lease's validity is refused
/// (and released), not handed out already expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_acquire_is_refused() {
    let server = RedisServer::start().unwrap();
    let locker = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    // Warm the connection and the script cache.
    drop(
        locker
            .try_acquire("warm", &LockOptions::new())
            .await
            .unwrap(),
    );
    server.pause();
    let pid = server.pid().unwrap();
    // Paused past the 1 s TTL's validity.
    let resumer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1300));
        std::process::Command::new("kill")
            .args(["-CONT", &pid.to_string()])
            .status()
            .unwrap();
    });
    let err = locker
        .try_acquire("slow", &LockOptions::new().ttl(Duration::from_secs(1)))
        .await
        .unwrap_err();
    resumer.join().unwrap();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    // Released, well before its 1 s TTL (from the resume) could end it.
    let key = locker.keys_for("slow").lock;
    tollgate_testkit::eventually(
        Duration::from_millis(700),
        "the refused lock released",
        || async { (server.cli(&["EXISTS", &key]) == "0").then_some(()) },
    )
    .await;
    let lease = locker
        .try_acquire("slow", &LockOptions::new())
        .await
        .unwrap();
    // Ownership is the lease, not the task: release it from another task.
    let released = tokio::spawn(async move { lease.release().await })
        .await
        .unwrap();
    assert!(released.unwrap());
}

fn pttl_ms(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).parse().unwrap()
}

/// Fence keys are short-lived — 1 hour after the last acquire by default,
/// at least 10 × the lock's TTL — so one-off lock names (one per order id)
/// do not pile up; and fences keep increasing once the fence key is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_keys_are_short_lived() {
    let server = server();
    let locker = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .prefix("fencettl")
        .build()
        .unwrap();
    let fence_key = locker.keys_for("order-1").fence;
    let hour_ms = 3_600_000;

    let lease = locker
        .try_acquire("order-1", &LockOptions::new())
        .await
        .unwrap();
    let first = lease.fence();
    assert!(lease.release().await.unwrap());
    let pttl = pttl_ms(server, &fence_key);
    assert!(pttl > hour_ms - 60_000 && pttl <= hour_ms, "PTTL {pttl}");

    // A long lock TTL stretches it to 10 × the TTL.
    let lease = locker
        .try_acquire(
            "order-1",
            &LockOptions::new()
                .ttl(Duration::from_secs(600))
                .renew(false),
        )
        .await
        .unwrap();
    let second = lease.fence();
    assert!(second > first);
    assert!(lease.release().await.unwrap());
    let pttl = pttl_ms(server, &fence_key);
    assert!(
        pttl > 6_000_000 - 60_000 && pttl <= 6_000_000,
        "PTTL {pttl}"
    );

    // A configured fence TTL applies, with the same 10 × TTL floor.
    let short = Locker::builder(RedisBackend::connect(&server.url()).await.unwrap())
        .prefix("fencettl")
        .fence_ttl(Duration::from_secs(5))
        .build()
        .unwrap();
    let lease = short
        .try_acquire("order-1", &LockOptions::new().ttl(Duration::from_secs(2)))
        .await
        .unwrap();
    let third = lease.fence();
    assert!(third > second);
    assert!(lease.release().await.unwrap());
    let pttl = pttl_ms(server, &fence_key);
    assert!(pttl > 15_000 && pttl <= 20_000, "PTTL {pttl}");

    // The fence key gone (expired, or lost with the data): still increasing.
    assert_eq!(server.cli(&["DEL", &fence_key]), "1");
    let lease = locker
        .try_acquire("order-1", &LockOptions::new())
        .await
        .unwrap();
    assert!(lease.fence() > third, "{} <= {third}", lease.fence());
    assert!(lease.release().await.unwrap());
    assert_all_keys_expire(server);
}

/// A retried acquire (same request) whose fence key vanished meanwhile still
/// gets its own lock, with a fence above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_acquire_without_its_fence_key() {
    use tollgate_core::lock::{AcquireReply, AcquireRequest};
    use tollgate_core::LockBackend;

    let server = server();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let locker = Locker::builder(backend.clone())
        .prefix("retryfence")
        .build()
        .unwrap();
    let keys = locker.keys_for("x");
    let ttl = Duration::from_secs(30);
    let request = AcquireRequest::new(keys.clone(), "c".repeat(32), ttl, ttl * 10);
    let AcquireReply::Acquired { fence } = backend.acquire_lock(&request).await.unwrap() else {
        panic!("not acquired");
    };
    assert_eq!(server.cli(&["DEL", &keys.fence]), "1");
    match backend.acquire_lock(&request).await.unwrap() {
        AcquireReply::Acquired { fence: again } => assert!(again > fence),
        held => panic!("not acquired: {held:?}"),
    }
    let pttl = pttl_ms(server, &keys.fence);
    assert!(pttl > 0 && pttl <= 300_000, "PTTL {pttl}");
    assert!(backend.release_lock(&keys, &request.token).await.unwrap());
}

/// A wait ends at its bound even with an attempt in flight: here every
/// reply of the waiter's connection comes 1 s late and the lock stays
/// held: the second attempt, sent once the first has answered (at 1 s),
/// would answer at 2 s or later; it is left to its task, and the waiter
/// hears Busy at the 1.2 s bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_in_flight_at_the_bound_does_not_hold_the_wait() {
    let server = RedisServer::start().unwrap();
    let holder = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let held = LockOptions::new().ttl(Duration::from_secs(30));
    let _lease = holder.try_acquire("slow", &held).await.unwrap();
    let slow = tollgate_testkit::ReplyDelay::start(&server.addr())
        .await
        .unwrap();
    let waiter = Locker::builder(RedisBackend::connect(&slow.url()).await.unwrap())
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    slow.set(Duration::from_secs(1));
    let bound = Duration::from_millis(1200);
    let started = Instant::now();
    let e = waiter
        .acquire("slow", &held.clone().wait(bound))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(e, Error::Busy { .. }), "{e}");
    // Waiting for the second attempt's answer would take 2 s or more.
    assert!(elapsed < Duration::from_millis(1800), "{elapsed:?}");
}
