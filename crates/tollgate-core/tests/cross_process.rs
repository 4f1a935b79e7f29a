//! Mutual exclusion across OS processes: 4 processes (this test binary run
//! again as children) each do a read-modify-write of one counter under one
//! lock — GET, a pause, SET through a plain connection, so any overlap
//! loses an update. With the lock: no lost update, and the fences, logged
//! inside the critical sections, are in the order the sections ran. Without
//! it (the control run), updates are lost: the test can tell the two apart.

use std::process::Stdio;
use std::time::Duration;

use redis::AsyncCommands;
use tollgate_core::{LockOptions, Locker, RedisBackend};
use tollgate_testkit::RedisServer;

const PROCESSES: usize = 4;
const ROUNDS: u64 = 40;
/// Set in a child: the Redis url.
const CHILD_URL: &str = "TOLLGATE_XPROC_URL";
/// Set in a child of the control run: no lock around the section.
const CHILD_UNLOCKED: &str = "TOLLGATE_XPROC_UNLOCKED";

/// The child's work; run by the parent only (ignored otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of cross_process_mutual_exclusion"]
async fn child() {
    let url = std::env::var(CHILD_URL).expect("run by cross_process_mutual_exclusion");
    let locked = std::env::var_os(CHILD_UNLOCKED).is_none();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let locker = Locker::new(RedisBackend::connect(&url).await.unwrap());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    // Start together: the parent says go once every child is ready.
    let _: () = con.incr("ready", 1).await.unwrap();
    while con.get::<_, Option<String>>("go").await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..ROUNDS {
        let lease = if locked {
            Some(locker.acquire("counter", &opts).await.unwrap())
        } else {
            None
        };
        let n: u64 = con
            .get::<_, Option<u64>>("counter")
            .await
            .unwrap()
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let _: () = con.set("counter", n + 1).await.unwrap();
        if let Some(lease) = lease {
            let _: () = con.rpush("fences", lease.fence().get()).await.unwrap();
            assert!(lease.release().await.unwrap(), "held to the end");
        }
    }
}

/// Runs `PROCESSES` children against `server` and returns the counter and
/// the fences they logged.
async fn run(server: &RedisServer, locked: bool) -> (u64, Vec<u64>) {
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["--ignored", "--exact", "child", "--test-threads", "1"])
                .env(CHILD_URL, server.url())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            if !locked {
                cmd.env(CHILD_UNLOCKED, "1");
            }
            cmd.spawn().unwrap()
        })
        .collect();
    let mut con = server.multiplexed().await;
    for _ in 0..6000 {
        if con.get::<_, Option<usize>>("ready").await.unwrap() == Some(PROCESSES) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _: () = con.set("go", 1).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    for i in 0..children.len() {
        let status = loop {
            if let Some(status) = children[i].try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                for c in &mut children {
                    let _ = c.kill();
                }
                panic!("the children did not finish within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(status.success(), "child failed: {status}");
    }
    let counter: u64 = con.get("counter").await.unwrap();
    let fences: Vec<u64> = con.lrange("fences", 0, -1).await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.unwrap();
    (counter, fences)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_process_mutual_exclusion() {
    let server = RedisServer::start().unwrap();
    let total = PROCESSES as u64 * ROUNDS;

    let (counter, fences) = run(&server, true).await;
    assert_eq!(counter, total, "lost updates under the lock");
    assert_eq!(fences.len() as u64, total);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences out of the sections' order: {fences:?}"
    );

    // The control: the same sections without the lock lose updates.
    let (counter, _) = run(&server, false).await;
    assert!(
        counter < total,
        "no update lost without the lock ({counter})"
    );
    eprintln!("without the lock: {counter} of {total} updates kept");
}
