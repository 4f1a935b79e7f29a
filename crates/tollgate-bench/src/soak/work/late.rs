//! Checks answered by the failure policy: limiters with a 100 ms timeout,
//! failing closed and open, with and without coalescing, checked in
//! bursts while a fault runs, so that checks time out while Redis holds
//! them (paused) or cannot take them (down). None of those may take
//! anything, however late Redis gets to them: at the end, once Redis is
//! back, a cost-0 check of every subject shows the units the store holds
//! as used, and for a subject whose whole life fell within one epoch they
//! must be the units Redis admitted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tollgate_core::{
    Algorithm, Coalescing, DecisionSource, Error, FailurePolicy, Quota, RateLimiter, RedisBackend,
};

use super::rate::ALGORITHMS;
use super::{backend, Tally, Tasks};
use crate::common::BenchResult;
use crate::soak::faults::Endpoint;
use crate::soak::{Rng, Shared};

/// Units per subject: far more than a subject is ever asked for, so that
/// it never runs out and a unit taken without being admitted always shows
/// in what is left.
pub(crate) const LATE_LIMIT: u64 = 1_000;
/// The longest period a quota of [`LATE_LIMIT`] may have (limit × period
/// in µs stays below 2^53): less than a unit refills during a run.
pub(crate) const LATE_PERIOD: Duration = Duration::from_secs(90 * 24 * 3600);
/// Short, so that checks time out while Redis is paused, and are then
/// decided (or not) when it resumes.
const LATE_TIMEOUT: Duration = Duration::from_millis(100);
/// Fresh subjects every slice, short lived: only subjects that start after
/// the last data-losing fault are judged, so some must start in the last
/// seconds of faults and through the quiet tail.
pub(crate) const SLICE: Duration = Duration::from_secs(2);
const SUBJECTS_PER_SLICE: u64 = 4;
/// Checks sent at once on one subject while a fault runs.
const BURST: usize = 16;
const PACING: Duration = Duration::from_millis(10);
/// The failure policies, in limiter order.
const POLICIES: [(&str, FailurePolicy); 2] = [
    ("deny", FailurePolicy::Deny),
    ("allow", FailurePolicy::Allow),
];

/// One (policy, algorithm) pair, a limiter name whichever instance checks:
/// its policy and algorithm.
pub(crate) fn identity(i: usize) -> (&'static str, Algorithm) {
    (
        POLICIES[i / ALGORITHMS.len()].0,
        ALGORITHMS[i % ALGORITHMS.len()],
    )
}

const IDENTITIES: usize = POLICIES.len() * ALGORITHMS.len();

/// What the checks of one subject of one limiter saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Life {
    /// When its first check was sent.
    pub(crate) first: Instant,
    /// When its last check was answered.
    pub(crate) last: Instant,
    /// Units admitted by Redis (`DecisionSource::Backend`, allowed).
    pub(crate) admitted: u64,
    /// Checks answered by the failure policy (a timeout, the circuit open,
    /// an outage; refused or admitted without Redis).
    pub(crate) policy: u64,
}

impl Life {
    fn new(at: Instant) -> Self {
        Life {
            first: at,
            last: at,
            admitted: 0,
            policy: 0,
        }
    }

    pub(super) fn merge(&mut self, other: &Life) {
        self.first = self.first.min(other.first);
        self.last = self.last.max(other.last);
        self.admitted += other.admitted;
        self.policy += other.policy;
    }
}

/// The end state of one subject of one limiter: the units the store holds
/// as used (`None`: the store could not be read).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peek {
    pub(crate) identity: usize,
    pub(crate) subject: u64,
    pub(crate) used: Option<u64>,
}

fn limiter(
    backend: &RedisBackend,
    identity: usize,
    timeout: Duration,
    breaker: u32,
) -> BenchResult<RateLimiter> {
    let ((name, policy), algorithm) = (
        POLICIES[identity / ALGORITHMS.len()],
        ALGORITHMS[identity % ALGORITHMS.len()],
    );
    Ok(RateLimiter::builder(backend.clone(), algorithm)
        .quota(Quota::new(LATE_LIMIT, LATE_PERIOD)?)
        .prefix("soak")
        .name(format!("late-{name}"))
        .timeout(timeout)
        .failure_policy(policy)
        .circuit_breaker(breaker, Duration::from_secs(1))
        .deny_cache(0)
        .build()?)
}

/// Starts 3 workers over two instances of the ten limiters: one without
/// coalescing and with the default circuit breaker (after 5 failures, a
/// second of `CircuitOpen` answers), one coalescing after 2 calls in
/// flight with a breaker that never opens, so that checks queue while
/// Redis is paused and their callers give up.
pub(super) async fn start(
    endpoint: &Endpoint,
    shared: &Arc<Shared>,
    seed: u64,
    tasks: &mut Tasks,
) -> BenchResult<()> {
    let plain = backend(endpoint).await?.with_coalescing(Coalescing::off());
    let queued = backend(endpoint)
        .await?
        .with_coalescing(Coalescing::default().max_calls_in_flight(2));
    let mut limiters = Vec::new();
    for (b, breaker) in [(&plain, 5), (&queued, u32::MAX)] {
        for i in 0..IDENTITIES {
            limiters.push(limiter(b, i, LATE_TIMEOUT, breaker)?);
        }
    }
    let limiters = Arc::new(limiters);
    for w in 0..3 {
        let rng = Rng::new(seed.wrapping_mul(47).wrapping_add(w));
        tasks.push(tokio::spawn(worker(limiters.clone(), shared.clone(), rng)));
    }
    Ok(())
}

async fn worker(limiters: Arc<Vec<RateLimiter>>, shared: Arc<Shared>, mut rng: Rng) -> Tally {
    let mut tally = Tally::default();
    while !shared.stopped() {
        let slice = shared.start.elapsed().as_millis() as u64 / SLICE.as_millis() as u64;
        let subject = slice * SUBJECTS_PER_SLICE + rng.range(0, SUBJECTS_PER_SLICE);
        let l = rng.below(limiters.len());
        let n = if shared.faulting() { BURST } else { 1 };
        let name = format!("s{subject}");
        let sent = Instant::now();
        let results =
            futures::future::join_all((0..n).map(|_| limiters[l].check_n(&name, 1))).await;
        for result in results {
            record(&mut tally, &shared, (l % IDENTITIES, subject), sent, result);
        }
        tokio::time::sleep(PACING).await;
    }
    tally
}

fn record(
    tally: &mut Tally,
    shared: &Shared,
    (identity, subject): (usize, u64),
    sent: Instant,
    result: Result<tollgate_core::Decision, Error>,
) {
    // (what happened, admitted by Redis, answered by the policy)
    let (outcome, admitted, policy) = match &result {
        Ok(d) if d.source == DecisionSource::Backend => {
            tally.success("policy", shared.start);
            if d.allowed {
                ("admitted by Redis", true, false)
            } else {
                ("denied by Redis", false, false)
            }
        }
        Ok(d) if d.source == DecisionSource::FailOpen => {
            ("admitted by the policy (fail-open)", false, true)
        }
        Ok(_) => ("answered from elsewhere", false, false),
        // The script's answer to a check that reached it past its deadline,
        // seen only when it comes before the client's own timeout (which
        // carries the timeout's length).
        Err(Error::Timeout(d)) if d.is_zero() => (
            "refused by the policy: the script found it past its deadline",
            false,
            true,
        ),
        Err(Error::Timeout(_)) => ("refused by the policy: timeout", false, true),
        Err(Error::CircuitOpen) => ("refused by the policy: circuit open", false, true),
        Err(Error::Backend(b)) if b.is_outage() => ("refused by the policy: outage", false, true),
        Err(e) => {
            tally.error("policy check", e);
            ("an error not an outage", false, false)
        }
    };
    let life = tally
        .lives
        .entry((identity, subject))
        .or_insert_with(|| Life::new(sent));
    life.last = Instant::now();
    life.admitted += u64::from(admitted);
    life.policy += u64::from(policy);
    let (name, _) = self::identity(identity);
    tally.decision(format!("policy ({name}): {outcome}"));
}

/// Reads what every subject of `lives` has used, once the run is over and
/// Redis is back: a check of cost 0 takes nothing and tells what is left.
/// On its own connection, without coalescing, with a 1 s timeout; each
/// subject is tried for up to 10 s (a cluster may still be settling), and
/// only an answer from Redis counts.
pub(crate) async fn peek(
    endpoint: &Endpoint,
    lives: &BTreeMap<(usize, u64), Life>,
) -> BenchResult<Vec<Peek>> {
    let b = backend(endpoint).await?.with_coalescing(Coalescing::off());
    let limiters: Vec<RateLimiter> = (0..IDENTITIES)
        .map(|i| limiter(&b, i, Duration::from_secs(1), u32::MAX))
        .collect::<BenchResult<_>>()?;
    let limiters = &limiters;
    let peeks = futures::stream::iter(lives.keys().copied())
        .map(|(identity, subject)| async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let name = format!("s{subject}");
            let used = loop {
                match limiters[identity].check_n(&name, 0).await {
                    Ok(d) if d.source == DecisionSource::Backend => {
                        break Some(d.limit - d.remaining)
                    }
                    _ if Instant::now() >= deadline => break None,
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            Peek {
                identity,
                subject,
                used,
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    Ok(peeks)
}
