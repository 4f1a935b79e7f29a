//! `acquire` across 4 OS processes (this test binary run again as
//! children), on a standalone Redis and on a 3-master cluster. Each child
//! fires `PER_CHILD` acquires of one subject at one agreed instant, under
//! GCRA at 20 a second with a burst of 1 (a slot every 50 ms) and a max
//! wait of 500 ms, and reports each admission's slot (the charge's instant,
//! on the server's clock) and each refusal's figures.
//!
//! With every arrival within `spread` of the first, the slots are the first
//! arrival's instant plus k × 50 ms, in reservation order, and a slot fits
//! when it lies within 500 ms of its arrival: k = 0..=10 always fit (11
//! admissions), and each further one needs an arrival at least 50 ms after
//! the first: exactly 11 when the arrivals spread less than 50 ms, at most
//! 11 + spread / 50 ms. Every refusal's retry-after lies past the max wait
//! and is honest: for a burst of 1 it is the schedule's end (its reset).

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate_core::{Algorithm, Quota, RateLimiter, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};

const PROCESSES: usize = 4;
const PER_CHILD: usize = 10;
const INTERVAL_US: u64 = 50_000;
const MAX_WAIT_US: u64 = 500_000;
/// Set in a child: the Redis url, or the cluster's seeds (comma-separated).
const CHILD_URL: &str = "TOLLGATE_ACQ_URL";
const CHILD_SEEDS: &str = "TOLLGATE_ACQ_SEEDS";
/// The agreed start (µs since the epoch) and the key prefix.
const CHILD_START: &str = "TOLLGATE_ACQ_START";
const CHILD_PREFIX: &str = "TOLLGATE_ACQ_PREFIX";

fn epoch_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// The child's work; run by the parent only (ignored otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of acquire_across_processes_*"]
async fn acquire_child() {
    let start: u64 = std::env::var(CHILD_START)
        .expect("run by acquire_across_processes_*")
        .parse()
        .unwrap();
    let backend = match std::env::var(CHILD_URL) {
        Ok(url) => RedisBackend::connect(&url).await.unwrap(),
        Err(_) => {
            let seeds = std::env::var(CHILD_SEEDS).unwrap();
            RedisBackend::connect_cluster(seeds.split(',').map(str::to_owned))
                .await
                .unwrap()
        }
    };
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_second(20).with_burst(1).unwrap())
        .prefix(std::env::var(CHILD_PREFIX).unwrap())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // Warm the connection (and load the script) on another subject.
    limiter.check("warm-up").await.unwrap();
    let now = epoch_micros();
    tokio::time::sleep(Duration::from_micros(start.saturating_sub(now))).await;
    let tasks: Vec<_> = (0..PER_CHILD)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let arrival = epoch_micros();
                let d = limiter
                    .acquire("shared", 1, Duration::from_micros(MAX_WAIT_US))
                    .await
                    .unwrap();
                (arrival, d)
            })
        })
        .collect();
    for t in tasks {
        let (arrival, d) = t.await.unwrap();
        let micros = |t: Option<Duration>| t.map_or(0, |t| t.as_micros() as u64);
        let slot = d.charge.map_or(0, |c| c.at_micros());
        println!(
            "ACQ {arrival} {} {slot} {} {}",
            u8::from(d.allowed),
            micros(d.retry_after),
            d.reset_after.as_micros()
        );
    }
}

/// One child's report line.
#[derive(Debug)]
struct Report {
    arrival: u64,
    allowed: bool,
    slot: u64,
    retry: u64,
    reset: u64,
}

/// Runs the children with `env` and gathers their reports.
fn run(env: (&str, String)) -> Vec<Report> {
    let exe = std::env::current_exe().unwrap();
    // Far enough ahead for every child to be up and connected.
    let start = epoch_micros() + 3_000_000;
    let prefix = format!("acq{}x{}", std::process::id(), start);
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "acquire_child", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(env.0, &env.1)
                .env(CHILD_START, start.to_string())
                .env(CHILD_PREFIX, &prefix)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut reports = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "child failed: {}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // The harness's own "test … " may precede the first line.
            let Some(rest) = line.split_once("ACQ ").map(|(_, r)| r) else {
                continue;
            };
            let f: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
            reports.push(Report {
                arrival: f[0],
                allowed: f[1] == 1,
                slot: f[2],
                retry: f[3],
                reset: f[4],
            });
        }
    }
    assert_eq!(reports.len(), PROCESSES * PER_CHILD, "every child reported");
    reports
}

fn check(reports: &[Report]) {
    let first = reports.iter().map(|r| r.arrival).min().unwrap();
    let last = reports.iter().map(|r| r.arrival).max().unwrap();
    let spread = last - first;
    let mut slots: Vec<u64> = reports
        .iter()
        .filter(|r| r.allowed)
        .map(|r| r.slot)
        .collect();
    slots.sort_unstable();
    // One slot every interval, none closer: no period holds more than 20.
    for w in slots.windows(2) {
        assert_eq!(w[1] - w[0], INTERVAL_US, "slots {slots:?}");
    }
    for (i, s) in slots.iter().enumerate() {
        let in_period = slots[i..]
            .iter()
            .take_while(|t| **t < s + 1_000_000)
            .count();
        assert!(in_period <= 20, "{in_period} slots in a second from {s}");
    }
    // Everything that fits within the max wait, and no more.
    let fits = (MAX_WAIT_US / INTERVAL_US + 1) as usize;
    let most = fits + (spread / INTERVAL_US) as usize;
    assert!(
        (fits..=most).contains(&slots.len()),
        "{} admitted; expected {fits}..={most} (arrivals spread {spread} µs)",
        slots.len()
    );
    // Each admission came within the max wait of its arrival (local and
    // server clocks are one host's clock).
    for r in reports.iter().filter(|r| r.allowed) {
        assert!(r.slot <= r.arrival + MAX_WAIT_US + 20_000, "{r:?}");
    }
    // Refusals: past the max wait, and when the schedule ends (the next
    // free slot) — the slot after the last one admitted.
    let next_free = slots.last().unwrap() + INTERVAL_US;
    for r in reports.iter().filter(|r| !r.allowed) {
        assert!(r.retry > MAX_WAIT_US, "{r:?}");
        assert_eq!(
            r.retry, r.reset,
            "a burst of 1: the retry is the schedule's end: {r:?}"
        );
        // Decided between the arrivals and the end of the test's run.
        assert!(
            r.arrival + r.retry >= next_free - 20_000,
            "{r:?} vs {next_free}"
        );
    }
    eprintln!(
        "{} admitted of {}, arrivals spread {spread} µs",
        slots.len(),
        reports.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_across_processes_standalone() {
    let server = RedisServer::start().unwrap();
    check(&run((CHILD_URL, server.url())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_across_processes_cluster() {
    let cluster = RedisCluster::start().unwrap();
    check(&run((CHILD_SEEDS, cluster.seeds().join(","))));
}
