//! [`IdempotencyBackend`] for [`RedisBackend`]: `lua/idem_*.lua`; the
//! records in flight found as the holders are (`SCAN`, on every master of
//! a cluster), each read by `lua/idem_in_flight.lua`.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use redis::Value;

use super::holders::{page, scan, text, READS_IN_FLIGHT};
use super::pubsub::glob_escape;
use super::reply::{self, parse_flag, pttl};
use super::scripts::{IDEM_ABANDON, IDEM_CLAIM, IDEM_COMPLETE, IDEM_IN_FLIGHT};
use super::RedisBackend;
use crate::error::{Error, Result};
use crate::store::{
    millis_ceil, parse_record_key, ClaimReply, ClaimRequest, FencingToken, IdempotencyBackend,
    InFlightRecord, RecordKeys, StoredResponse,
};

/// An integer reply, or `None`.
fn int(value: &Value) -> Option<i64> {
    reply::int(value).ok()
}

fn protocol(what: &str, value: &Value) -> Error {
    Error::Protocol(format!("unexpected {what} reply {value:?}"))
}

fn bytes(value: &Value) -> Option<Option<&[u8]>> {
    match value {
        Value::BulkString(b) => Some(Some(b)),
        Value::Nil => Some(None),
        _ => None,
    }
}

fn parse_claim(value: Value) -> Result<ClaimReply> {
    let Value::Array(items) = &value else {
        return Err(protocol("claim", &value));
    };
    let bad = || protocol("claim", &value);
    match items.as_slice() {
        [flag, fence] if int(flag) == Some(1) => match int(fence) {
            Some(f) if f > 0 => Ok(ClaimReply::Claimed {
                fence: FencingToken(f as u64),
            }),
            _ => Err(bad()),
        },
        [flag, same, ms] if int(flag) == Some(0) => Ok(ClaimReply::InFlight {
            same_payload: int(same).ok_or_else(bad)? == 1,
            pttl: pttl(int(ms).ok_or_else(bad)?),
        }),
        [flag, same, rest @ ..] if int(flag) == Some(2) => {
            // Lua stops an array at its first nil: a missing field ends it.
            let field = |i: usize| rest.get(i).map_or(Some(None), bytes);
            let status = field(0)
                .flatten()
                .and_then(|s| std::str::from_utf8(s).ok()?.parse::<u16>().ok())
                .ok_or_else(bad)?;
            let (headers, trailers) = field(1)
                .ok_or_else(bad)?
                .map_or(
                    Some((Vec::new(), Vec::new())),
                    StoredResponse::decode_headers,
                )
                .ok_or_else(bad)?;
            let body = field(2).ok_or_else(bad)?.map(<[u8]>::to_vec);
            let replayable = field(3).ok_or_else(bad)? == Some(b"1".as_slice());
            Ok(ClaimReply::Completed {
                same_payload: int(same).ok_or_else(bad)? == 1,
                response: StoredResponse {
                    status,
                    headers,
                    body: if replayable {
                        Some(body.unwrap_or_default())
                    } else {
                        None
                    },
                    trailers,
                },
            })
        }
        _ => Err(bad()),
    }
}

/// Every record under `prefix` in flight now.
async fn in_flight(backend: &RedisBackend, prefix: &str) -> Result<Vec<InFlightRecord>> {
    let pattern = format!("{}:*}}:record", glob_escape(prefix));
    let keys = scan(backend, &pattern, |k| parse_record_key(prefix, k).is_some()).await?;
    let read: Vec<Option<InFlightRecord>> = futures_util::stream::iter(keys)
        .map(|key| async move { page(read_in_flight(backend, prefix, &key)).await })
        .buffer_unordered(READS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok(read.into_iter().flatten().collect())
}

/// The record `key`, if in flight.
async fn read_in_flight(
    backend: &RedisBackend,
    prefix: &str,
    key: &str,
) -> Result<Option<InFlightRecord>> {
    let Some((name, subject)) = parse_record_key(prefix, key) else {
        return Ok(None);
    };
    let lease = key.strip_suffix(":record").unwrap_or(key);
    let value = backend
        .invoke(&IDEM_IN_FLIGHT, |cmd| {
            cmd.arg(2).arg(lease).arg(key);
        })
        .await?;
    parse_in_flight(name, subject, &value)
}

fn parse_in_flight(name: &str, subject: &str, value: &Value) -> Result<Option<InFlightRecord>> {
    let bad = || protocol("in-flight", value);
    let Value::Array(items) = value else {
        return Err(bad());
    };
    match items.as_slice() {
        [flag] if int(flag) == Some(0) => Ok(None),
        [flag, now, fence, claimed, ms] if int(flag) == Some(1) => {
            let now = int(now)
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(bad)?;
            let fence = text(fence)
                .and_then(|f| f.parse::<u64>().ok())
                .ok_or_else(bad)?;
            let ms = int(ms)
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(bad)?;
            let mut record = InFlightRecord::new(name, subject, fence, Duration::from_millis(ms));
            // Empty: claimed by a version that did not store when.
            record.held = text(claimed)
                .and_then(|c| c.parse::<u64>().ok())
                .map(|since| Duration::from_micros(now.saturating_sub(since)));
            Ok(Some(record))
        }
        _ => Err(bad()),
    }
}

impl IdempotencyBackend for RedisBackend {
    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<ClaimReply>> {
        async move {
            let value = self
                .invoke(&IDEM_CLAIM, |cmd| {
                    cmd.arg(3)
                        .arg(req.keys.lease.lock.as_str())
                        .arg(req.keys.lease.fence.as_str())
                        .arg(req.keys.record.as_str())
                        .arg(req.token.as_str())
                        .arg(millis_ceil(req.ttl))
                        .arg(millis_ceil(req.fence_ttl))
                        .arg(millis_ceil(req.record_ttl))
                        .arg(req.fingerprint.to_hex());
                })
                .await?;
            parse_claim(value)
        }
        .boxed()
    }

    fn complete<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
        response: &'a StoredResponse,
        record_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        async move {
            let headers = response.encode_headers();
            let value = self
                .invoke(&IDEM_COMPLETE, |cmd| {
                    cmd.arg(2)
                        .arg(keys.lease.lock.as_str())
                        .arg(keys.record.as_str())
                        .arg(token)
                        .arg(fence.get())
                        .arg(response.status)
                        .arg(headers.as_slice())
                        .arg(response.body.as_deref().unwrap_or_default())
                        .arg(if response.body.is_some() { "1" } else { "0" })
                        .arg(millis_ceil(record_ttl))
                        .arg(keys.lease.channel.as_str());
                })
                .await?;
            parse_flag(value)
        }
        .boxed()
    }

    fn abandon<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<bool>> {
        async move {
            let value = self
                .invoke(&IDEM_ABANDON, |cmd| {
                    cmd.arg(2)
                        .arg(keys.lease.lock.as_str())
                        .arg(keys.record.as_str())
                        .arg(token)
                        .arg(fence.get())
                        .arg(keys.lease.channel.as_str());
                })
                .await?;
            parse_flag(value)
        }
        .boxed()
    }

    fn records_in_flight<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<InFlightRecord>>> {
        in_flight(self, prefix).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn in_flight_replies_are_read_strictly() {
        let reply = |claimed: &str| {
            Value::Array(vec![
                Value::Int(1),
                Value::Int(5_000_000),
                bulk("42"),
                bulk(claimed),
                Value::Int(900),
            ])
        };
        let r = parse_in_flight("idem", "k", &reply("2000000"))
            .unwrap()
            .unwrap();
        assert_eq!((r.name.as_str(), r.subject.as_str()), ("idem", "k"));
        assert_eq!(r.fence.get(), 42);
        assert_eq!(r.held, Some(Duration::from_secs(3)));
        assert_eq!(r.ttl, Duration::from_millis(900));
        let old = parse_in_flight("idem", "k", &reply("")).unwrap().unwrap();
        assert_eq!(old.held, None);
        let none = Value::Array(vec![Value::Int(0)]);
        assert_eq!(parse_in_flight("idem", "k", &none).unwrap(), None);
        assert!(parse_in_flight("idem", "k", &Value::Int(1)).is_err());
        let no_fence = Value::Array(vec![
            Value::Int(1),
            Value::Int(1),
            bulk("x"),
            bulk(""),
            Value::Int(1),
        ]);
        assert!(parse_in_flight("idem", "k", &no_fence).is_err());
    }
}
