//! The soak's Redis (started by tollgate-testkit) and its seeded fault
//! schedule. Faults run one at a time on a thread of their own; each is
//! bounded (pauses by their length, restarts and promotions by the
//! testkit's timeouts), and none starts after `until` (the closing pause:
//! 1.5 s at most), so the run ends.

use std::sync::atomic::Ordering;
use std::thread::sleep;
use std::time::{Duration, Instant};

use tollgate_testkit::{RedisCluster, RedisServer};

use super::work::LATE_SLICE;
use super::{Fault, Rng, Shared};
use crate::common::{progress, BenchResult};

/// The Redis under test.
pub(crate) enum Target {
    Standalone(RedisServer),
    Cluster(RedisCluster),
}

/// How the workloads connect.
#[derive(Debug, Clone)]
pub(crate) enum Endpoint {
    Url(String),
    Seeds(Vec<String>),
}

impl Target {
    pub(crate) fn start(cluster: bool) -> BenchResult<Target> {
        Ok(if cluster {
            Target::Cluster(RedisCluster::start_with_replicas(1)?)
        } else {
            Target::Standalone(RedisServer::start()?)
        })
    }

    pub(crate) fn endpoint(&self) -> Endpoint {
        match self {
            Target::Standalone(s) => Endpoint::Url(s.url()),
            Target::Cluster(c) => Endpoint::Seeds(c.seeds()),
        }
    }
}

/// What the schedule can do.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// SIGSTOP for 100 ms – 2 s (cluster: 1.5 s, below what the cluster's
    /// 2 s node timeout and the election need to fail a master over).
    Pause,
    /// Standalone: SIGKILL, down 100 ms – 1 s, restart with an empty data set.
    KillRestart,
    /// Cluster: SIGKILL a master, wait for its replica's promotion, restart
    /// the killed node (it rejoins as a replica).
    KillMaster,
    /// Cluster: `CLUSTER FAILOVER FORCE` on a synced replica.
    ForceFailover,
    /// The schedule's last fault: a pause of 500 ms – 1.5 s, long enough
    /// for many 100 ms checks to time out.
    ClosingPause,
}

/// Gaps between faults.
const GAP_MS: (u64, u64) = (2_000, 6_000);
/// Data-losing cluster faults are extended by this much when the report
/// groups admissions into epochs: a demoted master may still answer for a
/// moment after the promotion was seen. (A restarted standalone server
/// has nothing to add: from its restart on, it answers from the new state.)
pub(crate) const LOSS_GRACE: Duration = Duration::from_secs(1);

/// How late the closing pause may start after `until`.
const CLOSING_SLACK: Duration = Duration::from_millis(1_500);

/// Runs faults until `until` (or the stop flag), logging each in `shared`,
/// and ends with a pause (see [`closing_start`]).
pub(crate) fn run(target: &mut Target, shared: &Shared, seed: u64, until: Instant) {
    // The schedule has its own stream, so the workloads' choices do not
    // shift it.
    let mut rng = Rng::new(seed ^ 0xFA17_5EED);
    let mut bag: Vec<Kind> = Vec::new();
    let mut masters = match target {
        Target::Cluster(c) => sorted(c.masters()),
        Target::Standalone(_) => Vec::new(),
    };
    let mut stable_since = Instant::now();
    loop {
        let gap = Duration::from_millis(rng.range(GAP_MS.0, GAP_MS.1));
        let wake = Instant::now() + gap;
        if !wait_until(shared, wake.min(until)) || Instant::now() >= until {
            break;
        }
        if let Target::Cluster(c) = target {
            check_unplanned(c, shared, &mut masters, &mut stable_since);
        }
        if bag.is_empty() {
            bag = match target {
                Target::Standalone(_) => vec![Kind::Pause, Kind::Pause, Kind::KillRestart],
                Target::Cluster(_) => vec![
                    Kind::Pause,
                    Kind::Pause,
                    Kind::KillMaster,
                    Kind::ForceFailover,
                ],
            };
            // Fisher–Yates, seeded.
            for i in (1..bag.len()).rev() {
                bag.swap(i, rng.below(i + 1));
            }
        }
        let kind = bag.pop().expect("refilled above");
        strike(target, shared, kind, &mut rng);
        if let Target::Cluster(c) = target {
            masters = sorted(c.masters());
            stable_since = Instant::now();
        }
    }
    match closing_start(shared, until, matches!(target, Target::Cluster(_))) {
        Some(at) if wait_until(shared, at) => {
            if let Target::Cluster(c) = target {
                check_unplanned(c, shared, &mut masters, &mut stable_since);
            }
            strike(target, shared, Kind::ClosingPause, &mut rng);
        }
        Some(_) => {}
        None => progress!("soak: no closing pause: the last data loss ended too late"),
    }
    if let Target::Cluster(c) = target {
        check_unplanned(c, shared, &mut masters, &mut stable_since);
    }
}

/// Sleeps until `at`; false if the run was stopped first.
fn wait_until(shared: &Shared, at: Instant) -> bool {
    while Instant::now() < at {
        if shared.stopped() {
            return false;
        }
        sleep(Duration::from_millis(50));
    }
    !shared.stopped()
}

/// When the closing pause starts: at `until`, but no sooner than a slice of
/// the policy workload (and on a cluster the loss grace) after the last
/// data loss. That
/// workload judges only subjects born after the last data loss, so the
/// schedule ends with a pause they live through; a pause loses nothing.
/// `None` when that would eat into the quiet tail by more than
/// [`CLOSING_SLACK`].
fn closing_start(shared: &Shared, until: Instant, cluster: bool) -> Option<Instant> {
    let faults = shared.faults.lock().expect("faults");
    let last_loss = faults.iter().filter(|f| f.loses_data).map(|f| f.end).max();
    let grace = if cluster { LOSS_GRACE } else { Duration::ZERO };
    // Time for the new slice's subjects to see their first checks.
    let settled = Duration::from_millis(200);
    let at = last_loss.map_or(until, |t| until.max(t + grace + LATE_SLICE + settled));
    (at <= until + CLOSING_SLACK).then_some(at)
}

/// Carries out one fault, flagged in `shared` while it runs, and logs it.
fn strike(target: &mut Target, shared: &Shared, kind: Kind, rng: &mut Rng) {
    shared.faulting.store(true, Ordering::Relaxed);
    let fault = match target {
        Target::Standalone(s) => standalone(s, kind, rng),
        Target::Cluster(c) => cluster(c, kind, rng),
    };
    shared.faulting.store(false, Ordering::Relaxed);
    progress!(
        "soak: t={:.1}s {} ({:.1} s){}",
        shared.at(fault.start),
        fault.what,
        (fault.end - fault.start).as_secs_f64(),
        fault
            .error
            .as_deref()
            .map(|e| format!(" — failed: {e}"))
            .unwrap_or_default()
    );
    shared.faults.lock().expect("faults").push(fault);
}

fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v
}

/// A failover nobody asked for (a pause that the cluster took for a
/// failure) loses data like a planned one: it is logged as a data-losing
/// fault spanning the time since the masters were last seen unchanged.
fn check_unplanned(
    c: &RedisCluster,
    shared: &Shared,
    masters: &mut Vec<usize>,
    stable_since: &mut Instant,
) {
    let now = sorted(c.masters());
    if now != *masters {
        let fault = Fault {
            start: *stable_since,
            end: Instant::now(),
            what: format!("unplanned: the masters changed from nodes {masters:?} to {now:?}"),
            loses_data: true,
            error: None,
        };
        progress!("soak: {}", fault.what);
        shared.faults.lock().expect("faults").push(fault);
        *masters = now;
    }
    *stable_since = Instant::now();
}

fn standalone(s: &mut RedisServer, kind: Kind, rng: &mut Rng) -> Fault {
    let start = Instant::now();
    match kind {
        Kind::KillRestart | Kind::KillMaster | Kind::ForceFailover => {
            let down = rng.range(100, 1_000);
            s.stop();
            sleep(Duration::from_millis(down));
            let error = s.restart().err().map(|e| e.to_string());
            Fault {
                start,
                end: Instant::now(),
                what: format!("kill -9, down {down} ms, restart (empty data set)"),
                loses_data: true,
                error,
            }
        }
        Kind::Pause | Kind::ClosingPause => {
            let ms = pause_ms(kind, rng, 2_000);
            let _ = s.pause_for(Duration::from_millis(ms)).join();
            Fault {
                start,
                end: Instant::now(),
                what: format!("pause (SIGSTOP) {ms} ms"),
                loses_data: false,
                error: None,
            }
        }
    }
}

/// A pause's length (ms): up to `max` (below what fails a cluster master
/// over), at least 500 for the closing pause.
fn pause_ms(kind: Kind, rng: &mut Rng, max: u64) -> u64 {
    match kind {
        Kind::ClosingPause => rng.range(500, 1_500),
        _ => rng.range(100, max),
    }
}

/// Whether `node` is a replica whose link to its master is up (a replica
/// that never synced may refuse to be promoted).
fn synced_replica(node: &RedisServer) -> bool {
    let info = node.cli(&["INFO", "replication"]);
    info.contains("role:slave") && info.contains("master_link_status:up")
}

/// Waits up to `bound` for `node` to report itself a replica.
fn demoted(node: &RedisServer, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if node.cli(&["INFO", "replication"]).contains("role:slave") {
            return true;
        }
        sleep(Duration::from_millis(50));
    }
    false
}

/// A master with a synced replica, chosen by `rng`: (master, replica).
fn pick_pair(c: &RedisCluster, rng: &mut Rng) -> Option<(usize, usize)> {
    let pairs: Vec<(usize, usize)> = c
        .masters()
        .into_iter()
        .flat_map(|m| {
            c.replicas_of(m)
                .into_iter()
                .filter(|&r| synced_replica(&c.nodes()[r]))
                .map(move |r| (m, r))
        })
        .collect();
    (!pairs.is_empty()).then(|| pairs[rng.below(pairs.len())])
}

fn cluster(c: &mut RedisCluster, kind: Kind, rng: &mut Rng) -> Fault {
    let start = Instant::now();
    let pair = match kind {
        Kind::KillMaster | Kind::ForceFailover => pick_pair(c, rng),
        Kind::Pause | Kind::ClosingPause | Kind::KillRestart => None,
    };
    match (kind, pair) {
        (Kind::KillMaster, Some((m, _))) => {
            let promoted = c.kill_master(m);
            let promoted_at = Instant::now();
            // Restarted, the node comes back with its nodes.conf and an
            // empty data set; the cluster makes it a replica of the new
            // master (Redis delays a restarted master's rejoin for this).
            sleep(Duration::from_millis(300));
            let restarted = c.nodes_mut()[m].restart();
            let (what, error) = match (promoted, restarted) {
                (Ok(p), Ok(())) => (
                    format!(
                        "kill -9 master node {m}; node {p} promoted after {:.1} s; node {m} restarted",
                        (promoted_at - start).as_secs_f64()
                    ),
                    None,
                ),
                (p, r) => (
                    format!("kill -9 master node {m}"),
                    Some(format!("promotion: {p:?}; restart: {r:?}")),
                ),
            };
            Fault {
                start,
                end: Instant::now(),
                what,
                loses_data: true,
                error,
            }
        }
        (Kind::ForceFailover, Some((m, r))) => {
            let mut error = c.force_failover(r).err().map(|e| e.to_string());
            // The old master may accept writes until it learns of the new
            // epoch and turns replica: the fault (and its possible data
            // loss) lasts until then.
            if error.is_none() && !demoted(&c.nodes()[m], Duration::from_secs(10)) {
                error = Some(format!("node {m} still a master 10 s after the failover"));
            }
            Fault {
                start,
                end: Instant::now(),
                what: format!("CLUSTER FAILOVER FORCE: node {r} takes over from master node {m}"),
                loses_data: true,
                error,
            }
        }
        // A pause, or a failover with no synced replica to promote.
        _ => {
            let masters = c.masters();
            let Some(&m) = masters.get(rng.below(masters.len().max(1))) else {
                return Fault {
                    start,
                    end: Instant::now(),
                    what: "pause".to_owned(),
                    loses_data: false,
                    error: Some("no running master".to_owned()),
                };
            };
            let ms = pause_ms(kind, rng, 1_500);
            let _ = c.nodes()[m].pause_for(Duration::from_millis(ms)).join();
            let note = if matches!(kind, Kind::Pause | Kind::ClosingPause) {
                ""
            } else {
                " (instead of a failover: no synced replica)"
            };
            Fault {
                start,
                end: Instant::now(),
                what: format!("pause (SIGSTOP) master node {m} {ms} ms{note}"),
                loses_data: false,
                error: None,
            }
        }
    }
}
