//! The Redis store: [`RedisBackend`], scripts over any redis-rs async
//! connection (standalone, Cluster, Sentinel), and everything that talks to
//! Redis — the script table, rate limits and their coalescing, locks and
//! permits, idempotency records, pub/sub and the version check.

use std::fmt;
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Value};

use self::coalesce::Coalescer;
use self::conn::{downcast, Conn};
use self::pubsub::PubSubNodes;
use self::rate::RateCalls;
use self::scripts::LuaScript;
use self::standalone::Standalone;
use crate::error::{redis_error, within, Error, Result};

mod admin;
mod coalesce;
mod conn;
mod demoted;
mod holders;
mod idempotency;
mod lean;
mod lease;
mod lock;
mod permits;
mod pubsub;
mod rate;
mod reply;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
mod server_clock;
mod standalone;
mod unclaimed;
mod version;

pub use self::coalesce::Coalescing;
#[cfg(feature = "sentinel")]
pub use self::sentinel::SentinelConnection;

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
/// # async fn run() -> Result<(), tollgate::Error> {
/// use tollgate::{Quota, RateLimiter, RedisBackend};
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
    /// How rate checks are sent (the connection and the server's clock).
    rate: RateCalls,
    /// Coalescing of rate checks; `None` when off.
    coalescer: Option<Coalescer<RateCalls>>,
    /// Listeners of the admin channels this backend watches.
    watchers: Arc<admin::Watchers>,
    pub(super) kind: &'static str,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("kind", &self.kind)
            .field("pubsub", &self.pubsub.is_some())
            .finish()
    }
}

impl RedisBackend {
    fn with_conn(conn: Conn, kind: &'static str) -> Self {
        let by_tag = matches!(conn, Conn::Cluster(_));
        let rate = RateCalls {
            conn: conn.clone(),
            clock: Arc::default(),
        };
        RedisBackend {
            pubsub: None,
            watchers: Arc::default(),
            coalescer: Some(Coalescer::new(
                rate.clone(),
                Coalescing::default(),
                by_tag,
                None,
            )),
            rate,
            conn,
            kind,
        }
    }

    /// Connects to a standalone Redis with a connection manager (which
    /// reconnects by itself after failures) and uses the same URL for pub/sub.
    /// A `READONLY` reply (the server was demoted to a replica) makes it
    /// connect anew, resolving the URL's name again: a name that moves to
    /// the promoted replica on failover (a cloud provider's primary
    /// endpoint) is followed after one failed call.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(redis_error)?;
        let mut conn = ConnectionManager::new_with_config(client.clone(), standalone::config())
            .await
            .map_err(redis_error)?;
        ensure_supported(&mut conn).await?;
        let conn = Standalone::new(client.clone(), conn);
        Ok(Self::with_conn(Conn::Standalone(conn), "redis").with_pubsub(client))
    }

    /// Like [`RedisBackend::connect`], but returns at once and connects in
    /// the background: the backend works once Redis is reachable, and a
    /// service can start while Redis is down. The Redis version is not
    /// checked (there is no connection yet): call
    /// [`check_server_version`](Self::check_server_version) once Redis is up.
    pub fn connect_lazy(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(redis_error)?;
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), standalone::config())
            .map_err(redis_error)?;
        let conn = Standalone::new(client.clone(), conn);
        Ok(Self::with_conn(Conn::Standalone(conn), "redis").with_pubsub(client))
    }

    /// Connects to a Redis Cluster through its seed nodes (`redis://host:port`
    /// or `host:port`). Lock waiters subscribe on any live node of the
    /// current topology (a cluster-wide `PUBLISH` reaches every node), and
    /// move to another when theirs goes away.
    ///
    /// A command that surely never ran (a redirection during a failover or
    /// a slot migration, a node that refused the connection) is sent again
    /// within the caller's timeout; one whose connection dropped after it
    /// was sent is not (it may have run), and the caller's failure policy
    /// answers it.
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
        // No retries of redis-rs's own: it would send a command again after
        // its connection dropped, and a script that ran before the drop
        // would run twice (a check charged twice, a claim finding itself in
        // flight). `Conn` sends again only what surely never ran.
        let mut conn = redis::cluster::ClusterClient::builder(seeds.clone())
            .retries(0)
            .build()
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
    /// failovers (see [`SentinelConnection`]).
    /// Lock waiters poll instead of subscribing, so a failover never strands
    /// them on a stale subscription.
    #[cfg(feature = "sentinel")]
    pub fn sentinel<S: AsRef<str>>(sentinels: &[S], service: &str) -> Result<Self> {
        let conn = SentinelConnection::new(sentinels, service)?;
        Ok(Self::with_conn(Conn::Sentinel(conn), "sentinel"))
    }

    /// A backend over a connection you already have: any redis-rs async
    /// connection that is `ConnectionLike + Clone + Send + Sync` (a
    /// connection manager, a cluster connection, a `MultiplexedConnection`,
    /// your own wrapper). Its kind is `"cluster"` for a cluster connection,
    /// `"sentinel"` for a `SentinelConnection` (feature `sentinel`)
    /// and `"redis"` otherwise. Without [`with_pubsub`](Self::with_pubsub),
    /// lock waiters poll instead of waking on release notifications.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::RedisBackend;
    ///
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let backend = RedisBackend::from_connection(conn).with_pubsub(client);
    /// assert_eq!(tollgate::RateBackend::kind(&backend), "redis");
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
        let conn = match downcast::<C, SentinelConnection>(conn) {
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

    /// The server's `maxmemory-policy` when it lets Redis evict keys that
    /// still live (any but `noeviction`; on a cluster, the first primary's
    /// that does), or `None`. A server that may evict can drop a lock or
    /// permit holder (two holders), an idempotency record (a second
    /// execution) or a rate-limit state (a reset quota) under memory
    /// pressure; connecting logs a warning for it. `None` too when the
    /// server refuses `INFO`.
    pub async fn eviction_policy(&self) -> Result<Option<String>> {
        let mut conn = self.conn.clone();
        let read = async { version::eviction(&mut conn).await.map_err(redis_error) };
        within(CONNECT_CHECKS, read).await
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
    /// # async fn run() -> Result<(), tollgate::Error> {
    /// use tollgate::{Coalescing, RedisBackend};
    ///
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379")
    ///     .await?
    ///     .with_coalescing(Coalescing::default().max_batch(32));
    /// # Ok(()) }
    /// ```
    pub fn with_coalescing(mut self, coalescing: Coalescing) -> Self {
        let home = self.coalescer.as_ref().and_then(|c| c.home());
        self.coalescer = (coalescing.batch_limit() > 1).then(|| {
            Coalescer::new(
                self.rate.clone(),
                coalescing,
                matches!(self.conn, Conn::Cluster(_)),
                home,
            )
        });
        self
    }

    /// How many rate-limit checks wait for a turn to be sent (see
    /// [`with_coalescing`](Self::with_coalescing)): 0 without coalescing, or
    /// while fewer checks than its turns are in flight. A gauge for metrics,
    /// and what a test waits for.
    pub fn checks_waiting(&self) -> usize {
        self.coalescer.as_ref().map_or(0, Coalescer::waiting)
    }

    /// Names the backend in logs (`"redis"`, `"cluster"`, `"sentinel"`).
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// Runs a script on the connection (see [`Conn::invoke`]).
    pub(crate) async fn invoke(
        &self,
        script: &LuaScript,
        fill: impl Fn(&mut Cmd),
    ) -> Result<Value> {
        self.conn.invoke(script, fill).await
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
}

/// How long connecting waits for the server to answer its checks.
const CONNECT_CHECKS: std::time::Duration = std::time::Duration::from_secs(5);

/// Refuses a server too old for the scripts, and warns when it may evict
/// tollgate's keys (see [`version`]). A server that does not answer within
/// [`CONNECT_CHECKS`] fails the connect (a timeout).
async fn ensure_supported<C: ConnectionLike>(conn: &mut C) -> Result<()> {
    within(CONNECT_CHECKS, server_checks(conn)).await
}

async fn server_checks<C: ConnectionLike>(conn: &mut C) -> Result<()> {
    if let Some(problem) = version::check(conn).await.map_err(redis_error)? {
        return Err(Error::InvalidConfig(problem));
    }
    if let Some(policy) = version::eviction(conn).await.map_err(redis_error)? {
        tracing::warn!(
            maxmemory_policy = %policy,
            "Redis may evict tollgate's keys under memory pressure: a lock or permit \
             holder (two holders), an idempotency record (a second execution), a \
             rate-limit state (a reset quota). Set maxmemory-policy noeviction, or \
             give tollgate a Redis of its own"
        );
    }
    Ok(())
}
