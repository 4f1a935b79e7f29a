//! The operations contenders run: a raw `EVALSHA` or a tollgate check.

use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use std::time::{Duration, Instant};
use tollgate_core::{Algorithm, Coalescing, DecisionSource, RateLimiter, Subject};

use crate::common::{redis_limiter, redis_limiter_with, workload_quota, BenchResult, RawScript};

/// One contender: a name and what it does per call.
#[derive(Debug, Clone)]
pub(crate) struct Contender {
    pub(crate) name: String,
    pub(crate) op: Op,
}

/// What a contender does per call `i`.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// `EVALSHA` of `script`; `keys[i % len]` is its one key (none if empty),
    /// then `args`.
    Raw {
        conn: MultiplexedConnection,
        script: RawScript,
        keys: Vec<String>,
        args: Vec<String>,
    },
    /// `limiter.check(subjects[i % len])`.
    Check {
        limiter: RateLimiter,
        subjects: Vec<Subject>,
    },
}

impl Op {
    /// A tollgate check of `algorithm` at the workload quota over
    /// `subjects`, one script call per check (`Coalescing::off()`), with its
    /// own policy name `{tag}-{algorithm}` (so runs do not share state).
    pub(crate) fn workload_check(
        conn: &MultiplexedConnection,
        algorithm: Algorithm,
        tag: &str,
        subjects: Vec<Subject>,
    ) -> BenchResult<Op> {
        Ok(Op::Check {
            limiter: redis_limiter(
                conn,
                algorithm,
                workload_quota(),
                &format!("{tag}-{}", algorithm.short_name()),
            )?,
            subjects,
        })
    }

    /// As [`workload_check`](Self::workload_check), on a backend that
    /// coalesces (issue #15, `Coalescing::default()`: what `RedisBackend`
    /// does unless told otherwise): checks that arrive while calls are in
    /// flight go out together as one call of the batch script.
    pub(crate) fn coalesced_workload_check(
        conn: &MultiplexedConnection,
        algorithm: Algorithm,
        tag: &str,
        subjects: Vec<Subject>,
    ) -> BenchResult<Op> {
        Ok(Op::Check {
            limiter: redis_limiter_with(
                conn,
                algorithm,
                workload_quota(),
                &format!("{tag}-{}", algorithm.short_name()),
                Coalescing::default(),
            )?,
            subjects,
        })
    }
}

/// What one call gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    /// Denied by the local deny cache, without a round trip.
    DeniedLocally,
}

impl Op {
    pub(crate) async fn call(&self, i: usize) -> BenchResult<Outcome> {
        match self {
            Op::Raw {
                conn,
                script,
                keys,
                args,
            } => {
                let mut c = conn.clone();
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(script.sha.as_str());
                if keys.is_empty() {
                    cmd.arg(0);
                } else {
                    cmd.arg(1).arg(keys[i % keys.len()].as_str());
                }
                for a in args {
                    cmd.arg(a.as_str());
                }
                let v: redis::Value = cmd.query_async(&mut c).await?;
                Ok(match v {
                    redis::Value::Array(items)
                        if matches!(items.first(), Some(redis::Value::Int(0))) =>
                    {
                        Outcome::Denied
                    }
                    _ => Outcome::Allowed,
                })
            }
            Op::Check { limiter, subjects } => {
                let d = limiter.check(&subjects[i % subjects.len()]).await?;
                Ok(match (d.allowed, d.source) {
                    (true, _) => Outcome::Allowed,
                    (false, DecisionSource::DenyCache) => Outcome::DeniedLocally,
                    (false, _) => Outcome::Denied,
                })
            }
        }
    }
}

/// What a run of many calls gave.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunStats {
    pub(crate) calls: u64,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) denied_locally: u64,
    pub(crate) elapsed: Duration,
    /// CPU time of this thread during the run (the whole client, on a
    /// current-thread runtime), when the OS tells it.
    pub(crate) client_cpu: Option<Duration>,
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat` (ns).
pub(crate) fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

impl RunStats {
    pub(crate) fn per_sec(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }

    /// Client CPU per call, µs (NaN when unknown).
    pub(crate) fn client_us_per_call(&self) -> f64 {
        self.client_cpu.map_or(f64::NAN, |c| {
            c.as_secs_f64() * 1e6 / self.calls.max(1) as f64
        })
    }
}

/// Runs calls `start..start + n` with up to `concurrency` in flight.
pub(crate) async fn run(
    op: &Op,
    start: usize,
    n: usize,
    concurrency: usize,
) -> BenchResult<RunStats> {
    let t0 = Instant::now();
    let cpu0 = thread_cpu();
    let mut stats = RunStats::default();
    let mut results = futures::stream::iter(start..start + n)
        .map(|i| op.call(i))
        .buffer_unordered(concurrency.max(1));
    while let Some(r) = results.next().await {
        stats.calls += 1;
        match r? {
            Outcome::Allowed => stats.allowed += 1,
            Outcome::Denied => stats.denied += 1,
            Outcome::DeniedLocally => stats.denied_locally += 1,
        }
    }
    stats.elapsed = t0.elapsed();
    stats.client_cpu = thread_cpu().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
    Ok(stats)
}

/// Runs blocks of calls with up to `concurrency` in flight until `duration`
/// has passed.
pub(crate) async fn run_for(
    op: &Op,
    duration: Duration,
    concurrency: usize,
) -> BenchResult<RunStats> {
    let t0 = Instant::now();
    let mut total = RunStats::default();
    let block = (concurrency * 64).max(256);
    while t0.elapsed() < duration {
        let s = run(op, total.calls as usize, block, concurrency).await?;
        total.calls += s.calls;
        total.allowed += s.allowed;
        total.denied += s.denied;
        total.denied_locally += s.denied_locally;
    }
    total.elapsed = t0.elapsed();
    Ok(total)
}
