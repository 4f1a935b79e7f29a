//! The soak's workloads: rate checks, lock critical sections and permit
//! holders, as tokio tasks over several backends (each its own connection
//! and subscription, as separate processes would have). Every task keeps
//! its own [`Tally`]; locks and permits also enter a shared [`Table`] that
//! sees who is inside a critical section at the same time.

mod concurrency;
mod idem;
mod late;
mod locks;
mod rate;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{Error, Lease, RedisBackend};

pub(crate) use self::concurrency::{Running, CAP, CONC_PERMITS, CONC_TTL};
pub(crate) use self::idem::Runs;
pub(crate) use self::late::{identity, Life, Peek, LATE_LIMIT, LATE_PERIOD, SLICE as LATE_SLICE};
pub(crate) use self::locks::PERMITS;
pub(crate) use self::rate::{ALGORITHMS, RATE_LIMIT, RATE_PERIOD};
use super::faults::Endpoint;
use super::Shared;
use crate::common::BenchResult;

/// Round-trip bound of every check, acquire, renewal and release.
const TIMEOUT: Duration = Duration::from_millis(200);

/// The tasks of every workload, each returning what it saw.
type Tasks = Vec<tokio::task::JoinHandle<Tally>>;

/// One admitted check: which limiter and subject, how many units, and when
/// it was sent and answered (it ran on Redis somewhere in between).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admit {
    pub(crate) limiter: usize,
    pub(crate) subject: u64,
    pub(crate) units: u64,
    pub(crate) sent: Instant,
    pub(crate) answered: Instant,
}

/// What tasks saw, merged at the end.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// "component: outcome" → count.
    pub(crate) decisions: BTreeMap<String, u64>,
    /// (component, kind) → count.
    pub(crate) errors: BTreeMap<(&'static str, &'static str), u64>,
    /// Messages of errors of kind "other" → count.
    pub(crate) other: BTreeMap<String, u64>,
    /// Component → the 100 ms ticks (since the start) with a success.
    pub(crate) ticks: BTreeMap<&'static str, BTreeSet<u64>>,
    pub(crate) admits: Vec<Admit>,
    /// Checks answered by the failure policy, per (limiter, subject).
    pub(crate) lives: BTreeMap<(usize, u64), Life>,
    /// The longest rate check.
    pub(crate) slowest_check: Duration,
}

impl Tally {
    fn decision(&mut self, what: String) {
        *self.decisions.entry(what).or_default() += 1;
    }

    fn error(&mut self, component: &'static str, e: &Error) {
        let kind = match e {
            Error::Timeout(_) => "timeout",
            Error::CircuitOpen => "unavailable (circuit open)",
            Error::Backend(b) if b.is_outage() => "unavailable (outage)",
            _ => "other",
        };
        *self.errors.entry((component, kind)).or_default() += 1;
        if kind == "other" {
            let msg: String = format!("{component}: {e}").chars().take(160).collect();
            *self.other.entry(msg).or_default() += 1;
        }
    }

    fn success(&mut self, component: &'static str, start: Instant) {
        self.success_at(component, start, Instant::now());
    }

    /// A success that happened at `at` (seen later).
    fn success_at(&mut self, component: &'static str, start: Instant, at: Instant) {
        let tick = at.saturating_duration_since(start).as_millis() as u64 / 100;
        self.ticks.entry(component).or_default().insert(tick);
    }

    pub(crate) fn merge(&mut self, other: Tally) {
        for (k, v) in other.decisions {
            *self.decisions.entry(k).or_default() += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in other.other {
            *self.other.entry(k).or_default() += v;
        }
        for (k, v) in other.ticks {
            self.ticks.entry(k).or_default().extend(v);
        }
        self.admits.extend(other.admits);
        for (k, life) in other.lives {
            self.lives
                .entry(k)
                .and_modify(|l| l.merge(&life))
                .or_insert(life);
        }
        self.slowest_check = self.slowest_check.max(other.slowest_check);
    }
}

/// Two holders believed valid at once (or more than N for permits): a
/// violation unless a data-losing fault falls between `since` (the earliest
/// acquire among the holders involved was sent) and `at`.
#[derive(Debug, Clone)]
pub(crate) struct Overlap {
    pub(crate) since: Instant,
    pub(crate) at: Instant,
    pub(crate) detail: String,
}

struct Holder {
    id: u64,
    lease: Arc<Lease>,
    sent: Instant,
    fence: u64,
}

/// Who is inside a critical section, per lock or permit name.
#[derive(Default)]
pub(crate) struct Table {
    holders: HashMap<&'static str, Vec<Holder>>,
    last_fence: HashMap<&'static str, u64>,
    pub(crate) sections: u64,
    pub(crate) overlaps: Vec<Overlap>,
    /// Fences that did not increase in section order: always violations.
    pub(crate) fence_regressions: Vec<Overlap>,
    /// The most holders believing themselves valid at one entry
    /// (including the one entering).
    pub(crate) most_valid: usize,
}

impl Table {
    /// Enters `name`'s critical section with `lease` (checked valid by the
    /// caller under the same lock), recording any violation it makes.
    fn enter(&mut self, name: &'static str, limit: usize, me: Holder, now: Instant) {
        let inside = self.holders.entry(name).or_default();
        let valid: Vec<&Holder> = inside.iter().filter(|h| h.lease.is_held()).collect();
        if valid.len() >= limit {
            let since = valid.iter().map(|h| h.sent).min().unwrap_or(me.sent);
            let fences: Vec<u64> = valid.iter().map(|h| h.fence).collect();
            self.overlaps.push(Overlap {
                since,
                at: now,
                detail: format!(
                    "{name}: fence {} entered while {} valid holder(s) were inside (fences {fences:?})",
                    me.fence,
                    valid.len()
                ),
            });
        }
        if limit == 1 {
            let last = self.last_fence.entry(name).or_default();
            if me.fence <= *last {
                self.fence_regressions.push(Overlap {
                    since: me.sent,
                    at: now,
                    detail: format!("{name}: fence {} after fence {last}", me.fence),
                });
            }
            *last = (*last).max(me.fence);
        }
        self.most_valid = self.most_valid.max(valid.len() + 1);
        inside.push(me);
        self.sections += 1;
    }

    fn leave(&mut self, name: &'static str, id: u64) {
        if let Some(v) = self.holders.get_mut(name) {
            v.retain(|h| h.id != id);
        }
    }
}

/// The running tasks.
pub(crate) struct Workload {
    tasks: Tasks,
    locks: Arc<Mutex<Table>>,
    permits: Arc<Mutex<Table>>,
    running: Arc<Mutex<Running>>,
    runs: Arc<Mutex<Runs>>,
}

/// What the workload produced.
pub(crate) struct Results {
    pub(crate) tally: Tally,
    pub(crate) locks: Table,
    pub(crate) permits: Table,
    pub(crate) concurrency: Running,
    pub(crate) idempotency: Runs,
    /// What the policy workload's subjects had used at the end.
    pub(crate) peeks: Vec<Peek>,
    /// Tasks that did not end within the wind-down bound.
    pub(crate) stuck: usize,
}

async fn backend(endpoint: &Endpoint) -> BenchResult<RedisBackend> {
    Ok(match endpoint {
        Endpoint::Url(url) => RedisBackend::connect(url).await?,
        Endpoint::Seeds(seeds) => RedisBackend::connect_cluster(seeds).await?,
    })
}

/// Starts every workload (see each module's `start`).
pub(crate) async fn start(
    endpoint: &Endpoint,
    shared: Arc<Shared>,
    seed: u64,
) -> BenchResult<Workload> {
    let mut tasks = Vec::new();
    rate::start(endpoint, &shared, seed, &mut tasks).await?;
    let locks = Arc::new(Mutex::new(Table::default()));
    let permits = Arc::new(Mutex::new(Table::default()));
    locks::start(endpoint, &shared, seed, (&locks, &permits), &mut tasks).await?;
    let running = Arc::new(Mutex::new(Running::default()));
    concurrency::start(endpoint, &shared, seed, &running, &mut tasks).await?;
    late::start(endpoint, &shared, seed, &mut tasks).await?;
    let runs = Arc::new(Mutex::new(Runs::default()));
    idem::start(endpoint, &shared, seed, &runs, &mut tasks).await?;
    Ok(Workload {
        tasks,
        locks,
        permits,
        running,
        runs,
    })
}

impl Workload {
    /// Waits for every task (they stop on the shared flag; an acquire may
    /// still wait out its bound), merges what they saw, and reads what the
    /// policy workload's subjects used (call it once the faults are over
    /// and Redis is back).
    pub(crate) async fn finish(self, endpoint: &Endpoint) -> Results {
        let mut tally = Tally::default();
        let mut stuck = 0;
        for t in self.tasks {
            match tokio::time::timeout(Duration::from_secs(30), t).await {
                Ok(Ok(t)) => tally.merge(t),
                Ok(Err(e)) => {
                    stuck += 1;
                    crate::common::progress!("soak: a task failed: {e}");
                }
                Err(_) => stuck += 1,
            }
        }
        let peeks = match late::peek(endpoint, &tally.lives).await {
            Ok(peeks) => peeks,
            Err(e) => {
                crate::common::progress!("soak: the final peek could not connect: {e}");
                Vec::new()
            }
        };
        let take = |t: Arc<Mutex<Table>>| std::mem::take(&mut *t.lock().expect("table"));
        Results {
            peeks,
            tally,
            locks: take(self.locks),
            permits: take(self.permits),
            concurrency: std::mem::take(&mut *self.running.lock().expect("running")),
            idempotency: std::mem::take(&mut *self.runs.lock().expect("runs")),
            stuck,
        }
    }
}
