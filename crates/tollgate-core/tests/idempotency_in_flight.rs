//! Which idempotency keys are in flight: an operator lists them from the
//! store alone — a claim whose handler runs is listed with its fence, since
//! when and its lease's TTL; a completed, an abandoned or an expired one is
//! not — through the store trait and the operator's [`Admin`], on memory, a
//! standalone redis-server and a 3-master cluster (real processes).

mod store_common;

use std::time::Duration;

use tollgate_core::admin::Admin;
use tollgate_core::idempotency::{
    Claim, ClaimReply, ClaimRequest, Claimed, Fingerprint, IdempotencyBackend, IdempotencyStore,
    InFlightRecord, StoredResponse,
};
use tollgate_core::{Backend, LockOptions, Locker, ManualClock, MemoryBackend, Subject};
use tollgate_testkit::{eventually, unique};

use store_common::{backend, server, Kind};

/// The records in flight under `prefix`, by subject.
async fn in_flight(backend: &Backend, prefix: &str) -> Vec<InFlightRecord> {
    let mut all = backend.records_in_flight(prefix).await.expect("in flight");
    all.sort_by(|a, b| a.subject.cmp(&b.subject));
    all
}

fn store(backend: &Backend, prefix: &str, ttl: Duration) -> IdempotencyStore {
    IdempotencyStore::builder(backend.clone())
        .prefix(prefix)
        .lease(LockOptions::new().ttl(ttl))
        .build()
        .unwrap()
}

async fn claimed(store: &IdempotencyStore, key: &str) -> Claimed {
    match store
        .claim(Subject::new(key), Fingerprint::of(key.as_bytes()))
        .await
        .unwrap()
    {
        Claim::Claimed(c) => c,
        other => panic!("{key}: {other:?}"),
    }
}

fn response() -> StoredResponse {
    StoredResponse::new(201, vec![], b"{}".to_vec())
}

/// A claim with a running handler is listed (fence, since when, its
/// lease's TTL) and goes when completed; completed and abandoned keys, a
/// lock's holder and another prefix's claim beside it are never listed.
async fn running_claims_are_listed(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("inflight");
    let ttl = Duration::from_secs(20);
    let records = store(&backend, &prefix, ttl);
    let running = claimed(&records, "order-1").await;
    let done = claimed(&records, "order-2").await;
    assert!(done.complete(&response()).await.unwrap());
    let given_up = claimed(&records, "order-3").await;
    assert!(given_up.abandon().await.unwrap());
    // Neighbours: a lock under the same prefix, a claim under another.
    let locker = Locker::builder(backend.clone())
        .prefix(&prefix)
        .build()
        .unwrap();
    let lock = locker
        .try_acquire("order-1", &LockOptions::new())
        .await
        .unwrap();
    let other = store(&backend, &format!("{prefix}-other"), ttl);
    let elsewhere = claimed(&other, "order-4").await;

    let listed = in_flight(&backend, &prefix).await;
    assert_eq!(listed.len(), 1, "{kind:?}: {listed:?}");
    let r = &listed[0];
    assert_eq!((r.name.as_str(), r.subject.as_str()), ("idem", "order-1"));
    assert_eq!(r.fence, running.fence());
    assert!(r.ttl <= ttl && r.ttl > ttl / 2, "{:?}", r.ttl);
    assert!(r.held.expect("claimed by this version") < ttl / 2, "{r:?}");

    // The operator's view, as the admin API's JSON shows it.
    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    let seen = admin.idempotency_in_flight().await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].name.as_str(), seen[0].key.as_str()),
        ("idem", "order-1")
    );
    assert_eq!(seen[0].fence, running.fence().get());
    assert!(
        seen[0].ttl_ms <= 20_000 && seen[0].ttl_ms > 10_000,
        "{:?}",
        seen[0]
    );
    let json = serde_json::to_value(&seen[0]).unwrap();
    let fields: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
    assert_eq!(fields, ["fence", "held_ms", "key", "name", "ttl_ms"]);
    assert_eq!(json["key"], "order-1");

    // Held for longer at each look.
    let first = seen[0].held_ms.unwrap();
    eventually(Duration::from_secs(3), "held_ms grows", || async {
        let now = admin.idempotency_in_flight().await.unwrap();
        (now[0].held_ms.unwrap() > first).then_some(())
    })
    .await;

    assert!(running.complete(&response()).await.unwrap());
    assert_eq!(in_flight(&backend, &prefix).await, []);
    assert!(admin.idempotency_in_flight().await.unwrap().is_empty());
    assert_eq!(
        in_flight(&backend, &format!("{prefix}-other")).await.len(),
        1
    );
    assert!(elsewhere.abandon().await.unwrap());
    assert!(lock.release().await.unwrap());
}

/// A claim whose process died (its lease, never renewed, runs out) stops
/// being listed when the lease expires, though its record is still in
/// flight; a retry's claim replaces it and is listed with a higher fence.
async fn expired_claims_are_not_listed(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("expired");
    let records = store(&backend, &prefix, Duration::from_secs(20));
    let key = Subject::new("order-9");
    let fingerprint = Fingerprint::of(b"order-9");
    // The raw claim: no watchdog renews its lease.
    let request = ClaimRequest::new(
        records.keys_for(&key),
        "dead-process".to_owned(),
        Duration::from_millis(500),
        Duration::from_secs(60),
        Duration::from_secs(60),
        fingerprint,
    );
    let ClaimReply::Claimed { fence: dead } = backend.claim(&request).await.unwrap() else {
        panic!("claimed");
    };
    let listed = in_flight(&backend, &prefix).await;
    assert_eq!(listed.len(), 1, "{kind:?}: {listed:?}");
    assert_eq!(listed[0].fence, dead);
    assert!(listed[0].ttl <= Duration::from_millis(500));

    eventually(Duration::from_secs(5), "the dead claim leaves", || async {
        in_flight(&backend, &prefix).await.is_empty().then_some(())
    })
    .await;
    let retry = claimed(&records, "order-9").await;
    assert!(retry.fence() > dead);
    let listed = in_flight(&backend, &prefix).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].fence, retry.fence());
    drop(retry);
    eventually(Duration::from_secs(3), "a dropped claim leaves", || async {
        in_flight(&backend, &prefix).await.is_empty().then_some(())
    })
    .await;
}

/// Names and subjects come back as keys show them; many records are all
/// found (the walk pages through `SCAN` on every master).
async fn every_key_is_found(kind: Kind) {
    let backend = backend(kind).await;
    let prefix = unique("many");
    let records = store(&backend, &prefix, Duration::from_secs(20));
    let mut claims = Vec::new();
    for i in 0..40 {
        claims.push(claimed(&records, &format!("tenant:{i}")).await);
    }
    let compound = Subject::compound(["t-1", "POST /orders", "k 1"]);
    let Claim::Claimed(c) = records
        .claim(compound.clone(), Fingerprint::of(b"x"))
        .await
        .unwrap()
    else {
        panic!("claimed");
    };
    claims.push(c);
    let listed = in_flight(&backend, &prefix).await;
    assert_eq!(listed.len(), 41, "{kind:?}");
    assert!(listed.iter().any(|r| r.subject == compound.as_encoded()));
    assert!(listed
        .iter()
        .any(|r| r.subject == Subject::new("tenant:7").as_encoded()));
    // Each key parses back to its subject.
    for r in &listed {
        Subject::from_encoded(&r.subject).unwrap();
    }
    for c in claims {
        assert!(c.abandon().await.unwrap());
    }
    assert_eq!(in_flight(&backend, &prefix).await, []);
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Kind::Memory).await;
            })*
        }
        mod standalone {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Kind::Standalone).await;
            })*
        }
        mod cluster {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario(super::Kind::Cluster).await;
            })*
        }
    };
}

on_every_store!(
    running_claims_are_listed,
    expired_claims_are_not_listed,
    every_key_is_found,
);

/// On a clock that does not move, the lease's end decides to the
/// microsecond: listed just before, not at it.
#[tokio::test]
async fn memory_lease_end_is_exact() {
    let clock = ManualClock::starting_now();
    let memory = MemoryBackend::with_clock(clock.clone());
    let records = IdempotencyStore::builder(memory.clone())
        .lease(LockOptions::new().ttl(Duration::from_secs(10)))
        .build()
        .unwrap();
    let request = ClaimRequest::new(
        records.keys_for(&Subject::new("k")),
        "t".to_owned(),
        Duration::from_secs(10),
        Duration::from_secs(60),
        Duration::from_secs(60),
        Fingerprint::of(b"k"),
    );
    assert!(matches!(
        memory.claim(&request).await.unwrap(),
        ClaimReply::Claimed { .. }
    ));
    clock.advance(Duration::from_secs(4));
    let listed = memory.records_in_flight("tollgate").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].held, Some(Duration::from_secs(4)));
    assert_eq!(listed[0].ttl, Duration::from_secs(6));
    clock.advance(Duration::from_secs(6) - Duration::from_micros(1));
    assert_eq!(memory.records_in_flight("tollgate").await.unwrap().len(), 1);
    clock.advance(Duration::from_micros(1));
    assert_eq!(memory.records_in_flight("tollgate").await.unwrap(), []);
}

/// A record claimed by a version that did not store when (no `a` field)
/// is listed without `held`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_record_has_no_held() {
    let backend = backend(Kind::Standalone).await;
    let prefix = unique("older");
    let records = store(&backend, &prefix, Duration::from_secs(20));
    let claim = claimed(&records, "k").await;
    let keys = records.keys_for(&Subject::new("k"));
    assert_eq!(server().cli(&["HDEL", &keys.record, "a"]), "1");
    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    let seen = admin.idempotency_in_flight().await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].held_ms, None);
    assert_eq!(
        serde_json::to_value(&seen[0]).unwrap()["held_ms"],
        serde_json::Value::Null
    );
    assert!(claim.complete(&response()).await.unwrap());
}
