//! The lock and permit scripts against their memory twins: the same random
//! sequence of acquires, releases (replayed ones too), extensions and
//! permit counts, by four holders on two names, on memory and on Redis
//! (standalone and cluster); every answer compared. TTLs are long — nothing
//! expires during a run — so the answers do not depend on either clock;
//! fences are compared by order (each side strictly increasing per name),
//! since they come from each side's clock. Only answers both sides gave
//! count as agreement. At the end of each sequence both list the same
//! holders.

mod rate_common;

use std::collections::HashMap;
use std::time::Duration;

use tollgate_core::store::{AcquireReply, AcquireRequest, LockKeys};
use tollgate_core::{Keyspace, LockBackend, MemoryBackend, RedisBackend, Subject};

use rate_common::*;

const TTL: Duration = Duration::from_secs(30);
const FENCE_TTL: Duration = Duration::from_secs(120);

/// One answer, comparable across backends.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Acquired,
    Held,
    Released(bool),
    Extended(bool),
    InUse(u32),
}

/// A holder's keys on `name`: a lock, or permits of `weight` of `limit`.
fn keys(keyspace: &Keyspace, name: &str, permits: Option<(u32, u32)>) -> LockKeys {
    let subject = Subject::new(name);
    match permits {
        None => LockKeys::new(keyspace, &subject),
        Some((limit, weight)) => LockKeys::permits(keyspace, &subject, limit, weight, false),
    }
}

async fn answer(
    backend: &dyn LockBackend,
    op: u64,
    keys: &LockKeys,
    token: &str,
    fences: &mut HashMap<String, u64>,
) -> Answer {
    match op {
        0 | 1 => {
            let req = AcquireRequest::new(keys.clone(), token.to_owned(), TTL, FENCE_TTL);
            match backend.acquire_lock(&req).await.unwrap() {
                AcquireReply::Acquired { fence } => {
                    let last = fences.entry(format!("{}/{token}", keys.lock)).or_insert(0);
                    // A token that already holds gets its own fence again.
                    assert!(fence.get() >= *last, "fence went back");
                    *last = fence.get();
                    Answer::Acquired
                }
                AcquireReply::Held { .. } => Answer::Held,
                other => panic!("{other:?}"),
            }
        }
        2 | 3 => Answer::Released(backend.release_lock(keys, token).await.unwrap()),
        4 => Answer::Extended(backend.extend_lock(keys, token, TTL).await.unwrap()),
        _ => Answer::InUse(backend.permits_in_use(keys).await.unwrap()),
    }
}

/// Who holds what under `prefix`: (subject, permits, weight, holder), sorted.
async fn listing(backend: &dyn LockBackend, prefix: &str) -> Vec<(String, bool, u32, String)> {
    let mut all: Vec<_> = backend
        .lock_holders(prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|h| {
            assert_eq!(h.name, "twins");
            (h.subject, h.permits, h.weight, h.holder)
        })
        .collect();
    all.sort();
    all
}

async fn sequence(redis: RedisBackend, what: &str) {
    let mut seed: u64 = 0x9FB2_1C65_1E98_DF25;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let memory = MemoryBackend::new();
    let tokens = ["a", "b", "c", "d"];
    for permits in [None, Some((1, 1)), Some((3, 1)), Some((5, 2))] {
        let keyspace = Keyspace::new(prefix(), "twins").unwrap();
        let (mut fences_m, mut fences_r) = (HashMap::new(), HashMap::new());
        let mut seen = HashMap::new();
        for step in 0..steps(300) {
            let name = ["x", "y"][rand(2) as usize];
            let token = tokens[rand(4) as usize];
            // Counting permits is for semaphores only.
            let op = rand(if permits.is_some() { 6 } else { 5 });
            let k = keys(&keyspace, name, permits);
            let m = answer(&memory, op, &k, token, &mut fences_m).await;
            let r = answer(&redis, op, &k, token, &mut fences_r).await;
            assert_eq!(
                m, r,
                "{what} {permits:?} step {step}: {name} {token} op {op}"
            );
            *seen.entry(format!("{m:?}")).or_insert(0) += 1;
        }
        // Both list the same holders (fences aside: each side's clock).
        assert_eq!(
            listing(&memory, keyspace.prefix()).await,
            listing(&redis, keyspace.prefix()).await,
            "{what} {permits:?}: holders"
        );
        for needed in [
            "Acquired",
            "Held",
            "Released(true)",
            "Released(false)",
            "Extended(true)",
            "Extended(false)",
        ] {
            if permits == Some((5, 2)) && needed == "Held" {
                continue; // five permits among four holders of weight ≤ 2 may never run out
            }
            assert!(
                seen.contains_key(needed),
                "{what} {permits:?}: never {needed}: {seen:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_permit_scripts_match_their_twins_standalone() {
    let redis = RedisBackend::from_connection(server().connection_manager().await);
    sequence(redis, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_permit_scripts_match_their_twins_cluster() {
    let redis = RedisBackend::from_connection(cluster().connection().await);
    sequence(redis, "cluster").await;
}

/// Steps per sequence: `default`, or `TOLLGATE_DIFF_STEPS` for a long run
/// (e.g. `TOLLGATE_DIFF_STEPS=1000000`).
fn steps(default: u64) -> u64 {
    std::env::var("TOLLGATE_DIFF_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
