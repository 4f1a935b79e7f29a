//! Shared pieces: options, runtime, connections, raw scripts, the report.

use std::fmt::Write as _;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tollgate_core::{Algorithm, Coalescing, Quota, RateLimiter, RedisBackend, Subject};

/// Errors of the harness (never of tollgate's own API under test: those are
/// counted, not propagated, where a benchmark expects them).
pub(crate) type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Options every benchmark takes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Opts {
    /// The Redis to measure against. It should be a private server: the
    /// benchmarks reset its statistics (`CONFIG RESETSTAT`).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    pub(crate) redis_url: String,
    /// Rounds: every contender runs once per round, interleaved, and tables
    /// show the median of rounds.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: usize,
    /// One tenth of the work per round: a smoke test, not a measurement.
    #[arg(long)]
    pub(crate) quick: bool,
}

impl Opts {
    /// `n`, or a tenth of it with `--quick`.
    pub(crate) fn scale(&self, n: usize) -> usize {
        if self.quick {
            (n / 10).max(1)
        } else {
            n
        }
    }
}

/// A current-thread runtime: the client side of every contender runs on one
/// thread, as the single-threaded peers (node, asyncio) do.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A fresh multiplexed connection to `url`.
pub(crate) async fn connect(url: &str) -> BenchResult<MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Runs `rounds` interleaved rounds over `k` variants: `start(round)` as a
/// round begins (progress), then `measure(round, variant)` once for every
/// variant, in [`rotation`](crate::stats::rotation) order. `measure` pushes
/// its figures per variant (`figures[variant].push(x)`, one entry a round),
/// so that [`median`](crate::stats::median) gives a variant's cell and
/// [`ratios`](crate::stats::ratios) its per-round ratios to a baseline.
pub(crate) async fn interleaved(
    rounds: usize,
    k: usize,
    mut start: impl FnMut(usize),
    mut measure: impl AsyncFnMut(usize, usize) -> BenchResult<()>,
) -> BenchResult<()> {
    for round in 0..rounds {
        start(round);
        for c in crate::stats::rotation(round, k) {
            measure(round, c).await?;
        }
    }
    Ok(())
}

/// Every algorithm, in the order tables list them.
pub(crate) const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
];

/// The quota of the throughput, CPU and peer workloads: 1000 per second per
/// subject, spread over [`SUBJECTS`] subjects, so nobody is ever denied at the
/// rates one client reaches here (a denial is counted and reported).
pub(crate) fn workload_quota() -> Quota {
    Quota::per_second(1000)
}

/// Subjects the workloads rotate over.
pub(crate) const SUBJECTS: usize = 1000;

/// `u0`, `u1`, … as subjects.
pub(crate) fn subjects(n: usize) -> Vec<Subject> {
    (0..n).map(|i| Subject::from(format!("u{i}"))).collect()
}

/// A limiter on Redis over `conn`, without a deny cache (every check is a
/// round trip) and without coalescing (issue #15: one script call per check,
/// so that a row measures the script's own cost per decision), named so that
/// runs never share keys with each other.
pub(crate) fn redis_limiter(
    conn: &MultiplexedConnection,
    algorithm: Algorithm,
    quota: Quota,
    name: &str,
) -> BenchResult<RateLimiter> {
    redis_limiter_with(conn, algorithm, quota, name, Coalescing::off())
}

/// [`redis_limiter`] with the given coalescing (`Coalescing::default()` is
/// what `RedisBackend` does unless told otherwise). The limiter has a backend
/// of its own, hence its own queue of checks, over the shared connection.
pub(crate) fn redis_limiter_with(
    conn: &MultiplexedConnection,
    algorithm: Algorithm,
    quota: Quota,
    name: &str,
    coalescing: Coalescing,
) -> BenchResult<RateLimiter> {
    let backend = RedisBackend::from_connection(conn.clone()).with_coalescing(coalescing);
    Ok(RateLimiter::builder(backend, algorithm)
        .quota(quota)
        .prefix("tgbench")
        .name(name)
        .deny_cache(0)
        .timeout(Duration::from_secs(5))
        .failure_policy(tollgate_core::FailurePolicy::Deny)
        .build()?)
}

/// A Lua script run by raw `EVALSHA`, outside tollgate.
#[derive(Debug, Clone)]
pub(crate) struct RawScript {
    pub(crate) name: &'static str,
    pub(crate) sha: String,
    pub(crate) body: &'static str,
}

impl RawScript {
    pub(crate) fn new(name: &'static str, body: &'static str) -> Self {
        RawScript {
            name,
            sha: redis::Script::new(body).get_hash().to_owned(),
            body,
        }
    }

    /// `SCRIPT LOAD`, so the measured calls never take the NOSCRIPT path.
    pub(crate) async fn load(&self, conn: &MultiplexedConnection) -> BenchResult<()> {
        let mut c = conn.clone();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(self.body)
            .query_async(&mut c)
            .await?;
        if sha != self.sha {
            return Err(format!(
                "{}: SCRIPT LOAD gave {sha}, expected {}",
                self.name, self.sha
            )
            .into());
        }
        Ok(())
    }
}

/// The no-op script every Redis figure is compared with.
pub(crate) fn noop() -> RawScript {
    RawScript::new("no-op", include_str!("../lua/noop.lua"))
}

/// tollgate's script for an algorithm as tollgate sends it (a single call):
/// the arguments, the shared prelude, then the algorithm's file.
macro_rules! core_lua {
    ($file:literal $(+ $state:literal)?) => {
        concat!(
            include_str!("../../tollgate-core/lua/rate_args.lua"),
            include_str!("../../tollgate-core/lua/rate_deadline.lua"),
            include_str!("../../tollgate-core/lua/rate_prelude.lua"),
            $(include_str!(concat!("../../tollgate-core/lua/", $state)),)?
            include_str!("../../tollgate-core/lua/rate_block.lua"),
            include_str!(concat!("../../tollgate-core/lua/", $file))
        )
    };
}

/// tollgate's own script for `algorithm`, byte for byte (for raw runs that
/// separate the script's cost from the client's). [`verify_core_script`]
/// checks that it is still the one tollgate runs.
pub(crate) fn core_script(algorithm: Algorithm) -> RawScript {
    match algorithm {
        Algorithm::Gcra => RawScript::new("gcra.lua", core_lua!("gcra.lua" + "gcra_state.lua")),
        Algorithm::TokenBucket => RawScript::new(
            "token_bucket.lua",
            core_lua!("token_bucket.lua" + "token_bucket_state.lua"),
        ),
        Algorithm::FixedWindow => RawScript::new(
            "fixed_window.lua",
            core_lua!("fixed_window.lua" + "fixed_window_state.lua"),
        ),
        Algorithm::SlidingWindowCounter => RawScript::new(
            "sliding_window_counter.lua",
            core_lua!("sliding_window_counter.lua"),
        ),
        _ => RawScript::new(
            "sliding_window_log.lua",
            core_lua!("sliding_window_log.lua"),
        ),
    }
}

/// Checks that `script` is byte for byte the script `limiter` runs: after
/// `SCRIPT FLUSH`, a check loads tollgate's script, and `SCRIPT EXISTS` must
/// then find `script`'s SHA1. (Other loaded scripts are flushed too.)
pub(crate) async fn verify_core_script(
    conn: &MultiplexedConnection,
    limiter: &RateLimiter,
    script: &RawScript,
) -> BenchResult<()> {
    let mut c = conn.clone();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut c)
        .await?;
    limiter.check("verify-script").await?;
    let exists: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(script.sha.as_str())
        .query_async(&mut c)
        .await?;
    if exists.first() != Some(&1) {
        return Err(format!(
            "the bench's copy of {} is not the script tollgate runs (update core_lua! in common.rs)",
            script.name
        )
        .into());
    }
    Ok(())
}

/// The arguments tollgate sends for one quota and cost 1, server time (the
/// nonce only to the sliding log, the one script that reads it).
pub(crate) fn core_args(algorithm: Algorithm, quota: &Quota, nonce: u64) -> Vec<String> {
    let (a, b) = if algorithm.uses_burst() {
        (quota.burst(), quota.interval_micros())
    } else {
        (quota.limit(), quota.period_micros())
    };
    vec![
        String::new(),
        "1".to_owned(),
        if algorithm == Algorithm::SlidingWindowLog {
            format!("{nonce:016x}")
        } else {
            String::new()
        },
        a.to_string(),
        b.to_string(),
    ]
}

/// Whether a target was met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Met,
    Missed,
    NotMeasured,
    Info,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Met => "met",
            Verdict::Missed => "**missed**",
            Verdict::NotMeasured => "not measured",
            Verdict::Info => "—",
        })
    }
}

/// One line of the summary: a target and what was measured.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) item: &'static str,
    pub(crate) what: String,
    pub(crate) target: String,
    pub(crate) measured: String,
    pub(crate) verdict: Verdict,
}

impl Target {
    pub(crate) fn new(
        item: &'static str,
        what: impl Into<String>,
        target: impl Into<String>,
        measured: impl Into<String>,
        verdict: Verdict,
    ) -> Self {
        Target {
            item,
            what: what.into(),
            target: target.into(),
            measured: measured.into(),
            verdict,
        }
    }

    /// `met` when `ok`, else `missed`.
    pub(crate) fn check(
        item: &'static str,
        what: impl Into<String>,
        target: impl Into<String>,
        measured: impl Into<String>,
        ok: bool,
    ) -> Self {
        Self::new(
            item,
            what,
            target,
            measured,
            if ok { Verdict::Met } else { Verdict::Missed },
        )
    }
}

/// What one benchmark produced: Markdown and targets.
#[derive(Debug, Default)]
pub(crate) struct Section {
    pub(crate) markdown: String,
    pub(crate) targets: Vec<Target>,
}

impl Section {
    pub(crate) fn heading(&mut self, title: &str) {
        let _ = writeln!(self.markdown, "\n### {title}\n");
    }

    pub(crate) fn line(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(self.markdown, "{}", text.as_ref());
    }

    /// A Markdown table.
    pub(crate) fn table(&mut self, header: &[&str], rows: &[Vec<String>]) {
        self.line(format!("| {} |", header.join(" | ")));
        self.line(format!(
            "|{}",
            header.iter().map(|_| "---|").collect::<String>()
        ));
        for r in rows {
            self.line(format!("| {} |", r.join(" | ")));
        }
        self.line("");
    }

    /// Prints the section as soon as it is done (a long run shows progress).
    pub(crate) fn print(&self) {
        println!("{}", self.markdown);
    }
}

/// The summary table of every target.
pub(crate) fn summary(targets: &[Target]) -> String {
    let mut s = Section::default();
    s.heading("Targets");
    let rows: Vec<Vec<String>> = targets
        .iter()
        .map(|t| {
            vec![
                t.item.to_owned(),
                t.what.clone(),
                t.target.clone(),
                t.measured.clone(),
                t.verdict.to_string(),
            ]
        })
        .collect();
    s.table(
        &[
            "item",
            "what",
            "target",
            "measured (median of rounds)",
            "verdict",
        ],
        &rows,
    );
    s.markdown
}

/// `eprintln!` with a prefix: progress goes to stderr, results to stdout.
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("tollgate-bench: {}", format!($($arg)*)) };
}
pub(crate) use progress;
