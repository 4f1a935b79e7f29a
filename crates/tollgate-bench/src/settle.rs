//! What a settle costs on Redis, beside a check and a refund
//! (a settle to 0), and what a waiting acquire costs: Redis's CPU per call
//! (`INFO` `used_cpu_*` deltas) and the commands per call (`INFO
//! commandstats` deltas: one `EVALSHA` is one round trip), every algorithm,
//! one call at a time.

use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, Charge, Quota, RateLimiter, Subject};

use crate::common::{connect, progress, redis_limiter, BenchResult, Opts, Section};
use crate::redisinfo::{Accounting, Admin, Spent, SCRIPT_COMMANDS};

/// Each reservation: 10 of a quota large enough never to refuse.
const COST: u64 = 10;

/// What one row measures.
#[derive(Debug, Clone, Copy)]
enum Row {
    Check,
    Refund,
    /// Settled to half the estimate.
    Under,
    /// Settled to twice the estimate (a debt).
    Over,
    /// A check that empties the quota, then an acquire that must wait for
    /// the next [`COST`] (a 2 ms period): a bucket reserves, a window waits
    /// out the retry-after and checks again.
    Acquire,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::Check => "check (cost 10)",
            Row::Refund => "refund",
            Row::Under => "settle under (10 → 5)",
            Row::Over => "settle over (10 → 20)",
            Row::Acquire => "check + waiting acquire (slot ≤ 2 ms away)",
        }
    }
}

pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let admin = Admin::connect(&opts.redis_url).await?;
    let n = opts.scale(5_000);
    let subjects: Vec<Subject> = (0..n).map(|i| Subject::from(format!("s{i}"))).collect();
    let mut s = Section::default();
    s.heading("Settle (issue #26): Redis CPU and round trips per call");
    s.line(format!(
        "{n} calls per row, one at a time, one subject each; a reservation of {COST} of 1 000 000/s (the log: 10 000/h, each subject far below it). \
         CPU: Redis `used_cpu_user + used_cpu_sys` per call; calls: `EVALSHA` per call \
         (the round trips), then every command the scripts ran per call. The acquire row: {} pairs of a check that \
         empties a quota of {COST} per 2 ms and an acquire of {COST} that waits for the next (per pair; subtract the check row \
         for the acquire alone).\n", n / 5
    ));
    s.line("| algorithm | operation | Redis CPU µs/call | EVALSHA/call | commands/call | client µs/call |");
    s.line("|---|---|---:|---:|---:|---:|");
    for alg in Algorithm::ALL {
        progress!("settle: {alg}");
        for row in [Row::Check, Row::Refund, Row::Under, Row::Over, Row::Acquire] {
            // The log's limit is capped (one entry per unit): 10 000 an hour.
            let quota = match (row, alg) {
                (Row::Acquire, _) => Quota::new(COST, Duration::from_millis(2))?,
                (_, Algorithm::SlidingWindowLog) => Quota::per_hour(10_000),
                _ => Quota::per_second(1_000_000),
            };
            let quota = match row {
                _ if !alg.uses_burst() => quota,
                Row::Acquire => quota.with_burst(COST)?,
                _ => quota.with_burst(1_000_000)?,
            };
            // Each acquire waits for its slot: fewer of them.
            let n = if matches!(row, Row::Acquire) {
                n / 5
            } else {
                n
            };
            let tag = format!(
                "settle-{}-{:?}-{}",
                alg.short_name(),
                row,
                std::process::id()
            );
            let l = redis_limiter(&conn, alg, quota, &tag)?;
            // The charges to settle are taken before the measured run.
            let mut charges: Vec<Charge> = Vec::with_capacity(n);
            if !matches!(row, Row::Check | Row::Acquire) {
                for subject in &subjects[..n] {
                    charges.push(take(&l, subject).await?);
                }
            }
            let acct = Accounting::start(&admin).await?;
            let started = Instant::now();
            for (i, subject) in subjects[..n].iter().enumerate() {
                match row {
                    Row::Check => {
                        take(&l, subject).await?;
                    }
                    Row::Refund => {
                        l.refund(subject, &charges[i]).await?;
                    }
                    Row::Under => {
                        l.settle(subject, &charges[i], COST / 2).await?;
                    }
                    Row::Over => {
                        l.settle(subject, &charges[i], COST * 2).await?;
                    }
                    Row::Acquire => {
                        take(&l, subject).await?;
                        let d = l.acquire(subject, COST, Duration::from_secs(1)).await?;
                        if !d.allowed {
                            return Err("an acquire with a slot 2 ms away was refused".into());
                        }
                    }
                }
            }
            let client = started.elapsed().as_secs_f64() * 1e6 / n as f64;
            let spent: Spent = acct.finish(&admin).await?;
            let per = |x: f64| x / n as f64;
            let scripts: u64 = spent
                .stats
                .0
                .iter()
                .filter(|(name, _)| SCRIPT_COMMANDS.contains(&name.as_str()))
                .map(|(_, c)| c.calls)
                .sum();
            let all: u64 = spent
                .stats
                .0
                .iter()
                .filter(|(name, _)| !matches!(name.as_str(), "info" | "config"))
                .map(|(_, c)| c.calls)
                .sum();
            s.line(format!(
                "| {alg} | {} | {:.1} | {:.2} | {:.2} | {:.0} |",
                row.name(),
                per(spent.cpu_micros),
                per(scripts as f64),
                per(all as f64),
                client,
            ));
            admin.delete_matching(&format!("tgbench:{tag}:*")).await?;
        }
    }
    Ok(s)
}

/// An admitted reservation of [`COST`].
async fn take(l: &RateLimiter, subject: &Subject) -> BenchResult<Charge> {
    let d = l.check_n(subject, COST).await?;
    d.charge
        .ok_or_else(|| "the bench quota refused a reservation".into())
}
