//! Redis Cluster failover, for real: a master with a synced replica is
//! SIGKILLed while limits and locks run against it. Rate limits honour
//! their failure policy during the failover (never another error, never a
//! wait past their timeout) and decide from Redis again soon after the
//! promotion; lock fences keep increasing and waiters keep waking.
//!
//! What a failover may lose: Redis replicates asynchronously, so the last
//! writes before the kill may be missing on the promoted replica (a limit
//! may admit a little more than its budget once; a lock may be free early —
//! which is what the fence is for). Fences come from the server clock
//! (`max(previous + 1, TIME in µs)`), so they keep increasing across a
//! failover as long as the new master's clock is not behind the last fence
//! handed out — here all nodes share one host clock.

mod lock_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{
    Algorithm, DecisionSource, FailurePolicy, LockOptions, Locker, Quota, RateLimiter,
    RedisBackend, Subject,
};
use tollgate_testkit::{unique, RedisCluster};

/// A rate limit check's timeout in these tests.
const TIMEOUT: Duration = Duration::from_millis(300);
/// Slack over the timeout for a loaded machine: a check that took longer
/// than this waited past its timeout.
const SLACK: Duration = Duration::from_secs(1);

fn limiter(backend: &RedisBackend, policy: FailurePolicy) -> RateLimiter {
    RateLimiter::builder(backend.clone(), Algorithm::Gcra)
        .quota(Quota::per_second(100_000))
        .name(unique("failover"))
        .failure_policy(policy)
        .timeout(TIMEOUT)
        .deny_cache(0)
        .build()
        .unwrap()
}

/// One check: when it ended, how long it took, and what it gave.
struct Outcome {
    at: Instant,
    took: Duration,
    source: Result<DecisionSource, String>,
}

/// Checks `subject` on `limiter` in a loop until `stop`.
fn load(
    limiter: RateLimiter,
    subject: Subject,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Outcome>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            let result = limiter.check(subject.clone()).await;
            let source = match result {
                Ok(d) => Ok(d.source),
                Err(e) if e.is_unavailable() => Err("unavailable".to_owned()),
                Err(e) => Err(format!("not an outage: {e}")),
            };
            out.push(Outcome {
                at: Instant::now(),
                took: start.elapsed(),
                source,
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_through_a_killed_master() {
    let cluster = RedisCluster::start_with_replicas(1).unwrap();
    let backend = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    let deny = limiter(&backend, FailurePolicy::Deny);
    let allow = limiter(&backend, FailurePolicy::Allow);
    let subject = Subject::new("victim");
    let key = deny.keys_for(&subject).remove(0);
    let victim = cluster.master_for_key(&key);
    for l in [&deny, &allow] {
        assert_eq!(
            l.check(subject.clone()).await.unwrap().source,
            DecisionSource::Backend
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let tasks = [
        load(deny.clone(), subject.clone(), stop.clone()),
        load(deny.clone(), subject.clone(), stop.clone()),
        load(allow.clone(), subject.clone(), stop.clone()),
    ];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cluster = Arc::new(Mutex::new(cluster));
    let killer = cluster.clone();
    let promoted = tokio::task::spawn_blocking(move || {
        let mut cluster = killer.lock().unwrap();
        let killed = Instant::now();
        let promoted = cluster.kill_master(victim).unwrap();
        (killed, Instant::now(), promoted)
    });
    let (killed, promotion, promoted) = promoted.await.unwrap();
    eprintln!(
        "master {victim} killed; node {promoted} promoted after {:?}",
        promotion - killed
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);

    let mut by_policy = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let outcomes = t.await.unwrap();
        let allow_policy = i == 2;
        for o in &outcomes {
            assert!(
                o.took <= TIMEOUT + SLACK,
                "a check waited {:?}, past its {TIMEOUT:?} timeout",
                o.took
            );
            match (&o.source, allow_policy) {
                (Ok(DecisionSource::Backend), _) => {}
                (Ok(DecisionSource::FailOpen), true) => {}
                (Err(e), false) if e == "unavailable" => {}
                (other, _) => panic!("allow policy {allow_policy}: {other:?}"),
            }
        }
        by_policy.push(outcomes);
    }
    // The outage was seen (the kill is not a no-op) ...
    let failed = by_policy[..2]
        .iter()
        .flatten()
        .filter(|o| o.at > killed && o.source.is_err())
        .count();
    let opened = by_policy[2]
        .iter()
        .filter(|o| o.source == Ok(DecisionSource::FailOpen))
        .count();
    assert!(
        failed > 0 && opened > 0,
        "{failed} refused, {opened} failed open"
    );
    // ... and Redis decides again within 2 s of the promotion, for both.
    for (i, outcomes) in by_policy.iter().enumerate() {
        let back = outcomes
            .iter()
            .find(|o| o.at > promotion && o.source == Ok(DecisionSource::Backend))
            .map(|o| o.at - promotion);
        eprintln!("limiter {i}: from Redis again {back:?} after the promotion was seen");
        let back = back.expect("never decided from Redis after the promotion");
        assert!(
            back <= Duration::from_secs(2),
            "{back:?} after the promotion"
        );
    }
    // Only the promoted replica serves the slot now.
    let c = cluster.lock().unwrap();
    assert_eq!(c.master_for_key(&key), promoted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_and_waiters_wake_through_a_killed_master() {
    let cluster = RedisCluster::start_with_replicas(1).unwrap();
    let backend = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    let watched = lock_common::Watched::new(Arc::new(backend));
    let locker = Locker::builder(watched.clone())
        .timeout(TIMEOUT)
        .build()
        .unwrap();
    let name = unique("job");
    let key = locker.keys_for(name.as_str()).lock;
    let victim = cluster.master_for_key(&key);
    let opts = LockOptions::new().ttl(Duration::from_secs(5));

    let mut fences = Vec::new();
    for _ in 0..3 {
        let lease = locker.acquire(name.as_str(), &opts).await.unwrap();
        fences.push(lease.fence());
        assert!(lease.release().await.unwrap());
    }
    // A holder, and a waiter for as long as the failover may take.
    let holder = locker.acquire(name.as_str(), &opts).await.unwrap();
    fences.push(holder.fence());
    let waiter = {
        let (locker, name) = (locker.clone(), name.clone());
        let wait = LockOptions::new()
            .ttl(Duration::from_secs(5))
            .wait(Duration::from_secs(40));
        tokio::spawn(async move { locker.acquire(name.as_str(), &wait).await })
    };
    // Refused while the holder holds it, it waits through the failover.
    watched.refused(1).await;
    assert!(!waiter.is_finished(), "the waiter waits for the holder");

    let cluster = Arc::new(Mutex::new(cluster));
    let killer = cluster.clone();
    tokio::task::spawn_blocking(move || killer.lock().unwrap().kill_master(victim).unwrap())
        .await
        .unwrap();
    // The holder lets go (its lock may or may not have survived the
    // failover); the waiter gets the lock with a newer fence.
    let _ = holder.release().await;
    let lease = waiter
        .await
        .unwrap()
        .expect("the waiter acquires after the failover");
    assert!(
        fences.iter().all(|f| lease.fence() > *f),
        "{:?} after {fences:?}",
        lease.fence()
    );
    fences.push(lease.fence());
    assert!(lease.release().await.unwrap());
    for _ in 0..3 {
        let lease = locker.acquire(name.as_str(), &opts).await.unwrap();
        assert!(lease.fence() > *fences.last().unwrap());
        fences.push(lease.fence());
        assert!(lease.release().await.unwrap());
    }
}

/// The node a `Locker`'s release subscription is on (`PUBSUB NUMPAT`).
fn subscribed(cluster: &RedisCluster) -> Option<usize> {
    (0..cluster.nodes().len()).find(|&i| {
        cluster.nodes()[i].pid().is_some() && cluster.nodes()[i].cli(&["PUBSUB", "NUMPAT"]) != "0"
    })
}

/// The release subscription follows the topology: when the node it is on
/// dies, it moves to another live node (it was pinned to the first seed),
/// and a waiter that only polls once a minute is still woken by the next
/// release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_subscription_moves_off_a_dead_node() {
    let cluster = RedisCluster::start_with_replicas(1).unwrap();
    let backend = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    let locker = Locker::builder(backend)
        .timeout(TIMEOUT)
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let name = unique("sub");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let holder = locker.acquire(name.as_str(), &opts).await.unwrap();
    let waiter = {
        let (locker, name) = (locker.clone(), name.clone());
        let wait = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(40));
        tokio::spawn(async move { locker.acquire(name.as_str(), &wait).await })
    };
    let first = tollgate_testkit::eventually(Duration::from_secs(20), "a subscription", || async {
        subscribed(&cluster)
    })
    .await;
    // The kill may fail the lock's own master over: its replica must have
    // the lock first, or the holder's release finds nothing to release.
    let key = locker.keys_for(name.as_str()).lock;
    cluster
        .wait_replicated(cluster.master_for_key(&key))
        .unwrap();
    let cluster = Arc::new(Mutex::new(cluster));
    let killer = cluster.clone();
    tokio::task::spawn_blocking(move || {
        let mut cluster = killer.lock().unwrap();
        if cluster.masters().contains(&first) {
            cluster.kill_master(first).unwrap();
        } else {
            cluster.nodes_mut()[first].stop();
        }
    })
    .await
    .unwrap();
    let moved =
        tollgate_testkit::eventually(Duration::from_secs(20), "a new subscription", || async {
            subscribed(&cluster.lock().unwrap())
        })
        .await;
    assert_ne!(moved, first);
    assert!(!waiter.is_finished(), "the waiter still waits");
    assert!(holder.release().await.unwrap());
    let lease = waiter
        .await
        .unwrap()
        .expect("woken by the release (with a live subscription, waiters poll once a minute)");
    assert!(lease.release().await.unwrap());
}
