//! Item 6: locks and semaphores — uncontended acquire + release against two
//! raw round trips, and the contended hand-off (release → the next waiter
//! holds) against the ideal notified hand-off and a naive poller that
//! retries `SET NX PX` every 50 ms. A [`Locker`] and [`Semaphore`]s run
//! through the same loops ([`Acquire`]), interleaved in the same rounds.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tollgate_core::{Lease, LockOptions, Locker, RedisBackend, Semaphore};

use crate::common::{connect, progress, BenchResult, Opts, RawScript, Section, Target, Verdict};
use crate::stats::{median, percentile, ratio_cell, ratios, rotation, us};

/// The naive poller's sleep between attempts.
const POLL: Duration = Duration::from_millis(50);

/// Permits of the semaphore in the uncontended rows.
const SEM_PERMITS: u32 = 3;

/// Uncontended contenders, in table order.
const U_PING: usize = 0;
const U_RAW: usize = 1;
const U_LOCK: usize = 2;
const U_SEM: usize = 3;
const U_NAMES: [&str; 4] = [
    "one raw round trip (`PING`)",
    "two raw round trips (`SET k v NX PX` + `DEL k`)",
    "tollgate lock `acquire` + `release`",
    "tollgate `Semaphore` (N = 3) `acquire` + `release`",
];

/// Hand-off contenders, in table order.
const H_LOCK: usize = 0;
const H_SEM: usize = 1;
const H_FAIR: usize = 2;
const H_IDEAL: usize = 3;
const H_POLL: usize = 4;
const H_COLD: usize = 5;
const H_NAMES: [&str; 6] = [
    "tollgate lock `acquire` with `wait` (pub/sub wake-up)",
    "tollgate `Semaphore` (1 permit) `acquire` with `wait`",
    "tollgate fair `Semaphore` (1 permit) `acquire` with `wait`",
    "ideal raw hand-off (`DEL`+`PUBLISH` script → `SET NX PX`)",
    "naive poller (`SET NX PX`, sleep 50 ms)",
    "cold RTT: `PING` after the same idle pause",
];

/// What the tollgate rows measure: a [`Locker`] or a [`Semaphore`] — one
/// engine and one guard ([`Lease`]) behind two front doors.
trait Acquire: Clone + Send + Sync + 'static {
    /// `acquire` (waiting as `options` allow) when `wait`, else `try_acquire`.
    fn take(
        &self,
        name: String,
        options: &LockOptions,
        wait: bool,
    ) -> impl Future<Output = tollgate_core::Result<Lease>> + Send;
}

impl Acquire for Locker {
    async fn take(
        &self,
        name: String,
        options: &LockOptions,
        wait: bool,
    ) -> tollgate_core::Result<Lease> {
        if wait {
            self.acquire(name, options).await
        } else {
            self.try_acquire(name, options).await
        }
    }
}

impl Acquire for Semaphore {
    async fn take(
        &self,
        name: String,
        options: &LockOptions,
        wait: bool,
    ) -> tollgate_core::Result<Lease> {
        if wait {
            self.acquire(name, options).await
        } else {
            self.try_acquire(name, options).await
        }
    }
}

/// A holder and a waiter of one kind, each on its own connection.
struct Pair<A> {
    holder: A,
    waiter: A,
}

fn backend(conn: &MultiplexedConnection, url: &str) -> BenchResult<RedisBackend> {
    Ok(RedisBackend::from_connection(conn.clone()).with_pubsub(redis::Client::open(url)?))
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

/// One uncontended tollgate acquire + release of `name`.
async fn acquire_release(a: &impl Acquire, name: &str, plain: &LockOptions) -> BenchResult<()> {
    let lease = a.take(name.to_owned(), plain, true).await?;
    if !lease.release().await? {
        return Err("lease lost before release".into());
    }
    Ok(())
}

/// One tollgate hand-off: the holder takes `name`, a spawned waiter asks for
/// it with `waiting`, and the holder releases after `hold`. Returns when the
/// release was sent and when the waiter held.
async fn handoff<A: Acquire>(
    pair: &Pair<A>,
    name: String,
    hold: Duration,
    plain: &LockOptions,
    waiting: &LockOptions,
) -> BenchResult<(Instant, Instant)> {
    let lease = pair.holder.take(name.clone(), plain, false).await?;
    let w = pair.waiter.clone();
    let waiting = waiting.clone();
    let h = tokio::spawn(async move {
        let lease = w.take(name, &waiting, true).await?;
        let t = Instant::now();
        lease.release().await?;
        Ok::<_, tollgate_core::Error>(t)
    });
    tokio::time::sleep(hold).await;
    let t_release = Instant::now();
    lease.release().await?;
    Ok((t_release, h.await??))
}

/// The least any notified lock can do: release = one script doing `DEL` +
/// `PUBLISH`, waiter = `SET NX PX` on each message (`wake`).
async fn ideal_handoff(
    conns: (&MultiplexedConnection, &MultiplexedConnection),
    release: &RawScript,
    wake: &std::sync::Arc<tokio::sync::Notify>,
    key: String,
    hold: Duration,
) -> BenchResult<(Instant, Instant)> {
    if !raw_set_nx(conns.0, &key, "holder").await? {
        return Err("ideal lock unexpectedly held".into());
    }
    let conn = conns.1.clone();
    let key2 = key.clone();
    let wake = wake.clone();
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
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
        }
    });
    tokio::time::sleep(hold).await;
    let t_release = Instant::now();
    let mut c = conns.0.clone();
    redis::cmd("EVALSHA")
        .arg(release.sha.as_str())
        .arg(1)
        .arg(&key)
        .arg(&key)
        .query_async::<()>(&mut c)
        .await?;
    Ok((t_release, h.await??))
}

/// The naive waiter: `SET NX PX` until it succeeds, sleeping 50 ms between tries.
async fn poll_handoff(
    conns: (&MultiplexedConnection, &MultiplexedConnection),
    key: String,
    hold: Duration,
) -> BenchResult<(Instant, Instant)> {
    if !raw_set_nx(conns.0, &key, "holder").await? {
        return Err("poll lock unexpectedly held".into());
    }
    let conn = conns.1.clone();
    let key2 = key.clone();
    let h = tokio::spawn(async move {
        let t = loop {
            match raw_set_nx(&conn, &key2, "poller").await {
                Ok(true) => break Ok(Instant::now()),
                Ok(false) => tokio::time::sleep(POLL).await,
                Err(e) => break Err(e.to_string()),
            }
        };
        let _ = raw_del(&conn, &key2).await;
        t
    });
    tokio::time::sleep(hold).await;
    let t_release = Instant::now();
    raw_del(conns.0, &key).await?;
    Ok((t_release, h.await??))
}

/// Runs item 6.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let url = &opts.redis_url;
    let conn_a = connect(url).await?;
    let conn_b = connect(url).await?;
    let lock = |c: &MultiplexedConnection| -> BenchResult<Locker> {
        Ok(Locker::builder(backend(c, url)?)
            .prefix("tgbench")
            .build()?)
    };
    let sem = |c: &MultiplexedConnection, n: u32, fair: bool| -> BenchResult<Semaphore> {
        let b = Semaphore::builder(backend(c, url)?, n).prefix("tgbench");
        Ok(if fair { b.fair() } else { b }.build()?)
    };
    let locks = Pair {
        holder: lock(&conn_a)?,
        waiter: lock(&conn_b)?,
    };
    let sem3 = sem(&conn_a, SEM_PERMITS, false)?;
    let sems = Pair {
        holder: sem(&conn_a, 1, false)?,
        waiter: sem(&conn_b, 1, false)?,
    };
    let fairs = Pair {
        holder: sem(&conn_a, 1, true)?,
        waiter: sem(&conn_b, 1, true)?,
    };
    let plain = LockOptions::new();
    let waiting = LockOptions::new().wait(Duration::from_secs(10));

    // Uncontended: PING, raw SET NX PX + DEL, lock and semaphore acquire + release.
    let n = opts.scale(5_000);
    let k = U_NAMES.len();
    let mut p50 = vec![Vec::new(); k];
    let mut p99 = vec![Vec::new(); k];
    for i in 0..opts.scale(500) {
        acquire_release(&locks.holder, &format!("warm{i}"), &plain).await?;
        acquire_release(&sem3, &format!("warm{i}"), &plain).await?;
    }
    for round in 0..opts.rounds {
        progress!("locks: uncontended, round {}/{}", round + 1, opts.rounds);
        let mut s: Vec<Vec<u64>> = (0..k).map(|_| Vec::with_capacity(n)).collect();
        for i in 0..n {
            for c in rotation(i, k) {
                let t0 = Instant::now();
                match c {
                    U_PING => ping(&conn_a).await?,
                    U_RAW => {
                        let key = "tgbench:rawlock:{u}";
                        if !raw_set_nx(&conn_a, key, "me").await? {
                            return Err("raw lock unexpectedly held".into());
                        }
                        raw_del(&conn_a, key).await?;
                    }
                    U_LOCK => acquire_release(&locks.holder, "u", &plain).await?,
                    _ => acquire_release(&sem3, "u", &plain).await?,
                }
                s[c].push(t0.elapsed().as_nanos() as u64);
            }
        }
        for c in 0..k {
            s[c].sort_unstable();
            p50[c].push(percentile(&s[c], 50.0) as f64);
            p99[c].push(percentile(&s[c], 99.0) as f64);
        }
    }

    // Contended hand-off: tollgate's lock and semaphores, the ideal raw
    // hand-off, the naive poller, and a PING after the same idle pause (the
    // round trip under the same conditions: every hand-off starts with
    // processes waking from idle).
    let m = opts.scale(100).max(5);
    let kh = H_NAMES.len();
    let mut jitter = Jitter(0x9E37_79B9_7F4A_7C15);
    let mut handoffs: Vec<Vec<Vec<u64>>> = vec![Vec::new(); kh];
    let mut warm_rtt = Vec::new();
    let release_script = RawScript::new(
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
    // Warm the waiters' subscriptions.
    let warm = Duration::from_millis(20);
    handoff(&locks, "warm-handoff".into(), warm, &plain, &waiting).await?;
    handoff(&sems, "warm-handoff".into(), warm, &plain, &waiting).await?;
    handoff(&fairs, "warm-fair".into(), warm, &plain, &waiting).await?;
    let conns = (&conn_a, &conn_b);
    for round in 0..opts.rounds {
        progress!(
            "locks: hand-off, round {}/{} ({m} hand-offs each)",
            round + 1,
            opts.rounds
        );
        let mut s: Vec<Vec<u64>> = (0..kh).map(|_| Vec::with_capacity(m)).collect();
        let mut pings = Vec::with_capacity(m);
        for i in 0..m {
            // One hold time per hand-off, the same for every contender.
            let hold = Duration::from_millis(jitter.next_ms(5, 55));
            for c in rotation(i, kh) {
                let name = format!("h{round}-{i}");
                let (t_release, t_held) = match c {
                    H_LOCK => handoff(&locks, name, hold, &plain, &waiting).await?,
                    H_SEM => handoff(&sems, name, hold, &plain, &waiting).await?,
                    H_FAIR => handoff(&fairs, format!("f{name}"), hold, &plain, &waiting).await?,
                    H_IDEAL => {
                        let key = format!("tgbench:ideal:{{{name}}}");
                        ideal_handoff(conns, &release_script, &ideal_wake, key, hold).await?
                    }
                    H_POLL => poll_handoff(conns, format!("tgbench:poll:{{{name}}}"), hold).await?,
                    _ => {
                        tokio::time::sleep(hold).await;
                        let t = Instant::now();
                        ping(&conn_a).await?;
                        (t, Instant::now())
                    }
                };
                s[c].push(t_held.saturating_duration_since(t_release).as_nanos() as u64);
            }
            let t0 = Instant::now();
            ping(&conn_a).await?;
            pings.push(t0.elapsed().as_nanos() as u64);
        }
        for (c, mut v) in s.into_iter().enumerate() {
            v.sort_unstable();
            handoffs[c].push(v);
        }
        pings.sort_unstable();
        warm_rtt.push(percentile(&pings, 50.0) as f64);
    }

    let mut section = Section::default();
    section.heading("6. Locks");
    section.line(format!(
        "*Uncontended*: {n} sequential iterations per contender per round, interleaved call by \
         call, {} rounds, default `LockOptions` (30 s TTL, watchdog on); the semaphore has \
         {SEM_PERMITS} permits per name and one holder at a time. Ratios are per round against \
         the two raw round trips (`SET NX PX` + `DEL`) of the same round.\n",
        opts.rounds
    ));
    let mut rows = Vec::new();
    for (c, name) in U_NAMES.iter().enumerate() {
        rows.push(vec![
            (*name).to_owned(),
            us(median(&p50[c])),
            us(median(&p99[c])),
            ratio_cell(&ratios(&p50[c], &p50[U_RAW])),
            ratio_cell(&ratios(&p99[c], &p99[U_RAW])),
        ]);
    }
    section.table(
        &["contender", "p50", "p99", "p50 ÷ 2 raw", "p99 ÷ 2 raw"],
        &rows,
    );
    let unc = median(&ratios(&p50[U_LOCK], &p50[U_RAW]));
    section.targets.push(Target::new(
        "6",
        "uncontended lock acquire + release p50 ÷ two raw round trips",
        "(reported)",
        format!("{unc:.2}×"),
        Verdict::Info,
    ));
    let unc_sem = median(&ratios(&p50[U_SEM], &p50[U_RAW]));
    section.targets.push(Target::check(
        "6",
        "uncontended semaphore (N = 3) acquire + release p50 ÷ two raw round trips",
        "≤ 1.5×",
        format!("{unc_sem:.2}× (lock {unc:.2}×)"),
        unc_sem <= 1.5,
    ));

    section.line(format!(
        "*Contended hand-off*: a holder (its own connection) keeps the lock or permit 5–55 ms \
         (pseudo-random, the same hold for every contender in an iteration), then releases; the \
         waiter (another connection) records when it holds. tollgate's waiters (the lock, a \
         semaphore of 1 permit, and a fair one) wake on their pub/sub notification; the *ideal \
         raw hand-off* is the least any notified lock can do — release = one script doing \
         `DEL` + `PUBLISH`, waiter = `SET NX PX` on each message of a pattern subscription — so \
         it shows the cost of two round trips plus the wake-ups here; the naive poller retries \
         `SET NX PX` every 50 ms. *Cold RTT*: a `PING` sent after the same 5–55 ms idle pause \
         (the round trip under the hand-off's conditions: every process wakes from idle); \
         *warm RTT*: a `PING` right after another command. {m} hand-offs per contender per \
         round, interleaved, {} rounds; cells are medians of rounds; *RTTs* are per round, p50 \
         ÷ that round's cold-RTT p50 (and ÷ warm-RTT p50).\n",
        opts.rounds
    ));
    // Per round, the p-th percentile of variant `c`'s hand-offs.
    let pct = |c: usize, p: f64| -> Vec<f64> {
        handoffs[c]
            .iter()
            .map(|v| percentile(v, p) as f64)
            .collect()
    };
    let cold_rtt = pct(H_COLD, 50.0);
    let mut rows = Vec::new();
    let mut in_rtt = Vec::new();
    for (c, name) in H_NAMES.iter().enumerate() {
        let h50 = pct(c, 50.0);
        let (cold, warm) = (
            median(&ratios(&h50, &cold_rtt)),
            median(&ratios(&h50, &warm_rtt)),
        );
        rows.push(vec![
            (*name).to_owned(),
            us(median(&h50)),
            us(median(&pct(c, 99.0))),
            format!("{cold:.1} cold RTT ({warm:.1} warm)"),
        ]);
        in_rtt.push((cold, warm));
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
    let (cold, warm) = in_rtt[H_LOCK];
    section.targets.push(Target::check(
        "6",
        "contended lock hand-off p50 (release → next waiter holds), in round trips",
        "≤ 3 round trips",
        format!(
            "{cold:.1} cold RTT ({warm:.1} warm RTT; ideal raw hand-off {:.1} cold)",
            in_rtt[H_IDEAL].0
        ),
        cold <= 3.0,
    ));
    let ((sem, sem_w), (fair, fair_w)) = (in_rtt[H_SEM], in_rtt[H_FAIR]);
    section.targets.push(Target::check(
        "6",
        "semaphore hand-off p50 (1 permit; fair, 1 permit), in round trips",
        "≤ 3 round trips",
        format!("{sem:.1}; fair {fair:.1} cold RTT ({sem_w:.1}; {fair_w:.1} warm RTT)"),
        sem <= 3.0 && fair <= 3.0,
    ));
    let vs_ideal = ratios(&pct(H_LOCK, 50.0), &pct(H_IDEAL, 50.0));
    let vs_poll = ratios(&pct(H_LOCK, 50.0), &pct(H_POLL, 50.0));
    section.targets.push(Target::new(
        "6",
        "contended lock hand-off p50, tollgate ÷ ideal raw hand-off; ÷ 50 ms poller",
        "(reported)",
        format!("{:.2}×; {:.4}×", median(&vs_ideal), median(&vs_poll)),
        Verdict::Info,
    ));
    Ok(section)
}
