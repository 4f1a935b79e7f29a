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
