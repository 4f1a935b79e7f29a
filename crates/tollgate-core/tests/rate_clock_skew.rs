//! Instances whose clocks disagree (each limiter given its own clock, as
//! for a managed Redis without `TIME`; or the server's clock behind after a
//! failover): a window one of them already moved to is the current window
//! for the other too. Read as empty, each clock would admit a limit in
//! turn, without bound.

mod rate_common;

use futures_util::future::join_all;
use rate_common::{prefix, server};
use tollgate_core::{
    Algorithm, Backend, ManualClock, MemoryBackend, Quota, RateLimiter, RedisBackend,
};

/// Two instances 100 ms apart across a window's edge (one at 10.05 s, in
/// window 10; the other at 9.95 s, in window 9), taking 10 of 10 per
/// second in turn, three times each, one check at a time and then four
/// at a time (a lean batch on Redis): at most the limit of the later
/// window is admitted, and the figures never say more is left.
async fn two_clocks_share_one_window(backend: Backend, algorithm: Algorithm) {
    for together in [1u64, 4] {
        let prefix = prefix();
        let at = |micros| {
            RateLimiter::builder(backend.clone(), algorithm)
                .quota(Quota::per_second(10))
                .prefix(&prefix)
                .name("skew")
                .clock(ManualClock::new(micros))
                .deny_cache(0)
                .build()
                .unwrap()
        };
        let (ahead, behind) = (at(10_050_000), at(9_950_000));
        let mut admitted = 0;
        for _ in 0..3 {
            for l in [&ahead, &behind] {
                let each = 10 / together;
                let ds = join_all((0..together).map(|_| l.check_n("s", each))).await;
                for d in ds {
                    let d = d.unwrap();
                    if d.allowed {
                        admitted += each;
                    }
                }
            }
        }
        assert!(
            admitted <= 10,
            "{algorithm:?}, {together} at a time: {admitted} admitted"
        );
    }
}

#[tokio::test]
async fn fixed_window_in_memory() {
    two_clocks_share_one_window(MemoryBackend::new().into(), Algorithm::FixedWindow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_on_redis() {
    let backend = RedisBackend::connect(&server().url()).await.unwrap();
    two_clocks_share_one_window(backend.into(), Algorithm::FixedWindow).await;
}

#[tokio::test]
async fn sliding_window_counter_in_memory() {
    two_clocks_share_one_window(MemoryBackend::new().into(), Algorithm::SlidingWindowCounter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_counter_on_redis() {
    let backend = RedisBackend::connect(&server().url()).await.unwrap();
    two_clocks_share_one_window(backend.into(), Algorithm::SlidingWindowCounter).await;
}

/// A limiter on a clock a day ahead shares a store with one on the store's
/// own clock: its checks (enough to sweep every shard of a memory store)
/// leave the other's state alone, as a key's TTL on Redis runs on the
/// server's clock whatever time the scripts are given.
async fn a_clock_ahead_sweeps_nothing(backend: Backend) {
    let prefix = prefix();
    let limiter = |name: &str, clock: Option<ManualClock>| {
        let mut b = RateLimiter::builder(backend.clone(), Algorithm::Gcra)
            .quota(Quota::per_hour(1))
            .prefix(&prefix)
            .name(name)
            .deny_cache(0);
        if let Some(clock) = clock {
            b = b.clock(clock);
        }
        b.build().unwrap()
    };
    let day = 86_400_000_000;
    let wall = tollgate_core::Clock::now_micros(&tollgate_core::SystemClock);
    let (plain, ahead) = (
        limiter("plain", None),
        limiter("ahead", Some(ManualClock::new(wall + day))),
    );
    assert!(plain.check("s").await.unwrap().allowed);
    assert!(!plain.check("s").await.unwrap().allowed);
    for chunk in 0..40 {
        let checks = (0..500).map(|i| ahead.check(format!("x{chunk}-{i}")));
        for d in join_all(checks).await {
            d.unwrap();
        }
    }
    let d = plain.check("s").await.unwrap();
    assert!(!d.allowed, "the state was swept by a clock ahead: {d:?}");
}

#[tokio::test]
async fn a_clock_ahead_sweeps_nothing_in_memory() {
    a_clock_ahead_sweeps_nothing(MemoryBackend::new().into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_ahead_sweeps_nothing_on_redis() {
    let backend = RedisBackend::from_connection(server().connection_manager().await);
    a_clock_ahead_sweeps_nothing(backend.into()).await;
}

/// A sliding log written by a clock ahead: a check from a clock behind is
/// told its room grows when that (oldest) entry leaves, 1.05 s on, on
/// every store (the memory twin said 1 s, from its own new entry).
async fn an_entry_ahead_stays_the_oldest(backend: Backend) {
    let prefix = prefix();
    let at = |micros| {
        RateLimiter::builder(backend.clone(), Algorithm::SlidingWindowLog)
            .quota(Quota::per_second(10))
            .prefix(&prefix)
            .name("log")
            .clock(ManualClock::new(micros))
            .deny_cache(0)
            .build()
            .unwrap()
    };
    let (ahead, behind) = (at(10_000_000), at(9_950_000));
    assert!(ahead.check("s").await.unwrap().allowed);
    let d = behind.check("s").await.unwrap();
    assert!(d.allowed, "{d:?}");
    assert_eq!(
        d.quotas[0].next_after,
        std::time::Duration::from_millis(1050),
        "{d:?}"
    );
}

#[tokio::test]
async fn an_entry_ahead_stays_the_oldest_in_memory() {
    an_entry_ahead_stays_the_oldest(MemoryBackend::new().into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_ahead_stays_the_oldest_on_redis() {
    let backend = RedisBackend::from_connection(server().connection_manager().await);
    an_entry_ahead_stays_the_oldest(backend.into()).await;
}
