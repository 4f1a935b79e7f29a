//! `RateLimiter::acquire` on memory, a standalone Redis and a 3-master
//! cluster: admitted now when free; a bucket's slot reserved on the store
//! with the right wait; refused with an honest retry-after, taking nothing,
//! when the wait exceeds `max_wait`; several quotas all or nothing; a
//! dropped waiter's slot reused; a short block waited out; the deny cache
//! never refusing a wait that fits; the windows polling; a reservation
//! made before a reset not given back. And the twins
//! agree with the scripts on reservations figure for figure.

mod coalesce_common;
mod rate_common;

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{
    Algorithm, Decision, ManualClock, MemoryBackend, Quota, RateBackend, RateLimiter, RedisBackend,
    Subject,
};

use rate_common::*;

const MS: Duration = Duration::from_millis(1);
const BUCKETS: [Algorithm; 2] = [Algorithm::Gcra, Algorithm::TokenBucket];

/// 10 a second, one at a time: a slot every 100 ms.
fn tenth() -> Quota {
    Quota::per_second(10).with_burst(1).unwrap()
}

/// The subject's figures as they stand (a check of cost 0, which takes
/// nothing), from a limiter without a deny cache.
async fn peek(l: &RateLimiter, s: &str) -> Decision {
    l.check_n(s, 0).await.unwrap()
}

/// Waits until `cond` holds of the subject's figures (a waiter reserved, a
/// refund applied), or panics after 5 s.
async fn until(l: &RateLimiter, s: &str, what: &str, cond: impl Fn(&Decision) -> bool) {
    for _ in 0..500 {
        if cond(&peek(l, s).await) {
            return;
        }
        tokio::time::sleep(10 * MS).await;
    }
    panic!("{what}: never came ({:?})", peek(l, s).await);
}

/// An acquire of 1 for "s" on `l` with `max_wait`, in a task of its own.
fn waiter(
    l: &RateLimiter,
    max_wait: Duration,
) -> tokio::task::JoinHandle<tollgate_core::Result<Decision>> {
    let l = l.clone();
    tokio::spawn(async move { l.acquire("s", 1, max_wait).await })
}

async fn resolved(
    task: tokio::task::JoinHandle<tollgate_core::Result<Decision>>,
    what: &str,
) -> Decision {
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting"))
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_reserves_its_slot_or_refuses_honestly() {
    for kind in KINDS {
        for alg in BUCKETS {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let p = prefix();
            let l = t.limiter(alg, &[tenth()], &p, &clock);
            // Free: admitted now, as a check would be.
            let first = l.acquire("s", 1, Duration::from_secs(1)).await.unwrap();
            assert!(first.allowed, "{what}");
            assert_eq!(first.reset_after, 100 * MS, "{what}");
            assert_eq!(first.waited, Duration::ZERO, "{what}: admitted at once");
            // The next slot is 100 ms away: reserved now, resolved then.
            let waiter = waiter(&l, Duration::from_secs(1));
            until(&l, "s", &what, |d| d.reset_after == 200 * MS).await;
            // 200 ms away does not fit 150: refused, taking nothing, with the
            // wait a plain check has (past the max wait).
            let refused = l.acquire("s", 1, 150 * MS).await.unwrap();
            assert!(refused.is_denied(), "{what}");
            assert_eq!(refused.retry_after, Some(200 * MS), "{what}");
            assert_eq!(peek(&l, "s").await.reset_after, 200 * MS, "{what}");
            // The slot comes with the clock; the decision is as of the slot.
            clock.advance(100 * MS);
            let d = resolved(waiter, &what).await;
            assert!(d.allowed, "{what}");
            assert_eq!((d.remaining, d.reset_after), (0, 100 * MS), "{what}");
            assert_eq!(d.waited, 100 * MS, "{what}: waited for its slot");
            let charge = d.charge.expect("it took one");
            assert_eq!(charge.cost(), 1);
            assert_eq!(peek(&l, "s").await.reset_after, 100 * MS, "{what}");
            t.assert_all_keys_expire(&p, &clock).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiters_slot_is_reused() {
    for kind in KINDS {
        for alg in BUCKETS {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let l = t.limiter(alg, &[tenth()], &prefix(), &clock);
            assert!(l.acquire("s", 1, Duration::ZERO).await.unwrap().allowed);
            let dropped = waiter(&l, Duration::from_secs(1));
            until(&l, "s", &what, |d| d.reset_after == 200 * MS).await;
            dropped.abort();
            // Given back: the schedule ends one slot away again.
            until(&l, "s", &what, |d| d.reset_after == 100 * MS).await;
            // The next waiter takes the dropped one's slot, +100 ms.
            let next = waiter(&l, Duration::from_secs(1));
            until(&l, "s", &what, |d| d.reset_after == 200 * MS).await;
            clock.advance(100 * MS);
            assert!(resolved(next, &what).await.allowed, "{what}");
        }
    }
}

/// A waiter that leaves while others wait behind it keeps its slot taken:
/// giving it back would move the line's end back under the last waiter,
/// and the next arrival would share that waiter's slot (two admissions in
/// one interval). The one after the line gets the slot after the line.
#[test]
fn a_dropped_waiter_inside_the_line_keeps_its_slot_taken() {
    for kind in KINDS {
        for alg in BUCKETS {
            // A runtime per case: the tasks it counts are this case's only
            // (an earlier case's limiters end their tasks in their own time).
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(a_dropped_waiter_keeps_its_slot(kind, alg));
        }
    }
}

/// One case of the test above, on its own runtime.
async fn a_dropped_waiter_keeps_its_slot(kind: Kind, alg: Algorithm) {
    let what = format!("{kind:?} {alg:?}");
    let clock = ManualClock::starting_now();
    let t = Target::new(kind, &clock).await;
    let p = prefix();
    let l = t.limiter(alg, &[tenth()], &p, &clock);
    assert!(l.acquire("s", 1, Duration::ZERO).await.unwrap().allowed);
    let dropped = waiter(&l, Duration::from_secs(1));
    until(&l, "s", &what, |d| d.reset_after == 200 * MS).await;
    // The tasks alive besides the two waiters (the store's own).
    let alive = alive_tasks() - 1;
    let last = waiter(&l, Duration::from_secs(1));
    until(&l, "s", &what, |d| d.reset_after == 300 * MS).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled(), "{what}");
    // Its give-back runs in a task of its own: wait until it has
    // been decided (that task has ended), then the line is as it was.
    tasks_down_to(alive, &what).await;
    let d = l.check_n("s", 0).await.unwrap();
    assert_eq!(d.reset_after, 300 * MS, "{what}: the line kept its end");
    let next = waiter(&l, Duration::from_secs(1));
    until(&l, "s", &what, |d| d.reset_after == 400 * MS).await;
    clock.advance(200 * MS);
    assert!(resolved(last, &what).await.allowed, "{what}");
    clock.advance(100 * MS);
    assert!(resolved(next, &what).await.allowed, "{what}");
}

/// A charge given back while waiters hold reservations behind it gives
/// nothing: their slots were fixed by the charge as it stood, and moving
/// the schedule back would admit newcomers on top of them. 1 a second,
/// burst 2: C takes 2 at 0 s, two waiters reserve 1 s and 2 s; settling C
/// to 0 must not let two more in at 2 s beside the second waiter (3 at one
/// instant against a burst of 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_ahead_of_waiters_gives_nothing() {
    for kind in KINDS {
        for alg in BUCKETS {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::starting_now();
            let (_t, l, c, first) = two_taken_and_a_waiter(kind, alg, &clock, &what).await;
            let second = waiter(&l, Duration::from_secs(10));
            until(&l, "s", &what, |d| d.reset_after == 4000 * MS).await;
            let s = l.settle("s", &c, 0).await.unwrap();
            assert!(!s.applied, "{what}: nothing given back behind waiters");
            assert_eq!(peek(&l, "s").await.reset_after, 4000 * MS, "{what}");
            clock.advance(1000 * MS);
            assert!(resolved(first, &what).await.allowed, "{what}");
            clock.advance(1000 * MS);
            assert!(resolved(second, &what).await.allowed, "{what}");
            // At 2 s: the second waiter's unit, and none beside it.
            assert!(l.check_n("s", 1).await.unwrap().is_denied(), "{what}");
        }
    }
}

/// On `kind` at 1 a second, burst 2: a charge of 2 taken at 0 s, and a
/// waiter that has reserved the slot at 1 s (the target kept alive with
/// them).
async fn two_taken_and_a_waiter(
    kind: Kind,
    alg: Algorithm,
    clock: &ManualClock,
    what: &str,
) -> (
    Target,
    RateLimiter,
    tollgate_core::Charge,
    tokio::task::JoinHandle<tollgate_core::Result<Decision>>,
) {
    let t = Target::new(kind, clock).await;
    let quota = Quota::per_second(1).with_burst(2).unwrap();
    let l = t.limiter(alg, &[quota], &prefix(), clock);
    let c = l.check_n("s", 2).await.unwrap().charge.expect("took 2");
    let w = waiter(&l, Duration::from_secs(10));
    until(&l, "s", what, |d| d.reset_after == 3000 * MS).await;
    (t, l, c, w)
}

/// A reservation made before a reset, whose slot comes after it, is
/// admitted at its slot but not given back: its units went with the reset,
/// and giving them back would add them to the fresh quota (the scripts and
/// the memory twin alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_made_before_a_reset_is_not_given_back_after_it() {
    for kind in KINDS {
        for alg in BUCKETS {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let l = t.limiter(alg, &[Quota::per_second(1)], &prefix(), &clock);
            assert!(l.check_n("s", 1).await.unwrap().allowed, "{what}");
            let w = waiter(&l, Duration::from_secs(10));
            until(&l, "s", &what, |d| d.reset_after == 2000 * MS).await;
            clock.advance(100 * MS);
            l.reset(&Subject::new("s")).await.unwrap();
            clock.advance(900 * MS);
            let reserved = resolved(w, &what).await;
            assert!(reserved.allowed, "{what}: {reserved:?}");
            assert!(
                l.check_n("s", 1).await.unwrap().allowed,
                "{what}: the fresh quota"
            );
            let c = reserved.charge.expect("a reservation's charge");
            assert!(!l.refund("s", &c).await.unwrap(), "{what}: given back");
            assert!(l.check_n("s", 1).await.unwrap().is_denied(), "{what}");
        }
    }
}

/// The tasks alive on this runtime.
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits until no more than `alive` tasks are alive besides the last waiter
/// (a dropped waiter's give-back has run), or panics after 5 s.
async fn tasks_down_to(alive: usize, what: &str) {
    for _ in 0..500 {
        if alive_tasks() <= alive + 1 {
            return;
        }
        tokio::time::sleep(10 * MS).await;
    }
    panic!(
        "{what}: the give-back never ended ({} tasks)",
        alive_tasks()
    );
}

/// A give-back refused behind a waiter leaves the charge open: once the
/// waiter has left (giving its own slot back as the last in line), the
/// same give-back applies — once. 1 a second, burst 2: C takes 2, a waiter
/// reserves 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_refused_behind_a_waiter_applies_once_it_has_gone() {
    for kind in KINDS {
        for alg in BUCKETS {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::starting_now();
            let (_t, l, c, w) = two_taken_and_a_waiter(kind, alg, &clock, &what).await;
            assert!(
                !l.settle("s", &c, 0).await.unwrap().applied,
                "{what}: behind a waiter"
            );
            w.abort();
            assert!(w.await.unwrap_err().is_cancelled(), "{what}");
            until(&l, "s", &what, |d| d.reset_after == 2000 * MS).await;
            let s = l.settle("s", &c, 0).await.unwrap();
            assert!(s.applied, "{what}: nothing behind it now");
            assert_eq!(peek(&l, "s").await.remaining, 2, "{what}");
            assert!(!l.settle("s", &c, 0).await.unwrap().applied, "{what}: once");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_quotas_all_or_nothing_the_longest_wait() {
    // A slot every 100 ms, and 2 a second with a burst of 2.
    let quotas = [tenth(), Quota::per_second(2)];
    for kind in KINDS {
        for alg in BUCKETS {
            let what = format!("{kind:?} {alg:?}");
            let clock = ManualClock::starting_now();
            let t = Target::new(kind, &clock).await;
            let l = t.limiter(alg, &quotas, &prefix(), &clock);
            let wait = Duration::from_secs(1);
            assert!(l.acquire("s", 1, wait).await.unwrap().allowed);
            // The second waits 100 ms for the first quota.
            let second = waiter(&l, Duration::from_secs(1));
            let resets = |d: &Decision| -> Vec<Duration> {
                d.quotas.iter().map(|q| q.reset_after).collect()
            };
            until(&l, "s", &what, |d| resets(d) == [200 * MS, 1000 * MS]).await;
            // The third: 200 ms for the first, 500 ms for the second (its
            // tokens are gone until then). 400 ms is not enough: refused,
            // and neither quota charged.
            let refused = l.acquire("s", 1, 400 * MS).await.unwrap();
            assert!(refused.is_denied(), "{what}");
            assert_eq!(refused.retry_after, Some(500 * MS), "{what}");
            assert_eq!(resets(&peek(&l, "s").await), [200 * MS, 1000 * MS]);
            // 600 ms is: both quotas charged as at the slot, 500 ms away.
            let third = waiter(&l, 600 * MS);
            until(&l, "s", &what, |d| resets(d) == [600 * MS, 1500 * MS]).await;
            clock.advance(100 * MS);
            assert!(resolved(second, &what).await.allowed, "{what}");
            clock.advance(400 * MS);
            let d = resolved(third, &what).await;
            assert!(d.allowed, "{what}");
            assert_eq!(resets(&d), [100 * MS, 1000 * MS], "{what}: as of the slot");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_windows_wait_out_a_retry_that_fits() {
    for kind in KINDS {
        for alg in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowLog,
            Algorithm::SlidingWindowCounter,
        ] {
            let what = format!("{kind:?} {alg:?}");
            // A window aligned to the second: the fixed window's end is known.
            let clock = ManualClock::new(1_800_000_000_000_000);
            let t = Target::new(kind, &clock).await;
            let l = t.limiter(alg, &[Quota::per_second(2)], &prefix(), &clock);
            for _ in 0..2 {
                assert!(l.acquire("s", 1, Duration::ZERO).await.unwrap().allowed);
            }
            // Refused when the wait does not fit, taking nothing.
            let refused = l.acquire("s", 1, 500 * MS).await.unwrap();
            assert!(refused.is_denied(), "{what}");
            let retry = refused.retry_after.unwrap();
            assert!(retry > 500 * MS, "{what}: {retry:?}");
            // Within the wait: it polls, and is admitted once the clock has
            // moved past the retry.
            let waiter = waiter(&l, Duration::from_secs(2));
            // The clock moves on in steps until the waiter is served: it
            // waits out its retry-after on this clock, wherever it started.
            let steps = retry.as_millis() / 10 + 1;
            for _ in 0..steps {
                clock.advance(10 * MS);
                tokio::time::sleep(MS).await;
            }
            let d = resolved(waiter, &what).await;
            assert!(d.allowed, "{what}");
            assert!(!d.waited.is_zero(), "{what}: it waited for its retry");
        }
    }
}

/// A block that ends within the wait is waited out (the server's clock:
/// a block lives by its TTL); a longer one is refused with its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_block_is_waited_out() {
    for kind in KINDS {
        let backend: Arc<dyn RateBackend> = match kind {
            Kind::Memory => Arc::new(MemoryBackend::new()),
            _ => Target::new(kind, &ManualClock::new(0)).await.backend,
        };
        for alg in [Algorithm::Gcra, Algorithm::FixedWindow] {
            let what = format!("{kind:?} {alg:?}");
            let l = RateLimiter::builder(backend.clone(), alg)
                .quota(Quota::per_second(100))
                .prefix(prefix())
                .deny_cache(0)
                .build()
                .unwrap();
            let s = Subject::new("s");
            l.block(&s, Duration::from_secs(60)).await.unwrap();
            let left = l.blocked_for(&s).await.unwrap().expect("blocked");
            assert!(
                left > Duration::from_secs(59) && left <= Duration::from_secs(60),
                "{what}"
            );
            let refused = l.acquire("s", 1, 200 * MS).await.unwrap();
            assert!(refused.is_denied(), "{what}");
            assert!(refused.retry_after.unwrap() > 200 * MS, "{what}");
            l.block(&s, 300 * MS).await.unwrap();
            let d = l.acquire("s", 1, Duration::from_secs(5)).await.unwrap();
            assert!(d.allowed, "{what}: admitted once the block ended");
            assert!(d.waited > Duration::ZERO, "{what}: it waited the block out");
            assert_eq!(l.blocked_for(&s).await.unwrap(), None, "{what}");
        }
    }
}

/// A block set while a waiter waits for its reserved slot holds at the
/// slot too (an upstream's stop learnt elsewhere must stop calls already in
/// line): the waiter goes only once the block has ended. 1 a second: the
/// waiter's slot is 1 s away; a 1.5 s block set meanwhile outlasts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_set_while_waiting_holds_at_the_slot() {
    for kind in KINDS {
        let backend: Arc<dyn RateBackend> = match kind {
            Kind::Memory => Arc::new(MemoryBackend::new()),
            _ => Target::new(kind, &ManualClock::new(0)).await.backend,
        };
        let what = format!("{kind:?}");
        let l = RateLimiter::builder(backend, Algorithm::Gcra)
            .quota(Quota::per_second(1).with_burst(1).unwrap())
            .prefix(prefix())
            .deny_cache(0)
            .build()
            .unwrap();
        assert!(l.acquire("s", 1, Duration::ZERO).await.unwrap().allowed);
        let waiter = waiter(&l, Duration::from_secs(5));
        // Reserved: the schedule reaches past one interval.
        until(&l, "s", &what, |d| d.reset_after > Duration::from_secs(1)).await;
        let blocked_at = std::time::Instant::now();
        l.block(&Subject::new("s"), Duration::from_millis(1500))
            .await
            .unwrap();
        let d = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("served once the block ended")
            .unwrap()
            .unwrap();
        assert!(d.allowed, "{what}");
        assert!(
            blocked_at.elapsed() >= Duration::from_millis(1500),
            "{what}: went during the block"
        );
    }
}

/// A cached denial refuses only a wait longer than it: a bucket's acquire
/// that fits goes to the store and reserves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_never_refuses_a_wait_that_fits() {
    for kind in KINDS {
        let clock = ManualClock::starting_now();
        let t = Target::new(kind, &clock).await;
        let p = prefix();
        let cached = RateLimiter::builder(t.backend.clone(), Algorithm::Gcra)
            .quota(tenth())
            .prefix(p.as_str())
            .clock(clock.clone())
            .build()
            .unwrap();
        let plain = t.limiter(Algorithm::Gcra, &[tenth()], &p, &clock);
        assert!(cached.check("s").await.unwrap().allowed);
        let d = cached.check("s").await.unwrap();
        assert!(d.is_denied());
        assert_eq!(
            cached.check("s").await.unwrap().source,
            tollgate_core::DecisionSource::DenyCache
        );
        // Too short a wait: the cached denial answers.
        let short = cached.acquire("s", 1, 50 * MS).await.unwrap();
        assert_eq!(
            short.source,
            tollgate_core::DecisionSource::DenyCache,
            "{kind:?}"
        );
        let waiter = waiter(&cached, Duration::from_secs(1));
        until(&plain, "s", "reserved", |d| d.reset_after == 200 * MS).await;
        clock.advance(100 * MS);
        assert!(resolved(waiter, "cached").await.allowed, "{kind:?}");
    }
}

/// The twins reserve as the scripts do, figure for figure: random waits,
/// costs and steps, one and two quotas, on the scripts' single path and in
/// a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twins_reserve_as_the_scripts_do() {
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let redis = RedisBackend::from_connection(server().connection_manager().await);
    let one = [Quota::new(7, Duration::from_millis(1500))
        .unwrap()
        .with_burst(3)
        .unwrap()];
    let two = [one[0], Quota::new(20, Duration::from_secs(20)).unwrap()];
    for alg in BUCKETS {
        for quotas in [&one[..], &two[..]] {
            let memory = MemoryBackend::new();
            let p = prefix();
            let mut now = 1_800_000_000_000_000u64;
            let mut reserved = 0;
            for step in 0..400 {
                now += next(300_000);
                let mut r = coalesce_common::request_for(alg, quotas, "s", &p);
                r.cost = next(4);
                r.now_micros = Some(now);
                r.max_wait_micros = [0, 1, next(2_000_000)][next(3) as usize];
                let a = memory.check_rate(&r).await.unwrap();
                let b = if next(2) == 0 {
                    redis.check_rate(&r).await.unwrap()
                } else {
                    let mut both = redis
                        .check_rate_batch(&[r.clone(), r.clone()])
                        .await
                        .unwrap();
                    // The second of a batch sees the first: undo it by
                    // asking the twin the same again.
                    let second = both.pop().unwrap().unwrap();
                    let twin_second = memory.check_rate(&r).await.unwrap();
                    assert_eq!(
                        figures(&second),
                        figures(&twin_second),
                        "{alg:?} step {step} (2nd)"
                    );
                    both.pop().unwrap().unwrap()
                };
                assert_eq!(
                    figures(&a),
                    figures(&b),
                    "{alg:?} {quotas:?} step {step}: {r:?}"
                );
                reserved += usize::from(a.allowed && a.wait_micros() > 0);
            }
            assert!(reserved > 20, "{alg:?}: only {reserved} reservations");
        }
    }
}

/// The block read at a reserved slot is bounded by the limiter's timeout,
/// as every round trip of a check: on a connection with no response
/// timeout of its own, a Redis frozen while the waiter waits for its slot
/// does not hang the waiter (its slot is kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_at_the_slot_does_not_hang_the_waiter() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let l = RateLimiter::builder(RedisBackend::from_connection(conn), Algorithm::Gcra)
        .quota(tenth())
        .name("frozen")
        .timeout(Duration::from_millis(50))
        .deny_cache(0)
        .build()
        .unwrap();
    let peer = RateLimiter::builder(
        RedisBackend::connect(&server.url()).await.unwrap(),
        Algorithm::Gcra,
    )
    .quota(tenth())
    .name("frozen")
    .deny_cache(0)
    .build()
    .unwrap();
    assert!(
        l.acquire("s", 1, Duration::from_secs(1))
            .await
            .unwrap()
            .allowed
    );
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move { l.acquire("s", 1, Duration::from_secs(1)).await })
    };
    // Reserved: the subject is full again only two intervals ahead.
    until(&peer, "s", "the waiter reserved", |d| {
        d.reset_after > 150 * MS
    })
    .await;
    server.pause();
    let done = tokio::time::timeout(Duration::from_secs(3), waiter).await;
    server.resume();
    let d = done.expect("the waiter hung").unwrap().unwrap();
    assert!(d.allowed, "{d:?}");
}
