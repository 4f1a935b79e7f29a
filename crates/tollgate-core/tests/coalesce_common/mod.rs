//! What the coalescing suites share (issue #15): a recorder of the requests
//! a limiter sends, random sequences of checks, requests built by a limiter,
//! script-call counts, and a burst of checks while a server is frozen.
#![allow(dead_code)] // each suite uses its own part

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tollgate_core::store::{RateReply, RateRequest};
use tollgate_core::{
    Algorithm, FailurePolicy, ManualClock, MemoryBackend, Quota, RateBackend, RateLimiter,
    RedisBackend,
};
use tollgate_testkit::RedisServer;

use crate::rate_common::*;

/// The memory backend, keeping every request it decided and its reply.
#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) memory: MemoryBackend,
    pub(crate) seen: Arc<Mutex<Vec<(RateRequest, RateReply)>>>,
}

impl RateBackend for Recorder {
    fn check_rate<'a>(
        &'a self,
        request: &'a RateRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<RateReply>> {
        Box::pin(std::future::ready(self.check_rate_now(request).unwrap()))
    }

    fn check_rate_now(&self, request: &RateRequest) -> Option<tollgate_core::Result<RateReply>> {
        let reply = self.memory.check_rate_now(request)?;
        if let Ok(r) = &reply {
            self.seen.lock().unwrap().push((request.clone(), r.clone()));
        }
        Some(reply)
    }

    fn local_rate(&self) -> std::sync::Arc<dyn tollgate_core::RateBackend> {
        std::sync::Arc::new(tollgate_core::MemoryBackend::new())
    }

    fn kind(&self) -> &'static str {
        "recorder"
    }
}

/// A small deterministic generator (xorshift64*): the sequence is the seed's.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// A random sequence of checks on the client's clock: five algorithms, one
/// and two quotas, three subjects, costs from 0 to the capacity, bursts and
/// lulls. Returns each request with the memory twin's reply.
pub(crate) async fn sequence(
    seed: u64,
    steps: usize,
    prefix: &str,
) -> Vec<(RateRequest, RateReply)> {
    let clock = ManualClock::new(1_700_000_000_000_000 + seed * 1_000);
    let recorder = Arc::new(Recorder {
        memory: MemoryBackend::with_clock(clock.clone()),
        seen: Arc::default(),
    });
    let shapes: [&[Quota]; 2] = [&[q(5, 1)], &[q(4, 1), q(9, 10)]];
    let mut limiters = Vec::new();
    for alg in ALL {
        for (i, quotas) in shapes.iter().enumerate() {
            let mut b = RateLimiter::builder(recorder.clone(), alg)
                .name(format!("q{i}"))
                .prefix(prefix)
                .clock(clock.clone())
                .failure_policy(FailurePolicy::Deny)
                .deny_cache(0);
            for q in quotas.iter() {
                b = b.quota(*q);
            }
            limiters.push((b.build().unwrap(), quotas[0].burst()));
        }
    }
    let mut rng = Rng(seed | 1);
    for _ in 0..steps {
        let (limiter, capacity) = &limiters[rng.below(limiters.len() as u64) as usize];
        let subject = ["alice", "bob", "carol"][rng.below(3) as usize];
        let cost = rng.below(capacity + 1);
        limiter
            .check_n(subject, cost)
            .await
            .expect("the memory backend answers");
        // Mostly bursts (no time), sometimes a lull of up to two periods.
        let pause = match rng.below(10) {
            0..=6 => 0,
            7..=8 => rng.below(100_000),
            _ => rng.below(3_000_000),
        };
        clock.advance(Duration::from_micros(pause));
    }
    let seen = recorder.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), steps, "every check reached the backend");
    seen
}

/// Deletes every key under `prefix` (on a standalone server).
pub(crate) fn clear(server: &RedisServer, prefix: &str) {
    let keys = server.cli(&["--scan", "--pattern", &format!("{prefix}:*")]);
    for key in keys.lines().filter(|k| !k.is_empty()) {
        server.cli(&["DEL", key]);
    }
}

/// Script calls the server has run since its stats were reset.
pub(crate) fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

pub(crate) fn unique_prefix() -> String {
    format!("co{}", prefix())
}

/// The request a limiter sends for `subject`, taken from a recorder.
pub(crate) fn request_for(
    alg: Algorithm,
    quotas: &[Quota],
    subject: &str,
    prefix: &str,
) -> RateRequest {
    let recorder = Arc::new(Recorder {
        memory: MemoryBackend::new(),
        seen: Arc::default(),
    });
    let mut b = RateLimiter::builder(recorder.clone(), alg)
        .prefix(prefix)
        .deny_cache(0);
    for q in quotas {
        b = b.quota(*q);
    }
    let limiter = b.build().unwrap();
    futures_util::FutureExt::now_or_never(limiter.check(subject))
        .expect("in process")
        .unwrap();
    let seen = recorder.seen.lock().unwrap();
    seen[0].0.clone()
}

/// Starts `n` checks of `subject` while `server` is frozen (the first calls
/// hang, the rest queue), waits until each has entered its check, thaws the
/// server and returns how many were admitted.
pub(crate) async fn burst_while_frozen(
    server: &RedisServer,
    limiter: &RateLimiter,
    subjects: &[&str],
    n: usize,
) -> Vec<usize> {
    server.pause();
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..n {
        let limiter = limiter.clone();
        let which = i % subjects.len();
        let subject = subjects[which].to_owned();
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            started.fetch_add(1, Ordering::SeqCst);
            (which, limiter.check(subject).await)
        }));
    }
    tollgate_testkit::eventually(Duration::from_secs(10), "every check started", || {
        let started = started.clone();
        async move { (started.load(Ordering::SeqCst) == n).then_some(()) }
    })
    .await;
    // Each task enters the coalescer in the same poll that counted it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.resume();
    let mut admitted = vec![0; subjects.len()];
    for t in tasks {
        let (s, d) = t.await.unwrap();
        if d.expect("Redis answers once thawed").allowed {
            admitted[s] += 1;
        }
    }
    admitted
}

/// Loads the single and the batch script (so a NOSCRIPT retry does not
/// count as a call below).
pub(crate) async fn warm_up(backend: &RedisBackend) {
    warm_up_on(backend, "warm").await;
}

pub(crate) async fn warm_up_on(backend: &RedisBackend, subject: &str) {
    let prefix = unique_prefix();
    let r = request_for(Algorithm::TokenBucket, &[q(1, 1)], subject, &prefix);
    backend.check_rate(&r).await.unwrap();
    backend.check_rate_batch(&[r.clone(), r]).await.unwrap();
}

/// A GCRA limiter (1000 a minute) on `backend` that fails closed, with
/// `timeout` and no circuit breaker (every check here must reach the
/// backend) and no deny cache.
pub(crate) fn strict_gcra(backend: RedisBackend, timeout: Duration) -> RateLimiter {
    RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(q(1000, 60))
        .failure_policy(FailurePolicy::Deny)
        .timeout(timeout)
        .circuit_breaker(u32::MAX, Duration::from_millis(1))
        .deny_cache(0)
        .build()
        .unwrap()
}
