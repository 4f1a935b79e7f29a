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

mod children;

use std::time::Duration;

use children::{child_setup, epoch_micros, reports, run_children, Target};
use tollgate_core::{Algorithm, Quota, RateLimiter};
use tollgate_testkit::{RedisCluster, RedisServer};

const PROCESSES: usize = 4;
const PER_CHILD: usize = 10;
const INTERVAL_US: u64 = 50_000;
const MAX_WAIT_US: u64 = 500_000;

/// The child's work; run by the parent only (ignored otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of acquire_across_processes_*"]
async fn acquire_child() {
    let (start, prefix, backend) = child_setup()
        .await
        .expect("run by acquire_across_processes_*");
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_second(20).with_burst(1).unwrap())
        .prefix(prefix)
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
                (arrival, d, epoch_micros())
            })
        })
        .collect();
    for t in tasks {
        let (arrival, d, answered) = t.await.unwrap();
        let micros = |t: Option<Duration>| t.map_or(0, |t| t.as_micros() as u64);
        let slot = d.charge.map_or(0, |c| c.at_micros());
        println!(
            "ACQ {arrival} {} {slot} {} {} {answered}",
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
    /// When the acquire returned (an admission: at its slot): a refusal
    /// was decided between `arrival` and this.
    answered: u64,
}

/// Runs the children against `target` and gathers their reports.
fn run(target: Target) -> Vec<Report> {
    let lines = run_children("acquire_child", PROCESSES, &target, &[]);
    let reports: Vec<Report> = reports(&lines, "ACQ ")
        .map(|f| Report {
            arrival: f[0],
            allowed: f[1] == 1,
            slot: f[2],
            retry: f[3],
            reset: f[4],
            answered: f[5],
        })
        .collect();
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
    // Refusals: past the max wait, and when the schedule ends as it stood
    // when the refusal was decided (between its arrival and its answer):
    // the slot after one admitted.
    for r in reports.iter().filter(|r| !r.allowed) {
        assert!(r.retry > MAX_WAIT_US, "{r:?}");
        assert_eq!(
            r.retry, r.reset,
            "a burst of 1: the retry is the schedule's end: {r:?}"
        );
        let (earliest, latest) = (r.arrival + r.retry, r.answered + r.retry);
        assert!(
            slots.iter().map(|s| s + INTERVAL_US).any(|free| {
                (earliest.saturating_sub(20_000)..=latest + 20_000).contains(&free)
            }),
            "{r:?}: no schedule end in {earliest}..={latest}, slots {slots:?}"
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
    check(&run(Target::Url(server.url())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_across_processes_cluster() {
    let cluster = RedisCluster::start().unwrap();
    check(&run(Target::Seeds(cluster.seeds())));
}
