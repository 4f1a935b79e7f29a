//! The report's figures for the promises at the edges: the concurrency
//! layer past its hold cap, checks answered by the failure policy, and
//! idempotent requests whose completions meet killed connections.

use std::time::Instant;

use super::{allowance, intersects, Input, Span};
use crate::soak::work::{
    identity, Running, Runs, CAP, CONC_PERMITS, CONC_TTL, LATE_LIMIT, LATE_PERIOD,
};

/// The concurrency layer's row: requests through `ConcurrencyLimitLayer`
/// whose handlers run past the hold cap.
pub(super) fn concurrency_row(c: &Running, bad: usize, excused: usize) -> Vec<String> {
    vec![
        format!(
            "concurrency layer: at most {CONC_PERMITS} requests running per key, past the hold cap ({} ms)",
            CAP.as_millis()
        ),
        format!(
            "{} requests started, {} completed ({} past the cap, longest {:.1} s), {} ended by the \
             layer on a lost permit; at most {} running at once",
            c.started,
            c.completed,
            c.past_cap,
            c.longest.as_secs_f64(),
            c.cancelled.len(),
            c.most
        ),
        bad.to_string(),
        format!("{excused} over the limit after a data loss"),
    ]
}

/// Requests the layer ended on a lost permit with no fault while they ran
/// (or within a TTL after a fault, as long as a renewal may take to fail):
/// a healthy request cut off, as a hold cap applied to a request in flight
/// would.
pub(super) fn cut_off<'a>(input: &'a Input) -> Vec<&'a String> {
    input
        .results
        .concurrency
        .cancelled
        .iter()
        .filter(|(sent, ended, _)| {
            !input
                .faults
                .iter()
                .any(|f| intersects(&(f.start, f.end + CONC_TTL), *sent, *ended))
        })
        .map(|(_, _, detail)| detail)
        .collect()
}

/// The row of requests ended by the layer: each must follow a fault.
pub(super) fn cut_off_row(c: &Running, cut_off: usize) -> Vec<String> {
    vec![
        "concurrency layer: a request is ended (its permit lost) only by a fault".to_owned(),
        format!("{} requests ended by the layer", c.cancelled.len()),
        cut_off.to_string(),
        format!(
            "{} with a fault during the request (or within a TTL after it)",
            c.cancelled.len() - cut_off
        ),
    ]
}

/// What the failure policy answered, and what the store holds as used.
#[derive(Default)]
pub(super) struct LateFigures {
    /// Checks answered by the failure policy, in all.
    answers: u64,
    subjects: usize,
    /// Subjects with no data loss from their first check to the end: the
    /// store's figure is theirs alone.
    judged: usize,
    /// Judged subjects that lived through a fault (a pause, Redis down).
    judged_through_fault: usize,
    judged_answers: u64,
    judged_admitted: u64,
    judged_used: u64,
    /// Judged subjects holding fewer units used than Redis admitted (not
    /// a promise of the policy's; a sign of lost writes).
    fewer: usize,
    /// Subjects whose use could not be read at the end.
    pub(super) unread: usize,
    pub(super) violations: Vec<String>,
}

/// For every subject of the policy workload whose whole life fell within
/// one epoch, the units the store holds as used must be the units Redis
/// admitted (plus a capacity if a window boundary fell inside the run):
/// more means a check answered by the failure policy took quota.
pub(super) fn late_figures(input: &Input, losses: &[Span]) -> LateFigures {
    let r = &input.results;
    let run = input.stopped - input.start;
    let mut f = LateFigures {
        subjects: r.tally.lives.len(),
        ..LateFigures::default()
    };
    for life in r.tally.lives.values() {
        f.answers += life.policy;
    }
    f.unread = r.tally.lives.len().saturating_sub(r.peeks.len());
    for p in &r.peeks {
        let Some(life) = r.tally.lives.get(&(p.identity, p.subject)) else {
            continue;
        };
        let Some(used) = p.used else {
            f.unread += 1;
            continue;
        };
        if losses.iter().any(|w| w.1 >= life.first) {
            continue;
        }
        let (policy, algorithm) = identity(p.identity);
        f.judged += 1;
        f.judged_answers += life.policy;
        f.judged_admitted += life.admitted;
        f.judged_used += used;
        let during = |s: Instant, e: Instant| intersects(&(s, e), life.first, life.last);
        if input.faults.iter().any(|x| during(x.start, x.end)) {
            f.judged_through_fault += 1;
        }
        if used < life.admitted {
            f.fewer += 1;
        }
        let extra = allowance(algorithm, (LATE_LIMIT, LATE_PERIOD), input.wall_start, run);
        if used > life.admitted + extra {
            f.violations.push(format!(
                "policy ({policy}) {} subject s{}: the store holds {used} units used, Redis \
                 admitted {} ({} checks answered by the failure policy)",
                algorithm.short_name(),
                p.subject,
                life.admitted,
                life.policy
            ));
        }
    }
    f
}

pub(super) fn late_row(f: &LateFigures) -> Vec<String> {
    vec![
        "policy answers take nothing: units used at the end = units Redis admitted, per subject \
         with no data loss since its first check"
            .to_owned(),
        format!(
            "{} checks answered by the failure policy; {} of {} subjects judged ({} lived \
             through a fault, {} policy answers among them): {} units admitted, {} held used",
            f.answers,
            f.judged,
            f.subjects,
            f.judged_through_fault,
            f.judged_answers,
            f.judged_admitted,
            f.judged_used
        ),
        f.violations.len().to_string(),
        format!(
            "{} subjects with a data loss since their first check; {} judged ones holding fewer \
             used than admitted",
            f.subjects - f.judged - f.unread,
            f.fewer
        ),
    ]
}

/// How the policy workload runs, under the decisions table.
pub(super) fn policy_setup() -> String {
    format!(
        "Policy answers: the five algorithms failing closed (`deny`) and open (`allow`), {LATE_LIMIT} \
         units per {} days per subject, a 100 ms timeout, on two connections (no coalescing with the \
         default circuit breaker; coalescing after 2 calls in flight with a breaker that never \
         opens), bursts of 16 checks while a fault runs, 4 new subjects every 2 s; the schedule \
         ends with a pause that subjects born after the last data loss live through.\n",
        LATE_PERIOD.as_secs() / 86_400
    )
}

/// The idempotency row: a key's handler runs to its end at most once.
pub(super) fn idempotency_row(r: &Runs, bad: usize, excused: usize) -> Vec<String> {
    vec![
        "idempotency layer: a key's handler runs to its end at most once".to_owned(),
        format!(
            "{} operations in {} requests (retried until answered, some twice at once, some \
             given up midway, 30 % sent again after success); {} handler runs started, {} ran to \
             their end; {} connections killed as a handler returned; {} operations given up after \
             10 s",
            r.ops, r.requests, r.started, r.completed, r.kills, r.given_up
        ),
        bad.to_string(),
        format!("{excused} keys run twice after a data loss"),
    ]
}
