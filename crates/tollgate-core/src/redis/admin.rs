//! The operator plane on Redis: [`AdminBackend`] for [`RedisBackend`].
//! Registry and throttled lists are plain keys; a block is set by a script
//! (its end on the server's clock, which the check scripts compare with);
//! the admin channel is pub/sub, backed by a version stamp each watcher
//! polls so that a lost message costs one poll's staleness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use redis::Cmd;

use super::scripts::{RATE_BLOCK_SET, THROTTLED_ADD};
use super::RedisBackend;
use crate::error::{redis_error, Result};
use crate::store::{
    millis_ceil, AdminBackend, AdminListener, DenialCount, EVERYTHING, VERSION_POLL,
};

/// How long a version stamp lives after its last change (an hour): a
/// watcher reading it back at 0 just keeps going.
const VERSION_TTL_MS: u64 = 3600 * 1000;

/// The listeners of each watched channel, shared by a backend's clones.
#[derive(Default)]
pub(crate) struct Watchers {
    channels: Mutex<HashMap<String, Vec<AdminListener>>>,
}

impl Watchers {
    fn listeners(&self, channel: &str) -> Vec<AdminListener> {
        self.channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(channel)
            .cloned()
            .unwrap_or_default()
    }

    fn tell(&self, channel: &str, message: &str) {
        for l in self.listeners(channel) {
            l(message);
        }
    }
}

impl RedisBackend {
    /// A clone for the watcher's task that does not keep the listeners
    /// alive: the task ends once every other clone is gone.
    fn clone_for_watch(&self) -> RedisBackend {
        RedisBackend {
            watchers: Arc::default(),
            ..self.clone()
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut conn = self.conn.clone();
        cmd.query_async(&mut conn).await.map_err(redis_error)
    }
}

impl AdminBackend for RedisBackend {
    fn register<'a>(
        &'a self,
        key: &'a str,
        field: &'a str,
        value: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            let mut pipe = redis::pipe();
            pipe.cmd("HSET")
                .arg(key)
                .arg(field)
                .arg(value)
                .ignore()
                .cmd("PEXPIRE")
                .arg(key)
                .arg(millis_ceil(ttl).max(1))
                .ignore();
            let mut conn = self.conn.clone();
            pipe.query_async::<()>(&mut conn)
                .await
                .map_err(redis_error)?;
            Ok(())
        }
        .boxed()
    }

    fn registered<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<(String, String)>>> {
        async move {
            let all: HashMap<String, String> = self.query(redis::cmd("HGETALL").arg(key)).await?;
            Ok(all.into_iter().collect())
        }
        .boxed()
    }

    fn delete<'a>(&'a self, keys: &'a [String]) -> BoxFuture<'a, Result<()>> {
        async move {
            if !keys.is_empty() {
                let _: i64 = self.query(redis::cmd("DEL").arg(keys)).await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn set_block<'a>(&'a self, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<()>> {
        async move {
            self.invoke(&RATE_BLOCK_SET, |cmd| {
                cmd.arg(1).arg(key).arg(millis_ceil(ttl).max(1));
            })
            .await?;
            Ok(())
        }
        .boxed()
    }

    fn unblock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<()>> {
        async move {
            let _: i64 = self.query(redis::cmd("DEL").arg(key)).await?;
            Ok(())
        }
        .boxed()
    }

    fn block_left<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Duration>>> {
        async move {
            let ms: i64 = self.query(redis::cmd("PTTL").arg(key)).await?;
            Ok((ms > 0).then(|| Duration::from_millis(ms as u64)))
        }
        .boxed()
    }

    fn announce<'a>(
        &'a self,
        channel: &'a str,
        version_key: &'a str,
        message: &'a str,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            // The stamp first: a watcher that polls between the two sees a
            // change it has no message for, and forgets everything.
            let mut pipe = redis::pipe();
            pipe.cmd("INCR")
                .arg(version_key)
                .ignore()
                .cmd("PEXPIRE")
                .arg(version_key)
                .arg(VERSION_TTL_MS)
                .ignore();
            let mut conn = self.conn.clone();
            pipe.query_async::<()>(&mut conn)
                .await
                .map_err(redis_error)?;
            let _: i64 = self
                .query(redis::cmd("PUBLISH").arg(channel).arg(message))
                .await?;
            Ok(())
        }
        .boxed()
    }

    fn version<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64>> {
        async move {
            let v: Option<u64> = self.query(redis::cmd("GET").arg(key)).await?;
            Ok(v.unwrap_or(0))
        }
        .boxed()
    }

    fn watch(&self, channel: &str, version_key: &str, listener: AdminListener) {
        let first = {
            let mut channels = self
                .watchers
                .channels
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let list = channels.entry(channel.to_owned()).or_default();
            list.push(listener);
            list.len() == 1
        };
        if !first {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(channel, "no runtime to watch the admin channel on: admin actions reach this instance only through its own calls");
            return;
        };
        runtime.spawn(watch(
            self.clone_for_watch(),
            Arc::downgrade(&self.watchers),
            channel.to_owned(),
            version_key.to_owned(),
        ));
    }

    fn add_denials<'a>(
        &'a self,
        key: &'a str,
        counts: &'a [DenialCount],
        ttl: Duration,
        keep: usize,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            if counts.is_empty() {
                return Ok(());
            }
            self.invoke(&THROTTLED_ADD, |cmd| {
                cmd.arg(2)
                    .arg(key)
                    .arg(format!("{key}:details"))
                    .arg(millis_ceil(ttl).max(1))
                    .arg(keep.max(1));
                for c in counts {
                    cmd.arg(&c.subject)
                        .arg(c.denied)
                        .arg(c.last_denied_ms)
                        .arg(c.label.as_deref().unwrap_or(""));
                }
            })
            .await?;
            Ok(())
        }
        .boxed()
    }

    fn add_traffic<'a>(
        &'a self,
        key: &'a str,
        second: u64,
        admitted: u64,
        refused: u64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            let mut pipe = redis::pipe();
            pipe.cmd("HINCRBY")
                .arg(key)
                .arg(format!("{second}:a"))
                .arg(admitted)
                .ignore()
                .cmd("HINCRBY")
                .arg(key)
                .arg(format!("{second}:r"))
                .arg(refused)
                .ignore()
                .cmd("PEXPIRE")
                .arg(key)
                .arg(millis_ceil(ttl).max(1))
                .ignore();
            let mut conn = self.conn.clone();
            pipe.query_async::<()>(&mut conn)
                .await
                .map_err(redis_error)?;
            Ok(())
        }
        .boxed()
    }

    fn traffic<'a>(
        &'a self,
        key: &'a str,
        from: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<Vec<(u64, u64, u64)>>> {
        async move {
            let seconds: Vec<u64> = (from..=to.max(from)).collect();
            let fields: Vec<String> = seconds
                .iter()
                .flat_map(|s| [format!("{s}:a"), format!("{s}:r")])
                .collect();
            let values: Vec<Option<u64>> = self
                .query(redis::cmd("HMGET").arg(key).arg(&fields))
                .await?;
            Ok(seconds
                .iter()
                .zip(values.chunks(2))
                .filter_map(|(s, v)| {
                    let (a, r) = (v[0].unwrap_or(0), v.get(1).copied().flatten().unwrap_or(0));
                    (a + r > 0).then_some((*s, a, r))
                })
                .collect())
        }
        .boxed()
    }

    fn top_denials<'a>(
        &'a self,
        key: &'a str,
        n: usize,
    ) -> BoxFuture<'a, Result<Vec<DenialCount>>> {
        async move {
            if n == 0 {
                return Ok(Vec::new());
            }
            let top: Vec<(String, f64)> = self
                .query(
                    redis::cmd("ZRANGE")
                        .arg(key)
                        .arg(0)
                        .arg(n - 1)
                        .arg("REV")
                        .arg("WITHSCORES"),
                )
                .await?;
            if top.is_empty() {
                return Ok(Vec::new());
            }
            let details: Vec<Option<String>> = self
                .query(
                    redis::cmd("HMGET")
                        .arg(format!("{key}:details"))
                        .arg(top.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>()),
                )
                .await?;
            Ok(top
                .into_iter()
                .zip(details)
                .map(|((subject, denied), d)| {
                    let d = d.unwrap_or_default();
                    let (last, label) = d.split_once('|').unwrap_or((d.as_str(), ""));
                    DenialCount {
                        subject,
                        denied: denied as u64,
                        last_denied_ms: last.parse().unwrap_or(0),
                        label: (!label.is_empty()).then(|| label.to_owned()),
                    }
                })
                .collect())
        }
        .boxed()
    }
}

/// Watches `channel` for as long as the backend's clones live: its
/// messages go to the listeners; a version stamp that moved by more than
/// the messages heard (one was lost, or the subscription was down) makes
/// them forget everything.
async fn watch(
    backend: RedisBackend,
    watchers: Weak<Watchers>,
    channel: String,
    version_key: String,
) {
    let mut seen = backend.version(&version_key).await.unwrap_or(0);
    loop {
        let Some(nodes) = backend.pubsub_nodes().cloned() else {
            poll_only(&backend, &watchers, &channel, &version_key, &mut seen).await;
            return;
        };
        let client = match backend.cluster_connection() {
            Some(mut conn) if nodes.follows_topology() => nodes.next_cluster_node(&mut conn).await,
            _ => nodes.next_seed(),
        };
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(channel.as_str()).await?;
            redis::RedisResult::Ok(pubsub.into_on_message())
        };
        let mut messages = match tokio::time::timeout(VERSION_POLL * 4, subscribed).await {
            Ok(Ok(m)) => m,
            _ => {
                // Down: poll meanwhile, then try again.
                if !poll_once(&backend, &watchers, &channel, &version_key, &mut seen, 0).await {
                    return;
                }
                tokio::time::sleep(VERSION_POLL).await;
                continue;
            }
        };
        // Messages may have been missed while unsubscribed.
        let mut heard: u64 = 0;
        if !poll_once(
            &backend,
            &watchers,
            &channel,
            &version_key,
            &mut seen,
            u64::MAX,
        )
        .await
        {
            return;
        }
        let mut tick = tokio::time::interval(VERSION_POLL);
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { break };
                    let Some(w) = watchers.upgrade() else { return };
                    let text: String = message.get_payload().unwrap_or_default();
                    heard += 1;
                    w.tell(&channel, &text);
                }
                _ = tick.tick() => {
                    if !poll_once(&backend, &watchers, &channel, &version_key, &mut seen, heard).await {
                        return;
                    }
                    heard = 0;
                }
            }
        }
    }
}

/// Reads the stamp: when it moved by more than `heard` messages, the
/// listeners forget everything. `false` when the backend is gone.
async fn poll_once(
    backend: &RedisBackend,
    watchers: &Weak<Watchers>,
    channel: &str,
    version_key: &str,
    seen: &mut u64,
    heard: u64,
) -> bool {
    let Some(w) = watchers.upgrade() else {
        return false;
    };
    if let Ok(v) = backend.version(version_key).await {
        if v != *seen && v.saturating_sub(*seen) > heard {
            w.tell(channel, EVERYTHING);
        }
        *seen = v;
    }
    true
}

async fn poll_only(
    backend: &RedisBackend,
    watchers: &Weak<Watchers>,
    channel: &str,
    version_key: &str,
    seen: &mut u64,
) {
    while poll_once(backend, watchers, channel, version_key, seen, 0).await {
        tokio::time::sleep(VERSION_POLL).await;
    }
}
