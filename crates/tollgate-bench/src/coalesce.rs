//! Item 2c: coalescing (issue #15). The same tollgate checks on a backend
//! that sends one script call per check (`Coalescing::off()`) and on one
//! that coalesces them (`Coalescing::default()`, what `RedisBackend` does
//! unless told otherwise), side by side: decisions/s, Redis CPU and script
//! calls per decision at 1, 16 and 256 in flight, and the latency of a lone
//! check.

use std::time::Instant;

use tollgate_core::Algorithm;

use crate::common::{
    connect, interleaved, progress, subjects, BenchResult, Opts, Section, Target, Verdict, SUBJECTS,
};
use crate::ops::{run as run_op, Contender, Op, Outcome};
use crate::redisinfo::{Accounting, Admin};
use crate::stats::{median, per_sec, percentile, ratio_cell, ratios, rotation, us};

/// The algorithms compared: the two one-integer ones, where the call costs
/// Redis more than the algorithm does, and the sliding log, where the
/// algorithm's own work (a sorted set) weighs more.
const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::SlidingWindowLog,
];

/// Checks in flight (2: a coalesced GCRA or token-bucket check then goes
/// in lean batches of two).
const LEVELS: [usize; 4] = [1, 2, 16, 256];

/// The algorithm whose ratios are checked against the targets (the others
/// are reported beside them).
const TARGETED: Algorithm = Algorithm::Gcra;

/// The single-call contender of algorithm `a` (its coalesced one is next).
fn single(a: usize) -> usize {
    2 * a
}

fn coalesced(a: usize) -> usize {
    2 * a + 1
}

/// Per level, per contender: one figure per round.
type Figures = Vec<Vec<Vec<f64>>>;

/// A row per contender: its name, then per level its median figure
/// (`fmt`) and, for a coalesced contender, the ratio coalesced ÷ single
/// per round (median, min–max).
fn level_rows(
    contenders: &[Contender],
    figures: &Figures,
    fmt: impl Fn(f64) -> String,
) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for (c, cont) in contenders.iter().enumerate() {
        let mut row = vec![cont.name.clone()];
        for level in figures {
            row.push(fmt(median(&level[c])));
            row.push(if c % 2 == 0 {
                "1×".into()
            } else {
                ratio_cell(&ratios(&level[c], &level[c - 1]))
            });
        }
        rows.push(row);
    }
    rows
}

/// A target of item 2c for every algorithm: checked for [`TARGETED`],
/// reported for the others.
fn target(
    section: &mut Section,
    alg: Algorithm,
    what: &str,
    target: &str,
    measured: f64,
    ok: bool,
) {
    let what = format!("{what} ({alg})");
    let measured = format!("{measured:.3}×");
    section.targets.push(if alg == TARGETED {
        Target::check("2c", what, target, measured, ok)
    } else {
        Target::new(
            "2c",
            what,
            format!("(no target; {TARGETED}'s is {target})"),
            measured,
            Verdict::Info,
        )
    });
}

/// Runs item 2c.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let admin = Admin::connect(&opts.redis_url).await?;
    let subj = subjects(SUBJECTS);
    let mut contenders = Vec::new();
    for alg in ALGORITHMS {
        contenders.push(Contender {
            name: format!("tollgate {alg}, single call"),
            op: Op::workload_check(&conn, alg, "coal-single", subj.clone())?,
        });
        contenders.push(Contender {
            name: format!("tollgate {alg}, coalesced"),
            op: Op::coalesced_workload_check(&conn, alg, "coal-batch", subj.clone())?,
        });
    }
    let k = contenders.len();
    for c in &contenders {
        run_op(&c.op, 0, opts.scale(2_000), 16).await?;
    }

    // Throughput, Redis CPU and script calls, blocks of decisions in rounds.
    let mut rates: Figures = vec![vec![Vec::new(); k]; LEVELS.len()];
    let mut cpu_us: Figures = vec![vec![Vec::new(); k]; LEVELS.len()];
    let mut calls: Figures = vec![vec![Vec::new(); k]; LEVELS.len()];
    let mut script_us: Figures = vec![vec![Vec::new(); k]; LEVELS.len()];
    let mut denied = 0u64;
    let mut offset = 0usize;
    for (l, &conc) in LEVELS.iter().enumerate() {
        let n = opts.scale(match conc {
            1 => 10_000,
            2 => 20_000,
            _ => 40_000,
        });
        interleaved(
            opts.rounds,
            k,
            |round| {
                progress!(
                    "coalesce: {conc} in flight, round {}/{} ({n} decisions per contender)",
                    round + 1,
                    opts.rounds
                )
            },
            async |_, c| {
                let acct = Accounting::start(&admin).await?;
                let s = run_op(&contenders[c].op, offset, n, conc).await?;
                let spent = acct.finish(&admin).await?;
                offset += n;
                let scripts = spent.stats.scripts();
                // One call per check: what the single-call rows claim, and what
                // any check that finds nothing in flight does.
                if (c % 2 == 0 || conc == 1) && scripts.calls != s.calls {
                    return Err(format!(
                        "{} at {conc} in flight: {} script calls for {} decisions",
                        contenders[c].name, scripts.calls, s.calls
                    )
                    .into());
                }
                let d = s.calls.max(1) as f64;
                rates[l][c].push(s.per_sec());
                cpu_us[l][c].push(spent.cpu_micros / d);
                calls[l][c].push(scripts.calls as f64 / d);
                script_us[l][c].push(scripts.usec as f64 / d);
                denied += s.denied + s.denied_locally;
                Ok(())
            },
        )
        .await?;
    }

    // The latency of a lone check: sequential, call by call, every
    // contender in turn in a rotating order (as item 1 does).
    let n_lat = opts.scale(10_000);
    let mut p50 = vec![Vec::new(); k];
    let mut p99 = vec![Vec::new(); k];
    for i in 0..opts.scale(1_000) {
        for c in &contenders {
            c.op.call(offset + i).await?;
        }
    }
    offset += opts.scale(1_000);
    for round in 0..opts.rounds {
        progress!(
            "coalesce: latency, round {}/{} ({n_lat} calls per contender, interleaved call by call)",
            round + 1,
            opts.rounds
        );
        let mut samples: Vec<Vec<u64>> = (0..k).map(|_| Vec::with_capacity(n_lat)).collect();
        for i in 0..n_lat {
            for c in rotation(i, k) {
                let t0 = Instant::now();
                let o = contenders[c].op.call(offset + i).await?;
                samples[c].push(t0.elapsed().as_nanos() as u64);
                if o != Outcome::Allowed {
                    denied += 1;
                }
            }
        }
        offset += n_lat;
        for (c, s) in samples.iter_mut().enumerate() {
            s.sort_unstable();
            p50[c].push(percentile(s, 50.0) as f64);
            p99[c].push(percentile(s, 99.0) as f64);
        }
    }
    admin.delete_matching("tgbench:coal-*").await?;

    let mut section = Section::default();
    section.heading("2c. Coalescing (issue #15): one call per check vs coalesced");
    section.line(format!(
        "The same tollgate checks (deny cache off, quota 1000/s over {SUBJECTS} subjects, \
         {denied} denials) over one multiplexed connection: *single call* = \
         `RedisBackend::with_coalescing(Coalescing::off())`, one `EVALSHA` of the algorithm's \
         script per check (as items 1, 2a and 2b measure); *coalesced* = the default \
         `Coalescing::default()` (batches of up to {} checks, at most {} calls in flight per \
         backend): checks that arrive while that many calls are out go together in the next \
         call — a limiter's GCRA, token-bucket or fixed-window checks as one call of its lean \
         script from two up, others (the sliding log) as one call of the batch script from 8 \
         up, else as single calls sent together — and a check that finds fewer calls in \
         flight goes out alone at once. Each \
         contender runs a block of decisions ({} at 1 in flight, {} at 16 and 256), blocks \
         interleaved in rotating order, {} rounds. Cells: median of rounds; *coalesced ÷ \
         single*: per-round ratio to the same algorithm's single-call row of the same round \
         (median, min–max). Client: one tokio current-thread runtime.\n",
        tollgate_core::Coalescing::default().batch_limit(),
        tollgate_core::Coalescing::default().calls_limit(),
        opts.scale(10_000),
        opts.scale(40_000),
        opts.rounds
    ));
    let mut header = vec!["contender".to_owned()];
    for conc in LEVELS {
        header.push(format!("{conc} in flight"));
        header.push("coalesced ÷ single".into());
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    section.line("**Decisions/s.**\n");
    section.table(&header, &level_rows(&contenders, &rates, per_sec));
    section.line(
        "**Redis process CPU µs per decision**: growth of the server's `used_cpu_user + \
         used_cpu_sys` over the block ÷ decisions (the script, parsing, networking and the \
         event loop).\n",
    );
    section.table(
        &header,
        &level_rows(&contenders, &cpu_us, |x| format!("{x:.2}")),
    );
    section.line(
        "**Script calls per decision**: calls of script commands (`evalsha`, `eval`) in \
         `INFO commandstats` over the block ÷ decisions, then its inverse, the average \
         number of decisions per call (the batch size). *script µs*: their `usec` ÷ \
         decisions (time inside scripts, the part of the process CPU above that the calls' \
         Lua work accounts for).\n",
    );
    let mut rows = Vec::new();
    for (c, cont) in contenders.iter().enumerate() {
        let mut row = vec![cont.name.clone()];
        for (level, script) in calls.iter().zip(&script_us) {
            let m = median(&level[c]);
            row.push(format!("{m:.3} ({:.1} per call)", 1.0 / m));
            row.push(format!("{:.2}", median(&script[c])));
        }
        rows.push(row);
    }
    let mut calls_header = vec!["contender".to_owned()];
    for conc in LEVELS {
        calls_header.push(format!("calls @{conc}"));
        calls_header.push(format!("script µs @{conc}"));
    }
    let calls_header: Vec<&str> = calls_header.iter().map(String::as_str).collect();
    section.table(&calls_header, &rows);
    section.line(format!(
        "**Latency of a lone check** (1 in flight): {n_lat} calls per contender per round, \
         sequential, interleaved call by call in rotating order (as item 1), {} rounds; \
         ratios per round to the same algorithm's single-call row.\n",
        opts.rounds
    ));
    let mut rows = Vec::new();
    for (c, cont) in contenders.iter().enumerate() {
        let ratio = |p: &[Vec<f64>]| {
            if c % 2 == 0 {
                "1×".to_owned()
            } else {
                ratio_cell(&ratios(&p[c], &p[c - 1]))
            }
        };
        rows.push(vec![
            cont.name.clone(),
            us(median(&p50[c])),
            us(median(&p99[c])),
            ratio(&p50),
            ratio(&p99),
        ]);
    }
    section.table(
        &[
            "contender",
            "p50",
            "p99",
            "p50 coalesced ÷ single",
            "p99 coalesced ÷ single",
        ],
        &rows,
    );
    if denied > 0 {
        section.line(format!(
            "⚠ {denied} checks were denied: the workload is not what it claims."
        ));
    }

    for (a, &alg) in ALGORITHMS.iter().enumerate() {
        let (s, c) = (single(a), coalesced(a));
        for (l, &conc) in LEVELS.iter().enumerate().skip(1) {
            let r = median(&ratios(&cpu_us[l][c], &cpu_us[l][s]));
            if conc == 2 {
                // Two checks in one lean call against two single calls.
                target(
                    &mut section,
                    alg,
                    "Redis process CPU per decision, coalesced ÷ single call, 2 in flight",
                    "< 1×",
                    r,
                    r < 1.0,
                );
                continue;
            }
            target(
                &mut section,
                alg,
                &format!(
                    "Redis process CPU per decision, coalesced ÷ single call, {conc} in flight"
                ),
                "≤ 0.4×",
                r,
                r <= 0.4,
            );
        }
        let r = median(&ratios(&p50[c], &p50[s]));
        target(
            &mut section,
            alg,
            "1 in flight p50, coalesced ÷ single call",
            "≤ 1.02×",
            r,
            r <= 1.02,
        );
    }
    Ok(section)
}
