//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod lock_suite;
pub mod suite;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use futures::FutureExt;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tollgate_core::{Locker, MemoryBackend, RateBackend, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};
use tower::ServiceExt;

/// A name no other test uses (keys on a shared Redis stay apart).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{nanos:x}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

pub async fn send(app: &Router, req: Request<Body>) -> Reply {
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `GET uri` from `peer`, as axum's `ConnectInfo` would record it.
pub fn get_from(uri: &str, peer: &str) -> Request<Body> {
    let mut req = Request::get(uri).body(Body::empty()).unwrap();
    req.extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    req
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
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
    let locker = Locker::new(backend.clone());
    lock_suite::LockEnv {
        locker,
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
    let locker = Locker::new(RedisBackend::connect(&server.url()).await.unwrap());
    let conn = server.connection_manager().await;
    lock_suite::LockEnv {
        locker,
        break_lock: break_by_del(conn),
    }
}

pub async fn lock_cluster() -> lock_suite::LockEnv {
    let cluster = shared_cluster();
    let locker = Locker::new(
        RedisBackend::connect_cluster(cluster.seeds())
            .await
            .unwrap(),
    );
    let conn = cluster.connection().await;
    lock_suite::LockEnv {
        locker,
        break_lock: break_by_del(conn),
    }
}
