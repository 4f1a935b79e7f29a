//! Redis Sentinel: the backend follows a failover to the promoted replica.
#![cfg(feature = "sentinel")]

use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, DecisionSource, FailurePolicy, Quota, RateLimiter, RedisBackend};
use tollgate_testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_backend_follows_a_failover() {
    let master = RedisServer::start().unwrap();
    let port = master.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let sentinel = RedisServer::start_sentinel(&master, "main").unwrap();

    let backend = RedisBackend::sentinel(&[sentinel.url()], "main").unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_hour(1000).unwrap())
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(2))
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
    while replica
        .cli(&["INFO", "replication"])
        .contains("master_link_status:down")
    {
        assert!(Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sentinel.cli(&["SENTINEL", "FAILOVER", "main"]), "OK");
    while !replica.cli(&["ROLE"]).starts_with("master") {
        assert!(Instant::now() < deadline, "no failover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Errors are allowed while the old master is demoted; then checks land on
    // the new master without rebuilding anything.
    let mut errors = 0;
    loop {
        match limiter.check("s").await {
            Ok(d) if replica.cli(&["DBSIZE"]) != "0" => {
                assert_eq!(d.source, DecisionSource::Backend);
                break;
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
    // The new master now holds the limiter's key and keeps counting.
    let before = replica.cli(&["INFO", "commandstats"]);
    limiter.check("s").await.unwrap();
    assert_ne!(before, replica.cli(&["INFO", "commandstats"]));
}
