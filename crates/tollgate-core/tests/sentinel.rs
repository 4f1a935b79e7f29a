//! Redis Sentinel: the backend follows a failover to the promoted replica,
//! whether the old master is demoted politely or simply stops answering.
#![cfg(feature = "sentinel")]

mod lock_common;

use std::time::{Duration, Instant};

use tollgate_core::{
    Algorithm, DecisionSource, FailurePolicy, Quota, RateLimiter, RedisBackend, Subject,
};
use tollgate_testkit::RedisServer;

struct Topology {
    master: RedisServer,
    replica: RedisServer,
    sentinel: RedisServer,
    limiter: RateLimiter,
}

/// A master, its replica and one sentinel that knows both, and a limiter on
/// the sentinel backend that has written to the master.
async fn topology(timeout: Duration) -> Topology {
    let master = RedisServer::start().unwrap();
    let port = master.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let sentinel = RedisServer::start_sentinel(&master, "main").unwrap();
    let backend = RedisBackend::sentinel(&[sentinel.url()], "main").unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_hour(1000))
        .failure_policy(FailurePolicy::Deny)
        .timeout(timeout)
        .circuit_breaker(u32::MAX, Duration::from_millis(1))
        .deny_cache(0)
        .build()
        .unwrap();
    let d = limiter.check("s").await.unwrap();
    assert!(d.allowed && d.source == DecisionSource::Backend);
    assert!(
        master.cli(&["DBSIZE"]).parse::<u64>().unwrap() > 0,
        "wrote to the master"
    );
    // The sentinel must know the replica before it can promote it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sentinel
        .cli(&["SENTINEL", "REPLICAS", "main"])
        .contains(&replica.port().to_string())
    {
        assert!(Instant::now() < deadline, "sentinel never saw the replica");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while !replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Topology {
        master,
        replica,
        sentinel,
        limiter,
    }
}

/// Checks until one lands on the promoted replica — each on a fresh subject,
/// whose key must then exist there (a write that went to the old master, or
/// nowhere, does not count); errors on the way are unavailability, never
/// anything else.
async fn until_checks_reach(new_master: &RedisServer, limiter: &RateLimiter) {
    let deadline = Instant::now() + Duration::from_secs(40);
    while !new_master.cli(&["ROLE"]).starts_with("master") {
        assert!(Instant::now() < deadline, "no failover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut errors = 0;
    for n in 0.. {
        let subject = Subject::new(format!("after-{n}"));
        let key = limiter.keys_for(&subject).remove(0);
        assert_eq!(new_master.cli(&["EXISTS", &key]), "0", "{key}");
        match limiter.check(subject).await {
            Ok(d) if new_master.cli(&["EXISTS", &key]) == "1" => {
                assert_eq!(d.source, DecisionSource::Backend);
                assert!(d.allowed);
                return;
            }
            Ok(_) => {}
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                errors += 1;
            }
        }
        assert!(
            Instant::now() < deadline,
            "never reached the new master ({errors} errors)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_that_demotes_the_master() {
    let t = topology(Duration::from_secs(2)).await;
    assert_eq!(t.sentinel.cli(&["SENTINEL", "FAILOVER", "main"]), "OK");
    until_checks_reach(&t.replica, &t.limiter).await;
    drop(t.master);
}

/// A paused master answers nothing: no error reaches the connection, only
/// abandoned requests. The backend still finds the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_away_from_a_paused_master() {
    let t = topology(Duration::from_millis(200)).await;
    t.master.pause();
    until_checks_reach(&t.replica, &t.limiter).await;
    t.master.resume();
}

/// An old master that is still reachable but no longer takes writes (cut
/// off from its replicas, with `min-replicas-to-write` set, it answers
/// NOREPLICAS) while Sentinel names another: the backend asks Sentinel
/// again and follows, rather than failing every check until the old
/// master is reconfigured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_away_from_a_master_refusing_writes() {
    let t = topology(Duration::from_secs(2)).await;
    assert_eq!(t.replica.cli(&["REPLICAOF", "NO", "ONE"]), "OK");
    assert_eq!(t.sentinel.cli(&["SENTINEL", "REMOVE", "main"]), "OK");
    let port = t.replica.port().to_string();
    assert_eq!(
        t.sentinel
            .cli(&["SENTINEL", "MONITOR", "main", "127.0.0.1", &port, "1"]),
        "OK"
    );
    assert_eq!(
        t.master
            .cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]),
        "OK"
    );
    until_checks_reach(&t.replica, &t.limiter).await;
}

/// Semaphores and idempotency records on a Sentinel backend: the bound and
/// the replay hold, and after a failover permits are taken on the promoted
/// replica (its key is there: a check that fails if the write went
/// elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_idempotency_follow_a_failover() {
    use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore, StoredResponse};
    use tollgate_core::{Error, LockOptions, Semaphore, Subject};

    let t = topology(Duration::from_secs(2)).await;
    let backend = || RedisBackend::sentinel(&[t.sentinel.url()], "main").unwrap();
    let permits = Semaphore::new(backend(), 2).unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let a = permits.try_acquire("s", &opts).await.unwrap();
    let _b = permits.try_acquire("s", &opts).await.unwrap();
    assert!(matches!(
        permits.try_acquire("s", &opts).await,
        Err(Error::Busy { .. })
    ));
    assert!(a.release().await.unwrap());

    let store = IdempotencyStore::new(backend());
    let key = Subject::new("order-1");
    let fp = Fingerprint::of(b"body");
    let Claim::Claimed(claim) = store.claim(key.clone(), fp).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    let stored = StoredResponse::new(201, vec![], b"done".to_vec());
    assert!(claim.complete(&stored).await.unwrap());
    assert!(matches!(store.claim(key, fp).await.unwrap(), Claim::Completed(r) if r == stored));

    assert_eq!(t.sentinel.cli(&["SENTINEL", "FAILOVER", "main"]), "OK");
    let deadline = Instant::now() + Duration::from_secs(40);
    while !t.replica.cli(&["ROLE"]).starts_with("master") {
        assert!(Instant::now() < deadline, "no failover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The old master may take writes until it is reconfigured (the
    // failover's window): wait until a permit lands on the new master.
    let key = permits.keys_for("after").lock;
    loop {
        match permits.try_acquire("after", &opts).await {
            Ok(p) if t.replica.cli(&["EXISTS", &key]) == "1" => {
                assert!(p.release().await.unwrap());
                break;
            }
            Ok(p) => drop(p),
            Err(e) => assert!(e.is_unavailable(), "{e}"),
        }
        assert!(
            Instant::now() < deadline,
            "no permit on the new master after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three Sentinels (quorum 2) fail a killed master over: locks follow — a
/// waiter blocked on the holder acquires on the promoted replica with a
/// fence above every earlier one (server-clock fences; one host clock here)
/// — and so do rate limits (a check's key lands on the new master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_limits_follow_three_sentinels_through_a_killed_master() {
    use tollgate_core::{LockOptions, Locker};

    let mut master = RedisServer::start().unwrap();
    let port = master.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let sentinels = RedisServer::start_sentinels(&master, "main", 3).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Each sentinel knows the replica and the two others before the kill.
    for s in &sentinels {
        while !s
            .cli(&["SENTINEL", "REPLICAS", "main"])
            .contains(&replica.port().to_string())
            || s.cli(&["SENTINEL", "SENTINELS", "main"])
                .matches("runid")
                .count()
                < 2
        {
            assert!(Instant::now() < deadline, "sentinels never met");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    while !replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let urls: Vec<String> = sentinels.iter().map(RedisServer::url).collect();
    let watched = lock_common::Watched::new(std::sync::Arc::new(
        RedisBackend::sentinel(&urls, "main").unwrap(),
    ));
    let locker = Locker::builder(watched.clone())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let mut fences = Vec::new();
    for _ in 0..3 {
        let lease = locker.acquire("job", &opts).await.unwrap();
        fences.push(lease.fence());
        assert!(lease.release().await.unwrap());
    }
    let holder = locker.acquire("job", &opts).await.unwrap();
    fences.push(holder.fence());
    let waiter = {
        let locker = locker.clone();
        let wait = LockOptions::new()
            .ttl(Duration::from_secs(5))
            .wait(Duration::from_secs(40));
        tokio::spawn(async move { locker.acquire("job", &wait).await })
    };
    // Refused while the holder holds it, it waits through the failover.
    watched.refused(1).await;
    assert!(!waiter.is_finished(), "the waiter waits for the holder");

    master.stop();
    while !replica.cli(&["ROLE"]).starts_with("master") {
        assert!(
            Instant::now() < deadline + Duration::from_secs(30),
            "no failover"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = holder.release().await;
    let lease = waiter.await.unwrap().expect("the waiter acquires");
    assert!(
        fences.iter().all(|f| lease.fence() > *f),
        "{:?} after {fences:?}",
        lease.fence()
    );
    assert_eq!(replica.cli(&["EXISTS", lease.key()]), "1");
    assert!(lease.release().await.unwrap());

    let limiter = RateLimiter::builder(
        RedisBackend::sentinel(&urls, "main").unwrap(),
        Algorithm::FixedWindow,
    )
    .quota(Quota::per_hour(10))
    .failure_policy(FailurePolicy::Deny)
    .build()
    .unwrap();
    let d = limiter.check("after").await.unwrap();
    assert_eq!((d.allowed, d.source), (true, DecisionSource::Backend));
    let key = limiter.keys_for(&Subject::new("after")).remove(0);
    assert_eq!(replica.cli(&["EXISTS", &key]), "1");
}

/// Coalescing through Sentinel (issue #15): the backend's connection follows
/// the master Sentinel names, and checks that wait while calls are in flight
/// share calls there as on a standalone Redis — 200 checks while the master
/// is frozen take a handful of script calls and admit exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_share_calls_through_sentinel() {
    let master = RedisServer::start().unwrap();
    let sentinel = RedisServer::start_sentinel(&master, "main").unwrap();
    let limiter = RateLimiter::builder(
        RedisBackend::sentinel(&[sentinel.url()], "main").unwrap(),
        Algorithm::TokenBucket,
    )
    .quota(Quota::per_hour(50))
    .failure_policy(FailurePolicy::Deny)
    .timeout(Duration::from_secs(10))
    .deny_cache(0)
    .build()
    .unwrap();
    // Connects and loads the scripts (single and batch) before counting.
    limiter.check("warm").await.unwrap();
    let mut warm = Vec::new();
    for _ in 0..40 {
        let l = limiter.clone();
        warm.push(tokio::spawn(async move { l.check("warm").await }));
    }
    for w in warm {
        w.await.unwrap().unwrap();
    }
    master.cli(&["CONFIG", "RESETSTAT"]);
    master.pause();
    let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (l, started) = (limiter.clone(), started.clone());
        tasks.push(tokio::spawn(async move {
            started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            l.check("hot").await
        }));
    }
    while started.load(std::sync::atomic::Ordering::SeqCst) < 200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Each task enters the coalescer in the poll that counted it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    master.resume();
    let mut admitted = 0;
    for t in tasks {
        if t.await.unwrap().expect("decided by the master").allowed {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 50);
    let calls = master.command_calls("evalsha") + master.command_calls("eval");
    assert!(calls <= 20, "200 checks took {calls} script calls");
}

/// A first sentinel that accepts connections and never answers makes
/// every lookup of the master slower than a check's timeout: the lookup
/// goes on after the check that started it gave up, and the master it
/// finds serves the next checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_sentinel_only_delays_the_master() {
    let master = RedisServer::start().unwrap();
    let sentinel = RedisServer::start_sentinel(&master, "main").unwrap();
    // Bound, never accepted: connections complete in the backlog, and no
    // reply ever comes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("redis://{}", silent.local_addr().unwrap());
    let backend = RedisBackend::sentinel(&[silent_url, sentinel.url()], "main").unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_hour(1000))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(100))
        .circuit_breaker(u32::MAX, Duration::from_millis(1))
        .deny_cache(0)
        .build()
        .unwrap();
    let d = tollgate_testkit::eventually(Duration::from_secs(20), "a decision", || async {
        limiter.check("s").await.ok()
    })
    .await;
    assert!(d.allowed && d.source == DecisionSource::Backend, "{d:?}");
    drop(silent);
}
