//! A standalone URL whose name moves to the promoted replica on failover
//! (a cloud provider's primary endpoint, a virtual IP), played by a relay
//! that sends new connections to the new master while open ones stay with
//! the old one, now a replica. The backend of `connect` follows it: the
//! demoted server's `READONLY` makes it connect anew.

use std::cell::Cell;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Quota, RateLimiter, RedisBackend};
use tollgate_testkit::{eventually, unique, RedisServer, ReplyDelay};

/// Waits until `server` reports `role:<role>`.
async fn role_is(server: &RedisServer, role: &str) {
    let want = format!("role:{role}");
    eventually(Duration::from_secs(10), &want, || async {
        server
            .cli(&["INFO", "replication"])
            .contains(&want)
            .then_some(())
    })
    .await;
}

/// Swaps the roles: `replica` becomes the master, `master` its replica.
async fn fail_over(master: &RedisServer, replica: &RedisServer) {
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    role_is(replica, "master").await;
    let port = replica.port().to_string();
    master.cli(&["REPLICAOF", "127.0.0.1", &port]);
    role_is(master, "slave").await;
}

async fn follows_a_moving_name(lazy: bool) {
    let a = RedisServer::start().unwrap();
    let port = a.port().to_string();
    let b = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]).unwrap();
    role_is(&b, "slave").await;
    let name = ReplyDelay::start(&a.addr()).await.unwrap();
    let backend = if lazy {
        RedisBackend::connect_lazy(&name.url()).unwrap()
    } else {
        RedisBackend::connect(&name.url()).await.unwrap()
    };
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_second(1000))
        .name(unique("moving"))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(2))
        .deny_cache(0)
        .build()
        .unwrap();
    eventually(Duration::from_secs(10), "a first check", || async {
        limiter.check("alice").await.ok()
    })
    .await;

    fail_over(&a, &b).await;
    name.move_to(&b.addr());
    // One call may still reach the demoted server and fail; then the
    // backend connects anew through the name, to the new master.
    let failed = Cell::new(0);
    let d = eventually(
        Duration::from_secs(10),
        "a check on the new master",
        || async {
            match limiter.check("alice").await {
                Ok(d) => Some(d),
                Err(e) => {
                    assert!(e.to_string().contains("read only replica"), "{e}");
                    failed.set(failed.get() + 1);
                    None
                }
            }
        },
    )
    .await;
    assert!(d.allowed);
    assert!(
        failed.get() <= 1,
        "{} checks failed after the failover",
        failed.get()
    );
    // Decided on the new master (a replica runs no script a client did not
    // send it: writes replicate as their effects).
    assert!(b.command_calls("evalsha") + b.command_calls("eval") > 0);
}

#[tokio::test]
async fn connect_follows_a_name_that_moves_on_failover() {
    follows_a_moving_name(false).await;
}

#[tokio::test]
async fn connect_lazy_follows_a_name_that_moves_on_failover() {
    follows_a_moving_name(true).await;
}
