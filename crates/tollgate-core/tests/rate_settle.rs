//! Settles ([`RateLimiter::settle`]) for every algorithm, on memory, a
//! standalone Redis and a cluster: exactly once per charge (replays, and
//! refunds, which share the marker), the debt and its bound, the subject
//! and limiter a charge belongs to, several quotas, the horizon, and a
//! charge the outage fallback took.

mod rate_common;

use std::time::Duration;

use tollgate_core::{
    Algorithm, Decision, DecisionSource, Error, FailurePolicy, ManualClock, Quota, RateLimiter,
};

use rate_common::*;

/// `limit` per 10 s; a bucket's burst is the limit.
fn per_ten(alg: Algorithm, limit: u64) -> Quota {
    let q = q(limit, 10);
    if alg.uses_burst() {
        q.with_burst(limit).unwrap()
    } else {
        q
    }
}

fn limiter(
    t: &Target,
    alg: Algorithm,
    quotas: &[Quota],
    p: &str,
    clock: &ManualClock,
    debt: Option<u64>,
) -> RateLimiter {
    let mut b = RateLimiter::builder(t.backend.clone(), alg)
        .prefix(p)
        .clock(clock.clone())
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(5))
        .deny_cache(0);
    for q in quotas {
        b = b.quota(*q);
    }
    if let Some(debt) = debt {
        b = b.max_debt(debt);
    }
    b.build().unwrap()
}

/// The figures a check of cost 0 reports now.
async fn peek(l: &RateLimiter, subject: &str) -> Decision {
    // Its figures: the peek's own charge (of 0 units) is not a settle's.
    let mut d = l.check_n(subject, 0).await.unwrap();
    d.charge = None;
    d
}

/// A window-aligned start: 10 s windows begin at it.
const T0: u64 = 1_700_000_000_000_000;

/// Under the estimate the difference comes back, over it the subject owes
/// it; each exactly once: a replay, a refund after a settle and a settle
/// after a refund change nothing and say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_applies_exactly_once() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = limiter(&t, alg, &[per_ten(alg, 5)], &p, &clock, None);
            let what = format!("{kind:?} {alg:?}");
            // Under: 4 reserved, 1 used.
            let c = l.check_n("s", 4).await.unwrap().charge.unwrap();
            let s = l.settle("s", &c, 1).await.unwrap();
            assert!(s.applied, "{what}");
            assert_eq!(s.decision.remaining, 4, "{what}");
            assert!(s.decision.allowed, "{what}");
            assert_eq!(
                s.decision,
                peek(&l, "s").await,
                "{what}: as a check of 0 sees it"
            );
            let again = l.settle("s", &c, 1).await.unwrap();
            assert!(!again.applied, "{what}: replayed");
            assert_eq!(
                again.decision, s.decision,
                "{what}: a replay changes nothing"
            );
            assert!(
                !l.settle("s", &c, 0).await.unwrap().applied,
                "{what}: another amount"
            );
            assert!(
                !l.refund("s", &c).await.unwrap(),
                "{what}: refund after settle"
            );
            assert_eq!(peek(&l, "s").await.remaining, 4, "{what}");
            // A refund first: a settle after it does nothing.
            let c = l.check_n("s", 2).await.unwrap().charge.unwrap();
            assert!(l.refund("s", &c).await.unwrap(), "{what}");
            let s = l.settle("s", &c, 5).await.unwrap();
            assert!(!s.applied, "{what}: settle after refund");
            assert_eq!(s.decision.remaining, 4, "{what}");
            // Over: 3 reserved (1 left), 6 used: 2 owed beyond the limit.
            let c = l.check_n("s", 3).await.unwrap().charge.unwrap();
            let s = l.settle("s", &c, 6).await.unwrap();
            assert!(s.applied, "{what}");
            assert!(!s.decision.allowed, "{what}: in debt");
            assert_eq!(s.decision.remaining, 0, "{what}");
            assert!(s.decision.retry_after.is_some(), "{what}");
            assert_eq!(s.decision, peek(&l, "s").await, "{what}");
            let again = l.settle("s", &c, 6).await.unwrap();
            assert!(!again.applied, "{what}: replayed debt");
            assert_eq!(again.decision, s.decision, "{what}");
            assert!(!l.check("s").await.unwrap().allowed, "{what}: owes");
            // A settle to the charge's own cost changes nothing.
            let other = l.check_n("o", 2).await.unwrap().charge.unwrap();
            let s = l.settle("o", &other, 2).await.unwrap();
            assert!(!s.applied && s.decision.remaining == 3, "{what}: {s:?}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// A part of a charge (`Charge::part`) settled over its own cost adds the
/// difference, as the whole charge would: 5 taken, a part of 2 settled to
/// 4 leaves 3 of 10, on every store and algorithm (the log's new entries
/// are named apart from the check's, not moved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_settled_over_its_cost_adds_the_difference() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = limiter(&t, alg, &[per_ten(alg, 10)], &p, &clock, None);
            let what = format!("{kind:?} {alg:?}");
            let c = l.check_n("s", 5).await.unwrap().charge.unwrap();
            let s = l.settle("s", &c.part(2), 4).await.unwrap();
            assert!(s.applied, "{what}");
            assert_eq!(s.decision.remaining, 3, "{what}");
            assert_eq!(peek(&l, "s").await.remaining, 3, "{what}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// The debt never passes `max_debt`: however far over the estimate, the
/// subject is free again as soon as a debt of `max_debt` allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debt_is_bounded() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            // 10 per 10 s (a unit a second), at most 2 owed.
            let l = limiter(&t, alg, &[per_ten(alg, 10)], &p, &clock, Some(2));
            let what = format!("{kind:?} {alg:?}");
            let c = l.check_n("s", 10).await.unwrap().charge.unwrap();
            match alg {
                Algorithm::SlidingWindowLog => {
                    // 2 owed at 5 s: the 10 at 0 leave at 10 s, the 2 stay.
                    clock.advance(Duration::from_secs(5));
                    assert!(l.settle("s", &c, 1_000).await.unwrap().applied, "{what}");
                    clock.advance(Duration::from_secs(5));
                    assert_eq!(peek(&l, "s").await.remaining, 8, "{what}");
                }
                Algorithm::SlidingWindowCounter => {
                    // 12 in this window; at 9 s into the next it weighs ceil(1.2).
                    assert!(l.settle("s", &c, 1_000).await.unwrap().applied, "{what}");
                    clock.advance(Duration::from_secs(19));
                    assert_eq!(peek(&l, "s").await.remaining, 8, "{what}");
                }
                Algorithm::FixedWindow => {
                    // 12 counted: a give-back of 1 still leaves it over.
                    let s = l.settle("s", &c, 1_000).await.unwrap();
                    assert!(s.applied && !s.decision.allowed, "{what}");
                    clock.advance(Duration::from_secs(10));
                    assert_eq!(peek(&l, "s").await.remaining, 10, "{what}: a new window");
                }
                _ => {
                    // 12 s of refill owed: the debt is paid in 2 s and a
                    // unit is back a second later (the retry a request of
                    // one unit needs); 11 s on, 9 are back.
                    let s = l.settle("s", &c, 1_000).await.unwrap();
                    assert!(s.applied && !s.decision.allowed, "{what}");
                    assert_eq!(
                        s.decision.retry_after,
                        Some(Duration::from_secs(3)),
                        "{what}"
                    );
                    clock.advance(Duration::from_secs(11));
                    assert_eq!(peek(&l, "s").await.remaining, 9, "{what}");
                }
            }
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// A debt is owed within its horizon (the longer of the charge's refund
/// span and the longest period); a settle after it changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_debt_is_refused() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = limiter(&t, alg, &[per_ten(alg, 5)], &p, &clock, None);
            let what = format!("{kind:?} {alg:?}");
            let c = l.check_n("s", 1).await.unwrap().charge.unwrap();
            // The counter's span is two periods.
            let horizon = if alg == Algorithm::SlidingWindowCounter {
                20
            } else {
                10
            };
            clock.advance(Duration::from_secs(horizon));
            let s = l.settle("s", &c, 5).await.unwrap();
            assert!(!s.applied, "{what}");
            assert_eq!(s.decision.remaining, 5, "{what}: nothing owed");
            // A give-back's marker outlives its own (shorter) horizon: a
            // debt settled later, within the debt's, is still a replay.
            let c = l.check_n("s", 5).await.unwrap().charge.unwrap();
            assert!(l.settle("s", &c, 4).await.unwrap().applied, "{what}");
            clock.advance(Duration::from_secs(horizon) - Duration::from_millis(1));
            assert!(!l.settle("s", &c, 9).await.unwrap().applied, "{what}: once");
        }
    }
}

/// A charge belongs to its subject and limiter: settled for another, it is
/// refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_settles_only_its_own_subject() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = limiter(&t, alg, &[per_ten(alg, 5)], &p, &clock, None);
            let other = limiter(&t, alg, &[per_ten(alg, 5)], &format!("{p}-o"), &clock, None);
            let what = format!("{kind:?} {alg:?}");
            let c = l.check_n("a", 2).await.unwrap().charge.unwrap();
            l.check_n("b", 1).await.unwrap();
            for (lim, subject) in [(&l, "b"), (&other, "a")] {
                for actual in [0, 5] {
                    let e = lim.settle(subject, &c, actual).await.unwrap_err();
                    assert!(matches!(e, Error::InvalidConfig(_)), "{what}: {e:?}");
                }
            }
            assert_eq!(peek(&l, "a").await.remaining, 3, "{what}");
            assert_eq!(peek(&l, "b").await.remaining, 4, "{what}");
            assert_eq!(peek(&other, "a").await.remaining, 5, "{what}");
            // Still open for its own subject.
            assert!(l.settle("a", &c, 4).await.unwrap().applied, "{what}");
            assert_eq!(peek(&l, "a").await.remaining, 1, "{what}");
        }
    }
}

/// With several quotas every quota is corrected, all in one call, and the
/// figures are the strictest quota's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_quota_is_settled() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let quotas = [per_ten(alg, 5), {
                let q = q(20, 60);
                if alg.uses_burst() {
                    q.with_burst(20).unwrap()
                } else {
                    q
                }
            }];
            let l = limiter(&t, alg, &quotas, &p, &clock, None);
            let what = format!("{kind:?} {alg:?}");
            let c = l.check_n("s", 3).await.unwrap().charge.unwrap();
            let s = l.settle("s", &c, 1).await.unwrap();
            assert!(s.applied, "{what}");
            let left: Vec<u64> = s.decision.quotas.iter().map(|q| q.remaining).collect();
            assert_eq!(left, [4, 19], "{what}");
            let c = l.check_n("s", 2).await.unwrap().charge.unwrap();
            let s = l.settle("s", &c, 9).await.unwrap();
            assert!(s.applied && !s.decision.allowed, "{what}: {s:?}");
            let left: Vec<u64> = s.decision.quotas.iter().map(|q| q.remaining).collect();
            // The first quota owes 5; the second has 20 - 10 left.
            assert_eq!(left, [0, 10], "{what}");
            assert!(
                !s.decision.quotas[0].allowed && s.decision.quotas[1].allowed,
                "{what}"
            );
            assert_eq!(s.decision, peek(&l, "s").await, "{what}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// A charge the outage fallback took is settled on that fallback, where
/// it was taken, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_charge_settles_on_the_fallback() {
    let limiters = on_a_stopped_redis(|alg| per_ten(alg, 40), 4).await;
    for l in &limiters {
        let alg = l.algorithm();
        // The local share: 10.
        let d = l.check_n("s", 6).await.unwrap();
        assert_eq!(d.source, DecisionSource::Fallback, "{alg:?}");
        let c = d.charge.unwrap();
        let s = l.settle("s", &c, 2).await.unwrap();
        assert!(s.applied, "{alg:?}");
        assert_eq!(s.decision.source, DecisionSource::Fallback, "{alg:?}");
        assert_eq!(s.decision.remaining, 8, "{alg:?}");
        assert!(!l.settle("s", &c, 2).await.unwrap().applied, "{alg:?}");
        assert!(!l.refund("s", &c).await.unwrap(), "{alg:?}");
        // Over the estimate, the local share's debt (its capacity).
        let c = l.check_n("s", 8).await.unwrap().charge.unwrap();
        let s = l.settle("s", &c, 12).await.unwrap();
        assert!(s.applied && !s.decision.allowed, "{alg:?}: {s:?}");
    }
}

/// A bucket gives back only what its schedule still holds of a charge: the
/// part time has refilled since was used (another check took it). 5 per
/// 5 s, no debt: A takes 5; 4 s later 4 have refilled and B takes them;
/// settling A to 0 then gives back 1 (what A still held), never 5 — had A
/// cost nothing, the bucket would have held 5 at B, and 1 after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_gives_back_only_what_has_not_refilled() {
    for kind in KINDS {
        for alg in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let quota = Quota::new(5, Duration::from_secs(5)).unwrap();
            let l = limiter(&t, alg, &[quota], &prefix(), &clock, Some(0));
            let a = l.check_n("s", 5).await.unwrap();
            let charge = a.charge.expect("A took 5");
            clock.advance(Duration::from_secs(4));
            assert!(l.check_n("s", 4).await.unwrap().allowed, "{what}");
            let s = l.settle("s", &charge, 0).await.unwrap();
            assert!(s.applied, "{what}");
            assert_eq!(s.decision.remaining, 1, "{what}: one unit came back");
            assert!(l.check_n("s", 2).await.unwrap().is_denied(), "{what}");
            assert!(l.check_n("s", 1).await.unwrap().allowed, "{what}");
        }
    }
}

/// A debt as large as `max_debt(u64::MAX)` allows ends at most 2^40 µs
/// ahead: the store keeps it (a bucket's instant past 2^53 µs would read
/// as no value and forgive it), and the twin agrees; a log's debt is at most
/// `MAX_LOG_LIMIT` entries, so a huge settle stays one quick call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_debt_is_kept_and_bounded() {
    const MOST_AHEAD: Duration = Duration::from_micros(1 << 40);
    for kind in KINDS {
        for alg in Algorithm::ALL {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let l = limiter(
                &t,
                alg,
                &[per_ten(alg, 10)],
                &prefix(),
                &clock,
                Some(u64::MAX),
            );
            let a = l.check_n("s", 1).await.unwrap();
            let s = l.settle("s", &a.charge.unwrap(), u64::MAX).await.unwrap();
            assert!(s.applied, "{what}");
            assert!(!s.decision.allowed, "{what}: in debt");
            let next = l.check_n("s", 1).await.unwrap();
            assert!(next.is_denied(), "{what}: the debt was kept");
            let retry = next.retry_after.unwrap();
            if alg.uses_burst() {
                assert!(retry > MOST_AHEAD / 2, "{what}: {retry:?}");
                assert!(retry <= MOST_AHEAD, "{what}: {retry:?}");
            }
        }
    }
}

/// A bucket's huge debt is kept on a quota whose time unit is a small
/// fraction of a µs (10 007 per minute: 1/10 007 µs), where 2^40 µs ahead
/// is beyond the 2^52 units a stored instant is read within: the debt is
/// bounded to what is read back, so it is kept on Redis as in memory.
#[tokio::test]
async fn a_huge_debt_is_kept_on_a_fine_unit() {
    for kind in KINDS {
        for alg in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::new(T0);
            let t = Target::new(kind, &clock).await;
            let quota = Quota::per_minute(10_007).with_burst(10_007).unwrap();
            for debt in [u64::MAX, 100_000_000] {
                let l = limiter(&t, alg, &[quota], &prefix(), &clock, Some(debt));
                let a = l.check_n("s", 1).await.unwrap();
                let s = l.settle("s", &a.charge.unwrap(), u64::MAX).await.unwrap();
                assert!(s.applied, "{what}");
                assert!(!s.decision.allowed, "{what} {debt}: in debt {s:?}");
                let next = l.check_n("s", 1).await.unwrap();
                assert!(
                    next.is_denied(),
                    "{what} {debt}: the debt was kept {next:?}"
                );
            }
        }
    }
}
