//! A lock backend that forwards to another and counts what a test waits
//! for. Shared by the lock tests of tollgate-core, tollgate-tower and
//! tollgate-axum (the latter two include this file by path).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use tollgate_core::lock::{AcquireReply, AcquireRequest, LockKeys, ReleaseEvents};
use tollgate_core::{FencingToken, LockBackend};

/// A backend that forwards to another and counts the acquires it answered
/// "held by someone else": a test waits for a waiter's refused attempt (the
/// waiter has then looked, found the name taken, and waits) instead of
/// sleeping and hoping it got that far. Clones share the count, so one count
/// can watch every instance of a Redlock. It also counts the release
/// subscriptions it handed out, so a test can wait until waiters are
/// notified rather than polling.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    inner: Arc<dyn LockBackend>,
    refused: Arc<tokio::sync::watch::Sender<u64>>,
    subscribed: Arc<tokio::sync::watch::Sender<u64>>,
    /// Release subscriptions started (counted when first polled, not when
    /// up: a backend's future that is made and dropped unpolled is none).
    asked: Arc<std::sync::atomic::AtomicU64>,
}

impl Watched {
    pub(crate) fn new(inner: Arc<dyn LockBackend>) -> Self {
        Watched {
            inner,
            refused: Arc::new(tokio::sync::watch::channel(0).0),
            subscribed: Arc::new(tokio::sync::watch::channel(0).0),
            asked: Arc::default(),
        }
    }

    /// Another backend counted with this one.
    pub(crate) fn also(&self, inner: Arc<dyn LockBackend>) -> Self {
        Watched {
            inner,
            refused: self.refused.clone(),
            subscribed: self.subscribed.clone(),
            asked: self.asked.clone(),
        }
    }

    /// Release subscriptions started so far.
    pub(crate) fn subscriptions_asked(&self) -> u64 {
        self.asked.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Acquires refused so far.
    pub(crate) fn refusals(&self) -> u64 {
        *self.refused.borrow()
    }

    /// Waits (up to 10 s) until at least `n` acquires were refused.
    pub(crate) async fn refused(&self, n: u64) {
        let mut rx = self.refused.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&c| c >= n))
            .await
            .unwrap_or_else(|_| panic!("{} acquires refused, not {n}", self.refusals()))
            .unwrap();
    }

    /// Waits (up to 10 s) until `n` release subscriptions were established.
    pub(crate) async fn subscribed(&self, n: u64) {
        let mut rx = self.subscribed.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&c| c >= n))
            .await
            .unwrap_or_else(|_| panic!("{} subscriptions, not {n}", *self.subscribed.borrow()))
            .unwrap();
    }
}

impl LockBackend for Watched {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, tollgate_core::Result<AcquireReply>> {
        async move {
            let reply = self.inner.acquire_lock(request).await;
            if let Ok(AcquireReply::Held { .. }) = reply {
                self.refused.send_modify(|c| *c += 1);
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
        self.inner.release_lock(keys, token)
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, tollgate_core::Result<bool>> {
        self.inner.extend_lock(keys, token, ttl)
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
        let connect = self.inner.release_events(channel_prefix)?;
        let asked = self.asked.clone();
        let subscribed = self.subscribed.clone();
        Some(
            async move {
                asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let events = connect.await?;
                subscribed.send_modify(|c| *c += 1);
                Ok(events)
            }
            .boxed(),
        )
    }

    fn permits_in_use<'a>(
        &'a self,
        keys: &'a LockKeys,
    ) -> BoxFuture<'a, tollgate_core::Result<u32>> {
        self.inner.permits_in_use(keys)
    }

    fn local_lock(&self) -> std::sync::Arc<dyn LockBackend> {
        self.inner.local_lock()
    }

    fn lock_kind(&self) -> &'static str {
        self.inner.lock_kind()
    }
}
