//! Item 2: throughput with 1, 16 and 256 checks in flight over one
//! multiplexed connection, and Redis CPU per decision for every algorithm.

use tollgate_core::Algorithm;

use crate::common::interleaved;
use crate::common::{
    connect, core_args, core_script, noop, progress, redis_limiter, subjects, verify_core_script,
    workload_quota, BenchResult, Opts, RawScript, Section, Target, ALGORITHMS, SUBJECTS,
};
use crate::ops::{run as run_op, Contender, Op};
use crate::redisinfo::{Accounting, Admin};
use crate::stats::{median, per_sec, ratio_cell, ratios};

fn limiter_contenders(
    conn: &redis::aio::MultiplexedConnection,
    tag: &str,
) -> BenchResult<Vec<Contender>> {
    let subjects = subjects(SUBJECTS);
    ALGORITHMS
        .iter()
        .map(|&alg| {
            Ok(Contender {
                name: format!("tollgate {alg}"),
                op: Op::workload_check(conn, alg, tag, subjects.clone())?,
            })
        })
        .collect()
}

async fn noop_contender(conn: &redis::aio::MultiplexedConnection) -> BenchResult<Contender> {
    let script = noop();
    script.load(conn).await?;
    Ok(Contender {
        name: "raw EVALSHA no-op".into(),
        op: Op::Raw {
            conn: conn.clone(),
            script,
            keys: vec![],
            args: vec![],
        },
    })
}

/// tollgate's GCRA and token-bucket scripts by raw `EVALSHA`, with the same
/// keys and arguments as tollgate sends: the script's share of the cost,
/// without tollgate's client.
pub(crate) async fn raw_core_contenders(
    conn: &redis::aio::MultiplexedConnection,
) -> BenchResult<Vec<Contender>> {
    let mut v = Vec::new();
    for alg in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let limiter = redis_limiter(
            conn,
            alg,
            workload_quota(),
            &format!("tput-raw-{}", alg.short_name()),
        )?;
        let script = core_script(alg);
        verify_core_script(conn, &limiter, &script).await?;
        let keys = subjects(SUBJECTS)
            .iter()
            .map(|s| limiter.keys_for(s).remove(0))
            .collect();
        v.push(Contender {
            name: format!("raw EVALSHA of tollgate's {}", script.name),
            op: Op::Raw {
                conn: conn.clone(),
                script,
                keys,
                args: core_args(alg, &workload_quota(), 0x5eed),
            },
        });
    }
    Ok(v)
}

/// Runs the throughput half of item 2.
pub(crate) async fn throughput(opts: &Opts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let mut contenders = vec![noop_contender(&conn).await?];
    contenders.extend(raw_core_contenders(&conn).await?);
    contenders.extend(limiter_contenders(&conn, "tput")?);
    for c in &contenders {
        if let Op::Raw { script, .. } = &c.op {
            script.load(&conn).await?;
        }
    }
    let k = contenders.len();
    let levels = [1usize, 16, 256];
    // per level, per contender: decisions/s per round
    let mut rates = vec![vec![Vec::new(); k]; levels.len()];
    let mut client_us = vec![vec![Vec::new(); k]; levels.len()];
    let mut server_us = vec![vec![Vec::new(); k]; levels.len()];
    let admin = Admin::connect(&opts.redis_url).await?;
    let mut denied = 0;
    let mut offset = 0usize;
    for c in &contenders {
        run_op(&c.op, 0, opts.scale(2_000), 16).await?;
    }
    for (l, &conc) in levels.iter().enumerate() {
        let n = opts.scale(if conc == 1 { 10_000 } else { 40_000 });
        interleaved(
            opts.rounds,
            k,
            |round| {
                progress!(
                    "throughput: {conc} in flight, round {}/{} ({n} decisions per contender)",
                    round + 1,
                    opts.rounds
                )
            },
            async |_, c| {
                let acct = Accounting::start(&admin).await?;
                let s = run_op(&contenders[c].op, offset, n, conc).await?;
                let spent = acct.finish(&admin).await?;
                offset += n;
                client_us[l][c].push(s.client_us_per_call());
                server_us[l][c].push(spent.cpu_micros / s.calls as f64);
                denied += s.denied + s.denied_locally;
                rates[l][c].push(s.per_sec());
                Ok(())
            },
        )
        .await?;
    }
    let mut section = Section::default();
    section.heading("2a. Throughput over one multiplexed connection (deny cache off)");
    section.line(format!(
        "Each contender runs a block of decisions ({} at 1 in flight, {} at 16 and 256), \
         blocks interleaved in rotating order, {} rounds; quota 1000/s over {SUBJECTS} subjects \
         ({denied} denials). Cells: median decisions/s, then the median of per-round ratios to the \
         no-op (min–max). Client: one tokio current-thread runtime.\n",
        opts.scale(10_000),
        opts.scale(40_000),
        opts.rounds
    ));
    let mut rows = Vec::new();
    for (c, cont) in contenders.iter().enumerate() {
        let mut row = vec![cont.name.clone()];
        for level in &rates {
            row.push(per_sec(median(&level[c])));
            row.push(if c == 0 {
                "1×".into()
            } else {
                ratio_cell(&ratios(&level[c], &level[0]))
            });
        }
        rows.push(row);
    }
    section.table(
        &[
            "contender",
            "1 in flight",
            "÷ no-op",
            "16 in flight",
            "÷ no-op",
            "256 in flight",
            "÷ no-op",
        ],
        &rows,
    );
    section.line(
        "CPU per decision in the same runs, µs (median of rounds): *client* = this process's \
         thread (`/proc/thread-self/schedstat`: the whole client, tollgate or raw, plus \
         redis-rs), *Redis* = growth of the server's `used_cpu_user + used_cpu_sys` ÷ \
         decisions. At 16 and 256 in flight a contender's rate is bounded by the busier of \
         the two (and both share the machine's cores with everything else).\n",
    );
    let mut rows = Vec::new();
    for (c, cont) in contenders.iter().enumerate() {
        let mut row = vec![cont.name.clone()];
        for l in 0..levels.len() {
            row.push(format!("{:.1}", median(&client_us[l][c])));
            row.push(format!("{:.1}", median(&server_us[l][c])));
        }
        rows.push(row);
    }
    section.table(
        &[
            "contender",
            "client @1",
            "Redis @1",
            "client @16",
            "Redis @16",
            "client @256",
            "Redis @256",
        ],
        &rows,
    );
    for (c, cont) in contenders.iter().enumerate().skip(3).take(2) {
        for (l, conc) in levels.iter().enumerate() {
            section.targets.push(Target::new(
                "2",
                format!("{} throughput ÷ no-op, {conc} in flight", cont.name),
                "(no target)",
                format!("{:.2}×", median(&ratios(&rates[l][c], &rates[l][0]))),
                crate::common::Verdict::Info,
            ));
        }
    }
    Ok(section)
}

/// A script measured for its Redis CPU: how it is called.
struct CpuSubject {
    name: String,
    op: Op,
    /// Whether it is one of tollgate's own algorithms (checked against the target).
    target: Option<Algorithm>,
}

fn reference(
    conn: &redis::aio::MultiplexedConnection,
    script: RawScript,
    args: &[&str],
    keys: &[String],
) -> CpuSubject {
    CpuSubject {
        name: format!("reference: {}", script.name),
        op: Op::Raw {
            conn: conn.clone(),
            script,
            keys: keys.to_vec(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
        },
        target: None,
    }
}

/// The scripts of the CPU table besides tollgate's: the no-op, references,
/// and experimental variants of tollgate's scripts.
fn extra_scripts(conn: &redis::aio::MultiplexedConnection) -> Vec<CpuSubject> {
    let keys = |tag: &str| -> Vec<String> {
        (0..SUBJECTS)
            .map(|i| format!("tgbench:ref-{tag}:{{u{i}}}"))
            .collect()
    };
    let q = workload_quota();
    let (burst, interval) = (q.burst().to_string(), q.interval_micros().to_string());
    let mut v = vec![
        reference(conn, noop(), &[], &[]),
        reference(
            conn,
            RawScript::new("TIME only", include_str!("../lua/ref_time.lua")),
            &[],
            &[],
        ),
        reference(
            conn,
            RawScript::new(
                "HMGET/HSET/PEXPIRE token bucket",
                include_str!("../lua/ref_token_bucket_hash.lua"),
            ),
            &[&burst, &interval],
            &keys("tb"),
        ),
        reference(
            conn,
            RawScript::new(
                "GET/SET GCRA (float, TIME)",
                include_str!("../lua/ref_gcra_getset.lua"),
            ),
            &[&burst, &interval],
            &keys("gcra"),
        ),
    ];
    // The floor of any server-clocked one-integer limiter: TIME + GET + SET PX,
    // no logic (GCRA's arguments, ignored).
    let floor_args = core_args(Algorithm::Gcra, &q, 0x5eed);
    let floor_args: Vec<&str> = floor_args.iter().map(String::as_str).collect();
    v.push(reference(
        conn,
        RawScript::new(
            "floor: TIME + GET + SET PX, no logic",
            include_str!("../lua/exp_floor_time_get_set.lua"),
        ),
        &floor_args,
        &keys("floor"),
    ));
    v
}

/// Runs the Redis-CPU half of item 2.
pub(crate) async fn cpu(opts: &Opts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let admin = Admin::connect(&opts.redis_url).await?;
    let mut subjects_: Vec<CpuSubject> = Vec::new();
    for c in limiter_contenders(&conn, "cpu")? {
        let alg = ALGORITHMS[subjects_.len()];
        subjects_.push(CpuSubject {
            name: c.name,
            op: c.op,
            target: Some(alg),
        });
    }
    for s in extra_scripts(&conn) {
        if let Op::Raw { script, .. } = &s.op {
            script.load(&conn).await?;
        }
        subjects_.push(s);
    }
    let k = subjects_.len();
    let n = opts.scale(20_000);
    let mut script_us = vec![Vec::new(); k];
    let mut cpu_us = vec![Vec::new(); k];
    let mut per_decision = vec![String::new(); k];
    let mut offset = 0;
    for s in &subjects_ {
        run_op(&s.op, 0, opts.scale(2_000), 16).await?;
    }
    interleaved(
        opts.rounds,
        k,
        |round| {
            progress!(
                "redis cpu: round {}/{} ({n} decisions per script, 16 in flight)",
                round + 1,
                opts.rounds
            )
        },
        async |_, c| {
            let acct = Accounting::start(&admin).await?;
            let r = run_op(&subjects_[c].op, offset, n, 16).await?;
            let spent = acct.finish(&admin).await?;
            offset += n;
            let scripts = spent.stats.scripts();
            if scripts.calls != r.calls {
                return Err(format!(
                    "{}: {} script calls for {} decisions",
                    subjects_[c].name, scripts.calls, r.calls
                )
                .into());
            }
            script_us[c].push(scripts.usec as f64 / scripts.calls as f64);
            cpu_us[c].push(spent.cpu_micros / r.calls as f64);
            per_decision[c] = spent.stats.per_decision(r.calls);
            Ok(())
        },
    )
    .await?;
    let mut section = Section::default();
    section.heading("2b. Redis CPU per decision");
    section.line(format!(
        "{n} decisions per script per round, 16 in flight, {} rounds, after `CONFIG RESETSTAT`. \
         *script µs/call*: `usec_per_call` of `evalsha` in `INFO commandstats` (time inside the \
         script, including the commands it calls). *process CPU µs/decision*: growth of \
         `used_cpu_user + used_cpu_sys` divided by decisions (adds parsing, networking, event \
         loop). *commands*: calls per decision in `INFO commandstats` (the commands a script \
         calls are counted too). Medians of rounds (min–max of the script figure).\n",
        opts.rounds
    ));
    let mut rows = Vec::new();
    for c in 0..k {
        let (lo, hi) = crate::stats::range(&script_us[c]);
        rows.push(vec![
            subjects_[c].name.clone(),
            format!("**{:.2}** ({lo:.2}–{hi:.2})", median(&script_us[c])),
            format!("{:.2}", median(&cpu_us[c])),
            format!("`{}`", per_decision[c]),
        ]);
        if let Some(alg) = subjects_[c].target {
            let m = median(&script_us[c]);
            if matches!(alg, Algorithm::Gcra | Algorithm::TokenBucket) {
                section.targets.push(Target::check(
                    "2",
                    format!("Redis CPU per {alg} decision (evalsha usec_per_call)"),
                    "≤ 4 µs",
                    format!("{m:.2} µs"),
                    m <= 4.0,
                ));
            } else {
                section.targets.push(Target::new(
                    "2",
                    format!("Redis CPU per {alg} decision (evalsha usec_per_call)"),
                    "(no target)",
                    format!("{m:.2} µs"),
                    crate::common::Verdict::Info,
                ));
            }
        }
    }
    section.table(
        &[
            "script",
            "script µs/call",
            "process CPU µs/decision",
            "commands per decision",
        ],
        &rows,
    );
    admin.delete_matching("tgbench:*").await?;
    Ok(section)
}
