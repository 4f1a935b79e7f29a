//! GCRA and the token bucket against `governor`, decision by decision and
//! figure by figure, over random schedules on a virtual clock — with the
//! local deny cache on and off. A cached denial must say what the store
//! would: the limiter with its cache and the one without answer alike.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock as _, FakeRelativeClock};
use governor::middleware::StateInformationMiddleware;
use governor::{Quota as GovernorQuota, RateLimiter as Governor};
use proptest::prelude::*;
use tollgate_core::{Algorithm, Decision, Error, ManualClock, MemoryBackend, Quota, RateLimiter};

/// One step: advance the clock by `gap` µs, then ask for `cost` units.
#[derive(Debug, Clone, Copy)]
struct Step {
    gap: u64,
    cost: u64,
}

fn limiter(alg: Algorithm, quota: Quota, clock: &ManualClock, cache: usize) -> RateLimiter {
    RateLimiter::builder(MemoryBackend::with_clock(clock.clone()), alg)
        .quota(quota)
        .clock(clock.clone())
        .deny_cache(cache)
        .build()
        .unwrap()
}

/// The figures a decision reports, without where it came from.
fn figures(d: &Decision) -> impl PartialEq + std::fmt::Debug {
    let q = &d.quotas[0];
    (
        d.allowed,
        d.remaining,
        d.retry_after,
        d.reset_after,
        (q.remaining, q.retry_after, q.reset_after, q.next_after),
    )
}

fn run(alg: Algorithm, interval_us: u64, burst: u32, steps: &[Step]) -> Result<(), TestCaseError> {
    let quota = Quota::new(1, Duration::from_micros(interval_us))
        .unwrap()
        .with_burst(u64::from(burst))
        .unwrap();
    let clock = ManualClock::new(1_700_000_000_000_000);
    let cached = limiter(alg, quota, &clock, 1_000);
    let uncached = limiter(alg, quota, &clock, 0);
    let fake = FakeRelativeClock::default();
    let gq = GovernorQuota::with_period(Duration::from_micros(interval_us))
        .unwrap()
        .allow_burst(NonZeroU32::new(burst).unwrap());
    let oracle = Governor::direct_with_clock(gq, fake.clone())
        .with_middleware::<StateInformationMiddleware>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (i, s) in steps.iter().enumerate() {
        clock.advance(Duration::from_micros(s.gap));
        fake.advance(Duration::from_micros(s.gap));
        let with = rt.block_on(cached.check_n("k", s.cost));
        let without = rt.block_on(uncached.check_n("k", s.cost));
        let expected = oracle.check_n(NonZeroU32::new(s.cost as u32).unwrap());
        match expected {
            Err(_) => {
                prop_assert!(
                    matches!(with, Err(Error::CostExceedsCapacity { .. }))
                        && matches!(without, Err(Error::CostExceedsCapacity { .. })),
                    "step {i} {s:?}: {with:?} / {without:?}"
                );
                continue;
            }
            Ok(Ok(snapshot)) => {
                let (with, without) = (with.unwrap(), without.unwrap());
                prop_assert!(without.allowed, "step {i} {s:?}: {without:?}");
                prop_assert_eq!(
                    without.remaining,
                    u64::from(snapshot.remaining_burst_capacity()),
                    "step {} {:?}",
                    i,
                    s
                );
                prop_assert_eq!(figures(&with), figures(&without), "step {} {:?}", i, s);
            }
            Ok(Err(not_until)) => {
                let (with, without) = (with.unwrap(), without.unwrap());
                let wait = not_until.wait_time_from(fake.now());
                prop_assert!(!without.allowed, "step {i} {s:?}: {without:?}");
                prop_assert_eq!(without.retry_after, Some(wait), "step {} {:?}", i, s);
                prop_assert_eq!(figures(&with), figures(&without), "step {} {:?}", i, s);
            }
        }
    }
    Ok(())
}

fn schedules() -> impl Strategy<Value = (u64, u32, Vec<Step>)> {
    // Emission intervals of whole microseconds, as governor keeps them.
    (
        prop::sample::select(vec![1_000u64, 250_000, 1_000_000, 333_333]),
        1u32..=6,
    )
        .prop_flat_map(|(interval, burst)| {
            let step = (0..=interval * 3, 1..=u64::from(burst) + 1)
                .prop_map(|(gap, cost)| Step { gap, cost });
            // Mostly short gaps, so denials (and cached denials) come often.
            let short = (0..=interval / 2, 1..=u64::from(burst) + 1)
                .prop_map(|(gap, cost)| Step { gap, cost });
            let steps = prop::collection::vec(prop_oneof![1 => step, 3 => short], 1..60);
            (Just(interval), Just(burst), steps)
        })
}

proptest! {
    #[test]
    fn gcra_decides_as_governor((interval, burst, steps) in schedules()) {
        run(Algorithm::Gcra, interval, burst, &steps)?;
    }

    #[test]
    fn token_bucket_decides_as_governor((interval, burst, steps) in schedules()) {
        run(Algorithm::TokenBucket, interval, burst, &steps)?;
    }
}

/// The case that shipped: after a denial of 1 unit, a denial of 3 must say
/// when 3 fit (3 s), not the cached wait for 1 (1 s).
#[test]
fn a_cached_denial_never_answers_for_another_cost() {
    let steps = [
        Step { gap: 0, cost: 5 },
        Step { gap: 0, cost: 1 },
        Step { gap: 0, cost: 3 },
        Step {
            gap: 400_000,
            cost: 3,
        },
        Step {
            gap: 700_000,
            cost: 1,
        },
    ];
    for alg in [Algorithm::Gcra, Algorithm::TokenBucket] {
        run(alg, 1_000_000, 5, &steps).unwrap();
    }
}
