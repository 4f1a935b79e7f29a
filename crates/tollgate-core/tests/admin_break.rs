//! Breaking a lock breaks only a lock: a name that happens to reach another
//! kind of key (a limiter's state, `<limiter>:<algorithm>`, an idempotency
//! record's lease) breaks nothing, on Redis as in memory, whose locks live
//! apart.

use std::time::Duration;

use tollgate_core::admin::Admin;
use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore};
use tollgate_core::{
    Algorithm, Backend, LockOptions, Locker, Quota, RateLimiter, RedisBackend, Subject,
};
use tollgate_testkit::{unique, RedisServer};

async fn a_limiters_state_is_not_a_lock(backend: Backend) {
    let prefix = unique("brk");
    let limiter = RateLimiter::builder(backend.clone(), Algorithm::Gcra)
        .quota(Quota::per_hour(1))
        .prefix(&prefix)
        .name("login")
        .deny_cache(0)
        .build()
        .unwrap();
    let alice = Subject::new("alice");
    assert!(limiter.check(&alice).await.unwrap().allowed);
    assert!(!limiter.check(&alice).await.unwrap().allowed);
    // `<prefix>:login:gcra:{alice}` is the limiter's key, not a lock's.
    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    assert!(!admin.break_lock("login:gcra", &alice).await.unwrap());
    assert!(!limiter.check(&alice).await.unwrap().allowed);

    // `<prefix>:idem:{order-9}` is a record's lease: breaking it would let
    // a second request run while the first one still does.
    let records = IdempotencyStore::builder(backend.clone())
        .prefix(&prefix)
        .build()
        .unwrap();
    let order = Subject::new("order-9");
    let print = Fingerprint::of(b"x");
    let Claim::Claimed(_running) = records.claim(order.clone(), print).await.unwrap() else {
        panic!("claimed");
    };
    assert!(!admin.break_lock("idem", &order).await.unwrap());
    let again = records.claim(order, print).await.unwrap();
    assert!(matches!(again, Claim::InFlight { .. }), "{again:?}");

    // A lock of the same store is broken as ever.
    let locker = Locker::builder(backend).prefix(&prefix).build().unwrap();
    let _held = locker
        .try_acquire("job", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(admin
        .break_lock("lock", &Subject::new("job"))
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let server = RedisServer::start().expect("redis-server");
    let backend = RedisBackend::connect(&server.url()).await.expect("redis");
    a_limiters_state_is_not_a_lock(backend.into()).await;
}

#[tokio::test]
async fn in_memory() {
    a_limiters_state_is_not_a_lock(Backend::memory()).await;
}
