//! [`RedisBackend`]: scripts over any redis-rs async connection.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};

use super::coalesce::{Coalescer, Coalescing};
use super::pubsub::PubSubNodes;
use crate::error::{redis_error, Error, Result};

/// A Lua script and its SHA1, computed once.
#[derive(Debug)]
pub(crate) struct LuaScript {
    pub(crate) sha: String,
    pub(crate) body: &'static str,
}

impl LuaScript {
    /// A script from its source (use with `include_str!`).
    pub(crate) fn new(body: &'static str) -> Self {
        LuaScript {
            sha: redis::Script::new(body).get_hash().to_owned(),
            body,
        }
    }
}

/// Declares a `static` [`LuaScript`] whose SHA1 is computed on first use.
macro_rules! lua {
    ($name:ident, $body:expr) => {
        pub(crate) static $name: std::sync::LazyLock<$crate::backend::redis::LuaScript> =
            std::sync::LazyLock::new(|| $crate::backend::redis::LuaScript::new($body));
    };
}
pub(crate) use lua;

/// Rate limits and locks on Redis: standalone, Cluster, Sentinel, or any
/// redis-rs async connection.
///
/// Requires Redis 5.0 or newer: the scripts read `TIME` before they write,
/// which needs script effects replication (the default from 5.0). The
/// version (`INFO server`) is checked once when a connection is set up —
/// by [`connect`](Self::connect), [`connect_cluster`](Self::connect_cluster)
/// (every primary) and `sentinel` (each master it resolves, failovers
/// included) — and an older server is refused with
/// [`Error::InvalidConfig`]. [`connect_lazy`](Self::connect_lazy) and
/// [`from_connection`](Self::from_connection) cannot check at construction
/// (no connection yet, or one made elsewhere): call
/// [`check_server_version`](Self::check_server_version) once Redis is up.
/// A server that refuses `INFO` is not checked (a warning is logged).
///
/// One type whatever the deployment: the connection is chosen by the
/// constructor and kept inside. [`connect`](Self::connect) and
/// [`connect_lazy`](Self::connect_lazy) use a connection manager (it
/// reconnects on its own), [`connect_cluster`](Self::connect_cluster) a
/// cluster connection, `sentinel` (feature `sentinel`) a connection that
/// follows failovers, and [`from_connection`](Self::from_connection) any
/// `ConnectionLike + Clone + Send + Sync` you already have. The connection is
/// cloned per call (they are handles to one multiplexed connection). Lock
/// waiters also need a pub/sub connection, made from the client given to
/// [`with_pubsub`](Self::with_pubsub) (set by `connect*`).
///
/// ```no_run
/// # async fn run() -> Result<(), tollgate_core::Error> {
/// use tollgate_core::{Quota, RateLimiter, RedisBackend};
///
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let limiter = RateLimiter::gcra(backend, Quota::per_second(10))?;
/// let decision = limiter.check("alice").await?;
/// println!("allowed: {}", decision.allowed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    conn: Conn,
    pubsub: Option<Arc<PubSubNodes>>,
    /// Coalescing of rate checks; `None` when off.
    coalescer: Option<Arc<Coalescer>>,
    pub(super) kind: &'static str,
}

/// The connection behind a [`RedisBackend`]. The usual kinds are variants,
/// so a call clones a handle and dispatches with a `match` — no allocation
/// and no virtual call per command; only a connection brought by the user
/// is boxed.
#[derive(Clone)]
enum Conn {
    Manager(ConnectionManager),
    Cluster(ClusterConnection),
    #[cfg(feature = "sentinel")]
    Sentinel(super::SentinelConnection),
    Other(Box<dyn DynConnection>),
}

/// A user's connection, boxed: `ConnectionLike` plus a clone into a box.
trait DynConnection: ConnectionLike + Send + Sync {
    fn clone_box(&self) -> Box<dyn DynConnection>;
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> DynConnection for C {
    fn clone_box(&self) -> Box<dyn DynConnection> {
        Box::new(self.clone())
    }
}

impl Clone for Box<dyn DynConnection> {
    fn clone(&self) -> Self {
        (**self).clone_box()
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.req_packed_command(cmd),
            Conn::Other(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Other(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Manager(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.get_db(),
            Conn::Other(c) => c.get_db(),
        }
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("kind", &self.kind)
            .field("pubsub", &self.pubsub.is_some())
            .finish()
    }
}

/// Takes `conn` out as a `T` if that is its type (a connection handed to
/// [`RedisBackend::from_connection`] that is one of the usual kinds gets
/// its own variant, unboxed).
fn downcast<C: 'static, T: 'static>(conn: C) -> Result<T, C> {
    let mut slot = Some(conn);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>() {
        Some(t) => Ok(t.take().expect("just filled")),
        None => Err(slot.expect("not taken")),
    }
}

impl RedisBackend {
    fn with_conn(conn: Conn, kind: &'static str) -> Self {
        let by_tag = matches!(conn, Conn::Cluster(_));
        RedisBackend {
            conn,
            pubsub: None,
            coalescer: Some(Arc::new(Coalescer::new(
                Coalescing::default(),
                by_tag,
                None,
            ))),
            kind,
        }
    }

    /// Connects to a standalone Redis with a connection manager (which
    /// reconnects by itself after failures) and uses the same URL for pub/sub.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(redis_error)?;
        let mut conn = ConnectionManager::new(client.clone())
            .await
            .map_err(redis_error)?;
        ensure_supported(&mut conn).await?;
        Ok(Self::with_conn(Conn::Manager(conn), "redis").with_pubsub(client))
    }

    /// Like [`RedisBackend::connect`], but returns at once and connects in
    /// the background: the backend works once Redis is reachable, and a
    /// service can start while Redis is down. The Redis version is not
    /// checked (there is no connection yet): call
    /// [`check_server_version`](Self::check_server_version) once Redis is up.
    pub fn connect_lazy(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(redis_error)?;
        let conn = ConnectionManager::new_lazy_with_config(
            client.clone(),
            redis::aio::ConnectionManagerConfig::new(),
        )
        .map_err(redis_error)?;
        Ok(Self::with_conn(Conn::Manager(conn), "redis").with_pubsub(client))
    }

    /// Connects to a Redis Cluster through its seed nodes (`redis://host:port`
    /// or `host:port`). Lock waiters subscribe on any live node of the
    /// current topology (a cluster-wide `PUBLISH` reaches every node), and
    /// move to another when theirs goes away.
    pub async fn connect_cluster<I, S>(seeds: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let seeds: Vec<String> = seeds
            .into_iter()
            .map(|s| {
                let s = s.as_ref().trim();
                if s.contains("://") {
                    s.to_owned()
                } else {
                    format!("redis://{s}")
                }
            })
            .collect();
        let first = seeds
            .first()
            .ok_or_else(|| Error::InvalidConfig("a cluster needs at least one seed".into()))?;
        let mut pubsub = vec![redis::Client::open(first.as_str()).map_err(redis_error)?];
        for seed in &seeds[1..] {
            pubsub.push(redis::Client::open(seed.as_str()).map_err(redis_error)?);
        }
        let mut conn = redis::cluster::ClusterClient::new(seeds.clone())
            .map_err(redis_error)?
            .get_async_connection()
            .await
            .map_err(redis_error)?;
        ensure_supported(&mut conn).await?;
        let mut backend = Self::with_conn(Conn::Cluster(conn), "cluster");
        backend.pubsub = Some(Arc::new(PubSubNodes::new(pubsub, true)));
        Ok(backend)
    }

    /// A backend on the master `service` behind Redis Sentinel; follows
    /// failovers (see [`SentinelConnection`](super::SentinelConnection)).
    /// Lock waiters poll instead of subscribing, so a failover never strands
    /// them on a stale subscription.
    #[cfg(feature = "sentinel")]
    pub fn sentinel<S: AsRef<str>>(sentinels: &[S], service: &str) -> Result<Self> {
        let conn = super::SentinelConnection::new(sentinels, service)?;
        Ok(Self::with_conn(Conn::Sentinel(conn), "sentinel"))
    }

    /// A backend over a connection you already have: any redis-rs async
    /// connection that is `ConnectionLike + Clone + Send + Sync` (a
    /// connection manager, a cluster connection, a `MultiplexedConnection`,
    /// your own wrapper). Its kind is `"cluster"` for a cluster connection,
    /// `"sentinel"` for a [`SentinelConnection`](super::SentinelConnection)
    /// and `"redis"` otherwise. Without [`with_pubsub`](Self::with_pubsub),
    /// lock waiters poll instead of waking on release notifications.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate_core::RedisBackend;
    ///
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let backend = RedisBackend::from_connection(conn).with_pubsub(client);
    /// assert_eq!(tollgate_core::RateBackend::kind(&backend), "redis");
    /// # Ok(()) }
    /// ```
    pub fn from_connection<C>(conn: C) -> Self
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let conn = match downcast::<C, ConnectionManager>(conn) {
            Ok(c) => return Self::with_conn(Conn::Manager(c), "redis"),
            Err(c) => c,
        };
        let conn = match downcast::<C, ClusterConnection>(conn) {
            Ok(c) => return Self::with_conn(Conn::Cluster(c), "cluster"),
            Err(c) => c,
        };
        #[cfg(feature = "sentinel")]
        let conn = match downcast::<C, super::SentinelConnection>(conn) {
            Ok(c) => return Self::with_conn(Conn::Sentinel(c), "sentinel"),
            Err(c) => c,
        };
        Self::with_conn(Conn::Other(Box::new(conn)), "redis")
    }

    /// Checks that the server (every primary of a cluster) runs Redis 5.0 or
    /// newer: one `INFO server` round trip. [`connect`](Self::connect),
    /// [`connect_cluster`](Self::connect_cluster) and `sentinel` check on
    /// their own; call this after [`connect_lazy`](Self::connect_lazy) or
    /// [`from_connection`](Self::from_connection), once Redis is reachable.
    ///
    /// Errors: [`Error::InvalidConfig`] for an older server; a backend error
    /// when `INFO` cannot be sent. A server that refuses `INFO` passes (with
    /// a warning).
    pub async fn check_server_version(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        ensure_supported(&mut conn).await
    }

    /// The client used for the one pub/sub subscription per `Locker`, as
    /// given: its address is kept even on a cluster (e.g. a proxy or NAT
    /// address), where [`connect_cluster`](Self::connect_cluster)'s own
    /// subscriptions follow the topology.
    pub fn with_pubsub(mut self, client: redis::Client) -> Self {
        self.pubsub = Some(Arc::new(PubSubNodes::new(vec![client], false)));
        self
    }

    /// How rate-limit checks share script calls (issue #15). By default
    /// ([`Coalescing::default`]) checks that arrive while calls are in
    /// flight go out together as one call of a batch script, which decides
    /// each in turn with the algorithms' own code: Redis spends less CPU
    /// per decision under load, and a lone check goes out at once, as
    /// before. On a cluster connection each hash tag has its own turns and
    /// queue (a script's keys must share a slot, and a frozen node holds up
    /// only its own subjects). Any other connection is taken for one
    /// server; if it refuses a call of several tags (`CROSSSLOT`: a sharded
    /// proxy, a cluster connection in a wrapper), that batch is decided
    /// again one call per tag, and later batches are split so.
    /// [`Coalescing::off`] sends one call per check.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate_core::Error> {
    /// use tollgate_core::{Coalescing, RedisBackend};
    ///
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379")
    ///     .await?
    ///     .with_coalescing(Coalescing::default().max_batch(32));
    /// # Ok(()) }
    /// ```
    pub fn with_coalescing(mut self, coalescing: Coalescing) -> Self {
        let home = self.coalescer.as_ref().and_then(|c| c.home());
        self.coalescer = (coalescing.batch_limit() > 1).then(|| {
            Arc::new(Coalescer::new(
                coalescing,
                matches!(self.conn, Conn::Cluster(_)),
                home,
            ))
        });
        self
    }

    pub(crate) fn coalescer(&self) -> Option<&Coalescer> {
        self.coalescer.as_deref()
    }

    /// Names the backend in logs (`"redis"`, `"cluster"`, `"sentinel"`).
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// Where lock waiters subscribe, if anywhere.
    pub(crate) fn pubsub_nodes(&self) -> Option<&Arc<PubSubNodes>> {
        self.pubsub.as_ref()
    }

    /// The cluster connection, for a cluster backend (to ask it for the
    /// current topology).
    pub(crate) fn cluster_connection(&self) -> Option<ClusterConnection> {
        match &self.conn {
            Conn::Cluster(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// Runs a script: `EVALSHA`, and on `NOSCRIPT` (after a restart, a
    /// failover or `SCRIPT FLUSH`) `EVAL` once, which also loads it. No other
    /// error is retried. `fill` adds the keys and arguments after `numkeys`.
    pub(crate) async fn invoke(
        &self,
        script: &LuaScript,
        fill: impl Fn(&mut Cmd),
    ) -> Result<Value> {
        self.invoke_raw(script, fill).await.map_err(redis_error)
    }

    /// [`invoke`](Self::invoke) with redis-rs's error (a batch answers each
    /// check with a copy of it).
    pub(super) async fn invoke_raw(
        &self,
        script: &LuaScript,
        fill: impl Fn(&mut Cmd),
    ) -> redis::RedisResult<Value> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.sha.as_str());
        fill(&mut cmd);
        match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.body);
                fill(&mut cmd);
                cmd.query_async::<Value>(&mut conn).await
            }
            other => other,
        }
    }
}

/// Refuses a server too old for the scripts (see [`super::version`]).
async fn ensure_supported<C: ConnectionLike>(conn: &mut C) -> Result<()> {
    match super::version::check(conn).await.map_err(redis_error)? {
        Some(problem) => Err(Error::InvalidConfig(problem)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downcast_takes_only_its_own_type() {
        assert_eq!(downcast::<u32, u32>(7), Ok(7));
        assert_eq!(downcast::<u32, u64>(7), Err(7));
    }
}
