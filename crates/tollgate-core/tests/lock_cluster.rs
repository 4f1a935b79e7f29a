//! The lock behaviour suite on a 3-master Redis Cluster.

mod lock_common;

use std::sync::OnceLock;

use lock_common::Cluster;
use tollgate_testkit::RedisCluster;

fn cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(|| RedisCluster::start().expect("redis cluster"))
}

behaviour_suite!(Cluster(cluster()), 10_000);
replay_suite!(Cluster(cluster()));

/// A release published by a node other than the one the waiters subscribe
/// to (the first seed) still wakes them: plain PUBLISH reaches every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_another_node_wakes_waiters() {
    use std::time::{Duration, Instant};
    use tollgate_core::{LockOptions, Locker, RedisBackend};

    let c = cluster();
    let prefix = lock_common::prefix("xnode");
    let build = |poll| {
        let seeds = c.seeds();
        let prefix = prefix.clone();
        async move {
            let watched = lock_common::Watched::new(std::sync::Arc::new(
                RedisBackend::connect_cluster(seeds).await.unwrap(),
            ));
            let locker = Locker::builder(watched.clone())
                .prefix(prefix)
                .poll_interval(poll)
                .build()
                .unwrap();
            (locker, watched)
        }
    };
    let (holder, _) = build(Duration::from_millis(500)).await;
    let (waiter, watched) = build(Duration::from_secs(10)).await;
    // A name whose slot is not on the first seed.
    let name = (0..)
        .map(|i| format!("n{i}"))
        .find(|n| {
            let key = holder.keys_for(n.as_str()).lock;
            c.nodes()[0].cli(&["GET", &key]).starts_with("MOVED")
        })
        .unwrap();
    let lease = holder
        .try_acquire(name.as_str(), &LockOptions::new())
        .await
        .unwrap();
    let wait = tokio::spawn({
        let name = name.clone();
        async move {
            let l = waiter
                .acquire(name, &LockOptions::new().wait(Duration::from_secs(20)))
                .await
                .unwrap();
            (Instant::now(), l.fence())
        }
    });
    lock_common::release_wakes_waiter(lease, &watched, wait).await;
}
