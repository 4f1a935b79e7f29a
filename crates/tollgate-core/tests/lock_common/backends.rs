//! Backends that forward to another and watch or slow the traffic: the
//! memory backend recording its fair queues ([`Queues`]) and a slow network
//! ([`Delayed`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, ReleaseEvents};
use tollgate_core::{FencingToken, LockBackend, MemoryBackend};

/// The memory backend's fair queues as its callers saw them (it has no look
/// inside, where Redis has ZCARD): queue key → the tickets refused and not
/// yet admitted or withdrawn. A ticket that expires unrefreshed stays
/// counted.
fn memory_queues() -> std::sync::MutexGuard<'static, HashMap<String, HashSet<String>>> {
    static Q: std::sync::OnceLock<Mutex<HashMap<String, HashSet<String>>>> =
        std::sync::OnceLock::new();
    Q.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// How many tickets `queue` holds on the memory backend (see [`Queues`]).
pub(crate) fn memory_queue_len(queue: &str) -> u64 {
    memory_queues().get(queue).map_or(0, |q| q.len() as u64)
}

/// The memory backend, recording its fair queues ([`memory_queue_len`]).
#[derive(Debug)]
pub(super) struct Queues(pub(super) MemoryBackend);

impl LockBackend for Queues {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.0.acquire_lock(request).await;
            if let (Some((ticket, _)), Ok(r)) = (&request.ticket, &reply) {
                let mut queues = memory_queues();
                let queue = queues.entry(request.keys.queue()).or_default();
                match r {
                    AcquireReply::Held { .. } => {
                        queue.insert(ticket.clone());
                    }
                    _ => {
                        queue.remove(ticket);
                    }
                }
            }
            reply
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        async move {
            let released = self.0.release_lock(keys, token).await;
            if let Some(queue) = memory_queues().get_mut(&keys.queue()) {
                queue.remove(token);
            }
            released
        }
        .boxed()
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.0.extend_lock(keys, token, ttl)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.0.raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, tollgate_core::Result<ReleaseEvents>>> {
        self.0.release_events(channel_prefix)
    }

    fn permits_in_use<'a>(
        &'a self,
        keys: &'a LockKeys,
    ) -> BoxFuture<'a, tollgate_core::Result<u32>> {
        self.0.permits_in_use(keys)
    }

    fn local_lock(&self) -> std::sync::Arc<dyn LockBackend> {
        self.0.local_lock()
    }

    fn lock_kind(&self) -> &'static str {
        self.0.lock_kind()
    }
}

/// A backend that forwards to another, with a slow network: an acquire's
/// reply arrives `acquire_reply` after the acquire was applied, an
/// extension's `extend_reply` after it was applied, and a release is
/// applied only `release_send` after it was sent. A caller that gives up
/// in between has left its request on the backend.
#[derive(Debug)]
pub(crate) struct Delayed {
    pub(crate) inner: Arc<dyn LockBackend>,
    pub(crate) acquire_reply: Duration,
    pub(crate) extend_reply: Duration,
    pub(crate) release_send: Duration,
}

impl LockBackend for Delayed {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.inner.acquire_lock(request).await;
            tokio::time::sleep(self.acquire_reply).await;
            reply
        }
        .boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        async move {
            tokio::time::sleep(self.release_send).await;
            self.inner.release_lock(keys, token).await
        }
        .boxed()
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        async move {
            let reply = self.inner.extend_lock(keys, token, ttl).await;
            tokio::time::sleep(self.extend_reply).await;
            reply
        }
        .boxed()
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, tollgate_core::Result<ReleaseEvents>>> {
        self.inner.release_events(channel_prefix)
    }

    fn local_lock(&self) -> std::sync::Arc<dyn LockBackend> {
        self.inner.local_lock()
    }

    fn lock_kind(&self) -> &'static str {
        self.inner.lock_kind()
    }
}
