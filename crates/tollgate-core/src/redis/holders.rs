//! Who holds what on Redis, for operators: the lock and semaphore keys
//! under a prefix, found with `SCAN` (on every master of a cluster), each
//! read by `lua/lock_holders.lua`; and breaking a holder
//! (`lua/lock_break.lua`).
//!
//! A walk of the keyspace rather than an index kept by the acquire scripts:
//! an index under the prefix would live in a slot of its own, which a
//! script running in the subject's slot cannot write on a cluster, so it
//! would cost every acquire and release a second round trip and could
//! disagree with the holders. The walk costs nothing until an operator asks.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use super::pubsub::glob_escape;
use super::reply::int;
use super::scripts::{LOCK_BREAK, LOCK_HOLDERS};
use super::RedisBackend;
use crate::error::{redis_error, within, Error, Result};
use crate::store::{parse_description, parse_lock_key, LockHolder, LockKeys, ACTION_TIMEOUT};

/// Keys asked for per `SCAN` call.
const SCAN_COUNT: u64 = 1000;

/// How many names are read at once.
pub(super) const READS_IN_FLIGHT: usize = 16;

/// Every described holder of a lock or permits under `prefix`.
pub(super) async fn list(backend: &RedisBackend, prefix: &str) -> Result<Vec<LockHolder>> {
    // Lock and semaphore keys end with their hash tag; the rest is told
    // apart by `parse_lock_key`.
    let pattern = format!("{}:*}}", glob_escape(prefix));
    let keys = scan(backend, &pattern, |k| parse_lock_key(prefix, k).is_some()).await?;
    let read: Vec<Vec<LockHolder>> = futures_util::stream::iter(keys)
        .map(|key| async move { page(read(backend, prefix, &key)).await })
        .buffer_unordered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(read.into_iter().flatten().collect())
}

/// Removes whoever holds `keys`; how many holders went.
pub(super) async fn break_holders(backend: &RedisBackend, keys: &LockKeys) -> Result<u32> {
    let value = backend
        .invoke(&LOCK_BREAK, |cmd| {
            cmd.arg(1)
                .arg(keys.lock.as_str())
                .arg(keys.channel.as_str());
        })
        .await?;
    let n = int(&value)?;
    u32::try_from(n).map_err(|_| protocol(&value))
}

fn protocol(value: &Value) -> Error {
    Error::Protocol(format!("unexpected holders reply {value:?}"))
}

pub(super) fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// The holders of one lock or semaphore key.
async fn read(backend: &RedisBackend, prefix: &str, key: &str) -> Result<Vec<LockHolder>> {
    let Some((name, subject)) = parse_lock_key(prefix, key) else {
        return Ok(Vec::new());
    };
    let fence_key = format!("{key}:fence");
    let value = backend
        .invoke(&LOCK_HOLDERS, |cmd| {
            cmd.arg(2).arg(key).arg(fence_key.as_str());
        })
        .await?;
    let bad = || protocol(&value);
    let Value::Array(items) = &value else {
        return Err(bad());
    };
    let (kind, rest) = items.split_first().ok_or_else(bad)?;
    let kind = int(kind)?;
    if kind == 0 {
        return Ok(Vec::new());
    }
    let (now, rest) = rest.split_first().ok_or_else(bad)?;
    let now = u64::try_from(int(now)?).map_err(|_| bad())?;
    let held = |since_ms: u64| Duration::from_millis((now / 1000).saturating_sub(since_ms));
    match (kind, rest) {
        (1, [description, pttl, fence]) => {
            let description = text(description).ok_or_else(bad)?;
            // Not described: an idempotency record's lease (or a holder of
            // an older version); not listed.
            let Some((drawn, since, _, who)) = parse_description(description, false) else {
                return Ok(Vec::new());
            };
            // The fence key while it lives: a Redlock raises it above the
            // one this instance drew.
            let fence = text(fence).and_then(|f| f.parse().ok()).unwrap_or(drawn);
            let mut holder = LockHolder::new(name, subject, false, fence);
            holder.holder = who.to_owned();
            holder.held = held(since);
            holder.ttl = Duration::from_millis(u64::try_from(int(pttl)?).unwrap_or(0));
            Ok(vec![holder])
        }
        (2, pairs) if pairs.len() % 2 == 0 => pairs
            .chunks(2)
            .map(|pair| {
                let (fence, since, weight, who) = text(&pair[0])
                    .and_then(|d| parse_description(d, true))
                    .ok_or_else(bad)?;
                let expires = u64::try_from(int(&pair[1])?).map_err(|_| bad())?;
                let mut holder = LockHolder::new(name, subject, true, fence);
                holder.holder = who.to_owned();
                holder.weight = weight;
                holder.held = held(since);
                holder.ttl = Duration::from_micros(expires.saturating_sub(now));
                Ok(holder)
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// The keys matching `pattern` that `keep` accepts: `SCAN` on the server,
/// or on every master of a cluster. Each page is filtered as it comes, so a
/// walk past millions of other keys under the prefix (rate limits, blocks)
/// holds only the keys it will read. A key moved between masters while the
/// walk runs (resharding) may be missed or seen twice (it is kept once).
pub(super) async fn scan(
    backend: &RedisBackend,
    pattern: &str,
    keep: impl Fn(&str) -> bool,
) -> Result<BTreeSet<String>> {
    let mut keys = BTreeSet::new();
    match backend.cluster_connection() {
        Some(mut conn) => {
            for (host, port) in page(masters(&mut conn)).await? {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port,
                });
                let mut cursor = 0u64;
                loop {
                    let call = conn.route_command(scan_cmd(cursor, pattern), routing.clone());
                    let reply = page(async { call.await.map_err(redis_error) }).await?;
                    cursor = scan_page(reply, &mut keys, &keep)?;
                    if cursor == 0 {
                        break;
                    }
                }
            }
        }
        None => {
            let mut conn = backend.conn.clone();
            let mut cursor = 0u64;
            loop {
                let cmd = scan_cmd(cursor, pattern);
                let call = cmd.query_async::<Value>(&mut conn);
                let reply = page(async { call.await.map_err(redis_error) }).await?;
                cursor = scan_page(reply, &mut keys, &keep)?;
                if cursor == 0 {
                    break;
                }
            }
        }
    }
    Ok(keys)
}

/// One call of a walk (a page of keys, one key's read), bounded by the
/// action timeout: a walk over many keys may take long as a whole, but a
/// store that stopped answering fails it.
pub(super) async fn page<T>(call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    within(ACTION_TIMEOUT, call).await
}

fn scan_cmd(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    cmd
}

/// Adds one `SCAN` reply's keys to `keys`; the next cursor.
fn scan_page(
    reply: Value,
    keys: &mut BTreeSet<String>,
    keep: impl Fn(&str) -> bool,
) -> Result<u64> {
    let bad = || Error::Protocol(format!("unexpected SCAN reply {reply:?}"));
    let Value::Array(parts) = &reply else {
        return Err(bad());
    };
    let [cursor, Value::Array(page)] = parts.as_slice() else {
        return Err(bad());
    };
    let cursor = text(cursor).and_then(|c| c.parse().ok()).ok_or_else(bad)?;
    // Keys that are not UTF-8 are no lock's.
    keys.extend(
        page.iter()
            .filter_map(text)
            .filter(|k| keep(k))
            .map(str::to_owned),
    );
    Ok(cursor)
}

/// `(host, port)` of every master, as the cluster's slot map names them
/// (the names the cluster connection routes by).
async fn masters(conn: &mut ClusterConnection) -> Result<Vec<(String, u16)>> {
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(redis_error)?;
    let bad = || Error::Protocol(format!("unexpected CLUSTER SLOTS reply {slots:?}"));
    let Value::Array(ranges) = &slots else {
        return Err(bad());
    };
    let mut masters = BTreeSet::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(bad());
        };
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err(bad());
        };
        let (Some(host), Some(port)) = (master.first().and_then(text), master.get(1)) else {
            return Err(bad());
        };
        let port = u16::try_from(int(port)?).map_err(|_| bad())?;
        masters.insert((host.to_owned(), port));
    }
    Ok(masters.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn scan_pages_are_read_strictly() {
        let mut keys = BTreeSet::new();
        let all = |_: &str| true;
        let page = Value::Array(vec![bulk("17"), Value::Array(vec![bulk("b"), bulk("a")])]);
        assert_eq!(scan_page(page, &mut keys, all).unwrap(), 17);
        assert_eq!(keys.iter().collect::<Vec<_>>(), ["a", "b"]);
        // Kept as the page comes: the others are never held.
        let page = Value::Array(vec![bulk("0"), Value::Array(vec![bulk("c"), bulk("dd")])]);
        assert_eq!(scan_page(page, &mut keys, |k| k.len() == 1).unwrap(), 0);
        assert_eq!(keys.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(scan_page(Value::Int(0), &mut keys, all).is_err());
        assert!(scan_page(
            Value::Array(vec![bulk("x"), Value::Array(vec![])]),
            &mut keys,
            all
        )
        .is_err());
    }
}
