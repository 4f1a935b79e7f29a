//! The soak's workloads: rate checks, lock critical sections and permit
//! holders, as tokio tasks over several backends (each its own connection
//! and subscription, as separate processes would have). Every task keeps
//! its own [`Tally`]; locks and permits also enter a shared [`Table`] that
//! sees who is inside a critical section at the same time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::{
    Algorithm, Coalescing, DecisionSource, Error, FailurePolicy, Lease, LockOptions, Locker, Quota,
    RateLimiter, RedisBackend, Semaphore,
};

use super::faults::Endpoint;
use super::{Rng, Shared};
use crate::common::BenchResult;

/// Every limiter admits this many units per subject over the whole run.
pub(crate) const RATE_LIMIT: u64 = 20;
/// Ten years, the longest period a quota takes: nothing refills during a
/// run, so the capacity is the whole budget.
pub(crate) const RATE_PERIOD: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// The algorithms under test, one limiter each.
pub(crate) const ALGORITHMS: [Algorithm; 5] = crate::common::ALGORITHMS;
/// A new set of subjects every slice, so fresh subjects are being used up
/// all through the run (a used-up subject only tests denials). With the
/// pacing below, a subject takes a few seconds to use up its budget, so
/// most pauses strike subjects in the middle of it.
const SLICE: Duration = Duration::from_secs(10);
const SUBJECTS_PER_SLICE: u64 = 50;
/// Each rate worker's pause between checks (about 800 checks/s in all).
const RATE_PACING: Duration = Duration::from_millis(5);
/// Checks a burst worker sends at once, all of one subject and limiter, on
/// the instance that coalesces after 2 calls in flight (issue #15): they go
/// out as batches of the batch script while the faults strike.
const BURST: usize = 24;
/// A burst worker's pause between bursts.
const BURST_PACING: Duration = Duration::from_millis(50);
/// Round-trip bound of every check, acquire, renewal and release.
const TIMEOUT: Duration = Duration::from_millis(200);
const LOCK_TTL: Duration = Duration::from_secs(1);
const LOCK_WAIT: Duration = Duration::from_secs(3);
pub(crate) const PERMITS: u32 = 3;
const LOCK_NAMES: [&str; 2] = ["soak-lock-0", "soak-lock-1"];
const PERMIT_NAMES: [&str; 2] = ["soak-sem-0", "soak-sem-1"];

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
        let tick = start.elapsed().as_millis() as u64 / 100;
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
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
    locks: Arc<Mutex<Table>>,
    permits: Arc<Mutex<Table>>,
}

/// What the workload produced.
pub(crate) struct Results {
    pub(crate) tally: Tally,
    pub(crate) locks: Table,
    pub(crate) permits: Table,
    /// Tasks that did not end within the wind-down bound.
    pub(crate) stuck: usize,
}

async fn backend(endpoint: &Endpoint) -> BenchResult<RedisBackend> {
    Ok(match endpoint {
        Endpoint::Url(url) => RedisBackend::connect(url).await?,
        Endpoint::Seeds(seeds) => RedisBackend::connect_cluster(seeds).await?,
    })
}

/// The limiter of algorithm `i` on `backend`; every instance of it shares
/// keys (same prefix and name). `deny_cache`: on for one instance, off for
/// the other, so both paths run.
fn limiter(backend: &RedisBackend, i: usize, deny_cache: bool) -> BenchResult<RateLimiter> {
    let algorithm = ALGORITHMS[i];
    Ok(RateLimiter::builder(backend.clone(), algorithm)
        .quota(Quota::new(RATE_LIMIT, RATE_PERIOD)?)
        .prefix("soak")
        .name(format!("rate-{}", algorithm.short_name()))
        .timeout(TIMEOUT)
        .failure_policy(FailurePolicy::Deny)
        .deny_cache(if deny_cache { 1_000 } else { 0 })
        .build()?)
}

/// Starts every task: 4 rate workers over two instances of the five
/// limiters (the second coalescing after 2 calls in flight), 2 burst
/// workers on that instance, 6 lock workers over three `Locker`s, 10 permit holders over two
/// `Semaphore`s.
pub(crate) async fn start(
    endpoint: &Endpoint,
    shared: Arc<Shared>,
    seed: u64,
) -> BenchResult<Workload> {
    let mut tasks = Vec::new();
    let mut instances = Vec::new();
    for deny_cache in [true, false] {
        let mut b = backend(endpoint).await?;
        if !deny_cache {
            // Batches form after 2 calls in flight, so the burst workers'
            // checks (and some of the others') are decided by the batch
            // script.
            b = b.with_coalescing(Coalescing::default().max_calls_in_flight(2));
        }
        instances.push(
            (0..ALGORITHMS.len())
                .map(|i| limiter(&b, i, deny_cache))
                .collect::<BenchResult<Vec<_>>>()?,
        );
    }
    let instances = Arc::new(instances);
    for w in 0..4 {
        let rng = Rng::new(seed.wrapping_mul(31).wrapping_add(w));
        tasks.push(tokio::spawn(rate_worker(
            instances.clone(),
            shared.clone(),
            rng,
        )));
    }
    for w in 0..2 {
        let rng = Rng::new(seed.wrapping_mul(37).wrapping_add(w));
        tasks.push(tokio::spawn(burst_worker(
            instances.clone(),
            shared.clone(),
            rng,
        )));
    }
    let locks = Arc::new(Mutex::new(Table::default()));
    let permits = Arc::new(Mutex::new(Table::default()));
    let ids = Arc::new(AtomicU64::new(0));
    for l in 0..3 {
        let locker = Locker::builder(backend(endpoint).await?)
            .prefix("soak")
            .timeout(TIMEOUT)
            .build()?;
        for w in 0..2 {
            let ctx = Ctx {
                shared: shared.clone(),
                table: locks.clone(),
                ids: ids.clone(),
                rng: Rng::new(seed.wrapping_mul(37).wrapping_add(l * 2 + w)),
            };
            tasks.push(tokio::spawn(holder(Take::Lock(locker.clone()), ctx)));
        }
    }
    for s in 0..2 {
        let sem = Semaphore::builder(backend(endpoint).await?, PERMITS)
            .prefix("soak")
            .timeout(TIMEOUT)
            .on_failure(FailurePolicy::Deny)
            .build()?;
        for w in 0..5 {
            let ctx = Ctx {
                shared: shared.clone(),
                table: permits.clone(),
                ids: ids.clone(),
                rng: Rng::new(seed.wrapping_mul(41).wrapping_add(s * 5 + w)),
            };
            tasks.push(tokio::spawn(holder(Take::Permit(sem.clone()), ctx)));
        }
    }
    Ok(Workload {
        tasks,
        locks,
        permits,
    })
}

impl Workload {
    /// Waits for every task (they stop on the shared flag; an acquire may
    /// still wait out its bound) and merges what they saw.
    pub(crate) async fn finish(self) -> Results {
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
        let take = |t: Arc<Mutex<Table>>| std::mem::take(&mut *t.lock().expect("table"));
        Results {
            tally,
            locks: take(self.locks),
            permits: take(self.permits),
            stuck,
        }
    }
}

fn source(s: DecisionSource) -> &'static str {
    match s {
        DecisionSource::Backend => "Redis",
        DecisionSource::DenyCache => "deny cache",
        DecisionSource::FailOpen => "fail-open",
        DecisionSource::Fallback => "fallback",
        _ => "other source",
    }
}

/// A subject of the current slice and a limiter, at random.
fn pick(shared: &Shared, rng: &mut Rng) -> (u64, usize) {
    let slice = shared.start.elapsed().as_millis() as u64 / SLICE.as_millis() as u64;
    let subject = slice * SUBJECTS_PER_SLICE + rng.range(0, SUBJECTS_PER_SLICE);
    (subject, rng.below(ALGORITHMS.len()))
}

async fn rate_worker(
    instances: Arc<Vec<Vec<RateLimiter>>>,
    shared: Arc<Shared>,
    mut rng: Rng,
) -> Tally {
    let mut tally = Tally::default();
    while !shared.stopped() {
        let (subject, limiter) = pick(&shared, &mut rng);
        let instance = &instances[rng.below(instances.len())];
        let units = if rng.percent(70) { 1 } else { rng.range(2, 4) };
        let sent = Instant::now();
        let result = instance[limiter]
            .check_n(format!("s{subject}"), units)
            .await;
        let ok = record(&mut tally, &shared, result, (limiter, subject, units), sent);
        let pause = if ok {
            RATE_PACING
        } else {
            Duration::from_millis(20)
        };
        tokio::time::sleep(pause).await;
    }
    tally
}

/// Bursts of [`BURST`] checks of one unit on one subject and limiter of the
/// coalescing instance, sent at once.
async fn burst_worker(
    instances: Arc<Vec<Vec<RateLimiter>>>,
    shared: Arc<Shared>,
    mut rng: Rng,
) -> Tally {
    let mut tally = Tally::default();
    while !shared.stopped() {
        let (subject, limiter) = pick(&shared, &mut rng);
        let l = &instances[1][limiter];
        let name = format!("s{subject}");
        let sent = Instant::now();
        let results = futures::future::join_all((0..BURST).map(|_| l.check_n(&name, 1))).await;
        for result in results {
            record(&mut tally, &shared, result, (limiter, subject, 1), sent);
        }
        tokio::time::sleep(BURST_PACING).await;
    }
    tally
}

/// Tallies one check's result; whether it was decided.
fn record(
    tally: &mut Tally,
    shared: &Shared,
    result: Result<tollgate_core::Decision, Error>,
    (limiter, subject, units): (usize, u64, u64),
    sent: Instant,
) -> bool {
    let answered = Instant::now();
    tally.slowest_check = tally.slowest_check.max(answered - sent);
    match result {
        Ok(d) => {
            let verdict = if d.allowed { "admitted" } else { "denied" };
            tally.decision(format!("rate: {verdict} ({})", source(d.source)));
            if d.source == DecisionSource::Backend {
                tally.success("rate", shared.start);
            }
            if d.allowed {
                tally.admits.push(Admit {
                    limiter,
                    subject,
                    units,
                    sent,
                    answered,
                });
            }
            true
        }
        Err(e) => {
            tally.error("rate check", &e);
            false
        }
    }
}

/// A lock or a semaphore: one loop serves both.
enum Take {
    Lock(Locker),
    Permit(Semaphore),
}

struct Ctx {
    shared: Arc<Shared>,
    table: Arc<Mutex<Table>>,
    ids: Arc<AtomicU64>,
    rng: Rng,
}

/// How long a critical section works: mostly a few ms, sometimes long
/// enough for renewals, and for a pause to strike inside it.
fn work_time(rng: &mut Rng) -> Duration {
    let ms = match rng.range(0, 100) {
        0..70 => rng.range(2, 10),
        70..95 => rng.range(50, 300),
        _ => rng.range(500, 2_500),
    };
    Duration::from_millis(ms)
}

async fn holder(take: Take, mut ctx: Ctx) -> Tally {
    let mut tally = Tally::default();
    let (component, release, names, limit): (_, _, &[&'static str], usize) = match &take {
        Take::Lock(_) => ("lock", "lock release", &LOCK_NAMES, 1),
        Take::Permit(_) => ("permit", "permit release", &PERMIT_NAMES, PERMITS as usize),
    };
    let options = LockOptions::new().ttl(LOCK_TTL).wait(LOCK_WAIT);
    while !ctx.shared.stopped() {
        let name = names[ctx.rng.below(names.len())];
        let sent = Instant::now();
        let result = match &take {
            Take::Lock(l) => l.acquire(name, &options).await,
            Take::Permit(s) => s.acquire(name, &options).await,
        };
        let lease = match result {
            Ok(lease) => Arc::new(lease),
            Err(Error::Busy { .. }) => {
                tally.decision(format!("{component}: busy after the {LOCK_WAIT:?} wait"));
                continue;
            }
            Err(e) => {
                tally.error(component, &e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = ctx.ids.fetch_add(1, Ordering::Relaxed);
        let entered = {
            let mut table = ctx.table.lock().expect("table");
            // Checked under the table's lock, so that the validity of every
            // holder is judged at one instant.
            let valid = lease.is_held();
            if valid {
                let me = Holder {
                    id,
                    lease: lease.clone(),
                    sent,
                    fence: lease.fence().get(),
                };
                table.enter(name, limit, me, Instant::now());
            }
            valid
        };
        if entered {
            tally.decision(format!("{component}: critical section"));
            tally.success(component, ctx.shared.start);
            let lost = lease.lost();
            tokio::select! {
                () = lost => tally.decision(format!("{component}: lease lost inside the section")),
                () = tokio::time::sleep(work_time(&mut ctx.rng)) => {}
            }
            ctx.table.lock().expect("table").leave(name, id);
        } else {
            tally.decision(format!(
                "{component}: acquired but no longer valid on arrival (not entered)"
            ));
        }
        let lease = Arc::into_inner(lease).expect("the table let go of the lease");
        match lease.release().await {
            Ok(true) => tally.decision(format!("{component}: released")),
            Ok(false) => tally.decision(format!("{component}: release found it lost/expired")),
            Err(e) => tally.error(release, &e),
        }
    }
    tally
}
