//! What tollgate needs of a server, checked once per connection setup (never
//! per call):
//!
//! - the oldest Redis its scripts run on: they read `TIME` before they
//!   write, which Redis replicates correctly only with script effects
//!   replication — the default from Redis 5.0 (4.x replicates the script
//!   itself, and a replica would re-run it with its own clock, or refuse the
//!   write);
//! - no eviction: under any `maxmemory-policy` but `noeviction` (every
//!   tollgate key has a TTL, so `volatile-*` too) Redis may drop a live
//!   lock, permit holder, idempotency record or rate-limit state under
//!   memory pressure. That is a warning, not a refusal: with memory to
//!   spare nothing is evicted, and many deployments share one policy.

use redis::aio::ConnectionLike;
use redis::Value;

/// The oldest supported Redis: (major, minor).
pub(crate) const MIN_REDIS: (u32, u32) = (5, 0);

/// The `redis_version` of an `INFO server` text: (major, minor, patch).
pub(crate) fn parse_version(info: &str) -> Option<(u32, u32, u32)> {
    let line = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("redis_version:"))?;
    let mut parts = line.trim().splitn(3, '.');
    let mut next = || -> Option<u32> {
        let p = parts.next()?;
        // A suffix (`7.2.4-rc1`) does not change the version's number.
        let digits = p.find(|c: char| !c.is_ascii_digit()).map_or(p, |i| &p[..i]);
        digits.parse().ok()
    };
    let major = next()?;
    Some((major, next().unwrap_or(0), next().unwrap_or(0)))
}

/// What is wrong with the servers behind an `INFO server` reply: `None` when
/// every version is supported (or none is reported: a Redis-compatible server
/// that names no version is given the benefit of the doubt, with a warning).
pub(crate) fn problem(reply: &Value) -> Option<String> {
    let mut reported = Vec::new();
    fields(reply, "redis_version", &mut reported);
    let found: Vec<(u32, u32, u32)> = reported
        .iter()
        .filter_map(|v| parse_version(&format!("redis_version:{v}")))
        .collect();
    if found.is_empty() {
        tracing::warn!("INFO server reports no redis_version; the Redis version is not checked");
        return None;
    }
    let oldest = found.into_iter().min()?;
    let (major, minor, patch) = oldest;
    ((major, minor) < MIN_REDIS).then(|| {
        format!(
            "Redis {major}.{minor}.{patch} is too old: tollgate needs Redis {}.{} or newer \
             (its scripts read TIME before writing, which needs script effects replication)",
            MIN_REDIS.0, MIN_REDIS.1
        )
    })
}

/// Every value of `field` in an `INFO` reply: one for a server, one per
/// primary for a cluster (whose client answers a map of node → text).
fn fields(value: &Value, field: &str, out: &mut Vec<String>) {
    let mut text = |t: &str| {
        let prefix = format!("{field}:");
        out.extend(
            t.lines()
                .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
                .map(|v| v.trim().to_owned()),
        );
    };
    match value {
        Value::BulkString(b) => {
            if let Ok(t) = std::str::from_utf8(b) {
                text(t);
            }
        }
        Value::SimpleString(s) => text(s),
        Value::VerbatimString { text: t, .. } => text(t),
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|v| fields(v, field, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| fields(v, field, out)),
        _ => {}
    }
}

/// The first `maxmemory_policy` of an `INFO memory` reply under which Redis
/// may evict tollgate's keys (any but `noeviction`), if any.
pub(crate) fn evicting_policy(reply: &Value) -> Option<String> {
    let mut found = Vec::new();
    fields(reply, "maxmemory_policy", &mut found);
    found.into_iter().find(|p| p != "noeviction")
}

/// Asks `INFO memory` once: the server's eviction policy when it may evict
/// tollgate's keys; `None` for `noeviction`, or when `INFO` is refused.
pub(crate) async fn eviction<C: ConnectionLike>(
    conn: &mut C,
) -> redis::RedisResult<Option<String>> {
    match redis::cmd("INFO")
        .arg("memory")
        .query_async::<Value>(conn)
        .await
    {
        Ok(reply) => Ok(evicting_policy(&reply)),
        Err(e) if refused(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A managed Redis that renames `INFO`, or an ACL that forbids it.
fn refused(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Server(
            redis::ServerErrorKind::ResponseError | redis::ServerErrorKind::NoPerm
        )
    )
}

/// Asks `INFO server` once. `Ok(Some(message))` for a server too old for the
/// scripts. A server that refuses `INFO` (a managed Redis that renames it,
/// an ACL that forbids it) is not checked: a warning, and `Ok(None)`.
pub(crate) async fn check<C: ConnectionLike>(conn: &mut C) -> redis::RedisResult<Option<String>> {
    match redis::cmd("INFO")
        .arg("server")
        .query_async::<Value>(conn)
        .await
    {
        Ok(reply) => Ok(problem(&reply)),
        Err(e) if refused(&e) => {
            tracing::warn!(error = %e, "INFO server refused; the Redis version is not checked");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn versions_are_parsed_from_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(parse_version(info), Some((7, 0, 15)));
        assert_eq!(parse_version("redis_version:5.0.0\n"), Some((5, 0, 0)));
        assert_eq!(parse_version("redis_version:7.2.4-rc1"), Some((7, 2, 4)));
        assert_eq!(
            parse_version("redis_version:255.255.255"),
            Some((255, 255, 255))
        );
        assert_eq!(parse_version("redis_version:6"), Some((6, 0, 0)));
        assert_eq!(parse_version("redis_version:10.1"), Some((10, 1, 0)));
        // Valkey also reports the Redis version it is compatible with.
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n";
        assert_eq!(parse_version(valkey), Some((7, 2, 4)));
        assert_eq!(parse_version("# Server\r\nredis_mode:standalone\r\n"), None);
        assert_eq!(parse_version("redis_version:\r\n"), None);
        assert_eq!(parse_version("redis_version:x.1.2"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn only_servers_older_than_5_are_refused() {
        for ok in ["5.0.0", "5.0.14", "6.2.14", "7.0.15", "7.4.1", "8.0.0"] {
            assert_eq!(
                problem(&text(&format!("redis_version:{ok}\r\n"))),
                None,
                "{ok}"
            );
        }
        for old in ["4.0.14", "3.2.12", "2.8.24", "0.9.0"] {
            let p = problem(&text(&format!("redis_version:{old}\r\n"))).expect(old);
            assert!(p.contains(old) && p.contains("5.0 or newer"), "{p}");
        }
        // No version reported: not refused.
        assert_eq!(problem(&text("# Server\r\n")), None);
        assert_eq!(problem(&Value::Nil), None);
    }

    #[test]
    fn a_cluster_is_as_old_as_its_oldest_primary() {
        let node = |v: &str| text(&format!("# Server\r\nredis_version:{v}\r\n"));
        let map = |vs: &[&str]| {
            Value::Map(
                vs.iter()
                    .enumerate()
                    .map(|(i, v)| (text(&format!("127.0.0.1:{}", 7000 + i)), node(v)))
                    .collect(),
            )
        };
        assert_eq!(problem(&map(&["7.0.15", "7.0.15", "6.0.0"])), None);
        let p = problem(&map(&["7.0.15", "4.0.9", "7.0.15"])).unwrap();
        assert!(p.contains("4.0.9"), "{p}");
        let verbatim = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: "redis_version:4.0.0\r\n".into(),
        };
        assert!(problem(&verbatim).is_some());
        assert!(problem(&Value::Array(vec![node("7.0.0"), node("3.0.0")])).is_some());
    }

    #[test]
    fn only_noeviction_keeps_every_key() {
        let info = |p: &str| {
            text(&format!(
                "# Memory\r\nused_memory:1\r\nmaxmemory_policy:{p}\r\n"
            ))
        };
        assert_eq!(evicting_policy(&info("noeviction")), None);
        for p in [
            "allkeys-lru",
            "volatile-ttl",
            "volatile-lfu",
            "allkeys-random",
        ] {
            assert_eq!(evicting_policy(&info(p)).as_deref(), Some(p));
        }
        // A cluster: one evicting primary is enough.
        let cluster = Value::Map(vec![
            (text("a"), info("noeviction")),
            (text("b"), info("volatile-lru")),
        ]);
        assert_eq!(evicting_policy(&cluster).as_deref(), Some("volatile-lru"));
        assert_eq!(evicting_policy(&text("# Memory\r\n")), None, "not reported");
    }
}
