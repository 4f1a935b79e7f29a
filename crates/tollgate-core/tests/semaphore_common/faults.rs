//! Standalone Redis only: the bound across OS processes (children re-run
//! this test binary), a SIGKILLed holder process, a SIGSTOPped server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{LockOptions, RedisBackend, Semaphore};
use tollgate_testkit::RedisServer;

use super::{busy_after, prefix};
use crate::lock_common::{assert_all_keys_expire, Watched};

/// The child's role (`count` or `hold`); unset: not a child.
const ROLE: &str = "TOLLGATE_SEM_CHILD";
const URL: &str = "TOLLGATE_SEM_URL";
const PREFIX: &str = "TOLLGATE_SEM_PREFIX";
/// The name of the (ignored) child test in `semaphore.rs`.
const CHILD_TEST: &str = "semaphore_child";
/// Acquisitions per counting child.
const ROUNDS: usize = 25;
/// The TTL of the permits a `hold` child takes (renewed while it lives).
const HOLD_TTL: Duration = Duration::from_secs(1);

/// Enters the critical section, counted outside tollgate: the number inside,
/// the most ever inside, and the total entries, on plain keys with TTLs.
const ENTER: &str = r"
local v = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], 120000)
redis.call('INCR', KEYS[3])
redis.call('PEXPIRE', KEYS[3], 120000)
if v > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], v, 'PX', 120000)
end
return v
";

/// This test binary, running only the child test, as `role`.
fn child(role: &str, server: &RedisServer, prefix: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", CHILD_TEST, "--ignored", "--nocapture"])
        .env(ROLE, role)
        .env(URL, server.url())
        .env(PREFIX, prefix)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Kills (SIGKILL) and reaps a child however the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The body of the child test: does nothing unless spawned by a test here.
pub(crate) async fn child_main() {
    let Ok(role) = std::env::var(ROLE) else {
        eprintln!("not spawned by a cross-process test: nothing to do");
        return;
    };
    let url = std::env::var(URL).unwrap();
    let prefix = std::env::var(PREFIX).unwrap();
    let sem = Semaphore::builder(RedisBackend::connect(&url).await.unwrap(), 3)
        .prefix(&prefix)
        .build()
        .unwrap();
    match role.as_str() {
        "count" => {
            let mut con = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let enter = redis::Script::new(ENTER);
            let inside = format!("{prefix}:inside");
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(60));
            for _ in 0..ROUNDS {
                let permit = sem.acquire("shared", &opts).await.unwrap();
                let _: i64 = enter
                    .key(&inside)
                    .key(format!("{prefix}:max"))
                    .key(format!("{prefix}:total"))
                    .invoke_async(&mut con)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(15)).await;
                let _: i64 = redis::cmd("DECR")
                    .arg(&inside)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                assert!(permit.release().await.unwrap());
            }
        }
        "hold" => {
            let opts = LockOptions::new().ttl(HOLD_TTL);
            let permits = sem.try_acquire_weighted("held", 3, &opts).await.unwrap();
            println!("HELD {}", permits.fence());
            // The parent SIGKILLs this process long before.
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(permits);
        }
        other => panic!("unknown child role {other}"),
    }
    println!("CHILD-DONE {role}");
}

/// 4 processes × 25 acquisitions of a semaphore of 3 on one redis-server:
/// the critical section, counted on plain keys, never has more than 3
/// inside and does have 3.
pub(crate) fn four_processes_share_three_permits() {
    let server = RedisServer::start().unwrap();
    let prefix = prefix("procs");
    let started = Instant::now();
    let children: Vec<Child> = (0..4)
        .map(|_| child("count", &server, &prefix).spawn().unwrap())
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            out.status.success() && stdout.contains("CHILD-DONE count"),
            "child failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
    }
    eprintln!(
        "4 processes × {ROUNDS} acquisitions in {:?}",
        started.elapsed()
    );
    let get = |k: &str| server.cli(&["GET", &format!("{prefix}:{k}")]);
    assert_eq!(get("total"), (4 * ROUNDS).to_string());
    assert_eq!(get("inside"), "0");
    assert_eq!(get("max"), "3", "the most inside at once");
    assert_all_keys_expire(&server);
}

/// A holder process of all 3 permits (TTL 1 s, renewed by its watchdog) is
/// SIGKILLed: nobody releases its permits, and they are free within the TTL
/// plus 1 s.
pub(crate) fn killed_holder_process_frees_within_ttl() {
    let server = RedisServer::start().unwrap();
    let prefix = prefix("killed");
    let mut holder = Killed(child("hold", &server, &prefix).spawn().unwrap());
    let mut lines = BufReader::new(holder.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("HELD") {
        line.clear();
        let n = lines.read_line(&mut line).unwrap();
        assert!(n > 0, "the child exited without holding the permits");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sem = Semaphore::builder(RedisBackend::connect(&server.url()).await.unwrap(), 3)
            .prefix(&prefix)
            .build()
            .unwrap();
        let opts = LockOptions::new().ttl(Duration::from_secs(10));
        // The child's watchdog renews across its TTL.
        tokio::time::sleep(HOLD_TTL * 3 / 2).await;
        assert_eq!(sem.in_use("held").await.unwrap(), 3);
        busy_after(sem.try_acquire("held", &opts).await);

        holder.0.kill().unwrap();
        holder.0.wait().unwrap();
        // Not released by anyone: still held right after the kill.
        assert_eq!(sem.in_use("held").await.unwrap(), 3);
        let permits = sem
            .acquire_weighted(
                "held",
                3,
                &opts.clone().wait(HOLD_TTL + Duration::from_secs(1)),
            )
            .await
            .expect("the killed holder's permits were not freed within TTL + 1 s");
        assert!(permits.release().await.unwrap());
    });
    assert_all_keys_expire(&server);
}

/// SIGSTOP while a plain and a fair waiter wait: both end with an
/// unavailable error once their wait bound has passed (they retry through
/// the outage until then: issue #16, defect 1), a try and a count at once,
/// and nothing hangs; after
/// SIGCONT the name works again (the fair waiter's ticket, which could not
/// be removed, expires).
pub(crate) async fn paused_server_is_unavailable_not_a_hang() {
    let server = RedisServer::start().unwrap();
    let build = |fair: bool| {
        let url = server.url();
        async move {
            let watched = Watched::new(Arc::new(RedisBackend::connect(&url).await.unwrap()));
            let b = Semaphore::builder(watched.clone(), 1)
                .timeout(Duration::from_millis(300))
                .poll_interval(Duration::from_millis(200));
            (if fair { b.fair() } else { b }.build().unwrap(), watched)
        }
    };
    let ((plain, plain_watched), (fair, fair_watched)) = (build(false).await, build(true).await);
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let held_p = plain.try_acquire("p", &opts).await.unwrap();
    let held_f = fair.try_acquire("f", &opts).await.unwrap();
    let waiters = [(&plain, "p"), (&fair, "f")].map(|(s, name)| {
        let (s, opts) = (s.clone(), opts.clone().wait(Duration::from_secs(2)));
        tokio::spawn(async move { s.acquire(name, &opts).await })
    });
    // Both were refused (so wait) before the pause.
    plain_watched.refused(1).await;
    fair_watched.refused(1).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));

    server.pause();
    let bound = Duration::from_secs(5);
    for w in waiters {
        let r = tokio::time::timeout(bound, w)
            .await
            .expect("a waiter hangs on a paused Redis")
            .unwrap();
        let e = r.expect_err("acquired from a paused Redis");
        assert!(e.is_unavailable(), "{e:?}");
    }
    let short = LockOptions::new().ttl(Duration::from_secs(1));
    for s in [&plain, &fair] {
        let e = tokio::time::timeout(bound, s.try_acquire("x", &short))
            .await
            .expect("try_acquire hangs on a paused Redis")
            .expect_err("acquired from a paused Redis");
        assert!(e.is_unavailable(), "{e:?}");
        let e = tokio::time::timeout(bound, s.in_use("x"))
            .await
            .expect("in_use hangs on a paused Redis")
            .unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
    }
    server.resume();

    assert!(held_p.release().await.unwrap());
    assert!(held_f.release().await.unwrap());
    for (s, name) in [(&plain, "p"), (&fair, "f")] {
        let p = s
            .acquire(name, &opts.clone().wait(Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(p.release().await.unwrap());
    }
    assert_all_keys_expire(&server);
}
