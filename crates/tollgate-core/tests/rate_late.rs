//! A check whose caller was answered by the failure policy takes nothing,
//! however late Redis decides it: queued checks whose callers gave up are
//! never sent, and a sent one carries a deadline the script honours on the
//! server's clock; a check Redis decided in time but whose reply came after
//! its caller gave up is given back. 100 ms timeout, 20 per hour: 30 checks
//! while Redis is paused all get the failure policy (a refusal, or an
//! admission that took nothing); once it resumes, the subject still has all
//! 20 units. With coalescing on and off, on a standalone Redis and a
//! cluster.

use std::time::Duration;

use futures_util::future::join_all;
use tollgate_core::{
    Algorithm, Coalescing, DecisionSource, Error, FailurePolicy, Quota, RateLimiter, RedisBackend,
    Subject,
};
use tollgate_testkit::{RedisCluster, RedisServer, ReplyDelay};

fn limiter(backend: RedisBackend, name: &str, policy: FailurePolicy) -> RateLimiter {
    RateLimiter::builder(backend, Algorithm::FixedWindow)
        .quota(Quota::per_hour(20))
        .name(name)
        .timeout(Duration::from_millis(100))
        .failure_policy(policy)
        .build()
        .unwrap()
}

/// Each (name, coalescing, policy) to try: a refusal (deny) and an
/// admission that took nothing (allow: fail open) alike.
fn variants() -> Vec<(String, Coalescing, FailurePolicy)> {
    let mut out = Vec::new();
    for (c, coalescing) in [("on", Coalescing::default()), ("off", Coalescing::off())] {
        for (p, policy) in [
            ("deny", FailurePolicy::Deny),
            ("allow", FailurePolicy::Allow),
        ] {
            out.push((format!("{c}-{p}"), coalescing, policy));
        }
    }
    out
}

/// Pauses `server` around 30 checks of `subject`, then checks what is left.
async fn refused_checks_take_nothing(server: &RedisServer, l: &RateLimiter, subject: &str) {
    // One answer teaches the backend the server's clock.
    assert_eq!(l.check("warm-up").await.unwrap().remaining, 19);
    server.pause();
    let answers = join_all((0..30).map(|_| l.check(subject))).await;
    for a in &answers {
        match l.failure_policy() {
            FailurePolicy::Deny => assert!(
                matches!(a, Err(Error::Timeout(_) | Error::CircuitOpen)),
                "{a:?}"
            ),
            _ => assert!(
                matches!(a, Ok(d) if d.allowed && d.source == DecisionSource::FailOpen),
                "{a:?}"
            ),
        }
    }
    server.resume();
    // The circuit breaker opened meanwhile: wait out its cooldown, then the
    // next check that Redis decides comes after everything sent before it.
    let d = tollgate_testkit::eventually(Duration::from_secs(10), "Redis answers", || async {
        let d = l.check(subject).await.ok()?;
        (d.source == DecisionSource::Backend).then_some(d)
    })
    .await;
    assert_eq!(d.remaining, 19, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_refused_checks_take_nothing() {
    let server = RedisServer::start().unwrap();
    for (name, coalescing, policy) in variants() {
        let backend = RedisBackend::connect(&server.url())
            .await
            .unwrap()
            .with_coalescing(coalescing);
        let l = limiter(backend, &name, policy);
        refused_checks_take_nothing(&server, &l, "late").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_refused_checks_take_nothing() {
    let cluster = RedisCluster::start().unwrap();
    for (name, coalescing, policy) in variants() {
        let backend = RedisBackend::connect_cluster(cluster.seeds())
            .await
            .unwrap()
            .with_coalescing(coalescing);
        let l = limiter(backend, &name, policy);
        let subject = "late";
        let node = cluster.master_for_key(&l.keys_for(&Subject::new(subject))[0]);
        refused_checks_take_nothing(&cluster.nodes()[node], &l, subject).await;
    }
}

/// Redis decides every check at once, but its replies are held back past
/// the callers' timeout (a relay): the callers get the failure policy, and
/// what Redis admitted for them is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_admissions_replied_too_late_are_given_back() {
    let server = RedisServer::start().unwrap();
    let relay = ReplyDelay::start(&server.addr()).await.unwrap();
    for (name, coalescing, policy) in variants() {
        let backend = RedisBackend::connect(&relay.url())
            .await
            .unwrap()
            .with_coalescing(coalescing);
        let l = limiter(backend, &format!("relayed-{name}"), policy);
        assert_eq!(l.check("warm-up").await.unwrap().remaining, 19);
        relay.set(Duration::from_millis(400));
        let answers = join_all((0..5).map(|_| l.check("late"))).await;
        assert!(
            answers.iter().all(|a| a
                .as_ref()
                .map_or(true, |d| d.source == DecisionSource::FailOpen)),
            "{name}: {answers:?}"
        );
        relay.set(Duration::ZERO);
        // Redis decided them (five units used), then the refunds came.
        let d = tollgate_testkit::eventually(Duration::from_secs(10), "given back", || async {
            let d = l.check_n("late", 0).await.ok()?;
            (d.source == DecisionSource::Backend && d.remaining == 20).then_some(d)
        })
        .await;
        assert_eq!(d.remaining, 20, "{name}: {d:?}");
    }
}

/// A quota lease's take decided in time but replied after its caller gave
/// up is given back whole: the check's cost and the slice it took. Hot at
/// the first check, so no check depends on when a 100 ms window turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_replied_too_late_is_given_back() {
    let server = RedisServer::start().unwrap();
    let relay = ReplyDelay::start(&server.addr()).await.unwrap();
    let cap = 100_000;
    let leased = |backend: RedisBackend| {
        RateLimiter::builder(backend, Algorithm::FixedWindow)
            .quota(Quota::per_hour(cap))
            .name("take")
            .timeout(Duration::from_millis(100))
            .failure_policy(FailurePolicy::Allow)
            .quota_leases(
                tollgate_core::QuotaLeases::default()
                    .hot_checks(1)
                    .target(Duration::from_secs(60))
                    .max_age(Duration::from_secs(60)),
            )
            .build()
            .unwrap()
    };
    let l = leased(RedisBackend::connect(&relay.url()).await.unwrap());
    let peer = RateLimiter::builder(
        RedisBackend::connect(&server.url()).await.unwrap(),
        Algorithm::FixedWindow,
    )
    .quota(Quota::per_hour(cap))
    .name("take")
    .build()
    .unwrap();
    // Unrelayed, a subject's first check takes a slice (it and the slice
    // leave the store), and the second is served from it.
    let first = l.check("control").await.unwrap();
    assert_eq!(first.source, DecisionSource::Backend, "{first:?}");
    assert!(peer.check_n("control", 0).await.unwrap().remaining < cap - 1);
    assert_eq!(
        l.check("control").await.unwrap().source,
        DecisionSource::Lease
    );
    relay.set(Duration::from_millis(400));
    let d = l.check("late").await.unwrap();
    assert_eq!(d.source, DecisionSource::FailOpen, "{d:?}");
    relay.set(Duration::ZERO);
    let left = tollgate_testkit::eventually(Duration::from_secs(10), "given back", || async {
        let left = peer.check_n("late", 0).await.ok()?.remaining;
        (left == cap).then_some(left)
    })
    .await;
    assert_eq!(left, cap);
}

/// An acquire whose reservation is decided in time but replied after its
/// caller gave up gives its slot back, even as the last in line: charged at
/// its slot, not at the decision (which would make its own slot look like
/// a waiter behind it, and give nothing back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_replied_too_late_gives_its_slot_back() {
    let server = RedisServer::start().unwrap();
    let relay = ReplyDelay::start(&server.addr()).await.unwrap();
    let backend = RedisBackend::connect(&relay.url()).await.unwrap();
    // One a minute: the next slot is a minute away, the one after two.
    let l = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_minute(1))
        .name(tollgate_testkit::unique("slot"))
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(200))
        .deny_cache(0)
        .build()
        .unwrap();
    assert!(l.check("s").await.unwrap().allowed);
    // Past the limiter's timeout, within the connection's own.
    relay.set(Duration::from_millis(400));
    let gave_up = l.acquire("s", 1, Duration::from_secs(90)).await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    relay.set(Duration::ZERO);
    // Once the give-back lands, the next slot is a minute away again.
    tollgate_testkit::eventually(Duration::from_secs(10), "the slot given back", || async {
        let d = l.check("s").await.ok()?;
        let wait = d.retry_after?;
        (wait < Duration::from_secs(90)).then_some(())
    })
    .await;
}

/// The same late reservation with a reset of its subject between the
/// reservation and its give-back: the units went with the reset, so the
/// give-back (which names when they were taken, not the slot) lands on
/// nothing. The fresh quota's unit, taken after the reset, stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reservation_reset_before_its_give_back_gives_nothing() {
    let server = RedisServer::start().unwrap();
    let relay = ReplyDelay::start(&server.addr()).await.unwrap();
    let name = tollgate_testkit::unique("slot");
    let build = |backend: RedisBackend| {
        RateLimiter::builder(backend, Algorithm::Gcra)
            .quota(Quota::per_minute(1))
            .name(&name)
            .failure_policy(FailurePolicy::Deny)
            .timeout(Duration::from_millis(100))
            .deny_cache(0)
            .build()
            .unwrap()
    };
    let l = build(RedisBackend::connect(&relay.url()).await.unwrap());
    let direct = build(RedisBackend::connect(&server.url()).await.unwrap());
    assert!(l.check("s").await.unwrap().allowed);
    // Scripts in the server's cache: each script's first call adds one.
    let cached = || {
        let info = server.cli(&["INFO", "memory"]);
        let n = info
            .lines()
            .find_map(|l| l.strip_prefix("number_of_cached_scripts:"));
        n.and_then(|n| n.trim().parse::<u64>().ok())
            .expect("number_of_cached_scripts")
    };
    // The reset's scripts loaded beforehand: the give-back's settle script
    // is then the only one new to this server.
    direct.reset(&Subject::new("warm-up")).await.unwrap();
    let before = cached();
    let checks = server.command_calls("evalsha") + server.command_calls("eval");
    // Decided on the server at once, replied after the caller gave up
    // (100 ms): the reset lands in between.
    relay.set(Duration::from_millis(450));
    let caller = tokio::spawn({
        let l = l.clone();
        async move { l.acquire("s", 1, Duration::from_secs(90)).await }
    });
    tollgate_testkit::eventually(Duration::from_secs(5), "the reservation made", || async {
        let calls = server.command_calls("evalsha") + server.command_calls("eval");
        (calls > checks).then_some(())
    })
    .await;
    direct.reset(&Subject::new("s")).await.unwrap();
    assert!(direct.check("s").await.unwrap().allowed, "the fresh quota");
    let gave_up = caller.await.unwrap();
    assert!(gave_up.is_err(), "{gave_up:?}");
    relay.set(Duration::ZERO);
    tollgate_testkit::eventually(Duration::from_secs(10), "the give-back sent", || async {
        (cached() > before).then_some(())
    })
    .await;
    let d = direct.check("s").await.unwrap();
    assert!(d.is_denied(), "the reset's unit given back again: {d:?}");
}

/// A limiter's timeout longer than redis-rs's default reply timeout
/// (500 ms) is the one that bounds its calls: a reply 800 ms late within a
/// 3 s timeout decides, rather than failing at 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_timeout_is_not_cut_short_by_the_connection() {
    let server = RedisServer::start().unwrap();
    let relay = ReplyDelay::start(&server.addr()).await.unwrap();
    let backends = [
        RedisBackend::connect(&relay.url()).await.unwrap(),
        RedisBackend::connect_lazy(&relay.url()).unwrap(),
    ];
    for (i, backend) in backends.into_iter().enumerate() {
        let l = RateLimiter::builder(backend, Algorithm::Gcra)
            .quota(Quota::per_minute(10))
            .name(format!("long-{i}"))
            .failure_policy(FailurePolicy::Deny)
            .timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        relay.set(Duration::ZERO);
        assert!(l.check("s").await.unwrap().allowed, "backend {i}");
        relay.set(Duration::from_millis(800));
        let d = l.check("s").await;
        let d = d.unwrap_or_else(|e| panic!("backend {i}: {e}"));
        assert!(
            d.allowed && d.source == DecisionSource::Backend,
            "backend {i}: {d:?}"
        );
        assert_eq!(d.remaining, 8, "backend {i}");
    }
}
