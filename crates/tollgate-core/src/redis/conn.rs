//! The connection behind a [`RedisBackend`](super::RedisBackend): one
//! cloneable handle whatever the deployment, and the one way a script is
//! sent on it.

use std::any::Any;

use futures_util::FutureExt;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};

use super::scripts::LuaScript;
use crate::error::{redis_error, Result};

/// The connection behind a [`RedisBackend`]. The usual kinds are variants,
/// so a call clones a handle and dispatches with a `match` — no allocation
/// and no virtual call per command; only a connection brought by the user
/// is boxed.
#[derive(Clone)]
pub(crate) enum Conn {
    /// What [`connect`](super::RedisBackend::connect) builds.
    Standalone(super::standalone::Standalone),
    Manager(ConnectionManager),
    Cluster(ClusterConnection),
    #[cfg(feature = "sentinel")]
    Sentinel(super::sentinel::SentinelConnection),
    Other(Box<dyn DynConnection>),
}

/// A user's connection, boxed: `ConnectionLike` plus a clone into a box.
pub(crate) trait DynConnection: ConnectionLike + Send + Sync {
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
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Manager(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => async move {
                let mut attempt = 0;
                loop {
                    let reply = c.req_packed_command(cmd).await;
                    if !unsent(&reply) || attempt == UNSENT_RETRIES {
                        return reply;
                    }
                    attempt += 1;
                    tokio::time::sleep(unsent_backoff(attempt)).await;
                }
            }
            .boxed(),
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
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => async move {
                let mut attempt = 0;
                loop {
                    let replies = c.req_packed_commands(pipeline, offset, count).await;
                    let failed = replies.as_ref().err().is_some_and(unsent_error);
                    if !failed || attempt == UNSENT_RETRIES {
                        return replies;
                    }
                    attempt += 1;
                    tokio::time::sleep(unsent_backoff(attempt)).await;
                }
            }
            .boxed(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Other(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Manager(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.get_db(),
            Conn::Other(c) => c.get_db(),
        }
    }
}

/// How often a cluster command is sent again while its answer says it
/// never ran, and how long before each ([`unsent_backoff`]): about 1.3 s
/// in all, which the caller's own timeout usually cuts short.
const UNSENT_RETRIES: u32 = 10;

fn unsent_backoff(attempt: u32) -> std::time::Duration {
    std::time::Duration::from_millis((10u64 << attempt.min(5)).min(200))
}

/// Whether a cluster command's answer says the command never ran: a
/// redirection (`MOVED`, `ASK`), a cluster reconfiguring (`TRYAGAIN`,
/// `CLUSTERDOWN`, `MASTERDOWN`, a demoted node's `READONLY`), or no
/// connection to its node. Only such a command is sent again: the cluster
/// client is built to retry nothing itself, since it would also resend a
/// command whose connection dropped after the node ran it.
fn unsent(reply: &redis::RedisResult<Value>) -> bool {
    match reply {
        Err(e) => unsent_error(e),
        Ok(Value::ServerError(e)) => unsent_error(&redis::RedisError::from(e.clone())),
        Ok(_) => false,
    }
}

fn unsent_error(e: &redis::RedisError) -> bool {
    use ServerErrorKind as S;
    e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    S::Moved | S::Ask | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly
                )
        )
}

/// Whether `e` says the server is a replica now: `READONLY`, or, before
/// Redis 7, a script's "ERR Error running script …: -READONLY …".
pub(crate) fn demoted(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || (e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("-READONLY ")))
}

/// Whether a connection's answer says its server is a replica now. A
/// server's error comes back from a connection as a value
/// (`Value::ServerError`); only the command's caller turns it into `Err`.
pub(crate) fn demoted_reply(reply: &redis::RedisResult<Value>) -> bool {
    match reply {
        Err(e) => demoted(e),
        Ok(v) => demoted_value(v),
    }
}

/// [`demoted_reply`] for a pipeline's answers.
pub(crate) fn demoted_replies(replies: &redis::RedisResult<Vec<Value>>) -> bool {
    match replies {
        Err(e) => demoted(e),
        Ok(values) => values.iter().any(demoted_value),
    }
}

fn demoted_value(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if demoted(&redis::RedisError::from(e.clone())))
}

/// Takes `conn` out as a `T` if that is its type (a connection handed to
/// [`RedisBackend::from_connection`] that is one of the usual kinds gets
/// its own variant, unboxed).
pub(super) fn downcast<C: 'static, T: 'static>(conn: C) -> Result<T, C> {
    let mut slot = Some(conn);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>() {
        Some(t) => Ok(t.take().expect("just filled")),
        None => Err(slot.expect("not taken")),
    }
}

impl Conn {
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
    pub(crate) async fn invoke_raw(
        &self,
        script: &LuaScript,
        fill: impl Fn(&mut Cmd),
    ) -> redis::RedisResult<Value> {
        let mut conn = self.clone();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A demoted master says so as `READONLY`, or, before Redis 7, inside a
    /// script's error; other errors say nothing of it.
    #[test]
    fn a_demoted_master_is_seen_in_both_forms() {
        let plain = redis::RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(demoted(&plain));
        let wrapped = redis::RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "Error running script (call to f_0): @user_script:1: @user_script: 1: \
             -READONLY You can't write against a read only replica."
                .to_owned(),
        ));
        assert!(demoted(&wrapped));
        let other = redis::RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "user_script:1: attempt to perform arithmetic on a nil value",
        ));
        assert!(!demoted(&other));
    }

    /// A connection hands a server's error back as a value: that is where
    /// a demotion shows, alone or among a pipeline's answers.
    #[test]
    fn a_demotion_is_seen_in_a_reply_value() {
        let parse = |s: &str| redis::parse_redis_value(s.as_bytes()).unwrap();
        let readonly = parse("-READONLY You can't write against a read only replica.\r\n");
        assert!(matches!(readonly, Value::ServerError(_)));
        assert!(demoted_reply(&Ok(readonly.clone())));
        let other = parse("-ERR unknown command\r\n");
        assert!(!demoted_reply(&Ok(other.clone())));
        assert!(!demoted_reply(&Ok(Value::Okay)));
        assert!(demoted_replies(&Ok(vec![Value::Okay, readonly])));
        assert!(!demoted_replies(&Ok(vec![Value::Okay, other])));
    }

    #[test]
    fn downcast_takes_only_its_own_type() {
        assert_eq!(downcast::<u32, u32>(7), Ok(7));
        assert_eq!(downcast::<u32, u64>(7), Err(7));
    }
}
