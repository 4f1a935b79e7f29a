//! Item 6: locks — uncontended acquire + release against two raw round trips,
//! and the contended hand-off (release → the next waiter holds) against a
//! naive poller that retries `SET NX PX` every 50 ms.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tollgate_core::{LockOptions, Locker, RedisBackend};

use crate::common::{connect, progress, BenchResult, Opts, Section, Target};
use crate::stats::{median, percentile, ratio_cell, ratios, rotation, us};

/// The naive poller's sleep between attempts.
const POLL: Duration = Duration::from_millis(50);

fn locker(conn: &MultiplexedConnection, url: &str) -> BenchResult<Locker> {
    let backend =
        RedisBackend::from_connection(conn.clone()).with_pubsub(redis::Client::open(url)?);
    Ok(Locker::builder(backend).prefix("tgbench").build()?)
}

/// A small deterministic generator for the holder's hold times.
struct Jitter(u64);

impl Jitter {
    fn next_ms(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + self.0 % (hi - lo)
    }
}

async fn raw_set_nx(conn: &MultiplexedConnection, key: &str, token: &str) -> BenchResult<bool> {
    let mut c = conn.clone();
    let r: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut c)
        .await?;
    Ok(r.is_some())
}

async fn raw_del(conn: &MultiplexedConnection, key: &str) -> BenchResult<()> {
    let mut c = conn.clone();
    redis::cmd("DEL").arg(key).query_async::<()>(&mut c).await?;
    Ok(())
}

async fn ping(conn: &MultiplexedConnection) -> BenchResult<()> {
    let mut c = conn.clone();
    redis::cmd("PING").query_async::<()>(&mut c).await?;
    Ok(())
}

/// The naive waiter: `SET NX PX` until it succeeds, sleeping 50 ms between tries.
async fn poll_until_held(conn: &MultiplexedConnection, key: &str) -> BenchResult<Instant> {
    loop {
        if raw_set_nx(conn, key, "poller").await? {
            return Ok(Instant::now());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs item 6.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let url = &opts.redis_url;
    let conn_a = connect(url).await?;
    let conn_b = connect(url).await?;
    let holder = locker(&conn_a, url)?;
    let waiter = locker(&conn_b, url)?;
    let plain = LockOptions::new();
    let waiting = LockOptions::new().wait(Duration::from_secs(10));

    // Uncontended: tollgate acquire + release, raw SET NX PX + DEL, one PING.
    let n = opts.scale(5_000);
    let mut p50 = vec![Vec::new(); 3];
    let mut p99 = vec![Vec::new(); 3];
    for i in 0..opts.scale(500) {
        holder
            .acquire(format!("warm{i}"), &plain)
            .await?
            .release()
            .await?;
    }
    for round in 0..opts.rounds {
        progress!("locks: uncontended, round {}/{}", round + 1, opts.rounds);
        let mut s: Vec<Vec<u64>> = (0..3).map(|_| Vec::with_capacity(n)).collect();
        for i in 0..n {
            for c in rotation(i, 3) {
                let t0 = Instant::now();
                match c {
                    0 => ping(&conn_a).await?,
                    1 => {
                        let key = "tgbench:rawlock:{u}";
                        if !raw_set_nx(&conn_a, key, "me").await? {
                            return Err("raw lock unexpectedly held".into());
                        }
                        raw_del(&conn_a, key).await?;
                    }
                    _ => {
                        let lease = holder.acquire("u", &plain).await?;
                        if !lease.release().await? {
                            return Err("lease lost before release".into());
                        }
                    }
                }
                s[c].push(t0.elapsed().as_nanos() as u64);
            }
        }
        for c in 0..3 {
            s[c].sort_unstable();
            p50[c].push(percentile(&s[c], 50.0) as f64);
            p99[c].push(percentile(&s[c], 99.0) as f64);
        }
    }

    // Contended hand-off: tollgate, the ideal raw hand-off, the naive poller,
    // and a PING after the same idle pause (the round trip under the same
    // conditions: every hand-off starts with processes waking from idle).
    let m = opts.scale(100).max(5);
    let mut jitter = Jitter(0x9E37_79B9_7F4A_7C15);
    let mut handoff: Vec<Vec<Vec<u64>>> = vec![Vec::new(); 4];
    let mut warm_rtt = Vec::new();
    let release_script = crate::common::RawScript::new(
        "release-and-publish",
        "redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[1], 'released') return 1",
    );
    release_script.load(&conn_a).await?;
    let ideal_wake = std::sync::Arc::new(tokio::sync::Notify::new());
    {
        let mut pubsub = redis::Client::open(url.as_str())?
            .get_async_pubsub()
            .await?;
        pubsub.psubscribe("tgbench:ideal:*").await?;
        let wake = ideal_wake.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut messages = pubsub.into_on_message();
            while messages.next().await.is_some() {
                wake.notify_one();
            }
        });
    }
    // Warm the waiter's subscription.
    {
        let lease = holder.try_acquire("warm-handoff", &plain).await?;
        let w = waiter.clone();
        let waiting2 = waiting.clone();
        let h = tokio::spawn(async move { w.acquire("warm-handoff", &waiting2).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        lease.release().await?;
        h.await??.release().await?;
    }
    for round in 0..opts.rounds {
        progress!(
            "locks: hand-off, round {}/{} ({m} hand-offs each)",
            round + 1,
            opts.rounds
        );
        let mut s: Vec<Vec<u64>> = (0..4).map(|_| Vec::with_capacity(m)).collect();
        let mut pings = Vec::with_capacity(m);
        for i in 0..m {
            for c in rotation(i, 4) {
                let hold = Duration::from_millis(jitter.next_ms(5, 55));
                let t_release;
                let t_held;
                match c {
                    0 => {
                        let name = format!("h{round}-{i}");
                        let lease = holder.try_acquire(name.as_str(), &plain).await?;
                        let w = waiter.clone();
                        let waiting2 = waiting.clone();
                        let h = tokio::spawn(async move {
                            let lease = w.acquire(name.as_str(), &waiting2).await?;
                            let t = Instant::now();
                            lease.release().await?;
                            Ok::<_, tollgate_core::Error>(t)
                        });
                        tokio::time::sleep(hold).await;
                        t_release = Instant::now();
                        lease.release().await?;
                        t_held = h.await??;
                    }
                    1 => {
                        let key = format!("tgbench:ideal:{{h{round}-{i}}}");
                        if !raw_set_nx(&conn_a, &key, "holder").await? {
                            return Err("ideal lock unexpectedly held".into());
                        }
                        let conn = conn_b.clone();
                        let key2 = key.clone();
                        let wake = ideal_wake.clone();
                        let h = tokio::spawn(async move {
                            loop {
                                let notified = wake.notified();
                                tokio::pin!(notified);
                                notified.as_mut().enable();
                                if raw_set_nx(&conn, &key2, "waiter")
                                    .await
                                    .map_err(|e| e.to_string())?
                                {
                                    let t = Instant::now();
                                    let _ = raw_del(&conn, &key2).await;
                                    return Ok::<_, String>(t);
                                }
                                let _ =
                                    tokio::time::timeout(Duration::from_secs(1), notified).await;
                            }
                        });
                        tokio::time::sleep(hold).await;
                        t_release = Instant::now();
                        let mut c = conn_a.clone();
                        redis::cmd("EVALSHA")
                            .arg(release_script.sha.as_str())
                            .arg(1)
                            .arg(&key)
                            .arg(&key)
                            .query_async::<()>(&mut c)
                            .await?;
                        t_held = h.await??;
                    }
                    2 => {
                        let key = format!("tgbench:poll:{{h{round}-{i}}}");
                        if !raw_set_nx(&conn_a, &key, "holder").await? {
                            return Err("poll lock unexpectedly held".into());
                        }
                        let conn = conn_b.clone();
                        let key2 = key.clone();
                        let h = tokio::spawn(async move {
                            let t = poll_until_held(&conn, &key2).await;
                            let _ = raw_del(&conn, &key2).await;
                            t.map_err(|e| e.to_string())
                        });
                        tokio::time::sleep(hold).await;
                        t_release = Instant::now();
                        raw_del(&conn_a, &key).await?;
                        t_held = h.await??;
                    }
                    _ => {
                        tokio::time::sleep(hold).await;
                        t_release = Instant::now();
                        ping(&conn_a).await?;
                        t_held = Instant::now();
                    }
                }
                s[c].push(t_held.saturating_duration_since(t_release).as_nanos() as u64);
            }
            let t0 = Instant::now();
            ping(&conn_a).await?;
            pings.push(t0.elapsed().as_nanos() as u64);
        }
        for (c, v) in s.into_iter().enumerate() {
            handoff[c].push(v);
        }
        pings.sort_unstable();
        warm_rtt.push(percentile(&pings, 50.0) as f64);
    }

    let mut section = Section::default();
    section.heading("6. Locks");
    section.line(format!(
        "*Uncontended*: {n} sequential iterations per contender per round, interleaved call by \
         call, {} rounds, default `LockOptions` (30 s TTL, watchdog on). Ratios are per round \
         against the two raw round trips (`SET NX PX` + `DEL`) of the same round.\n",
        opts.rounds
    ));
    let names = [
        "one raw round trip (`PING`)",
        "two raw round trips (`SET k v NX PX` + `DEL k`)",
        "tollgate `acquire` + `release`",
    ];
    let mut rows = Vec::new();
    for c in 0..3 {
        let r50 = ratios(&p50[c], &p50[1]);
        let r99 = ratios(&p99[c], &p99[1]);
        rows.push(vec![
            names[c].to_owned(),
            us(median(&p50[c])),
            us(median(&p99[c])),
            ratio_cell(&r50),
            ratio_cell(&r99),
        ]);
    }
    section.table(
        &["contender", "p50", "p99", "p50 ÷ 2 raw", "p99 ÷ 2 raw"],
        &rows,
    );
    let unc = median(&ratios(&p50[2], &p50[1]));
    section.targets.push(Target::new(
        "6",
        "uncontended acquire + release p50 ÷ two raw round trips",
        "(reported)",
        format!("{unc:.2}×"),
        crate::common::Verdict::Info,
    ));

    section.line(format!(
        "*Contended hand-off*: a holder (its own connection) keeps the lock 5–55 ms \
         (pseudo-random, the same sequence for every contender), then releases; the waiter \
         (another connection) records when it holds the lock. tollgate's waiter wakes on \
         its pub/sub notification; the *ideal raw hand-off* is the least any notified lock \
         can do — release = one script doing `DEL` + `PUBLISH`, waiter = `SET NX PX` on \
         each message of a pattern subscription — so it shows the cost of two round trips \
         plus the wake-ups here; the naive poller retries `SET NX PX` every 50 ms. *Cold \
         RTT*: a `PING` sent after the same 5–55 ms idle pause (the round trip under the \
         hand-off's conditions: every process wakes from idle); *warm RTT*: a `PING` right \
         after another command. {m} hand-offs per contender per round, interleaved, {} \
         rounds; cells are medians of rounds; *RTTs* are per round, p50 ÷ that round's \
         cold-RTT p50 (and ÷ warm-RTT p50).\n",
        opts.rounds
    ));
    let hnames = [
        "tollgate `acquire` with `wait` (pub/sub wake-up)",
        "ideal raw hand-off (`DEL`+`PUBLISH` script → `SET NX PX`)",
        "naive poller (`SET NX PX`, sleep 50 ms)",
        "cold RTT: `PING` after the same idle pause",
    ];
    let mut rows = Vec::new();
    let mut cold_rtt = Vec::new();
    let mut sorted = handoff;
    for v in sorted.iter_mut().flatten() {
        v.sort_unstable();
    }
    // Per round, the p50 of variant `c`'s hand-offs.
    let p50_of = |c: usize| -> Vec<f64> {
        sorted[c]
            .iter()
            .map(|v| percentile(v, 50.0) as f64)
            .collect()
    };
    for v in &sorted[3] {
        cold_rtt.push(percentile(v, 50.0) as f64);
    }
    let mut in_cold = Vec::new();
    for (c, name) in hnames.iter().enumerate() {
        let h50 = p50_of(c);
        let h99: Vec<f64> = sorted[c]
            .iter()
            .map(|v| percentile(v, 99.0) as f64)
            .collect();
        let cold = ratios(&h50, &cold_rtt);
        let warm = ratios(&h50, &warm_rtt);
        rows.push(vec![
            (*name).to_owned(),
            us(median(&h50)),
            us(median(&h99)),
            format!("{:.1} cold RTT ({:.1} warm)", median(&cold), median(&warm)),
        ]);
        in_cold.push((median(&cold), median(&warm)));
    }
    rows.push(vec![
        "warm RTT: `PING` right after another command".into(),
        us(median(&warm_rtt)),
        "—".into(),
        "—".into(),
    ]);
    section.table(
        &["waiter", "hand-off p50", "hand-off p99", "p50 in RTTs"],
        &rows,
    );
    let (cold, warm) = in_cold[0];
    section.targets.push(Target::check(
        "6",
        "contended hand-off p50 (release → next waiter holds), in round trips",
        "≤ 3 round trips",
        format!(
            "{cold:.1} cold RTT ({warm:.1} warm RTT; ideal raw hand-off {:.1} cold)",
            in_cold[1].0
        ),
        cold <= 3.0,
    ));
    let vs_ideal = ratios(&p50_of(0), &p50_of(1));
    let vs_poll = ratios(&p50_of(0), &p50_of(2));
    section.targets.push(Target::new(
        "6",
        "contended hand-off p50, tollgate ÷ ideal raw hand-off; ÷ 50 ms poller",
        "(reported)",
        format!("{:.2}×; {:.4}×", median(&vs_ideal), median(&vs_poll)),
        crate::common::Verdict::Info,
    ));
    Ok(section)
}
