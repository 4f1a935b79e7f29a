//! `soak` (issue #16): a bounded chaos run. Rate limits, fenced locks,
//! semaphore permits, the concurrency-limit and idempotency layers run
//! concurrently against real `redis-server`s (tollgate-testkit) while a
//! seeded schedule pauses, kills, restarts and (on a cluster) fails Redis
//! over; then a Markdown report: decisions, errors by kind,
//! over-admissions, lock, permit and concurrency violations, quota taken
//! by failure-policy answers, idempotent requests run twice, the fault
//! log. The process exits non-zero on a violation.
//!
//! What counts as a violation, and why (the report repeats it):
//! - **Over-admission within an epoch.** Quotas are long (20 units per ten
//!   years), so nothing refills during a run and the units a subject may
//!   get is exactly the capacity. A data-losing fault (a restart without
//!   persistence, a killed or forced-over cluster master: replication is
//!   asynchronous) legitimately forgets counters, so admissions are grouped
//!   into *epochs* between such faults; a pause (SIGSTOP) loses nothing and
//!   does not start an epoch. Admitted units of one subject within one epoch
//!   above the capacity are a violation. Admissions after a data loss that
//!   take a subject's run total above the capacity are reported, not counted.
//! - **Two lock holders at once**, both believing their lease valid
//!   (`Lease::is_held`: not lost, before its safe deadline on the holder's
//!   own clock), unless a data-losing fault happened since the earlier
//!   holder's acquire was sent.
//! - **A fence that does not increase** in the order critical sections start
//!   (counted whatever the faults: fences come from the server clock, so they
//!   survive data loss).
//! - **More than N permit holders** of one key believing their permits
//!   valid, with the same data-loss exception as locks.
//! - **More than N requests running at once** per key through
//!   `ConcurrencyLimitLayer`, whose handlers run several hold caps long:
//!   the layer keeps a request's permit for as long as it runs, and ends
//!   the request (`OnLeaseLost::Cancel`) when a fault takes the permit.
//!   Same data-loss exception. And **a request ended by the layer with no
//!   fault** while it ran: a healthy request cut off (as a hold cap applied
//!   to a request in flight would, under `Cancel`).
//! - **A check answered by the failure policy that took quota.** Limiters
//!   failing closed and open with a 100 ms timeout are checked in bursts
//!   while faults run. At the end, with Redis back, a cost-0 check of each
//!   subject reads the units the store holds as used; for a subject with no
//!   data-losing fault since its first check, more than Redis admitted is a
//!   violation (a timed-out check that Redis decided later, or a queued one
//!   sent after its caller gave up).
//! - **An idempotent request run twice.** `POST`s with an `Idempotency-Key`
//!   through `IdempotencyLayer`, retried until answered, while the layer's
//!   connection is killed as handlers return (their completions meet a
//!   reset connection) and the schedule pauses Redis: a key whose handler
//!   ran to its end twice with no data-losing fault since its first request
//!   is a violation.
//!
//! A workload that never succeeds again after the last fault, or a subject
//! whose use cannot be read at the end, is a liveness failure and also
//! makes the exit code non-zero.

mod faults;
mod report;
mod work;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{progress, BenchResult};

/// Which Redis the run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Topology {
    /// One `redis-server`, paused and killed/restarted.
    Standalone,
    /// Three masters with one replica each, paused and failed over.
    Cluster,
    /// Standalone, then cluster (each for the full duration).
    Both,
}

/// Options of `tollgate-bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SoakOpts {
    /// Seconds of load and faults, per topology (setup, the wind-down and
    /// the report come on top).
    #[arg(long, default_value_t = 300)]
    pub(crate) duration: u64,
    /// Which Redis to run against (the testkit starts it).
    #[arg(long, value_enum, default_value_t = Topology::Both)]
    pub(crate) topology: Topology,
    /// Seeds the fault schedule and the workloads' choices (timing still
    /// varies from run to run).
    #[arg(long, default_value_t = 16)]
    pub(crate) seed: u64,
}

/// One fault as it happened: from its first action to the moment Redis was
/// back (restarted, promoted, resumed).
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    pub(crate) what: String,
    /// Whether writes may have been forgotten (restart without persistence,
    /// a failover: replication is asynchronous).
    pub(crate) loses_data: bool,
    /// The testkit's error when the fault could not be carried out.
    pub(crate) error: Option<String>,
}

/// State the workloads and the fault thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) start: Instant,
    pub(crate) stop: AtomicBool,
    /// Set while a fault is being carried out, so that workloads can aim
    /// bursts at a Redis that is paused or down.
    pub(crate) faulting: AtomicBool,
    pub(crate) faults: Mutex<Vec<Fault>>,
}

impl Shared {
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub(crate) fn faulting(&self) -> bool {
        self.faulting.load(Ordering::Relaxed)
    }

    /// Seconds since the run started, for logs.
    pub(crate) fn at(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }
}

/// splitmix64: small, seedable, good enough for schedules and choices.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.range(0, n as u64) as usize
    }

    pub(crate) fn percent(&mut self, p: u64) -> bool {
        self.range(0, 100) < p
    }
}

/// Runs the soak; `Ok(true)` when every topology ran without a violation
/// and every workload recovered after the last fault.
pub(crate) fn run(opts: &SoakOpts) -> BenchResult<bool> {
    tollgate_testkit::require_binaries()?;
    let topologies: &[bool] = match opts.topology {
        Topology::Standalone => &[false],
        Topology::Cluster => &[true],
        Topology::Both => &[false, true],
    };
    let mut clean = true;
    for &cluster in topologies {
        let (markdown, ok) = run_one(cluster, opts)?;
        println!("{markdown}");
        clean &= ok;
    }
    Ok(clean)
}

/// How long the end of the run stays free of faults, so that recovery
/// after the last one is observed (the schedule's closing pause starts at
/// most 1.5 s into it and lasts 1.5 s at most).
fn quiet_tail(duration: Duration) -> Duration {
    (duration / 10).clamp(Duration::from_secs(5), Duration::from_secs(20))
}

fn run_one(cluster: bool, opts: &SoakOpts) -> BenchResult<(String, bool)> {
    let name = if cluster {
        "cluster (3 masters + 3 replicas)"
    } else {
        "standalone"
    };
    progress!("soak: starting {name} for {} s", opts.duration);
    let mut target = faults::Target::start(cluster)?;
    let endpoint = target.endpoint();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let duration = Duration::from_secs(opts.duration);
    let shared = Arc::new(Shared {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        faulting: AtomicBool::new(false),
        faults: Mutex::new(Vec::new()),
    });
    let wall_start = std::time::SystemTime::now();
    let workload = rt.block_on(work::start(&endpoint, shared.clone(), opts.seed))?;
    let faults_until = shared.start + duration.saturating_sub(quiet_tail(duration));
    let fault_thread = {
        let shared = shared.clone();
        let seed = opts.seed;
        std::thread::spawn(move || {
            faults::run(&mut target, &shared, seed, faults_until);
            target
        })
    };
    let end = shared.start + duration;
    rt.block_on(async { tokio::time::sleep_until(end.into()).await });
    shared.stop.store(true, Ordering::Relaxed);
    let stopped = Instant::now();
    progress!("soak: {name}: load stopped, winding down");
    // The last fault ends first: the final peek needs Redis back. The
    // servers stay up until every task has finished (a release in flight
    // must not meet a dead server and be counted as an error).
    let target = fault_thread
        .join()
        .map_err(|_| "the fault thread panicked")?;
    let results = rt.block_on(workload.finish(&endpoint));
    drop(rt);
    drop(target);
    let faults = shared.faults.lock().expect("faults").clone();
    let input = report::Input {
        topology: name,
        cluster,
        opts,
        start: shared.start,
        stopped,
        wall_start,
        faults,
        results,
    };
    Ok(report::render(&input))
}
