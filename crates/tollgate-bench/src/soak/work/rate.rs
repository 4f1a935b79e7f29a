//! The rate workload: checks of five limiters (one per algorithm) on two
//! instances, paced single checks and coalesced bursts, every admission
//! kept for the over-admission analysis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{
    Algorithm, Coalescing, DecisionSource, Error, FailurePolicy, Quota, RateLimiter, RedisBackend,
};

use super::{backend, Admit, Tally, Tasks, TIMEOUT};
use crate::common::BenchResult;
use crate::soak::faults::Endpoint;
use crate::soak::{Rng, Shared};

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

/// Starts 4 rate workers over two instances of the five limiters (the
/// second coalescing after 2 calls in flight) and 2 burst workers on that
/// instance.
pub(super) async fn start(
    endpoint: &Endpoint,
    shared: &Arc<Shared>,
    seed: u64,
    tasks: &mut Tasks,
) -> BenchResult<()> {
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
    Ok(())
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
