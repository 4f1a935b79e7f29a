//! The rate-limit behaviour suite: every test runs against the memory backend,
//! a standalone redis-server and a 3-master Redis Cluster (real processes,
//! started by the test kit; no mocks).

mod rate_common;

use std::time::Duration;

use redis::AsyncCommands;
use tollgate_core::{
    Algorithm, Clock, DecisionSource, Error, FailurePolicy, ManualClock, MemoryBackend, Quota,
    RateBackend, RateLimiter, RedisBackend, Subject, SystemClock,
};
use tollgate_testkit::RedisServer;

use rate_common::*;

/// Exactly `limit` admitted in a burst, the next denied with a retry-after
/// that is honest: just before it, still denied; at it, admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admits_exactly_the_limit_then_retry_after_is_exact() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[q(5, 10)], &p, &clock);
            let subject = format!("user-{alg:?}");
            for i in 0..5 {
                let d = l.check(subject.as_str()).await.unwrap();
                assert!(d.allowed, "{kind:?} {alg:?}: request {i} denied: {d:?}");
                assert_eq!(d.remaining, 4 - i, "{kind:?} {alg:?}");
                assert_eq!(d.limit, 5);
                assert_eq!(d.source, DecisionSource::Backend);
            }
            let d = l.check(subject.as_str()).await.unwrap();
            assert!(!d.allowed, "{kind:?} {alg:?}: sixth admitted");
            let retry = d.retry_after.expect("retry_after when denied");
            assert!(retry > Duration::ZERO);
            // The counter may wait into the next window for the weight to drop.
            let most = if alg == Algorithm::SlidingWindowCounter {
                20
            } else {
                10
            };
            assert!(
                retry <= Duration::from_secs(most),
                "{kind:?} {alg:?}: {retry:?}"
            );
            // Denials consume nothing: many more denials do not push the retry out.
            for _ in 0..5 {
                let again = l.check(subject.as_str()).await.unwrap();
                assert!(!again.allowed);
                assert_eq!(again.retry_after, Some(retry), "{kind:?} {alg:?}");
            }
            clock.advance(retry - Duration::from_micros(1));
            assert!(
                !l.check(subject.as_str()).await.unwrap().allowed,
                "{kind:?} {alg:?}: admitted early"
            );
            clock.advance(Duration::from_micros(1));
            let d = l.check(subject.as_str()).await.unwrap();
            assert!(d.allowed, "{kind:?} {alg:?}: denied at retry_after: {d:?}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// A limit of one admits one (upstash#39).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_of_one_admits_one() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[q(1, 1)], &p, &clock);
            assert!(l.check("a").await.unwrap().allowed, "{kind:?} {alg:?}");
            assert!(!l.check("a").await.unwrap().allowed, "{kind:?} {alg:?}");
            // Other subjects are independent.
            assert!(l.check("b").await.unwrap().allowed, "{kind:?} {alg:?}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// Weighted costs; a cost that can never fit is its own error and leaves the
/// state alone (rwz/redis-gcra#6: later calls must still be limited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_cost_and_impossible_cost() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[q(10, 60)], &p, &clock);
            let d = l.check_n("s", 7).await.unwrap();
            assert!(d.allowed && d.remaining == 3, "{kind:?} {alg:?}: {d:?}");
            let d = l.check_n("s", 4).await.unwrap();
            assert!(!d.allowed && d.remaining == 3, "{kind:?} {alg:?}: {d:?}");
            match l.check_n("s", 11).await {
                Err(Error::CostExceedsCapacity {
                    cost: 11,
                    capacity: 10,
                }) => {}
                other => panic!("{kind:?} {alg:?}: {other:?}"),
            }
            let d = l.check_n("s", 3).await.unwrap();
            assert!(d.allowed && d.remaining == 0, "{kind:?} {alg:?}: {d:?}");
            assert!(!l.check("s").await.unwrap().allowed, "{kind:?} {alg:?}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// Several quotas on one subject, in one script, all or nothing: a denial by
/// one quota takes nothing from the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_quotas_all_or_nothing() {
    for kind in KINDS {
        for alg in ALL {
            // At the start of an hour: the 2 s this test moves on never
            // cross into the next hourly window.
            let hour = 3_600_000_000;
            let clock = ManualClock::new(SystemClock.now_micros() / hour * hour);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            // 2 per second AND 3 per hour.
            let l = t.limiter(alg, &[q(2, 1), q(3, 3600)], &p, &clock);
            assert!(l.check("u").await.unwrap().allowed);
            let d = l.check("u").await.unwrap();
            assert!(d.allowed, "{kind:?} {alg:?}");
            assert_eq!(d.quotas.len(), 2);
            assert_eq!(
                (d.quotas[0].remaining, d.quotas[1].remaining),
                (0, 1),
                "{kind:?} {alg:?}"
            );
            // Denied by the per-second quota: the hourly one keeps its unit.
            let d = l.check("u").await.unwrap();
            assert!(!d.allowed, "{kind:?} {alg:?}");
            assert!(
                !d.quotas[0].allowed && d.quotas[1].allowed,
                "{kind:?} {alg:?}: {d:?}"
            );
            assert_eq!(d.quotas[1].remaining, 1, "{kind:?} {alg:?}");
            clock.advance(Duration::from_secs(2));
            assert!(l.check("u").await.unwrap().allowed, "{kind:?} {alg:?}");
            // Now the hourly quota is spent: it decides, with the longer wait.
            let d = l.check("u").await.unwrap();
            assert!(!d.allowed, "{kind:?} {alg:?}");
            assert!(
                d.quotas[0].allowed && !d.quotas[1].allowed,
                "{kind:?} {alg:?}: {d:?}"
            );
            assert!(
                d.retry_after.unwrap() > Duration::from_secs(60),
                "{kind:?} {alg:?}: {d:?}"
            );
            assert_eq!(d.limit, 3);
            // …and the per-second quota was not charged by that denial.
            assert_eq!(d.quotas[0].remaining, 1, "{kind:?} {alg:?}: {d:?}");
            assert_eq!(l.check("u").await.unwrap().quotas[0].remaining, 1);
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// The token bucket and GCRA: a burst of exactly `burst`, then the sustained
/// rate (go-redis/redis_rate#24: too many allowed when burst ≠ 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_then_sustained_rate() {
    for kind in KINDS {
        for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let quota = Quota::per_second(1).with_burst(5).unwrap();
            let l = t.limiter(alg, &[quota], &p, &clock);
            let mut admitted = 0;
            for _ in 0..20 {
                admitted += l.check("b").await.unwrap().allowed as u32;
            }
            assert_eq!(admitted, 5, "{kind:?} {alg:?}");
            // Over the next 10 s, one per second.
            let mut admitted = 0;
            for _ in 0..100 {
                clock.advance(Duration::from_millis(100));
                admitted += l.check("b").await.unwrap().allowed as u32;
            }
            assert_eq!(admitted, 10, "{kind:?} {alg:?}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// The sliding log is exact over any window; the counter stays within its
/// documented bound; the fixed window resets at the edge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_shapes() {
    for kind in KINDS {
        let clock = ManualClock::new(1_000_000_000_000_000); // a window edge
        let t = Target::new(kind, &clock).await;
        let p = prefix();
        let log = t.limiter(Algorithm::SlidingWindowLog, &[q(4, 10)], &p, &clock);
        let fw = t.limiter(Algorithm::FixedWindow, &[q(4, 10)], &p, &clock);
        let swc = t.limiter(Algorithm::SlidingWindowCounter, &[q(4, 10)], &p, &clock);
        clock.advance(Duration::from_secs(9));
        for l in [&log, &fw, &swc] {
            for _ in 0..4 {
                assert!(l.check("w").await.unwrap().allowed);
            }
        }
        clock.advance(Duration::from_secs(2)); // 11 s: a new fixed window
        assert!(
            fw.check("w").await.unwrap().allowed,
            "{kind:?}: fixed window resets at the edge"
        );
        assert!(
            !log.check("w").await.unwrap().allowed,
            "{kind:?}: the log remembers the last 10 s"
        );
        // The counter weights the previous window by 9/10: ceil(4 * 0.9) = 4.
        assert!(!swc.check("w").await.unwrap().allowed, "{kind:?}");
        clock.advance(Duration::from_secs(8)); // 19 s: the log's entries from 9 s are gone
        assert!(log.check("w").await.unwrap().allowed, "{kind:?}");
        // Counter: ceil(4 * 0.1) = 1 of the previous window, so 3 more.
        let mut n = 0;
        for _ in 0..10 {
            n += swc.check("w").await.unwrap().allowed as u32;
        }
        assert_eq!(n, 3, "{kind:?}");
        t.assert_all_keys_expire(&p, &clock).await;
    }
}

/// The memory twins and the Lua scripts agree figure for figure on a long
/// random sequence of costs and clock steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_twins_match_the_scripts() {
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for (alg, start) in ALL
        .into_iter()
        .flat_map(|a| [(a, None), (a, Some(1_000_000))])
    {
        // Also near the epoch, where a full bucket's empty instant is negative.
        let clock = start.map_or_else(ManualClock::starting_now, ManualClock::new);
        let mem = Target::new(Kind::Memory, &clock).await;
        let redis = Target::new(Kind::Standalone, &clock).await;
        let p = prefix();
        // One quota (the scripts' straight-line path) and two (their loop).
        let one = [Quota::new(7, Duration::from_millis(1500)).unwrap()];
        let two = [one[0], q(20, 20)];
        for quotas in [&one[..], &two[..]] {
            let a = mem.limiter(alg, quotas, &p, &clock);
            let b = redis.limiter(alg, quotas, &p, &clock);
            let subject = format!("same-{}", quotas.len());
            for step in 0..400 {
                clock.advance(Duration::from_micros(next(400_000)));
                let cost = next(4);
                let mut da = a.check_n(subject.as_str(), cost).await.unwrap();
                let mut db = b.check_n(subject.as_str(), cost).await.unwrap();
                // Charges agree but for their ids, unique per check.
                let charge = |d: &mut tollgate_core::Decision| {
                    d.charge.take().map(|c| (c.cost(), c.at_micros()))
                };
                assert_eq!(charge(&mut da), charge(&mut db), "{alg:?} step {step}");
                assert_eq!(
                    da,
                    db,
                    "{alg:?} with {} quotas from {start:?} diverged at step {step}",
                    quotas.len()
                );
            }
        }
    }
}

/// One EVALSHA per decision; NOSCRIPT (after SCRIPT FLUSH) is recovered by one
/// EVAL; other errors are returned, not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_noscript_recovery_and_no_blind_retry() {
    let server = RedisServer::start().unwrap();
    let conn = server.connection_manager().await;
    let clock = ManualClock::starting_now();
    let backend = RedisBackend::from_connection(conn.clone());
    let l = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(q(100, 60))
        .clock(clock.clone())
        .failure_policy(FailurePolicy::Deny)
        .deny_cache(0)
        .build()
        .unwrap();
    assert!(l.check("x").await.unwrap().allowed); // loads the script (NOSCRIPT + EVAL)
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..25 {
        l.check("x").await.unwrap();
    }
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=25,"), "{stats}");
    assert!(!stats.contains("cmdstat_eval:"), "{stats}");

    server.cli(&["SCRIPT", "FLUSH"]);
    server.cli(&["CONFIG", "RESETSTAT"]);
    assert!(l.check("x").await.unwrap().allowed);
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=1,"), "{stats}");
    assert!(stats.contains("cmdstat_eval:calls=1,"), "{stats}");

    // Any other server error (here a server out of memory; a key of the
    // wrong type is repaired, not an error) is returned once, never retried.
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    server.cli(&["CONFIG", "RESETSTAT"]);
    match l.check("bad").await {
        Err(Error::Backend(e)) => assert!(e.to_string().contains("OOM"), "{e}"),
        other => panic!("{other:?}"),
    }
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=1,"), "{stats}");
    assert!(!stats.contains("cmdstat_eval:"), "{stats}");
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
}

/// Time comes from the Redis server by default: no client clock at all, and
/// two limiters agree whatever the application's clock says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_by_default() {
    for kind in [Kind::Standalone, Kind::Cluster] {
        let clock = ManualClock::new(0);
        let t = Target::new(kind, &clock).await;
        let p = prefix();
        for alg in ALL {
            let l = RateLimiter::builder(t.backend.clone(), alg)
                .prefix(&p)
                .quota(q(3, 3600))
                .failure_policy(FailurePolicy::Deny)
                .deny_cache(0)
                .build()
                .unwrap();
            for _ in 0..3 {
                assert!(l.check("srv").await.unwrap().allowed, "{kind:?} {alg:?}");
            }
            let d = l.check("srv").await.unwrap();
            assert!(!d.allowed, "{kind:?} {alg:?}");
            assert!(d.retry_after.unwrap() <= Duration::from_secs(2 * 3600));
        }
        t.assert_all_keys_expire(&p, &clock).await;
    }
}

/// 8 limiters on separate connections, 400 concurrent checks on one subject:
/// never more admitted than the algorithm allows (exactly the limit, with the
/// clock held still), on every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_limiters_never_over_admit() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::starting_now();
            let p = prefix();
            let mut limiters = Vec::new();
            let shared_memory = Target::new(Kind::Memory, &clock).await;
            for _ in 0..8 {
                let t = if kind == Kind::Memory {
                    Target {
                        kind,
                        backend: shared_memory.backend.clone(),
                        memory: None,
                    }
                } else {
                    Target::new(kind, &clock).await // a new connection each
                };
                limiters.push(t.limiter(alg, &[q(50, 3600)], &p, &clock));
            }
            let mut tasks = Vec::new();
            for i in 0..400 {
                let l = limiters[i % 8].clone();
                tasks.push(tokio::spawn(async move {
                    l.check("hot").await.unwrap().allowed
                }));
            }
            let mut admitted = 0;
            for t in tasks {
                admitted += t.await.unwrap() as u32;
            }
            assert_eq!(admitted, 50, "{kind:?} {alg:?}");
        }
    }
}

/// The same with the server's clock running: exact for the fixed window (per
/// window touched), the log, the bucket and GCRA; within 2× for the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_limiters_on_server_time() {
    for kind in [Kind::Standalone, Kind::Cluster] {
        for alg in ALL {
            let clock = ManualClock::new(0);
            let p = prefix();
            let mut limiters = Vec::new();
            for _ in 0..8 {
                let t = Target::new(kind, &clock).await;
                limiters.push(
                    RateLimiter::builder(t.backend.clone(), alg)
                        .prefix(&p)
                        .quota(q(50, 3600))
                        .failure_policy(FailurePolicy::Deny)
                        .timeout(Duration::from_secs(5))
                        .deny_cache(0)
                        .build()
                        .unwrap(),
                );
            }
            let started = std::time::SystemTime::now();
            let mut tasks = Vec::new();
            for i in 0..400 {
                let l = limiters[i % 8].clone();
                tasks.push(tokio::spawn(async move {
                    l.check("hot").await.unwrap().allowed
                }));
            }
            let mut admitted = 0u64;
            for t in tasks {
                admitted += t.await.unwrap() as u64;
            }
            let elapsed = started.elapsed().unwrap().as_secs();
            // One refill per 72 s for the buckets; a new window on an hour edge.
            let bound = match alg {
                Algorithm::TokenBucket | Algorithm::Gcra => 50 + elapsed / 72 + 1,
                Algorithm::SlidingWindowLog => 50,
                Algorithm::FixedWindow => 100,
                _ => 100,
            };
            assert!(admitted <= bound, "{kind:?} {alg:?}: {admitted} > {bound}");
            assert!(admitted >= 50, "{kind:?} {alg:?}: only {admitted}");
        }
    }
}

/// Configuration errors come before any round trip.
#[tokio::test]
async fn configuration_errors() {
    let m = MemoryBackend::new();
    let burst = Quota::per_second(1).with_burst(3).unwrap();
    assert!(matches!(
        RateLimiter::fixed_window(m.clone(), burst),
        Err(Error::InvalidQuota(_))
    ));
    assert!(RateLimiter::token_bucket(m.clone(), burst).is_ok());
    assert!(matches!(
        RateLimiter::sliding_window_log(m.clone(), Quota::per_hour(1_000_000)),
        Err(Error::InvalidQuota(_))
    ));
    assert!(matches!(
        RateLimiter::builder(m.clone(), Algorithm::Gcra).build(),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        RateLimiter::builder(m.clone(), Algorithm::Gcra)
            .quota(Quota::per_second(1))
            .prefix("a{b}")
            .build(),
        Err(Error::InvalidConfig(_))
    ));
}

/// Two limiters with different quotas never share counters unless named alike.
#[tokio::test]
async fn different_policies_do_not_share_counters() {
    let m = MemoryBackend::new();
    let a = RateLimiter::gcra(m.clone(), Quota::per_minute(1)).unwrap();
    let b = RateLimiter::gcra(m.clone(), Quota::per_minute(2)).unwrap();
    assert!(a.check("k").await.unwrap().allowed);
    assert!(b.check("k").await.unwrap().allowed);
    let named = |n: u64| {
        RateLimiter::builder(m.clone(), Algorithm::Gcra)
            .quota(Quota::per_minute(n))
            .name("shared")
            .build()
            .unwrap()
    };
    assert!(named(1).check("k").await.unwrap().allowed);
    assert!(!named(1).check("k").await.unwrap().allowed);
}

/// A dead or paused Redis costs at most the timeout, then nothing once the
/// breaker opens; the default policy admits; recovery needs no restart. An
/// exhausted limit is a denial from the backend, never a fallback
/// (rate-limiter-flexible#337).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_timeout_breaker_and_recovery() {
    let mut server = RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await);
    let open = RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
        .quota(q(2, 3600))
        .timeout(Duration::from_millis(100))
        .circuit_breaker(3, Duration::from_millis(300))
        .build()
        .unwrap();
    let closed = RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
        .quota(q(2, 3600))
        .name("closed")
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let fallback = RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
        .quota(q(40, 3600))
        .name("fallback")
        .failure_policy(FailurePolicy::Fallback {
            instances: 4.try_into().unwrap(),
        })
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // Exhausted is a backend denial, not a fallback.
    for _ in 0..2 {
        assert!(open.check("s").await.unwrap().allowed);
    }
    let d = open.check("s").await.unwrap();
    assert!(!d.allowed && d.source == DecisionSource::Backend);

    server.pause();
    let started = std::time::Instant::now();
    for _ in 0..20 {
        let d = open.check("p").await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.source, DecisionSource::FailOpen);
    }
    // 3 timeouts of 100 ms, then the breaker answers at once (bound generous).
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(closed.check("p").await.unwrap_err().is_unavailable());
    // Fallback: a quarter of the limit, locally.
    let mut n = 0;
    for _ in 0..20 {
        let d = fallback.check("f").await.unwrap();
        assert_eq!(d.source, DecisionSource::Fallback);
        n += d.allowed as u32;
    }
    assert_eq!(n, 10);
    server.resume();

    // Killed and restarted: recovers without rebuilding anything.
    server.stop();
    assert!(closed.check("k").await.unwrap_err().is_unavailable());
    server.restart().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(d) = closed.check("k").await {
            assert_eq!(d.source, DecisionSource::Backend);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no recovery");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        let d = open.check("k2").await.unwrap();
        if d.source == DecisionSource::Backend {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no recovery");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The deny cache answers a blocked subject locally, only until the
/// backend's own retry-after, and never for a smaller cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_saves_round_trips_and_never_over_denies() {
    let server = RedisServer::start().unwrap();
    let clock = ManualClock::starting_now();
    let l = RateLimiter::builder(
        RedisBackend::from_connection(server.connection_manager().await),
        Algorithm::Gcra,
    )
    .quota(Quota::per_second(1).with_burst(2).unwrap())
    .clock(clock.clone())
    .build()
    .unwrap();
    assert!(l.check_n("flood", 2).await.unwrap().allowed);
    server.cli(&["CONFIG", "RESETSTAT"]);
    let first = l.check_n("flood", 2).await.unwrap();
    assert!(!first.allowed && first.source == DecisionSource::Backend);
    for _ in 0..1000 {
        let d = l.check_n("flood", 2).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(d.source, DecisionSource::DenyCache);
    }
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=1,"), "{stats}");
    // A smaller cost may fit sooner: it goes to Redis.
    clock.advance(Duration::from_secs(1));
    let d = l.check_n("flood", 1).await.unwrap();
    assert_eq!(d.source, DecisionSource::Backend);
    assert!(d.allowed);
    // At the announced retry-after the cache lets go.
    clock.advance(Duration::from_secs(2));
    let d = l.check_n("flood", 2).await.unwrap();
    assert_eq!(d.source, DecisionSource::Backend);
}

/// `try_check_now` decides at once exactly when no round trip is needed:
/// on Redis only from the deny cache or for a cost that can never fit (no
/// EVALSHA), otherwise it hands back a pending check whose `send` is the one
/// round trip, with the same figures `check_n` gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_check_now_answers_at_once_only_without_a_round_trip() {
    let server = RedisServer::start().unwrap();
    let clock = ManualClock::starting_now();
    let build = |name: &str, conn| {
        RateLimiter::builder(RedisBackend::from_connection(conn), Algorithm::TokenBucket)
            .quota(q(1, 3600))
            .clock(clock.clone())
            .failure_policy(FailurePolicy::Deny)
            .name(name)
            .build()
            .unwrap()
    };
    let l = build("two-phase", server.connection_manager().await);
    let twin = build("twin", server.connection_manager().await);
    let s = Subject::new("two-phase");
    // Load the script first, so that the counts below are real decisions.
    assert!(l.check("warm-up").await.unwrap().allowed);
    server.cli(&["CONFIG", "RESETSTAT"]);
    let pending = l
        .try_check_now(&s, 1)
        .expect_err("Redis needs a round trip");
    // Its Debug output names it but, like Subject's, never the raw subject.
    let shown = format!("{pending:?}");
    assert!(
        shown.contains("PendingCheck") && !shown.contains("two-phase"),
        "{shown}"
    );
    let mut first = pending.send().await.unwrap();
    assert!(first.allowed && first.source == DecisionSource::Backend);
    // The same figures; each check has its own charge id.
    let mut same = twin.check_n(&s, 1).await.unwrap();
    assert_eq!(first.charge.take().map(|c| c.cost()), Some(1));
    assert_eq!(same.charge.take().map(|c| c.cost()), Some(1));
    assert_eq!(first, same);
    let second = match l.try_check_now(&s, 1) {
        Err(pending) => pending.send().await.unwrap(),
        Ok(d) => panic!("decided without Redis before any denial: {d:?}"),
    };
    assert!(!second.allowed && second.source == DecisionSource::Backend);
    assert_eq!(second, twin.check_n(&s, 1).await.unwrap());
    // Now the denial is cached: answered at once, no EVALSHA.
    let third = l.try_check_now(&s, 1).expect("cached").unwrap();
    assert!(!third.allowed && third.source == DecisionSource::DenyCache);
    // A cost that can never fit: at once, without Redis.
    assert!(matches!(
        l.try_check_now(&s, 2),
        Ok(Err(Error::CostExceedsCapacity {
            cost: 2,
            capacity: 1
        }))
    ));
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=4,"), "{stats}");
    assert!(!stats.contains("cmdstat_eval:"), "{stats}");
}

/// A backend that answers on the first poll but only implements
/// `check_rate` (a wrapper, say) still needs no timer from the runtime: the
/// limiter arms its timeout only for a call that is really pending.
#[test]
fn a_ready_backend_needs_no_timer() {
    #[derive(Debug)]
    struct Wrapper(MemoryBackend);
    impl RateBackend for Wrapper {
        fn check_rate<'a>(
            &'a self,
            request: &'a tollgate_core::store::RateRequest,
        ) -> futures_util::future::BoxFuture<
            'a,
            tollgate_core::Result<tollgate_core::store::RateReply>,
        > {
            self.0.check_rate(request)
        }
        fn local_rate(&self) -> std::sync::Arc<dyn tollgate_core::RateBackend> {
            std::sync::Arc::new(tollgate_core::MemoryBackend::new())
        }

        fn kind(&self) -> &'static str {
            "wrapper"
        }
    }
    let clock = ManualClock::starting_now();
    // No deny cache: both decide from their backend, figure for figure.
    let wrapped = RateLimiter::builder(
        Wrapper(MemoryBackend::with_clock(clock.clone())),
        Algorithm::Gcra,
    )
    .quota(q(2, 60))
    .deny_cache(0)
    .build()
    .unwrap();
    let plain = RateLimiter::builder(MemoryBackend::with_clock(clock.clone()), Algorithm::Gcra)
        .quota(q(2, 60))
        .deny_cache(0)
        .build()
        .unwrap();
    // No `enable_time`: arming a tokio timer here would panic.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for _ in 0..4 {
        let a = rt.block_on(wrapped.check("x")).unwrap();
        let b = rt.block_on(plain.check("x")).unwrap();
        assert_eq!(
            (a.allowed, a.remaining, a.retry_after),
            (b.allowed, b.remaining, b.retry_after)
        );
    }
}

/// The sliding log's memory stays bounded by the limit under a flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_memory_bounded_by_limit() {
    let clock = ManualClock::starting_now();
    let t = Target::new(Kind::Standalone, &clock).await;
    let p = prefix();
    let l = t.limiter(Algorithm::SlidingWindowLog, &[q(100, 60)], &p, &clock);
    for _ in 0..1000 {
        l.check("flood").await.unwrap();
    }
    let key = &l.keys_for(&"flood".into())[0];
    let card: u64 = server().cli(&["ZCARD", key]).parse().unwrap();
    assert_eq!(card, 100);
}

/// A cost of zero is a peek: admitted, takes nothing, and never an error
/// (an idle GCRA key or a full bucket once made Redis refuse `PX 0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_zero_is_a_harmless_peek() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[q(3, 60)], &p, &clock);
            for _ in 0..6 {
                let d = l.check_n("peek", 0).await.unwrap();
                assert!(d.allowed, "{kind:?} {alg:?}: {d:?}");
                assert_eq!(d.remaining, 3, "{kind:?} {alg:?}");
            }
            assert_eq!(
                l.check("peek").await.unwrap().remaining,
                2,
                "{kind:?} {alg:?}"
            );
        }
    }
}

/// A key of the wrong type (WRONGTYPE for the script's GET) is repaired:
/// read as absent and overwritten, so that subject is decided again, and
/// nothing opens the circuit for the others. Errors that remain about one
/// key's data are neither admitted nor counted by the breaker
/// (tests/rate_foreign.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clobbered_key_is_repaired_and_trips_nothing() {
    let server = RedisServer::start().unwrap();
    let conn = server.connection_manager().await;
    let l = RateLimiter::builder(RedisBackend::from_connection(conn.clone()), Algorithm::Gcra)
        .quota(q(100, 60))
        .circuit_breaker(2, Duration::from_secs(60))
        .failure_policy(FailurePolicy::Deny)
        .deny_cache(0)
        .build()
        .unwrap();
    let key = l.keys_for(&"clobbered".into())[0].clone();
    let mut c = conn.clone();
    let _: () = c.hset(&key, "f", "v").await.unwrap();
    for left in (90..100).rev() {
        let d = l.check("clobbered").await.unwrap();
        assert_eq!((d.source, d.remaining), (DecisionSource::Backend, left));
    }
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(kind, "string");
    let d = l.check("someone-else").await.unwrap();
    assert_eq!(d.source, DecisionSource::Backend);
}

/// During an outage the fallback never discounts a cost above its local
/// share (issue #16, defect 2: a cost-30 request on 40/h over 4 instances was
/// admitted and charged 10, so 4 instances admitted 120/h), and never turns a
/// cost that fits the global quota into "can never fit": it is a denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_denies_a_cost_above_the_local_share() {
    let limiters = on_a_stopped_redis(|_| q(40, 3600), 4).await;
    for l in &limiters {
        let alg = l.algorithm();
        let d = l.check_n("big", 30).await.unwrap();
        assert_eq!(d.source, DecisionSource::Fallback, "{alg:?}");
        assert!(!d.allowed, "{alg:?}: {d:?}");
        assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO), "{d:?}");
        assert_eq!(d.remaining, 10, "{alg:?}: nothing was taken");
        // The local share is whole: 10 units, then denials.
        assert!(l.check_n("big", 10).await.unwrap().allowed, "{alg:?}");
        assert!(!l.check_n("big", 1).await.unwrap().allowed, "{alg:?}");
        assert!(matches!(
            l.check_n("big", 41).await,
            Err(Error::CostExceedsCapacity { .. })
        ));
    }
}

/// A limit below the number of instances is shared over a longer period,
/// not one unit per period on each (which let 10 instances admit 10 an
/// hour on a limit of 2 an hour): here one unit per 5 hours each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_limit_is_shared_over_a_longer_period() {
    let limiters = on_a_stopped_redis(|_| q(2, 3600), 10).await;
    for l in &limiters {
        let alg = l.algorithm();
        let d = l.check("s").await.unwrap();
        assert_eq!(d.source, DecisionSource::Fallback, "{alg:?}");
        assert!(d.allowed, "{alg:?}: {d:?}");
        let share = d.quotas[0].quota;
        assert_eq!(share.limit(), 1, "{alg:?}");
        assert_eq!(share.period(), Duration::from_secs(5 * 3600), "{alg:?}");
        assert!(!l.check("s").await.unwrap().allowed, "{alg:?}");
    }
}

/// The deny cache stays bounded with far more blocked subjects than it
/// holds, and keeps answering correctly.
#[tokio::test]
async fn deny_cache_is_bounded() {
    let clock = ManualClock::starting_now();
    let l = RateLimiter::builder(MemoryBackend::with_clock(clock.clone()), Algorithm::Gcra)
        .quota(q(1, 3600))
        .clock(clock.clone())
        .deny_cache(64)
        .build()
        .unwrap();
    for i in 0..5_000u64 {
        assert!(l.check(i).await.unwrap().allowed);
        let d = l.check(i).await.unwrap();
        assert!(!d.allowed);
    }
    // Cached or not, every blocked subject stays blocked, and a new one is free.
    for i in (0..5_000u64).step_by(97) {
        assert!(!l.check(i).await.unwrap().allowed);
    }
    assert!(l.check(10_000u64).await.unwrap().allowed);
    clock.advance(Duration::from_secs(3601));
    assert!(l.check(0u64).await.unwrap().allowed);
}
