//! The Rust twin of `lua/lock_*.lua` for the memory store: the same
//! semantics as the scripts, timed by the store's clock.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::broadcast;

use super::state::{micros, Fence, Holder, MemoryLocks, State, Who};
use super::MemoryBackend;
use crate::error::Result;
use crate::lock::RELEASE_MARKER_TTL;
use crate::store::{
    AcquireReply, AcquireRequest, FencingToken, Holders, LockBackend, LockHolder, LockKeys,
    ReleaseEvent, ReleaseEvents,
};

impl MemoryLocks {
    pub(crate) fn acquire(&self, req: &AcquireRequest, now: u64) -> Result<AcquireReply> {
        let mut state = self.lock();
        Self::sweep(&mut state, now);
        Self::not_permits(&state, &req.keys.lock, now)?;
        if let Some(h) = Self::live(&mut state, &req.keys.lock, now) {
            if h.token != req.token {
                return Ok(AcquireReply::Held {
                    pttl: Some(Duration::from_micros(h.expires_at - now)),
                });
            }
            // A retried request finds its own lock (as the script does):
            // acquired, with the fence it got.
            if let Some(f) = state
                .fences
                .get(&req.keys.fence)
                .filter(|f| f.expires_at > now)
            {
                return Ok(AcquireReply::Acquired {
                    fence: FencingToken(f.value),
                });
            }
            let fence = Self::next_fence(&mut state, req, now);
            return Ok(AcquireReply::Acquired { fence });
        }
        let fence = Self::next_fence(&mut state, req, now);
        state.held.insert(
            req.keys.lock.clone(),
            Holder {
                token: req.token.clone(),
                expires_at: now.saturating_add(micros(req.ttl)),
                who: Some(Who {
                    fence: fence.get(),
                    since: now,
                    holder: req.holder.clone(),
                }),
            },
        );
        Ok(AcquireReply::Acquired { fence })
    }

    /// `max(previous + 1, now)`, stored in the fence key with its TTL.
    pub(crate) fn next_fence(state: &mut State, req: &AcquireRequest, now: u64) -> FencingToken {
        let prev = state
            .fences
            .get(&req.keys.fence)
            .filter(|f| f.expires_at > now)
            .map_or(0, |f| f.value);
        let fence = now.max(prev.saturating_add(1));
        state.fences.insert(
            req.keys.fence.clone(),
            Fence {
                value: fence,
                expires_at: now.saturating_add(micros(req.fence_ttl)),
            },
        );
        FencingToken(fence)
    }

    /// Compare-and-delete, idempotent per token (as `lock_release.lua`): a
    /// release leaves a marker, and a replay that finds it reports `true`.
    pub(crate) fn release(&self, keys: &LockKeys, token: &str, now: u64) -> Result<bool> {
        {
            let mut state = self.lock();
            Self::not_permits(&state, &keys.lock, now)?;
            match Self::live(&mut state, &keys.lock, now) {
                Some(h) if h.token == token => {
                    state.held.remove(&keys.lock);
                    Self::remember_release(&mut state, keys, token, now);
                }
                _ => return Ok(Self::released_by(&state, keys, token, now)),
            }
        }
        self.notify(&keys.channel);
        Ok(true)
    }

    /// Redis answers WRONGTYPE when a lock's script reads a name that holds
    /// permits (a fair and an unfair locker on one name): so does the twin,
    /// for every call of a lock.
    fn not_permits(state: &State, key: &str, now: u64) -> Result<()> {
        if Self::permits_key_exists(state, key, now) {
            return Err(crate::error::Error::Backend(
                crate::error::BackendError::new(format!(
                    "WRONGTYPE: {key} holds permits, not a lock"
                )),
            ));
        }
        Ok(())
    }

    /// Leaves the marker of `token`'s release of `keys` (`SET marker 1 PX`).
    pub(crate) fn remember_release(state: &mut State, keys: &LockKeys, token: &str, now: u64) {
        state.released.insert(
            keys.release_marker(token),
            now.saturating_add(micros(RELEASE_MARKER_TTL)),
        );
    }

    /// Whether `token` released `keys` less than [`RELEASE_MARKER_TTL`] ago
    /// (`EXISTS marker`).
    pub(crate) fn released_by(state: &State, keys: &LockKeys, token: &str, now: u64) -> bool {
        state
            .released
            .get(&keys.release_marker(token))
            .is_some_and(|expires_at| *expires_at > now)
    }

    /// Announces a release on `channel` (no subscriber is fine: nobody waits).
    pub(crate) fn notify(&self, channel: &str) {
        let _ = self.events.send(channel.to_owned());
    }

    pub(crate) fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl: Duration,
        now: u64,
    ) -> Result<bool> {
        let mut state = self.lock();
        Self::not_permits(&state, &keys.lock, now)?;
        match Self::live(&mut state, &keys.lock, now) {
            Some(h) if h.token == token => {
                h.expires_at = now.saturating_add(micros(ttl));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) fn raise_fence(
        &self,
        keys: &LockKeys,
        token: &str,
        fence: FencingToken,
        fence_ttl: Duration,
        now: u64,
    ) -> Result<bool> {
        let mut state = self.lock();
        Self::not_permits(&state, &keys.lock, now)?;
        if Self::live(&mut state, &keys.lock, now).is_none_or(|h| h.token != token) {
            return Ok(false);
        }
        let entry = state.fences.entry(keys.fence.clone()).or_insert(Fence {
            value: 0,
            expires_at: 0,
        });
        if entry.expires_at <= now {
            entry.value = 0;
        }
        if fence.get() > entry.value {
            entry.value = fence.get();
            entry.expires_at = now.saturating_add(micros(fence_ttl));
        }
        Ok(true)
    }

    /// Removes a lock whoever holds it; `true` when there was one.
    pub(crate) fn break_lock(&self, key: &str, now: u64) -> bool {
        let mut state = self.lock();
        Self::live(&mut state, key, now).is_some() && state.held.remove(key).is_some()
    }

    fn events(&self, channel_prefix: &str) -> ReleaseEvents {
        let rx = self.events.subscribe();
        let prefix = channel_prefix.to_owned();
        futures_util::stream::unfold(rx, |mut rx| async move {
            match rx.recv().await {
                Ok(channel) => Some((Some(ReleaseEvent::Released { channel }), rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    Some((Some(ReleaseEvent::Resync), rx))
                }
                Err(broadcast::error::RecvError::Closed) => None,
            }
        })
        .filter_map(move |event| {
            let keep = match &event {
                Some(ReleaseEvent::Released { channel }) => channel.starts_with(&prefix),
                Some(_) => true,
                None => false,
            };
            futures_util::future::ready(if keep { event } else { None })
        })
        .boxed()
    }
}

impl MemoryBackend {
    /// Removes the lock stored under `key` (a [`LockKeys::lock`] key), whoever
    /// holds it, like `DEL` on Redis: an operator's tool for a stuck holder,
    /// and a way for tests to take a lock away. The holder's lease is lost at
    /// its next renewal. Returns whether a live lock was removed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let locker = Locker::new(backend.clone());
    /// let lease = locker.try_acquire("jobs", &LockOptions::new()).await?;
    /// assert!(backend.break_lock(lease.key()));
    /// assert!(!lease.release().await?); // no longer ours
    /// # Ok(()) }
    /// ```
    pub fn break_lock(&self, key: &str) -> bool {
        self.locks().break_lock(key, self.clock().now_micros())
    }
}

impl LockBackend for MemoryBackend {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<AcquireReply>> {
        let (locks, now) = (self.locks(), self.clock().now_micros());
        let reply = match request.keys.holders {
            Holders::One => locks.acquire(request, now),
            _ => locks.acquire_permits(request, now),
        };
        futures_util::future::ready(reply).boxed()
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, Result<bool>> {
        let (locks, now) = (self.locks(), self.clock().now_micros());
        let ok = match keys.holders {
            Holders::One => locks.release(keys, token, now),
            _ => locks.release_permits(keys, token, now),
        };
        futures_util::future::ready(ok).boxed()
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        let (locks, now) = (self.locks(), self.clock().now_micros());
        let ok = match keys.holders {
            Holders::One => locks.extend(keys, token, ttl, now),
            _ => locks.extend_permits(keys, token, ttl, now),
        };
        futures_util::future::ready(ok).boxed()
    }

    fn permits_in_use<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        let n = self.locks().permits_in_use(keys, self.clock().now_micros());
        futures_util::future::ready(n).boxed()
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        let ok = self
            .locks()
            .raise_fence(keys, token, fence, fence_ttl, self.clock().now_micros());
        futures_util::future::ready(ok).boxed()
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, Result<ReleaseEvents>>> {
        let events = self.locks().events(channel_prefix);
        Some(futures_util::future::ready(Ok(events)).boxed())
    }

    fn lock_holders<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockHolder>>> {
        let holders = self.locks().holders(prefix, self.clock().now_micros());
        futures_util::future::ready(Ok(holders)).boxed()
    }

    fn break_holders<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        let n = self.locks().break_holders(keys, self.clock().now_micros());
        futures_util::future::ready(Ok(n)).boxed()
    }

    fn local_lock(&self) -> std::sync::Arc<dyn LockBackend> {
        std::sync::Arc::new(MemoryBackend::new())
    }

    fn lock_kind(&self) -> &'static str {
        "memory"
    }

    fn lock_admin(&self) -> Option<std::sync::Arc<dyn crate::store::AdminBackend>> {
        Some(std::sync::Arc::new(self.clone()))
    }
}
