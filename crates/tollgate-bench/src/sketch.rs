//! A bound for the peers item: the least work any GCRA decision on Redis
//! can cost (`sketch_gcra.lua`), driven by the least
//! client work — `in_flight` checks split evenly over `calls` calls kept in
//! flight on one multiplexed connection, with no queue, no per-check future
//! and no reply parsing beyond one integer. What it reaches against a peer
//! in the same run bounds what a design that writes every admitted decision
//! to Redis could reach there.

use std::time::Instant;

use redis::aio::MultiplexedConnection;

use crate::common::{BenchResult, RawScript};
use crate::ops::{thread_cpu, RunStats};

/// The sketch script, loaded on `conn`.
pub(crate) async fn load_script(conn: &MultiplexedConnection) -> BenchResult<RawScript> {
    let script = RawScript::new(
        "the least-work GCRA sketch",
        include_str!("sketch_gcra.lua"),
    );
    script.load(conn).await?;
    Ok(script)
}

/// The sketch, `in_flight` checks as `calls` calls in flight.
pub(crate) struct Sketch {
    conn: MultiplexedConnection,
    script: RawScript,
    keys: Vec<String>,
    burst: u64,
    interval_micros: u64,
    pub(crate) calls: usize,
    pub(crate) in_flight: usize,
}

impl Sketch {
    /// A sketch over `subjects` keys under `prefix`, at `per_second` a
    /// subject (burst the same), loaded on `conn`.
    pub(crate) async fn new(
        conn: &MultiplexedConnection,
        prefix: &str,
        subjects: usize,
        per_second: u64,
        calls: usize,
        in_flight: usize,
    ) -> BenchResult<Sketch> {
        Ok(Sketch {
            conn: conn.clone(),
            script: load_script(conn).await?,
            keys: (0..subjects).map(|i| format!("{prefix}:u{i}")).collect(),
            burst: per_second,
            interval_micros: 1_000_000 / per_second,
            calls: calls.max(1),
            in_flight: in_flight.max(1),
        })
    }

    /// Decides checks `start..start + n` (subjects in turn); a call carries
    /// `in_flight / calls` checks, and `calls` calls are kept in flight.
    pub(crate) async fn run(&self, start: usize, n: usize) -> BenchResult<RunStats> {
        use futures::StreamExt;

        let per_call = (self.in_flight / self.calls).max(1);
        let t0 = Instant::now();
        let cpu0 = thread_cpu();
        let mut stats = RunStats::default();
        let mut replies = futures::stream::iter((start..start + n).step_by(per_call))
            .map(|first| {
                let last = (first + per_call).min(start + n);
                self.call(first..last)
            })
            .buffer_unordered(self.calls);
        while let Some(reply) = replies.next().await {
            for admitted in reply? {
                stats.calls += 1;
                if admitted == 1 {
                    stats.allowed += 1;
                } else {
                    stats.denied += 1;
                }
            }
        }
        stats.elapsed = t0.elapsed();
        stats.client_cpu = thread_cpu().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
        Ok(stats)
    }

    async fn call(&self, checks: std::ops::Range<usize>) -> BenchResult<Vec<i64>> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.sha.as_str()).arg(checks.len());
        for i in checks {
            cmd.arg(self.keys[i % self.keys.len()].as_str());
        }
        cmd.arg(self.burst).arg(self.interval_micros);
        Ok(cmd.query_async(&mut conn).await?)
    }
}
