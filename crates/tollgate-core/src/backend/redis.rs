//! [`RedisBackend`]: scripts over any redis-rs async connection.

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, ServerErrorKind, Value};

use super::{RateBackend, RateReply, RateRequest};
use crate::error::{Error, Result};
use crate::rate::{Algorithm, Outcome};

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

lua!(FIXED_WINDOW, crate::rate::fixed_window::SCRIPT);
lua!(SLIDING_WINDOW_LOG, crate::rate::sliding_window_log::SCRIPT);
lua!(
    SLIDING_WINDOW_COUNTER,
    crate::rate::sliding_window_counter::SCRIPT
);
lua!(TOKEN_BUCKET, crate::rate::token_bucket::SCRIPT);
lua!(GCRA, crate::rate::gcra::SCRIPT);

fn script_for(algorithm: Algorithm) -> &'static LuaScript {
    match algorithm {
        Algorithm::FixedWindow => &FIXED_WINDOW,
        Algorithm::SlidingWindowLog => &SLIDING_WINDOW_LOG,
        Algorithm::SlidingWindowCounter => &SLIDING_WINDOW_COUNTER,
        Algorithm::TokenBucket => &TOKEN_BUCKET,
        Algorithm::Gcra => &GCRA,
    }
}

/// Rate limits and locks on Redis.
///
/// Takes any redis-rs async connection that is `ConnectionLike + Clone + Send
/// + Sync` — a [`ConnectionManager`] (reconnects on its own), a
/// [`ClusterConnection`], a Sentinel-backed manager, a
/// `MultiplexedConnection` — and clones it per call (they are handles to one
/// multiplexed connection). Lock waiters also need a pub/sub connection, made
/// from the client given to [`RedisBackend::with_pubsub`] (set by
/// [`RedisBackend::connect`] and [`RedisBackend::connect_cluster`]).
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
pub struct RedisBackend<C = ConnectionManager> {
    conn: C,
    pubsub: Option<Arc<redis::Client>>,
    kind: &'static str,
}

impl<C> fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("kind", &self.kind)
            .field("pubsub", &self.pubsub.is_some())
            .finish()
    }
}

impl RedisBackend<ConnectionManager> {
    /// Connects to a standalone Redis with a [`ConnectionManager`] (which
    /// reconnects by itself after failures) and uses the same URL for pub/sub.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new(client.clone()).await?;
        Ok(RedisBackend::new(conn).with_pubsub(client))
    }

    /// Like [`RedisBackend::connect`], but returns at once and connects in
    /// the background: the backend works once Redis is reachable, and a
    /// service can start while Redis is down.
    pub fn connect_lazy(url: &str) -> Result<Self> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new_lazy_with_config(
            client.clone(),
            redis::aio::ConnectionManagerConfig::new(),
        )?;
        Ok(RedisBackend::new(conn).with_pubsub(client))
    }
}

impl RedisBackend<ClusterConnection> {
    /// Connects to a Redis Cluster through its seed nodes (`redis://host:port`
    /// or `host:port`). Pub/sub for lock waiters goes to the first seed
    /// (cluster-wide `PUBLISH` reaches every node).
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
        let pubsub = redis::Client::open(first.as_str())?;
        let conn = redis::cluster::ClusterClient::new(seeds.clone())?
            .get_async_connection()
            .await?;
        Ok(RedisBackend::new(conn)
            .with_pubsub(pubsub)
            .with_kind("cluster"))
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A backend over `conn`. Without [`RedisBackend::with_pubsub`], lock
    /// waiters poll instead of waking on release notifications.
    pub fn new(conn: C) -> Self {
        RedisBackend {
            conn,
            pubsub: None,
            kind: "redis",
        }
    }

    /// The client used for the one pub/sub subscription per `Locker`.
    pub fn with_pubsub(mut self, client: redis::Client) -> Self {
        self.pubsub = Some(Arc::new(client));
        self
    }

    /// Names the backend in logs (`"redis"`, `"cluster"`, `"sentinel"`).
    pub fn with_kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    /// A clone of the connection handle.
    pub fn connection(&self) -> C {
        self.conn.clone()
    }

    /// The pub/sub client, if any.
    pub(crate) fn pubsub_client(&self) -> Option<&redis::Client> {
        self.pubsub.as_deref()
    }

    /// Runs a script: `EVALSHA`, and on `NOSCRIPT` (after a restart, a
    /// failover or `SCRIPT FLUSH`) `EVAL` once, which also loads it. No other
    /// error is retried. `fill` adds the keys and arguments after `numkeys`.
    pub(crate) async fn invoke(
        &self,
        script: &LuaScript,
        fill: impl Fn(&mut Cmd),
    ) -> Result<Value> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.sha.as_str());
        fill(&mut cmd);
        match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.body);
                fill(&mut cmd);
                Ok(cmd.query_async::<Value>(&mut conn).await?)
            }
            other => Ok(other?),
        }
    }
}

fn parse_rate_reply(value: Value, quotas: usize) -> Result<RateReply> {
    let Value::Array(items) = value else {
        return Err(Error::Protocol(format!("expected an array, got {value:?}")));
    };
    let nums: Vec<i64> = items
        .iter()
        .map(|v| match v {
            Value::Int(n) => Ok(*n),
            other => Err(Error::Protocol(format!(
                "expected an integer, got {other:?}"
            ))),
        })
        .collect::<Result<_>>()?;
    if nums.len() != 1 + 3 * quotas {
        return Err(Error::Protocol(format!(
            "expected {} integers, got {}",
            1 + 3 * quotas,
            nums.len()
        )));
    }
    let outcomes = nums[1..]
        .chunks_exact(3)
        .map(|c| Outcome::from_reply(c[0].max(0) as u64, c[1].max(0) as u64, c[2].max(0) as u64))
        .collect();
    Ok(RateReply::new(nums[0] == 1, outcomes))
}

impl<C> RateBackend for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn check_rate<'a>(&'a self, req: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        async move {
            let value = self
                .invoke(script_for(req.algorithm), |cmd| {
                    cmd.arg(req.keys.len());
                    for k in &req.keys {
                        cmd.arg(k.as_str());
                    }
                    match req.now_micros {
                        Some(now) => cmd.arg(now),
                        None => cmd.arg(""),
                    };
                    cmd.arg(req.cost);
                    // Only the sliding log reads the nonce (ARGV[3]).
                    if req.algorithm == Algorithm::SlidingWindowLog {
                        cmd.arg(format!("{:016x}", req.nonce));
                    } else {
                        cmd.arg("");
                    }
                    for q in req.quotas.iter() {
                        let (a, b) = req.algorithm.params(q);
                        cmd.arg(a).arg(b);
                    }
                })
                .await?;
            parse_rate_reply(value, req.quotas.len())
        }
        .boxed()
    }

    fn kind(&self) -> &'static str {
        self.kind
    }
}
