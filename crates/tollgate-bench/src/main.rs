//! tollgate-bench: tollgate's benchmark suite (issue #6).
//!
//! Run everything with `scripts/bench.sh` (it installs the peers, starts a
//! private `redis-server`, builds this binary in release mode and runs
//! `tollgate-bench all`); results are recorded in `BENCHMARKS.md`.
//!
//! Every figure is a ratio measured side by side in one run: contenders are
//! interleaved in rounds and tables show the median of rounds, because the
//! machines this runs on are shared and absolute numbers drift.
//!
//! Subcommands run one item each (`latency`, `throughput`, `cpu`, `coalesce`, `memory`,
//! `http`, `micro`, `flood`, `locks`, `peers`, `idempotency`, `leases`) or all of them (`all`); `serve` is the
//! HTTP server that `http` starts once per variant. `soak` (issue #16) is not a benchmark: a bounded
//! chaos run against Redis servers it starts itself, which exits non-zero on a violation.
#![forbid(unsafe_code)]

mod coalesce;
mod common;
mod flood;
mod http;
mod http_sketch;
mod idempotency;
mod latency;
mod leases;
mod locks;
mod memory;
mod micro;
mod micro_sketch;
mod ops;
mod peers;
mod redisinfo;
mod router_sketch;
mod settle;
mod sketch;
mod soak;
mod stats;
mod throughput;

use clap::{Parser, Subcommand};

use common::{runtime, summary, BenchResult, Opts, Section, Target, Verdict};

#[derive(Debug, Parser)]
#[command(
    name = "tollgate-bench",
    about = "tollgate's benchmark suite (issue #6)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Every item, then the summary of targets.
    All {
        #[command(flatten)]
        opts: Opts,
        #[command(flatten)]
        peers: peers::PeerOpts,
        #[command(flatten)]
        http: http::HttpOpts,
        /// Items to skip (comma-separated: latency,throughput,cpu,coalesce,memory,http,micro,flood,locks,peers,idempotency,settle,leases).
        #[arg(long, value_delimiter = ',')]
        skip: Vec<String>,
        /// Also write the Markdown report to this file.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// 1. Sequential decision latency vs a raw no-op EVALSHA.
    Latency(Opts),
    /// 2a. Throughput at 1, 16 and 256 in flight vs a raw no-op.
    Throughput(Opts),
    /// 2b. Redis CPU per decision (INFO commandstats), every algorithm.
    Cpu(Opts),
    /// 2c. Coalescing (issue #15): one script call per check vs coalesced
    /// checks, at 1, 16 and 256 in flight, and a lone check's latency.
    Coalesce(Opts),
    /// 3. Redis memory per key.
    Memory(Opts),
    /// 4. HTTP under wrk: no limiter, tollgate memory/Redis, tower_governor.
    Http {
        #[command(flatten)]
        opts: Opts,
        #[command(flatten)]
        http: http::HttpOpts,
    },
    /// In-process costs: tollgate memory vs governor, getrandom, timeouts.
    Micro(Opts),
    /// 5. A flood from a blocked subject (deny cache).
    Flood(Opts),
    /// 6. Locks: uncontended, and contended hand-off vs a 50 ms poller.
    Locks(Opts),
    /// Idempotency keys (issue #13): Redis round trips per first request and per replay.
    Idempotency(Opts),
    /// Settles (issue #26): Redis CPU and round trips of a settle beside a check and a refund.
    Settle(Opts),
    /// Quota leases (issue #25): one hot subject, 4 instances, leases on vs the exact limiter.
    Leases(Opts),
    /// 7. Peers: rate-limiter-flexible (node) and limits (Python).
    Peers {
        #[command(flatten)]
        opts: Opts,
        #[command(flatten)]
        peers: peers::PeerOpts,
    },
    /// Chaos run (issue #16): limits, locks and permits while Redis is
    /// paused, killed, restarted and failed over; exits 2 on a violation.
    Soak(soak::SoakOpts),
    /// Serves the HTTP benchmark's app (started by `http`).
    Serve(http::ServeOpts),
    /// Drives one variant of the HTTP app in process, for a profiler
    /// (`valgrind --tool=callgrind tollgate-bench stack --variant …`):
    /// instructions per request are comparable between variants and runs.
    Stack {
        /// What runs in front of the handler (the Redis variants are not offered).
        #[arg(long, value_enum)]
        variant: http::Variant,
        /// Requests to send.
        #[arg(long, default_value_t = 100_000)]
        requests: u64,
    },
}

fn finish(sections: Vec<Section>, out: Option<&std::path::Path>) -> BenchResult<()> {
    let targets: Vec<Target> = sections.iter().flat_map(|s| s.targets.clone()).collect();
    let table = summary(&targets);
    println!("{table}");
    if let Some(path) = out {
        let mut md = String::new();
        for s in &sections {
            md.push_str(&s.markdown);
        }
        md.push_str(&table);
        std::fs::write(path, md)?;
    }
    Ok(())
}

fn one(section: BenchResult<Section>) -> BenchResult<()> {
    let s = section?;
    s.print();
    finish(vec![s], None)
}

fn all(
    opts: &Opts,
    peer: &peers::PeerOpts,
    http_opts: &http::HttpOpts,
    skip: &[String],
    out: Option<&std::path::Path>,
) -> BenchResult<()> {
    let rt = runtime();
    let mut sections = Vec::new();
    let skipped = |name: &str| skip.iter().any(|s| s == name);
    let mut push = |name: &'static str, r: BenchResult<Section>| {
        let s = match r {
            Ok(s) => s,
            // One item failing must not lose the others: it is reported.
            Err(e) => {
                common::progress!("{name} failed: {e}");
                let mut s = Section::default();
                s.heading(&format!("{name}: not measured"));
                s.line(format!("The run failed: `{e}`"));
                s.targets.push(Target::new(
                    "—",
                    format!("{name} (failed)"),
                    "—",
                    e.to_string(),
                    Verdict::NotMeasured,
                ));
                s
            }
        };
        s.print();
        sections.push(s);
    };
    let version = rt.block_on(async {
        let admin = redisinfo::Admin::connect(&opts.redis_url).await?;
        admin.info_field("server", "redis_version").await
    })?;
    println!(
        "Redis {version} at {}; {} rounds{}.",
        opts.redis_url,
        opts.rounds,
        if opts.quick {
            " (quick: not a measurement)"
        } else {
            ""
        }
    );
    if !skipped("latency") {
        push("latency", rt.block_on(latency::run(opts)));
    }
    if !skipped("throughput") {
        push("throughput", rt.block_on(throughput::throughput(opts)));
    }
    if !skipped("cpu") {
        push("cpu", rt.block_on(throughput::cpu(opts)));
    }
    if !skipped("coalesce") {
        push("coalesce", rt.block_on(coalesce::run(opts)));
    }
    if !skipped("memory") {
        push("memory", rt.block_on(memory::run(opts)));
    }
    if !skipped("http") {
        push("http", http::run(opts, http_opts));
    }
    if !skipped("micro") {
        push("micro", rt.block_on(micro::run(opts)));
    }
    if !skipped("flood") {
        push("flood", rt.block_on(flood::run(opts)));
    }
    if !skipped("locks") {
        push("locks", rt.block_on(locks::run(opts)));
    }
    if !skipped("idempotency") {
        push("idempotency", rt.block_on(idempotency::run(opts)));
    }
    if !skipped("settle") {
        push("settle", rt.block_on(settle::run(opts)));
    }
    if !skipped("leases") {
        push("leases", rt.block_on(leases::run(opts)));
    }
    if !skipped("peers") {
        push("peers", rt.block_on(peers::run(opts, peer)));
    }
    finish(sections, out)
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.command {
        Cmd::All {
            opts,
            peers,
            http,
            skip,
            out,
        } => all(opts, peers, http, skip, out.as_deref()),
        Cmd::Latency(o) => one(runtime().block_on(latency::run(o))),
        Cmd::Throughput(o) => one(runtime().block_on(throughput::throughput(o))),
        Cmd::Cpu(o) => one(runtime().block_on(throughput::cpu(o))),
        Cmd::Coalesce(o) => one(runtime().block_on(coalesce::run(o))),
        Cmd::Memory(o) => one(runtime().block_on(memory::run(o))),
        Cmd::Http { opts, http } => one(http::run(opts, http)),
        Cmd::Micro(o) => one(runtime().block_on(micro::run(o))),
        Cmd::Leases(o) => one(runtime().block_on(leases::run(o))),
        Cmd::Flood(o) => one(runtime().block_on(flood::run(o))),
        Cmd::Locks(o) => one(runtime().block_on(locks::run(o))),
        Cmd::Idempotency(o) => one(runtime().block_on(idempotency::run(o))),
        Cmd::Settle(o) => one(runtime().block_on(settle::run(o))),
        Cmd::Peers { opts, peers } => one(runtime().block_on(peers::run(opts, peers))),
        Cmd::Soak(o) => match soak::run(o) {
            Ok(true) => Ok(()),
            Ok(false) => {
                eprintln!("tollgate-bench: soak: violations or a stuck workload (see the report)");
                std::process::exit(2);
            }
            Err(e) => Err(e),
        },
        Cmd::Serve(o) => http::serve(o),
        Cmd::Stack { variant, requests } => {
            runtime().block_on(micro::drive_stack(*variant, *requests))
        }
    };
    if let Err(e) = result {
        eprintln!("tollgate-bench: {e}");
        std::process::exit(1);
    }
}
