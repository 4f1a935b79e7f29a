//! Lean batches: checks of one limiter (GCRA, token bucket, fixed window,
//! one quota, no wait) decided in one call of the limiter's lean script,
//! which replies one figure per check, decide and report exactly as the same
//! checks sent one call each — decision by decision, figure by figure, and
//! stored value by stored value — on random schedules on a virtual clock,
//! with foreign values in the keys and blocked subjects; each batch is
//! proved to be a call of the lean script (not a quiet fallback to the
//! batch script, which would pass the same way). Checks past their
//! deadline take nothing, as in a single call.

mod coalesce_common;
mod rate_common;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tollgate_core::store::{AdminBackend, RateReply, RateRequest};
use tollgate_core::{Algorithm, Coalescing, Error, Quota, RateBackend, RedisBackend};

use coalesce_common::*;
use rate_common::*;

const SUBJECTS: [&str; 4] = ["s0", "s1", "s2", "s3"];

/// What a step does before its batch: nothing mostly, else a foreign value
/// under a subject's key, or a block set or lifted. `<now+800000>` is the
/// step's instant plus 0.8 s and `<w>` its fixed window's index: values a
/// script reads as its own shape but no script writes (beyond 2^63 once
/// scaled by a large `per`, a count beyond any limit, a fraction of a µs),
/// which a reply truncated to an integer would misreport; and this window's
/// count in a shape no script writes but the single script reads (`0<w>`).
const FOREIGN: [&[&str]; 13] = [
    &["SET", "garbage"],
    &["SET", "12:abc"],
    &["SET", "99999999999999999999"],
    &["SET", "9000000000000000"],
    &["SET", "<w>:99999999999999999999"],
    &["SET", "<now+800000>.5"],
    &["SET", "-5"],
    &["SET", "1:2:3"],
    &["SET", "1800000000000000:3"],
    &["SET", "0:1"],
    &["SET", "0<w>:3"],
    &["HSET", "f", "v"],
    &["ZADD", "1", "m"],
];

/// One step of a schedule: what happens to the keys, then a batch of
/// (subject, cost) at one instant.
struct Step {
    at: u64,
    touch: Option<(usize, Touch)>,
    batch: Vec<(usize, u64)>,
}

#[derive(Clone, Copy)]
enum Touch {
    Foreign(usize),
    Block,
    /// A block lifted, and its key then holding a value with no TTL: not
    /// a block.
    StaleBlock,
    Unblock,
}

fn schedule(seed: u64, steps: usize, capacity: u64, period: u64) -> Vec<Step> {
    let mut rng = Rng(seed | 1);
    let mut at = 1_800_000_000_000_000 + seed * 7_919;
    (0..steps)
        .map(|_| {
            at += match rng.below(10) {
                0..=5 => 0,
                6..=8 => rng.below(period / 4),
                _ => rng.below(2 * period),
            };
            let touch = match rng.below(12) {
                0 => Some(Touch::Foreign(rng.below(FOREIGN.len() as u64) as usize)),
                1 => Some(Touch::Block),
                2 => Some(Touch::StaleBlock),
                3..=4 => Some(Touch::Unblock),
                _ => None,
            }
            .map(|t| (rng.below(SUBJECTS.len() as u64) as usize, t));
            let size = 1 + rng.below(12) as usize;
            let batch = (0..size)
                .map(|_| {
                    let subject = rng.below(SUBJECTS.len() as u64) as usize;
                    // Mostly one unit, as a limiter sends; sometimes more.
                    let cost = if rng.below(4) == 0 {
                        rng.below(capacity + 2)
                    } else {
                        1
                    };
                    (subject, cost)
                })
                .collect();
            Step { at, touch, batch }
        })
        .collect()
}

/// Each subject's request (its key, then its block key), under `prefix`.
fn requests(alg: Algorithm, quota: Quota, prefix: &str) -> Vec<RateRequest> {
    SUBJECTS
        .iter()
        .map(|s| {
            let mut r = request_for(alg, &[quota], s, prefix);
            let block = format!("{}:block", r.keys[0]);
            r.keys.push(block);
            r
        })
        .collect()
}

/// Applies a step's touch at `at` to one subject's keys; blocks are set and
/// lifted as an operator does (`admin`), which also keeps the limiter's
/// block index that batches of many subjects read.
async fn touch(
    conn: &mut redis::aio::ConnectionManager,
    admin: &RedisBackend,
    r: &RateRequest,
    touch: Touch,
    at: u64,
) {
    let (key, block) = (&r.keys[0], &r.keys[1]);
    match touch {
        Touch::Foreign(f) => {
            let _: () = conn.del(key).await.unwrap();
            let mut cmd = redis::cmd(FOREIGN[f][0]);
            cmd.arg(key);
            let w = at / r.quotas[0].period_micros();
            for v in &FOREIGN[f][1..] {
                cmd.arg(
                    v.replace("<now+800000>", &(at + 800_000).to_string())
                        .replace("<w>", &w.to_string()),
                );
            }
            let _: redis::Value = cmd.query_async(conn).await.unwrap();
        }
        Touch::Block => {
            let hour = Duration::from_secs(3600);
            admin.set_block(block, hour, false).await.unwrap();
        }
        Touch::StaleBlock => {
            admin.unblock(block).await.unwrap();
            let _: () = conn.set(block, "garbage").await.unwrap();
        }
        Touch::Unblock => {
            admin.unblock(block).await.unwrap();
        }
    }
}

/// Reads a pair of keys (the single calls' and the lean batch's) at once:
/// each one's type or string value, and whether it has a TTL. The clock is
/// virtual, so no key may expire on the real one: a pair where either key
/// is about to (or did) is deleted and read as absent, the others made
/// persistent.
const READ_PAIR: &str = r#"
local out = {}
local short = false
for i = 1, 2 do
  local t = redis.call('PTTL', KEYS[i])
  if t == -2 or (t >= 0 and t < 50) then short = true end
end
for i = 1, 2 do
  if short then
    redis.call('DEL', KEYS[i])
    out[i] = 'none'
  else
    local kind = redis.call('TYPE', KEYS[i])['ok']
    local ttl = redis.call('PTTL', KEYS[i]) > 0 and 'ttl' or 'no ttl'
    if kind == 'string' then kind = redis.call('GET', KEYS[i]) end
    redis.call('PERSIST', KEYS[i])
    out[i] = kind .. ' ' .. ttl
  end
end
return out
"#;

/// The SHA1 of an algorithm's lean script, as the crate assembles it.
fn lean_sha(alg: Algorithm) -> String {
    macro_rules! lean {
        ($file:literal) => {
            concat!(
                "local now, cost, n\n",
                include_str!("../lua/rate_prelude.lua"),
                include_str!(concat!("../lua/", $file, "_state.lua")),
                include_str!(concat!("../lua/", $file, "_lean.lua")),
                include_str!("../lua/rate_lean.lua")
            )
        };
    }
    let body = match alg {
        Algorithm::Gcra => lean!("gcra"),
        Algorithm::TokenBucket => lean!("token_bucket"),
        Algorithm::FixedWindow => lean!("fixed_window"),
        other => panic!("{other:?} has no lean script"),
    };
    redis::Script::new(body).get_hash().to_owned()
}

/// Runs `steps` in lockstep: on `a`'s keys one call per check, on `b`'s
/// each step's batch in one call; returns both runs' replies and, after
/// each step, each subject's stored state in both.
#[allow(clippy::too_many_arguments)]
async fn run(
    single: &RedisBackend,
    batched: &RedisBackend,
    conn: &mut redis::aio::ConnectionManager,
    alg: Algorithm,
    quota: Quota,
    (a, b): (&str, &str),
    steps: &[Step],
) -> (Vec<RateReply>, Vec<RateReply>, Vec<Vec<(String, String)>>) {
    let (base_a, base_b) = (requests(alg, quota, a), requests(alg, quota, b));
    let (mut alone, mut lean, mut states) = (Vec::new(), Vec::new(), Vec::new());
    let read = redis::Script::new(READ_PAIR);
    for step in steps {
        if let Some((s, t)) = step.touch {
            touch(conn, single, &base_a[s], t, step.at).await;
            touch(conn, single, &base_b[s], t, step.at).await;
        }
        let batch = |base: &[RateRequest]| -> Vec<RateRequest> {
            step.batch
                .iter()
                .map(|&(s, cost)| {
                    let mut r = base[s].clone();
                    r.cost = cost;
                    r.now_micros = Some(step.at);
                    r
                })
                .collect()
        };
        for r in &batch(&base_a) {
            alone.push(single.check_rate(r).await.expect("a single call"));
        }
        // The lean script ran: no script was loaded before the batch, and
        // its script is loaded after it.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(conn)
            .await
            .unwrap();
        let answers = batched
            .check_rate_batch(&batch(&base_b))
            .await
            .expect("a call");
        let loaded: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(lean_sha(alg))
            .query_async(conn)
            .await
            .unwrap();
        assert_eq!(loaded, [true], "{alg:?} at {}: no lean call", step.at);
        lean.extend(answers.into_iter().map(|a| a.expect("a decision")));
        let mut state = Vec::new();
        for (x, y) in base_a.iter().zip(&base_b) {
            let pair: (String, String) = read
                .key(&x.keys[0])
                .key(&y.keys[0])
                .invoke_async(conn)
                .await
                .unwrap();
            state.push(pair);
        }
        states.push(state);
    }
    (alone, lean, states)
}

/// A refusal by a block (an hour long here, which no quota's figure
/// reaches).
fn blocked(r: &RateReply) -> bool {
    let o = r.outcomes[0];
    !r.allowed
        && o.remaining == 0
        && o.reset_after_micros == o.retry_after_micros
        && o.retry_after_micros == o.next_after_micros
        && o.retry_after_micros > 1_000_000_000
}

/// A blocked reply's figures are the block's PTTL, read at different
/// times by the two runs: equal within the time the runs took.
fn same(a: &RateReply, b: &RateReply) -> bool {
    if blocked(a) && blocked(b) {
        let (x, y) = (
            a.outcomes[0].retry_after_micros,
            b.outcomes[0].retry_after_micros,
        );
        return a.now_micros == b.now_micros && x.abs_diff(y) < 10_000_000;
    }
    a == b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lean_batches_decide_and_report_as_single_calls() {
    let server = server();
    let mut conn = server.connection_manager().await;
    let single = RedisBackend::from_connection(conn.clone()).with_coalescing(Coalescing::off());
    let batched = RedisBackend::from_connection(conn.clone());
    let steps = std::env::var("TOLLGATE_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    for alg in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        // Whole and fractional emission intervals (5 and 7 a second, and
        // 1283 a minute: units of 1/1283 µs, a large `per`; per minute, as
        // per second its keys would live 1 ms on the real clock and expire
        // between two single calls), a burst (a window has none: a longer
        // window instead).
        let third = match alg {
            Algorithm::FixedWindow => q(40, 2),
            _ => Quota::per_minute(100).with_burst(10).unwrap(),
        };
        let quotas = [q(5, 1), q(7, 1), third, Quota::per_minute(1283)];
        for (i, quota) in quotas.iter().enumerate() {
            for seed in [3u64, 11] {
                let capacity = alg.capacity(quota);
                let schedule = schedule(seed, steps, capacity, quota.period_micros());
                let (a, b) = (unique_prefix(), unique_prefix());
                let (alone, lean, states) = run(
                    &single,
                    &batched,
                    &mut conn,
                    alg,
                    *quota,
                    (&a, &b),
                    &schedule,
                )
                .await;
                let admitted = alone.iter().filter(|r| r.allowed).count();
                let refused = alone.iter().filter(|r| !r.allowed && !blocked(r)).count();
                assert!(
                    admitted > 0 && refused > 0 && alone.iter().any(blocked),
                    "{alg:?} quota {i} seed {seed}: the schedule admits, refuses and blocks"
                );
                for (n, (x, y)) in alone.iter().zip(&lean).enumerate() {
                    assert!(
                        same(x, y),
                        "{alg:?} quota {i} seed {seed}, check {n}: single {x:?} lean {y:?}"
                    );
                }
                assert_eq!(alone.len(), lean.len());
                for (n, state) in states.iter().enumerate() {
                    let step = &schedule[n];
                    let (x, y): (Vec<_>, Vec<_>) = state.iter().cloned().unzip();
                    assert_eq!(
                        x, y,
                        "{alg:?} quota {i} seed {seed}, step {n} at {} (batch {:?}): stored state",
                        step.at, step.batch
                    );
                }
            }
        }
    }
}

/// In a lean batch on the server's clock, a check past its deadline is
/// answered as late and takes nothing; the others are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_check_in_a_lean_batch_takes_nothing() {
    let server = server();
    let conn = server.connection_manager().await;
    let backend = RedisBackend::from_connection(conn);
    for alg in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let prefix = unique_prefix();
        let base = request_for(alg, &[q(3, 3600)], "late", &prefix);
        // One answer teaches the backend the server's clock.
        let first = backend.check_rate(&base).await.unwrap();
        assert_eq!(first.outcomes[0].remaining, 2, "{alg:?}");
        let mut late = base.clone();
        late.deadline = Some(Instant::now() - Duration::from_secs(5));
        let mut in_time = base.clone();
        in_time.deadline = Some(Instant::now() + Duration::from_secs(60));
        let answers = backend
            .check_rate_batch(&[late.clone(), base.clone(), late, in_time])
            .await
            .unwrap();
        assert!(
            matches!(answers[0], Err(Error::Timeout(_))),
            "{alg:?}: {answers:?}"
        );
        assert!(
            matches!(answers[2], Err(Error::Timeout(_))),
            "{alg:?}: {answers:?}"
        );
        let remaining = |i: usize| answers[i].as_ref().unwrap().outcomes[0].remaining;
        assert_eq!(
            (remaining(1), remaining(3)),
            (1, 0),
            "{alg:?}: late checks took nothing"
        );
    }
}

/// The largest lean call (4000 checks: `unpack`'s limit leaves room for
/// little more) is one call of the lean script, and its packed reply
/// answers every check in order: 1000 subjects checked 4 times each
/// against a quota of 3, one of them blocked for an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_lean_call_answers_every_check() {
    // A server of its own: it flushes the scripts, which the lockstep
    // test beside it flushes and reads too.
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await);
    let mut conn = server.connection_manager().await;
    for alg in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let prefix = unique_prefix();
        let base: Vec<RateRequest> = (0..1000)
            .map(|i| {
                let mut r = request_for(alg, &[q(3, 3600)], &format!("s{i}"), &prefix);
                let block = format!("{}:block", r.keys[0]);
                r.keys.push(block);
                r
            })
            .collect();
        let hour = Duration::from_secs(3600);
        backend
            .set_block(&base[7].keys[1], hour, false)
            .await
            .unwrap();
        let batch: Vec<RateRequest> = (0..4).flat_map(|_| base.iter().cloned()).collect();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        let answers = backend.check_rate_batch(&batch).await.expect("a call");
        let loaded: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(lean_sha(alg))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(loaded, [true], "{alg:?}: no lean call");
        assert_eq!(answers.len(), 4000, "{alg:?}");
        for (i, answer) in answers.iter().enumerate() {
            let (round, s) = (i / 1000, i % 1000);
            let r = answer.as_ref().expect("a decision");
            if s == 7 {
                assert!(blocked(r), "{alg:?}: check {i} {r:?}");
            } else {
                assert_eq!(r.allowed, round < 3, "{alg:?}: check {i} {r:?}");
                let left = 2u64.saturating_sub(round as u64);
                assert_eq!(r.outcomes[0].remaining, left, "{alg:?}: check {i} {r:?}");
            }
        }
    }
}

/// A limiter's clock past what a lean reply's doubles hold exactly (2^53
/// µs) still gets decisions when its checks are coalesced, as single calls
/// do: they go in the batch script's call, not a lean one.
#[tokio::test(flavor = "current_thread")]
async fn a_clock_past_exact_doubles_is_decided_coalesced() {
    let server = server();
    let backend = RedisBackend::from_connection(server.connection_manager().await);
    let limiter = tollgate_core::RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(q(100, 3600))
        .prefix(unique_prefix())
        .clock(tollgate_core::ManualClock::new((1 << 53) + 10))
        .deny_cache(0)
        .build()
        .unwrap();
    let answers =
        futures_util::future::join_all((0..8).map(|i| limiter.check(format!("s{}", i % 3)))).await;
    for a in answers {
        let d = a.expect("a decision");
        assert!(d.allowed, "{d:?}");
    }
}

/// What a lean batch of every subject says of the first: `Some(ms)` of
/// block left, or `None` when it is admitted (the others always are).
async fn first_blocked(backend: &RedisBackend, requests: &[RateRequest]) -> Option<u64> {
    let answers = backend.check_rate_batch(requests).await.expect("a call");
    for a in &answers[1..] {
        assert!(a.as_ref().expect("a decision").allowed, "{answers:?}");
    }
    let first = answers[0].as_ref().expect("a decision");
    if first.allowed {
        return None;
    }
    // A quota of 1000 a second never refuses these checks: a block does.
    Some(first.outcomes[0].retry_after_micros / 1000)
}

/// The limiter's block marker and index, which a lean batch of many
/// subjects reads instead of each one's block key, follow every block action: a longer
/// block kept by "at least", a shorter one replacing it, a lift, a block
/// key set without the index (by an older writer) taken in by the next
/// "at least", a block that ran out, two subjects' blocks lifted one by
/// one; on the server's clock and on the limiter's own. The marker and the
/// index live as long as the longest block, and go with the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_block_index_follows_every_block_action() {
    let server = server();
    let mut conn = server.connection_manager().await;
    let backend = RedisBackend::from_connection(conn.clone());
    let mut reqs = requests(Algorithm::Gcra, q(1000, 1), &unique_prefix());
    let block = reqs[0].keys[1].clone();
    let family = &block[..block.find(":{").unwrap()];
    let (marker, index) = (format!("{family}:any"), format!("{family}:index"));
    let (hour, minute) = (3_600_000, 60_000);

    backend
        .set_block(&block, Duration::from_secs(3600), false)
        .await
        .unwrap();
    let left = first_blocked(&backend, &reqs).await.expect("blocked");
    assert!(left > hour - minute, "{left} ms");
    for key in [&marker, &index] {
        let ttl: i64 = conn.pttl(key).await.unwrap();
        assert!(
            ttl > (hour - minute) as i64,
            "{key} lives as its block: {ttl}"
        );
    }

    let kept = backend
        .set_block(&block, Duration::from_secs(1), true)
        .await
        .unwrap();
    assert!(kept > Duration::from_secs(3500), "{kept:?}");
    let left = first_blocked(&backend, &reqs).await.expect("still blocked");
    assert!(left > hour - minute, "{left} ms");

    backend
        .set_block(&block, Duration::from_secs(120), false)
        .await
        .unwrap();
    let left = first_blocked(&backend, &reqs).await.expect("blocked");
    assert!((minute..=2 * minute).contains(&left), "{left} ms");
    // On the limiter's own clock (an hour ahead), the block is still the
    // server's.
    let ahead = tollgate_core::Clock::now_micros(&tollgate_core::SystemClock) + 3_600_000_000;
    for r in &mut reqs {
        r.now_micros = Some(ahead);
    }
    let left = first_blocked(&backend, &reqs).await.expect("blocked");
    assert!((minute..=2 * minute).contains(&left), "{left} ms");
    for r in &mut reqs {
        r.now_micros = None;
        // Its state, an hour ahead of the server's, would refuse the next.
        let _: () = conn.del(&r.keys[0]).await.unwrap();
    }

    // More live blocks than checks in the batch: each check's is read.
    let others: Vec<String> = (0..6)
        .map(|i| block.replace("{s0}", &format!("{{other{i}}}")))
        .collect();
    for other in &others {
        let hour = Duration::from_secs(3600);
        backend.set_block(other, hour, false).await.unwrap();
    }
    let left = first_blocked(&backend, &reqs).await.expect("blocked");
    assert!((minute..=2 * minute).contains(&left), "{left} ms");
    for other in &others {
        backend.unblock(other).await.unwrap();
    }

    // Another subject's block keeps the marker; lifting both clears it.
    let other = reqs[1].keys[1].clone();
    let minute_long = Duration::from_secs(60);
    backend.set_block(&other, minute_long, false).await.unwrap();
    backend.unblock(&block).await.unwrap();
    let answers = backend.check_rate_batch(&reqs).await.expect("a call");
    let allowed: Vec<bool> = answers
        .iter()
        .map(|a| a.as_ref().unwrap().allowed)
        .collect();
    assert_eq!(allowed, [true, false, true, true], "{answers:?}");
    backend.unblock(&other).await.unwrap();
    assert_eq!(first_blocked(&backend, &reqs).await, None, "lifted");
    let left: (bool, bool) = (
        conn.exists(&marker).await.unwrap(),
        conn.exists(&index).await.unwrap(),
    );
    assert_eq!(left, (false, false), "nothing left once no block lives");

    let _: () = conn.pset_ex(&block, "1", 10 * minute).await.unwrap();
    let kept = backend
        .set_block(&block, Duration::from_secs(1), true)
        .await
        .unwrap();
    assert!(kept > Duration::from_secs(590), "{kept:?}");
    let left = first_blocked(&backend, &reqs).await.expect("blocked");
    assert!((9 * minute..=10 * minute).contains(&left), "{left} ms");

    backend
        .set_block(&block, Duration::from_millis(30), false)
        .await
        .unwrap();
    let start = Instant::now();
    loop {
        let gone: bool = !conn.exists::<_, bool>(&block).await.unwrap();
        if gone {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the block key expires"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(first_blocked(&backend, &reqs).await, None, "ran out");
}

/// On a cluster, which keeps no block index, a batch of two subjects
/// whose tags share a slot (what `check_rate_batch` asks of its callers
/// there) reads each one's block key: the blocked one is refused, the
/// other admitted (the batch went for the index before: another slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_batch_of_one_slot_reads_block_keys() {
    let cluster = cluster();
    let mut conn = cluster.connection().await;
    let backend = RedisBackend::from_connection(conn.clone());
    let prefix = unique_prefix();
    // Subjects of scattered bytes (CRC16 spreads "s0".."s1999" over
    // distinct slots): two share a slot within a few hundred.
    let name = |i: u64| format!("{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut seen = std::collections::HashMap::new();
    let mut pair = None;
    for i in 0..5000u64 {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("{{{}}}", name(i)))
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some(j) = seen.insert(slot, i) {
            pair = Some((j, i));
            break;
        }
    }
    let (a, b) = pair.expect("two subjects in one slot");
    let reqs: Vec<RateRequest> = [a, b]
        .iter()
        .map(|&i| {
            let mut r = request_for(Algorithm::Gcra, &[q(10, 1)], &name(i), &prefix);
            let block = format!("{}:block", r.keys[0]);
            r.keys.push(block);
            r
        })
        .collect();
    let hour = Duration::from_secs(3600);
    backend
        .set_block(&reqs[0].keys[1], hour, false)
        .await
        .unwrap();
    let answers = backend.check_rate_batch(&reqs).await.expect("one slot");
    let allowed: Vec<bool> = answers
        .iter()
        .map(|a| a.as_ref().unwrap().allowed)
        .collect();
    assert_eq!(allowed, [false, true], "{answers:?}");
}
