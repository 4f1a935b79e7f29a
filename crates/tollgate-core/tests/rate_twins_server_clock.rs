//! Every rate script against its Rust twin on the server's clock: the
//! script decides at Redis `TIME` (no client clock), and the twin is then
//! asked the same question at the instant the script reports it decided
//! at. Random sequences with bursts and lulls, costs from 0 to past the
//! capacity, one and several quotas, on a standalone Redis; the raw replies
//! (allowed, and per quota: remaining, reset, retry, next) must be equal.
//! Only replies both sides gave count as agreement: a check refused before
//! reaching either (a cost over the capacity) is counted apart, and a
//! sequence must reach a minimum of real agreements.

mod rate_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tollgate_core::store::{RateReply, RateRequest};
use tollgate_core::{
    Algorithm, Error, FailurePolicy, MemoryBackend, Quota, RateBackend, RateLimiter, RedisBackend,
};

use rate_common::*;

/// Redis on its own clock, keeping its last reply.
#[derive(Debug)]
struct Scripts {
    redis: RedisBackend,
    last: Arc<Mutex<Option<Figures>>>,
}

impl RateBackend for Scripts {
    fn check_rate<'a>(
        &'a self,
        request: &'a RateRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<RateReply>> {
        async move {
            assert_eq!(request.now_micros, None, "the server's clock");
            let reply = self.redis.check_rate(request).await?;
            *self.last.lock().unwrap() = Some(figures(&reply));
            Ok(reply)
        }
        .boxed()
    }

    fn local_rate(&self) -> std::sync::Arc<dyn tollgate_core::RateBackend> {
        std::sync::Arc::new(tollgate_core::MemoryBackend::new())
    }

    fn kind(&self) -> &'static str {
        "scripts"
    }
}

/// The memory twins, asked at the instant the script decided at.
#[derive(Debug)]
struct Twins {
    memory: MemoryBackend,
    at: Arc<Mutex<Option<Figures>>>,
    last: Arc<Mutex<Option<Figures>>>,
}

impl RateBackend for Twins {
    fn check_rate<'a>(
        &'a self,
        request: &'a RateRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<RateReply>> {
        async move {
            let at = self
                .at
                .lock()
                .unwrap()
                .as_ref()
                .expect("the script went first")
                .1;
            let mut request = request.clone();
            request.now_micros = Some(at);
            let reply = self.memory.check_rate(&request).await?;
            *self.last.lock().unwrap() = Some(figures(&reply));
            Ok(reply)
        }
        .boxed()
    }

    fn local_rate(&self) -> std::sync::Arc<dyn tollgate_core::RateBackend> {
        std::sync::Arc::new(tollgate_core::MemoryBackend::new())
    }

    fn kind(&self) -> &'static str {
        "twins"
    }
}

fn limiter(
    backend: impl RateBackend,
    alg: Algorithm,
    quotas: &[Quota],
    prefix: &str,
) -> RateLimiter {
    let mut b = RateLimiter::builder(backend, alg)
        .prefix(prefix)
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_secs(5))
        .deny_cache(0);
    for q in quotas {
        b = b.quota(*q);
    }
    b.build().unwrap()
}

/// Short periods, so that real waits of a few ms cross windows and refill.
fn quota_sets(alg: Algorithm) -> Vec<Vec<Quota>> {
    let ms = |n: u64, ms: u64| Quota::new(n, Duration::from_millis(ms)).unwrap();
    if alg.uses_burst() {
        vec![
            vec![ms(4, 200).with_burst(6).unwrap()],
            vec![ms(3, 90), ms(10, 700).with_burst(12).unwrap()],
        ]
    } else {
        vec![vec![ms(5, 150)], vec![ms(3, 60), ms(8, 400)]]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_matches_its_twin_on_the_server_clock() {
    let mut seed: u64 = 0xD1B5_4A32_D192_ED03;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let redis = RedisBackend::from_connection(server().connection_manager().await);
    for alg in ALL {
        for quotas in quota_sets(alg) {
            let p = prefix();
            let script_last = Arc::new(Mutex::new(None));
            let twin_last = Arc::new(Mutex::new(None));
            let scripts = Scripts {
                redis: redis.clone(),
                last: script_last.clone(),
            };
            let twins = Twins {
                memory: MemoryBackend::new(),
                at: script_last.clone(),
                last: twin_last.clone(),
            };
            let a = limiter(scripts, alg, &quotas, &p);
            let b = limiter(twins, alg, &quotas, &p);
            let capacity = quotas.iter().map(Quota::burst).min().unwrap();
            let (mut agreed, mut refused) = (0, 0);
            for step in 0..steps(150) {
                // Mostly quick succession (bursts), sometimes a lull.
                let pause = if rand(8) == 0 { rand(120) } else { rand(6) };
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let subject = ["s", "t"][rand(2) as usize];
                let cost = rand(capacity + 2);
                let what = format!("{alg:?} {quotas:?} step {step} cost {cost}");
                *script_last.lock().unwrap() = None;
                *twin_last.lock().unwrap() = None;
                let x = a.check_n(subject, cost).await;
                match x {
                    Err(Error::CostExceedsCapacity { .. }) => {
                        assert!(cost > capacity, "{what}");
                        let y = b.check_n(subject, cost).await;
                        assert!(
                            matches!(y, Err(Error::CostExceedsCapacity { .. })),
                            "{what}: {y:?}"
                        );
                        refused += 1;
                        continue;
                    }
                    Err(e) => panic!("{what}: the script failed: {e}"),
                    Ok(_) => {}
                }
                b.check_n(subject, cost)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the twin failed: {e}"));
                let script = script_last
                    .lock()
                    .unwrap()
                    .clone()
                    .expect("the script answered");
                let twin = twin_last
                    .lock()
                    .unwrap()
                    .clone()
                    .expect("the twin answered");
                assert_eq!(script, twin, "{what}");
                agreed += 1;
            }
            assert!(
                agreed >= steps(150) * 2 / 3,
                "{alg:?}: only {agreed} agreements ({refused} refused)"
            );
            assert!(refused > 0, "{alg:?}: no cost past the capacity was tried");
        }
    }
}

/// Steps per sequence: `default`, or `TOLLGATE_DIFF_STEPS` for a long run
/// (e.g. `TOLLGATE_DIFF_STEPS=1000000`).
fn steps(default: u64) -> u64 {
    std::env::var("TOLLGATE_DIFF_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
