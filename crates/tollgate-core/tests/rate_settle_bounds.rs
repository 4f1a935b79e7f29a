//! Settles over long random runs on a virtual clock, for every algorithm:
//! the units the limiter admits (each charge's cost, corrected by its
//! settle) never exceed the quota plus `max_debt` (the exact bound per
//! algorithm below), on memory, a standalone Redis and a cluster; and the
//! memory twin answers every settle as the script does, figure for figure.

mod rate_common;

use std::time::Duration;

use tollgate_core::{Algorithm, Charge, Clock, FailurePolicy, ManualClock, Quota, RateLimiter};

use rate_common::*;

/// A window-aligned start.
const T0: u64 = 1_700_000_000_000_000;

struct Rand(u64);

impl Rand {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn limiter(
    t: &Target,
    alg: Algorithm,
    q: Quota,
    p: &str,
    clock: &ManualClock,
    debt: Option<u64>,
) -> RateLimiter {
    let mut b = RateLimiter::builder(t.backend.clone(), alg)
        .quota(q)
        .prefix(p)
        .clock(clock.clone())
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(5))
        .deny_cache(0);
    if let Some(debt) = debt {
        b = b.max_debt(debt);
    }
    b.build().unwrap()
}

/// Units the limiter counted, signed, at the instant they count: a check's
/// cost at its instant; a debt at its settle's; a give-back at the charge's
/// instant (the charge cost that much less then: a bucket must not give
/// back what has refilled since and another check may have taken).
type Ledger = Vec<(u64, i128)>;

/// The bound every algorithm keeps, `limit` (burst for buckets) per
/// `period` µs with at most `debt` owed:
/// - fixed window, sliding window counter: each fixed window counts at most
///   limit + debt;
/// - sliding window log: any period (t - period, t] at most limit + debt;
/// - token bucket, GCRA: any span [t0, t1] at most
///   burst + debt + (t1 - t0) / interval (interval = period / limit).
fn check_bound(alg: Algorithm, ledger: &Ledger, limit: u64, period: u64, debt: u64, what: &str) {
    let most = i128::from(limit + debt);
    match alg {
        Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
            let mut windows = std::collections::BTreeMap::new();
            for (t, u) in ledger {
                *windows.entry(t / period).or_insert(0i128) += u;
            }
            for (w, sum) in windows {
                assert!(sum <= most, "{what}: window {w} counted {sum} > {most}");
            }
        }
        Algorithm::SlidingWindowLog => {
            for (end, _) in ledger {
                let sum: i128 = ledger
                    .iter()
                    .filter(|(t, _)| t + period > *end && t <= end)
                    .map(|(_, u)| u)
                    .sum();
                assert!(
                    sum <= most,
                    "{what}: the period to {end} counted {sum} > {most}"
                );
            }
        }
        _ => {
            // A give-back counts at its charge's instant: not in order.
            let mut times: Vec<u64> = ledger.iter().map(|(t, _)| *t).collect();
            times.sort_unstable();
            times.dedup();
            for (i, t0) in times.iter().enumerate() {
                for t1 in &times[i..] {
                    let sum: i128 = ledger
                        .iter()
                        .filter(|(t, _)| t >= t0 && t <= t1)
                        .map(|(_, u)| u)
                        .sum();
                    // sum ≤ most + (t1 - t0) · limit / period, in integers.
                    let room = most * i128::from(period) + i128::from(t1 - t0) * i128::from(limit);
                    assert!(
                        sum * i128::from(period) <= room,
                        "{what}: [{t0}, {t1}] counted {sum}"
                    );
                }
            }
        }
    }
}

/// Batches of admitted checks, then their settles in random order with
/// random actual costs (each batch owing at most `max_debt` in all, so the
/// store never has to cut a debt short and the ledger is exactly what it
/// counted), time moving at random throughout and faster than the quota
/// refills: the bound holds after every step, and the debts bite (some
/// checks are refused while the subject owes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_actual_costs_stay_within_the_quota_plus_the_debt() {
    let mut rand = Rand(0x9E37_79B9_7F4A_7C15);
    for kind in KINDS {
        for alg in ALL {
            for debt in [Some(4), None, Some(0)] {
                let clock = ManualClock::new(T0);
                let t = Target::new(kind, &clock).await;
                let p = prefix();
                // 6 per 4 s: a bucket's interval is 2/3 s, not whole µs.
                let (limit, period) = (6, 4_000_000);
                let quota = Quota::new(limit, Duration::from_micros(period)).unwrap();
                let quota = if alg.uses_burst() {
                    quota.with_burst(limit).unwrap()
                } else {
                    quota
                };
                let l = limiter(&t, alg, quota, &p, &clock, debt);
                let debt = debt.unwrap_or(limit);
                let what = format!("{kind:?} {alg:?} debt {debt}");
                let (mut ledger, mut refused, mut owed) = (Ledger::new(), 0, 0);
                for _ in 0..60 {
                    let mut open: Vec<Charge> = Vec::new();
                    for _ in 0..1 + rand.below(3) {
                        clock.advance(Duration::from_micros(rand.below(500_000)));
                        let d = l.check_n("s", 1 + rand.below(3)).await.unwrap();
                        match d.charge {
                            Some(c) => {
                                ledger.push((c.at_micros(), i128::from(c.cost())));
                                open.push(c);
                            }
                            None => refused += 1,
                        }
                        check_bound(alg, &ledger, limit, period, debt, &what);
                    }
                    let mut budget = debt;
                    while !open.is_empty() {
                        let c = open.swap_remove(rand.below(open.len() as u64) as usize);
                        clock.advance(Duration::from_micros(rand.below(500_000)));
                        let actual = rand.below(c.cost() + budget + 1);
                        let s = l.settle("s", &c, actual).await.unwrap();
                        if actual > c.cost() {
                            assert!(s.applied, "{what}: a debt within its horizon");
                            budget -= actual - c.cost();
                            owed += 1;
                            ledger.push((clock.now_micros(), i128::from(actual - c.cost())));
                        } else if actual < c.cost() && s.applied {
                            // (A give-back past the charge's span gives nothing.)
                            ledger.push((c.at_micros(), -i128::from(c.cost() - actual)));
                        } else if actual == c.cost() {
                            assert!(!s.applied, "{what}: nothing to correct");
                        }
                        check_bound(alg, &ledger, limit, period, debt, &what);
                    }
                }
                // Without debt (the bound is then exact) nothing is owed.
                assert!(
                    refused > 10 && (owed > 5 || debt == 0),
                    "{what}: {refused} refused, {owed} debts"
                );
                t.assert_all_keys_expire(&p, &clock).await;
            }
        }
    }
}

/// The memory twin and the settle scripts agree: a random sequence of
/// checks and settles (under and over the estimate, replayed, late, past
/// the debt bound), on one and two quotas, gives identical settlements and
/// decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_twin_matches_the_settle_scripts() {
    let mut rand = Rand(0x5DEE_CE66_D1CE_4E5B);
    for alg in ALL {
        for (quotas, debt) in [
            (
                vec![Quota::new(5, Duration::from_millis(1500)).unwrap()],
                Some(3),
            ),
            (
                vec![
                    Quota::new(5, Duration::from_millis(1500)).unwrap(),
                    q(20, 20),
                ],
                None,
            ),
        ] {
            let clock = ManualClock::new(T0);
            let mem = Target::new(Kind::Memory, &clock).await;
            let redis = Target::new(Kind::Standalone, &clock).await;
            let p = prefix();
            let build = |t: &Target| {
                let mut b = RateLimiter::builder(t.backend.clone(), alg)
                    .prefix(&p)
                    .clock(clock.clone())
                    .failure_policy(FailurePolicy::Deny)
                    .timeout(Duration::from_secs(5))
                    .deny_cache(0);
                for q in &quotas {
                    b = b.quota(*q);
                }
                if let Some(debt) = debt {
                    b = b.max_debt(debt);
                }
                b.build().unwrap()
            };
            let (a, b) = (build(&mem), build(&redis));
            let mut charges: Vec<(Charge, Charge)> = Vec::new();
            let (mut applied, mut over) = (0, 0);
            for step in 0..500 {
                let what = format!("{alg:?} {} quotas, step {step}", quotas.len());
                clock.advance(Duration::from_micros(rand.below(300_000)));
                if rand.below(2) == 0 && !charges.is_empty() {
                    // Mostly recent charges (older ones are replays or late).
                    let back = rand.below(charges.len().min(6) as u64) as usize;
                    let (ca, cb) = charges[charges.len() - 1 - back];
                    let actual = rand.below(ca.cost() * 3 + 4);
                    let sa = a.settle("s", &ca, actual).await.unwrap();
                    let sb = b.settle("s", &cb, actual).await.unwrap();
                    assert_eq!(sa, sb, "{what}: settle {} to {actual}", ca.cost());
                    applied += u32::from(sa.applied);
                    over += u32::from(sa.applied && actual > ca.cost());
                    continue;
                }
                let cost = rand.below(4);
                let mut da = a.check_n("s", cost).await.unwrap();
                let mut db = b.check_n("s", cost).await.unwrap();
                if let (Some(ca), Some(cb)) = (da.charge.take(), db.charge.take()) {
                    assert_eq!((ca.cost(), ca.at_micros()), (cb.cost(), cb.at_micros()));
                    charges.push((ca, cb));
                }
                assert_eq!(da, db, "{what}");
            }
            assert!(
                applied >= 10 && over >= 5,
                "{alg:?}: {applied} applied, {over} debts"
            );
        }
    }
}
