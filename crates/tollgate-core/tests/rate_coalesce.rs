//! Coalescing (issue #15): checks that wait on one connection go out as one
//! call of the batch script. A batch must decide exactly as the same checks
//! sent one at a time (and as the memory twins), keep one check's error to
//! that check, form on its own under load on a standalone Redis and on a
//! cluster (one hash tag per batch), and apply the failure policy to every
//! check when Redis stops answering.

mod rate_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tollgate_core::backend::{RateReply, RateRequest};
use tollgate_core::{
    Algorithm, Coalescing, DecisionSource, Error, FailurePolicy, ManualClock, MemoryBackend, Quota,
    RateBackend, RateLimiter, RedisBackend,
};
use tollgate_testkit::RedisServer;

use rate_common::*;

/// The memory backend, keeping every request it decided and its reply.
#[derive(Debug)]
struct Recorder {
    memory: MemoryBackend,
    seen: Arc<Mutex<Vec<(RateRequest, RateReply)>>>,
}

impl RateBackend for Recorder {
    fn check_rate<'a>(
        &'a self,
        request: &'a RateRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<RateReply>> {
        Box::pin(std::future::ready(self.check_rate_now(request).unwrap()))
    }

    fn check_rate_now(&self, request: &RateRequest) -> Option<tollgate_core::Result<RateReply>> {
        let reply = self.memory.check_rate_now(request)?;
        if let Ok(r) = &reply {
            self.seen.lock().unwrap().push((request.clone(), r.clone()));
        }
        Some(reply)
    }

    fn kind(&self) -> &'static str {
        "recorder"
    }
}

/// A small deterministic generator (xorshift64*): the sequence is the seed's.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// A random sequence of checks on the client's clock: five algorithms, one
/// and two quotas, three subjects, costs from 0 to the capacity, bursts and
/// lulls. Returns each request with the memory twin's reply.
async fn sequence(seed: u64, steps: usize, prefix: &str) -> Vec<(RateRequest, RateReply)> {
    let clock = ManualClock::new(1_700_000_000_000_000 + seed * 1_000);
    let recorder = Arc::new(Recorder {
        memory: MemoryBackend::with_clock(clock.clone()),
        seen: Arc::default(),
    });
    let shapes: [&[Quota]; 2] = [&[q(5, 1)], &[q(4, 1), q(9, 10)]];
    let mut limiters = Vec::new();
    for alg in ALL {
        for (i, quotas) in shapes.iter().enumerate() {
            let mut b = RateLimiter::builder(recorder.clone(), alg)
                .name(format!("q{i}"))
                .prefix(prefix)
                .clock(clock.clone())
                .failure_policy(FailurePolicy::Deny)
                .deny_cache(0);
            for q in quotas.iter() {
                b = b.quota(*q);
            }
            limiters.push((b.build().unwrap(), quotas[0].burst()));
        }
    }
    let mut rng = Rng(seed | 1);
    for _ in 0..steps {
        let (limiter, capacity) = &limiters[rng.below(limiters.len() as u64) as usize];
        let subject = ["alice", "bob", "carol"][rng.below(3) as usize];
        let cost = rng.below(capacity + 1);
        limiter
            .check_n(subject, cost)
            .await
            .expect("the memory backend answers");
        // Mostly bursts (no time), sometimes a lull of up to two periods.
        let pause = match rng.below(10) {
            0..=6 => 0,
            7..=8 => rng.below(100_000),
            _ => rng.below(3_000_000),
        };
        clock.advance(Duration::from_micros(pause));
    }
    let seen = recorder.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), steps, "every check reached the backend");
    seen
}

/// Deletes every key under `prefix` (on a standalone server).
fn clear(server: &RedisServer, prefix: &str) {
    let keys = server.cli(&["--scan", "--pattern", &format!("{prefix}:*")]);
    for key in keys.lines().filter(|k| !k.is_empty()) {
        server.cli(&["DEL", key]);
    }
}

/// Script calls the server has run since its stats were reset.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The differential test the issue asks for: a random sequence decided one
/// call per check and coalesced (batches of random sizes, in order) gives
/// identical replies, and both equal the memory twins'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_decisions_equal_single_calls_and_the_twins() {
    let server = server();
    let conn = server.connection_manager().await;
    let single = RedisBackend::from_connection(conn.clone()).with_coalescing(Coalescing::off());
    let batched = RedisBackend::from_connection(conn);
    let steps = std::env::var("TOLLGATE_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    for seed in [1u64, 7, 2026] {
        let prefix = unique_prefix();
        let checks = sequence(seed, steps, &prefix).await;
        let mut one_by_one = Vec::new();
        for (request, _) in &checks {
            one_by_one.push(single.check_rate(request).await.expect("a single call"));
        }
        clear(server, &prefix);
        let mut rng = Rng(seed.wrapping_mul(31) | 1);
        let mut coalesced = Vec::new();
        let requests: Vec<RateRequest> = checks.iter().map(|(r, _)| r.clone()).collect();
        let mut rest = requests.as_slice();
        let mut batches = 0;
        while !rest.is_empty() {
            let take = (1 + rng.below(40) as usize).min(rest.len());
            let answers = batched
                .check_rate_batch(&rest[..take])
                .await
                .expect("a batch");
            assert_eq!(answers.len(), take);
            coalesced.extend(answers.into_iter().map(|a| a.expect("a decision")));
            rest = &rest[take..];
            batches += 1;
        }
        assert!(batches < checks.len() / 5, "batches were formed");
        let allowed = one_by_one.iter().filter(|r| r.allowed).count();
        assert!(
            allowed > steps / 10 && allowed < steps * 95 / 100,
            "seed {seed}: {allowed} of {steps} admitted: the sequence must both admit and deny"
        );
        for (i, ((request, twin), (alone, together))) in checks
            .iter()
            .zip(one_by_one.iter().zip(&coalesced))
            .enumerate()
        {
            assert_eq!(
                alone, together,
                "seed {seed}, check {i} ({:?}, cost {}): single call and batch differ",
                request.algorithm, request.cost
            );
            assert_eq!(
                figures(alone),
                figures(twin),
                "seed {seed}, check {i} ({:?}, cost {}): script and twin differ",
                request.algorithm,
                request.cost
            );
        }
    }
}

/// What a script replies: allowed, the instant, and per quota (remaining,
/// reset, retry, next). The twins also report a TTL, which no reply carries.
type Figures = (bool, u64, Vec<(u64, u64, u64, u64)>);

fn figures(reply: &RateReply) -> Figures {
    let quotas = reply
        .outcomes
        .iter()
        .map(|o| {
            (
                o.remaining,
                o.reset_after_micros,
                o.retry_after_micros,
                o.next_after_micros,
            )
        })
        .collect();
    (reply.allowed, reply.now_micros, quotas)
}

fn unique_prefix() -> String {
    format!("co{}", prefix())
}

/// The request a limiter sends for `subject`, taken from a recorder.
fn request_for(alg: Algorithm, quotas: &[Quota], subject: &str, prefix: &str) -> RateRequest {
    let recorder = Arc::new(Recorder {
        memory: MemoryBackend::new(),
        seen: Arc::default(),
    });
    let mut b = RateLimiter::builder(recorder.clone(), alg)
        .prefix(prefix)
        .deny_cache(0);
    for q in quotas {
        b = b.quota(*q);
    }
    let limiter = b.build().unwrap();
    futures_util::FutureExt::now_or_never(limiter.check(subject))
        .expect("in process")
        .unwrap();
    let seen = recorder.seen.lock().unwrap();
    seen[0].0.clone()
}

/// One check's error fails that check only: a request the script cannot
/// run (two keys, one quota's parameters: Lua arithmetic on nil) between two
/// good ones. The good ones are decided and take their units; the bad one
/// gets the same kind of error a single call of it gets — a data error, not
/// an outage. (The example, WRONGTYPE, no longer fails a check: a
/// key of another type is read as absent and overwritten, issue #16.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_checks_error_fails_that_check_only() {
    let server = server();
    let conn = server.connection_manager().await;
    let single = RedisBackend::from_connection(conn.clone()).with_coalescing(Coalescing::off());
    let backend = RedisBackend::from_connection(conn);
    let prefix = unique_prefix();
    let good = request_for(Algorithm::Gcra, &[q(2, 60)], "good", &prefix);
    let mut bad = request_for(Algorithm::TokenBucket, &[q(2, 60)], "bad", &prefix);
    bad.keys.push(format!("{}:second", bad.keys[0]));
    let alone = single.check_rate(&bad).await;
    let answers = backend
        .check_rate_batch(&[good.clone(), bad.clone(), good.clone(), good.clone()])
        .await
        .expect("the call itself succeeds");
    let outcomes: Vec<Option<bool>> = answers
        .iter()
        .map(|a| a.as_ref().ok().map(|r| r.allowed))
        .collect();
    assert_eq!(outcomes, [Some(true), None, Some(true), Some(false)]);
    for error in [
        alone.unwrap_err(),
        answers.into_iter().nth(1).unwrap().unwrap_err(),
    ] {
        match &error {
            Error::Backend(b) => assert!(!b.is_outage(), "a data error: {error}"),
            other => panic!("expected a backend error, got {other:?}"),
        }
        assert!(error.to_string().contains("nil"), "{error}");
    }
}

/// NOSCRIPT reloads once for the whole batch: after SCRIPT FLUSH a batch is
/// decided (by EVAL) and the next goes back to EVALSHA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_is_reloaded_for_the_whole_batch() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await);
    let prefix = unique_prefix();
    let checks: Vec<RateRequest> = ["a", "b", "c"]
        .iter()
        .map(|s| request_for(Algorithm::FixedWindow, &[q(1, 60)], s, &prefix))
        .collect();
    backend.check_rate_batch(&checks).await.unwrap();
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
    server.cli(&["CONFIG", "RESETSTAT"]);
    let again = backend.check_rate_batch(&checks).await.unwrap();
    assert!(again.iter().all(|r| !r.as_ref().unwrap().allowed));
    let stats = server.cli(&["INFO", "commandstats"]);
    let calls = |name: &str| {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .and_then(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    assert_eq!((calls("evalsha"), calls("eval")), (1, 1), "{stats}");
}

/// Starts `n` checks of `subject` while `server` is frozen (the first calls
/// hang, the rest queue), waits until each has entered its check, thaws the
/// server and returns how many were admitted.
async fn burst_while_frozen(
    server: &RedisServer,
    limiter: &RateLimiter,
    subjects: &[&str],
    n: usize,
) -> Vec<usize> {
    server.pause();
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..n {
        let limiter = limiter.clone();
        let which = i % subjects.len();
        let subject = subjects[which].to_owned();
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            started.fetch_add(1, Ordering::SeqCst);
            (which, limiter.check(subject).await)
        }));
    }
    tollgate_testkit::eventually(Duration::from_secs(10), "every check started", || {
        let started = started.clone();
        async move { (started.load(Ordering::SeqCst) == n).then_some(()) }
    })
    .await;
    // Each task enters the coalescer in the same poll that counted it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.resume();
    let mut admitted = vec![0; subjects.len()];
    for t in tasks {
        let (s, d) = t.await.unwrap();
        if d.expect("Redis answers once thawed").allowed {
            admitted[s] += 1;
        }
    }
    admitted
}

/// Loads the single and the batch script (so a NOSCRIPT retry does not
/// count as a call below).
async fn warm_up(backend: &RedisBackend) {
    warm_up_on(backend, "warm").await;
}

async fn warm_up_on(backend: &RedisBackend, subject: &str) {
    let prefix = unique_prefix();
    let r = request_for(Algorithm::TokenBucket, &[q(1, 1)], subject, &prefix);
    backend.check_rate(&r).await.unwrap();
    backend.check_rate_batch(&[r.clone(), r]).await.unwrap();
}

/// Under load checks share calls, and still admit exactly the limit: 200
/// checks of one subject while Redis is frozen go out in a handful of calls
/// (16 alone, then batches of up to 64: 19), and exactly 50 are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_checks_share_calls_on_a_standalone_redis() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await);
    warm_up(&backend).await;
    let limiter = RateLimiter::builder(backend, Algorithm::TokenBucket)
        .quota(q(50, 3600))
        .timeout(Duration::from_secs(10))
        .deny_cache(0)
        .build()
        .unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let admitted = burst_while_frozen(&server, &limiter, &["hot"], 200).await;
    assert_eq!(admitted, [50]);
    let calls = script_calls(&server);
    assert!(calls <= 20, "200 checks took {calls} script calls");
}

/// On a cluster a batch keeps to one hash tag: three subjects (three tags)
/// checked together still share calls per subject, and each admits exactly
/// its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_batches_per_hash_tag() {
    let cluster = cluster();
    let backend = RedisBackend::from_connection(cluster.connection().await);
    let prefix = unique_prefix();
    let limiter = RateLimiter::builder(backend.clone(), Algorithm::SlidingWindowLog)
        .prefix(&prefix)
        .quota(q(20, 3600))
        .timeout(Duration::from_secs(10))
        .deny_cache(0)
        .build()
        .unwrap();
    let subjects = ["s1", "s2", "s3"];
    // Freeze the node of the first subject: its checks queue behind it.
    let key = limiter.keys_for(&"s1".into()).remove(0);
    let node = &cluster.nodes()[cluster.master_for_key(&key)];
    for s in subjects {
        warm_up_on(&backend, s).await;
    }
    for n in cluster.nodes() {
        n.cli(&["CONFIG", "RESETSTAT"]);
    }
    let admitted = burst_while_frozen(node, &limiter, &subjects, 150).await;
    assert_eq!(admitted, [20, 20, 20]);
    let calls: u64 = cluster.nodes().iter().map(script_calls).sum();
    assert!(calls < 150, "150 checks took {calls} script calls");
    // Many subjects at once: a turn carries checks of many tags, each tag
    // its own call (a batch, or single calls for a few), all sent together;
    // every subject still admits exactly its limit.
    let many: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let admitted = burst_while_frozen(node, &limiter, &many, 40 * 25).await;
    assert_eq!(admitted, vec![20; 40]);
}

/// A timeout applies the failure policy to every check of the batch it
/// bounded, and once Redis answers again checks are decided by it: no turn
/// stays taken by a call that never came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_gets_the_policy_for_every_waiting_check() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await);
    let build = |policy| {
        RateLimiter::builder(backend.clone(), Algorithm::Gcra)
            .quota(q(1000, 60))
            .failure_policy(policy)
            .timeout(Duration::from_millis(200))
            // Every check here must reach the backend (no open circuit).
            .circuit_breaker(u32::MAX, Duration::from_millis(1))
            .deny_cache(0)
            .build()
            .unwrap()
    };
    let (allow, deny) = (build(FailurePolicy::Allow), build(FailurePolicy::Deny));
    server.pause();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let limiter = if i % 2 == 0 {
            allow.clone()
        } else {
            deny.clone()
        };
        tasks.push(tokio::spawn(async move {
            (i % 2 == 0, limiter.check(&format!("u{}", i % 5)).await)
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            (true, Ok(d)) => {
                assert!(d.allowed, "fail open");
                assert_eq!(d.source, DecisionSource::FailOpen);
            }
            (false, Err(e)) => assert!(matches!(e, Error::Timeout(_)), "{e}"),
            (allows, other) => panic!("allow policy {allows}: {other:?}"),
        }
    }
    server.resume();
    // The abandoned calls' turns came back: fresh checks reach Redis.
    for _ in 0..3 {
        let d = deny.check("after").await.expect("decided by Redis");
        assert!(d.allowed, "Redis admits once it answers");
    }
}

/// Foreign values under a batch's keys (another type, strings no script
/// writes) are read as absent and overwritten, as by a single call: the same
/// replies and the same stored state (with a TTL) either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_in_a_batch_are_repaired_as_by_single_calls() {
    let server = server();
    let conn = server.connection_manager().await;
    let single = RedisBackend::from_connection(conn.clone()).with_coalescing(Coalescing::off());
    let batched = RedisBackend::from_connection(conn);
    let foreign: [&[&str]; 4] = [
        &["SET", "garbage"],
        &["SET", "12:abc"],
        &["ZADD", "1", "m"],
        &["HSET", "f", "v"],
    ];
    for alg in ALL {
        let prefix = unique_prefix();
        let subjects = ["f0", "f1", "f2", "f3"];
        let mut checks: Vec<RateRequest> = subjects
            .iter()
            .map(|s| request_for(alg, &[q(3, 60)], s, &prefix))
            .collect();
        checks.extend(checks.clone());
        // One instant for all (a client clock): replies comparable figure
        // for figure.
        for r in &mut checks {
            r.now_micros = Some(1_800_000_000_000_000);
        }
        let seed = || {
            for (request, value) in checks.iter().zip(foreign) {
                let key = request.keys[0].as_str();
                server.cli(&["DEL", key]);
                let mut args = vec![value[0], key];
                args.extend(&value[1..]);
                server.cli(&args);
            }
        };
        let state = || {
            let mut keys: Vec<String> = checks.iter().map(|r| r.keys[0].clone()).collect();
            keys.dedup();
            keys.iter()
                .map(|k| {
                    let pttl: i64 = server.cli(&["PTTL", k]).parse().unwrap();
                    assert!(pttl > 0, "{alg:?}: {k} has PTTL {pttl}");
                    server.cli(&["TYPE", k])
                })
                .collect::<Vec<_>>()
        };
        seed();
        let mut alone = Vec::new();
        for r in &checks {
            alone.push(figures(&single.check_rate(r).await.expect("repaired")));
        }
        let after_single = state();
        seed();
        let together: Vec<Figures> = batched
            .check_rate_batch(&checks)
            .await
            .unwrap()
            .iter()
            .map(|r| figures(r.as_ref().expect("repaired")))
            .collect();
        assert_eq!(alone, together, "{alg:?}");
        assert_eq!(after_single, state(), "{alg:?}");
        assert!(alone.iter().take(4).all(|f| f.0), "{alg:?}: read as absent");
    }
}

/// A key that a log check and a string algorithm's check both use in one
/// batch (only a foreign or colliding key can be) is decided as single
/// calls decide it, in both orders: the batch then reads and writes as they
/// do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_shared_by_a_log_and_a_bucket_in_one_batch_is_decided_as_by_single_calls() {
    let server = server();
    let conn = server.connection_manager().await;
    let single = RedisBackend::from_connection(conn.clone()).with_coalescing(Coalescing::off());
    let batched = RedisBackend::from_connection(conn);
    let prefix = unique_prefix();
    let mut log = request_for(Algorithm::SlidingWindowLog, &[q(5, 60)], "k", &prefix);
    let mut gcra = request_for(Algorithm::Gcra, &[q(5, 60)], "k", &prefix);
    gcra.keys = log.keys.clone();
    let key = log.keys[0].clone();
    for r in [&mut log, &mut gcra] {
        r.now_micros = Some(1_800_000_000_000_000);
    }
    for order in [
        vec![gcra.clone(), gcra.clone(), log.clone(), gcra.clone()],
        vec![log.clone(), gcra.clone(), gcra.clone(), log.clone()],
    ] {
        let mut expected = Vec::new();
        server.cli(&["DEL", &key]);
        for r in &order {
            expected.push(figures(&single.check_rate(r).await.unwrap()));
        }
        let expected_type = server.cli(&["TYPE", &key]);
        server.cli(&["DEL", &key]);
        let got: Vec<Figures> = batched
            .check_rate_batch(&order)
            .await
            .unwrap()
            .iter()
            .map(|r| figures(r.as_ref().unwrap()))
            .collect();
        assert_eq!(got, expected);
        assert_eq!(server.cli(&["TYPE", &key]), expected_type);
    }
}

/// On a cluster a frozen node holds up only its own subjects: checks of
/// subjects on the other nodes are decided by Redis while checks of the
/// frozen node's subject wait out their timeouts (they shared the turns
/// before each hash tag had its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_cluster_node_holds_up_only_its_own_subjects() {
    let cluster = cluster();
    let backend = RedisBackend::from_connection(cluster.connection().await);
    let prefix = unique_prefix();
    let build = |timeout| {
        RateLimiter::builder(backend.clone(), Algorithm::Gcra)
            .prefix(&prefix)
            .quota(q(1_000_000, 60))
            .failure_policy(FailurePolicy::Deny)
            .timeout(timeout)
            .circuit_breaker(u32::MAX, Duration::from_millis(1))
            .deny_cache(0)
            .build()
            .unwrap()
    };
    // The frozen node's checks wait long; the others would give up sooner
    // than that if they had to wait for a turn behind them.
    let patient = build(Duration::from_secs(10));
    let limiter = build(Duration::from_secs(1));
    let frozen_subject = "frozen";
    let key = limiter.keys_for(&frozen_subject.into()).remove(0);
    let frozen = cluster.master_for_key(&key);
    // Subjects whose keys live on the other masters.
    let healthy: Vec<String> = (0..200)
        .map(|i| format!("h{i}"))
        .filter(|s| {
            let k = limiter.keys_for(&s.as_str().into()).remove(0);
            cluster.master_for_key(&k) != frozen
        })
        .take(20)
        .collect();
    assert_eq!(healthy.len(), 20);
    for s in &healthy {
        limiter.check(s.as_str()).await.unwrap();
    }
    let node = &cluster.nodes()[frozen];
    node.pause();
    // More checks of the frozen node's subject than the turns of a lane.
    let mut stuck = Vec::new();
    for _ in 0..40 {
        let l = patient.clone();
        stuck.push(tokio::spawn(async move { l.check(frozen_subject).await }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut healthy_tasks = Vec::new();
    for s in healthy.iter().cycle().take(200) {
        let (l, s) = (limiter.clone(), s.clone());
        healthy_tasks.push(tokio::spawn(async move { l.check(s).await }));
    }
    let mut decided = 0;
    for t in healthy_tasks {
        match t.await.unwrap() {
            Ok(d) if d.source == DecisionSource::Backend => decided += 1,
            other => panic!("a healthy node's check: {other:?}"),
        }
    }
    node.resume();
    assert_eq!(decided, 200);
    for t in stuck {
        let d = t.await.unwrap().expect("decided once thawed");
        assert!(d.allowed);
    }
}

/// A turn passed on while a runtime shuts down comes back: a backend shared
/// by two runtimes, one turn, checks of runtime B queued behind a frozen
/// server when B is shut down — runtime A's checks are then decided (the
/// turn leaked for good before, and every later check timed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_shut_down_mid_batch_gives_its_turns_back() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await)
        .with_coalescing(Coalescing::default().max_calls_in_flight(1));
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(q(1000, 60))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(500))
        .circuit_breaker(u32::MAX, Duration::from_millis(1))
        .deny_cache(0)
        .build()
        .unwrap();
    limiter.check("warm").await.unwrap();
    server.pause();
    let other = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for i in 0..3 {
        let l = limiter.clone();
        other.spawn(async move { l.check(format!("b{i}")).await });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    other.shutdown_background();
    server.resume();
    for i in 0..5 {
        let d = limiter.check(format!("a{i}")).await.expect("decided");
        assert_eq!(d.source, DecisionSource::Backend);
    }
}

/// A turn dropped where no runtime runs gives the turn back without failing
/// the checks that wait: they are sent by the next check's turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_dropped_outside_a_runtime_fails_no_waiting_check() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await)
        .with_coalescing(Coalescing::default().max_calls_in_flight(1));
    let prefix = unique_prefix();
    let first = request_for(Algorithm::Gcra, &[q(100, 60)], "first", &prefix);
    warm_up(&backend).await;
    server.pause();
    // Takes the only turn and is dropped on a plain thread, unfinished.
    let mut lone = Box::pin(backend.check_rate(&first));
    assert!(futures_util::poll!(&mut lone).is_pending());
    let mut waiting = Vec::new();
    for i in 0..5 {
        let (b, r) = (
            backend.clone(),
            request_for(Algorithm::Gcra, &[q(100, 60)], &format!("w{i}"), &prefix),
        );
        waiting.push(tokio::spawn(async move { b.check_rate(&r).await }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::thread::scope(|s| {
        s.spawn(move || drop(lone));
    });
    server.resume();
    // The next check takes the free turn and sends the waiting ones.
    let next = request_for(Algorithm::Gcra, &[q(100, 60)], "next", &prefix);
    backend.check_rate(&next).await.expect("decided");
    for w in waiting {
        let reply = w.await.unwrap().expect("decided, not failed");
        assert!(reply.allowed);
    }
}

/// A cluster connection inside the user's own wrapper looks like one server
/// to the backend, so its first batches mix hash tags; the cluster refuses
/// them (CROSSSLOT, before running anything), the backend decides them
/// again one call per tag and splits every later batch: every check is
/// decided, each subject admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_cluster_connection_is_split_by_tag_after_crossslot() {
    #[derive(Clone)]
    struct Wrapped(redis::cluster_async::ClusterConnection);
    impl redis::aio::ConnectionLike for Wrapped {
        fn req_packed_command<'a>(
            &'a mut self,
            cmd: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, redis::Value> {
            self.0.req_packed_command(cmd)
        }
        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a redis::Pipeline,
            offset: usize,
            count: usize,
        ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
            self.0.req_packed_commands(pipeline, offset, count)
        }
        fn get_db(&self) -> i64 {
            self.0.get_db()
        }
    }
    let cluster = cluster();
    let backend = RedisBackend::from_connection(Wrapped(cluster.connection().await))
        .with_coalescing(Coalescing::default().max_calls_in_flight(2));
    let prefix = unique_prefix();
    let limiter = RateLimiter::builder(backend, Algorithm::FixedWindow)
        .prefix(&prefix)
        .quota(q(5, 3600))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(10))
        .deny_cache(0)
        .build()
        .unwrap();
    let subjects: Vec<String> = (0..40).map(|i| format!("x{i}")).collect();
    let mut tasks = Vec::new();
    for round in 0..10 {
        for (i, s) in subjects.iter().enumerate() {
            let (l, s) = (limiter.clone(), s.clone());
            tasks.push(tokio::spawn(async move {
                let _ = round;
                (i, l.check(s).await)
            }));
        }
    }
    let mut admitted = vec![0; subjects.len()];
    for t in tasks {
        let (i, d) = t.await.unwrap();
        if d.expect("decided, not refused").allowed {
            admitted[i] += 1;
        }
    }
    assert_eq!(admitted, vec![5; subjects.len()]);
}
