//! The connection behind a [`RedisBackend`](super::RedisBackend): one
//! cloneable handle whatever the deployment, and the one way a script is
//! sent on it.

use std::any::Any;
use std::cell::RefCell;

use futures_util::FutureExt;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};

use super::demoted::answer_error;
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
                    let mut reply = c.req_packed_command(cmd).await;
                    // A key of a slot on the move: asked of the node it
                    // moves to, as redis-rs would with retries left.
                    if let Some((host, port)) = asked_elsewhere(&reply) {
                        reply = ask(c, cmd, host, port).await;
                    }
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

/// The node an `ASK` answer names (`host`, `port`): the command's slot is
/// moving there and its keys are not here (the command did not run).
fn asked_elsewhere(reply: &redis::RedisResult<Value>) -> Option<(String, u16)> {
    let e = answer_error(reply)?;
    if e.kind() != ErrorKind::Server(ServerErrorKind::Ask) {
        return None;
    }
    let (addr, _slot) = e.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// `cmd` sent to the node an `ASK` named, after `ASKING` on the same
/// connection (what lets that node serve a slot it is still importing).
async fn ask(
    c: &mut ClusterConnection,
    cmd: &Cmd,
    host: String,
    port: u16,
) -> redis::RedisResult<Value> {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    let node = SingleNodeRoutingInfo::ByAddress { host, port };
    let mut replies = c.route_pipeline(pipe, 1, 1, node).await?;
    replies
        .pop()
        .ok_or_else(|| redis::RedisError::from((ErrorKind::Client, "ASK: no reply from the node")))
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
    answer_error(reply).is_some_and(|e| unsent_error(&e))
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
        let mut cmd = spare_command();
        cmd.arg("EVALSHA").arg(script.sha.as_str());
        fill(&mut cmd);
        let reply = match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                cmd.clear();
                cmd.arg("EVAL").arg(script.body);
                fill(&mut cmd);
                cmd.query_async::<Value>(&mut conn).await
            }
            other => other,
        };
        give_back_command(cmd);
        reply
    }
}

/// The most arguments, and bytes of them, a command kept for the next call
/// may have held: a thread keeps no more than an ordinary batch's buffers,
/// never those of a stored response body.
const SPARE_COMMAND_ARGS: usize = 1024;
const SPARE_COMMAND_BYTES: usize = 64 * 1024;

thread_local! {
    /// This thread's spare command: a script call writes its arguments
    /// into the buffers an earlier call grew, so a batch's dozens of
    /// arguments cost no reallocation as they are added.
    static COMMAND: RefCell<Option<Cmd>> = const { RefCell::new(None) };
}

/// This thread's spare command (empty), or a new one.
fn spare_command() -> Cmd {
    COMMAND
        .try_with(|c| c.try_borrow_mut().ok()?.take())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps `cmd`'s buffers for the thread's next call, unless it has a
/// spare already or `cmd` was an outsized one.
fn give_back_command(mut cmd: Cmd) {
    if !worth_keeping(&cmd) {
        return;
    }
    cmd.clear();
    let _ = COMMAND.try_with(|c| {
        if let Ok(mut spare) = c.try_borrow_mut() {
            spare.get_or_insert(cmd);
        }
    });
}

fn worth_keeping(cmd: &Cmd) -> bool {
    let args = cmd.args_iter();
    let bytes = |arg| match arg {
        redis::Arg::Simple(bytes) => <[u8]>::len(bytes),
        _ => 0,
    };
    args.len() <= SPARE_COMMAND_ARGS && args.map(bytes).sum::<usize>() <= SPARE_COMMAND_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downcast_takes_only_its_own_type() {
        assert_eq!(downcast::<u32, u32>(7), Ok(7));
        assert_eq!(downcast::<u32, u64>(7), Err(7));
    }

    #[test]
    fn a_spare_command_comes_back_empty_and_an_outsized_one_is_not_kept() {
        let mut cmd = spare_command();
        cmd.arg("EVALSHA").arg("abc").arg(7);
        give_back_command(cmd);
        assert_eq!(spare_command().args_iter().len(), 0, "a spare starts empty");

        let mut batch = Cmd::new();
        batch.arg("EVALSHA").arg([7u8; 64].as_slice());
        assert!(worth_keeping(&batch));
        let mut body = Cmd::new();
        body.arg(vec![0u8; SPARE_COMMAND_BYTES + 1]);
        assert!(!worth_keeping(&body), "a body's buffer is not kept");
        let mut many = Cmd::new();
        for i in 0..=SPARE_COMMAND_ARGS {
            many.arg(i);
        }
        assert!(!worth_keeping(&many));
    }
}
