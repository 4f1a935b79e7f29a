//! Plan tables ([`Plans`]): the build rules, the default plan, separate
//! counters per plan, the runtime swap, and what a replaced table does to
//! the stored state of each algorithm when a limit grows or shrinks — on the
//! memory backend, a standalone redis-server and a 3-master cluster (real
//! processes, started by the test kit). Time comes from a `ManualClock`, so
//! every figure is exact.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tollgate_core::{
    Algorithm, Error, FailurePolicy, ManualClock, MemoryBackend, PlanTable, Plans, Quota,
    RateBackend, RateLimiter, RedisBackend,
};
use tollgate_testkit::{RedisCluster, RedisServer};

const ALL: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

/// On a minute and an hour boundary, so windows start fresh.
const T0: u64 = 1_800_000_000_000_000;

fn server() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(|| RedisServer::start().expect("redis-server"))
}

fn cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(|| RedisCluster::start().expect("redis cluster"))
}

/// A prefix no other test (or run) uses, so tests share servers, not keys.
fn prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "plans{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Standalone,
    Cluster,
}

const KINDS: [Kind; 3] = [Kind::Memory, Kind::Standalone, Kind::Cluster];

/// A backend of `kind`; the memory backend expires keys on `clock`.
async fn backend(kind: Kind, clock: &ManualClock) -> Arc<dyn RateBackend> {
    match kind {
        Kind::Memory => Arc::new(MemoryBackend::with_clock(clock.clone())),
        Kind::Standalone => Arc::new(RedisBackend::from_connection(
            server().connection_manager().await,
        )),
        Kind::Cluster => Arc::new(RedisBackend::from_connection(cluster().connection().await)),
    }
}

/// A limiter named `name` under `prefix`: `n` per `period`.
fn limiter(
    backend: &Arc<dyn RateBackend>,
    alg: Algorithm,
    prefix: &str,
    name: &str,
    n: u64,
    period: Duration,
    clock: &ManualClock,
) -> RateLimiter {
    RateLimiter::builder(backend.clone(), alg)
        .quota(Quota::new(n, period).unwrap())
        .prefix(prefix)
        .name(name)
        .clock(clock.clone())
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

const MINUTE: Duration = Duration::from_secs(60);

/// A table of one plan, "p", the default.
fn one_plan(l: RateLimiter) -> PlanTable {
    PlanTable::builder()
        .plan("p", l)
        .default_plan("p")
        .build()
        .unwrap()
}

fn invalid_config(r: Result<PlanTable, Error>) -> String {
    match r {
        Err(Error::InvalidConfig(m)) => m,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

#[test]
fn build_rules() {
    let m: Arc<dyn RateBackend> = Arc::new(MemoryBackend::new());
    let clock = ManualClock::new(T0);
    let l =
        |prefix: &str, name: &str| limiter(&m, Algorithm::Gcra, prefix, name, 10, MINUTE, &clock);
    let msg = invalid_config(PlanTable::builder().default_plan("x").build());
    assert!(msg.contains("needs a plan"), "{msg}");
    let msg = invalid_config(PlanTable::builder().plan("free", l("t", "a")).build());
    assert!(msg.contains("default plan"), "{msg}");
    let msg = invalid_config(
        PlanTable::builder()
            .plan("free", l("t", "a"))
            .default_plan("gold")
            .build(),
    );
    assert!(msg.contains("\"gold\""), "{msg}");
    let msg = invalid_config(
        PlanTable::builder()
            .plan("free", l("t", "a"))
            .plan("free", l("t", "b"))
            .default_plan("free")
            .build(),
    );
    assert!(msg.contains("twice"), "{msg}");
    // The same keys: the same prefix and name, or another split of them.
    for (p1, n1, p2, n2) in [("t", "a", "t", "a"), ("a:b", "c", "a", "b:c")] {
        let msg = invalid_config(
            PlanTable::builder()
                .plan("free", l(p1, n1))
                .plan("pro", l(p2, n2))
                .default_plan("free")
                .build(),
        );
        assert!(
            msg.contains("\"free\" and \"pro\" would share counters"),
            "{msg}"
        );
        assert!(msg.contains(&format!("\"{p1}:{n1}:gcra:\"")), "{msg}");
    }
    // One prefix and name under two algorithms: keys of their own.
    let other = limiter(&m, Algorithm::TokenBucket, "t", "a", 10, MINUTE, &clock);
    PlanTable::builder()
        .plan("free", l("t", "a"))
        .plan("pro", other)
        .default_plan("free")
        .build()
        .unwrap();
    // Derived names of identical limiters collide too.
    let derived = || RateLimiter::gcra(m.clone(), Quota::per_minute(10)).unwrap();
    invalid_config(
        PlanTable::builder()
            .plan("free", derived())
            .plan("pro", derived())
            .default_plan("free")
            .build(),
    );
    // Other prefixes or names are apart.
    let table = PlanTable::builder()
        .plan("free", l("t", "a"))
        .plan("pro", l("t", "b"))
        .plan("team", l("u", "a"))
        .default_plan("pro")
        .build()
        .unwrap();
    assert_eq!(table.default_plan().name(), "pro");
    assert_eq!(table.select(None).name(), "pro");
    assert_eq!(table.select(Some("")).name(), "pro");
    assert_eq!(table.select(Some("FREE")).name(), "pro");
    assert_eq!(table.select(Some("team")).name(), "team");
    let names: Vec<&str> = table.plans().iter().map(|p| p.name()).collect();
    assert_eq!(names, ["free", "pro", "team"]);
    for (i, plan) in table.plans().iter().enumerate() {
        assert_eq!(table.position(plan), Some(i));
    }
}

/// Unknown and missing names get the default plan; each plan counts on its
/// own keys, so one subject has a budget per plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_never_share_counters() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let b = backend(kind, &clock).await;
            let p = prefix();
            let plans = Plans::new(
                PlanTable::builder()
                    .plan("free", limiter(&b, alg, &p, "free", 2, MINUTE, &clock))
                    .plan("pro", limiter(&b, alg, &p, "pro", 5, MINUTE, &clock))
                    .default_plan("free")
                    .build()
                    .unwrap(),
            );
            let what = format!("{kind:?} {alg:?}");
            for name in [None, Some("free"), Some("gold")] {
                let plan = plans.select(name);
                assert_eq!(plan.name(), "free", "{what}");
                let d = plan.limiter().check("alice").await.unwrap();
                let admitted = name != Some("gold");
                assert_eq!(d.allowed, admitted, "{what} {name:?}: {d:?}");
            }
            for left in (0..5).rev() {
                let d = plans.select(Some("pro")).limiter().check("alice").await;
                let d = d.unwrap();
                assert!(d.allowed, "{what}: {d:?}");
                assert_eq!((d.limit, d.remaining), (5, left), "{what}");
            }
            assert!(
                !plans
                    .select(Some("pro"))
                    .limiter()
                    .check("alice")
                    .await
                    .unwrap()
                    .allowed
            );
            // Another subject on free is untouched by alice.
            let d = plans.select(None).limiter().check("bob").await.unwrap();
            assert_eq!((d.allowed, d.remaining), (true, 1), "{what}");
        }
    }
}

/// The limit grows: 10 per minute → 100 per minute, under the same name,
/// after 5 of the 10 were used. The module docs' table, figure for figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_limit_keeps_what_was_used() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let b = backend(kind, &clock).await;
            let p = prefix();
            let what = format!("{kind:?} {alg:?}");
            let plans = Plans::new(one_plan(limiter(&b, alg, &p, "n", 10, MINUTE, &clock)));
            let d = plans.select(None).limiter().check_n("s", 5).await.unwrap();
            assert_eq!((d.allowed, d.remaining), (true, 5), "{what}");
            plans
                .replace(one_plan(limiter(&b, alg, &p, "n", 100, MINUTE, &clock)))
                .unwrap();
            let d = plans.select(None).limiter().check("s").await.unwrap();
            // Windows: the count carries over (5 + this one of 100). Buckets:
            // half the window's refill was used, so half of 100 is left.
            let left = if alg.uses_burst() { 49 } else { 94 };
            assert_eq!(d.limit, 100, "{what}");
            assert_eq!((d.allowed, d.remaining), (true, left), "{what}: {d:?}");
            // Under a fresh name, a fresh budget.
            let fresh = limiter(&b, alg, &p, "n2", 100, MINUTE, &clock);
            plans.replace(one_plan(fresh)).unwrap();
            let d = plans.select(None).limiter().check("s").await.unwrap();
            assert_eq!(d.remaining, 99, "{what}: {d:?}");
        }
    }
}

/// The limit shrinks: 100 per minute → 10 per minute, under the same name,
/// after 50 of the 100 were used. Buckets keep half of 10; the windows
/// refuse until the old count is out of the window — exactly when the
/// denial's retry-after says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrunk_limit_counts_what_was_used() {
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let b = backend(kind, &clock).await;
            let p = prefix();
            let what = format!("{kind:?} {alg:?}");
            let plans = Plans::new(one_plan(limiter(&b, alg, &p, "n", 100, MINUTE, &clock)));
            let d = plans.select(None).limiter().check_n("s", 50).await.unwrap();
            assert_eq!((d.allowed, d.remaining), (true, 50), "{what}");
            plans
                .replace(one_plan(limiter(&b, alg, &p, "n", 10, MINUTE, &clock)))
                .unwrap();
            let l = plans.select(None).limiter().clone();
            let d = l.check("s").await.unwrap();
            assert_eq!(d.limit, 10, "{what}");
            if alg.uses_burst() {
                assert_eq!((d.allowed, d.remaining), (true, 4), "{what}: {d:?}");
                continue;
            }
            assert_eq!((d.allowed, d.remaining), (false, 0), "{what}: {d:?}");
            // Fixed window: its end. Log: the 50 entries leave. Counter: the
            // 50 weigh into the next window until ceil(50 × (60 − e) / 60)
            // ≤ 9, at e = 49.2 s.
            let wait = match alg {
                Algorithm::SlidingWindowCounter => Duration::from_millis(109_200),
                _ => MINUTE,
            };
            assert_eq!(d.retry_after, Some(wait), "{what}: {d:?}");
            clock.advance(wait - Duration::from_micros(1));
            let d = l.check("s").await.unwrap();
            assert!(!d.allowed, "{what}: admitted early: {d:?}");
            clock.advance(Duration::from_micros(1));
            let d = l.check("s").await.unwrap();
            assert!(d.allowed, "{what}: {d:?}");
            let left = if alg == Algorithm::SlidingWindowCounter {
                0
            } else {
                9
            };
            assert_eq!(d.remaining, left, "{what}: {d:?}");
        }
    }
}

/// A changed period: the window algorithms store a window index of the old
/// length, so their counts are forgotten; the log keeps its entries for the
/// new period; the token bucket re-reads the time since it was empty at the
/// new rate, GCRA its debt. 10 per minute, 8 used → 10 per hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_period() {
    let hour = Duration::from_secs(3600);
    for kind in KINDS {
        for alg in ALL {
            let clock = ManualClock::new(T0);
            let b = backend(kind, &clock).await;
            let p = prefix();
            let what = format!("{kind:?} {alg:?}");
            let plans = Plans::new(one_plan(limiter(&b, alg, &p, "n", 10, MINUTE, &clock)));
            plans.select(None).limiter().check_n("s", 8).await.unwrap();
            plans
                .replace(one_plan(limiter(&b, alg, &p, "n", 10, hour, &clock)))
                .unwrap();
            clock.advance(Duration::from_secs(30));
            let d = plans.select(None).limiter().check("s").await.unwrap();
            // 2 were left, 48 s of refill owed, 30 s passed. The windows
            // forget; the log counts its 8 entries against 10 per hour; the
            // bucket has refilled 42 s since empty, under one token at 6 min
            // a token; GCRA owes 18 s, under one unit of 6 min: 9 left.
            let (allowed, left) = match alg {
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => (true, 9),
                Algorithm::SlidingWindowLog => (true, 1),
                Algorithm::TokenBucket => (false, 0),
                _ => (true, 8),
            };
            assert_eq!((d.allowed, d.remaining), (allowed, left), "{what}: {d:?}");
        }
    }
}

/// A plan that changes its algorithm under the same name starts afresh:
/// keys carry the algorithm, so the new limiter reads none of the old one's
/// state (before, `replace` refused it: the other script failed on that
/// state). Going back before the old keys expire finds them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_algorithm_under_the_same_name_starts_afresh() {
    for kind in KINDS {
        for (from, to) in ALL.iter().zip(ALL.iter().cycle().skip(1)) {
            let clock = ManualClock::new(T0);
            let b = backend(kind, &clock).await;
            let p = prefix();
            let l = |alg| limiter(&b, alg, &p, "pro", 3, MINUTE, &clock);
            let what = format!("{kind:?} {from:?} → {to:?}");
            let plans = Plans::new(one_plan(l(*from)));
            let drain = |plans: &Plans| {
                let limiter = plans.select(None).limiter().clone();
                async move {
                    let mut admitted = 0;
                    for _ in 0..4 {
                        admitted += u32::from(limiter.check("alice").await.unwrap().allowed);
                    }
                    admitted
                }
            };
            assert_eq!(drain(&plans).await, 3, "{what}");
            let old = plans.replace(one_plan(l(*to))).unwrap();
            assert_eq!(old.default_plan().limiter().algorithm(), *from);
            assert_eq!(drain(&plans).await, 3, "{what}: a full budget of its own");
            plans.replace(one_plan(l(*from))).unwrap();
            assert_eq!(
                drain(&plans).await,
                0,
                "{what}: the old state is still there"
            );
        }
    }
}

/// Clones share the table; while one task replaces it back and forth,
/// checks on other tasks each see one whole table (the limit and the plan
/// belong together), and once a replacement returns, every later check
/// uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_swap_is_atomic_and_the_next_decision_uses_it() {
    let clock = ManualClock::new(T0);
    let b: Arc<dyn RateBackend> = Arc::new(MemoryBackend::with_clock(clock.clone()));
    let p = prefix();
    let table = |version: u64| {
        // Each version has its own names: plans apart, versions apart.
        let l = |plan: &str, n| {
            let name = format!("{plan}-v{version}");
            limiter(&b, Algorithm::FixedWindow, &p, &name, n, MINUTE, &clock)
        };
        PlanTable::builder()
            .plan("free", l("free", 1_000 + version))
            .plan("pro", l("pro", 2_000 + version))
            .default_plan("free")
            .build()
            .unwrap()
    };
    let plans = Plans::new(table(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let (plans, stop, reads) = (plans.clone(), stop.clone(), reads.clone());
        readers.push(tokio::spawn(async move {
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let plan = plans.select(Some("pro"));
                let d = plan.limiter().check("s").await.unwrap();
                assert_eq!(plan.name(), "pro");
                assert!((2_000..2_100).contains(&d.limit), "{d:?}");
                seen += 1;
                reads.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            seen
        }));
    }
    for version in 1..50 {
        // Readers decide between every two swaps (on a loaded machine the
        // writer could otherwise finish before a reader ran at all).
        let before = reads.load(Ordering::Relaxed);
        while reads.load(Ordering::Relaxed) == before && !readers.iter().any(|r| r.is_finished()) {
            tokio::task::yield_now().await;
        }
        plans.replace(table(version)).unwrap();
        let d = plans
            .select(Some("pro"))
            .limiter()
            .check("t")
            .await
            .unwrap();
        assert_eq!(d.limit, 2_000 + version);
        let d = plans
            .select(Some("other"))
            .limiter()
            .check("t")
            .await
            .unwrap();
        assert_eq!(d.limit, 1_000 + version);
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.await.unwrap() > 0);
    }
}

/// A token bucket whose refill window grew keeps its empty instant until
/// its key expires, when the old bucket would have been full; from then on
/// the subject starts full under the new quota (memory backend: its keys
/// expire on the manual clock).
#[tokio::test]
async fn a_kept_key_lives_as_long_as_the_old_quota_needed() {
    let clock = ManualClock::new(T0);
    let b: Arc<dyn RateBackend> = Arc::new(MemoryBackend::with_clock(clock.clone()));
    let p = prefix();
    let alg = Algorithm::TokenBucket;
    let plans = Plans::new(one_plan(limiter(&b, alg, &p, "n", 10, MINUTE, &clock)));
    plans.select(None).limiter().check_n("s", 10).await.unwrap();
    // Without a deny cache: the denial below announces the new quota's
    // wait (5 min), which the expiring key cuts short; a cache would repeat
    // it until then.
    let hourly = RateLimiter::builder(b.clone(), alg)
        .quota(Quota::per_hour(10))
        .prefix(&p)
        .name("n")
        .clock(clock.clone())
        .deny_cache(0)
        .build()
        .unwrap();
    plans.replace(one_plan(hourly)).unwrap();
    // 59 s after empty: no token yet at one per 6 minutes.
    clock.advance(Duration::from_secs(59));
    let d = plans.select(None).limiter().check("s").await.unwrap();
    assert!(!d.allowed, "{d:?}");
    // The old bucket would be full now: its key has expired.
    clock.advance(Duration::from_secs(1));
    let d = plans.select(None).limiter().check("s").await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 9), "{d:?}");
}
