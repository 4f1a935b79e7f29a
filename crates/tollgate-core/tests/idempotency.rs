//! The idempotency store's suite, instantiated for the memory backend, a
//! standalone redis-server and a 3-master Redis Cluster: exact replays,
//! payload mismatches, in-flight claims, abandon (explicit and by drop),
//! fenced completion after a lost lease, renewal, record TTLs and no
//! immortal keys. Plus: a memory backend on a manual clock, a paused server
//! (a lost lease; calls bounded) and two OS processes claiming the same keys.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tollgate_core::idempotency::{
    Claim, Claimed, Fingerprint, IdempotencyStore, IdempotencyStoreBuilder, StoredResponse,
};
use tollgate_core::{LockOptions, ManualClock, MemoryBackend, RedisBackend, Subject};
use tollgate_testkit::{eventually, unique, RedisCluster, RedisServer};

// ---------------------------------------------------------------------------
// Fixtures

/// A backend under test: stores over fresh connections, and a look behind
/// the store's back (raw keys) where the backend has any.
trait Fixture: Sync {
    /// A store builder over a fresh backend handle, keys under `prefix`.
    async fn builder(&self, prefix: &str) -> IdempotencyStoreBuilder;
    /// Deletes the lease (lock) key `key` behind every holder's back;
    /// panics unless it existed.
    async fn delete_lease(&self, key: &str);
    /// `PTTL key` (`None`: no raw keys, the memory backend).
    async fn pttl(&self, key: &str) -> Option<i64>;
    /// `HGET key field` (outer `None`: the memory backend).
    async fn hget(&self, key: &str, field: &str) -> Option<Option<Vec<u8>>>;
    /// Panics if a key under `prefix` has no TTL.
    fn assert_no_immortal_keys(&self, prefix: &str);
}

struct Memory(MemoryBackend);

impl Fixture for Memory {
    async fn builder(&self, prefix: &str) -> IdempotencyStoreBuilder {
        IdempotencyStore::builder(self.0.clone()).prefix(prefix)
    }
    async fn delete_lease(&self, key: &str) {
        assert!(self.0.break_lock(key), "no live lease under {key}");
    }
    async fn pttl(&self, _key: &str) -> Option<i64> {
        None
    }
    async fn hget(&self, _key: &str, _field: &str) -> Option<Option<Vec<u8>>> {
        None
    }
    fn assert_no_immortal_keys(&self, _prefix: &str) {}
}

struct Standalone<'a>(&'a RedisServer);

impl Fixture for Standalone<'_> {
    async fn builder(&self, prefix: &str) -> IdempotencyStoreBuilder {
        let backend = RedisBackend::connect(&self.0.url()).await.unwrap();
        IdempotencyStore::builder(backend).prefix(prefix)
    }
    async fn delete_lease(&self, key: &str) {
        let n: i64 = query(&mut self.0.multiplexed().await, redis::cmd("DEL").arg(key)).await;
        assert_eq!(n, 1, "no key {key}");
    }
    async fn pttl(&self, key: &str) -> Option<i64> {
        Some(query(&mut self.0.multiplexed().await, redis::cmd("PTTL").arg(key)).await)
    }
    async fn hget(&self, key: &str, field: &str) -> Option<Option<Vec<u8>>> {
        let cmd = redis::cmd("HGET").arg(key).arg(field).clone();
        Some(query(&mut self.0.multiplexed().await, &cmd).await)
    }
    fn assert_no_immortal_keys(&self, prefix: &str) {
        assert_keys_expire(self.0, prefix);
    }
}

struct Cluster<'a>(&'a RedisCluster);

impl Fixture for Cluster<'_> {
    async fn builder(&self, prefix: &str) -> IdempotencyStoreBuilder {
        let backend = RedisBackend::connect_cluster(self.0.seeds()).await.unwrap();
        IdempotencyStore::builder(backend).prefix(prefix)
    }
    async fn delete_lease(&self, key: &str) {
        let n: i64 = query(&mut self.0.connection().await, redis::cmd("DEL").arg(key)).await;
        assert_eq!(n, 1, "no key {key}");
    }
    async fn pttl(&self, key: &str) -> Option<i64> {
        Some(query(&mut self.0.connection().await, redis::cmd("PTTL").arg(key)).await)
    }
    async fn hget(&self, key: &str, field: &str) -> Option<Option<Vec<u8>>> {
        let cmd = redis::cmd("HGET").arg(key).arg(field).clone();
        Some(query(&mut self.0.connection().await, &cmd).await)
    }
    fn assert_no_immortal_keys(&self, prefix: &str) {
        for node in self.0.nodes() {
            assert_keys_expire(node, prefix);
        }
    }
}

async fn query<T: redis::FromRedisValue>(
    con: &mut impl redis::aio::ConnectionLike,
    cmd: &redis::Cmd,
) -> T {
    cmd.query_async(con).await.unwrap()
}

/// Every key under `prefix` on `server` has a TTL (PTTL ≥ 0; -2 = expired
/// between KEYS and PTTL is fine). Panics when there are no such keys at
/// all, so that a wrong pattern cannot pass.
fn assert_keys_expire(server: &RedisServer, prefix: &str) -> usize {
    let mut con = server.client().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut con)
        .unwrap();
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        // 0: in its last millisecond (a lease's release marker, say).
        assert!(
            pttl >= 0 || pttl == -2,
            "key {key} has no TTL (PTTL {pttl})"
        );
    }
    keys.len()
}

fn server() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(|| RedisServer::start().expect("redis-server"))
}

fn cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(|| RedisCluster::start().expect("redis cluster"))
}

// ---------------------------------------------------------------------------
// Helpers

fn fp(s: &str) -> Fingerprint {
    Fingerprint::of(s.as_bytes())
}

fn key(s: &str) -> Subject {
    Subject::compound(["tenant-1", "POST /orders", s])
}

/// A response with every awkward byte: an empty header value, binary
/// header bytes, NULs in the body.
fn awkward_response() -> StoredResponse {
    StoredResponse::new(
        201,
        vec![
            ("location".into(), b"/orders/9".to_vec()),
            ("x-empty".into(), Vec::new()),
            (
                "x-binary".into(),
                vec![0x01, b'\t', b' ', 0x7f, 0x80, 0xc3, 0x28, 0xfe, 0xff],
            ),
            ("etag".into(), b"\"v1\"".to_vec()),
            ("x-empty".into(), Vec::new()),
        ],
        [
            b"\0{\"order\":9}\0".as_slice(),
            &(0..=255u8).collect::<Vec<_>>(),
            b"\0\0",
        ]
        .concat(),
    )
}

async fn store<F: Fixture>(f: &F, prefix: &str, lease: LockOptions) -> IdempotencyStore {
    f.builder(prefix).await.lease(lease).build().unwrap()
}

async fn claimed(store: &IdempotencyStore, k: &Subject, p: Fingerprint) -> Claimed {
    match store.claim(k.clone(), p).await.unwrap() {
        Claim::Claimed(c) => c,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

async fn in_flight(store: &IdempotencyStore, k: &Subject, p: Fingerprint) -> Option<Duration> {
    match store.claim(k.clone(), p).await.unwrap() {
        Claim::InFlight { retry_after } => retry_after,
        other => panic!("expected InFlight, got {other:?}"),
    }
}

async fn completed(store: &IdempotencyStore, k: &Subject, p: Fingerprint) -> StoredResponse {
    match store.claim(k.clone(), p).await.unwrap() {
        Claim::Completed(r) => r,
        other => panic!("expected Completed, got {other:?}"),
    }
}

async fn mismatch(store: &IdempotencyStore, k: &Subject, p: Fingerprint) {
    match store.claim(k.clone(), p).await.unwrap() {
        Claim::Mismatch => {}
        other => panic!("expected Mismatch, got {other:?}"),
    }
}

/// The record's fence as stored (Redis only).
async fn stored_fence<F: Fixture>(f: &F, store: &IdempotencyStore, k: &Subject) -> Option<u64> {
    let record = store.keys_for(k).record;
    let raw = f.hget(&record, "f").await?;
    let raw = raw.unwrap_or_else(|| panic!("record {record} has no fence"));
    Some(String::from_utf8(raw).unwrap().parse().unwrap())
}

// ---------------------------------------------------------------------------
// The suite

/// 1 and 6: a completed record replays byte for byte (and keeps doing so);
/// another payload is refused while in flight and once completed; the lease
/// goes at completion and the record lives `record_ttl`.
async fn replays_exactly<F: Fixture>(f: &F) {
    let prefix = unique("idem-replay");
    let record_ttl = Duration::from_secs(120);
    let a = f
        .builder(&prefix)
        .await
        .record_ttl(record_ttl)
        .build()
        .unwrap();
    let b = f
        .builder(&prefix)
        .await
        .record_ttl(record_ttl)
        .build()
        .unwrap();
    let k = key("replay");
    let response = awkward_response();

    let claim = claimed(&a, &k, fp("payload")).await;
    mismatch(&b, &k, fp("other payload")).await;
    assert!(claim.is_held());
    assert!(claim.complete(&response).await.unwrap());

    for store in [&a, &b, &a] {
        assert_eq!(completed(store, &k, fp("payload")).await, response);
    }
    mismatch(&b, &k, fp("other payload")).await;
    mismatch(&a, &k, fp("")).await;

    // An empty response: no headers, an empty (but replayable) body.
    let empty = StoredResponse::new(204, Vec::new(), Vec::new());
    let k2 = key("empty");
    let claim = claimed(&b, &k2, fp("payload")).await;
    assert!(claim.complete(&empty).await.unwrap());
    let got = completed(&a, &k2, fp("payload")).await;
    assert_eq!(got, empty);
    assert_eq!(got.body, Some(Vec::new()));
    assert!(got.headers.is_empty());

    // Keys on Redis: the lease went at completion; the record lives
    // about `record_ttl` (measured now, a moment after completing).
    let keys = a.keys_for(&k);
    if let Some(pttl) = f.pttl(&keys.lease.lock).await {
        assert_eq!(pttl, -2, "the lease outlived the completion");
        let rec = f.pttl(&keys.record).await.unwrap();
        let ttl = record_ttl.as_millis() as i64;
        assert!(
            rec <= ttl && rec > ttl - 10_000,
            "record PTTL {rec} ms, record_ttl {ttl} ms"
        );
        let fence = f.pttl(&keys.lease.fence).await.unwrap();
        assert!(fence > 0, "fence key PTTL {fence}");
    }
    f.assert_no_immortal_keys(&prefix);
}

/// 2: in flight for others (retry_after within the lease TTL); abandon lets
/// a new claim run with a higher fence; so does dropping a claim, long
/// before the lease TTL.
async fn in_flight_abandon_and_drop<F: Fixture>(f: &F) {
    let prefix = unique("idem-flight");
    let ttl = Duration::from_secs(30);
    let a = store(f, &prefix, LockOptions::new().ttl(ttl)).await;
    let b = store(f, &prefix, LockOptions::new().ttl(ttl)).await;
    let k = key("flight");

    let first = claimed(&a, &k, fp("p")).await;
    let retry = in_flight(&b, &k, fp("p")).await.expect("a retry_after");
    assert!(
        retry > Duration::ZERO && retry <= ttl,
        "retry_after {retry:?}, lease TTL {ttl:?}"
    );
    // The holder itself is told the same (a second claim is never its own).
    in_flight(&a, &k, fp("p")).await;
    if let Some(fence) = stored_fence(f, &a, &k).await {
        assert_eq!(fence, first.fence().get());
    }
    f.assert_no_immortal_keys(&prefix);

    let fence1 = first.fence();
    assert!(first.abandon().await.unwrap());
    // The record went too: another payload may claim now.
    if let Some(pttl) = f.pttl(&a.keys_for(&k).record).await {
        assert_eq!(pttl, -2, "the abandoned record is still there");
    }
    let second = claimed(&b, &k, fp("p2")).await;
    assert!(
        second.fence() > fence1,
        "{:?} after {fence1:?}",
        second.fence()
    );
    in_flight(&a, &k, fp("p2")).await;
    mismatch(&a, &k, fp("p")).await;

    // Dropped: abandoned in the background, long before the 30 s TTL.
    let fence2 = second.fence();
    drop(second);
    let third = eventually(Duration::from_secs(10), "a claim after a drop", || async {
        match a.claim(k.clone(), fp("p3")).await.unwrap() {
            Claim::Claimed(c) => Some(c),
            // Still in flight with the dropped claim's payload.
            Claim::Mismatch => None,
            other => panic!("expected Claimed or InFlight, got {other:?}"),
        }
    })
    .await;
    assert!(third.fence() > fence2);
    let r = StoredResponse::new(200, Vec::new(), b"third".to_vec());
    assert!(third.complete(&r).await.unwrap());
    assert_eq!(completed(&b, &k, fp("p3")).await, r);
    f.assert_no_immortal_keys(&prefix);
}

/// 2 (cont.): a lease whose hold cap is shorter than its TTL is what others
/// see: the key is in flight for at most the cap, not the TTL.
async fn capped_lease<F: Fixture>(f: &F) {
    let prefix = unique("idem-cap");
    let cap = Duration::from_millis(1500);
    let lease = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .max_hold(cap);
    let a = store(f, &prefix, lease.clone()).await;
    let b = store(f, &prefix, lease).await;
    let k = key("cap");
    let claim = claimed(&a, &k, fp("p")).await;
    let retry = in_flight(&b, &k, fp("p")).await.expect("a retry_after");
    assert!(
        retry <= cap,
        "retry_after {retry:?} beyond the hold cap {cap:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), claim.lost())
        .await
        .expect("lost() at the hold cap");
    let next = eventually(Duration::from_secs(10), "a claim after the cap", || async {
        match b.claim(k.clone(), fp("p")).await.unwrap() {
            Claim::Claimed(c) => Some(c),
            Claim::InFlight { .. } => None,
            other => panic!("expected Claimed or InFlight, got {other:?}"),
        }
    })
    .await;
    assert!(next.fence() > claim.fence());
    assert!(!claim
        .complete(&StoredResponse::not_replayable(200))
        .await
        .unwrap());
    next.abandon().await.unwrap();
    f.assert_no_immortal_keys(&prefix);
}

/// 3: a response that was not kept comes back without a body, and is still
/// "completed" (no rerun) with the same status.
async fn not_replayable<F: Fixture>(f: &F) {
    let prefix = unique("idem-norep");
    let a = store(f, &prefix, LockOptions::new()).await;
    let k = key("big");
    let claim = claimed(&a, &k, fp("p")).await;
    assert!(claim
        .complete(&StoredResponse::not_replayable(202))
        .await
        .unwrap());
    let got = completed(&a, &k, fp("p")).await;
    assert_eq!(got, StoredResponse::not_replayable(202));
    assert_eq!((got.status, got.body, got.headers.len()), (202, None, 0));
    mismatch(&a, &k, fp("q")).await;

    // Headers given with a not-replayable response are not kept either
    // (there is nothing to replay them with) — but an empty replayable
    // body is still a body.
    let k2 = key("empty-body");
    let claim = claimed(&a, &k2, fp("p")).await;
    let r = StoredResponse::new(200, vec![("etag".into(), b"x".to_vec())], Vec::new());
    assert!(claim.complete(&r).await.unwrap());
    assert_eq!(completed(&a, &k2, fp("p")).await.body, Some(Vec::new()));
    f.assert_no_immortal_keys(&prefix);
}

/// 4: a holder whose lease was lost still stores its response while the
/// record carries its fence (nobody claimed since: storing it spares the
/// retry a second run of the handler), and completes nothing (`Ok(false)`)
/// once someone claimed meanwhile; the newer holder's in-flight record is
/// untouched (fence, payload) and its own completion replays. A stale
/// abandon leaves the newer claim alone too.
async fn lost_lease_stores_nothing<F: Fixture>(f: &F) {
    let prefix = unique("idem-fenced");
    let a = store(f, &prefix, LockOptions::new().ttl(Duration::from_secs(30))).await;
    let b = store(f, &prefix, LockOptions::new().ttl(Duration::from_secs(30))).await;
    let k = key("fenced");
    let lease_key = a.keys_for(&k).lease.lock;

    // Nobody claims after the loss: the response is stored (the record is
    // still this claim's), and the retry gets it instead of running again.
    let first = key("fenced-first");
    let slow = claimed(&a, &first, fp("p")).await;
    f.delete_lease(&a.keys_for(&first).lease.lock).await;
    let late = StoredResponse::new(200, Vec::new(), b"late".to_vec());
    assert!(slow.complete(&late).await.unwrap());
    assert_eq!(completed(&b, &first, fp("p")).await, late);

    // Someone claims after the loss.
    let old = claimed(&a, &k, fp("p")).await;
    f.delete_lease(&lease_key).await;
    let new = claimed(&b, &k, fp("p")).await;
    assert!(
        new.fence() > old.fence(),
        "{:?} after {:?}",
        new.fence(),
        old.fence()
    );
    let old_fence = old.fence();
    assert!(!old
        .complete(&StoredResponse::new(500, Vec::new(), b"old".to_vec()))
        .await
        .unwrap());
    // Untouched: still in flight, with the newer fence and payload.
    in_flight(&a, &k, fp("p")).await;
    if let Some(fence) = stored_fence(f, &b, &k).await {
        assert_eq!(fence, new.fence().get());
        assert_ne!(fence, old_fence.get());
    }
    assert!(new.is_held());
    let r = StoredResponse::new(
        201,
        vec![("location".into(), b"/new".to_vec())],
        b"new".to_vec(),
    );
    assert!(new.complete(&r).await.unwrap());
    assert_eq!(completed(&a, &k, fp("p")).await, r);

    // A stale abandon after a newer claim: `false`, the newer claim stays.
    let k2 = key("fenced-abandon");
    let lease_key2 = a.keys_for(&k2).lease.lock;
    let old = claimed(&a, &k2, fp("p")).await;
    f.delete_lease(&lease_key2).await;
    let new = claimed(&b, &k2, fp("p")).await;
    assert!(!old.abandon().await.unwrap());
    in_flight(&a, &k2, fp("p")).await;
    if let Some(fence) = stored_fence(f, &b, &k2).await {
        assert_eq!(fence, new.fence().get());
    }
    assert!(new.complete(&r).await.unwrap());
    assert_eq!(completed(&a, &k2, fp("p")).await, r);
    f.assert_no_immortal_keys(&prefix);
}

/// 5: a claim held for four lease TTLs stays in flight for everyone else
/// (the watchdog renews it), then completes and replays.
async fn renewed_while_running<F: Fixture>(f: &F) {
    let prefix = unique("idem-renew");
    let ttl = Duration::from_millis(900);
    let a = store(f, &prefix, LockOptions::new().ttl(ttl)).await;
    let b = store(f, &prefix, LockOptions::new().ttl(ttl)).await;
    let k = key("renew");
    let claim = claimed(&a, &k, fp("p")).await;
    let until = Instant::now() + ttl * 4;
    let mut checks = 0;
    while Instant::now() < until {
        let retry = in_flight(&b, &k, fp("p")).await;
        if let Some(retry) = retry {
            assert!(retry <= ttl, "retry_after {retry:?} beyond the TTL {ttl:?}");
        }
        assert!(claim.is_held(), "lease lost while renewing");
        checks += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(checks >= 4);
    let r = StoredResponse::new(200, Vec::new(), b"after renewals".to_vec());
    assert!(claim.complete(&r).await.unwrap());
    assert_eq!(completed(&b, &k, fp("p")).await, r);
    f.assert_no_immortal_keys(&prefix);
}

/// 5 (cont.): a request that runs longer than the record TTL keeps its
/// in-flight record (another payload is refused throughout) and completes.
async fn outlives_record_ttl<F: Fixture>(f: &F) {
    outlives_record_ttl_with(f, LockOptions::new()).await;
}

/// 5 (cont.): the same with a lease renewed without a hold cap.
async fn unbounded_outlives_record_ttl<F: Fixture>(f: &F) {
    outlives_record_ttl_with(f, LockOptions::new().unbounded_hold()).await;
}

async fn outlives_record_ttl_with<F: Fixture>(f: &F, lease: LockOptions) {
    let prefix = unique("idem-long");
    let ttl = Duration::from_millis(600);
    let build = || async {
        f.builder(&prefix)
            .await
            .lease(lease.clone().ttl(ttl))
            .record_ttl(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let (a, b) = (build().await, build().await);
    let k = key("long");
    let claim = claimed(&a, &k, fp("p")).await;
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        mismatch(&b, &k, fp("q")).await;
        in_flight(&b, &k, fp("p")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = StoredResponse::new(200, Vec::new(), b"slow".to_vec());
    assert!(
        claim.complete(&r).await.unwrap(),
        "the response was not stored"
    );
    assert_eq!(completed(&b, &k, fp("p")).await, r);
    f.assert_no_immortal_keys(&prefix);
}

/// 6 (cont.): a completed record goes at its TTL; the key may then run again.
async fn record_expires<F: Fixture>(f: &F) {
    let prefix = unique("idem-expire");
    let a = f
        .builder(&prefix)
        .await
        .record_ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let k = key("expire");
    let r = StoredResponse::new(200, Vec::new(), b"once".to_vec());
    assert!(claimed(&a, &k, fp("p")).await.complete(&r).await.unwrap());
    assert_eq!(completed(&a, &k, fp("p")).await, r);
    let again = eventually(Duration::from_secs(10), "the record's expiry", || async {
        match a.claim(k.clone(), fp("other")).await.unwrap() {
            Claim::Claimed(c) => Some(c),
            Claim::Mismatch => None,
            other => panic!("expected Claimed or Mismatch, got {other:?}"),
        }
    })
    .await;
    assert!(again.abandon().await.unwrap());
    f.assert_no_immortal_keys(&prefix);
}

/// Configuration: record TTLs out of range are refused.
async fn bad_record_ttl<F: Fixture>(f: &F) {
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(400 * 86_400),
    ] {
        let err = f.builder("cfg").await.record_ttl(ttl).build().unwrap_err();
        assert!(!err.is_unavailable(), "{err:?}");
    }
}

macro_rules! idempotency_suite {
    ($fixture:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn replays_exactly() {
            super::replays_exactly(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn in_flight_abandon_and_drop() {
            super::in_flight_abandon_and_drop(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn capped_lease() {
            super::capped_lease(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn not_replayable() {
            super::not_replayable(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn lost_lease_stores_nothing() {
            super::lost_lease_stores_nothing(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn renewed_while_running() {
            super::renewed_while_running(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn outlives_record_ttl() {
            super::outlives_record_ttl(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unbounded_outlives_record_ttl() {
            super::unbounded_outlives_record_ttl(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn record_expires() {
            super::record_expires(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_record_ttl() {
            super::bad_record_ttl(&$fixture).await;
        }
    };
}

mod memory {
    use super::Memory;
    use tollgate_core::MemoryBackend;
    idempotency_suite!(Memory(MemoryBackend::new()));
}

mod standalone {
    use super::{server, Standalone};
    idempotency_suite!(Standalone(server()));
}

mod cluster {
    use super::{cluster, Cluster};
    idempotency_suite!(Cluster(cluster()));
}

// ---------------------------------------------------------------------------
// Memory on a manual clock

/// 4 on memory: the lease runs out on the backend's clock, another claimer
/// takes the key; the first holder's completion stores nothing, the newer
/// one's record is untouched and its completion replays. The record then
/// lives exactly `record_ttl` on that clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_expired_lease_stores_nothing() {
    let clock = ManualClock::starting_now();
    let f = Memory(MemoryBackend::with_clock(clock.clone()));
    let lease = LockOptions::new().ttl(Duration::from_secs(10));
    let record_ttl = Duration::from_secs(60);
    let build = || async {
        f.builder("clock")
            .await
            .lease(lease.clone())
            .record_ttl(record_ttl)
            .build()
            .unwrap()
    };
    let (a, b, c) = (build().await, build().await, build().await);
    let k = key("clock");

    let old = claimed(&a, &k, fp("p")).await;
    clock.advance(Duration::from_secs(9));
    in_flight(&b, &k, fp("p")).await;
    clock.advance(Duration::from_secs(2));
    let new = claimed(&b, &k, fp("p")).await;
    assert!(new.fence() > old.fence());
    assert!(!old
        .complete(&StoredResponse::new(500, Vec::new(), b"old".to_vec()))
        .await
        .unwrap());
    let retry = in_flight(&c, &k, fp("p")).await.expect("retry_after");
    assert!(retry <= Duration::from_secs(10));
    mismatch(&c, &k, fp("q")).await;
    let r = StoredResponse::new(201, Vec::new(), b"new".to_vec());
    assert!(new.complete(&r).await.unwrap());
    assert_eq!(completed(&c, &k, fp("p")).await, r);

    clock.advance(record_ttl - Duration::from_secs(1));
    assert_eq!(completed(&c, &k, fp("p")).await, r);
    clock.advance(Duration::from_secs(2));
    let again = claimed(&c, &k, fp("q")).await;
    assert!(again.abandon().await.unwrap());
}

// ---------------------------------------------------------------------------
// A paused server

/// 4 on Redis, by a pause: the server is frozen past a short lease TTL; on
/// resume the lease has expired, another claimer takes the key, and the first
/// holder's completion stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_past_lease_ttl_stores_nothing() {
    let server = RedisServer::start().unwrap();
    let f = Standalone(&server);
    let prefix = unique("idem-pause");
    let ttl = Duration::from_millis(800);
    let a = store(&f, &prefix, LockOptions::new().ttl(ttl)).await;
    let b = store(&f, &prefix, LockOptions::new().ttl(Duration::from_secs(30))).await;
    let k = key("pause");

    let old = claimed(&a, &k, fp("p")).await;
    server.pause();
    tokio::time::sleep(ttl * 2).await;
    server.resume();
    tokio::time::timeout(Duration::from_secs(10), old.lost())
        .await
        .expect("lost() never resolved");
    assert!(!old.is_held());
    let new = eventually(
        Duration::from_secs(10),
        "a claim after the pause",
        || async {
            match b.claim(k.clone(), fp("p")).await {
                Ok(Claim::Claimed(c)) => Some(c),
                Ok(Claim::InFlight { .. }) | Err(_) => None,
                Ok(other) => panic!("expected Claimed, got {other:?}"),
            }
        },
    )
    .await;
    assert!(new.fence() > old.fence());
    assert!(!old
        .complete(&StoredResponse::new(500, Vec::new(), b"old".to_vec()))
        .await
        .unwrap());
    in_flight(&a, &k, fp("p")).await;
    assert_eq!(stored_fence(&f, &b, &k).await, Some(new.fence().get()));
    let r = StoredResponse::new(200, Vec::new(), b"new".to_vec());
    assert!(new.complete(&r).await.unwrap());
    assert_eq!(completed(&a, &k, fp("p")).await, r);
    assert!(assert_keys_expire(&server, &prefix) > 0);
}

/// 8: while Redis is frozen, claims fail as unavailable within a bound; a
/// completion started then is sent again until the server answers (well
/// within the lease's safe deadline), so after the resume it is stored and
/// the interrupted key replays it — never released to run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_is_unavailable() {
    let server = RedisServer::start().unwrap();
    let f = Standalone(&server);
    let prefix = unique("idem-down");
    let timeout = Duration::from_millis(300);
    let a = f.builder(&prefix).await.timeout(timeout).build().unwrap();
    let k = key("down");
    let held = claimed(&a, &k, fp("p")).await;

    server.pause();
    let start = Instant::now();
    let err = a.claim(key("other"), fp("p")).await.unwrap_err();
    let took = start.elapsed();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(took < Duration::from_secs(5), "claim took {took:?}");

    let r = StoredResponse::new(200, Vec::new(), b"x".to_vec());
    let mut completing = tokio::spawn({
        let r = r.clone();
        async move { held.complete(&r).await }
    });
    // Three round-trip bounds: a completion that gave up after its first
    // timed-out try would have answered by now.
    let early = tokio::time::timeout(timeout * 3, &mut completing).await;
    assert!(early.is_err(), "gave up while frozen: {early:?}");
    server.resume();

    let stored = tokio::time::timeout(Duration::from_secs(10), completing)
        .await
        .expect("the completion never landed after the resume")
        .unwrap();
    assert!(matches!(stored, Ok(true)), "{stored:?}");
    assert_eq!(completed(&a, &k, fp("p")).await, r);
    // Recovered: a fresh key claims at once.
    let c = claimed(&a, &key("fresh"), fp("p")).await;
    assert!(c.abandon().await.unwrap());
    assert_keys_expire(&server, &prefix);
}

/// 8 on a cluster: every master frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_cluster_is_unavailable() {
    let cluster = RedisCluster::start().unwrap();
    let f = Cluster(&cluster);
    let prefix = unique("idem-cdown");
    let timeout = Duration::from_millis(300);
    let a = f.builder(&prefix).await.timeout(timeout).build().unwrap();
    let warm = claimed(&a, &key("warm"), fp("p")).await;
    assert!(warm.abandon().await.unwrap());

    for node in cluster.nodes() {
        node.pause();
    }
    for name in ["c1", "c2", "c3"] {
        let start = Instant::now();
        let err = a.claim(key(name), fp("p")).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }
    for node in cluster.nodes() {
        node.resume();
    }
    let c = eventually(Duration::from_secs(20), "a claim after resume", || async {
        match a.claim(key("after"), fp("p")).await {
            Ok(Claim::Claimed(c)) => Some(c),
            Err(e) if e.is_unavailable() => None,
            other => panic!("expected Claimed, got {other:?}"),
        }
    })
    .await;
    assert!(c.abandon().await.unwrap());
}

// ---------------------------------------------------------------------------
// Two OS processes

const CHILD_ENV: &str = "TOLLGATE_IDEM_CHILD";
const KEYS: usize = 50;

/// Milliseconds since the epoch (both processes share the machine's clock).
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A pseudo-random delay below `max_ms`, different per process and key.
fn jitter(i: usize, max_ms: u64) -> Duration {
    use std::hash::BuildHasher;
    let h = std::collections::hash_map::RandomState::new().hash_one((std::process::id(), i));
    Duration::from_millis(h % max_ms)
}

/// One process's side: 50 rounds, one per key, all at once from the shared
/// start time `go_ms` (each after a small random delay). Returns per key
/// whether this process ran it and the body it saw stored.
async fn rounds(url: &str, prefix: &str, go_ms: u64) -> Vec<(bool, Vec<u8>)> {
    let store = IdempotencyStore::builder(RedisBackend::connect(url).await.unwrap())
        .prefix(prefix)
        .lease(LockOptions::new().ttl(Duration::from_secs(10)))
        .build()
        .unwrap();
    let client = redis::Client::open(url).unwrap();
    let con = client.get_multiplexed_async_connection().await.unwrap();
    // (A process that comes late on a loaded machine starts at once.)
    tokio::time::sleep(Duration::from_millis(go_ms.saturating_sub(epoch_ms()))).await;
    let mut handles = Vec::new();
    for i in 0..KEYS {
        let (store, mut con) = (store.clone(), con.clone());
        let prefix = prefix.to_owned();
        handles.push(tokio::spawn(async move {
            tokio::time::sleep(jitter(i, 40)).await;
            let k = key(&format!("x{i}"));
            let p = fp(&format!("payload {i}"));
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                assert!(Instant::now() < deadline, "key {i} never completed");
                match store.claim(k.clone(), p).await.unwrap() {
                    Claim::Claimed(c) => {
                        let runs: i64 = redis::cmd("INCR")
                            .arg(format!("runs:{prefix}:{i}"))
                            .query_async(&mut con)
                            .await
                            .unwrap();
                        // Long enough for the other process to find it in flight.
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        let body = format!("key {i} run {runs} by pid {}", std::process::id());
                        let r = StoredResponse::new(200, Vec::new(), body.clone().into_bytes());
                        assert!(c.complete(&r).await.unwrap(), "key {i}: not stored");
                        return (true, body.into_bytes());
                    }
                    Claim::InFlight { .. } => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Claim::Completed(r) => return (false, r.body.expect("a replayable body")),
                    other => panic!("key {i}: {other:?}"),
                }
            }
        }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// The other process of [`cross_process_claims_run_once`]; does nothing
/// unless started by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "started by cross_process_claims_run_once"]
async fn cross_process_child() {
    let Ok(arg) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut args = arg.split(' ');
    let (url, prefix, go_ms) = (
        args.next().unwrap(),
        args.next().unwrap(),
        args.next().unwrap().parse().unwrap(),
    );
    let mut lines = String::new();
    for (i, (ran, body)) in rounds(url, prefix, go_ms).await.into_iter().enumerate() {
        let body = String::from_utf8(body).unwrap();
        lines.push_str(&format!("\nIDEM {i} {} {body}\n", u8::from(ran)));
    }
    print!("{lines}");
}

/// 7: two processes claim the same 50 keys at once; each key's handler ran
/// exactly once (a counter outside tollgate) and both processes saw the same
/// stored body.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cross_process_claims_run_once() {
    let server = RedisServer::start().unwrap();
    let prefix = unique("idem-xproc");
    // Both processes start at this wall-clock time: long enough for the
    // child to start and connect.
    let go_ms = epoch_ms() + 3000;
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cross_process_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{} {prefix} {go_ms}", server.url()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let child = std::thread::spawn(move || child.wait_with_output().unwrap());

    let mine = rounds(&server.url(), &prefix, go_ms).await;
    let output = tokio::task::spawn_blocking(move || child.join().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let theirs: BTreeMap<usize, (bool, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("IDEM "))
        .map(|l| {
            let mut parts = l.splitn(3, ' ');
            let i = parts.next().unwrap().parse().unwrap();
            let ran = parts.next().unwrap() == "1";
            (i, (ran, parts.next().unwrap().to_owned()))
        })
        .collect();
    assert_eq!(theirs.len(), KEYS, "child output:\n{stdout}");

    let mut con = server.multiplexed().await;
    let (mut ran_here, mut ran_there) = (0, 0);
    for (i, (ran, body)) in mine.into_iter().enumerate() {
        let runs: i64 = redis::cmd("GET")
            .arg(format!("runs:{prefix}:{i}"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(runs, 1, "key {i} ran {runs} times");
        let body = String::from_utf8(body).unwrap();
        let (their_ran, their_body) = &theirs[&i];
        assert_eq!(
            &body, their_body,
            "key {i}: the processes saw different bodies"
        );
        assert!(
            body.starts_with(&format!("key {i} run 1 by pid ")),
            "{body}"
        );
        assert!(
            ran != *their_ran,
            "key {i}: ran here {ran}, there {their_ran}"
        );
        ran_here += usize::from(ran);
        ran_there += usize::from(*their_ran);
    }
    eprintln!("cross-process: {KEYS} keys, {ran_here} run here, {ran_there} in the child");
    assert!(assert_keys_expire(&server, &prefix) >= KEYS);
}
