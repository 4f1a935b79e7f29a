//! Refunds ([`RateLimiter::refund`]) for every algorithm, on memory, a
//! standalone Redis and a cluster: what is given back, at most once per
//! charge, never above capacity, to the window charged only; and the memory
//! twins agree with the scripts over random checks and refunds.

mod rate_common;

use std::time::Duration;

use tollgate_core::{Algorithm, Decision, ManualClock, Quota, RateLimiter, RedisBackend};

use rate_common::*;

/// 3 per 10 s for windows; a bucket of 3 refilling one per 10 s / 3.
fn three(alg: Algorithm) -> Quota {
    let q = q(3, 10);
    if alg.uses_burst() {
        q.with_burst(3).unwrap()
    } else {
        q
    }
}

async fn drain(l: &RateLimiter, subject: &str, n: usize) -> Vec<Decision> {
    let mut out = Vec::new();
    for i in 0..n {
        let d = l.check(subject).await.unwrap();
        assert!(d.allowed, "check {i} denied: {d:?}");
        out.push(d);
    }
    out
}

/// A full quota with one charge refunded admits exactly one more; the same
/// refund again (a retry after a lost reply) gives nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_gives_back_once() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(1_700_000_000_000_000);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[three(alg)], &p, &clock);
            let what = format!("{kind:?} {alg:?}");
            let taken = drain(&l, "s", 3).await;
            assert!(!l.check("s").await.unwrap().allowed, "{what}");
            let charge = taken[1].charge.expect("an admitted check has a charge");
            assert_eq!(charge.cost(), 1);
            assert!(l.refund("s", &charge).await.unwrap(), "{what}");
            assert!(!l.refund("s", &charge).await.unwrap(), "{what}: twice");
            assert!(
                l.check("s").await.unwrap().allowed,
                "{what}: room given back"
            );
            assert!(
                !l.check("s").await.unwrap().allowed,
                "{what}: one unit only"
            );
            // Another subject is untouched by the refund.
            assert_eq!(l.check("other").await.unwrap().remaining, 2, "{what}");
            // A denial has nothing to refund.
            assert!(l.check("s").await.unwrap().charge.is_none());
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// A charge gives back only to the subject (and limiter) it was taken
/// for: refunded for another, it is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_refunds_only_its_own_subject() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(1_700_000_000_000_000);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[three(alg)], &p, &clock);
            let other = t.limiter(alg, &[three(alg)], &format!("{p}-other"), &clock);
            let what = format!("{kind:?} {alg:?}");
            let a = drain(&l, "a", 3).await;
            drain(&l, "b", 3).await;
            let charge = a[0].charge.expect("an admitted check has a charge");
            let e = l.refund("b", &charge).await.unwrap_err();
            assert!(
                matches!(e, tollgate_core::Error::InvalidConfig(_)),
                "{what}: {e}"
            );
            let e = other.refund("a", &charge).await.unwrap_err();
            assert!(
                matches!(e, tollgate_core::Error::InvalidConfig(_)),
                "{what}: {e}"
            );
            assert!(
                !l.check("b").await.unwrap().allowed,
                "{what}: b got nothing"
            );
            // Its own subject still takes it, once.
            assert!(l.refund("a", &charge).await.unwrap(), "{what}");
            assert!(l.check("a").await.unwrap().allowed, "{what}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

/// Never above capacity: a charge refunded after its quota refilled (or its
/// window passed) gives nothing more than a full quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_above_capacity_nor_into_another_window() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(1_700_000_000_000_000);
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[three(alg)], &p, &clock);
            let what = format!("{kind:?} {alg:?}");
            let taken = drain(&l, "s", 2).await;
            // 10 s on: a new window, an empty log, a refilled bucket; the
            // counter's previous window still weighs.
            clock.advance(Duration::from_secs(10));
            let now = drain(&l, "s", 1).await;
            for d in &taken {
                l.refund("s", d.charge.as_ref().unwrap()).await.unwrap();
            }
            // Only this window's (or refill's) charge counts: the counter's
            // previous window got its 2 back; the rest had nothing to give.
            let d = l.check_n("s", 0).await.unwrap();
            assert_eq!(d.remaining, 2, "{what}: {d:?}");
            // The new window's own charge still counts until refunded.
            assert!(l
                .refund("s", now[0].charge.as_ref().unwrap())
                .await
                .unwrap());
            assert_eq!(l.check_n("s", 0).await.unwrap().remaining, 3, "{what}");
        }
    }
}

/// A log gives back the refunded check's own entries: the others keep their
/// times, so the next unit still comes when the oldest kept one leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_removes_its_own_entries() {
    for kind in KINDS {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let t = Target::new(kind, &clock).await;
        let p = prefix();
        let l = t.limiter(Algorithm::SlidingWindowLog, &[q(3, 10)], &p, &clock);
        let first = drain(&l, "s", 1).await;
        clock.advance(Duration::from_secs(2));
        let second = l.check_n("s", 2).await.unwrap();
        assert!(second.allowed);
        // Refund the first (at 0 s): the two at 2 s remain.
        assert!(l
            .refund("s", first[0].charge.as_ref().unwrap())
            .await
            .unwrap());
        let d = l.check("s").await.unwrap();
        assert!(d.allowed, "{kind:?}");
        assert_eq!(
            d.quotas[0].next_after,
            Duration::from_secs(10),
            "{kind:?}: {d:?}"
        );
        // A partial refund of the 2-unit check removes one of its entries.
        let part = second.charge.unwrap().part(1);
        assert!(l.refund("s", &part).await.unwrap());
        assert_eq!(l.check_n("s", 0).await.unwrap().remaining, 1, "{kind:?}");
        t.assert_all_keys_expire(&p, &clock).await;
    }
}

/// At most once across a reconnect: the marker lives in Redis, not in the
/// client, so a new connection's retry of the same refund gives nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_across_a_reconnect() {
    for alg in ALL {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let p = prefix();
        let build = |backend: RedisBackend| {
            RateLimiter::builder(backend, alg)
                .quota(three(alg))
                .prefix(p.as_str())
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let a = build(RedisBackend::from_connection(
            server().connection_manager().await,
        ));
        let taken = drain(&a, "s", 3).await;
        let charge = taken[0].charge.unwrap();
        assert!(a.refund("s", &charge).await.unwrap());
        drop(a);
        let b = build(RedisBackend::from_connection(
            server().connection_manager().await,
        ));
        assert!(
            !b.refund("s", &charge).await.unwrap(),
            "{alg:?}: applied twice"
        );
        assert!(b.check("s").await.unwrap().allowed, "{alg:?}");
        assert!(
            !b.check("s").await.unwrap().allowed,
            "{alg:?}: two refunds' worth"
        );
    }
}

/// A refund clears the subject from the local deny cache: the next check
/// asks the backend instead of repeating the cached denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_clears_the_deny_cache() {
    for kind in KINDS {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let t = Target::new(kind, &clock).await;
        let p = prefix();
        let l = RateLimiter::builder(t.backend.clone(), Algorithm::FixedWindow)
            .quota(q(2, 10))
            .prefix(p.as_str())
            .clock(clock.clone())
            .deny_cache(1_000)
            .build()
            .unwrap();
        let taken = drain(&l, "s", 2).await;
        let denied = l.check("s").await.unwrap();
        assert!(!denied.allowed);
        let again = l.check("s").await.unwrap();
        assert_eq!(
            again.source,
            tollgate_core::DecisionSource::DenyCache,
            "{kind:?}"
        );
        assert!(l
            .refund("s", taken[0].charge.as_ref().unwrap())
            .await
            .unwrap());
        let d = l.check("s").await.unwrap();
        assert!(d.allowed, "{kind:?}: {d:?}");
    }
}

/// The memory twins and the refund scripts agree: a random sequence of
/// checks and refunds (some replayed, some late) gives identical decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_twins_match_the_refund_scripts() {
    let mut seed: u64 = 0x5DEE_CE66_D1CE_4E5B;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for alg in ALL {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let mem = Target::new(Kind::Memory, &clock).await;
        let redis = Target::new(Kind::Standalone, &clock).await;
        let p = prefix();
        let quotas = [
            Quota::new(5, Duration::from_millis(1500)).unwrap(),
            q(20, 20),
        ];
        let a = mem.limiter(alg, &quotas, &p, &clock);
        let b = redis.limiter(alg, &quotas, &p, &clock);
        let mut charges = Vec::new();
        for step in 0..300 {
            clock.advance(Duration::from_micros(rand(300_000)));
            if rand(3) == 0 && !charges.is_empty() {
                let i = rand(charges.len() as u64) as usize;
                let (ca, cb): (tollgate_core::Charge, tollgate_core::Charge) = charges[i];
                let part = 1 + rand(ca.cost());
                let ra = a.refund("s", &ca.part(part)).await.unwrap();
                let rb = b.refund("s", &cb.part(part)).await.unwrap();
                assert_eq!(ra, rb, "{alg:?} step {step}: refund");
                continue;
            }
            let cost = rand(4);
            let mut da = a.check_n("s", cost).await.unwrap();
            let mut db = b.check_n("s", cost).await.unwrap();
            // A check of cost 0 has a charge of 0 units too; its refund is
            // a no-op on both, so only charges that took units are kept.
            if let (Some(ca), Some(cb)) = (da.charge.take(), db.charge.take()) {
                if ca.cost() > 0 {
                    charges.push((ca, cb));
                }
            }
            assert_eq!(da, db, "{alg:?} step {step}");
        }
    }
}
