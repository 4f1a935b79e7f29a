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

use super::conn::Conn;
use super::scripts::LuaScript;
use super::scripts::{ADMIN_ANNOUNCE, RATE_BLOCK_SET, RATE_RESET, RATE_UNBLOCK, THROTTLED_ADD};
use super::RedisBackend;
use crate::error::{redis_error, Error, Result};
use crate::store::{
    millis_ceil, AdminBackend, AdminListener, DenialCount, Listeners, EVERYTHING, VERSION_POLL,
};

/// Seconds of traffic counts per hash.
const TRAFFIC_BUCKET_SECONDS: u64 = 10;

/// The hash holding `second`'s traffic counts under `key`.
fn traffic_bucket(key: &str, second: u64) -> String {
    format!("{key}:{}", second / TRAFFIC_BUCKET_SECONDS)
}

/// How long a version stamp lives after its last change (an hour): a
/// watcher reading it back at 0 just keeps going.
const VERSION_TTL_MS: u64 = 3600 * 1000;

/// The listeners of each watched channel, shared by a backend's clones.
#[derive(Default)]
pub(crate) struct Watchers {
    channels: Mutex<HashMap<String, Channel>>,
}

/// One watched channel: its listeners, and whether a task watches it.
#[derive(Default)]
struct Channel {
    listeners: Listeners,
    running: bool,
}

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells every listener of `channel`, dropping those that are gone.
    fn tell(&self, channel: &str, message: &str) {
        let listeners = self
            .lock()
            .get(channel)
            .map(|c| c.listeners.snapshot())
            .unwrap_or_default();
        let gone: Vec<AdminListener> = listeners.into_iter().filter(|l| !l(message)).collect();
        if !gone.is_empty() {
            if let Some(c) = self.lock().get_mut(channel) {
                c.listeners.drop_gone(&gone);
            }
        }
    }
}

/// Marks a channel's watcher as stopped when its task ends, however it
/// ends (its runtime shutting down included): the next listener starts one.
struct Running {
    watchers: Weak<Watchers>,
    channel: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(w) = self.watchers.upgrade() {
            if let Some(c) = w.lock().get_mut(&self.channel) {
                c.running = false;
            }
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
            // One transaction: a connection cut between the two commands
            // must not leave the hash without its TTL.
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("HSET")
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

    fn reset<'a>(
        &'a self,
        keys: &'a [String],
        stamp: &'a str,
        now_micros: Option<u64>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            self.invoke(&RATE_RESET, |cmd| {
                cmd.arg(keys.len() + 1).arg(keys).arg(stamp);
                match now_micros {
                    Some(now) => cmd.arg(now),
                    None => cmd.arg(""),
                };
                cmd.arg(millis_ceil(ttl).max(1));
            })
            .await?;
            Ok(())
        }
        .boxed()
    }

    fn set_block<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        at_least: bool,
    ) -> BoxFuture<'a, Result<Duration>> {
        async move {
            let left = self
                .with_block_index(&RATE_BLOCK_SET, key, |cmd| {
                    let mode = if at_least { "1" } else { "0" };
                    cmd.arg(millis_ceil(ttl).max(1)).arg(mode);
                })
                .await?;
            match left {
                redis::Value::Int(ms) if ms > 0 => Ok(Duration::from_millis(ms as u64)),
                other => Err(Error::Protocol(format!("a block replied {other:?}"))),
            }
        }
        .boxed()
    }

    fn unblock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<()>> {
        async move {
            self.with_block_index(&RATE_UNBLOCK, key, |_| {}).await?;
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
            self.invoke(&ADMIN_ANNOUNCE, |cmd| {
                cmd.arg(1)
                    .arg(version_key)
                    .arg(channel)
                    .arg(message)
                    .arg(VERSION_TTL_MS);
            })
            .await?;
            // This process's limiters on this backend hear it now, not a
            // pub/sub round trip later (the echo is heard again: harmless).
            self.watchers.tell(channel, message);
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
        let mut channels = self.watchers.lock();
        let c = channels.entry(channel.to_owned()).or_default();
        c.listeners.add(listener);
        if c.running {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(channel, "no runtime to watch the admin channel on yet: the next limiter built on one starts the watcher");
            return;
        };
        c.running = true;
        drop(channels);
        let running = Running {
            watchers: Arc::downgrade(&self.watchers),
            channel: channel.to_owned(),
        };
        runtime.spawn(watch(
            self.clone_for_watch(),
            running,
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
            // One hash per ten seconds, each with its own TTL: a limiter that
            // never stops leaves no ever-growing key.
            let bucket = traffic_bucket(key, second);
            // One transaction, so no count is ever written without the TTL.
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("HINCRBY")
                .arg(&bucket)
                .arg(format!("{second}:a"))
                .arg(admitted)
                .ignore()
                .cmd("HINCRBY")
                .arg(&bucket)
                .arg(format!("{second}:r"))
                .arg(refused)
                .ignore()
                .cmd("PEXPIRE")
                .arg(&bucket)
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
            let mut out = Vec::new();
            let mut second = from;
            while second <= to.max(from) {
                // The seconds of one bucket, in one read.
                let last = (second / TRAFFIC_BUCKET_SECONDS + 1) * TRAFFIC_BUCKET_SECONDS - 1;
                let seconds: Vec<u64> = (second..=last.min(to.max(from))).collect();
                let fields: Vec<String> = seconds
                    .iter()
                    .flat_map(|s| [format!("{s}:a"), format!("{s}:r")])
                    .collect();
                let values: Vec<Option<u64>> = self
                    .query(
                        redis::cmd("HMGET")
                            .arg(traffic_bucket(key, second))
                            .arg(&fields),
                    )
                    .await?;
                for (s, v) in seconds.iter().zip(values.chunks(2)) {
                    let a = v[0].unwrap_or(0);
                    let r = v.get(1).copied().flatten().unwrap_or(0);
                    if a + r > 0 {
                        out.push((*s, a, r));
                    }
                }
                second = last + 1;
            }
            Ok(out)
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
                    // ZREVRANGE: Redis 5.0 has no ZRANGE … REV.
                    redis::cmd("ZREVRANGE")
                        .arg(key)
                        .arg(0)
                        .arg(n - 1)
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

/// Watches a channel for as long as the backend's clones live. Messages
/// carry the version stamp they set (`<version> <notice>`); a message of an
/// unexpected version, a stamp that moved without one, or a subscription
/// that was down makes the listeners forget everything (a message was
/// missed).
async fn watch(backend: RedisBackend, running: Running, version_key: String) {
    let (watchers, channel) = (running.watchers.clone(), running.channel.clone());
    let mut last = read_version(&backend, &version_key).await.unwrap_or(0);
    loop {
        let Some(nodes) = backend.pubsub_nodes().cloned() else {
            // No pub/sub connection to make: the stamp alone.
            while poll_once(&backend, &watchers, &channel, &version_key, &mut last).await {
                tokio::time::sleep(VERSION_POLL).await;
            }
            return;
        };
        let subscribed = async {
            let client = match backend.cluster_connection() {
                Some(mut conn) if nodes.follows_topology() => {
                    nodes.next_cluster_node(&mut conn).await
                }
                _ => nodes.next_seed(),
            };
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(channel.as_str()).await?;
            redis::RedisResult::Ok(pubsub.into_on_message())
        };
        // The stamp is read on its schedule while the subscription is made:
        // a node that takes its time to answer must not stretch how long a
        // missed message goes unnoticed.
        let subscribed = tokio::time::timeout(VERSION_POLL * 4, subscribed);
        tokio::pin!(subscribed);
        let mut polls = tokio::time::interval(VERSION_POLL);
        polls.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let subscribed = loop {
            tokio::select! {
                subscribed = &mut subscribed => break subscribed,
                _ = polls.tick() => {
                    if !poll_once(&backend, &watchers, &channel, &version_key, &mut last).await {
                        return;
                    }
                }
            }
        };
        // Subscribed or not, what happened meanwhile is unknown until read.
        if !poll_once(&backend, &watchers, &channel, &version_key, &mut last).await {
            return;
        }
        let Ok(Ok(mut messages)) = subscribed else {
            tokio::time::sleep(VERSION_POLL).await;
            continue;
        };
        let mut tick = tokio::time::interval(VERSION_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { break };
                    let Some(w) = watchers.upgrade() else { return };
                    let text: String = message.get_payload().unwrap_or_default();
                    // Not an announcement (someone else's message): ignored.
                    let Some((version, notice)) = text
                        .split_once(' ')
                        .and_then(|(v, n)| Some((v.parse::<u64>().ok()?, n)))
                    else {
                        continue;
                    };
                    if version != last + 1 {
                        w.tell(&channel, EVERYTHING);
                    }
                    last = version;
                    w.tell(&channel, notice);
                }
                _ = tick.tick() => {
                    if !poll_once(&backend, &watchers, &channel, &version_key, &mut last).await {
                        return;
                    }
                }
            }
        }
        // The subscription ended (its node went away): again, after a pause.
        tokio::time::sleep(VERSION_POLL).await;
    }
}

/// The stamp, bounded by a poll's interval (a hung connection holds up no
/// message).
async fn read_version(backend: &RedisBackend, version_key: &str) -> Option<u64> {
    tokio::time::timeout(VERSION_POLL, backend.version(version_key))
        .await
        .ok()?
        .ok()
}

/// Reads the stamp: any change from the last version known (a missed
/// message, or a stamp that expired or was lost) makes the listeners forget
/// everything. `false` when the backend is gone.
async fn poll_once(
    backend: &RedisBackend,
    watchers: &Weak<Watchers>,
    channel: &str,
    version_key: &str,
    last: &mut u64,
) -> bool {
    if watchers.strong_count() == 0 {
        return false;
    }
    let v = read_version(backend, version_key).await;
    let Some(w) = watchers.upgrade() else {
        return false;
    };
    if let Some(v) = v {
        if v != *last {
            w.tell(channel, EVERYTHING);
            *last = v;
        }
    }
    true
}

/// The block marker and block index of the limiter whose block key is
/// `block_key`: `<prefix>:<policy>:block:any` and `…:block:index` beside
/// `<prefix>:<policy>:block:{…}` (no key with a subject is without its
/// tag). The marker lives while any block of the limiter does; the index
/// holds each live block's end under its subject's tag. A batch of many
/// subjects reads the marker with its keys, and the index only while the
/// marker exists, not one block key each (`lua/rate_block_set.lua`,
/// `lua/rate_lean.lua`).
pub(crate) fn block_index(block_key: &str) -> Option<[String; 2]> {
    block_family(block_key).map(family_index)
}

/// [`block_index`] of a family ([`block_family`]) already found.
pub(crate) fn family_index(family: &str) -> [String; 2] {
    [[family, ":any"].concat(), [family, ":index"].concat()]
}

/// What comes before a block key's tag (its only brace): one limiter's
/// blocks share it.
pub(crate) fn block_family(block_key: &str) -> Option<&str> {
    // A byte scan: `str::find` sets up a two-way search per key.
    let at = block_key.as_bytes().windows(2).position(|w| w == b":{")?;
    Some(&block_key[..at])
}

/// Whether `block_key`'s family ([`block_family`]) is `family`.
pub(crate) fn in_block_family(block_key: &str, family: &str) -> bool {
    block_key.as_bytes().get(family.len()..family.len() + 2) == Some(b":{")
        && block_key.starts_with(family)
}

/// Whether `e` is a server's refusal of one call's keys in several slots.
fn across_slots(e: &Error) -> bool {
    let Error::Backend(b) = e else {
        return false;
    };
    std::error::Error::source(b)
        .and_then(|s| s.downcast_ref::<redis::RedisError>())
        .is_some_and(|r| r.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot))
}

impl RedisBackend {
    /// Runs a block script on `block_key` and, on one server, the limiter's
    /// block marker and index too. A cluster keeps no index (it would sit in another
    /// slot than the block: there a batch holds one subject, and reads its
    /// block key), nor does a server that refuses the pair (`CROSSSLOT`: a
    /// sharded proxy), which then gets batches of one tag too.
    async fn with_block_index(
        &self,
        script: &LuaScript,
        block_key: &str,
        args: impl Fn(&mut Cmd),
    ) -> Result<redis::Value> {
        let index = match self.conn {
            Conn::Cluster(_) => None,
            _ => block_index(block_key),
        };
        match self
            .block_call(script, block_key, index.as_ref(), &args)
            .await
        {
            Err(e) if index.is_some() && across_slots(&e) => {
                self.block_call(script, block_key, None, &args).await
            }
            other => other,
        }
    }

    async fn block_call(
        &self,
        script: &LuaScript,
        block_key: &str,
        index: Option<&[String; 2]>,
        args: &impl Fn(&mut Cmd),
    ) -> Result<redis::Value> {
        self.invoke(script, |cmd| {
            cmd.arg(1 + 2 * usize::from(index.is_some())).arg(block_key);
            if let Some([marker, index]) = index {
                cmd.arg(marker.as_str()).arg(index.as_str());
            }
            args(cmd);
        })
        .await
    }
}
