//! Item 3: Redis memory per key, per algorithm.

use tollgate_core::{Algorithm, Quota, Subject};

use crate::common::{
    connect, progress, redis_limiter, BenchResult, Opts, Section, Target, Verdict, ALGORITHMS,
};
use crate::redisinfo::Admin;
use crate::stats::median;

/// Runs item 3.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let conn = connect(&opts.redis_url).await?;
    let admin = Admin::connect(&opts.redis_url).await?;
    let keys_per_alg = opts.scale(10_000);
    // A quiet keyspace: earlier items' keys expiring meanwhile would skew
    // the `used_memory` growth.
    admin.delete_matching("tgbench*").await?;
    // Long-lived keys (a GCRA key lives one emission interval, 36 s here),
    // so none expires while it is measured.
    let quota = Quota::per_hour(100);
    let mut section = Section::default();
    section.heading("3. Redis memory per key");
    section.line(format!(
        "One decision on each of {keys_per_alg} fresh subjects (`u0`…) per algorithm, quota \
         100 per hour (so that no key expires while it is measured). *MEMORY USAGE*: median of `MEMORY USAGE key SAMPLES 0` over those keys — the \
         value, the key's name and Redis's per-key overhead, but not the entry in the \
         expires table. *used_memory growth*: the rise of `used_memory` divided by the number \
         of keys, which includes the expires entry and the hash tables' share (the fairer \
         figure for capacity planning). The sliding window log is also shown after 10 and \
         100 admitted requests on one key, since it stores one entry per request.\n"
    ));
    let mut rows = Vec::new();
    for alg in ALGORITHMS {
        progress!("memory: {alg}");
        let name = format!("mem-{}", alg.short_name());
        let limiter = redis_limiter(&conn, alg, quota, &name)?;
        let pattern = format!("tgbench:{name}:*");
        admin.delete_matching(&pattern).await?;
        // Let lazy frees and allocator settle.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let before = admin.used_memory().await?;
        let mut sample_keys = Vec::new();
        for i in 0..keys_per_alg {
            let s = Subject::from(format!("u{i}"));
            limiter.check(&s).await?;
            if i % (keys_per_alg / 100).max(1) == 0 {
                sample_keys.push(limiter.keys_for(&s).remove(0));
            }
        }
        let after = admin.used_memory().await?;
        let mut usage = Vec::new();
        for k in &sample_keys {
            if let Some(u) = admin.memory_usage(k).await? {
                usage.push(u as f64);
            }
        }
        if usage.is_empty() {
            return Err(format!("{alg}: every sampled key had expired before MEMORY USAGE").into());
        }
        let m = median(&usage);
        let growth = (after as f64 - before as f64) / keys_per_alg as f64;
        let key_len = sample_keys.first().map(String::len).unwrap_or(0);
        rows.push(vec![
            alg.to_string(),
            format!(
                "`{}` ({key_len} B)",
                sample_keys.first().cloned().unwrap_or_default()
            ),
            format!("**{m:.0} B**"),
            format!("{growth:.0} B"),
        ]);
        let what = format!("Redis memory per {alg} key (MEMORY USAGE)");
        if matches!(alg, Algorithm::Gcra | Algorithm::TokenBucket) {
            section.targets.push(Target::check(
                "3",
                what,
                "≤ 100 B",
                format!("{m:.0} B ({growth:.0} B with expires entry)"),
                m <= 100.0,
            ));
        } else {
            section.targets.push(Target::new(
                "3",
                what,
                "(no target)",
                format!("{m:.0} B"),
                Verdict::Info,
            ));
        }
        if alg == Algorithm::SlidingWindowLog {
            for n in [10u64, 100] {
                let s = Subject::from(format!("log{n}"));
                for _ in 0..n {
                    limiter.check(&s).await?;
                }
                let k = limiter.keys_for(&s).remove(0);
                let u = admin.memory_usage(&k).await?.unwrap_or(0);
                rows.push(vec![
                    format!("{alg}, after {n} requests"),
                    format!("`{k}`"),
                    format!("{u} B"),
                    "—".into(),
                ]);
            }
        }
        admin.delete_matching(&pattern).await?;
    }
    section.table(
        &[
            "algorithm",
            "key (length)",
            "MEMORY USAGE",
            "used_memory growth per key",
        ],
        &rows,
    );
    Ok(section)
}
