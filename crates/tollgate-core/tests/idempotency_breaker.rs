//! An idempotency store skips a dead backend: after repeated outages a
//! claim fails at once with `CircuitOpen` (no round trip, no task left
//! waiting on a paused server), and claims work again once a probe finds
//! the server back. A redis-server of its own (the test pauses it).

use std::time::Duration;

use tollgate_core::failure::is_outage;
use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore};
use tollgate_core::{Error, RedisBackend, Subject};
use tollgate_testkit::{eventually, unique, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_outages_open_the_circuit_and_a_probe_closes_it() {
    let server = RedisServer::start().expect("redis-server");
    let backend = RedisBackend::connect(&server.url()).await.expect("redis");
    let store = IdempotencyStore::builder(backend)
        .prefix(unique("idem-breaker"))
        .timeout(Duration::from_millis(100))
        .circuit_breaker(3, Duration::from_millis(300))
        .build()
        .unwrap();
    let claim = |k: &str| {
        let store = store.clone();
        let k = k.to_owned();
        async move {
            store
                .claim(Subject::new(k.as_str()), Fingerprint::of(k.as_bytes()))
                .await
        }
    };
    // Closed: a claim reaches the server.
    assert!(matches!(claim("before").await, Ok(Claim::Claimed(_))));

    server.pause();
    for i in 0..3 {
        let e = claim(&format!("down-{i}")).await.unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "claim {i}: {e:?}");
    }
    // Open: refused without a round trip.
    let e = claim("skipped").await.unwrap_err();
    assert!(matches!(e, Error::CircuitOpen), "{e:?}");
    server.resume();

    // A probe after the cooldown finds the server and closes the circuit.
    eventually(
        Duration::from_secs(10),
        "a claim after the cooldown",
        || async { matches!(claim("after").await, Ok(Claim::Claimed(_))).then_some(()) },
    )
    .await;
    assert!(matches!(claim("closed").await, Ok(Claim::Claimed(_))));
}

/// An error about one record's data is not an outage: it never opens the
/// circuit, however often it repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_record_type_never_opens_the_circuit() {
    let server = RedisServer::start().expect("redis-server");
    let backend = RedisBackend::connect(&server.url()).await.expect("redis");
    let prefix = unique("idem-breaker");
    let store = IdempotencyStore::builder(backend)
        .prefix(prefix.as_str())
        .circuit_breaker(1, Duration::from_secs(60))
        .build()
        .unwrap();
    let bad = Subject::new("bad");
    // The record key holds a string: the claim script's HMGET fails.
    let record = store.keys_for(&bad).record;
    assert_eq!(server.cli(&["SET", &record, "x"]), "OK");
    for _ in 0..3 {
        let e = store
            .claim(bad.clone(), Fingerprint::of(b"bad"))
            .await
            .unwrap_err();
        assert!(!is_outage(&e), "{e:?}");
    }
    let good = store
        .claim(Subject::new("good"), Fingerprint::of(b"good"))
        .await;
    assert!(matches!(good, Ok(Claim::Claimed(_))), "{good:?}");
}
