//! The backends every rate-limit suite runs on: memory, a standalone
//! redis-server and a 3-master cluster (real processes, no mocks), with the
//! limiter they build and the every-key-has-a-TTL check.
#![allow(dead_code)] // each test file uses its own part

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tollgate_core::{
    Algorithm, FailurePolicy, ManualClock, MemoryBackend, Quota, RateBackend, RateLimiter,
    RedisBackend,
};
use tollgate_testkit::{RedisCluster, RedisServer};

pub(crate) const ALL: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

pub(crate) fn server() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(|| RedisServer::start().expect("redis-server"))
}

pub(crate) fn cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(|| RedisCluster::start().expect("redis cluster"))
}

/// A unique key prefix per test, so tests share servers without sharing keys.
pub(crate) fn prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    Memory,
    Standalone,
    Cluster,
}

pub(crate) const KINDS: [Kind; 3] = [Kind::Memory, Kind::Standalone, Kind::Cluster];

/// A backend of `kind`, plus a checker that every key under `prefix` has a TTL.
pub(crate) struct Target {
    pub(crate) kind: Kind,
    pub(crate) backend: Arc<dyn RateBackend>,
    pub(crate) memory: Option<MemoryBackend>,
}

impl Target {
    pub(crate) async fn new(kind: Kind, clock: &ManualClock) -> Target {
        match kind {
            Kind::Memory => {
                let m = MemoryBackend::with_clock(clock.clone());
                Target {
                    kind,
                    backend: Arc::new(m.clone()),
                    memory: Some(m),
                }
            }
            Kind::Standalone => Target {
                kind,
                backend: Arc::new(RedisBackend::from_connection(
                    server().connection_manager().await,
                )),
                memory: None,
            },
            Kind::Cluster => Target {
                kind,
                backend: Arc::new(RedisBackend::from_connection(cluster().connection().await)),
                memory: None,
            },
        }
    }

    pub(crate) fn limiter(
        &self,
        alg: Algorithm,
        quotas: &[Quota],
        prefix: &str,
        clock: &ManualClock,
    ) -> RateLimiter {
        let mut b = RateLimiter::builder(self.backend.clone(), alg)
            .prefix(prefix)
            .clock(clock.clone())
            .failure_policy(FailurePolicy::Deny)
            .timeout(Duration::from_secs(5))
            .deny_cache(0);
        for q in quotas {
            b = b.quota(*q);
        }
        b.build().unwrap()
    }

    /// Rule 4: every key written has a TTL.
    pub(crate) async fn assert_all_keys_expire(&self, prefix: &str, clock: &ManualClock) {
        match self.kind {
            Kind::Memory => {
                let m = self.memory.as_ref().unwrap();
                assert!(!m.is_empty(), "the scenario wrote no entry");
                // Days later every entry has expired and is evicted.
                clock.advance(Duration::from_secs(3 * 86_400));
                m.evict_expired();
                assert_eq!(m.len(), 0, "memory entries without expiry");
            }
            Kind::Standalone => assert_ttls(&[server()], prefix),
            Kind::Cluster => {
                let nodes: Vec<&RedisServer> = cluster().nodes().iter().collect();
                assert_ttls(&nodes, prefix)
            }
        }
    }
}

pub(crate) fn assert_ttls(nodes: &[&RedisServer], prefix: &str) {
    let mut seen = 0;
    for node in nodes {
        let keys = node.cli(&["--scan", "--pattern", &format!("{prefix}:*")]);
        for key in keys.lines().filter(|k| !k.is_empty()) {
            let pttl: i64 = node.cli(&["PTTL", key]).parse().unwrap();
            // -2: it expired between the scan and PTTL; -1 would be immortal.
            assert!(pttl > 0 || pttl == -2, "key {key} has PTTL {pttl}");
            seen += 1;
        }
    }
    assert!(seen > 0, "the scenario wrote no key under {prefix}");
}

pub(crate) fn q(limit: u64, secs: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(secs)).unwrap()
}

/// What a script or a twin answered: allowed, the instant, and per quota
/// (remaining, reset, retry, next). The twins also report a TTL, which no
/// script reply carries.
pub(crate) type Figures = (bool, u64, Vec<(u64, u64, u64, u64)>);

pub(crate) fn figures(reply: &tollgate_core::store::RateReply) -> Figures {
    let quotas = reply
        .outcomes
        .iter()
        .map(|o| {
            (
                o.remaining,
                o.reset_after_micros,
                o.retry_after_micros,
                o.next_after_micros,
            )
        })
        .collect();
    (reply.allowed, reply.now_micros, quotas)
}

/// One limiter per algorithm (quota `quota(alg)`) on a Redis that is
/// stopped before they are returned, each falling back to its share over
/// `instances`: every check decides on the fallback.
pub(crate) async fn on_a_stopped_redis(
    quota: impl Fn(Algorithm) -> Quota,
    instances: u32,
) -> Vec<RateLimiter> {
    let mut server = RedisServer::start().unwrap();
    let conn = server.connection_manager().await;
    let limiters = ALL
        .iter()
        .map(|alg| {
            RateLimiter::builder(RedisBackend::from_connection(conn.clone()), *alg)
                .quota(quota(*alg))
                .failure_policy(FailurePolicy::Fallback {
                    instances: instances.try_into().unwrap(),
                })
                .timeout(Duration::from_millis(100))
                .build()
                .unwrap()
        })
        .collect();
    server.stop();
    limiters
}
