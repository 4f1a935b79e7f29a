//! [`Standalone`]: the connection of [`RedisBackend::connect`]: a connection
//! manager, built anew once its server says it is a replica now.
//!
//! [`RedisBackend::connect`]: super::RedisBackend::connect

use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::demoted::{demoted, replies_say, reply_says};

/// A connection manager reconnects after a dropped connection, but not
/// after a `READONLY` reply: its socket is still open, to the demoted
/// master. A URL whose name moves to the promoted replica on failover (a
/// cloud "primary endpoint", a virtual IP) would stay on the replica and
/// fail every write. So such a reply replaces the manager with a new one,
/// which resolves the name again when it connects. The failed command
/// itself is not retried: the caller's failure policy sees that one error.
#[derive(Clone)]
pub(crate) struct Standalone {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    /// The manager, with its number: a request replaces only the manager
    /// it used (a late reply must not drop one built since).
    current: Mutex<(u64, ConnectionManager)>,
}

impl Standalone {
    pub(crate) fn new(client: redis::Client, manager: ConnectionManager) -> Self {
        Standalone {
            inner: Arc::new(Inner {
                client,
                current: Mutex::new((0, manager)),
            }),
        }
    }

    fn current(&self) -> (u64, ConnectionManager) {
        self.inner
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A new manager in place of manager `used`, connecting in the
    /// background (the next request waits for it, within its timeout).
    fn rebuild(&self, used: u64) {
        let mut current = self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.0 != used {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.inner.client.clone(), config()) {
            Ok(manager) => {
                tracing::warn!("Redis answered READONLY (a demoted master): reconnecting");
                *current = (used + 1, manager);
            }
            Err(e) => tracing::warn!(error = %e, "Redis answered READONLY; could not reconnect"),
        }
    }
}

impl ConnectionLike for Standalone {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        async move {
            let (used, mut conn) = self.current();
            let result = conn.req_packed_command(cmd).await;
            if reply_says(&result, demoted) {
                self.rebuild(used);
            }
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
            let (used, mut conn) = self.current();
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            if replies_say(&result, demoted) {
                self.rebuild(used);
            }
            result
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.current().1.get_db()
    }
}

/// A connection manager's settings: replies awaited as long as a late one
/// is still given back. redis-rs's default (500 ms) would cut every call
/// short there, whatever timeout its caller was configured with (a
/// limiter's, a lock's, an admin action's 5 s), and drop the late replies
/// that give back what a call nobody waits for took.
pub(super) fn config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new().set_response_timeout(Some(super::unclaimed::KEPT_AT_MOST))
}
