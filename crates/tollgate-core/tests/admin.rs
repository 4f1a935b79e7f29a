//! The operator plane on every store (memory, standalone, a cluster): the
//! registry, inspect, reset, block and unblock, the throttled list, and —
//! on Redis — the fleet-wide effect on another instance's deny cache, with
//! the admin message delivered and with it lost (the version stamp).

mod rate_common;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rate_common::{assert_ttls, cluster, prefix, server};
use tollgate_core::admin::{Admin, Registered};
use tollgate_core::{
    Algorithm, Backend, DecisionSource, Error, ManualClock, MemoryBackend, Quota, RateLimiter,
    RedisBackend, Semaphore, Subject,
};
use tollgate_testkit::{eventually, ReplyDelay};

const WAIT: Duration = Duration::from_secs(10);

fn login(backend: &Backend, prefix: &str, deny_cache: usize) -> RateLimiter {
    RateLimiter::builder(backend.clone(), Algorithm::SlidingWindowLog)
        .quota(Quota::per_minute(3))
        .prefix(prefix)
        .name("login")
        .deny_cache(deny_cache)
        .build()
        .unwrap()
}

async fn standalone() -> Backend {
    RedisBackend::connect(&server().url()).await.unwrap().into()
}

async fn clustered() -> Backend {
    RedisBackend::connect_cluster(cluster().seeds())
        .await
        .unwrap()
        .into()
}

/// Waits until a limiter has registered under `admin`'s prefix.
async fn registered(admin: &Admin) {
    eventually(WAIT, "registered", || async {
        admin.limiters().await.ok().filter(|l| !l.is_empty())
    })
    .await;
}

/// Everything one store offers, in one scenario.
async fn operations(backend: Backend, prefix: &str) {
    let l = login(&backend, prefix, 0);
    let admin = Admin::new(backend.clone()).with_prefix(prefix);
    let listed = eventually(WAIT, "the limiter registers", || async {
        admin.limiters().await.ok().filter(|l| !l.is_empty())
    })
    .await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "login");
    assert_eq!(listed[0].algorithm, "sliding_window_log");
    assert_eq!(
        (
            listed[0].quotas[0].limit,
            listed[0].quotas[0].period_seconds
        ),
        (3, 60)
    );
    // A semaphore registers what it is too.
    let jobs = Semaphore::builder(backend.clone(), 4)
        .prefix(prefix)
        .name("jobs")
        .build()
        .unwrap();
    let semaphore = Registered::Semaphore {
        name: "jobs".into(),
        permits: 4,
    };
    // And an idempotency store.
    let orders = tollgate_core::idempotency::IdempotencyStore::builder(backend.clone())
        .prefix(prefix)
        .build()
        .unwrap();
    let records = Registered::Idempotency {
        name: "idem".into(),
    };
    eventually(WAIT, "the semaphore and the store register", || async {
        admin
            .registered()
            .await
            .ok()
            .filter(|r| r.contains(&semaphore) && r.contains(&records))
    })
    .await;
    drop((jobs, orders));

    let alice = Subject::new("alice:1").with_label("ali…");
    for _ in 0..3 {
        assert!(l.check(&alice).await.unwrap().allowed);
    }
    assert!(!l.check(&alice).await.unwrap().allowed);
    let state = admin.inspect("login", &alice).await.unwrap();
    assert_eq!(state.subject, alice.as_encoded());
    assert_eq!((state.remaining, state.limit), (0, 3));
    let retry = state.retry_after_ms.expect("empty: a retry");
    assert!(retry > 0 && retry <= 60_000, "{state:?}");
    assert_eq!(state.blocked_until_ms, None);
    // Inspecting takes nothing: a subject with room keeps it.
    for _ in 0..5 {
        assert_eq!(
            admin
                .inspect("login", &Subject::new("bob"))
                .await
                .unwrap()
                .remaining,
            3
        );
    }

    admin.reset("login", &alice).await.unwrap();
    let fresh = admin.inspect("login", &alice).await.unwrap();
    assert_eq!((fresh.remaining, fresh.reset_after_ms), (3, 0), "{fresh:?}");
    assert_eq!(fresh.retry_after_ms, None, "{fresh:?}");
    let d = l.check(&alice).await.unwrap();
    assert!(d.allowed && d.remaining == 2, "{d:?}");

    // A block refuses whatever the quota holds, with its own wait, on a
    // single check and on checks coalesced into one batch.
    admin
        .block("login", &alice, Duration::from_secs(30))
        .await
        .unwrap();
    let blocked = join_all((0..20).map(|_| l.check(&alice))).await;
    for d in &blocked {
        let d = d.as_ref().unwrap();
        assert!(!d.allowed, "{d:?}");
        let retry = d.retry_after.unwrap();
        assert!(
            retry > Duration::from_secs(25) && retry <= Duration::from_secs(30),
            "{d:?}"
        );
    }
    let state = admin.inspect("login", &alice).await.unwrap();
    assert_eq!(state.remaining, 2, "a block takes nothing: {state:?}");
    let until = state.blocked_until_ms.expect("blocked");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(until > now + 25_000 && until <= now + 31_000, "{state:?}");
    assert!(state.retry_after_ms.unwrap() > 25_000, "{state:?}");
    // Another subject is not blocked.
    assert!(
        l.check("bob").await.unwrap().allowed,
        "another subject is not blocked"
    );
    admin.unblock("login", &alice).await.unwrap();
    assert!(l.check(&alice).await.unwrap().allowed);
    assert_eq!(
        admin
            .inspect("login", &alice)
            .await
            .unwrap()
            .blocked_until_ms,
        None
    );

    // Bad input loses nothing and says what is wrong.
    assert!(matches!(
        admin.inspect("nope", &alice).await,
        Err(Error::NotRegistered(_))
    ));
    for bad in [Duration::ZERO, Duration::from_secs(400 * 86_400)] {
        assert!(matches!(
            admin.block("login", &alice, bad).await,
            Err(Error::InvalidConfig(_))
        ));
    }

    // Who is throttled: the denials above, with the label, fleet-wide.
    let top = eventually(WAIT, "the throttled list fills", || async {
        let top = admin.throttled(10).await.ok()?;
        top.into_iter()
            .find(|t| t.subject == alice.as_encoded() && t.denied >= 21)
    })
    .await;
    assert_eq!(top.limiter, "login");
    assert_eq!(top.label.as_deref(), Some("ali…"));
    assert!(top.last_denied_ms > 0);

    // What it decided lately, per second, fleet-wide (each instance adds
    // its counts once a second; the figure averages the last 5 seconds).
    let traffic = eventually(WAIT, "traffic is reported", || async {
        let l = admin.limiters().await.ok()?.pop()?;
        l.traffic
            .filter(|t| t.allowed_per_second > 0.0 && t.denied_per_second > 0.0)
    })
    .await;
    // 7 admitted and 21 refused in all, over a 5 s average.
    assert!(
        traffic.allowed_per_second <= 7.0 / 5.0 + 1e-9,
        "{traffic:?}"
    );
    assert!(
        traffic.denied_per_second <= 21.0 / 5.0 + 1e-9,
        "{traffic:?}"
    );
}

#[tokio::test]
async fn memory_operations() {
    operations(MemoryBackend::new().into(), &prefix()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_operations() {
    let prefix = prefix();
    operations(standalone().await, &prefix).await;
    assert_ttls(&[server()], &prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_operations() {
    let prefix = prefix();
    operations(clustered().await, &prefix).await;
    assert_ttls(&cluster().nodes().iter().collect::<Vec<_>>(), &prefix);
}

/// Denies `subject` on `l` until the denial comes from its deny cache.
async fn cached_denial(l: &RateLimiter, subject: &str) {
    for _ in 0..4 {
        l.check(subject).await.unwrap();
    }
    eventually(WAIT, "a denial is cached", || async {
        let d = l.check(subject).await.ok()?;
        (d.source == DecisionSource::DenyCache).then_some(())
    })
    .await;
}

/// Waits until instance `b` admits `subject` again; returns how long it took.
async fn admitted_again(b: &RateLimiter, subject: &str) -> Duration {
    let start = Instant::now();
    eventually(WAIT, "the other instance admits again", || async {
        b.check(subject).await.ok().filter(|d| d.allowed)?;
        Some(())
    })
    .await;
    start.elapsed()
}

/// Two instances (two connections, each with its limiter and deny cache):
/// an admin action on one reaches the other's cache — by its message, and
/// by the version stamp when the message is lost.
async fn fleet_wide(a: Backend, b: Backend, raw: impl Fn(&[&str]) -> String) {
    let prefix = prefix();
    let (la, lb) = (login(&a, &prefix, 1000), login(&b, &prefix, 1000));
    let admin = Admin::new(a.clone()).with_prefix(&prefix);
    registered(&admin).await;

    cached_denial(&lb, "carol").await;
    admin.reset("login", &Subject::new("carol")).await.unwrap();
    let took = admitted_again(&lb, "carol").await;
    eprintln!("reset reached the other instance in {took:?}");

    // A block, then an unblock, whose denials the other instance cached.
    admin
        .block("login", &Subject::new("dave"), Duration::from_secs(60))
        .await
        .unwrap();
    let d = lb.check("dave").await.unwrap();
    assert!(!d.allowed && d.retry_after.unwrap() > Duration::from_secs(55));
    // Cached once a denial sent after the block's notice comes back (one
    // that crossed the notice is not cached: it may predate the action).
    eventually(WAIT, "the block's denial is cached", || async {
        let d = lb.check("dave").await.ok()?;
        (d.source == DecisionSource::DenyCache).then_some(())
    })
    .await;
    admin.unblock("login", &Subject::new("dave")).await.unwrap();
    admitted_again(&lb, "dave").await;

    // A lost message: an operator who deletes the keys by hand and bumps
    // the stamp publishes nothing; the cache is forgotten at the next poll.
    cached_denial(&lb, "erin").await;
    let keys = la.keys_for(&Subject::new("erin"));
    raw(&["DEL", &keys[0]]);
    raw(&["INCR", &format!("{prefix}:admin:version")]);
    raw(&["PEXPIRE", &format!("{prefix}:admin:version"), "60000"]);
    let took = admitted_again(&lb, "erin").await;
    eprintln!("a lost message cost {took:?}");

    // The acting instance's own limiters forget before the action returns:
    // the next request is admitted, not refused from the cache.
    for round in 0..20 {
        let subject = format!("frank{round}");
        cached_denial(&la, &subject).await;
        admin.reset("login", &Subject::new(&subject)).await.unwrap();
        let d = la.check(&subject).await.unwrap();
        assert!(d.allowed, "round {round}: refused after the reset: {d:?}");
    }
    drop(la);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_fleet_wide() {
    fleet_wide(standalone().await, standalone().await, |args| {
        server().cli(args)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_fleet_wide() {
    fleet_wide(clustered().await, clustered().await, |args| {
        let c = cluster();
        let node = c.master_for_key(args[1]);
        c.nodes()[node].cli(args)
    })
    .await;
}

/// A block reaches the local fallback too: with Redis down, a limiter that
/// falls back to its own in-process quota still refuses the blocked
/// subject (and only it), with the block's wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_reaches_the_local_fallback() {
    let mut server = tollgate_testkit::RedisServer::start().unwrap();
    let backend: Backend = RedisBackend::connect(&server.url()).await.unwrap().into();
    let prefix = prefix();
    let l = RateLimiter::builder(backend.clone(), Algorithm::Gcra)
        .quota(Quota::per_minute(100))
        .prefix(&prefix)
        .name("api")
        // Without a deny cache, so the refusal seen while Redis is down
        // is the fallback's own.
        .deny_cache(0)
        .failure_policy(tollgate_core::FailurePolicy::Fallback {
            instances: std::num::NonZeroU32::new(1).unwrap(),
        })
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let admin = Admin::new(backend).with_prefix(&prefix);
    registered(&admin).await;
    let mallory = Subject::new("mallory");
    admin
        .block("api", &mallory, Duration::from_secs(60))
        .await
        .unwrap();
    // A shorter wait asked later (pacing) keeps the longer block, in the
    // fallback too.
    l.block_at_least(&mallory, Duration::from_secs(1))
        .await
        .unwrap();
    // The store refuses it; then Redis goes away. The notice was published
    // before the block call returned: it reaches the instance even so (it
    // is in flight or read already).
    assert!(!l.check(&mallory).await.unwrap().allowed);
    server.stop();
    let d = eventually(WAIT, "the fallback refuses the blocked subject", || async {
        let d = l.check(&mallory).await.ok()?;
        (d.source == DecisionSource::Fallback && !d.allowed).then_some(d)
    })
    .await;
    assert!(d.retry_after.unwrap() > Duration::from_secs(50), "{d:?}");
    let other = l.check("someone").await.unwrap();
    assert!(
        other.allowed && other.source == DecisionSource::Fallback,
        "{other:?}"
    );
}

/// `multi`: a token bucket of 10 per second and 1000 per hour.
fn ten_a_second_and_a_thousand_an_hour(backend: &Backend, prefix: &str) -> RateLimiter {
    RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
        .quota(Quota::per_second(10))
        .quota(Quota::per_hour(1000))
        .prefix(prefix)
        .name("multi")
        .deny_cache(0)
        .build()
        .unwrap()
}

/// A limiter of several quotas honours a block as one of one quota does
/// (its checks carry a key per quota, then the block key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_holds_for_several_quotas() {
    let backends: [Backend; 3] = [
        MemoryBackend::new().into(),
        standalone().await,
        clustered().await,
    ];
    for backend in backends {
        let prefix = prefix();
        let l = ten_a_second_and_a_thousand_an_hour(&backend, &prefix);
        let admin = Admin::new(backend).with_prefix(&prefix);
        registered(&admin).await;
        let s = Subject::new("s");
        admin
            .block("multi", &s, Duration::from_secs(60))
            .await
            .unwrap();
        let refused = join_all((0..12).map(|_| l.check(&s))).await;
        for d in refused {
            let d = d.unwrap();
            assert!(!d.allowed, "{d:?}");
            assert!(d.quotas.iter().all(|q| !q.allowed), "{d:?}");
        }
        admin.unblock("multi", &s).await.unwrap();
        assert!(l.check(&s).await.unwrap().allowed);
    }
}

/// `inspect`'s reset is when every quota is full again: after 10 units of
/// 10 per second and 1000 per hour, the hour's bucket refills them in 36 s,
/// long after the second's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_resets_when_every_quota_is_full() {
    for backend in [MemoryBackend::new().into(), standalone().await] {
        let prefix = prefix();
        let l = ten_a_second_and_a_thousand_an_hour(&backend, &prefix);
        let admin = Admin::new(backend).with_prefix(&prefix);
        registered(&admin).await;
        let s = Subject::new("s");
        assert!(l.check_n(&s, 10).await.unwrap().allowed);
        let state = admin.inspect("multi", &s).await.unwrap();
        assert_eq!((state.remaining, state.limit), (0, 10), "{state:?}");
        assert!(
            (30_000..=36_000).contains(&state.reset_after_ms),
            "{state:?}"
        );
    }
}

/// `inspect` waits for a slow store as long as the operator's timeout says
/// (5 s unless set), not the 100 ms a request path's limiter has by default
/// — whether asked through `Admin` or of the limiter itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_waits_as_long_as_the_operator_says() {
    let slow = ReplyDelay::start(&server().addr()).await.unwrap();
    let backend: Backend = RedisBackend::connect(&slow.url()).await.unwrap().into();
    let prefix = prefix();
    let l = login(&backend, &prefix, 0);
    let admin = Admin::new(backend).with_prefix(&prefix);
    registered(&admin).await;
    let alice = Subject::new("alice");
    assert!(l.check(&alice).await.unwrap().allowed);
    slow.set(Duration::from_millis(150));
    let state = admin.inspect("login", &alice).await.unwrap();
    assert_eq!(state.remaining, 2, "{state:?}");
    let own = l.inspect(&alice).await.unwrap();
    assert_eq!(own.remaining, 2, "{own:?}");
    let quick = admin.with_timeout(Duration::from_millis(50));
    let e = quick.inspect("login", &alice).await.unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
}

/// A plan change runs a second algorithm under one name for a while, each
/// on keys of its own: both are listed, a reset gives the subject its
/// quota back on both, inspect shows the one with less left, and the
/// subject they refuse is throttled once, not once per algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_two_algorithms_is_reset_on_both() {
    for backend in [MemoryBackend::new().into(), standalone().await] {
        let prefix = prefix();
        let build = |algorithm, n| {
            RateLimiter::builder(Backend::clone(&backend), algorithm)
                .quota(Quota::per_hour(n))
                .prefix(&prefix)
                .name("api")
                .deny_cache(0)
                .build()
                .unwrap()
        };
        let (old, new) = (build(Algorithm::Gcra, 1), build(Algorithm::FixedWindow, 2));
        let admin = Admin::new(backend.clone()).with_prefix(&prefix);
        eventually(WAIT, "both registered", || async {
            admin.limiters().await.ok().filter(|l| l.len() == 2)
        })
        .await;
        let alice = Subject::new("alice");
        assert!(old.check(&alice).await.unwrap().allowed);
        assert!(new.check(&alice).await.unwrap().allowed);
        assert!(!old.check(&alice).await.unwrap().allowed);
        assert_eq!(admin.inspect("api", &alice).await.unwrap().remaining, 0);
        let top = eventually(WAIT, "alice is throttled", || async {
            let top = admin.throttled(10).await.ok()?;
            top.iter()
                .any(|t| t.subject == alice.as_encoded())
                .then_some(top)
        })
        .await;
        let listed = top.iter().filter(|t| t.subject == alice.as_encoded());
        assert_eq!(listed.count(), 1, "{top:?}");
        admin.reset("api", &alice).await.unwrap();
        assert!(old.check(&alice).await.unwrap().allowed);
        let d = new.check(&alice).await.unwrap();
        assert!(d.allowed && d.remaining == 1, "{d:?}");
    }
}

/// `block_at_least` (what pacing an upstream uses) keeps a block that
/// lasts longer: a later, shorter wait must not lift it; a longer one
/// extends it; `block` (the operator's) replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_at_least_keeps_a_longer_block() {
    for backend in [MemoryBackend::new().into(), standalone().await] {
        let prefix = prefix();
        let l = login(&backend, &prefix, 0);
        let s = Subject::new("s");
        let left = || async { l.blocked_for(&s).await.unwrap().unwrap() };
        l.block_at_least(&s, Duration::from_secs(60)).await.unwrap();
        l.block_at_least(&s, Duration::from_secs(1)).await.unwrap();
        assert!(left().await > Duration::from_secs(58));
        l.block_at_least(&s, Duration::from_secs(120))
            .await
            .unwrap();
        assert!(left().await > Duration::from_secs(118));
        l.block(&s, Duration::from_secs(1)).await.unwrap();
        assert!(left().await <= Duration::from_secs(1));
    }
}

/// A message published while an instance's subscription is down is not
/// lost for good: once it subscribes again it reads the version stamp,
/// sees it moved, and forgets what it cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_missed_while_the_subscription_was_down_is_caught_up() {
    let (a, b) = (standalone().await, standalone().await);
    let prefix = prefix();
    let (_la, lb) = (login(&a, &prefix, 1000), login(&b, &prefix, 1000));
    let admin = Admin::new(a).with_prefix(&prefix);
    registered(&admin).await;
    cached_denial(&lb, "frank").await;
    // Every subscription is cut, and the reset is published before any
    // instance is back (a watcher waits before it subscribes again).
    server().cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    admin.reset("login", &Subject::new("frank")).await.unwrap();
    admitted_again(&lb, "frank").await;
}

/// The first limiter of a backend built where no runtime runs cannot start
/// the watcher; the next one built on a runtime does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_starts_with_the_first_limiter_on_a_runtime() {
    let (a, b) = (standalone().await, standalone().await);
    let prefix = prefix();
    let early = {
        let (b, prefix) = (b.clone(), prefix.clone());
        std::thread::spawn(move || login(&b, &prefix, 1000))
            .join()
            .unwrap()
    };
    let lb = login(&b, &prefix, 1000);
    let admin = Admin::new(a).with_prefix(&prefix);
    registered(&admin).await;
    cached_denial(&lb, "grace").await;
    admin.reset("login", &Subject::new("grace")).await.unwrap();
    admitted_again(&lb, "grace").await;
    drop(early);
}

/// A block runs on the store's clock: a limiter on its own clock, however
/// far that is from the store's, is refused while the block lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_holds_whatever_the_limiters_clock() {
    let backends: [Backend; 2] = [MemoryBackend::new().into(), standalone().await];
    for backend in backends {
        let prefix = prefix();
        let day_ahead = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
            + 86_400_000_000;
        let l = RateLimiter::builder(backend.clone(), Algorithm::Gcra)
            .quota(Quota::per_minute(100))
            .prefix(&prefix)
            .name("clocked")
            .clock(tollgate_core::ManualClock::new(day_ahead))
            .deny_cache(0)
            .build()
            .unwrap();
        let admin = Admin::new(backend).with_prefix(&prefix);
        registered(&admin).await;
        let s = Subject::new("s");
        admin
            .block("clocked", &s, Duration::from_secs(60))
            .await
            .unwrap();
        let d = l.check(&s).await.unwrap();
        assert!(!d.allowed, "{d:?}");
        assert!(d.retry_after.unwrap() > Duration::from_secs(50), "{d:?}");
    }
}

#[test]
fn the_operator_planes_own_names_are_reserved() {
    for name in ["throttled", "traffic"] {
        assert!(tollgate_core::Keyspace::new("app", name).is_err(), "{name}");
    }
    assert!(tollgate_core::Keyspace::new("app", "login").is_ok());
}

/// A charge taken before a reset is void after it: its refund gives
/// nothing back, or the subject would get it on top of its fresh quota —
/// on every algorithm, in memory, on a server and on a cluster. A charge
/// taken after the reset is given back as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_taken_before_a_reset_is_not_given_back_after_it() {
    // The memory store's clock is moved past the reset by hand (a check in
    // the reset's own microsecond counts as before it); a server's `TIME`
    // moves between round trips.
    let clock = ManualClock::new(1_700_000_000_000_000);
    for backend in [
        MemoryBackend::with_clock(clock.clone()).into(),
        standalone().await,
        clustered().await,
    ] {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowLog,
            Algorithm::SlidingWindowCounter,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ] {
            let limiter = RateLimiter::builder(Backend::clone(&backend), algorithm)
                .quota(Quota::per_hour(3))
                .prefix(prefix())
                .name("api")
                .deny_cache(0)
                .build()
                .unwrap();
            let what = format!("{algorithm:?} on {}", limiter.backend_kind());
            let alice = Subject::new("alice");
            let before = limiter.check(&alice).await.unwrap().charge.unwrap();
            limiter.reset(&alice).await.unwrap();
            clock.advance(Duration::from_millis(1));
            let after = limiter.check(&alice).await.unwrap().charge.unwrap();
            for _ in 0..2 {
                assert!(limiter.check(&alice).await.unwrap().allowed, "{what}");
            }
            assert!(!limiter.check(&alice).await.unwrap().allowed, "{what}");
            assert!(
                !limiter.refund(&alice, &before).await.unwrap(),
                "{what}: applied"
            );
            let d = limiter.check(&alice).await.unwrap();
            assert!(!d.allowed, "{what}: {d:?}");
            assert!(limiter.refund(&alice, &after).await.unwrap(), "{what}");
            let d = limiter.check(&alice).await.unwrap();
            assert!(d.allowed, "{what}: {d:?}");
        }
    }
}

/// On a bucket of one a second in memory (tokio's paused clock lets each
/// wait for a slot pass): a check, `queued` reservations (the last one's
/// slot `queued` seconds ahead), a reset 100 ms later, then `after` more
/// and a fresh check, admitted. The last reservation's refund gives
/// nothing back: the subject stays refused.
async fn a_reservation_is_not_given_back_after_a_reset(queued: u32, after: Duration) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let limiter = RateLimiter::builder(MemoryBackend::with_clock(clock.clone()), algorithm)
            .quota(Quota::per_second(1))
            .name("api")
            .deny_cache(0)
            .build()
            .unwrap();
        let alice = Subject::new("alice");
        assert!(limiter.check(&alice).await.unwrap().allowed);
        let mut last = None;
        for _ in 0..queued {
            last = Some(
                limiter
                    .acquire(&alice, 1, Duration::from_secs(10))
                    .await
                    .unwrap(),
            );
        }
        let last = last.expect("at least one reservation");
        assert!(
            last.allowed && last.waited >= Duration::from_secs(queued.into()),
            "{last:?}"
        );
        clock.advance(Duration::from_millis(100));
        limiter.reset(&alice).await.unwrap();
        clock.advance(after);
        assert!(
            limiter.check(&alice).await.unwrap().allowed,
            "{algorithm:?}"
        );
        let charge = last.charge.unwrap();
        assert!(
            !limiter.refund(&alice, &charge).await.unwrap(),
            "{algorithm:?}: applied"
        );
        let d = limiter.check(&alice).await.unwrap();
        assert!(!d.allowed, "{algorithm:?}: {d:?}");
    }
}

/// A reservation (a bucket's `acquire` that waits for its slot) is charged
/// at its slot but taken when it was made: made before a reset, it is not
/// given back after it, even when its slot comes after the reset.
#[tokio::test(start_paused = true)]
async fn a_reservation_made_before_a_reset_is_not_given_back_after_it() {
    a_reservation_is_not_given_back_after_a_reset(1, Duration::from_millis(100)).await;
}

/// A reservation's slot may lie far past its reset: the stamp lives as
/// long as a reservation may reach, so the refund of one made before the
/// reset, with its slot seconds after the stamp's other horizons (2
/// periods, a whole refill, 1 s), still gives nothing back.
#[tokio::test(start_paused = true)]
async fn a_reservation_far_ahead_of_a_reset_is_not_given_back_after_it() {
    a_reservation_is_not_given_back_after_a_reset(5, Duration::from_millis(3500)).await;
}

/// A store that stops answering (a frozen server: connections open, no
/// replies) fails every admin action with a timeout (5 s a call at least,
/// the action timeout for `Admin`'s reads), never holding its caller until
/// the connection gives up. The actions run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_on_a_frozen_store_time_out() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let backend: Backend = RedisBackend::connect(&server.url()).await.unwrap().into();
    let limiter = RateLimiter::builder(Backend::clone(&backend), Algorithm::Gcra)
        .quota(Quota::per_minute(10))
        .name("frozen")
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let admin = Admin::new(Backend::clone(&backend)).with_timeout(Duration::from_millis(200));
    let alice = Subject::new("alice");
    server.pause();
    let outcomes = tokio::join!(
        returned(limiter.reset(&alice)),
        returned(limiter.block(&alice, Duration::from_secs(60))),
        returned(limiter.unblock(&alice)),
        returned(async { limiter.blocked_for(&alice).await.map(drop) }),
        returned(async { admin.registered().await.map(drop) }),
        returned(async { admin.throttled(10).await.map(drop) }),
        returned(async { admin.holders().await.map(drop) }),
        returned(async { admin.idempotency_in_flight().await.map(drop) }),
        returned(async { admin.break_lock("lock", &alice).await.map(drop) }),
    );
    server.resume();
    let outcomes = [
        ("reset", outcomes.0),
        ("block", outcomes.1),
        ("unblock", outcomes.2),
        ("blocked_for", outcomes.3),
        ("registered", outcomes.4),
        ("throttled", outcomes.5),
        ("holders", outcomes.6),
        ("in flight", outcomes.7),
        ("break_lock", outcomes.8),
    ];
    for (what, r) in outcomes {
        assert!(matches!(r, Err(Error::Timeout(_))), "{what}: {r:?}");
    }
}

/// `action`'s result, once it returned within 30 s: past any action's
/// bound (two calls of 5 s), far below a connection's own wait for a reply.
async fn returned<T>(
    action: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(Duration::from_secs(30), action)
        .await
        .expect("the action returned")
}

/// A limiter built while its Redis is down is listed soon after Redis is
/// back, not at its next routine refresh (a minute later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_built_while_redis_is_down_is_listed_once_it_is_back() {
    let mut server = tollgate_testkit::RedisServer::start().unwrap();
    let url = server.url();
    server.stop();
    // Meanwhile the port takes connections and never answers (a frozen
    // store): the first one is for the registry write, the backend's first
    // command, which gives up after its 2 s bound.
    let frozen = tokio::net::TcpListener::bind(("127.0.0.1", server.port()))
        .await
        .unwrap();
    let prefix = prefix();
    let backend: Backend = RedisBackend::connect_lazy(&url).unwrap().into();
    let _login = login(&backend, &prefix, 0);
    let (conn, _) = tokio::time::timeout(WAIT, frozen.accept())
        .await
        .expect("the registry write is tried")
        .unwrap();
    // Past the write's bound: it has failed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop((conn, frozen));
    server.restart().unwrap();
    let admin = Admin::new(RedisBackend::connect(&url).await.unwrap()).with_prefix(&prefix);
    eventually(Duration::from_secs(20), "login listed", || async {
        admin.limiters().await.ok().filter(|l| l.len() == 1)
    })
    .await;
}

/// Two configurations of one limiter written at once (a plan table being
/// replaced while the old one still runs, or a fleet half rolled out): the
/// one built last is listed, whichever wrote last; an entry no owner has
/// written for minutes (a plan removed, its limiters gone) is not listed;
/// and a limiter built here writes its entry in that form. On Redis and in
/// memory alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_lists_the_newest_configuration_of_live_owners() {
    newest_configuration_of_live_owners(RedisBackend::connect(&server().url()).await.unwrap())
        .await;
    newest_configuration_of_live_owners(MemoryBackend::new()).await;
}

/// In memory, where nothing ages an entry out, a limiter's entry is taken
/// out once the last limiter of its configuration is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_registry_entry_goes_with_its_last_owner() {
    let store = MemoryBackend::new();
    let prefix = prefix();
    let build = || {
        RateLimiter::builder(store.clone(), Algorithm::Gcra)
            .quota(Quota::per_minute(7))
            .prefix(&prefix)
            .name("temp")
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let admin = Admin::new(store.clone()).with_prefix(&prefix);
    let names = || async {
        let all = admin.limiters().await.unwrap();
        all.into_iter().map(|l| l.name).collect::<Vec<_>>()
    };
    assert_eq!(names().await, ["temp"]);
    drop((a, b));
    eventually(WAIT, "the entry is taken out", || async {
        names().await.is_empty().then_some(())
    })
    .await;
}

async fn newest_configuration_of_live_owners<S>(store: S)
where
    S: tollgate_core::store::AdminBackend + tollgate_core::RateBackend + Into<Backend> + Clone,
{
    let prefix = prefix();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let entry = |name: &str, per_minute: u64, digest: &str, built: u64, seen: u64| {
        let value = format!(
            r#"{{"kind":"limiter","name":"{name}","algorithm":"gcra","quotas":[{{"limit":{per_minute},"period_seconds":60,"period_micros":60000000,"burst":{per_minute}}}],"built_ms":{built},"seen_ms":{seen}}}"#
        );
        (format!("limiter:{name}:gcra#{digest}"), value)
    };
    let key = format!("{prefix}:registry");
    let hour = Duration::from_secs(3600);
    for (field, value) in [
        entry("api", 20, "b", now_ms - 1_000, now_ms),
        // The older configuration's refresh, written after the newer's.
        entry("api", 10, "a", now_ms - 60_000, now_ms),
        entry("gone", 5, "c", now_ms - 3_600_000, now_ms - 600_000),
    ] {
        store.register(&key, &field, &value, hour).await.unwrap();
    }
    let admin = Admin::new(store.clone()).with_prefix(&prefix);
    let listed = admin.limiters().await.unwrap();
    let seen: Vec<(&str, u64)> = listed
        .iter()
        .map(|l| (l.name.as_str(), l.quotas[0].limit))
        .collect();
    assert_eq!(seen, [("api", 20)]);

    let _live = RateLimiter::builder(store.clone(), Algorithm::Gcra)
        .quota(Quota::per_minute(7))
        .prefix(&prefix)
        .name("fresh")
        .build()
        .unwrap();
    let listed = eventually(WAIT, "the limiter registers", || async {
        let all = admin.limiters().await.ok()?;
        all.iter().any(|l| l.name == "fresh").then_some(all)
    })
    .await;
    let fresh = listed.iter().find(|l| l.name == "fresh").unwrap();
    assert_eq!(fresh.quotas[0].limit, 7);
    let fields: Vec<(String, String)> = store.registered(&key).await.unwrap();
    // A shared store's entry says when it was last written; an in-process
    // store's is never refreshed (it goes with its last owner).
    let seen = fields
        .iter()
        .any(|(f, v)| f.starts_with("limiter:fresh:gcra#") && v.contains("\"seen_ms\""));
    assert_eq!(seen, !store.in_process(), "{fields:?}");
}
