//! Quota leases across 4 OS processes (this test binary run again as
//! children), on a standalone Redis and on a 3-master cluster: every child
//! hammers one hot subject from 4 tasks for `RUN_MS`, with leases on, and
//! reports each admission. The fleet never admits more than the quota:
//!
//! - fixed window: no window admits more than its limit (a slice is never
//!   served past the end of the window its units were counted in);
//! - token bucket and GCRA: the admissions up to any instant are at most the
//!   burst plus what refilled since the first take.

mod children;

use std::time::Duration;

use children::{child_setup, epoch_micros, reports, run_children, Target};
use tollgate_core::{Algorithm, DecisionSource, FailurePolicy, Quota, QuotaLeases, RateLimiter};
use tollgate_testkit::{RedisCluster, RedisServer};

const PROCESSES: usize = 4;
const TASKS: usize = 4;
const RUN_MS: u64 = 2_500;
/// 400 a second: a window of 1 s, or a unit every 2.5 ms.
const LIMIT: u64 = 400;
const CHILD_ALG: &str = "TOLLGATE_LEASE_ALG";

fn algorithm(name: &str) -> Algorithm {
    Algorithm::ALL
        .into_iter()
        .find(|a| a.short_name() == name)
        .unwrap()
}

/// The child's work; run by the parent only (ignored otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of leases_across_processes_*"]
async fn lease_child() {
    let (start, prefix, backend) = child_setup()
        .await
        .expect("run by leases_across_processes_*");
    let limiter = RateLimiter::builder(backend, algorithm(&std::env::var(CHILD_ALG).unwrap()))
        .quota(Quota::per_second(LIMIT))
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        // An outage must not admit here: the bound is the quota's.
        .failure_policy(FailurePolicy::Deny)
        .quota_leases(QuotaLeases::default())
        .build()
        .unwrap();
    limiter.check("warm-up").await.unwrap();
    tokio::time::sleep(Duration::from_micros(start.saturating_sub(epoch_micros()))).await;
    let end = start + RUN_MS * 1000;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut checks = 0u64;
                while epoch_micros() < end {
                    // A check served in process never yields: let the
                    // connection's tasks run.
                    if checks.is_multiple_of(32) {
                        tokio::task::yield_now().await;
                    }
                    let before = epoch_micros();
                    let d = limiter.check("shared").await.unwrap();
                    checks += 1;
                    if d.allowed {
                        let after = epoch_micros();
                        let leased = d.source == DecisionSource::Lease;
                        seen.push((before, after, d.reset_after.as_micros() as u64, leased));
                    }
                }
                (checks, seen)
            })
        })
        .collect();
    let mut checks = 0;
    for t in tasks {
        let (n, seen) = t.await.unwrap();
        checks += n;
        for (before, after, reset, leased) in seen {
            println!("ADM {before} {after} {reset} {}", u8::from(leased));
        }
    }
    limiter.return_leases().await;
    println!("CHECKS {checks}");
}

#[derive(Debug)]
struct Admission {
    before: u64,
    after: u64,
    reset: u64,
    leased: bool,
}

fn run(alg: Algorithm, target: Target) -> (Vec<Admission>, u64) {
    let env = [(CHILD_ALG, alg.short_name().to_owned())];
    let lines = run_children("lease_child", PROCESSES, &target, &env);
    let checks = reports(&lines, "CHECKS ").map(|f| f[0]).sum();
    let admissions = reports(&lines, "ADM ")
        .map(|f| Admission {
            before: f[0],
            after: f[1],
            reset: f[2],
            leased: f[3] == 1,
        })
        .collect();
    (admissions, checks)
}

/// No window admits more than the limit. An admission's window is the one
/// whose end it reports: `before + reset_after` is that end, less the
/// round trip (a slice reports the reset as of its take less the time
/// since, and is never served past that end); the nearest window end is
/// taken, as the server's clock may read a few µs behind this one.
fn check_fixed_window(admissions: &[Admission]) {
    let period = 1_000_000;
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    for a in admissions {
        let end = (a.before + a.reset + period / 2) / period * period;
        *per_window.entry(end / period).or_default() += 1;
        // Served before the end of its window (one host's clock; 20 ms for
        // the scheduler).
        assert!(a.after <= end + 20_000, "{a:?}");
    }
    for (w, n) in &per_window {
        assert!(*n <= LIMIT, "window {w}: {n} admitted, limit {LIMIT}");
    }
}

/// The admissions up to each instant are at most the burst (the limit) plus
/// one unit per interval since the first take (which came after the first
/// check was sent).
fn check_bucket(admissions: &[Admission]) {
    let interval = 1_000_000 / LIMIT;
    let first = admissions.iter().map(|a| a.before).min().unwrap();
    let mut afters: Vec<u64> = admissions.iter().map(|a| a.after).collect();
    afters.sort_unstable();
    for (i, t) in afters.iter().enumerate() {
        let most = LIMIT + (t - first) / interval;
        assert!(
            (i as u64) < most,
            "{} admitted by {} µs after the first take; at most {most}",
            i + 1,
            t - first
        );
    }
}

fn check(alg: Algorithm, (admissions, checks): (Vec<Admission>, u64)) {
    let leased = admissions.iter().filter(|a| a.leased).count();
    eprintln!(
        "{alg:?}: {} admitted of {checks} checks, {leased} from slices",
        admissions.len()
    );
    assert!(leased > 0, "no slice served");
    // Saturated: the quota's units were spent (a slice's last quarter may
    // be left to nobody at a window's end).
    let expected = LIMIT * RUN_MS / 1000;
    assert!(
        admissions.len() as u64 >= expected / 2,
        "{} admitted",
        admissions.len()
    );
    match alg {
        Algorithm::FixedWindow => check_fixed_window(&admissions),
        _ => check_bucket(&admissions),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_across_processes_standalone_fixed_window() {
    let server = RedisServer::start().unwrap();
    let alg = Algorithm::FixedWindow;
    check(alg, run(alg, Target::Url(server.url())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_across_processes_standalone_token_bucket() {
    let server = RedisServer::start().unwrap();
    let alg = Algorithm::TokenBucket;
    check(alg, run(alg, Target::Url(server.url())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_across_processes_cluster_fixed_window() {
    let cluster = RedisCluster::start().unwrap();
    let alg = Algorithm::FixedWindow;
    check(alg, run(alg, Target::Seeds(cluster.seeds())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_across_processes_cluster_gcra() {
    let cluster = RedisCluster::start().unwrap();
    let alg = Algorithm::Gcra;
    check(alg, run(alg, Target::Seeds(cluster.seeds())));
}
