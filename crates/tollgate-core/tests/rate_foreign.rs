//! Issue #16, defect 4: rate limiters never read state they did not write.
//! Two limiters that share a prefix and an explicit name but not an
//! algorithm keep their own keys; a rate limiter's keys are never a lock's,
//! a semaphore's or an idempotency record's; a value someone else wrote
//! under a limiter's key is repaired (read as absent and overwritten with a
//! TTL), never an error that the default allow policy would turn into
//! "admit everything, for ever". On memory, a standalone Redis and a
//! 3-master cluster (real processes, no mocks).

mod rate_common;

use std::time::Duration;

use redis::aio::ConnectionLike;
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::{
    Algorithm, DecisionSource, LockOptions, Locker, ManualClock, MemoryBackend, Quota, RateLimiter,
    RedisBackend, Semaphore, Subject,
};

use rate_common::*;

/// A limiter on `t` under the default failure policy (allow): an error that
/// the policy turned into an admission shows as a `FailOpen` decision.
fn allow_limiter(
    t: &Target,
    alg: Algorithm,
    quotas: &[Quota],
    prefix: &str,
    name: &str,
    clock: &ManualClock,
) -> RateLimiter {
    let mut b = RateLimiter::builder(t.backend.clone(), alg)
        .prefix(prefix)
        .name(name)
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .deny_cache(0);
    for q in quotas {
        b = b.quota(*q);
    }
    b.build().unwrap()
}

fn quota_sets() -> [Vec<Quota>; 2] {
    // One quota (the scripts' straight-line path) and two (their loop).
    [vec![q(3, 60)], vec![q(3, 60), q(5, 3600)]]
}

/// Two limiters with one prefix and one explicit name, each pair of
/// algorithms, checked in turn on one subject: each admits exactly its own
/// limit, every decision from the backend. (Before: GCRA overwrote the fixed
/// window's value, the fixed window's script then failed on GCRA's, and the
/// allow policy admitted that subject without limit; on memory each read the
/// other's state as empty and admitted everything.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_two_algorithms_stay_apart() {
    for kind in KINDS {
        let clock = ManualClock::starting_now();
        let t = Target::new(kind, &clock).await;
        let p = prefix();
        for (i, &a) in ALL.iter().enumerate() {
            for &b in &ALL[i + 1..] {
                for quotas in quota_sets() {
                    let la = allow_limiter(&t, a, &quotas, &p, "shared", &clock);
                    let lb = allow_limiter(&t, b, &quotas, &p, "shared", &clock);
                    let subject = format!("{a:?}-{b:?}-{}", quotas.len());
                    for round in 0..5 {
                        for l in [&la, &lb] {
                            let what = format!(
                                "{kind:?} {:?} beside {a:?}/{b:?}, {} quotas, round {round}",
                                l.algorithm(),
                                quotas.len()
                            );
                            let d = l
                                .check(subject.as_str())
                                .await
                                .unwrap_or_else(|e| panic!("{what}: {e}"));
                            assert_eq!(d.source, DecisionSource::Backend, "{what}: {d:?}");
                            assert_eq!(d.allowed, round < 3, "{what}: {d:?}");
                        }
                    }
                }
            }
        }
        t.assert_all_keys_expire(&p, &clock).await;
    }
}

/// Every key a rate limiter can write, next to every key a lock, a fair
/// lock, a semaphore and an idempotency store can write under the same
/// prefix, for names chosen to collide (`lock`, `sem`, `idem`, names and
/// prefixes with colons): no key in common. (Before: a limiter named `lock`
/// wrote `<prefix>:lock:{<subject>}`, the lock's own key.)
#[test]
fn rate_keys_never_meet_lock_keys() {
    let m = MemoryBackend::new();
    let prefixes = ["t", "t:lock", "t:sem", "t:idem", "t:x"];
    let names = [
        "lock", "sem", "idem", "x", "lock:x", "x:lock", "fence", "record", "fw", "gcra",
    ];
    let subjects = ["orders", "fence", "q0", ""];
    let mut lock_keys = std::collections::HashSet::new();
    for prefix in prefixes {
        let locker = Locker::builder(m.clone()).prefix(prefix).build().unwrap();
        let fair = Locker::builder(m.clone())
            .prefix(prefix)
            .fair()
            .build()
            .unwrap();
        let sem = Semaphore::builder(m.clone(), 3)
            .prefix(prefix)
            .fair()
            .build()
            .unwrap();
        let idem = IdempotencyStore::builder(m.clone())
            .prefix(prefix)
            .build()
            .unwrap();
        for s in subjects {
            for keys in [locker.keys_for(s), fair.keys_for(s), sem.keys_for(s)] {
                lock_keys.extend([keys.queue(), keys.tickets(), keys.lock, keys.fence]);
            }
            let record = idem.keys_for(&Subject::new(s));
            lock_keys.extend([record.record, record.lease.lock, record.lease.fence]);
        }
    }
    let mut checked = 0;
    for prefix in prefixes {
        for name in names {
            for alg in ALL {
                for quotas in quota_sets() {
                    let mut b = RateLimiter::builder(m.clone(), alg)
                        .prefix(prefix)
                        .name(name);
                    for q in &quotas {
                        b = b.quota(*q);
                    }
                    let l = b.build().unwrap();
                    for s in subjects {
                        for key in l.keys_for(&Subject::new(s)) {
                            assert!(
                                !lock_keys.contains(&key),
                                "{alg:?} limiter {prefix:?}/{name:?} writes {key}, a lock keyspace key"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000);
}

/// A rate limiter named `lock` beside a held lock of the same name under
/// the same prefix: the limit is exact and the lock is still held (its
/// release finds its own token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_named_lock_leaves_locks_alone() {
    for kind in [Kind::Standalone, Kind::Cluster] {
        let clock = ManualClock::starting_now();
        let t = Target::new(kind, &clock).await;
        let p = prefix();
        let backend = match kind {
            Kind::Standalone => RedisBackend::from_connection(server().connection_manager().await),
            _ => RedisBackend::from_connection(cluster().connection().await),
        };
        let locker = Locker::builder(backend).prefix(&p).build().unwrap();
        for alg in ALL {
            let name = format!("orders-{alg:?}");
            let lease = locker
                .acquire(name.as_str(), &LockOptions::new())
                .await
                .unwrap();
            let l = allow_limiter(&t, alg, &[q(3, 60)], &p, "lock", &clock);
            for round in 0..5 {
                let d = l.check(name.as_str()).await.unwrap();
                let what = format!("{kind:?} {alg:?} round {round}");
                assert_eq!(d.source, DecisionSource::Backend, "{what}: {d:?}");
                assert_eq!(d.allowed, round < 3, "{what}: {d:?}");
            }
            assert!(
                lease.release().await.unwrap(),
                "{kind:?} {alg:?}: the lock was overwritten"
            );
        }
    }
}

/// A raw connection to the standalone server or the cluster, to write
/// what a limiter would never write.
enum Raw {
    Standalone(redis::aio::ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    async fn new(kind: Kind) -> Raw {
        match kind {
            Kind::Standalone => Raw::Standalone(server().connection_manager().await),
            Kind::Cluster => Raw::Cluster(cluster().connection().await),
            Kind::Memory => unreachable!("memory holds only what the twins write"),
        }
    }

    async fn run(&mut self, args: &[&str]) -> redis::Value {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let r = match self {
            Raw::Standalone(c) => c.req_packed_command(&cmd).await,
            Raw::Cluster(c) => c.req_packed_command(&cmd).await,
        };
        r.unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    async fn pttl(&mut self, key: &str) -> i64 {
        match self.run(&["PTTL", key]).await {
            redis::Value::Int(n) => n,
            other => panic!("PTTL {key}: {other:?}"),
        }
    }
}

/// What someone else may have left under a limiter's key, with no TTL:
/// strings no script writes (not numbers, not finite, beyond 2^53, an
/// instant 2^52 µs or more from now, another algorithm's shape) and other
/// types (WRONGTYPE for GET or ZCARD).
const FOREIGN: [&[&str]; 19] = [
    &["SET", "garbage"],
    &["SET", ""],
    &["SET", "nan"],
    &["SET", "inf"],
    &["SET", "-inf"],
    &["SET", "1e400"],
    &["SET", "0x7fffffffffffffff"],
    &["SET", "99999999999999999999"],
    &["SET", "9000000000000000"],
    &["SET", "12:abc"],
    &["SET", ":"],
    &["SET", "::"],
    &["SET", "1:2"],
    &["SET", "1:2:3:4"],
    &["SET", "-5"],
    &["HSET", "f", "v"],
    &["RPUSH", "a"],
    &["SADD", "a"],
    &["ZADD", "1", "a"],
];

/// A foreign value under every key of a limiter, on the default allow
/// policy: the checks decide from the backend, admit exactly the limit, and
/// leave every key holding the limiter's own value with a TTL; a refund over
/// a foreign value is an answer, not an error. (Before: the window scripts
/// failed on such a value — and so did every script on another type — and
/// the allow policy admitted that subject without limit for as long as the
/// value stayed, which without a TTL is for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_repaired() {
    for kind in [Kind::Standalone, Kind::Cluster] {
        let clock = ManualClock::starting_now();
        let t = Target::new(kind, &clock).await;
        let mut raw = Raw::new(kind).await;
        let p = prefix();
        for alg in ALL {
            for quotas in quota_sets() {
                let l = allow_limiter(&t, alg, &quotas, &p, "n", &clock);
                for (i, foreign) in FOREIGN.iter().enumerate() {
                    // A sorted set is the log's own type: its members count.
                    if alg == Algorithm::SlidingWindowLog && foreign[0] == "ZADD" {
                        continue;
                    }
                    let subject = format!("s{i}");
                    let keys = l.keys_for(&Subject::new(&subject));
                    let what = format!("{kind:?} {alg:?} {} quotas, {foreign:?}", quotas.len());
                    for key in &keys {
                        raw.run(&["DEL", key]).await;
                        let mut args = vec![foreign[0], key.as_str()];
                        args.extend(&foreign[1..]);
                        raw.run(&args).await;
                    }
                    let mut first = None;
                    for round in 0..5 {
                        let d = l.check(subject.as_str()).await;
                        let d = d.unwrap_or_else(|e| panic!("{what} round {round}: {e}"));
                        assert_eq!(d.source, DecisionSource::Backend, "{what}: {d:?}");
                        assert_eq!(d.allowed, round < 3, "{what} round {round}: {d:?}");
                        first = first.or(d.charge);
                    }
                    for key in &keys {
                        let pttl = raw.pttl(key).await;
                        assert!(pttl > 0, "{what}: {key} left with PTTL {pttl}");
                    }
                    // Clobbered again, then refunded: an answer either way.
                    for key in &keys {
                        raw.run(&["DEL", key]).await;
                        let mut args = vec![foreign[0], key.as_str()];
                        args.extend(&foreign[1..]);
                        raw.run(&args).await;
                    }
                    let charge = first.expect("an admitted check");
                    l.refund(subject.as_str(), &charge)
                        .await
                        .unwrap_or_else(|e| panic!("{what}: refund: {e}"));
                    let d = l.check(subject.as_str()).await.unwrap();
                    assert_eq!(d.source, DecisionSource::Backend, "{what}: {d:?}");
                }
            }
        }
        t.assert_all_keys_expire(&p, &clock).await;
    }
}

/// A backend that answers per subject: `script` and `wrongtype` with the
/// errors a script about one key's data gives, `protocol` with a reply no
/// script gives, `down` with an outage; anything else from memory.
#[derive(Debug)]
struct Faulty(MemoryBackend);

impl tollgate_core::RateBackend for Faulty {
    fn check_rate<'a>(
        &'a self,
        request: &'a tollgate_core::store::RateRequest,
    ) -> futures_util::future::BoxFuture<'a, tollgate_core::Result<tollgate_core::store::RateReply>>
    {
        use tollgate_core::{BackendError, Error};
        let subject = request.keys[0].rsplit('{').next().unwrap_or_default();
        let io = |m: &str| std::io::Error::other(m.to_owned());
        let error = match subject.trim_end_matches('}') {
            "script" => Error::Backend(BackendError::new(io(
                "ERR user_script:12: attempt to perform arithmetic on local 'sep' (a nil value)",
            ))),
            "wrongtype" => Error::Backend(BackendError::new(io(
                "WRONGTYPE Operation against a key holding the wrong kind of value",
            ))),
            "protocol" => Error::Protocol("expected an array, got nil".into()),
            "down" => Error::Backend(BackendError::outage(io("connection refused"))),
            _ => return self.0.check_rate(request),
        };
        Box::pin(std::future::ready(Err(error)))
    }

    fn local_rate(&self) -> std::sync::Arc<dyn tollgate_core::RateBackend> {
        std::sync::Arc::new(tollgate_core::MemoryBackend::new())
    }

    fn kind(&self) -> &'static str {
        "faulty"
    }
}

/// An error about one request's data (a script error, WRONGTYPE, a reply no
/// script gives) is not an outage: no failure policy admits it or decides it
/// locally — the check fails, as unavailable (503 over HTTP) — and it does
/// not trip the circuit breaker. An outage still gets the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_errors_are_not_outages() {
    use tollgate_core::FailurePolicy;
    for policy in [
        FailurePolicy::Allow,
        FailurePolicy::Deny,
        FailurePolicy::Fallback {
            instances: 2.try_into().unwrap(),
        },
    ] {
        let l = RateLimiter::builder(Faulty(MemoryBackend::new()), Algorithm::Gcra)
            .quota(q(100, 60))
            .failure_policy(policy)
            .circuit_breaker(2, Duration::from_secs(60))
            .deny_cache(0)
            .build()
            .unwrap();
        for _ in 0..5 {
            for subject in ["script", "wrongtype", "protocol"] {
                match l.check(subject).await {
                    Err(e) => assert!(e.is_unavailable(), "{policy:?} {subject}: {e}"),
                    Ok(d) => panic!("{policy:?} {subject}: decided {d:?}"),
                }
            }
        }
        // The circuit stayed closed: others are decided by the backend.
        let d = l.check("fine").await.unwrap();
        assert_eq!(d.source, DecisionSource::Backend, "{policy:?}");
        // An outage gets the failure policy.
        let d = l.check("down").await;
        match policy {
            FailurePolicy::Allow => assert_eq!(d.unwrap().source, DecisionSource::FailOpen),
            FailurePolicy::Deny => assert!(d.unwrap_err().is_unavailable()),
            _ => assert_eq!(d.unwrap().source, DecisionSource::Fallback),
        }
    }
}

/// A server that refuses every write (out of memory) is an outage, not a
/// data error: the allow policy admits, the deny policy refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_memory_server_is_an_outage() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let backend = RedisBackend::from_connection(server.connection_manager().await);
    let build = |policy| {
        RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
            .quota(q(100, 60))
            .failure_policy(policy)
            .deny_cache(0)
            .build()
            .unwrap()
    };
    let (open, closed) = (
        build(tollgate_core::FailurePolicy::Allow),
        build(tollgate_core::FailurePolicy::Deny),
    );
    assert_eq!(
        open.check("a").await.unwrap().source,
        DecisionSource::Backend
    );
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let d = open.check("b").await.unwrap();
    assert_eq!(d.source, DecisionSource::FailOpen, "{d:?}");
    let e = closed.check("b").await.unwrap_err();
    assert!(e.to_string().contains("OOM"), "{e}");
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
}
