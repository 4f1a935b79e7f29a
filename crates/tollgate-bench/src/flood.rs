//! Item 5: a flood from an already-blocked subject, with the deny cache on.

use std::time::Duration;

use tollgate_core::{Algorithm, MemoryBackend, Quota, RateLimiter, RedisBackend, Subject};

use crate::common::interleaved;
use crate::common::{connect, progress, BenchResult, Opts, Section, Target, Verdict};
use crate::ops::{run_for, Op, RunStats};
use crate::redisinfo::{Accounting, Admin};
use crate::stats::{median, per_sec, ratio_cell, ratios};

const CONCURRENCY: usize = 16;

fn limiter(
    backend: impl tollgate_core::RateBackend,
    quota: Quota,
    deny_cache: bool,
) -> BenchResult<RateLimiter> {
    let b = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(quota)
        .prefix("tgbench")
        .name(if deny_cache { "flood" } else { "flood-nocache" })
        .timeout(Duration::from_secs(5))
        .failure_policy(tollgate_core::FailurePolicy::Deny);
    Ok(if deny_cache { b } else { b.deny_cache(0) }.build()?)
}

/// Blocks the subject: checks until a denial.
async fn exhaust(l: &RateLimiter, s: &Subject) -> BenchResult<()> {
    for _ in 0..10_000 {
        if !l.check(s).await?.allowed {
            return Ok(());
        }
    }
    Err("the flood subject was never denied".into())
}

/// Runs item 5.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let admin = Admin::connect(&opts.redis_url).await?;
    let quota = Quota::per_second(10);
    let subject = Subject::from("flooder");
    let redis = limiter(RedisBackend::from_connection(conn.clone()), quota, true)?;
    let memory = limiter(MemoryBackend::new(), quota, true)?;
    let redis_nocache = limiter(RedisBackend::from_connection(conn.clone()), quota, false)?;
    let secs = if opts.quick { 0.3 } else { 2.0 };
    let dur = Duration::from_secs_f64(secs);
    let op = |l: &RateLimiter| Op::Check {
        limiter: l.clone(),
        subjects: vec![subject.clone()],
    };
    let contenders = [
        (
            "tollgate GCRA on Redis, deny cache on (default)",
            op(&redis),
            true,
        ),
        (
            "tollgate GCRA in memory, deny cache on (default)",
            op(&memory),
            false,
        ),
        (
            "tollgate GCRA on Redis, deny cache off",
            op(&redis_nocache),
            true,
        ),
    ];
    let k = contenders.len();
    let mut rates = vec![Vec::new(); k];
    let mut calls_per_rejected = vec![Vec::new(); k];
    let mut totals = vec![RunStats::default(); k];
    interleaved(
        opts.rounds,
        k,
        |round| progress!("flood: round {}/{}", round + 1, opts.rounds),
        async |_, c| {
            let (_, op, on_redis) = &contenders[c];
            let Op::Check { limiter, .. } = op else {
                unreachable!()
            };
            exhaust(limiter, &subject).await?;
            let acct = Accounting::start(&admin).await?;
            let s = run_for(op, dur, CONCURRENCY).await?;
            let spent = acct.finish(&admin).await?;
            let rejected = s.denied + s.denied_locally;
            rates[c].push(s.per_sec());
            if *on_redis {
                calls_per_rejected[c]
                    .push(spent.stats.scripts().calls as f64 / rejected.max(1) as f64);
            }
            let t = &mut totals[c];
            t.calls += s.calls;
            t.allowed += s.allowed;
            t.denied += s.denied;
            t.denied_locally += s.denied_locally;
            Ok(())
        },
    )
    .await?;
    let mut section = Section::default();
    section.heading("5. Flood from a blocked subject");
    section.line(format!(
        "One subject over a GCRA quota of 10/s floods with {CONCURRENCY} checks in flight \
         for {secs} s per contender per round, after being denied once. \
         *Redis calls per rejected request*: `evalsha` calls in `INFO commandstats` during \
         the flood ÷ rejected checks (when the cached denial runs out — every ≈100 ms at \
         10/s — up to {CONCURRENCY} checks in flight go to Redis, and one refilled unit is \
         admitted). Throughput ratios are per round against the in-memory limiter of the \
         same round. {} rounds.\n",
        opts.rounds
    ));
    let mut rows = Vec::new();
    for c in 0..k {
        let t = &totals[c];
        rows.push(vec![
            contenders[c].0.to_owned(),
            per_sec(median(&rates[c])),
            ratio_cell(&ratios(&rates[c], &rates[1])),
            if contenders[c].2 {
                format!("{:.5}", median(&calls_per_rejected[c]))
            } else {
                "0 (no Redis)".into()
            },
            format!(
                "{} admitted, {} denied by the backend, {} by the deny cache",
                t.allowed, t.denied, t.denied_locally
            ),
        ]);
    }
    section.table(
        &[
            "contender",
            "checks/s",
            "÷ memory",
            "Redis calls per rejected",
            "totals over rounds",
        ],
        &rows,
    );
    let calls = median(&calls_per_rejected[0]);
    section.targets.push(Target::check(
        "5",
        "Redis calls per rejected request in a flood (deny cache on)",
        "≤ 0.01",
        format!("{calls:.5}"),
        calls <= 0.01,
    ));
    let ratio = median(&ratios(&rates[0], &rates[1]));
    section.targets.push(Target::new(
        "5",
        "flood throughput, Redis (deny cache) ÷ memory",
        "(reported)",
        format!("{ratio:.2}×"),
        Verdict::Info,
    ));
    Ok(section)
}
