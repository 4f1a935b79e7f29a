//! A throttled list lives as long as its TTL on every store: the memory
//! store drops it as Redis expires it (a list is written per window, so a
//! list kept forever would grow the process's memory without end).

use std::time::Duration;

use tollgate_core::store::{AdminBackend, DenialCount};
use tollgate_core::{ManualClock, MemoryBackend, RedisBackend};
use tollgate_testkit::{eventually, RedisServer};

fn denial(subject: &str) -> DenialCount {
    DenialCount {
        subject: subject.to_owned(),
        denied: 3,
        last_denied_ms: 1_700_000_000_000,
        label: None,
    }
}

#[tokio::test]
async fn a_memory_list_expires_at_its_ttl() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryBackend::with_clock(clock.clone());
    let ttl = Duration::from_secs(60);
    store
        .add_denials("t:throttled:1", &[denial("alice")], ttl, 10)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(30));
    // A write sets the TTL again, as the script's PEXPIRE does.
    store
        .add_denials("t:throttled:1", &[denial("bob")], ttl, 10)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(59));
    assert_eq!(
        store.top_denials("t:throttled:1", 10).await.unwrap().len(),
        2
    );
    clock.advance(Duration::from_secs(1));
    assert!(store
        .top_denials("t:throttled:1", 10)
        .await
        .unwrap()
        .is_empty());
    // Written again after it expired: a new list, the old counts gone.
    store
        .add_denials("t:throttled:1", &[denial("carol")], ttl, 10)
        .await
        .unwrap();
    let top = store.top_denials("t:throttled:1", 10).await.unwrap();
    assert_eq!(top.len(), 1);
    assert_eq!((top[0].subject.as_str(), top[0].denied), ("carol", 3));
}

/// The same on Redis, whose TTL the memory store follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_list_expires_at_its_ttl() {
    let server = RedisServer::start().expect("redis-server");
    let store = RedisBackend::connect(&server.url()).await.expect("redis");
    store
        .add_denials(
            "t:throttled:{1}",
            &[denial("alice")],
            Duration::from_millis(200),
            10,
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .top_denials("t:throttled:{1}", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    eventually(Duration::from_secs(10), "the list expired", || async {
        store
            .top_denials("t:throttled:{1}", 10)
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
}

/// Subjects denied as often are listed in one order on every store (as
/// Redis's ZREVRANGE gives them), and a block lasts whole ms on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ties_and_block_lengths_read_alike_on_every_store() {
    let server = RedisServer::start().expect("redis-server");
    let redis = RedisBackend::connect(&server.url()).await.expect("redis");
    let memory = MemoryBackend::new();
    let stores: [&dyn AdminBackend; 2] = [&memory, &redis];
    let mut tops = Vec::new();
    let mut blocks = Vec::new();
    for store in stores {
        let ttl = Duration::from_secs(60);
        let both = [denial("alice"), denial("bob")];
        store
            .add_denials("t:throttled:{2}", &both, ttl, 10)
            .await
            .unwrap();
        let top = store.top_denials("t:throttled:{2}", 1).await.unwrap();
        tops.push(top[0].subject.clone());
        let block = Duration::from_micros(1_500);
        let kept = store
            .set_block("t:x:block:{s}", block, false)
            .await
            .unwrap();
        blocks.push(kept);
    }
    assert_eq!(tops[0], tops[1], "the first of two tied subjects");
    assert_eq!(blocks, [Duration::from_millis(2); 2]);
}
