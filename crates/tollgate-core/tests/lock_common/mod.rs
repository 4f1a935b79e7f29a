//! The lock behaviour suite, generic over a backend fixture, instantiated by
//! `lock_memory.rs`, `lock_standalone.rs` and `lock_cluster.rs` with
//! [`behaviour_suite!`]. Real Redis only (the test kit's processes).
//!
//! Here: the fixtures and [`Acquirer`]; the scenarios live in [`contention`],
//! [`waiting`] and [`lifecycle`], the forwarding backends in [`backends`]
//! and [`watched`].
#![allow(dead_code, async_fn_in_trait)]

pub(crate) mod backends;
pub(crate) mod contention;
pub(crate) mod lifecycle;
pub(crate) mod replay;
pub(crate) mod waiting;
pub(crate) mod watched;

// Re-exported so the binaries and [`behaviour_suite!`] keep calling
// `lock_common::…`; each binary uses a subset (hence the allows, as for
// `dead_code` above).
#[allow(unused_imports)]
pub(crate) use backends::{memory_queue_len, Delayed};
#[allow(unused_imports)]
pub(crate) use contention::*;
#[allow(unused_imports)]
pub(crate) use lifecycle::*;
#[allow(unused_imports)]
pub(crate) use waiting::*;
#[allow(unused_imports)]
pub(crate) use watched::Watched;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::future::{BoxFuture, FutureExt};
use tollgate_core::{
    Lease, LockBackend, LockOptions, Locker, LockerBuilder, MemoryBackend, RedisBackend,
};
use tollgate_testkit::{RedisCluster, RedisServer};

use backends::Queues;

/// A backend under test: hands out lockers on separate connections.
pub(crate) trait Fixture: Sync {
    /// A fresh backend handle (a fresh connection).
    async fn backend(&self) -> Arc<dyn LockBackend>;
    /// A builder over a fresh connection (a fresh backend handle).
    async fn builder(&self) -> LockerBuilder {
        Locker::builder(self.backend().await)
    }
    /// Deletes a key behind every holder's back.
    async fn delete_key(&self, key: &str);
    /// Panics if any key on the backend has no TTL.
    fn assert_no_immortal_keys(&self);
}

pub(crate) struct Memory(pub(crate) MemoryBackend);

impl Fixture for Memory {
    async fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(Queues(self.0.clone()))
    }
    async fn delete_key(&self, key: &str) {
        assert!(self.0.break_lock(key), "no live lock under {key}");
    }
    fn assert_no_immortal_keys(&self) {}
}

pub(crate) struct Standalone(pub(crate) &'static RedisServer);

impl Fixture for Standalone {
    async fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect(&self.0.url()).await.unwrap())
    }
    async fn delete_key(&self, key: &str) {
        delete_one(&mut self.0.multiplexed().await, key).await;
    }
    fn assert_no_immortal_keys(&self) {
        assert_all_keys_expire(self.0);
    }
}

pub(crate) struct Cluster(pub(crate) &'static RedisCluster);

impl Fixture for Cluster {
    async fn backend(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect_cluster(self.0.seeds()).await.unwrap())
    }
    async fn delete_key(&self, key: &str) {
        delete_one(&mut self.0.connection().await, key).await;
    }
    fn assert_no_immortal_keys(&self) {
        for node in self.0.nodes() {
            assert_all_keys_expire(node);
        }
    }
}

/// Deletes `key` over `con`; panics unless it existed.
async fn delete_one(con: &mut impl redis::aio::ConnectionLike, key: &str) {
    let n: i64 = redis::cmd("DEL").arg(key).query_async(con).await.unwrap();
    assert_eq!(n, 1, "no key {key}");
}

/// What the shared scenarios need of a [`Locker`] (over one backend or a
/// Redlock's instances).
pub(crate) trait Acquirer: Clone + Send + Sync + 'static {
    fn acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>>;
    fn try_acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>>;
}

impl Acquirer for Locker {
    fn acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>> {
        self.acquire(name, opts).boxed()
    }
    fn try_acquire_boxed<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, tollgate_core::Result<Lease>> {
        self.try_acquire(name, opts).boxed()
    }
}

/// Every key on `server` has a TTL (PTTL ≥ 0: 0 is a key in its last
/// millisecond, such as one of the many short-lived release markers; -2 =
/// expired meanwhile is fine; -1 = immortal is not).
pub(crate) fn assert_all_keys_expire(server: &RedisServer) {
    let mut con = server.client().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut con).unwrap();
        assert!(
            pttl >= 0 || pttl == -2,
            "key {key} has no TTL (PTTL {pttl})"
        );
    }
}

/// A unique prefix per test, so tests sharing a server never meet.
pub(crate) fn prefix(test: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("t{}-{test}", N.fetch_add(1, Ordering::Relaxed))
}

/// Instantiates the behaviour suite for a fixture expression and a count of
/// acquisitions for the contended tests.
#[macro_export]
macro_rules! behaviour_suite {
    ($fixture:expr, $total:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fences_strictly_increase_4_clients() {
            lock_common::contended(&$fixture, "fences", 4, 4, $total).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mutual_exclusion_4_lockers_32_tasks() {
            lock_common::contended(&$fixture, "mutex", 4, 32, $total).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiter_wakes_on_release() {
            lock_common::waiter_wakes_on_release(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn wait_bound_is_honoured() {
            lock_common::wait_bound_is_honoured(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn drop_releases() {
            lock_common::drop_releases(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn release_semantics() {
            lock_common::release_semantics(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn deleted_key_is_lost() {
            lock_common::deleted_key_is_lost(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn renewal_and_cap() {
            lock_common::renewal_and_cap(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn busy_hints_the_typical_hold() {
            lock_common::busy_hints_the_typical_hold(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn fill_once_computes_once() {
            lock_common::fill_once_computes_once(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn names_are_independent() {
            lock_common::names_are_independent(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_acquire_leaves_no_lock() {
            lock_common::dropped_acquire_leaves_no_lock(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_release_still_releases() {
            lock_common::dropped_release_still_releases(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn acquire_is_idempotent() {
            lock_common::acquire_is_idempotent(&$fixture).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn huge_durations_are_refused_not_panics() {
            lock_common::huge_durations_are_refused_not_panics(&$fixture).await;
        }
    };
}
