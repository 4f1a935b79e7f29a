//! Counters through the `metrics` facade (feature `metrics`).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::routing::get;
use axum::Router;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tollgate_core::{Algorithm, MemoryBackend, Quota, RateLimiter};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::RateLimitLayer;

use common::{send, unique};

/// Records counters by `name{label=value,...}` (labels sorted).
#[derive(Default)]
struct TestRecorder {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

impl TestRecorder {
    fn get(&self, key: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = Arc::clone(self.counters.lock().unwrap().entry(name).or_default());
        Counter::from_arc(counter)
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn recorder() -> &'static TestRecorder {
    static RECORDER: OnceLock<&'static TestRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let r: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(r).expect("no other recorder in this binary");
        r
    })
}

fn decisions(policy: &str, outcome: &str, source: &str) -> u64 {
    recorder().get(&format!(
        "tollgate_decisions_total{{outcome={outcome},policy={policy},source={source}}}"
    ))
}

#[tokio::test]
async fn decisions_are_counted_by_policy_outcome_and_source() {
    recorder();
    let policy = unique("m");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&policy)
                .deny_cache(0)
                .build()
                .unwrap(),
        ));
    send(&app, common::get("/")).await;
    send(&app, common::get("/")).await;
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&policy, "allowed", "backend"), 1);
    assert_eq!(decisions(&policy, "denied", "backend"), 2);

    let shadow = unique("m-shadow");
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&shadow)
                .build()
                .unwrap(),
        )
        .shadow(true),
    );
    send(&app, common::get("/")).await;
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&shadow, "allowed", "backend"), 1);
    assert_eq!(decisions(&shadow, "shadow_denied", "backend"), 1);

    let keyed = unique("m-key");
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&keyed)
                .build()
                .unwrap(),
        )
        .key(HeaderKey::new("x-api-key")),
    );
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&keyed, "key_error", "none"), 1);

    let costly = unique("m-cost");
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(
            RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(Quota::per_hour(1))
                .name(&costly)
                .build()
                .unwrap(),
        )
        .cost(2),
    );
    send(&app, common::get("/")).await;
    assert_eq!(decisions(&costly, "too_costly", "none"), 1);
}

#[tokio::test]
async fn lock_requests_are_counted_by_outcome() {
    let backend = MemoryBackend::new();
    let locker = tollgate_core::Locker::new(backend);
    let app =
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(tollgate_tower::LockLayer::new(
                locker.clone(),
                tollgate_tower::key::GlobalKey,
            ));
    let before = (
        recorder().get("tollgate_lock_requests_total{outcome=acquired}"),
        recorder().get("tollgate_lock_requests_total{outcome=busy}"),
    );
    send(&app, common::get("/")).await;
    let held = locker
        .try_acquire("global", &tollgate_core::LockOptions::new())
        .await
        .unwrap();
    send(&app, common::get("/")).await;
    held.release().await.unwrap();
    // Other tests of this binary may count too: compare with at least.
    assert!(recorder().get("tollgate_lock_requests_total{outcome=acquired}") > before.0);
    assert!(recorder().get("tollgate_lock_requests_total{outcome=busy}") > before.1);
}
