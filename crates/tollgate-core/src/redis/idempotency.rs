//! [`IdempotencyBackend`] for [`RedisBackend`]: `lua/idem_*.lua`.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use redis::Value;

use super::reply::{self, parse_flag, pttl};
use super::scripts::{IDEM_ABANDON, IDEM_CLAIM, IDEM_COMPLETE};
use super::RedisBackend;
use crate::error::{Error, Result};
use crate::store::{
    millis_ceil, ClaimReply, ClaimRequest, FencingToken, IdempotencyBackend, RecordKeys,
    StoredResponse,
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
            let headers = field(1)
                .ok_or_else(bad)?
                .map_or(Some(Vec::new()), StoredResponse::decode_headers)
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
                },
            })
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
}
