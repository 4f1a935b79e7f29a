//! The semaphore suite (and fair locks), instantiated for the memory
//! backend, a standalone redis-server and a 3-master Redis Cluster; plus
//! memory-only cases (the backend's clock, configuration) and standalone
//! faults (other OS processes, SIGKILL, SIGSTOP).

mod lock_common;
mod semaphore_common;

use std::sync::OnceLock;

use lock_common::{Cluster, Memory, Standalone};
use tollgate_core::MemoryBackend;
use tollgate_testkit::{RedisCluster, RedisServer};

/// The suite for one fixture expression; `$total` acquisitions in the
/// contended test (a third of them for the fair one).
macro_rules! semaphore_suite {
    ($fixture:expr, $total:expr) => {
        use tollgate_core::{Locker, Semaphore};

        use crate::semaphore_common as sc;

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bound_under_contention() {
            sc::bound_under_contention(&$fixture, false, 12, $total).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bound_under_contention_fair() {
            sc::bound_under_contention(&$fixture, true, 12, $total / 3).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn try_acquire_and_release() {
            sc::try_acquire_and_release(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn weighted() {
            sc::weighted(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dead_holder_frees_by_ttl() {
            sc::dead_holder_frees_by_ttl(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiter_wakes_on_release() {
            sc::waiter_wakes_on_release(&$fixture, false).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_waiter_wakes_on_release() {
            sc::waiter_wakes_on_release(&$fixture, true).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn light_waiter_woken_beside_a_heavy_one() {
            sc::waking::a_light_waiter_is_woken_beside_a_heavy_one(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn renewal_and_loss() {
            sc::renewal_and_loss(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_and_unfair_do_not_mix() {
            sc::fair_and_unfair_do_not_mix(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_and_unfair_after_expiry() {
            sc::fair_and_unfair_after_expiry(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_semaphore_arrival_order() {
            sc::fair::arrival_order::<Semaphore, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_locker_arrival_order() {
            sc::fair::arrival_order::<Locker, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_leavers_leave_at_once() {
            sc::fair::leavers_leave_at_once::<Semaphore, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_locker_leavers_leave_at_once() {
            sc::fair::leavers_leave_at_once::<Locker, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_dead_waiter_blocks_until_ticket_ttl() {
            sc::fair::dead_waiter_blocks_until_ticket_ttl::<Semaphore, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_locker_dead_waiter_blocks_until_ticket_ttl() {
            sc::fair::dead_waiter_blocks_until_ticket_ttl::<Locker, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_mixed_ticket_ttls_keep_arrival_order() {
            sc::fair::mixed_ticket_ttls_keep_arrival_order(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_endless_poll_interval() {
            sc::fair::endless_poll_interval::<Semaphore, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_locker_endless_poll_interval() {
            sc::fair::endless_poll_interval::<Locker, _>(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fair_lost_notification_costs_one_poll() {
            sc::fair::lost_notification_costs_one_poll(&$fixture).await;
        }
    };
}

mod memory {
    use std::time::Duration;

    use tollgate_core::lock::MAX_PERMITS;
    use tollgate_core::{Error, LockOptions, ManualClock};

    use super::*;

    fn memory() -> Memory {
        static M: OnceLock<MemoryBackend> = OnceLock::new();
        Memory(M.get_or_init(MemoryBackend::new).clone())
    }

    semaphore_suite!(memory(), 1500);

    /// Expiry follows the backend's clock: once it passes the TTL, the
    /// permits are free and the holder's next renewal reports the loss.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clock_expiry_is_loss() {
        let clock = ManualClock::starting_now();
        let backend = MemoryBackend::with_clock(clock.clone());
        let a = Semaphore::new(backend.clone(), 2).unwrap();
        let b = Semaphore::new(backend, 2).unwrap();
        let opts = LockOptions::new().ttl(Duration::from_millis(300));
        let both = a.try_acquire_weighted("m", 2, &opts).await.unwrap();
        sc::busy_after(b.try_acquire("m", &opts).await);
        clock.advance(Duration::from_secs(1));
        assert_eq!(b.in_use("m").await.unwrap(), 0);
        let taken = b.try_acquire("m", &opts).await.unwrap();
        assert!(taken.fence() > both.fence());
        tokio::time::timeout(Duration::from_secs(2), both.lost())
            .await
            .expect("lost() never resolved");
        assert!(both.is_lost());
        assert!(!both.release().await.unwrap());
        assert_eq!(b.in_use("m").await.unwrap(), 1);
        assert!(taken.release().await.unwrap());
    }

    /// Permit counts out of 1..=MAX_PERMITS are refused, as are fair names
    /// on a Redlock; the builder's settings are kept.
    #[tokio::test]
    async fn configuration_is_checked() {
        for n in [0, MAX_PERMITS + 1, u32::MAX] {
            let r = Semaphore::new(MemoryBackend::new(), n);
            assert!(matches!(r, Err(Error::InvalidConfig(_))), "{n}: {r:?}");
        }
        let s = Semaphore::new(MemoryBackend::new(), MAX_PERMITS).unwrap();
        let all = s
            .try_acquire_weighted("max", MAX_PERMITS, &LockOptions::new())
            .await
            .unwrap();
        assert_eq!(s.available("max").await.unwrap(), 0);
        assert!(all.release().await.unwrap());
        let s = Semaphore::builder(MemoryBackend::new(), 4)
            .prefix("render")
            .fair()
            .build()
            .unwrap();
        assert_eq!((s.permits(), s.is_fair()), (4, true));
        assert_eq!(s.keys_for("farm").lock, "render:sem:{farm}");
        assert_eq!(s.keys_for("farm").queue(), "render:sem:{farm}:queue");
        sc::fair::redlock_refuses_fair();
    }
}

mod standalone {
    use super::*;

    fn server() -> &'static RedisServer {
        static S: OnceLock<RedisServer> = OnceLock::new();
        S.get_or_init(|| RedisServer::start().expect("redis-server"))
    }

    semaphore_suite!(Standalone(server()), 600);

    #[test]
    fn four_processes_share_three_permits() {
        sc::faults::four_processes_share_three_permits();
    }

    #[test]
    fn killed_holder_process_frees_within_ttl() {
        sc::faults::killed_holder_process_frees_within_ttl();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn paused_server_is_unavailable_not_a_hang() {
        sc::faults::paused_server_is_unavailable_not_a_hang().await;
    }
}

mod cluster {
    use super::*;

    fn cluster() -> &'static RedisCluster {
        static C: OnceLock<RedisCluster> = OnceLock::new();
        C.get_or_init(|| RedisCluster::start().expect("redis cluster"))
    }

    semaphore_suite!(Cluster(cluster()), 600);
}

/// A child process of the cross-process tests (`semaphore_common::faults`):
/// they re-run this binary with `--exact semaphore_child --ignored` and its
/// role in the environment. Run directly, it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the cross-process tests, spawned by them"]
async fn semaphore_child() {
    semaphore_common::faults::child_main().await;
}

/// A dead Redis under the allow and fallback policies: a bounded wait does
/// not ride the outage out (every request would cost the whole bound), the
/// policy answers after one bounded attempt; under deny the wait rides it
/// out until the bound, as a lock's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policies_answer_without_waiting_out_the_bound() {
    use std::num::NonZeroU32;
    use std::time::{Duration, Instant};
    use tollgate_core::{FailurePolicy, LockOptions, RedisBackend, Semaphore};

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = || RedisBackend::connect_lazy(&format!("redis://127.0.0.1:{port}")).unwrap();
    let build = |policy| {
        Semaphore::builder(dead(), 4)
            .timeout(Duration::from_millis(100))
            .on_failure(policy)
            .build()
            .unwrap()
    };
    let bound = Duration::from_secs(4);
    let opts = LockOptions::new().wait(bound);

    let allow = build(FailurePolicy::Allow);
    let start = Instant::now();
    let err = allow.acquire("k", &opts).await.unwrap_err();
    assert!(allow.fails_open(&err), "{err}");
    assert!(
        start.elapsed() < bound / 2,
        "allow waited {:?}",
        start.elapsed()
    );

    let two = NonZeroU32::new(2).unwrap();
    let fallback = build(FailurePolicy::Fallback { instances: two });
    let start = Instant::now();
    let _local = fallback.acquire("k", &opts).await.unwrap();
    assert!(
        start.elapsed() < bound / 2,
        "fallback waited {:?}",
        start.elapsed()
    );

    let deny = build(FailurePolicy::Deny);
    let start = Instant::now();
    let err = deny.acquire("k", &opts).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(
        start.elapsed() >= bound,
        "deny gave up after {:?}",
        start.elapsed()
    );
}

/// Releasing a permit that expired (its holder stalled past the TTL, nobody
/// took it since) reports "not held", on Redis as in memory: the holder is
/// told it lost its protection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_an_expired_permit_reports_not_held() {
    use std::sync::Arc;
    use std::time::Duration;
    use tollgate_core::{LockBackend, LockOptions, RedisBackend, Semaphore};

    let server = RedisServer::start().unwrap();
    let backends: [Arc<dyn LockBackend>; 2] = [
        Arc::new(MemoryBackend::new()),
        Arc::new(RedisBackend::connect_lazy(&server.url()).unwrap()),
    ];
    for backend in backends {
        let permits = Semaphore::new(backend, 2).unwrap();
        let opts = LockOptions::new()
            .ttl(Duration::from_millis(200))
            .renew(false);
        let permit = permits.try_acquire("k", &opts).await.unwrap();
        // Another holder keeps the name's key alive past the first's expiry.
        let long = LockOptions::new().ttl(Duration::from_secs(10));
        let _other = permits.try_acquire("k", &long).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !permit.release().await.unwrap(),
            "an expired permit is not ours"
        );
    }
}

/// A dead Redis costs a round-trip timeout for the first few acquires only:
/// then the breaker skips it (`CircuitOpen`, which the failure policy acts
/// on), until a probe after the cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_is_skipped_after_repeated_failures() {
    use std::time::Duration;
    use tollgate_core::{Error, FailurePolicy, LockOptions, RedisBackend, Semaphore};

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = RedisBackend::connect_lazy(&format!("redis://127.0.0.1:{port}")).unwrap();
    let permits = Semaphore::builder(dead, 2)
        .timeout(Duration::from_millis(100))
        .on_failure(FailurePolicy::Allow)
        .build()
        .unwrap();
    let opts = LockOptions::new();
    let mut errors = Vec::new();
    for _ in 0..8 {
        let e = permits.try_acquire("k", &opts).await.unwrap_err();
        assert!(permits.fails_open(&e), "{e}");
        errors.push(matches!(e, Error::CircuitOpen));
    }
    assert_eq!(
        errors,
        [false, false, false, false, false, true, true, true]
    );
}

/// A request that can never be granted is refused as such while the breaker
/// skips a dead backend too, under every failure policy: a weight above the
/// permit count is `PermitsExceedLimit`, a weight of 0 or a TTL the drift
/// leaves nothing of is `InvalidConfig` — never `CircuitOpen` (which the
/// Allow policy lets through without a permit) nor a local permit's `Busy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_request_is_refused_while_the_breaker_is_open() {
    use std::num::NonZeroU32;
    use std::time::Duration;
    use tollgate_core::{Error, FailurePolicy, LockOptions, RedisBackend, Semaphore};

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let fallback = FailurePolicy::Fallback {
        instances: NonZeroU32::new(1).unwrap(),
    };
    for policy in [FailurePolicy::Allow, FailurePolicy::Deny, fallback] {
        let dead = RedisBackend::connect_lazy(&format!("redis://127.0.0.1:{port}")).unwrap();
        let permits = Semaphore::builder(dead, 2)
            .timeout(Duration::from_millis(100))
            .on_failure(policy)
            .build()
            .unwrap();
        let opts = LockOptions::new();
        // Five outages open the breaker (a local permit each, on fallback).
        for _ in 0..5 {
            drop(permits.try_acquire("k", &opts).await);
        }
        let open = permits.try_acquire("k", &opts).await;
        assert!(
            matches!(open, Err(Error::CircuitOpen)) || policy == fallback,
            "{policy:?}: the breaker is not open: {open:?}"
        );
        drop(open);
        let too_heavy = permits.try_acquire_weighted("k", 3, &opts).await;
        assert!(
            matches!(
                too_heavy,
                Err(Error::PermitsExceedLimit {
                    requested: 3,
                    limit: 2
                })
            ),
            "{policy:?}: {too_heavy:?}"
        );
        let nothing = permits.try_acquire_weighted("k", 0, &opts).await;
        assert!(
            matches!(nothing, Err(Error::InvalidConfig(_))),
            "{policy:?}: {nothing:?}"
        );
        let tiny = LockOptions::new().ttl(Duration::from_millis(2));
        let tiny = permits.try_acquire("k", &tiny).await;
        assert!(
            matches!(tiny, Err(Error::InvalidConfig(_))),
            "{policy:?}: {tiny:?}"
        );
    }
}

/// A lock and a semaphore never share keys: a name that is another kind's
/// default policy (`lock`, `sem`, the idempotency store's `idem`) would put
/// a named one on the other's keys, so `build` refuses it; a kind may take
/// its own default.
#[tokio::test]
async fn a_name_never_shares_another_kinds_keys() {
    use tollgate_core::idempotency::IdempotencyStore;
    use tollgate_core::{Error, Locker, Semaphore, Subject};

    let m = MemoryBackend::new();
    let subject = Subject::new("a");
    let store = IdempotencyStore::new(m.clone());
    let lock_keys = Locker::new(m.clone()).keys_for("a").lock;
    let sem_keys = Semaphore::new(m.clone(), 2).unwrap().keys_for("a").lock;
    let idem_keys = store.keys_for(&subject).lease.lock;
    for name in ["sem", "idem"] {
        let named = Locker::builder(m.clone()).name(name).build();
        assert!(
            matches!(named, Err(Error::InvalidConfig(_))),
            "a Locker named {name:?}: {:?}",
            named.map(|l| l.keys_for("a").lock)
        );
        let fair = Locker::builder(m.clone()).name(name).fair().build();
        assert!(
            matches!(fair, Err(Error::InvalidConfig(_))),
            "fair {name:?}"
        );
    }
    for name in ["lock", "idem"] {
        let named = Semaphore::builder(m.clone(), 2).name(name).build();
        assert!(
            matches!(named, Err(Error::InvalidConfig(_))),
            "a Semaphore named {name:?}: {:?}",
            named.map(|s| s.keys_for("a").lock)
        );
    }
    let own = Locker::builder(m.clone()).name("lock").build().unwrap();
    assert_eq!(own.keys_for("a").lock, lock_keys);
    let own = Semaphore::builder(m.clone(), 2)
        .name("sem")
        .build()
        .unwrap();
    assert_eq!(own.keys_for("a").lock, sem_keys);
    assert!(lock_keys != sem_keys && sem_keys != idem_keys && idem_keys != lock_keys);
}

/// A semaphore name whose key holds something else (here a lock) fails the
/// acquire as an error about that request's data, under every failure
/// policy, on memory and on Redis: it is not an outage, so it never trips
/// the breaker, never fails open and never falls back to a local permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_a_data_error_under_every_policy() {
    use std::num::NonZeroU32;
    use std::sync::Arc;
    use std::time::Duration;
    use tollgate_core::failure::is_outage;
    use tollgate_core::lock::{AcquireRequest, LockKeys};
    use tollgate_core::{
        Error, FailurePolicy, LockBackend, LockOptions, RedisBackend, Semaphore, Subject,
    };

    let server = RedisServer::start().unwrap();
    let backends: [Arc<dyn LockBackend>; 2] = [
        Arc::new(MemoryBackend::new()),
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap()),
    ];
    let two = NonZeroU32::new(2).unwrap();
    for backend in backends {
        for policy in [
            FailurePolicy::Allow,
            FailurePolicy::Deny,
            FailurePolicy::Fallback { instances: two },
        ] {
            let permits = Semaphore::builder(Arc::clone(&backend), 4)
                .on_failure(policy)
                .build()
                .unwrap();
            // A lock on the very key the semaphore keeps its holders in.
            let keys = permits.keys_for("taken");
            let lock = LockKeys::new(permits.keyspace(), &Subject::new("taken"));
            assert_eq!(lock.lock, keys.lock);
            let ttl = Duration::from_secs(60);
            let req = AcquireRequest::new(lock, "other".into(), ttl, ttl);
            backend.acquire_lock(&req).await.unwrap();
            // More tries than the breaker's threshold.
            for _ in 0..8 {
                let e = permits.try_acquire("taken", &LockOptions::new()).await;
                let e = e.expect_err("a key of another type");
                assert!(!is_outage(&e), "{e}");
                assert!(!matches!(e, Error::CircuitOpen), "{policy:?}: {e}");
                assert!(!permits.fails_open(&e), "{policy:?}: {e}");
                assert!(e.to_string().contains("WRONGTYPE"), "{policy:?}: {e}");
            }
            // The breaker stayed closed: another name is served by the store.
            let other = permits.try_acquire("free", &LockOptions::new()).await;
            other.unwrap().release().await.unwrap();
        }
    }
}

/// A lock's own calls (release, extend, raising its fence) on a name that
/// now holds permits (its lock was broken and a fair locker took the name)
/// fail as its acquire does, with the store's WRONGTYPE, on memory and on
/// Redis alike: an error about that name's data, not an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_calls_on_a_name_that_holds_permits_fail_alike() {
    use std::sync::Arc;
    use std::time::Duration;
    use tollgate_core::failure::is_outage;
    use tollgate_core::lock::LockKeys;
    use tollgate_core::{FencingToken, LockBackend, LockOptions, RedisBackend, Semaphore, Subject};

    let server = RedisServer::start().unwrap();
    let backends: [Arc<dyn LockBackend>; 2] = [
        Arc::new(MemoryBackend::new()),
        Arc::new(RedisBackend::connect(&server.url()).await.unwrap()),
    ];
    for backend in backends {
        let permits = Semaphore::builder(Arc::clone(&backend), 4).build().unwrap();
        let held = permits
            .try_acquire("taken", &LockOptions::new())
            .await
            .unwrap();
        let lock = LockKeys::new(permits.keyspace(), &Subject::new("taken"));
        assert_eq!(lock.lock, permits.keys_for("taken").lock);
        let ttl = Duration::from_secs(60);
        let calls = [
            ("release", backend.release_lock(&lock, "gone").await),
            ("extend", backend.extend_lock(&lock, "gone", ttl).await),
            (
                "raise_fence",
                backend
                    .raise_fence(&lock, "gone", FencingToken(7), ttl)
                    .await,
            ),
        ];
        for (call, answer) in calls {
            let e = answer.expect_err(call);
            assert!(e.to_string().contains("WRONGTYPE"), "{call}: {e}");
            assert!(!is_outage(&e), "{call}: {e}");
        }
        held.release().await.unwrap();
    }
}

/// A fair queue whose head lost its ticket (evicted under memory pressure:
/// here the state such an eviction leaves, made by hand) does not hold the
/// queue up: the next acquire purges the head, and the waiter behind it is
/// served when the permit frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_head_whose_ticket_was_evicted_is_purged() {
    use std::time::Duration;
    use tollgate_core::{LockOptions, RedisBackend, Semaphore};

    let server = RedisServer::start().unwrap();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let permits = Semaphore::builder(backend, 1).fair().build().unwrap();
    let holder = permits.try_acquire("q", &LockOptions::new()).await.unwrap();
    // A waiter that arrived first and whose ticket is gone.
    let queue = permits.keys_for("q").queue();
    assert_eq!(server.cli(&["ZADD", &queue, "0", "evicted"]), "1");
    let waiter = {
        let permits = permits.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new().wait(Duration::from_secs(5));
            permits.acquire("q", &opts).await
        })
    };
    assert!(holder.release().await.unwrap());
    let permit = waiter
        .await
        .unwrap()
        .expect("served, not held up by the evicted head");
    assert!(permit.release().await.unwrap());
    assert_eq!(server.cli(&["ZSCORE", &queue, "evicted"]), "");
}

/// Under `Fallback`, the wait bound is the whole acquire's: one that waited
/// on Redis until Redis stopped answering waits for the local share only
/// what is left of its bound, not a whole bound more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_acquire_keeps_its_wait_bound() {
    use std::num::NonZeroU32;
    use std::time::{Duration, Instant};
    use tollgate_core::{Error, FailurePolicy, LockOptions, RedisBackend, Semaphore};
    use tollgate_testkit::ReplyDelay;

    let server = RedisServer::start().unwrap();
    let relay = ReplyDelay::start(&server.addr()).await.unwrap();
    let prefix = tollgate_testkit::unique("fb");
    let permits = Semaphore::builder(RedisBackend::connect(&relay.url()).await.unwrap(), 1)
        .prefix(&prefix)
        .timeout(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(100))
        .on_failure(FailurePolicy::Fallback {
            instances: NonZeroU32::new(1).unwrap(),
        })
        .build()
        .unwrap();
    let direct = Semaphore::builder(RedisBackend::connect(&server.url()).await.unwrap(), 1)
        .prefix(&prefix)
        .build()
        .unwrap();
    let hold = LockOptions::new().ttl(Duration::from_secs(30));
    // The local share (one permit) taken while Redis answers too late; the
    // relay then passes its late reply on and answers at once again.
    relay.set(Duration::from_secs(1));
    let _local = permits.try_acquire("k", &hold).await.unwrap();
    relay.set(Duration::ZERO);
    // Redis's permit held elsewhere (once the late acquire's clean-up has
    // given it back): the acquire below waits on Redis.
    let _remote = tollgate_testkit::eventually(Duration::from_secs(10), "Redis's permit", || {
        let (direct, hold) = (&direct, &hold);
        async move { direct.try_acquire("k", hold).await.ok() }
    })
    .await;
    // The relay answers at once again.
    tollgate_testkit::eventually(Duration::from_secs(10), "a prompt answer", || async {
        let t = Instant::now();
        let answered = match permits.try_acquire("other", &hold).await {
            Ok(_) | Err(Error::Busy { .. }) => true,
            Err(_) => false,
        };
        (answered && t.elapsed() < Duration::from_millis(200)).then_some(())
    })
    .await;
    let bound = Duration::from_secs(2);
    let wait = LockOptions::new().wait(bound);
    let started = Instant::now();
    let waiting = permits.acquire("k", &wait);
    let silence = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        relay.set(Duration::from_secs(3600));
    };
    let (got, ()) = tokio::join!(waiting, silence);
    let took = started.elapsed();
    assert!(matches!(got, Err(Error::Busy { .. })), "{got:?}");
    // The bound, one round trip's timeout and slack; a second bound
    // (3.5 s and more) is what it used to take.
    assert!(took < Duration::from_millis(3300), "{took:?}");
}
