//! Rates are exact (issue #16, defect 5): over a long span of simulated time,
//! a limiter admits exactly what its quota says — `limit × span / period`,
//! plus the burst a full bucket starts with — on memory, a standalone Redis
//! and a cluster. The buckets' emission interval (`period / limit`) is kept
//! as an exact fraction: rounded up to whole microseconds, as it once was,
//! `Quota::per_second(999_999)` admitted half its rate and 3 per 7 µs
//! admitted 7 of every 9. What cannot be kept exact is refused at build
//! time, with a clear error.

mod rate_common;

use std::time::Duration;

use tollgate_core::{Algorithm, Error, ManualClock, MemoryBackend, Quota, RateLimiter};

use rate_common::*;

/// A start on a whole day: every window starts at a known instant.
const START: u64 = 1_699_920_000_000_000;

/// Runs `steps` steps of `step` on `alg` under `quota`, taking everything
/// there is at each step (a cost-0 peek, then its remaining), and returns
/// how many units were admitted. Each take must be admitted: a peek that
/// promises more than a check admits is a defect of its own.
async fn drain(kind: Kind, alg: Algorithm, quota: Quota, step: Duration, steps: u64) -> u64 {
    // On a period boundary: a fixed window's span covers whole windows.
    let clock = ManualClock::new(START.next_multiple_of(quota.period_micros()));
    let t = Target::new(kind, &clock).await;
    let p = prefix();
    let l = t.limiter(alg, &[quota], &p, &clock);
    let mut taken = 0;
    for i in 0..steps {
        let room = l.check_n("s", 0).await.unwrap().quotas[0].remaining;
        if room > 0 {
            let d = l.check_n("s", room).await.unwrap();
            assert!(
                d.allowed,
                "{kind:?} {alg:?} {quota:?} step {i}: {room} promised, {d:?}"
            );
            taken += room;
            // Nothing is left over: the figures after a take are exact.
            assert_eq!(
                d.quotas[0].remaining, 0,
                "{kind:?} {alg:?} {quota:?} step {i}"
            );
        }
        clock.advance(step);
    }
    // Every key has a TTL; checked where the last key outlives the scan by
    // far (a short quota's key may expire, in real time, before it).
    if quota.burst() * quota.interval_micros() >= 10_000_000 {
        t.assert_all_keys_expire(&p, &clock).await;
    }
    taken
}

/// The buckets: a full bucket (the burst) at the start, then exactly
/// `floor(span × limit / period)` more, however odd the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_admit_exactly_the_rate() {
    let micros = Duration::from_micros;
    // (quota, step, steps): each span is `step × steps`, the last take at
    // `step × (steps - 1)`; steps short enough that the bucket never fills.
    let cases = [
        (Quota::per_second(999_999), micros(100_000), 101),
        (Quota::per_second(700_000), micros(100_000), 101),
        (Quota::per_second(1_000_000), micros(100_000), 101),
        (Quota::per_second(3), micros(100_000), 101),
        (
            Quota::new(3, micros(7))
                .unwrap()
                .with_burst(1_000_000)
                .unwrap(),
            micros(100_000),
            101,
        ),
        (
            Quota::new(999_983, Duration::from_secs(7)).unwrap(),
            micros(1_000_000),
            11,
        ),
        (Quota::per_day(1), Duration::from_secs(3600), 24 * 10 + 1),
        (Quota::per_day(7), Duration::from_secs(3600), 24 * 10 + 1),
        (
            Quota::per_hour(999_999).with_burst(1000).unwrap(),
            micros(3_000),
            3_001,
        ),
    ];
    let mut wrong = Vec::new();
    for kind in KINDS {
        for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
            for &(quota, step, steps) in &cases {
                let span = step.as_micros() as u64 * (steps - 1);
                let refill = u128::from(span) * u128::from(quota.limit())
                    / u128::from(quota.period_micros());
                let expected = quota.burst() + refill as u64;
                let taken = drain(kind, alg, quota, step, steps).await;
                if taken != expected {
                    wrong.push(format!(
                        "{kind:?} {alg:?} {quota:?} over {span} µs: admitted {taken} of {expected}"
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The windows count per period: exact already. A fixed window admits its
/// limit per window; the log and the counter `limit` per period give or
/// take one period's worth at the ends of the span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_admit_exactly_the_rate() {
    for kind in KINDS {
        for (alg, quota) in [
            (Algorithm::FixedWindow, Quota::per_second(999_999)),
            (
                Algorithm::FixedWindow,
                Quota::new(999_983, Duration::from_secs(7)).unwrap(),
            ),
            (Algorithm::SlidingWindowCounter, Quota::per_second(999_999)),
            (
                Algorithm::SlidingWindowLog,
                Quota::new(997, Duration::from_millis(700)).unwrap(),
            ),
        ] {
            // 10 periods, in steps of a tenth. (Periods of a second at
            // least: a Redis key's TTL runs in real time.)
            let period = quota.period_micros();
            let (step, steps) = (period / 10, 100);
            let taken = drain(kind, alg, quota, Duration::from_micros(step), steps).await;
            let expected = 10 * quota.limit();
            if alg == Algorithm::FixedWindow {
                assert_eq!(taken, expected, "{kind:?} {alg:?} {quota:?}");
            } else {
                assert!(
                    taken.abs_diff(expected) <= quota.limit(),
                    "{kind:?} {alg:?} {quota:?}: admitted {taken} of {expected}"
                );
            }
        }
    }
}

/// The memory twins agree with the scripts figure for figure on odd rates
/// too (fractional intervals, with the fraction carried in the state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twins_match_the_scripts_on_odd_rates() {
    let mut seed: u64 = 0x1234_5678_9ABC_DEF1;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // Each refills in seconds at least: a Redis key's TTL runs in real
    // time, and the manual clock must not outlive it.
    let quotas = [
        Quota::per_second(999_999).with_burst(5_000_000).unwrap(),
        Quota::new(3, Duration::from_micros(7))
            .unwrap()
            .with_burst(3_000_000)
            .unwrap(),
        Quota::per_day(7).with_burst(3).unwrap(),
    ];
    for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
        // Near the epoch too: a full bucket's empty instant is negative.
        for start in [START, 3] {
            let clock = ManualClock::new(start);
            let mem = Target::new(Kind::Memory, &clock).await;
            let redis = Target::new(Kind::Standalone, &clock).await;
            let p = prefix();
            for (i, quota) in quotas.iter().enumerate() {
                let set = [*quota, quotas[(i + 1) % quotas.len()]];
                for n in [1, 2] {
                    let a = mem.limiter(alg, &set[..n], &p, &clock);
                    let b = redis.limiter(alg, &set[..n], &p, &clock);
                    // Steps of up to a third of a refill and costs up to
                    // two fifths of the burst: bursts, denials and refills.
                    let burst = set[..n].iter().map(Quota::burst).min().unwrap();
                    let refill = quota.burst() * quota.interval_micros();
                    for step in 0..300 {
                        clock.advance(Duration::from_micros(next(refill / 3 + 3)));
                        let cost = next(burst * 2 / 5 + 2);
                        let mut da = a.check_n("same", cost).await.unwrap();
                        let mut db = b.check_n("same", cost).await.unwrap();
                        let charge = |d: &mut tollgate_core::Decision| d.charge.take();
                        let (ca, cb) = (charge(&mut da), charge(&mut db));
                        assert_eq!(da, db, "{alg:?} {:?} from {start} step {step}", &set[..n]);
                        assert_eq!(ca.map(|c| c.cost()), cb.map(|c| c.cost()));
                        // Refunds agree too: what comes back is what the next
                        // decision sees.
                        if let (Some(ca), Some(cb)) = (ca, cb) {
                            if next(3) == 0 {
                                assert_eq!(
                                    a.refund("same", &ca).await.unwrap(),
                                    b.refund("same", &cb).await.unwrap()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What the buckets cannot keep exact is an error at build time, never a
/// panic and never a silently slower rate; a fixed window takes the same
/// quota.
#[test]
fn what_cannot_be_exact_is_refused() {
    // 1 000 003 (prime) per day: the interval is 86 400 000 000 / 1 000 003
    // µs, whose burst spans ~8.6e16 units of 1/1 000 003 µs: past 2^50.
    let q = Quota::per_day(1_000_003);
    for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let e = RateLimiter::builder(MemoryBackend::new(), alg)
            .quota(q)
            .build()
            .err()
            .unwrap_or_else(|| panic!("{alg:?} accepted {q:?}"));
        assert!(matches!(e, Error::InvalidQuota(_)), "{e}");
        assert!(e.to_string().contains("exact"), "{e}");
        // A smaller burst fits.
        let small = q.with_burst(1000).unwrap();
        RateLimiter::builder(MemoryBackend::new(), alg)
            .quota(small)
            .build()
            .unwrap();
    }
    // (The counter and the log have rules of their own for such limits.)
    RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
        .quota(q)
        .build()
        .unwrap();
    // A period that is not a whole number of microseconds cannot be kept.
    assert!(matches!(
        Quota::new(3, Duration::from_nanos(7_500)),
        Err(Error::InvalidQuota(_))
    ));
    assert!(Quota::new(3, Duration::from_nanos(7_000)).is_ok());
}

/// A bucket's stored instant is whole µs plus `:<fraction>`: a value of that
/// shape that no script writes is read as absent and overwritten (never a
/// script error, never a permanent fail-open), and a fraction of another
/// quota's units (the quota changed under the same name) is rounded up to
/// the next whole µs, which is stricter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_fractions_are_repaired() {
    let clock = ManualClock::new(START);
    let t = Target::new(Kind::Standalone, &clock).await;
    // 3 per 7 µs, a burst of 10: one unit every 7/3 µs.
    let quota = Quota::new(3, Duration::from_micros(7))
        .unwrap()
        .with_burst(10)
        .unwrap();
    for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
        for bad in ["1:2:3", "x:1", "5:nan", "5:-1", ":", "5:", "nan", "inf:0"] {
            let p = prefix();
            let l = t.limiter(alg, &[quota], &p, &clock);
            let key = l.keys_for(&"s".into()).remove(0);
            server().cli(&["SET", &key, bad, "PX", "60000"]);
            let d = l
                .check("s")
                .await
                .unwrap_or_else(|e| panic!("{alg:?} {bad}: {e}"));
            assert!(d.allowed, "{alg:?} {bad}: {d:?}");
            assert_eq!(d.remaining, 9, "{alg:?} {bad}: read as absent");
            let stored = server().cli(&["GET", &key]);
            assert_ne!(stored, bad, "{alg:?}: overwritten");
        }
        // A fraction past this quota's units: the next whole µs. GCRA: a
        // TAT 5 µs + (rounded up) 1 µs ahead holds 6 µs = 18/7 of the burst's
        // 10 × 7/3 µs, so 10 - ceil(18/7) = 7 whole units remain before this
        // check. The bucket: empty 3 µs ago, rounded up to 2 µs ago = 6/7 of
        // a unit: none yet.
        let p = prefix();
        let l = t.limiter(alg, &[quota], &p, &clock);
        let key = l.keys_for(&"s".into()).remove(0);
        let (at, want) = match alg {
            Algorithm::Gcra => (START + 5, Some(6)),
            _ => (START - 3, None),
        };
        server().cli(&["SET", &key, &format!("{at}:7"), "PX", "60000"]);
        let d = l.check("s").await.unwrap();
        match want {
            Some(left) => assert_eq!(d.remaining, left, "{d:?}"),
            None => assert!(!d.allowed, "{d:?}"),
        }
    }
}
