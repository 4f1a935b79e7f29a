//! The soak's analysis and Markdown report. What is a violation and what is
//! only reported is explained in [`super`] and printed with the figures.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tollgate_core::Algorithm;

use super::faults::LOSS_GRACE;
use super::work::{Overlap, Results, ALGORITHMS, PERMITS, RATE_LIMIT, RATE_PERIOD};
use super::{Fault, SoakOpts};
use crate::common::Section;

mod edges;

/// What a run produced.
pub(crate) struct Input<'a> {
    pub(crate) topology: &'static str,
    /// Cluster faults get [`LOSS_GRACE`] after their end.
    pub(crate) cluster: bool,
    pub(crate) opts: &'a SoakOpts,
    pub(crate) start: Instant,
    pub(crate) stopped: Instant,
    pub(crate) wall_start: SystemTime,
    pub(crate) faults: Vec<Fault>,
    pub(crate) results: Results,
}

/// A time span `[from, to]`.
type Span = (Instant, Instant);

fn intersects(w: &Span, from: Instant, to: Instant) -> bool {
    w.0 <= to && from <= w.1
}

/// Seconds since the start, one decimal.
fn secs(start: Instant, t: Instant) -> String {
    format!("{:.1}", t.saturating_duration_since(start).as_secs_f64())
}

/// Admissions of one (limiter, subject) within one epoch.
#[derive(Default)]
struct Group {
    units: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// The rate limits' over-admission figures.
#[derive(Default)]
struct RateFigures {
    admitted_units: u64,
    /// Units admitted by checks in flight while a data-losing fault
    /// happened: which side of the loss they ran on is unknown, so they
    /// belong to no epoch (they do count in the run totals).
    unattributed: u64,
    groups: usize,
    exhausted: usize,
    /// Groups whose admissions went on across a pause (SIGSTOP), and how
    /// many of those used up their budget.
    across_pause: usize,
    across_pause_exhausted: usize,
    violations: Vec<String>,
    /// (limiter, subject) pairs whose run total exceeds the capacity
    /// (only possible across data loss when there is no violation).
    after_loss_pairs: usize,
    after_loss_units: u64,
    most_units: u64,
    allowance: Vec<u64>,
}

/// The units a limiter of `limit` per `period` may admit per subject and
/// epoch beyond its capacity: refill over the run (0 with a ten-year period), plus a whole
/// capacity if a window boundary of the epoch-aligned windows fell inside
/// the run (not before 2029).
fn allowance(
    algorithm: Algorithm,
    (limit, period): (u64, Duration),
    wall_start: SystemTime,
    run: Duration,
) -> u64 {
    let period = period.as_micros();
    let refill = (u128::from(limit) * run.as_micros() / period) as u64;
    let from = wall_start
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let to = from + run.as_micros();
    let windowed = matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
    );
    let crossed = windowed && from / period != to / period;
    refill + if crossed { limit } else { 0 }
}

fn rate_figures(input: &Input, losses: &[Span], pauses: &[Span]) -> RateFigures {
    let run = input.stopped - input.start;
    let mut f = RateFigures {
        allowance: ALGORITHMS
            .iter()
            .map(|&a| allowance(a, (RATE_LIMIT, RATE_PERIOD), input.wall_start, run))
            .collect(),
        ..RateFigures::default()
    };
    let mut groups: BTreeMap<(usize, u64, usize), Group> = BTreeMap::new();
    let mut totals: BTreeMap<(usize, u64), u64> = BTreeMap::new();
    for a in &input.results.tally.admits {
        f.admitted_units += a.units;
        *totals.entry((a.limiter, a.subject)).or_default() += a.units;
        if losses.iter().any(|w| intersects(w, a.sent, a.answered)) {
            f.unattributed += a.units;
            continue;
        }
        let epoch = losses.iter().filter(|w| w.1 < a.sent).count();
        let g = groups.entry((a.limiter, a.subject, epoch)).or_default();
        g.units += a.units;
        g.first = Some(g.first.map_or(a.sent, |t| t.min(a.sent)));
        g.last = Some(g.last.map_or(a.answered, |t| t.max(a.answered)));
    }
    f.groups = groups.len();
    for ((limiter, subject, epoch), g) in &groups {
        let cap = RATE_LIMIT + f.allowance[*limiter];
        f.most_units = f.most_units.max(g.units);
        if g.units >= RATE_LIMIT {
            f.exhausted += 1;
        }
        if let (Some(first), Some(last)) = (g.first, g.last) {
            if pauses.iter().any(|p| intersects(p, first, last)) {
                f.across_pause += 1;
                if g.units >= RATE_LIMIT {
                    f.across_pause_exhausted += 1;
                }
            }
        }
        if g.units > cap {
            f.violations.push(format!(
                "{} subject s{subject}, epoch {epoch}: {} units admitted, capacity {cap}",
                ALGORITHMS[*limiter].short_name(),
                g.units
            ));
        }
    }
    for total in totals.values() {
        if *total > RATE_LIMIT {
            f.after_loss_pairs += 1;
            f.after_loss_units += total - RATE_LIMIT;
        }
    }
    f
}

/// Splits overlaps into violations and those a data loss explains.
fn classify<'a>(overlaps: &'a [Overlap], losses: &[Span]) -> (Vec<&'a Overlap>, usize) {
    let (excused, violations): (Vec<&Overlap>, Vec<&Overlap>) = overlaps
        .iter()
        .partition(|o| losses.iter().any(|w| intersects(w, o.since, o.at)));
    (violations, excused.len())
}

/// Per component: the longest time from a fault's end to the next success
/// (100 ms resolution), and whether it succeeded after the last fault.
fn recovery(input: &Input, component: &str) -> (Option<(Duration, usize)>, bool) {
    let empty = Default::default();
    let ticks = input.results.tally.ticks.get(component).unwrap_or(&empty);
    let mut worst: Option<(Duration, usize)> = None;
    let mut after_last = true;
    for (i, fault) in input.faults.iter().enumerate() {
        let end = fault.end.saturating_duration_since(input.start);
        let from_tick = end.as_millis() as u64 / 100;
        match ticks.range(from_tick..).next() {
            Some(&t) => {
                let back = Duration::from_millis(t * 100).saturating_sub(end);
                if worst.is_none_or(|(w, _)| back > w) {
                    worst = Some((back, i));
                }
            }
            None => after_last = false,
        }
    }
    (worst, after_last && !ticks.is_empty())
}

/// The report, and whether the run was clean (no violation, no stuck task,
/// every workload back after the last fault).
pub(crate) fn render(input: &Input) -> (String, bool) {
    let grace = if input.cluster {
        LOSS_GRACE
    } else {
        Duration::ZERO
    };
    let losses: Vec<Span> = input
        .faults
        .iter()
        .filter(|f| f.loses_data)
        .map(|f| (f.start, f.end + grace))
        .collect();
    let pauses: Vec<Span> = input
        .faults
        .iter()
        .filter(|f| !f.loses_data)
        .map(|f| (f.start, f.end))
        .collect();
    let r = &input.results;
    let rate = rate_figures(input, &losses, &pauses);
    let (lock_bad, lock_excused) = classify(&r.locks.overlaps, &losses);
    let (permit_bad, permit_excused) = classify(&r.permits.overlaps, &losses);
    let (conc_bad, conc_excused) = classify(&r.concurrency.overlaps, &losses);
    let cut_off = edges::cut_off(input);
    let twice = r.idempotency.twice();
    let (idem_bad, idem_excused) = classify(&twice, &losses);
    let late = edges::late_figures(input, &losses);
    let fence_bad = &r.locks.fence_regressions;
    let components = [
        "rate",
        "lock",
        "permit",
        "concurrency",
        "policy",
        "idempotency",
    ];
    let recoveries: Vec<_> = components.iter().map(|c| recovery(input, c)).collect();
    let live = recoveries.iter().all(|(_, ok)| *ok) && r.stuck == 0 && late.unread == 0;
    let violations = rate.violations.len()
        + lock_bad.len()
        + fence_bad.len()
        + permit_bad.len()
        + conc_bad.len()
        + cut_off.len()
        + late.violations.len()
        + idem_bad.len();

    let mut s = Section::default();
    let run = input.stopped - input.start;
    s.heading(&format!(
        "Soak: {} — {:.0} s, seed {}",
        input.topology,
        run.as_secs_f64(),
        input.opts.seed
    ));
    let (n_loss, n_pause) = (losses.len(), pauses.len());
    s.line(format!(
        "{} faults: {n_pause} without data loss (pauses), {n_loss} data-losing (restarts, failovers). \
         Verdict: **{}**.\n",
        input.faults.len(),
        if violations == 0 && live {
            "clean"
        } else {
            "FAILED"
        }
    ));
    s.table(
        &["check", "counted", "violations (must be 0)", "not violations"],
        &[
            vec![
                format!("rate: units admitted per subject and epoch ≤ capacity ({RATE_LIMIT})"),
                format!(
                    "{} units in {} (limiter, subject, epoch) groups, {} used up; {} groups admitted across a pause ({} used up)",
                    rate.admitted_units,
                    rate.groups,
                    rate.exhausted,
                    rate.across_pause,
                    rate.across_pause_exhausted
                ),
                rate.violations.len().to_string(),
                format!(
                    "after data loss: {} (limiter, subject) pairs over {RATE_LIMIT} for the run (+{} units); {} units admitted by checks in flight during a data-losing fault (no epoch)",
                    rate.after_loss_pairs, rate.after_loss_units, rate.unattributed
                ),
            ],
            vec![
                "locks: two holders believing their lease valid".to_owned(),
                format!("{} critical sections", r.locks.sections),
                lock_bad.len().to_string(),
                format!("{lock_excused} overlaps after a data loss"),
            ],
            vec![
                "locks: fences strictly increase in section order".to_owned(),
                format!("{} critical sections", r.locks.sections),
                fence_bad.len().to_string(),
                "—".to_owned(),
            ],
            vec![
                format!("permits: at most {PERMITS} holders believing their permit valid"),
                format!(
                    "{} sections, at most {} valid holders at once",
                    r.permits.sections, r.permits.most_valid
                ),
                permit_bad.len().to_string(),
                format!("{permit_excused} over-subscriptions after a data loss"),
            ],
            edges::concurrency_row(&r.concurrency, conc_bad.len(), conc_excused),
            edges::cut_off_row(&r.concurrency, cut_off.len()),
            edges::late_row(&late),
            edges::idempotency_row(&r.idempotency, idem_bad.len(), idem_excused),
            vec![
                "liveness: every workload succeeds after the last fault; no stuck task; every \
                 policy subject read at the end"
                    .to_owned(),
                format!(
                    "{} stuck tasks, {} subjects not read",
                    r.stuck, late.unread
                ),
                if live { "0" } else { "**1**" }.to_owned(),
                "—".to_owned(),
            ],
        ],
    );
    let overlaps: Vec<&Overlap> = lock_bad
        .iter()
        .copied()
        .chain(fence_bad)
        .chain(permit_bad.iter().copied())
        .chain(conc_bad.iter().copied())
        .chain(idem_bad.iter().copied())
        .collect();
    let listed: Vec<String> = cut_off
        .iter()
        .map(|d| format!("{d}, with no fault"))
        .chain(late.violations.iter().cloned())
        .collect();
    details(&mut s, input, &rate, &overlaps, &listed);
    outcomes(&mut s, input, &rate);
    s.heading("Recovery");
    s.line(format!(
        "Longest time from the end of a fault to the next success (100 ms resolution; the rate \
         row counts decisions from Redis). Slowest rate check: {} ms (timeout 200 ms).\n",
        r.tally.slowest_check.as_millis()
    ));
    let rows: Vec<Vec<String>> = components
        .iter()
        .zip(&recoveries)
        .map(|(c, (worst, ok))| {
            let (t, which) = match worst {
                Some((d, i)) => (
                    format!("{:.1} s", d.as_secs_f64()),
                    input.faults[*i].what.clone(),
                ),
                None => ("—".to_owned(), "—".to_owned()),
            };
            vec![
                (*c).to_owned(),
                t,
                which,
                if *ok { "yes" } else { "**no**" }.to_owned(),
            ]
        })
        .collect();
    s.table(
        &[
            "workload",
            "longest recovery",
            "after",
            "back after the last fault",
        ],
        &rows,
    );
    fault_log(&mut s, input);
    (s.markdown, violations == 0 && live)
}

fn details(
    s: &mut Section,
    input: &Input,
    rate: &RateFigures,
    overlaps: &[&Overlap],
    listed: &[String],
) {
    let all: Vec<String> = rate
        .violations
        .iter()
        .cloned()
        .chain(listed.iter().cloned())
        .chain(overlaps.iter().map(|o| {
            format!(
                "t={} s (the earliest request or acquire involved sent at {} s): {}",
                secs(input.start, o.at),
                secs(input.start, o.since),
                o.detail
            )
        }))
        .collect();
    if all.is_empty() {
        return;
    }
    s.heading("Violations");
    for v in all.iter().take(30) {
        s.line(format!("- {v}"));
    }
    if all.len() > 30 {
        s.line(format!("- … and {} more", all.len() - 30));
    }
    s.line("");
}

fn outcomes(s: &mut Section, input: &Input, rate: &RateFigures) {
    let t = &input.results.tally;
    s.heading("Decisions");
    let rows: Vec<Vec<String>> = t
        .decisions
        .iter()
        .map(|(k, v)| vec![k.clone(), v.to_string()])
        .collect();
    s.table(&["outcome", "count"], &rows);
    s.line(format!(
        "Rate limits: {} algorithms, {RATE_LIMIT} units per ten years per subject (nothing refills \
         during a run; allowance per algorithm for a window boundary or refill: {:?}), fail closed \
         (`FailurePolicy::Deny`), costs 1–3, 50 new subjects every 10 s. The most units one subject got \
         in one epoch: {}.\n",
        ALGORITHMS.len(),
        rate.allowance,
        rate.most_units
    ));
    s.line(edges::policy_setup());
    s.heading("Errors by kind");
    let rows: Vec<Vec<String>> = t
        .errors
        .iter()
        .map(|((c, k), v)| vec![(*c).to_owned(), (*k).to_owned(), v.to_string()])
        .collect();
    if rows.is_empty() {
        s.line("None.\n");
    } else {
        s.table(&["operation", "kind", "count"], &rows);
    }
    if !t.other.is_empty() {
        s.line("Errors of kind \"other\" (neither a timeout nor an outage):\n");
        for (msg, n) in &t.other {
            s.line(format!("- {n} × `{msg}`"));
        }
        s.line("");
    }
}

fn fault_log(s: &mut Section, input: &Input) {
    s.heading("Fault log");
    let rows: Vec<Vec<String>> = input
        .faults
        .iter()
        .map(|f| {
            vec![
                secs(input.start, f.start),
                format!("{:.1}", (f.end - f.start).as_secs_f64()),
                f.what.clone(),
                if f.loses_data { "yes" } else { "no" }.to_owned(),
                f.error.clone().unwrap_or_else(|| "—".to_owned()),
            ]
        })
        .collect();
    if rows.is_empty() {
        s.line("No fault ran (the run was too short).\n");
    } else {
        s.table(
            &["t (s)", "took (s)", "fault", "may lose data", "error"],
            &rows,
        );
    }
}
