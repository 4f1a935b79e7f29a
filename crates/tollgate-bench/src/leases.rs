//! Quota leases (issue #25): one hot subject checked by 4 instances (4
//! limiters, each on its own connection, 4 checks in flight each), with
//! leases on and off (the exact limiter), side by side in each round:
//! script calls per decision, admissions over the quota's bound, and the
//! admissions of leases ÷ the exact limiter's. Two quotas: 1000/s (both
//! saturate it) and 1M/s (only leases reach it).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Quota, QuotaLeases, RateLimiter, RedisBackend};

use crate::common::{interleaved, progress, BenchResult, Opts, Section, Target};
use crate::redisinfo::{Accounting, Admin};
use crate::stats::{median, ratio_cell, ratios};

const INSTANCES: usize = 4;
const IN_FLIGHT: usize = 4;
const ALGORITHMS: [Algorithm; 2] = [Algorithm::Gcra, Algorithm::FixedWindow];

/// A load: its name and quota.
struct Load {
    name: &'static str,
    quota: fn() -> Quota,
}

const LOADS: [Load; 2] = [
    Load {
        name: "saturated (1000/s)",
        quota: || Quota::per_second(1000),
    },
    Load {
        name: "1M/s (only leases reach it)",
        quota: || Quota::per_second(1_000_000),
    },
];

/// What one contender's run gave.
#[derive(Default, Clone, Copy)]
struct Run {
    decisions: u64,
    admitted: u64,
    over: u64,
    calls: u64,
}

/// Admissions beyond the quota's bound: for a bucket, the most by any
/// instant (one read after the decision) is the burst plus one unit per
/// interval since the start; for a fixed window, the limit per window (an
/// admission's window is the one whose end it reports, from a read before
/// the check). `seen`: (before, after, reset) per admission.
fn over_admissions(
    alg: Algorithm,
    quota: &Quota,
    start_us: u64,
    seen: &mut [(u64, u64, u64)],
) -> u64 {
    let limit = quota.limit();
    if alg == Algorithm::FixedWindow {
        let period = quota.period_micros();
        let mut per = std::collections::BTreeMap::<u64, u64>::new();
        // The window end nearest the reported one: a server's `now` may
        // read a few µs behind this process's clock.
        for (before, _, reset) in seen.iter() {
            *per.entry((before + reset + period / 2) / period)
                .or_default() += 1;
        }
        return per.values().map(|n| n.saturating_sub(limit)).sum();
    }
    seen.sort_unstable_by_key(|(_, after, _)| *after);
    let interval = quota.period_micros() as f64 / limit as f64;
    let mut over = 0;
    for (i, (_, after, _)) in seen.iter().enumerate() {
        let most = quota.burst() as f64 + (after - start_us) as f64 / interval;
        over = over.max((i as u64 + 1).saturating_sub(most.floor() as u64));
    }
    over
}

fn epoch_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

async fn instances(
    url: &str,
    alg: Algorithm,
    quota: Quota,
    name: &str,
    leases: bool,
) -> BenchResult<Vec<RateLimiter>> {
    let mut out = Vec::new();
    for _ in 0..INSTANCES {
        let mut b = RateLimiter::builder(RedisBackend::connect(url).await?, alg)
            .quota(quota)
            .prefix("tgbench")
            .name(name)
            .timeout(Duration::from_secs(5))
            .failure_policy(tollgate_core::FailurePolicy::Deny);
        if leases {
            b = b.quota_leases(QuotaLeases::default());
        }
        out.push(b.build()?);
    }
    Ok(out)
}

/// Every instance checks `subject` with `IN_FLIGHT` checks in flight for
/// `span`, from the start of a second; then gives its leases back.
async fn hammer(
    limiters: &[RateLimiter],
    alg: Algorithm,
    quota: &Quota,
    subject: &str,
    span: Duration,
) -> BenchResult<Run> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let decisions = Rc::new(RefCell::new(0u64));
    // Runs start as a second (a fixed window) starts: each spans the same
    // whole windows.
    let now = epoch_us();
    tokio::time::sleep(Duration::from_micros(1_000_000 - now % 1_000_000)).await;
    let start_us = epoch_us();
    // Stop short of the last window's end: every run spans whole windows.
    let end = Instant::now() + span - Duration::from_millis(20);
    let mut tasks = Vec::new();
    for limiter in limiters {
        for _ in 0..IN_FLIGHT {
            let (seen, decisions) = (Rc::clone(&seen), Rc::clone(&decisions));
            tasks.push(async move {
                while Instant::now() < end {
                    let at = epoch_us();
                    // A check served in process never yields: let the
                    // connections' tasks run.
                    if decisions.borrow().is_multiple_of(32) {
                        tokio::task::yield_now().await;
                    }
                    let d = limiter.check(subject).await?;
                    *decisions.borrow_mut() += 1;
                    if d.allowed {
                        let reset = d.reset_after.as_micros() as u64;
                        seen.borrow_mut().push((at, epoch_us(), reset));
                    }
                }
                BenchResult::Ok(())
            });
        }
    }
    for r in futures::future::join_all(tasks).await {
        r?;
    }
    for limiter in limiters {
        limiter.return_leases().await;
    }
    let mut seen = seen.take();
    let over = over_admissions(alg, quota, start_us, &mut seen);
    let decisions = *decisions.borrow();
    Ok(Run {
        decisions,
        admitted: seen.len() as u64,
        over,
        calls: 0,
    })
}

/// Runs the leases item.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let admin = Admin::connect(&opts.redis_url).await?;
    let span = Duration::from_millis(if opts.quick { 300 } else { 2_000 });
    let mut s = Section::default();
    s.heading("Quota leases: one hot subject, 4 instances");
    s.line(format!(
        "4 limiters on 4 connections (one process, one thread), {IN_FLIGHT} checks in flight each, \
         one subject, {} ms per run; `QuotaLeases::default()` vs the exact limiter (no leases; \
         both with the deny cache and coalescing on, as by default). Script calls from \
         `INFO commandstats`; over-admissions against the quota's exact bound (buckets: burst + \
         elapsed ÷ interval; fixed window: limit per window). Median of {} rounds; ratios per round.",
        span.as_millis(),
        opts.rounds
    ));
    let mut rows = Vec::new();
    for load in &LOADS {
        for alg in ALGORITHMS {
            let quota = (load.quota)();
            let name = format!("lease-{}", alg.short_name());
            let exact = instances(&opts.redis_url, alg, quota, &format!("{name}-x"), false).await?;
            let leased = instances(&opts.redis_url, alg, quota, &format!("{name}-l"), true).await?;
            let mut figures: Vec<Vec<Run>> = vec![Vec::new(); 2];
            let mut subject = 0u64;
            interleaved(
                opts.rounds,
                2,
                |round| {
                    progress!(
                        "leases: {} {alg}, round {}/{}",
                        load.name,
                        round + 1,
                        opts.rounds
                    )
                },
                async |_, c| {
                    subject += 1;
                    let limiters = if c == 0 { &exact } else { &leased };
                    let who = format!("hot{}-{subject}", std::process::id());
                    let acct = Accounting::start(&admin).await?;
                    let mut r = hammer(limiters, alg, &quota, &who, span).await?;
                    r.calls = acct.finish(&admin).await?.stats.scripts().calls;
                    figures[c].push(r);
                    Ok(())
                },
            )
            .await?;
            let col =
                |c: usize, f: fn(&Run) -> f64| -> Vec<f64> { figures[c].iter().map(f).collect() };
            let per_decision = |r: &Run| r.calls as f64 / r.decisions.max(1) as f64;
            let admitted = |r: &Run| r.admitted as f64;
            let over = |r: &Run| r.over as f64;
            let ratio = ratios(&col(1, admitted), &col(0, admitted));
            for (c, who) in ["exact", "leases"].iter().enumerate() {
                rows.push(vec![
                    load.name.to_owned(),
                    alg.to_string(),
                    (*who).to_owned(),
                    format!("{:.0}", median(&col(c, |r| r.decisions as f64))),
                    format!("{:.0}", median(&col(c, admitted))),
                    format!("{:.0}", col(c, over).iter().copied().fold(0.0, f64::max)),
                    format!("{:.4}", median(&col(c, per_decision))),
                    if c == 0 {
                        "1×".into()
                    } else {
                        ratio_cell(&ratio)
                    },
                ]);
            }
            let calls = median(&col(1, per_decision));
            let worst_over = col(1, over).iter().copied().fold(0.0, f64::max);
            let what = format!("{alg}, {}", load.name);
            s.targets.push(Target::check(
                "25",
                format!("leases: script calls per decision ({what})"),
                "≤ 0.05",
                format!("{calls:.4}"),
                calls <= 0.05,
            ));
            s.targets.push(Target::check(
                "25",
                format!("leases: over-admissions ({what})"),
                "0",
                format!("{worst_over:.0}"),
                worst_over == 0.0,
            ));
            if load.name.starts_with("saturated") {
                let m = median(&ratio);
                s.targets.push(Target::check(
                    "25",
                    format!("leases: admissions ÷ exact limiter's ({what})"),
                    "≥ 0.9×",
                    format!("{m:.3}×"),
                    m >= 0.9,
                ));
            }
        }
    }
    s.table(
        &[
            "load",
            "algorithm",
            "limiter",
            "decisions",
            "admitted",
            "over-admitted (worst round)",
            "script calls per decision",
            "admitted ÷ exact",
        ],
        &rows,
    );
    Ok(s)
}
