//! The permit scripts on a [`RedisBackend`].

use redis::Value;

use super::reply::{parse_acquire, parse_flag};
use super::scripts::{PERMIT_ACQUIRE, PERMIT_COUNT, PERMIT_EXTEND, PERMIT_RELEASE};
use super::RedisBackend;
use crate::error::{Error, Result};
use crate::lock::RELEASE_MARKER_TTL;
use crate::store::{millis_ceil, shape, AcquireReply, AcquireRequest, LockKeys};

pub(crate) async fn acquire(backend: &RedisBackend, req: &AcquireRequest) -> Result<AcquireReply> {
    let (limit, weight, fair) = shape(&req.keys)?;
    let (queue, tickets) = (req.keys.queue(), req.keys.tickets());
    let holder = req.keys.holder_key(&req.token);
    let value = backend
        .invoke(&PERMIT_ACQUIRE, |cmd| {
            cmd.arg(if fair { 5 } else { 3 })
                .arg(req.keys.lock.as_str())
                .arg(req.keys.fence.as_str())
                .arg(holder.as_str());
            if fair {
                cmd.arg(queue.as_str()).arg(tickets.as_str());
            }
            cmd.arg(req.token.as_str())
                .arg(weight)
                .arg(limit)
                .arg(millis_ceil(req.ttl))
                .arg(millis_ceil(req.fence_ttl))
                .arg(req.holder.as_str());
            if fair {
                match &req.ticket {
                    Some((ticket, ttl)) => cmd.arg(ticket.as_str()).arg(millis_ceil(*ttl)),
                    None => cmd.arg("").arg(0),
                };
                cmd.arg(req.keys.channel.as_str());
            }
        })
        .await?;
    parse_acquire(value)
}

pub(crate) async fn release(backend: &RedisBackend, keys: &LockKeys, token: &str) -> Result<bool> {
    let (_, weight, fair) = shape(keys)?;
    let (queue, tickets) = (keys.queue(), keys.tickets());
    let marker = keys.release_marker(token);
    let holder = keys.holder_key(token);
    let value = backend
        .invoke(&PERMIT_RELEASE, |cmd| {
            cmd.arg(if fair { 5 } else { 3 })
                .arg(keys.lock.as_str())
                .arg(marker.as_str())
                .arg(holder.as_str());
            if fair {
                cmd.arg(queue.as_str()).arg(tickets.as_str());
            }
            cmd.arg(token)
                .arg(weight)
                .arg(keys.channel.as_str())
                .arg(millis_ceil(RELEASE_MARKER_TTL));
        })
        .await?;
    parse_flag(value)
}

pub(crate) async fn extend(
    backend: &RedisBackend,
    keys: &LockKeys,
    token: &str,
    ttl: std::time::Duration,
) -> Result<bool> {
    let (_, weight, _) = shape(keys)?;
    let holder = keys.holder_key(token);
    let value = backend
        .invoke(&PERMIT_EXTEND, |cmd| {
            cmd.arg(2)
                .arg(keys.lock.as_str())
                .arg(holder.as_str())
                .arg(token)
                .arg(weight)
                .arg(millis_ceil(ttl));
        })
        .await?;
    parse_flag(value)
}

pub(crate) async fn in_use(backend: &RedisBackend, keys: &LockKeys) -> Result<u32> {
    shape(keys)?;
    match backend
        .invoke(&PERMIT_COUNT, |cmd| {
            cmd.arg(1).arg(keys.lock.as_str());
        })
        .await?
    {
        Value::Int(n) if n >= 0 => Ok(u32::try_from(n).unwrap_or(u32::MAX)),
        other => Err(Error::Protocol(format!(
            "expected a permit count, got {other:?}"
        ))),
    }
}
