//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

/// One `#[tokio::test]` per scenario and backend: `on_every_backend!(memory,
/// redis, cluster; [scenario, ...])` runs `crate::scenario(common::<backend>()
/// .await)` (a test file uses it with `#[macro_use] mod common;`).
#[allow(unused_macros)]
macro_rules! on_every_backend {
    ($($backend:ident),+; $scenarios:tt) => {
        $(on_every_backend!(@one $backend $scenarios);)+
    };
    (@one $backend:ident [$($scenario:ident),+ $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::$scenario(crate::common::$backend().await).await;
                }
            )+
        }
    };
}

pub mod grpc;
pub mod idempotency;
pub mod lock_suite;
pub mod suite;
#[path = "../../../tollgate-core/tests/lock_common/watched.rs"]
mod watched;

pub(crate) use watched::Watched;

use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use tollgate_core::{Locker, MemoryBackend, RateBackend, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};

#[cfg(feature = "axum")]
pub use tollgate_testkit::http::in_process::get_from;
pub use tollgate_testkit::http::in_process::{get, send};
pub use tollgate_testkit::http::Reply;
pub use tollgate_testkit::unique;

/// The `detail` of a rejection's body, after checking the body is an
/// `about:blank` problem document of the reply's status.
pub fn problem_detail(r: &Reply) -> String {
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"));
    assert_eq!(v["type"], "about:blank", "{v}");
    assert_eq!(v["title"], r.status.canonical_reason().unwrap(), "{v}");
    assert_eq!(v["status"], r.status.as_u16(), "{v}");
    let detail = v["detail"].as_str();
    detail
        .unwrap_or_else(|| panic!("no detail in {v}"))
        .to_owned()
}

/// A standalone Redis shared by the tests of one binary (each test opens its
/// own connection on its own runtime).
pub fn shared_redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start().expect("start redis-server"))
}

/// A three-master cluster shared by the tests of one binary.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start().expect("start redis cluster"))
}

pub async fn memory() -> Arc<dyn RateBackend> {
    Arc::new(MemoryBackend::new())
}

pub async fn redis() -> Arc<dyn RateBackend> {
    let server = shared_redis();
    Arc::new(RedisBackend::from_connection(
        server.connection_manager().await,
    ))
}

pub async fn cluster() -> Arc<dyn RateBackend> {
    let cluster = shared_cluster();
    Arc::new(RedisBackend::from_connection(cluster.connection().await).with_kind("cluster"))
}

pub async fn lock_memory() -> lock_suite::LockEnv {
    let backend = MemoryBackend::new();
    let watched = Watched::new(Arc::new(backend.clone()));
    lock_suite::LockEnv {
        locker: Locker::new(watched.clone()),
        watched,
        break_lock: Box::new(move |key| {
            assert!(backend.break_lock(&key), "no lock at {key}");
            async {}.boxed()
        }),
    }
}

/// Breaks a lock by deleting its key over `conn` (it must exist).
fn break_by_del<C>(conn: C) -> lock_suite::BreakLock
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    Box::new(move |key| {
        let mut conn = conn.clone();
        async move {
            let n: i64 = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(n, 1, "no lock at {key}");
        }
        .boxed()
    })
}

pub async fn lock_redis() -> lock_suite::LockEnv {
    let server = shared_redis();
    let watched = Watched::new(Arc::new(
        RedisBackend::connect(&server.url()).await.unwrap(),
    ));
    let conn = server.connection_manager().await;
    lock_suite::LockEnv {
        locker: Locker::new(watched.clone()),
        watched,
        break_lock: break_by_del(conn),
    }
}

pub async fn lock_cluster() -> lock_suite::LockEnv {
    let cluster = shared_cluster();
    let watched = Watched::new(Arc::new(
        RedisBackend::connect_cluster(cluster.seeds())
            .await
            .unwrap(),
    ));
    let conn = cluster.connection().await;
    lock_suite::LockEnv {
        locker: Locker::new(watched.clone()),
        watched,
        break_lock: break_by_del(conn),
    }
}

/// A one-quota limiter of `per_minute` on `backend`, timed by `clock`
/// (standing still, so every figure is exact), under a name of its own.
pub fn limiter(
    backend: &suite::Backend,
    alg: tollgate_core::Algorithm,
    per_minute: u64,
    clock: &tollgate_core::ManualClock,
) -> tollgate_core::RateLimiter {
    tollgate_core::RateLimiter::builder(backend.clone(), alg)
        .quota(tollgate_core::Quota::per_minute(per_minute))
        .name(unique("limit"))
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// What `subject` has left on `limiter`, without taking anything.
pub async fn left(limiter: &tollgate_core::RateLimiter, subject: &str) -> u64 {
    limiter.check_n(subject, 0).await.unwrap().remaining
}
