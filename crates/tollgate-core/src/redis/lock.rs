//! [`LockBackend`] for [`RedisBackend`]: one Lua script per operation.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};

use super::pubsub::glob_escape;
use super::reply::{parse_acquire, parse_flag};
use super::scripts::{LOCK_ACQUIRE, LOCK_EXTEND, LOCK_FENCE_RAISE, LOCK_RELEASE};
use super::RedisBackend;
use super::{holders, permits};
use crate::error::{redis_error, Result};
use crate::lock::RELEASE_MARKER_TTL;
use crate::store::{
    millis_ceil, AcquireReply, AcquireRequest, FencingToken, Holders, LockBackend, LockHolder,
    LockKeys, ReleaseEvent, ReleaseEvents,
};

impl LockBackend for RedisBackend {
    fn acquire_lock<'a>(&'a self, req: &'a AcquireRequest) -> BoxFuture<'a, Result<AcquireReply>> {
        if req.keys.holders != Holders::One {
            return permits::acquire(self, req).boxed();
        }
        async move {
            let value = self
                .invoke(&LOCK_ACQUIRE, |cmd| {
                    cmd.arg(2)
                        .arg(req.keys.lock.as_str())
                        .arg(req.keys.fence.as_str())
                        .arg(req.token.as_str())
                        .arg(millis_ceil(req.ttl))
                        .arg(millis_ceil(req.fence_ttl))
                        .arg(req.holder.as_str());
                })
                .await?;
            parse_acquire(value)
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, Result<bool>> {
        if keys.holders != Holders::One {
            return permits::release(self, keys, token).boxed();
        }
        async move {
            let marker = keys.release_marker(token);
            let value = self
                .invoke(&LOCK_RELEASE, |cmd| {
                    cmd.arg(2)
                        .arg(keys.lock.as_str())
                        .arg(marker.as_str())
                        .arg(token)
                        .arg(keys.channel.as_str())
                        .arg(millis_ceil(RELEASE_MARKER_TTL));
                })
                .await?;
            parse_flag(value)
        }
        .boxed()
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        if keys.holders != Holders::One {
            return permits::extend(self, keys, token, ttl).boxed();
        }
        async move {
            let value = self
                .invoke(&LOCK_EXTEND, |cmd| {
                    cmd.arg(1)
                        .arg(keys.lock.as_str())
                        .arg(token)
                        .arg(millis_ceil(ttl));
                })
                .await?;
            parse_flag(value)
        }
        .boxed()
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        async move {
            let value = self
                .invoke(&LOCK_FENCE_RAISE, |cmd| {
                    cmd.arg(2)
                        .arg(keys.lock.as_str())
                        .arg(keys.fence.as_str())
                        .arg(token)
                        .arg(fence.get())
                        .arg(millis_ceil(fence_ttl));
                })
                .await?;
            parse_flag(value)
        }
        .boxed()
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, Result<ReleaseEvents>>> {
        let nodes = std::sync::Arc::clone(self.pubsub_nodes()?);
        // A client given with `with_pubsub` is used as given.
        let cluster = nodes
            .follows_topology()
            .then(|| self.cluster_connection())
            .flatten();
        let pattern = format!("{}*", glob_escape(channel_prefix));
        Some(
            async move {
                // On a cluster, a live node of the current topology (the
                // last subscription's node may be the one that died).
                let client = match cluster {
                    Some(mut conn) => nodes.next_cluster_node(&mut conn).await,
                    None => nodes.next_seed(),
                };
                let mut pubsub = client.get_async_pubsub().await.map_err(redis_error)?;
                pubsub
                    .psubscribe(pattern.as_str())
                    .await
                    .map_err(redis_error)?;
                let events: ReleaseEvents = pubsub
                    .into_on_message()
                    .map(|msg| ReleaseEvent::Released {
                        channel: msg.get_channel_name().to_owned(),
                    })
                    .boxed();
                Ok(events)
            }
            .boxed(),
        )
    }

    fn permits_in_use<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        permits::in_use(self, keys).boxed()
    }

    fn lock_holders<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockHolder>>> {
        holders::list(self, prefix).boxed()
    }

    fn break_holders<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        holders::break_holders(self, keys).boxed()
    }

    fn local_lock(&self) -> std::sync::Arc<dyn LockBackend> {
        std::sync::Arc::new(crate::memory::MemoryBackend::new())
    }

    fn lock_kind(&self) -> &'static str {
        crate::store::RateBackend::kind(self)
    }

    fn lock_admin(&self) -> Option<std::sync::Arc<dyn crate::store::AdminBackend>> {
        Some(std::sync::Arc::new(self.clone()))
    }
}
