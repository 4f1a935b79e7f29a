//! Redlock over 3 and 5 independent redis-server processes: quorum with one
//! instance down or paused, mutual exclusion, fence = max (and written back),
//! failure with a majority down, refusal of a lease acquired too slowly, loss.

mod lock_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{
    Error, FencingToken, LockBackend, LockOptions, Locker, LockerBuilder, MemoryBackend,
    RedisBackend,
};
use tollgate_testkit::RedisServer;

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start().unwrap()).collect()
}

/// A Redlock over fresh connections to every server.
async fn builder(servers: &[RedisServer]) -> LockerBuilder {
    let mut backends = Vec::new();
    for s in servers {
        backends.push(RedisBackend::connect(&s.url()).await.unwrap());
    }
    Locker::redlock_builder(backends)
}

fn assert_no_immortal_keys(servers: &[RedisServer]) {
    for s in servers {
        if let Ok(mut con) = s.client().get_connection() {
            let keys: Vec<String> = match redis::cmd("KEYS").arg("*").query(&mut con) {
                Ok(k) => k,
                Err(_) => continue, // stopped
            };
            for key in keys {
                let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
                // 0: in its last millisecond (a release marker, say).
                assert!(pttl >= 0 || pttl == -2, "{key} has no TTL");
            }
        }
    }
}

/// `redlocks` × `tasks_each` tasks, `total` acquisitions of one name with a
/// read-modify-write inside: no overlap, no lost update, increasing fences.
async fn contended(redlocks: &[Locker], tasks_each: usize, total: usize) {
    lock_common::run_contended(redlocks, redlocks.len() * tasks_each, total).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_masters_one_down() {
    let mut servers = servers(3);
    let mut redlocks = Vec::new();
    for _ in 0..3 {
        redlocks.push(builder(&servers).await.build().unwrap());
    }
    assert_eq!(redlocks[0].quorum(), 2);
    assert_eq!(redlocks[0].backend_kind(), "redlock");
    servers[2].stop();
    let start = Instant::now();
    contended(&redlocks, 4, 1000).await;
    eprintln!(
        "3 masters, one down: 1000 acquisitions in {:?}",
        start.elapsed()
    );

    // A release reaches every live instance.
    let lease = redlocks[0]
        .try_acquire("gone", &LockOptions::new())
        .await
        .unwrap();
    let key = lease.key().to_owned();
    assert!(lease.release().await.unwrap());
    for s in &servers[..2] {
        assert_eq!(s.cli(&["EXISTS", &key]), "0");
    }
    assert_no_immortal_keys(&servers[..2]);
}

/// An error about one name's keys on one instance (its fence key of
/// another type) is not that instance being down: the next name is still
/// taken there too, not on the others alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_error_on_one_instance_spares_it_for_other_names() {
    let servers = servers(3);
    let redlock = builder(&servers).await.build().unwrap();
    let bad = redlock.keys_for("bad");
    assert_eq!(servers[0].cli(&["HSET", &bad.fence, "x", "1"]), "1");
    servers[0].cli(&["PEXPIRE", &bad.fence, "60000"]);
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    // The other two instances make the quorum; the first answers WRONGTYPE.
    let lease = redlock.try_acquire("bad", &opts).await.unwrap();
    let held: Vec<String> = servers
        .iter()
        .map(|s| s.cli(&["EXISTS", lease.key()]))
        .collect();
    assert_eq!(held, ["0", "1", "1"]);
    assert!(lease.release().await.unwrap());
    let good = redlock.try_acquire("good", &opts).await.unwrap();
    // The acquire returns with a quorum; the third instance's answer may
    // land just after.
    for s in &servers {
        let key = good.key().to_owned();
        tollgate_testkit::eventually(Duration::from_secs(5), "taken on every instance", || {
            let taken = s.cli(&["EXISTS", &key]) == "1";
            async move { taken.then_some(()) }
        })
        .await;
    }
    assert!(good.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_masters_one_paused() {
    let servers = servers(5);
    let mut redlocks = Vec::new();
    for _ in 0..3 {
        // A short per-instance timeout, as Redlock recommends: the paused
        // instance costs at most this when the live ones split their votes.
        // Not shorter: a live instance on a loaded machine answers a release
        // late, and a release a quorum did not answer is an error.
        redlocks.push(
            builder(&servers)
                .await
                .timeout(Duration::from_millis(250))
                .build()
                .unwrap(),
        );
    }
    assert_eq!(redlocks[0].quorum(), 3);
    servers[0].pause();
    let start = Instant::now();
    let lease = redlocks[0]
        .try_acquire("p", &LockOptions::new())
        .await
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(lease.release().await.unwrap());
    let start = Instant::now();
    contended(&redlocks, 4, 500).await;
    eprintln!(
        "5 masters, one paused: 500 acquisitions in {:?}",
        start.elapsed()
    );

    // Renewal keeps a lease across its TTL with one instance paused.
    let ttl = Duration::from_millis(400);
    let lease = redlocks[1]
        .try_acquire("renew", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(lease.is_held());
    assert!(lease.release().await.unwrap());
    servers[0].resume();
    assert_no_immortal_keys(&servers);
}

/// The fence is the max over the quorum, and it is written back, so the next
/// quorum produces a higher one even without the instance that was ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_is_the_quorum_max_and_stays_increasing() {
    let mut servers = servers(3);
    let redlock = builder(&servers).await.build().unwrap();
    let keys = redlock.keys_for("f");
    // Instance 0's clock (or history) is far ahead of the others.
    let ahead: u64 = 9_000_000_000_000_000;
    servers[0].cli(&["SET", &keys.fence, &ahead.to_string(), "PX", "600000"]);
    // With instance 2 paused, the quorum is {0, 1}: the fence is the max.
    servers[2].pause();
    let lease = redlock.try_acquire("f", &LockOptions::new()).await.unwrap();
    assert_eq!(lease.fence().get(), ahead + 1);
    assert!(lease.release().await.unwrap());
    servers[2].resume();
    // Without instance 0, the quorum is {1, 2}: still above, because the
    // agreed fence was written back to instance 1.
    servers[0].stop();
    let mut last = FencingToken(ahead + 1);
    for _ in 0..20 {
        let lease = redlock.try_acquire("f", &LockOptions::new()).await.unwrap();
        assert!(lease.fence() > last, "{} <= {last}", lease.fence());
        last = lease.fence();
        assert!(lease.release().await.unwrap());
    }
    assert_no_immortal_keys(&servers[1..]);
}

/// With a majority down, a try fails at once; a bounded wait keeps retrying
/// and fails only once its bound has passed (issue #16, defect 1: it used to
/// give up on the first error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_down_fails() {
    let mut servers = servers(3);
    let redlock = builder(&servers).await.build().unwrap();
    servers[0].stop();
    servers[1].stop();
    let start = Instant::now();
    let err = redlock
        .try_acquire("m", &LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    let bound = Duration::from_secs(2);
    let start = Instant::now();
    let err = redlock
        .acquire("m", &LockOptions::new().wait(bound))
        .await
        .unwrap_err();
    let waited = start.elapsed();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        waited >= bound,
        "gave up after {waited:?}, before the bound"
    );
    assert!(waited < bound + Duration::from_secs(3), "{waited:?}");
    // Nothing is left behind on the live instance: released, long before
    // its 30 s TTL.
    let key = redlock.keys_for("m").lock;
    tollgate_testkit::eventually(
        Duration::from_secs(5),
        "released on the live instance",
        || async { (servers[2].cli(&["EXISTS", &key]) == "0").then_some(()) },
    )
    .await;
}

/// Resumes `servers` (SIGCONT) `after` from now, from a thread of its own.
fn resume_after(servers: &[&RedisServer], after: Duration) -> std::thread::JoinHandle<()> {
    let pids: Vec<u32> = servers.iter().map(|s| s.pid().unwrap()).collect();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        for pid in pids {
            std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status()
                .unwrap();
        }
    })
}

/// A blip shorter than the wait bound is ridden out: a bounded wait retries
/// with a backoff through the errors and acquires once the backend answers
/// (issue #16, defect 1) — on one instance and on a Redlock majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_rides_out_a_blip() {
    let servers = servers(3);
    let single = Locker::builder(RedisBackend::connect(&servers[0].url()).await.unwrap())
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let redlock = builder(&servers)
        .await
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // Warm the connections and the script caches.
    for locker in [&single, &redlock] {
        let lease = locker.try_acquire("warm", &LockOptions::new()).await;
        assert!(lease.unwrap().release().await.unwrap());
    }
    let wait = LockOptions::new().wait(Duration::from_secs(5));

    servers[0].pause();
    let start = Instant::now();
    let resumer = resume_after(&[&servers[0]], Duration::from_millis(300));
    let lease = single.acquire("blip", &wait).await;
    let took = start.elapsed();
    resumer.join().unwrap();
    let lease = lease.unwrap_or_else(|e| panic!("gave up after {took:?}: {e:?}"));
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(lease.release().await.unwrap());

    servers[0].pause();
    servers[1].pause();
    let start = Instant::now();
    let resumer = resume_after(&[&servers[0], &servers[1]], Duration::from_millis(300));
    let lease = redlock.acquire("blip", &wait).await;
    let took = start.elapsed();
    resumer.join().unwrap();
    let lease = lease.unwrap_or_else(|e| panic!("gave up after {took:?}: {e:?}"));
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(lease.release().await.unwrap());
    assert_no_immortal_keys(&servers);
}

/// An acquire slower than the TTL yields no lease: validity = ttl − elapsed −
/// drift is gone, so it is refused and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_acquire_is_refused() {
    let servers = servers(3);
    let redlock = builder(&servers)
        .await
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    // Warm the connections and the script cache.
    redlock
        .try_acquire("warm", &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    servers[0].pause();
    servers[1].pause();
    let pids = [servers[0].pid().unwrap(), servers[1].pid().unwrap()];
    // Started before the resumer: the instances answer no earlier than
    // 1.3 s from here, past the 1 s TTL's validity.
    let start = Instant::now();
    let resumer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1300));
        for pid in pids {
            std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status()
                .unwrap();
        }
    });
    let err = redlock
        .try_acquire("slow", &LockOptions::new().ttl(Duration::from_secs(1)))
        .await
        .unwrap_err();
    // Measured before joining the resumer (which sleeps 1.3 s itself): the
    // acquire did wait for the paused instances.
    let took = start.elapsed();
    resumer.join().unwrap();
    assert!(took >= Duration::from_millis(1300), "{took:?}");
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    // The refused lock is released everywhere: well before its 1 s TTL
    // (from the resume) could end it.
    let key = redlock.keys_for("slow").lock;
    tollgate_testkit::eventually(
        Duration::from_millis(700),
        "the refused lock released",
        || async {
            servers
                .iter()
                .all(|s| s.cli(&["EXISTS", &key]) == "0")
                .then_some(())
        },
    )
    .await;
    // And a normal acquire works again.
    let lease = redlock
        .try_acquire("slow", &LockOptions::new())
        .await
        .unwrap();
    assert!(lease.release().await.unwrap());
}

/// Two of three instances paused: renewal cannot reach a quorum, so lost()
/// resolves before the TTL runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_paused_is_loss_before_ttl() {
    let servers = servers(3);
    let redlock = builder(&servers)
        .await
        .drift(0.3, Duration::from_millis(10))
        .build()
        .unwrap();
    // Validity ends at 0.7 × 3 s: the 900 ms left before the TTL absorb a
    // timer woken late on a loaded machine, not a renewal that still works.
    let ttl = Duration::from_secs(3);
    let before = Instant::now();
    let lease = redlock
        .try_acquire("l", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    servers[1].pause();
    servers[2].pause();
    tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .unwrap();
    assert!(
        before.elapsed() < ttl,
        "lost only after {:?}",
        before.elapsed()
    );
    assert!(lease.is_lost());
    servers[1].resume();
    servers[2].resume();
}

/// A release that too few instances answer cannot tell whether the lock
/// was still held: it is an error, never `Ok(false)` ("it had expired"),
/// and the lock, released on the instance that answered, expires on the
/// others at its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_a_majority_does_not_answer_is_an_error() {
    let servers = servers(3);
    let redlock = builder(&servers)
        .await
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(2);
    let lease = redlock
        .try_acquire("r", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    servers[1].pause();
    servers[2].pause();
    let released = lease.release().await;
    servers[1].resume();
    servers[2].resume();
    assert!(
        matches!(released, Err(Error::Timeout(_))),
        "the lock was held on every instance: {released:?}"
    );
    let mut con = servers[0].client().get_connection().unwrap();
    let held: bool = redis::cmd("EXISTS")
        .arg("tollgate:lock:{r}")
        .query(&mut con)
        .unwrap();
    assert!(!held, "released where the release was answered");
    let again =
        tollgate_testkit::eventually(Duration::from_secs(10), "free at the TTL", || async {
            redlock.try_acquire("r", &LockOptions::new()).await.ok()
        })
        .await;
    assert!(again.release().await.unwrap());
    assert_no_immortal_keys(&servers);
}

/// Waiters on a Redlock wake on the release notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiter_wakes_on_release() {
    let servers = servers(3);
    let a = builder(&servers).await.build().unwrap();
    // The waiter's instances, watched together.
    let mut instances: Vec<lock_common::Watched> = Vec::new();
    for s in &servers {
        let backend: Arc<dyn LockBackend> =
            Arc::new(RedisBackend::connect(&s.url()).await.unwrap());
        instances.push(match instances.first() {
            Some(w) => w.also(backend),
            None => lock_common::Watched::new(backend),
        });
    }
    let watched = instances[0].clone();
    let b = Locker::redlock_builder(instances)
        .poll_interval(Duration::from_secs(10))
        .build()
        .unwrap();
    let lease = a.try_acquire("w", &LockOptions::new()).await.unwrap();
    let waiter = tokio::spawn(async move {
        let l = b
            .acquire("w", &LockOptions::new().wait(Duration::from_secs(20)))
            .await
            .unwrap();
        (Instant::now(), l.fence())
    });
    lock_common::release_wakes_waiter(lease, &watched, waiter).await;
}

/// Any mix of backends works as instances (`Arc<dyn LockBackend>`).
#[tokio::test]
async fn redlock_over_memory_instances() {
    let instances: Vec<Arc<dyn LockBackend>> = (0..3)
        .map(|_| Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>)
        .collect();
    let redlock = Locker::redlock(instances.clone()).unwrap();
    let other = Locker::redlock(instances).unwrap();
    let lease = redlock.try_acquire("x", &LockOptions::new()).await.unwrap();
    assert!(matches!(
        other.try_acquire("x", &LockOptions::new()).await,
        Err(Error::Busy { .. })
    ));
    let fence = lease.fence();
    assert!(lease.release().await.unwrap());
    assert!(
        other
            .try_acquire("x", &LockOptions::new())
            .await
            .unwrap()
            .fence()
            > fence
    );
}

/// A Redlock acquire dropped while its requests are in flight (applied on
/// the instances, replies not back yet) leaves no lock on any instance: the
/// attempt completes in its own task and releases what it got. The same for
/// a dropped release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquire_and_release_leave_no_lock() {
    let servers = servers(3);
    let delayed = |acquire_reply, release_send| {
        let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
        async move {
            let mut instances = Vec::new();
            for url in urls {
                instances.push(lock_common::Delayed {
                    inner: Arc::new(RedisBackend::connect(&url).await.unwrap()),
                    acquire_reply,
                    extend_reply: Duration::ZERO,
                    release_send,
                });
            }
            Locker::redlock(instances).unwrap()
        }
    };
    let slow_acquire = delayed(Duration::from_millis(200), Duration::ZERO).await;
    let slow_release = delayed(Duration::ZERO, Duration::from_millis(200)).await;
    let other = builder(&servers).await.build().unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        slow_acquire.try_acquire("d", &opts),
    )
    .await;
    assert!(dropped.is_err(), "the delayed acquire finished early");
    let lease = lock_common::acquire_within(&other, "d", &opts, Duration::from_secs(3)).await;
    assert!(lease.release().await.unwrap());

    let lease = slow_release.try_acquire("d", &opts).await.unwrap();
    let dropped = tokio::time::timeout(Duration::from_millis(50), lease.release()).await;
    assert!(dropped.is_err(), "the delayed release finished early");
    let lease = lock_common::acquire_within(&other, "d", &opts, Duration::from_secs(3)).await;
    assert!(lease.release().await.unwrap());
    assert_no_immortal_keys(&servers);
}
