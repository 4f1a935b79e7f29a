//! Waiters of one `Locker`: one release subscription per backend instance,
//! shared by all waiters, started lazily and stopped with the `Locker`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::futures::Notified;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::util::unit_random;
use crate::store::{LockBackend, ReleaseEvent};

/// First pause after a failed subscription attempt; doubles up to the max.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

pub(crate) struct Waiters {
    shared: Arc<Shared>,
    channel_prefix: String,
    /// The subscription tasks; `None` until the first wait.
    tasks: Mutex<Option<Vec<JoinHandle<()>>>>,
    /// Dropped with the `Locker`: every subscription task then ends.
    shutdown: watch::Sender<()>,
}

/// The waiters of one channel in this `Locker`.
#[derive(Default)]
struct Slot {
    notify: Notify,
    /// Registered waiters that take more than one permit.
    heavy: AtomicUsize,
}

#[derive(Default)]
struct Shared {
    /// Release channel → the waiters of that lock in this `Locker`.
    map: Mutex<HashMap<String, Arc<Slot>>>,
    /// Subscriptions currently established.
    live: AtomicUsize,
    /// A release wakes every waiter of its channel, not one (fair names:
    /// only the head of the queue may take it, and it may be any of them).
    broadcast: bool,
}

impl Shared {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self, channel: &str) {
        if let Some(slot) = self.map().get(channel) {
            // A wake-one could pick a waiter the freed permits do not fit
            // (weight 3, one free) while one they fit sleeps on: wake them all.
            if self.broadcast || slot.heavy.load(Ordering::Acquire) > 0 {
                slot.notify.notify_waiters();
            } else {
                slot.notify.notify_one();
            }
        }
    }

    fn wake_all(&self) {
        for slot in self.map().values() {
            slot.notify.notify_waiters();
        }
    }
}

/// Counts a subscription as live while it exists.
struct LiveGuard(Arc<Shared>);

impl LiveGuard {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.live.fetch_add(1, Ordering::AcqRel);
        LiveGuard(shared.clone())
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
        // Notifications may be missed from now on: let everyone look again.
        self.0.wake_all();
    }
}

impl Waiters {
    pub(crate) fn new(channel_prefix: String, broadcast: bool) -> Self {
        Waiters {
            shared: Arc::new(Shared {
                broadcast,
                ..Shared::default()
            }),
            channel_prefix,
            tasks: Mutex::new(None),
            shutdown: watch::channel(()).0,
        }
    }

    /// Starts one subscription task per backend that can notify, on the
    /// current runtime: once, and again only if the runtime they ran on has
    /// shut down since.
    pub(crate) fn start(&self, backends: &[Arc<dyn LockBackend>], timeout: Duration) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = tasks.as_ref() {
            if running.is_empty() || running.iter().any(|t| !t.is_finished()) {
                return;
            }
        }
        let spawned = backends
            .iter()
            .filter(|b| b.release_events(&self.channel_prefix).is_some())
            .map(|backend| {
                tokio::spawn(subscription(
                    backend.clone(),
                    self.channel_prefix.clone(),
                    self.shared.clone(),
                    self.shutdown.subscribe(),
                    timeout.max(Duration::from_millis(500)),
                ))
            })
            .collect();
        *tasks = Some(spawned);
    }

    /// Whether at least one subscription is established (waiters may then
    /// poll rarely).
    pub(crate) fn live(&self) -> bool {
        self.shared.live.load(Ordering::Acquire) > 0
    }

    /// Wakes the waiters of `channel` in this `Locker` that a release may
    /// serve: one while every waiter takes one permit, else all of them
    /// (each then looks, and those the free permits do not fit sleep on).
    pub(crate) fn wake(&self, channel: &str) {
        self.shared.wake(channel);
    }

    /// Passes a wake-up on to one waiter of `channel`: after an acquire
    /// that may have left permits. The release that freed them already woke
    /// every waiter a weighted one could need; waking all again from each
    /// acquire would cost every waiter an attempt per acquire.
    pub(crate) fn pass_on(&self, channel: &str) {
        if let Some(slot) = self.shared.map().get(channel) {
            slot.notify.notify_one();
        }
    }

    /// Registers interest in `channel`'s releases, for `weight` permits,
    /// until the `Waiter` drops.
    pub(crate) fn register(&self, channel: &str, weight: u32) -> Waiter {
        let heavy = weight > 1;
        let slot = {
            let mut map = self.shared.map();
            let slot = map.entry(channel.to_owned()).or_default().clone();
            if heavy {
                slot.heavy.fetch_add(1, Ordering::AcqRel);
            }
            slot
        };
        Waiter {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            slot,
            heavy,
        }
    }

    /// Number of lock names with registered waiters (for tests).
    #[cfg(test)]
    pub(crate) fn registered(&self) -> usize {
        self.shared.map().len()
    }
}

pub(crate) struct Waiter {
    shared: Arc<Shared>,
    channel: String,
    slot: Arc<Slot>,
    heavy: bool,
}

impl Waiter {
    /// A future that completes on the next wake-up; `enable` it before the
    /// attempt it follows, so a release in between is not missed.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.slot.notify.notified()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut map = self.shared.map();
        if self.heavy {
            self.slot.heavy.fetch_sub(1, Ordering::AcqRel);
        }
        // Clones are only made under the map's lock: 2 = the map's and ours.
        if Arc::strong_count(&self.slot) <= 2 {
            map.remove(&self.channel);
        }
    }
}

async fn subscription(
    backend: Arc<dyn LockBackend>,
    channel_prefix: String,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<()>,
    connect_timeout: Duration,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let Some(connect) = backend.release_events(&channel_prefix) else {
            return;
        };
        let connected = tokio::select! {
            _ = shutdown.changed() => return,
            r = tokio::time::timeout(connect_timeout, connect) => r,
        };
        match connected {
            Ok(Ok(mut events)) => {
                backoff = BACKOFF_MIN;
                let _live = LiveGuard::new(&shared);
                // Releases before the subscription was up were not seen.
                shared.wake_all();
                tracing::debug!(
                    backend = backend.lock_kind(),
                    "lock release subscription up"
                );
                loop {
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        event = events.next() => match event {
                            Some(ReleaseEvent::Released { channel }) => shared.wake(&channel),
                            Some(_) => shared.wake_all(),
                            None => break,
                        },
                    }
                }
                tracing::debug!(
                    backend = backend.lock_kind(),
                    "lock release subscription ended"
                );
            }
            Ok(Err(e)) => {
                tracing::debug!(backend = backend.lock_kind(), error = %e, "lock release subscription failed");
            }
            Err(_) => {
                tracing::debug!(
                    backend = backend.lock_kind(),
                    "lock release subscription timed out"
                );
            }
        }
        let pause = backoff.mul_f64(0.5 + 0.5 * unit_random());
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn registrations_are_removed_with_the_last_waiter() {
        let w = Waiters::new("p:lock:".into(), false);
        let a = w.register("p:lock:{a}:released", 1);
        let b = w.register("p:lock:{a}:released", 2);
        let c = w.register("p:lock:{c}:released", 1);
        assert_eq!(w.registered(), 2);
        drop(a);
        assert_eq!(w.registered(), 2);
        drop(b);
        assert_eq!(w.registered(), 1);
        drop(c);
        assert_eq!(w.registered(), 0);
    }

    #[tokio::test]
    async fn a_wake_before_the_wait_is_not_lost() {
        let w = Waiters::new("p:lock:".into(), false);
        let waiter = w.register("ch", 1);
        let notified = waiter.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        w.wake("ch");
        tokio::time::timeout(Duration::from_secs(1), notified)
            .await
            .unwrap();
        // Unknown channels are ignored.
        w.wake("other");
    }

    /// While a waiter of weight > 1 waits, a release wakes every waiter of
    /// its name (the freed permits may fit only a lighter one); otherwise
    /// one.
    #[tokio::test]
    async fn a_heavy_waiter_makes_a_wake_reach_everyone() {
        use futures_util::FutureExt;

        let w = Waiters::new("p:sem:".into(), false);
        // Which of `waiters` one wake of "ch" reaches.
        let woken = |waiters: &[&Waiter]| {
            let mut armed: Vec<_> = waiters.iter().map(|x| Box::pin(x.notified())).collect();
            for n in &mut armed {
                n.as_mut().enable();
            }
            w.wake("ch");
            armed
                .into_iter()
                .map(|n| n.now_or_never().is_some())
                .collect::<Vec<_>>()
        };
        let heavy = w.register("ch", 3);
        let light = w.register("ch", 1);
        assert_eq!(woken(&[&heavy, &light]), [true, true]);
        drop(heavy);
        let other = w.register("ch", 1);
        let woken = woken(&[&light, &other]);
        assert_eq!(woken, [true, false], "one wake-up, to the first in line");
    }
}
