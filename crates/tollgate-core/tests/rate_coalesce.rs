//! Coalescing (issue #15): a batch decides exactly as the same checks sent
//! one at a time (and as the memory twins), keeps one check's error to that
//! check, reloads a flushed script once, and repairs foreign values as a
//! single call does. Load and faults: rate_coalesce_load.rs.

mod coalesce_common;
mod rate_common;

use tollgate_core::store::RateRequest;
use tollgate_core::{Algorithm, Coalescing, Error, RateBackend, RedisBackend};
use tollgate_testkit::RedisServer;

use coalesce_common::*;
use rate_common::*;

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

/// One check's error fails that check only: a request the script cannot
/// run (two quotas' parameters, one key: a GET of nil) between two good
/// ones. The good ones are decided and take their units; the bad one
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
    let mut bad = request_for(
        Algorithm::TokenBucket,
        &[q(2, 60), q(3, 60)],
        "bad",
        &prefix,
    );
    bad.keys.truncate(1);
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
        assert!(
            error.to_string().contains("script"),
            "a script error: {error}"
        );
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
    assert_eq!(
        (
            server.command_calls("evalsha"),
            server.command_calls("eval")
        ),
        (1, 1)
    );
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
