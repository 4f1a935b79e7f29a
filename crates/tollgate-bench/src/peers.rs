//! Item 7: peers on the same Redis and workload — rate-limiter-flexible
//! (node, ioredis) and the Python `limits` package (redis-py) — against
//! tollgate (one script call per check, and coalesced: issue #15), at equal
//! concurrency.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use tollgate_core::Algorithm;

use crate::common::interleaved;
use crate::common::{
    connect, progress, redis_limiter_with, subjects, workload_quota, BenchResult, Opts, Section,
    Target, SUBJECTS,
};
use crate::ops::{run as run_op, Op};
use crate::redisinfo::{Accounting, Admin, Spent};
use crate::sketch::Sketch;
use crate::stats::{median, per_sec, ratio_cell, ratios};
use crate::throughput::raw_core_contenders;

/// Where the peers' interpreters and packages are (set up by scripts/bench.sh).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PeerOpts {
    /// The node binary.
    #[arg(long, default_value = "node")]
    pub(crate) node: String,
    /// NODE_PATH for the node peer: a node_modules holding
    /// rate-limiter-flexible and ioredis.
    #[arg(long)]
    pub(crate) node_path: Option<PathBuf>,
    /// A Python with `limits` and `redis` installed (a venv's python).
    #[arg(long, default_value = "python3")]
    pub(crate) python: String,
    /// The directory of the peer driver scripts.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/peers"))]
    pub(crate) peers_dir: PathBuf,
    /// Checks in flight for every contender.
    #[arg(long, default_value_t = 16)]
    pub(crate) concurrency: usize,
}

const LIMIT: u64 = 1000;

/// The rate-limiter-flexible row.
const RLF: &str = "rate-limiter-flexible `RateLimiterRedis.consume` (node, ioredis)";

enum Runner {
    Tollgate(Op),
    Process(Vec<String>, Vec<(String, PathBuf)>),
    /// The least-work bound ([`Sketch`]).
    Sketch(Sketch),
}

struct Peer {
    name: String,
    /// Which tollgate algorithm is its like-for-like (for the ratio column).
    like: Algorithm,
    /// A tollgate row whose backend coalesces checks (issue #15).
    coalesced: bool,
    concurrency: usize,
    runner: Runner,
}

/// Parses `redis://host:port/…` into its port.
fn port_of(url: &str) -> BenchResult<u16> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = hostport.rsplit_once('@').map_or(hostport, |(_, h)| h);
    let port = hostport.rsplit_once(':').map(|(_, p)| p).unwrap_or("6379");
    Ok(port.parse()?)
}

/// One run of a peer process, bracketed by Redis accounting.
async fn run_process(
    admin: &Admin,
    argv: &[String],
    env: &[(String, PathBuf)],
) -> BenchResult<(u64, f64, u64, f64, Spent)> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut stdin = child.stdin.take().expect("piped");
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{}: expected `ready`, got {line:?}", argv.join(" ")).into());
    }
    let acct = Accounting::start(admin).await?;
    stdin.write_all(b"go\n")?;
    stdin.flush()?;
    line.clear();
    out.read_line(&mut line)?;
    let spent = acct.finish(admin).await?;
    drop(stdin);
    let status = child.wait()?;
    let mut decisions = 0;
    let mut seconds = f64::NAN;
    let mut denied = 0;
    let mut cpu = f64::NAN;
    for kv in line.split_whitespace().skip(1) {
        match kv.split_once('=') {
            Some(("decisions", v)) => decisions = v.parse()?,
            Some(("seconds", v)) => seconds = v.parse()?,
            Some(("denied", v)) => denied = v.parse()?,
            Some(("cpu_seconds", v)) => cpu = v.parse()?,
            _ => {}
        }
    }
    if !status.success() || !line.starts_with("result ") {
        return Err(format!("{}: failed ({status}), said {line:?}", argv.join(" ")).into());
    }
    Ok((decisions, seconds, denied, cpu, spent))
}

/// Runs item 7.
pub(crate) async fn run(opts: &Opts, peer: &PeerOpts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let admin = Admin::connect(&opts.redis_url).await?;
    let port = port_of(&opts.redis_url)?.to_string();
    let n = opts.scale(20_000);
    let c = peer.concurrency;
    let subj = subjects(SUBJECTS);
    let mut peers = Vec::new();
    for alg in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
    ] {
        peers.push(Peer {
            name: format!("tollgate {alg}, single call"),
            like: alg,
            coalesced: false,
            concurrency: c,
            runner: Runner::Tollgate(Op::workload_check(&conn, alg, "peer", subj.clone())?),
        });
    }
    // Coalesced (issue #15): GCRA, and the fixed window that
    // rate-limiter-flexible and limits' `FixedWindowRateLimiter` are like.
    for alg in [Algorithm::Gcra, Algorithm::FixedWindow] {
        peers.push(Peer {
            name: format!("tollgate {alg}, coalesced"),
            like: alg,
            coalesced: true,
            concurrency: c,
            runner: Runner::Tollgate(Op::coalesced_workload_check(
                &conn,
                alg,
                "peer-coal",
                subj.clone(),
            )?),
        });
    }
    // The lean batches (issue #25): GCRA coalesced with other numbers of
    // calls in flight than the default, to choose it by; and tollgate's
    // GCRA script by raw `EVALSHA`, one call per check, the floor of a
    // single call.
    let default_calls = tollgate_core::Coalescing::default().calls_limit();
    for calls in [1, 2, 4].into_iter().filter(|&n| n != default_calls) {
        let name = format!("peer-coal{calls}-gcra");
        peers.push(Peer {
            name: format!("tollgate GCRA, coalesced, {calls} calls in flight"),
            like: Algorithm::Gcra,
            coalesced: true,
            concurrency: c,
            runner: Runner::Tollgate(Op::Check {
                limiter: redis_limiter_with(
                    &conn,
                    Algorithm::Gcra,
                    workload_quota(),
                    &name,
                    tollgate_core::Coalescing::default().max_calls_in_flight(calls),
                )?,
                subjects: subj.clone(),
            }),
        });
    }
    let raw = raw_core_contenders(&conn)
        .await?
        .into_iter()
        .next()
        .expect("the GCRA script first");
    peers.push(Peer {
        name: format!("{} (one call per check)", raw.name),
        like: Algorithm::Gcra,
        coalesced: false,
        concurrency: c,
        runner: Runner::Tollgate(raw.op),
    });
    // The bound: the least work a GCRA decision can cost, the same checks
    // in flight split over 1, 2, 4 or 16 calls.
    for calls in [1, 2, 4, c] {
        let sketch = Sketch::new(&conn, "tgbench-sketch", SUBJECTS, LIMIT, calls, c).await?;
        peers.push(Peer {
            name: format!(
                "bound: least-work GCRA sketch, {} checks × {calls} calls in flight",
                (c / calls).max(1)
            ),
            like: Algorithm::Gcra,
            coalesced: false,
            concurrency: c,
            runner: Runner::Sketch(sketch),
        });
    }
    let common = |script: &str| -> Vec<String> {
        vec![
            peer.peers_dir.join(script).display().to_string(),
            port.clone(),
            n.to_string(),
            c.to_string(),
            SUBJECTS.to_string(),
            LIMIT.to_string(),
        ]
    };
    let mut node = vec![peer.node.clone()];
    node.extend(common("rlf.js"));
    let node_env: Vec<(String, PathBuf)> = peer
        .node_path
        .iter()
        .map(|p| ("NODE_PATH".to_owned(), p.clone()))
        .collect();
    peers.push(Peer {
        name: RLF.into(),
        like: Algorithm::FixedWindow,
        coalesced: false,
        concurrency: c,
        runner: Runner::Process(node, node_env),
    });
    for (strategy, label, like) in [
        ("fixed", "FixedWindowRateLimiter", Algorithm::FixedWindow),
        (
            "moving",
            "MovingWindowRateLimiter",
            Algorithm::SlidingWindowLog,
        ),
    ] {
        let mut py = vec![peer.python.clone()];
        py.extend(common("limits_bench.py"));
        py.push(strategy.into());
        py.push("async".into());
        peers.push(Peer {
            name: format!("limits `{label}` (Python, limits.aio + redis-py asyncio)"),
            like,
            coalesced: false,
            concurrency: c,
            runner: Runner::Process(py, vec![]),
        });
    }
    let mut py = vec![peer.python.clone()];
    py.extend(common("limits_bench.py"));
    py[4] = "1".into();
    py.push("fixed".into());
    py.push("sync".into());
    peers.push(Peer {
        name: "limits `FixedWindowRateLimiter` (Python, sync redis-py)".into(),
        like: Algorithm::FixedWindow,
        coalesced: false,
        concurrency: 1,
        runner: Runner::Process(py, vec![]),
    });

    let k = peers.len();
    let mut rates = vec![Vec::new(); k];
    let mut script_us = vec![Vec::new(); k];
    let mut cpu_us = vec![Vec::new(); k];
    let mut client_us = vec![Vec::new(); k];
    let mut cmds = vec![String::new(); k];
    let mut denied = vec![0u64; k];
    let mut offset = 0;
    for p in &peers {
        match &p.runner {
            Runner::Tollgate(op) => {
                run_op(op, 0, opts.scale(2_000), c).await?;
            }
            Runner::Sketch(sketch) => {
                sketch.run(0, opts.scale(2_000)).await?;
            }
            Runner::Process(..) => {}
        }
    }
    interleaved(
        opts.rounds,
        k,
        |round| {
            progress!(
                "peers: round {}/{} ({n} decisions each)",
                round + 1,
                opts.rounds
            )
        },
        async |_, i| {
            progress!("peers: {}", peers[i].name);
            let (decisions, seconds, d, client_cpu, spent) = match &peers[i].runner {
                Runner::Tollgate(op) => {
                    let acct = Accounting::start(&admin).await?;
                    let s = run_op(op, offset, n, peers[i].concurrency).await?;
                    offset += n;
                    let spent = acct.finish(&admin).await?;
                    (
                        s.calls,
                        s.elapsed.as_secs_f64(),
                        s.denied + s.denied_locally,
                        s.client_cpu.map_or(f64::NAN, |c| c.as_secs_f64()),
                        spent,
                    )
                }
                Runner::Process(argv, env) => run_process(&admin, argv, env).await?,
                Runner::Sketch(sketch) => {
                    let acct = Accounting::start(&admin).await?;
                    let s = sketch.run(offset, n).await?;
                    offset += n;
                    let spent = acct.finish(&admin).await?;
                    (
                        s.calls,
                        s.elapsed.as_secs_f64(),
                        s.denied,
                        s.client_cpu.map_or(f64::NAN, |c| c.as_secs_f64()),
                        spent,
                    )
                }
            };
            rates[i].push(decisions as f64 / seconds);
            let scripts = spent.stats.scripts();
            script_us[i].push(scripts.usec as f64 / decisions.max(1) as f64);
            cpu_us[i].push(spent.cpu_micros / decisions.max(1) as f64);
            client_us[i].push(client_cpu * 1e6 / decisions.max(1) as f64);
            cmds[i] = spent.stats.per_decision(decisions);
            denied[i] += d;
            Ok(())
        },
    )
    .await?;

    let mut section = Section::default();
    section.heading("7. Peers on the same Redis and workload");
    section.line(format!(
        "Every contender makes {n} decisions per round ({} rounds, in rotating order) with \
         {c} in flight (except the sync row), over {SUBJECTS} subjects at {LIMIT} per second \
         each (nobody denied: denials are listed), on the same Redis. Each client is one \
         single-threaded process: tollgate on a tokio current-thread runtime over one \
         multiplexed connection, node's event loop over one ioredis connection, Python's \
         asyncio loop over a redis-py pool. Peers are warmed up before each timed run. \
         *script µs/decision*: `usec` of script commands in `INFO commandstats` ÷ decisions; \
         *Redis process CPU*: Redis's `used_cpu_user + used_cpu_sys` growth ÷ decisions; \
         *client CPU*: the client process's own CPU time during the run ÷ decisions \
         (tollgate: its thread; node: `process.cpuUsage()`; Python: `time.process_time()`). \
         *tollgate ÷ it*: the like-for-like tollgate algorithm's rate ÷ this contender's, and \
         tollgate GCRA's rate ÷ this contender's, per round (median, min–max), both with one \
         script call per check (*single call*: `Coalescing::off()`, tollgate's cost before \
         issue #15); *coalesced ÷ it*: the like-for-like coalesced tollgate row's rate ÷ this \
         contender's (*coalesced*: the `RedisBackend` default since issue #15, checks that \
         arrive while calls are in flight go out as one call of a batch script; rows for GCRA \
         and the fixed window).\n",
        opts.rounds
    ));
    let gcra = 0;
    let ratio_vs = |t: usize, i: usize| ratios(&rates[t], &rates[i]);
    let mut rows = Vec::new();
    for i in 0..k {
        let tollgate = |coalesced: bool| {
            peers.iter().position(|p| {
                matches!(p.runner, Runner::Tollgate(_))
                    && p.coalesced == coalesced
                    && p.like == peers[i].like
            })
        };
        let like = tollgate(false).expect("every algorithm compared has a tollgate contender");
        let like_coalesced = tollgate(true);
        let is_peer = matches!(peers[i].runner, Runner::Process(..));
        rows.push(vec![
            peers[i].name.clone(),
            peers[i].concurrency.to_string(),
            per_sec(median(&rates[i])),
            if is_peer {
                format!(
                    "{} (tollgate {})",
                    ratio_cell(&ratio_vs(like, i)),
                    peers[like].like
                )
            } else {
                "—".into()
            },
            if is_peer {
                ratio_cell(&ratio_vs(gcra, i))
            } else {
                "—".into()
            },
            match like_coalesced {
                Some(t) if is_peer => format!(
                    "{} (tollgate {})",
                    ratio_cell(&ratio_vs(t, i)),
                    peers[t].like
                ),
                _ => "—".into(),
            },
            format!("{:.2}", median(&script_us[i])),
            format!("{:.2}", median(&cpu_us[i])),
            format!("{:.1}", median(&client_us[i])),
            format!("`{}`", cmds[i]),
            denied[i].to_string(),
        ]);
        if is_peer && peers[i].concurrency == c {
            let r = median(&ratio_vs(gcra, i));
            section.targets.push(Target::check(
                "7",
                format!("tollgate GCRA decisions/s ÷ {}", peers[i].name),
                "≥ 2×",
                format!("{r:.2}×"),
                r >= 2.0,
            ));
            let r = median(&ratio_vs(like, i));
            section.targets.push(Target::check(
                "7",
                format!(
                    "tollgate {} (like for like) ÷ {}",
                    peers[like].like, peers[i].name
                ),
                "≥ 2×",
                format!("{r:.2}×"),
                r >= 2.0,
            ));
            if let (Some(t), true) = (like_coalesced, peers[i].name == RLF) {
                let r = median(&ratio_vs(t, i));
                section.targets.push(Target::check(
                    "7",
                    format!(
                        "decisions/s, tollgate coalesced ÷ rate-limiter-flexible, {c} in flight \
                         (tollgate {}, like for like)",
                        peers[t].like
                    ),
                    "≥ 2×",
                    format!("{r:.2}×"),
                    r >= 2.0,
                ));
            }
        }
    }
    lean_targets(&mut section, &peers, &rates, &cpu_us, c);
    section.table(
        &[
            "contender",
            "in flight",
            "decisions/s",
            "like-for-like tollgate ÷ it",
            "tollgate GCRA ÷ it",
            "like-for-like tollgate coalesced ÷ it",
            "script µs/decision",
            "Redis process CPU µs/decision",
            "client CPU µs/decision",
            "commands per decision",
            "denied",
        ],
        &rows,
    );
    admin.delete_matching("tgbench*").await?;
    Ok(section)
}

/// The goals of the lean batches (issue #25): tollgate GCRA at its default
/// settings against its own script called once per check and against
/// rate-limiter-flexible, per round (median).
fn lean_targets(
    section: &mut Section,
    peers: &[Peer],
    rates: &[Vec<f64>],
    cpu_us: &[Vec<f64>],
    c: usize,
) {
    let find = |f: &dyn Fn(&Peer) -> bool| peers.iter().position(f);
    let coalesced = find(&|p| p.coalesced && p.like == Algorithm::Gcra);
    let raw = find(&|p| p.name.starts_with("raw EVALSHA"));
    let rlf = find(&|p| p.name == RLF);
    let (Some(t), Some(raw), Some(rlf)) = (coalesced, raw, rlf) else {
        return;
    };
    let r = median(&ratios(&cpu_us[t], &cpu_us[raw]));
    section.targets.push(Target::check(
        "7",
        format!("Redis process CPU per decision, tollgate GCRA (default settings) ÷ its script called once per check, {c} in flight"),
        "≤ 0.5×",
        format!("{r:.2}×"),
        r <= 0.5,
    ));
    let r = median(&ratios(&cpu_us[t], &cpu_us[rlf]));
    section.targets.push(Target::check(
        "7",
        format!("Redis process CPU per decision, tollgate GCRA (default settings) ÷ rate-limiter-flexible, {c} in flight"),
        "≤ 0.6×",
        format!("{r:.2}×"),
        r <= 0.6,
    ));
    let r = median(&ratios(&rates[t], &rates[rlf]));
    section.targets.push(Target::check(
        "7",
        format!(
            "decisions/s, tollgate GCRA (default settings) ÷ rate-limiter-flexible, {c} in flight"
        ),
        "≥ 1.5×",
        format!("{r:.2}×"),
        r >= 1.5,
    ));
    // The bound: the least-work sketch's best setting against the peer.
    let sketches: Vec<usize> = (0..peers.len())
        .filter(|&i| matches!(peers[i].runner, Runner::Sketch(_)))
        .collect();
    let best = |of: &dyn Fn(usize) -> f64, lower: bool| {
        sketches
            .iter()
            .map(|&i| (of(i), i))
            .reduce(|a, b| if (b.0 < a.0) == lower { b } else { a })
    };
    let cpu = best(&|i| median(&ratios(&cpu_us[i], &cpu_us[rlf])), true);
    let rate = best(&|i| median(&ratios(&rates[i], &rates[rlf])), false);
    if let (Some((cpu, ci)), Some((rate, ri))) = (cpu, rate) {
        section.line(format!(
            "\n**Bound** (the least-work sketch, best of its settings, per-round ratios): Redis \
             process CPU per decision ÷ rate-limiter-flexible **{cpu:.2}×** ({}); decisions/s ÷ \
             rate-limiter-flexible **{rate:.2}×** ({}): a bound, in this run, on a design that \
             writes every admitted GCRA decision to this Redis with {c} checks in flight from \
             one client thread.\n",
            peers[ci].name, peers[ri].name
        ));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_from_urls() {
        assert_eq!(super::port_of("redis://127.0.0.1:6400/").unwrap(), 6400);
        assert_eq!(super::port_of("redis://:pw@127.0.0.1:7000").unwrap(), 7000);
        assert_eq!(super::port_of("redis://localhost/").unwrap(), 6379);
    }
}
