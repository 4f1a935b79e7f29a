//! Quota leases and what a decision carries: a served decision's charge
//! (refund and settle in both directions, before and after its slice
//! ends), a take that finds too few units (an ordinary check), `acquire`
//! (never leased), the `Backend` enum, slices that age out unchecked, and
//! a give-back after a reset.

use std::time::Duration;

use tollgate_core::{
    Algorithm, Backend, DecisionSource, ManualClock, MemoryBackend, Quota, QuotaLeases,
    RateBackend, RateLimiter, RedisBackend, Subject,
};
use tollgate_testkit::{RedisCluster, RedisServer};

/// Hot after 5 checks in 100 ms, a slice of up to a minute of the rate,
/// living a minute.
fn long_leases() -> QuotaLeases {
    QuotaLeases::default()
        .hot_checks(5)
        .target(Duration::from_secs(60))
        .max_age(Duration::from_secs(60))
}

/// A limiter on `backend` with `leases`, and a peer of the same policy
/// without them (what the store holds, by a check of cost 0).
fn pair(
    backend: impl RateBackend + Clone,
    alg: Algorithm,
    quota: Quota,
    clock: &ManualClock,
    leases: QuotaLeases,
) -> (RateLimiter, RateLimiter) {
    let build = |b: tollgate_core::RateLimiterBuilder| {
        b.quota(quota)
            .name("charges")
            .clock(clock.clone())
            .timeout(Duration::from_secs(5))
    };
    let leased = build(RateLimiter::builder(backend.clone(), alg))
        .quota_leases(leases)
        .build()
        .unwrap();
    let peer = build(RateLimiter::builder(backend, alg)).build().unwrap();
    (leased, peer)
}

/// The memory store, a standalone Redis and a 3-master cluster (with the
/// servers, kept running while the test uses them).
async fn stores(clock: &ManualClock) -> ((RedisServer, RedisCluster), [Backend; 3]) {
    let server = RedisServer::start().unwrap();
    let cluster = RedisCluster::start().unwrap();
    let standalone = RedisBackend::connect(&server.url()).await.unwrap();
    let clustered = RedisBackend::connect_cluster(cluster.seeds())
        .await
        .unwrap();
    let backends = [
        MemoryBackend::with_clock(clock.clone()).into(),
        standalone.into(),
        clustered.into(),
    ];
    ((server, cluster), backends)
}

/// The cap of [`hourly`]'s quota.
const CAP: u64 = 100_000;

/// A fixed window of [`CAP`] an hour with long leases on `backend`, and its
/// peer without them.
fn hourly(backend: Backend, clock: &ManualClock) -> (RateLimiter, RateLimiter) {
    pair(
        backend,
        Algorithm::FixedWindow,
        Quota::per_hour(CAP),
        clock,
        long_leases(),
    )
}

/// Fifty checks of `subject`: the charge of the last one a slice served.
async fn last_served(limiter: &RateLimiter, subject: &Subject) -> tollgate_core::Charge {
    let mut served = None;
    for _ in 0..50 {
        let d = limiter.check(subject.clone()).await.unwrap();
        if d.source == DecisionSource::Lease {
            served = d.charge;
        }
    }
    served.expect("a served charge")
}

/// A memory limiter of [`CAP`] an hour that tracks one subject, with
/// 50 ms slices, after 40 checks of "a" (which then holds a slice), and
/// its peer.
async fn one_tracked_holding_a_slice(clock: &ManualClock) -> (RateLimiter, RateLimiter) {
    let (limiter, peer) = pair(
        MemoryBackend::with_clock(clock.clone()),
        Algorithm::FixedWindow,
        Quota::per_hour(CAP),
        clock,
        long_leases()
            .max_age(Duration::from_millis(50))
            .tracked_subjects(1),
    );
    for _ in 0..40 {
        limiter.check("a").await.unwrap();
    }
    assert!(remaining(&peer, "a").await < CAP - 40, "a holds a slice");
    (limiter, peer)
}

async fn remaining(peer: &RateLimiter, subject: &str) -> u64 {
    peer.check_n(subject, 0).await.unwrap().remaining
}

/// Lets the tasks spawned so far run (a current-thread runtime runs them
/// when this task yields).
async fn let_spawned_run() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// The `Backend` enum takes leases as its store does: a hot subject is
/// served from a slice, never refused with an error.
#[tokio::test]
async fn the_backend_enum_leases() {
    let limiter = RateLimiter::builder(Backend::memory(), Algorithm::Gcra)
        .quota(Quota::per_hour(10_000))
        .quota_leases(long_leases())
        .build()
        .unwrap();
    let mut served = 0;
    for _ in 0..50 {
        let d = limiter
            .check("hot")
            .await
            .expect("no error for a hot subject");
        assert!(d.allowed);
        served += usize::from(d.source == DecisionSource::Lease);
    }
    assert!(served > 30, "{served} served from slices");
}

/// `acquire` is never answered from a live slice nor takes one (its wait
/// and order are the store's), whether the slice can serve it or not.
#[tokio::test]
async fn acquire_never_leases() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (limiter, _) = pair(
        MemoryBackend::with_clock(clock.clone()),
        Algorithm::TokenBucket,
        Quota::per_hour(100_000),
        &clock,
        long_leases().max_age(Duration::from_millis(50)),
    );
    for _ in 0..10 {
        limiter.check("hot").await.unwrap();
    }
    assert_eq!(
        limiter.check("hot").await.unwrap().source,
        DecisionSource::Lease
    );
    // A live slice that holds the cost.
    let d = limiter
        .acquire("hot", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(d.source, DecisionSource::Backend, "{d:?}");
    // A slice that aged out: the hot subject would take a new one.
    clock.advance(Duration::from_millis(60));
    let d = limiter
        .acquire("hot", 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(d.source, DecisionSource::Backend, "{d:?}");
    assert!(d.charge.is_some(), "the store's own charge: {d:?}");
    assert_eq!(
        limiter.check("hot").await.unwrap().source,
        DecisionSource::Backend,
        "the acquire took no slice"
    );
}

/// Fewer units available than a slice's least: the take is an ordinary
/// check of the caller's cost, decided and cached as one (on memory, a
/// standalone Redis and a cluster).
#[tokio::test]
async fn too_few_units_for_a_slice_is_an_ordinary_check() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        // A slice wants up to 80 tokens and at least 20: hot at once.
        let leases = long_leases().hot_checks(1).max_share(1);
        let (limiter, peer) = pair(
            backend,
            Algorithm::TokenBucket,
            Quota::per_hour(80),
            &clock,
            leases,
        );
        peer.check_n("few", 77).await.unwrap();
        for left in (0..3).rev() {
            let d = limiter.check("few").await.unwrap();
            assert!(d.allowed, "{kind}: {d:?}");
            assert_eq!(d.source, DecisionSource::Backend, "{kind}");
            assert_eq!(d.charge.map(|c| c.cost()), Some(1), "{kind}");
            assert_eq!(remaining(&peer, "few").await, left, "{kind}");
        }
        // The denial a plain check gets: one token's wait (45 s), cached.
        let plain = peer.check("few").await.unwrap();
        for _ in 0..3 {
            let d = limiter.check("few").await.unwrap();
            assert!(d.is_denied(), "{kind}: {d:?}");
            assert_eq!(d.retry_after, plain.retry_after, "{kind}");
        }
    }
}

/// A served decision carries a charge: refunds put units back into the
/// live slice, a settle over the charge takes the difference (beyond what
/// the slice holds: a debt on the store when it ends), and the store ends
/// up charged exactly what was used.
#[tokio::test]
async fn served_charges_refund_and_settle_into_the_slice() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let cap = 100_000;
    let (limiter, peer) = pair(
        MemoryBackend::with_clock(clock.clone()),
        Algorithm::FixedWindow,
        Quota::per_hour(cap),
        &clock,
        long_leases(),
    );
    let mut used = 0u64;
    let mut served = 0;
    for i in 0..200u64 {
        let d = limiter.check("hot").await.unwrap();
        assert!(d.allowed);
        let charge = d.charge.expect("an admission carries a charge");
        served += usize::from(d.source == DecisionSource::Lease);
        match i % 4 {
            0 => assert!(limiter.refund("hot", &charge).await.unwrap(), "{i}"),
            1 => {
                assert!(limiter.settle("hot", &charge, 3).await.unwrap().applied);
                assert!(!limiter.settle("hot", &charge, 3).await.unwrap().applied);
                used += 3;
            }
            _ => used += 1,
        }
    }
    assert!(served > 150, "{served} served from slices");
    // More than the slice holds: the rest is owed when it ends.
    let d = limiter.check("hot").await.unwrap();
    assert_eq!(d.source, DecisionSource::Lease);
    let s = limiter
        .settle("hot", &d.charge.unwrap(), 20_000)
        .await
        .unwrap();
    assert!(s.applied);
    used += 20_000;
    limiter.return_leases().await;
    // The slices that ran out were given back in the background.
    let_spawned_run().await;
    assert_eq!(remaining(&peer, "hot").await, cap - used);
}

/// Once its slice has ended, a settle over a served charge still reaches
/// the store (once), and a refund is dropped.
#[tokio::test]
async fn served_charges_after_their_slice_ended() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        let cap = CAP;
        let (limiter, peer) = hourly(backend, &clock);
        let mut charges = Vec::new();
        for _ in 0..50 {
            let d = limiter.check("ended").await.unwrap();
            if d.source == DecisionSource::Lease {
                charges.push(d.charge.unwrap());
            }
        }
        limiter.return_leases().await;
        let before = remaining(&peer, "ended").await;
        assert_eq!(before, cap - 50, "{kind}");
        let s = limiter.settle("ended", &charges[0], 5).await.unwrap();
        assert!(s.applied, "{kind}");
        assert!(
            !limiter
                .settle("ended", &charges[0], 5)
                .await
                .unwrap()
                .applied
        );
        assert_eq!(remaining(&peer, "ended").await, before - 4, "{kind}");
        assert!(
            !limiter.refund("ended", &charges[1]).await.unwrap(),
            "{kind}"
        );
        assert_eq!(remaining(&peer, "ended").await, before - 4, "{kind}");
    }
}

/// A slice that aged out is given back without waiting for its subject's
/// next check (another subject's check sweeps it), and its tracker then
/// makes room for another subject.
#[tokio::test]
async fn aged_out_slices_are_given_back_and_evicted() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let cap = CAP;
    let (limiter, peer) = one_tracked_holding_a_slice(&clock).await;
    clock.advance(Duration::from_millis(300));
    let mut served_b = 0;
    for _ in 0..40 {
        let d = limiter.check("b").await.unwrap();
        served_b += usize::from(d.source == DecisionSource::Lease);
    }
    let_spawned_run().await;
    assert_eq!(
        remaining(&peer, "a").await,
        cap - 40,
        "a's slice given back"
    );
    assert!(served_b > 0, "b found room to lease");
}

/// A memory limiter of 1 000 an hour with 50 ms slices, and its peer,
/// once `subject`'s slice (after 20 checks) aged and was ended by a check
/// of cost 0: its give-back spawned, not yet run.
async fn give_back_queued(subject: &str) -> (RateLimiter, RateLimiter, Subject) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (limiter, peer) = pair(
        MemoryBackend::with_clock(clock.clone()),
        Algorithm::FixedWindow,
        Quota::per_hour(1_000),
        &clock,
        long_leases().max_age(Duration::from_millis(50)),
    );
    let subject = Subject::new(subject);
    for _ in 0..20 {
        limiter.check(subject.clone()).await.unwrap();
    }
    clock.advance(Duration::from_millis(60));
    limiter.check_n(subject.clone(), 0).await.unwrap();
    (limiter, peer, subject)
}

/// A give-back still on its way when a reset is heard is skipped: the
/// units it would return were counted before the reset.
#[tokio::test]
async fn a_give_back_after_a_reset_is_skipped() {
    let (limiter, peer, subject) = give_back_queued("reset").await;
    limiter.reset(&subject).await.unwrap();
    for _ in 0..30 {
        assert!(peer.check(subject.clone()).await.unwrap().allowed);
    }
    let_spawned_run().await;
    assert_eq!(remaining(&peer, "reset").await, 1_000 - 30);
}

/// A give-back still on its way when a block is heard lands: a block
/// leaves the quota counted, so the slice's unused units go back.
#[tokio::test]
async fn a_give_back_after_a_block_lands() {
    let (limiter, peer, subject) = give_back_queued("block").await;
    limiter
        .block(&subject, Duration::from_secs(3600))
        .await
        .unwrap();
    let_spawned_run().await;
    limiter.unblock(&subject).await.unwrap();
    assert_eq!(remaining(&peer, "block").await, 1_000 - 20);
}

/// A take on its way when a revocation is heard installs no slice: the
/// check it carries is answered, and the subject's next check is not
/// served from the take's units.
#[tokio::test]
async fn a_take_in_flight_during_a_revocation_installs_nothing() {
    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_hour(100_000))
        .name("in-flight")
        .quota_leases(long_leases())
        .build()
        .unwrap();
    let subject = Subject::new("hot");
    for _ in 0..4 {
        let d = limiter.check(subject.clone()).await.unwrap();
        assert_eq!(d.source, DecisionSource::Backend);
    }
    // The fifth makes the subject hot: its call is the take.
    let Err(take) = limiter.try_check_now(&subject, 1) else {
        panic!("a check on Redis needs a round trip");
    };
    limiter.reset(&subject).await.unwrap();
    let d = take.send().await.unwrap();
    assert!(d.allowed, "{d:?}");
    assert!(d.charge.is_some(), "its own charge: {d:?}");
    let next = limiter.check(subject.clone()).await.unwrap();
    assert_ne!(next.source, DecisionSource::Lease, "{next:?}");
}

/// The check whose call took the slice has a charge of its own: settled
/// over after the slice was given back, it still owes the store (its
/// marker is not the slice's, which the give-back used).
#[tokio::test]
async fn the_taking_checks_charge_is_its_own() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        let (limiter, peer) = hourly(backend, &clock);
        let mut taking = None;
        for _ in 0..10 {
            let d = limiter.check("first").await.unwrap();
            if taking.is_none() && d.source == DecisionSource::Backend && d.charge.is_some() {
                let next = limiter.check("first").await.unwrap();
                if next.source == DecisionSource::Lease {
                    taking = d.charge;
                    break;
                }
            }
        }
        let taking = taking.expect("a check took a slice");
        limiter.return_leases().await;
        let before = remaining(&peer, "first").await;
        let s = limiter.settle("first", &taking, 10).await.unwrap();
        assert!(s.applied, "{kind}: {s:?}");
        assert_eq!(remaining(&peer, "first").await, before - 9, "{kind}");
    }
}

/// A reset of one subject leaves another's slice alone: its unused units
/// and what settles over its charges owe still reach the store.
#[tokio::test]
async fn a_revocation_of_one_subject_spares_the_others() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        let cap = CAP;
        let (limiter, peer) = hourly(backend, &clock);
        let served = last_served(&limiter, &Subject::new("kept")).await;
        let left = limiter.check_n("kept", 0).await.unwrap().remaining;
        // More than the slice holds: 50 owed to the store at its end.
        let s = limiter
            .settle("kept", &served, 1 + left + 50)
            .await
            .unwrap();
        assert!(s.applied, "{kind}: {s:?}");
        limiter.reset(&Subject::new("other")).await.unwrap();
        limiter.return_leases().await;
        // 50 checks and 50 owed, the slice's unused units back.
        assert_eq!(
            remaining(&peer, "kept").await,
            cap - 50 - left - 50,
            "{kind}"
        );
    }
}

/// A slice ages on the clock that times the store's decisions: a fixed
/// window's slice ends with its window though the limiter has no clock of
/// its own, so the window admits no more than its limit.
#[tokio::test]
async fn a_slice_ages_on_the_stores_clock() {
    let clock = ManualClock::new(1_700_000_040_000_000);
    let limiter = RateLimiter::builder(
        MemoryBackend::with_clock(clock.clone()),
        Algorithm::FixedWindow,
    )
    .quota(Quota::per_minute(100))
    .quota_leases(long_leases())
    .build()
    .unwrap();
    let mut admitted = 0;
    for _ in 0..30 {
        admitted += usize::from(limiter.check("w").await.unwrap().allowed);
    }
    assert!(
        limiter.check_n("w", 0).await.unwrap().source == DecisionSource::Lease,
        "a slice is held"
    );
    // The next window: the slice's units were counted in the last one.
    clock.advance(Duration::from_secs(60));
    let mut next = 0;
    for _ in 0..200 {
        next += usize::from(limiter.check("w").await.unwrap().allowed);
    }
    assert_eq!(admitted, 30);
    assert!(next <= 100, "{next} admitted in one window of 100");
}

/// A hot subject's take that leases nothing (fewer units than a slice's
/// least) reports what the store holds, for a check of cost 0 too.
#[tokio::test]
async fn a_take_that_leases_nothing_reports_the_stores_figures() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        let (limiter, peer) = pair(
            backend,
            Algorithm::FixedWindow,
            Quota::per_hour(1_000),
            &clock,
            long_leases(),
        );
        assert!(peer.check_n("few", 995).await.unwrap().allowed, "{kind}");
        for _ in 0..10 {
            let d = limiter.check_n("few", 0).await.unwrap();
            assert_eq!(d.remaining, 5, "{kind}: {d:?}");
        }
        assert_eq!(remaining(&peer, "few").await, 5, "{kind}");
    }
}

/// A block ends the subject's slice, and the store, which still counts
/// the slice's units, gets back the ones it did not serve.
#[tokio::test]
async fn a_block_gives_back_what_the_slice_did_not_serve() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        let cap = CAP;
        let (limiter, peer) = hourly(backend, &clock);
        let subject = Subject::new("blocked");
        let served = last_served(&limiter, &subject).await;
        // Ten more than the charge, held by the slice.
        let s = limiter.settle(subject.clone(), &served, 11).await.unwrap();
        assert!(s.applied, "{kind}: {s:?}");
        limiter
            .block(&subject, Duration::from_secs(3600))
            .await
            .unwrap();
        let_spawned_run().await;
        limiter.unblock(&subject).await.unwrap();
        let left = tollgate_testkit::eventually(Duration::from_secs(10), "given back", || async {
            let left = remaining(&peer, "blocked").await;
            (left == cap - 60).then_some(left)
        })
        .await;
        assert_eq!(left, cap - 60, "{kind}");
    }
}

/// A slice taken over a round trip is given back once it has aged out
/// though no check comes after it on its instance (its checks went
/// elsewhere): units are held in slices for at most their age. (An
/// in-process store's slices go back with the next check's sweep: its
/// runtime may have no timers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aged_slice_is_given_back_with_no_check_after_it() {
    let server = RedisServer::start().unwrap();
    let standalone = RedisBackend::connect(&server.url()).await.unwrap();
    let backends: [Backend; 1] = [standalone.into()];
    for backend in backends {
        let kind = backend.kind();
        let cap = 100_000;
        let build = |b: tollgate_core::RateLimiterBuilder| {
            b.quota(Quota::per_hour(cap))
                .name("idle")
                .timeout(Duration::from_secs(5))
        };
        let limiter = build(RateLimiter::builder(
            backend.clone(),
            Algorithm::FixedWindow,
        ))
        .quota_leases(long_leases().max_age(Duration::from_millis(100)))
        .build()
        .unwrap();
        let peer = build(RateLimiter::builder(backend, Algorithm::FixedWindow))
            .build()
            .unwrap();
        for _ in 0..40 {
            limiter.check("idle").await.unwrap();
        }
        assert!(
            remaining(&peer, "idle").await < cap - 40,
            "{kind}: a slice is held"
        );
        let left = tollgate_testkit::eventually(Duration::from_secs(10), "given back", || async {
            let left = remaining(&peer, "idle").await;
            (left == cap - 40).then_some(left)
        })
        .await;
        assert_eq!(left, cap - 40, "{kind}");
    }
}

/// A slice the sweep ends goes back even when the check that swept it is
/// of a subject beyond the tracked ones (checked as a cold one).
#[tokio::test]
async fn a_swept_slice_goes_back_when_no_room_is_left() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let cap = CAP;
    let (limiter, peer) = one_tracked_holding_a_slice(&clock).await;
    // The next 100 ms window: a's slice aged, a's tracker still recent.
    clock.advance(Duration::from_millis(110));
    let d = limiter.check("b").await.unwrap();
    assert_eq!(d.source, DecisionSource::Backend);
    let_spawned_run().await;
    assert_eq!(
        remaining(&peer, "a").await,
        cap - 40,
        "a's slice given back"
    );
}

/// A settle of a served charge replayed after its slice ended is refused,
/// as the slice refused it: the debt is owed once.
#[tokio::test]
async fn a_settle_replayed_after_its_slice_ended_is_refused() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        let cap = CAP;
        let (limiter, peer) = hourly(backend, &clock);
        let served = last_served(&limiter, &Subject::new("replay")).await;
        assert!(limiter.settle("replay", &served, 5).await.unwrap().applied);
        limiter.return_leases().await;
        let before = remaining(&peer, "replay").await;
        assert_eq!(before, cap - 54, "{kind}: 50 checks and 4 more");
        let again = limiter.settle("replay", &served, 5).await.unwrap();
        assert!(!again.applied, "{kind}: {again:?}");
        let refund = limiter.refund("replay", &served).await.unwrap();
        assert!(!refund, "{kind}");
        assert_eq!(remaining(&peer, "replay").await, before, "{kind}");
    }
}

/// Checks of cost 0 (an estimate not known yet) served from a slice carry
/// a charge too: settled to what the work cost, every unit is charged,
/// in the slice or on the store.
#[tokio::test]
async fn checks_of_cost_zero_are_settled_from_slices_too() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (_servers, backends) = stores(&clock).await;
    for backend in backends {
        let kind = backend.kind();
        let cap = CAP;
        let (limiter, peer) = hourly(backend, &clock);
        let mut served = 0;
        for _ in 0..50 {
            let d = limiter.check_n("zero", 0).await.unwrap();
            served += usize::from(d.source == DecisionSource::Lease);
            let charge = d.charge.expect("a charge of 0 units");
            assert!(
                limiter.settle("zero", &charge, 3).await.unwrap().applied,
                "{kind}"
            );
        }
        assert!(served > 30, "{kind}: {served} served from slices");
        limiter.return_leases().await;
        assert_eq!(remaining(&peer, "zero").await, cap - 150, "{kind}");
    }
}
