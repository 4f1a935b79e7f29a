//! [`SentinelConnection`]: a multiplexed connection to the current master
//! behind Redis Sentinel that follows failovers.

use std::fmt;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, Value};

use super::demoted::{not_a_master, replies_say, reply_says};

use crate::error::{redis_error, Result};

/// A connection to the master that Sentinel currently names.
///
/// Each master it connects to must run Redis 5.0 or newer (checked once per
/// master, with `INFO server`; see [`RedisBackend`](super::RedisBackend)).
///
/// The master is asked of the sentinels on first use and again after a
/// connection error, a reply saying the server is no writable master now
/// (`READONLY`: the old master was demoted; `NOREPLICAS`: it was cut off
/// from its replicas; `MASTERDOWN`, `LOADING`) or a request abandoned by
/// its caller's timeout (a paused or partitioned master answers nothing at
/// all). The
/// failed command itself is not retried — nothing is retried blindly — so the
/// caller's failure policy sees that one error and the next call goes to the
/// new master.
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The master's connection, with the number of the lookup that found
    /// it: a request forgets only the connection it used.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    lookups: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConnection").finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// A connection to the master `service` known to `sentinels`
    /// (`redis://host:port` of each sentinel). Connects on first use.
    pub fn new<S: AsRef<str>>(sentinels: &[S], service: &str) -> Result<Self> {
        let urls: Vec<String> = sentinels.iter().map(|s| s.as_ref().to_owned()).collect();
        let client =
            SentinelClient::build(urls, service.to_owned(), None, SentinelServerType::Master)
                .map_err(redis_error)?;
        Ok(SentinelConnection {
            inner: Arc::new(Inner {
                sentinel: tokio::sync::Mutex::new(client),
                current: Mutex::new(None),
                lookups: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    async fn get(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        // The lookup runs in a task of its own: a caller whose timeout
        // fires first (a silent sentinel costs a connect or response
        // timeout before the next is asked) leaves it to finish, so the
        // master it finds serves the next calls.
        let this = self.clone();
        tokio::spawn(async move { this.look_up().await })
            .await
            .unwrap_or_else(|e| {
                Err(redis::RedisError::from(std::io::Error::other(format!(
                    "the Sentinel lookup stopped: {e}"
                ))))
            })
    }

    /// Asks the sentinels for the master and connects to it (one lookup at
    /// a time; a caller that waited finds the master already found).
    async fn look_up(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        let mut sentinel = self.inner.sentinel.lock().await;
        // Another caller may have resolved the master while we waited.
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let client = sentinel.async_get_client().await?;
        // Replies awaited as long as a late one is given back (not
        // redis-rs's 500 ms): callers bound each call with their own timeout.
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(super::unclaimed::KEPT_AT_MOST));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        // Once per master resolved (not per call): a master too old for the
        // scripts is refused, and asked of Sentinel again on the next call.
        let checked = tokio::time::timeout(super::CONNECT_CHECKS, super::version::check(&mut conn));
        let checked = checked.await.map_err(|_| {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the master did not answer its version check",
            ))
        })?;
        if let Some(problem) = checked? {
            return Err(redis::RedisError::from((
                ErrorKind::Client,
                "unsupported Redis version",
                problem,
            )));
        }
        let found = 1 + self
            .inner
            .lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.inner.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((found, conn.clone()));
        Ok((found, conn))
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.inner
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// After a request on connection `used`: its server is `not_a_master`
    /// (demoted, refusing writes, or loading) or the connection failed.
    fn observe<T>(&self, used: u64, result: &redis::RedisResult<T>, demoted: bool) {
        let failed = result.as_ref().err().is_some_and(|e| {
            e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
        });
        if demoted || failed {
            self.forget(used);
        }
    }

    /// The next request asks Sentinel which server is the master, unless
    /// the connection `used` was already replaced (a request that fails or
    /// is abandoned late must not drop a master found since).
    fn forget(&self, used: u64) {
        let mut current = self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|(n, _)| *n == used) {
            *current = None;
        }
    }
}

/// Forgets the cached master when a request is abandoned before its reply
/// (the caller's timeout fired): a paused or partitioned master answers no
/// error at all, and only asking Sentinel again finds the promoted replica.
struct Abandoned<'a> {
    conn: &'a SentinelConnection,
    used: u64,
    done: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.conn.forget(self.used);
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        async move {
            let (used, mut conn) = self.get().await?;
            let mut guard = Abandoned {
                conn: self,
                used,
                done: false,
            };
            let result = conn.req_packed_command(cmd).await;
            guard.done = true;
            self.observe(used, &result, reply_says(&result, not_a_master));
            result
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        async move {
            let (used, mut conn) = self.get().await?;
            let mut guard = Abandoned {
                conn: self,
                used,
                done: false,
            };
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            guard.done = true;
            self.observe(used, &result, replies_say(&result, not_a_master));
            result
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        0
    }
}
