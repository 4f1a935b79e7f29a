//! One store of each kind for a test binary: memory, a standalone
//! redis-server and a 3-master cluster (real processes, started once).
#![allow(dead_code)] // each test file uses its own part

use std::sync::OnceLock;

use tollgate_core::{Backend, RedisBackend};
use tollgate_testkit::{RedisCluster, RedisServer};

pub(crate) fn server() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(|| RedisServer::start().expect("redis-server"))
}

pub(crate) fn cluster() -> &'static RedisCluster {
    static C: OnceLock<RedisCluster> = OnceLock::new();
    C.get_or_init(|| RedisCluster::start().expect("redis cluster"))
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Memory,
    Standalone,
    Cluster,
}

/// A store of `kind` (the servers are shared by the binary's tests).
pub(crate) async fn backend(kind: Kind) -> Backend {
    match kind {
        Kind::Memory => Backend::memory(),
        Kind::Standalone => RedisBackend::connect(&server().url())
            .await
            .expect("redis")
            .into(),
        Kind::Cluster => RedisBackend::connect_cluster(cluster().seeds())
            .await
            .expect("cluster")
            .into(),
    }
}
