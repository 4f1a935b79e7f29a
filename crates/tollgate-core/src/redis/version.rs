//! The oldest Redis tollgate's scripts run on, checked once per connection
//! setup (never per call): the scripts read `TIME` before they write, which
//! Redis replicates correctly only with script effects replication — the
//! default from Redis 5.0 (4.x replicates the script itself, and a replica
//! would re-run it with its own clock, or refuse the write).

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

/// Every `redis_version` in an `INFO` reply: one for a server, one per
/// primary for a cluster (whose client answers a map of node → text).
fn versions(value: &Value, out: &mut Vec<(u32, u32, u32)>) {
    match value {
        Value::BulkString(b) => {
            if let Some(v) = std::str::from_utf8(b).ok().and_then(parse_version) {
                out.push(v);
            }
        }
        Value::SimpleString(s) => out.extend(parse_version(s)),
        Value::VerbatimString { text, .. } => out.extend(parse_version(text)),
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|v| versions(v, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| versions(v, out)),
        _ => {}
    }
}

/// What is wrong with the servers behind an `INFO server` reply: `None` when
/// every version is supported (or none is reported: a Redis-compatible server
/// that names no version is given the benefit of the doubt, with a warning).
pub(crate) fn problem(reply: &Value) -> Option<String> {
    let mut found = Vec::new();
    versions(reply, &mut found);
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
        Err(e)
            if matches!(
                e.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::ResponseError | redis::ServerErrorKind::NoPerm
                )
            ) =>
        {
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
}
