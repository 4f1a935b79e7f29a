//! Item 1: sequential decision latency, tollgate vs a raw no-op `EVALSHA`.

use std::time::Instant;

use tollgate_core::Algorithm;

use crate::common::{
    connect, core_args, core_script, noop, progress, redis_limiter, subjects, verify_core_script,
    workload_quota, BenchResult, Opts, Section, Target, SUBJECTS,
};
use crate::ops::{Contender, Op};
use crate::stats::{median, percentile, ratio_cell, ratios, rotation, us};

/// Runs item 1.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let quota = workload_quota();
    let subjects = subjects(SUBJECTS);
    let noop = noop();
    noop.load(&conn).await?;

    let mut contenders = vec![Contender {
        name: "raw EVALSHA no-op (`return 1`)".into(),
        op: Op::Raw {
            conn: conn.clone(),
            script: noop.clone(),
            keys: vec![],
            args: vec![],
        },
    }];
    for (alg, label) in [
        (Algorithm::Gcra, "GCRA"),
        (Algorithm::TokenBucket, "token bucket"),
    ] {
        let limiter = redis_limiter(&conn, alg, quota, &format!("lat-{}", alg.short_name()))?;
        let script = core_script(alg);
        verify_core_script(&conn, &limiter, &script).await?;
        let raw_limiter =
            redis_limiter(&conn, alg, quota, &format!("lat-raw-{}", alg.short_name()))?;
        let keys = subjects
            .iter()
            .map(|s| raw_limiter.keys_for(s).remove(0))
            .collect();
        contenders.push(Contender {
            name: format!(
                "raw EVALSHA of tollgate's {} (same keys and args)",
                script.name
            ),
            op: Op::Raw {
                conn: conn.clone(),
                script,
                keys,
                args: core_args(alg, &quota, 0x5eed),
            },
        });
        contenders.push(Contender {
            name: format!("tollgate {label} `check`"),
            op: Op::Check {
                limiter,
                subjects: subjects.clone(),
            },
        });
    }

    // SCRIPT FLUSH in the verification dropped them: load every raw script.
    for c in &contenders {
        if let Op::Raw { script, .. } = &c.op {
            script.load(&conn).await?;
        }
    }
    let n = opts.scale(20_000);
    let k = contenders.len();
    // p50 and p99 (ns) per round, per contender.
    let mut p50 = vec![Vec::new(); k];
    let mut p99 = vec![Vec::new(); k];
    let mut denied = 0u64;
    // Warm-up: loads scripts, fills keys, settles the allocator.
    for i in 0..opts.scale(2_000) {
        for c in &contenders {
            c.op.call(i).await?;
        }
    }
    for round in 0..opts.rounds {
        progress!(
            "latency: round {}/{} ({n} calls per contender, interleaved call by call)",
            round + 1,
            opts.rounds
        );
        let mut samples: Vec<Vec<u64>> = (0..k).map(|_| Vec::with_capacity(n)).collect();
        for i in 0..n {
            // Interleaved call by call, in a rotating order, so that noise
            // from other processes falls on every contender alike.
            for c in rotation(i, k) {
                let t0 = Instant::now();
                let o = contenders[c].op.call(i).await?;
                samples[c].push(t0.elapsed().as_nanos() as u64);
                if o != crate::ops::Outcome::Allowed {
                    denied += 1;
                }
            }
        }
        for (c, s) in samples.iter_mut().enumerate() {
            s.sort_unstable();
            p50[c].push(percentile(s, 50.0) as f64);
            p99[c].push(percentile(s, 99.0) as f64);
        }
    }

    let mut section = Section::default();
    section.heading("1. Decision latency (sequential, one connection, deny cache off)");
    section.line(format!(
        "{n} calls per contender per round, {} rounds, interleaved call by call; \
         quota 1000/s over {SUBJECTS} subjects (nobody denied: {denied} denials). \
         Ratios are per round against the no-op of the same round; the cell shows \
         the median of rounds and (min–max).\n",
        opts.rounds
    ));
    let mut rows = Vec::new();
    for (c, cont) in contenders.iter().enumerate() {
        rows.push(vec![
            cont.name.clone(),
            us(median(&p50[c])),
            us(median(&p99[c])),
            if c == 0 {
                "1×".into()
            } else {
                ratio_cell(&ratios(&p50[c], &p50[0]))
            },
            if c == 0 {
                "1×".into()
            } else {
                ratio_cell(&ratios(&p99[c], &p99[0]))
            },
        ]);
    }
    section.table(
        &["contender", "p50", "p99", "p50 ÷ no-op", "p99 ÷ no-op"],
        &rows,
    );
    for (c, label) in [(2, "GCRA"), (4, "token bucket")] {
        let r = median(&ratios(&p50[c], &p50[0]));
        section.targets.push(Target::check(
            "1",
            format!("{label} check p50 ÷ raw no-op EVALSHA p50"),
            "≤ 1.05×",
            format!("{r:.3}×"),
            r <= 1.05,
        ));
    }
    if denied > 0 {
        section.line(format!(
            "⚠ {denied} calls were denied: the workload is not what it claims."
        ));
    }
    Ok(section)
}
