//! Draft-10's `t` ([`QuotaDecision::next_after`]): for every algorithm, on
//! memory, a standalone Redis and a cluster, more quota is made available
//! exactly when `t` says — not a microsecond earlier, and at `t` itself —
//! and a denial's retry-after never points before it.
//!
//! [`QuotaDecision::next_after`]: tollgate_core::QuotaDecision::next_after

mod rate_common;

use std::time::Duration;

use tollgate_core::{Algorithm, ManualClock, Quota};

use rate_common::*;

/// Window quotas: 5 per 10 s. Buckets: the quickstart's, a burst of 5 that
/// refills one every 2 s.
fn quota(alg: Algorithm) -> Quota {
    if alg.uses_burst() {
        Quota::new(1, Duration::from_secs(2))
            .and_then(|q| q.with_burst(5))
            .unwrap()
    } else {
        q(5, 10)
    }
}

/// After every decision of a random sequence, a peek one microsecond before
/// `t` sees no more room, and a peek at `t` sees more (a fixed window: all
/// of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_quota_comes_exactly_at_t() {
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for kind in KINDS {
        for alg in ALL {
            // On a 10 s boundary: the windows start at a known instant.
            let clock = ManualClock::new(1_700_000_000_000_000);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[quota(alg)], &p, &clock);
            let mut checked = 0;
            for step in 0..40 {
                clock.advance(Duration::from_micros(rand(3_000_000)));
                let d = l.check_n("s", 1 + rand(2)).await.unwrap();
                let qd = &d.quotas[0];
                let what = format!("{kind:?} {alg:?} step {step}: {d:?}");
                if let Some(retry) = qd.retry_after {
                    assert!(retry >= qd.next_after, "{what}: retry before t");
                    assert!(d.retry_after.unwrap() >= qd.next_after, "{what}");
                }
                if qd.remaining >= qd.limit {
                    // Full: nothing more to come (a fixed window still ends).
                    if alg != Algorithm::FixedWindow {
                        assert_eq!(qd.next_after, Duration::ZERO, "{what}");
                    }
                    continue;
                }
                let t_next = qd.next_after;
                assert!(t_next > Duration::ZERO, "{what}: room to come but t = 0");
                clock.advance(t_next - Duration::from_micros(1));
                let before = l.check_n("s", 0).await.unwrap().quotas[0].remaining;
                assert_eq!(before, qd.remaining, "{what}: more room before t");
                clock.advance(Duration::from_micros(1));
                let at = l.check_n("s", 0).await.unwrap().quotas[0].remaining;
                assert!(at > qd.remaining, "{what}: no more room at t ({at})");
                if alg == Algorithm::FixedWindow {
                    assert_eq!(at, qd.limit, "{what}: a new window is full");
                }
                checked += 1;
            }
            assert!(checked >= 10, "{kind:?} {alg:?}: only {checked} checks");
        }
    }
}

/// The figures the draft's example in the issue names: the quickstart's
/// bucket drained at one instant says `t` = one refill (2 s), not the 10 s
/// until it is full; the retry-after agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_bucket_says_one_refill() {
    for kind in KINDS {
        for alg in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[quota(alg)], &p, &clock);
            for _ in 0..5 {
                assert!(l.check("s").await.unwrap().allowed);
            }
            let d = l.check("s").await.unwrap();
            assert!(!d.allowed, "{kind:?} {alg:?}");
            assert_eq!(d.quotas[0].remaining, 0);
            assert_eq!(
                d.quotas[0].next_after,
                Duration::from_secs(2),
                "{kind:?} {alg:?}"
            );
            assert_eq!(
                d.retry_after,
                Some(Duration::from_secs(2)),
                "{kind:?} {alg:?}"
            );
            assert_eq!(d.reset_after, Duration::from_secs(10), "{kind:?} {alg:?}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// With two quotas, each reports its own `t`; the denial's retry-after is
/// not before the violated quota's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_quota_has_its_own_t() {
    for kind in KINDS {
        for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowLog] {
            let clock = ManualClock::new(1_700_000_040_000_000);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[q(2, 1), q(3, 60)], &p, &clock);
            assert!(l.check("s").await.unwrap().allowed);
            clock.advance(Duration::from_millis(400));
            let d = l.check("s").await.unwrap();
            assert!(d.allowed);
            // A fixed window's ends and a log's first entry leaving agree
            // here: 0.6 s and 59.6 s away (the start is on a minute).
            assert_eq!(
                d.quotas[0].next_after,
                Duration::from_millis(600),
                "{kind:?} {alg:?}"
            );
            assert_eq!(
                d.quotas[1].next_after,
                Duration::from_millis(59_600),
                "{kind:?} {alg:?}"
            );
            clock.advance(Duration::from_secs(1));
            assert!(l.check("s").await.unwrap().allowed);
            let d = l.check("s").await.unwrap();
            assert!(!d.allowed, "{kind:?} {alg:?}: the 60 s quota holds 3");
            assert!(
                d.retry_after.unwrap() >= d.quotas[1].next_after,
                "{kind:?} {alg:?}: {d:?}"
            );
        }
    }
}
