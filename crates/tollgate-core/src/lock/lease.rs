//! [`Lease`]: a held lock, its watchdog, and [`LeaseLost`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::{FusedFuture, FutureExt, Shared};
use tokio::runtime::Handle;
use tokio::sync::{oneshot, Notify};

use super::instances::{Granted, Instances};
use super::options::LockOptions;
use super::util::instant_after;
use crate::error::Result;
use crate::store::{FencingToken, LockKeys};

const HELD: u8 = 0;
const RELEASED: u8 = 1;
const LOST: u8 = 2;

/// A held lock: its name, its [`FencingToken`], and whether it can still be
/// trusted.
///
/// While it is held, a watchdog renews it every TTL/3 (unless
/// [`LockOptions::renew`] is off). Its *safe deadline* is measured on the
/// OS's monotonic clock from before the acquire was sent, minus the
/// drift allowance; each successful renewal moves it. When the deadline
/// passes without a renewal (Redis down or paused, network cut), or a
/// renewal finds the lock is no longer ours (deleted, expired, taken), the
/// lease is *lost*: [`is_held`](Lease::is_held) turns false and
/// [`lost`](Lease::lost) resolves — before the lock can expire on the
/// backend, so the holder can stop in time.
///
/// Ownership is the lease's owner token, never a thread or a task: a lease can
/// move between tasks and threads, and only the lease can extend or release
/// its lock.
///
/// Dropping a lease releases it without blocking (on the tokio runtime it was
/// acquired on; without a runtime the lock simply expires at its TTL).
/// [`release`](Lease::release) does the same and reports whether the lock was
/// still ours; either way renewal stops at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::{LockOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let lease = locker
///     .try_acquire("nightly-report", &LockOptions::new().ttl(Duration::from_secs(5)))
///     .await?;
/// assert!(lease.is_held());
/// tokio::select! {
///     _ = lease.lost() => println!("lock lost: stop writing"),
///     _ = async { /* the protected work, sending lease.fence() along */ } => {}
/// }
/// assert!(lease.release().await?);
/// # Ok(()) }
/// ```
#[must_use = "dropping a Lease releases the lock at once"]
pub struct Lease {
    shared: Arc<LeaseShared>,
}

/// Resolves once a [`Lease`] can no longer be trusted: it was lost (renewal
/// failed until the safe deadline, or the lock was taken away), released, or
/// dropped. [`Lease::is_lost`] tells loss from release.
///
/// Cheap to clone; every clone resolves, and polling it again after it
/// resolved resolves again at once (it is a [`FusedFuture`]). Hand it to the
/// protected work and `select!` on it to stop in time.
#[derive(Clone)]
pub struct LeaseLost {
    /// `None` once resolved.
    inner: Option<Shared<oneshot::Receiver<()>>>,
}

impl fmt::Debug for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resolved = self.inner.as_ref().is_none_or(|s| s.peek().is_some());
        f.debug_struct("LeaseLost")
            .field("resolved", &resolved)
            .finish()
    }
}

impl Future for LeaseLost {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(());
        };
        // Sent on loss or release; the sender dropped with the lease: both end
        // the lease's trust.
        match inner.poll_unpin(cx) {
            Poll::Ready(_) => {
                self.inner = None;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl FusedFuture for LeaseLost {
    // Never terminated in the sense of "must not be polled": it can always be
    // polled and resolves at once after the first time.
    fn is_terminated(&self) -> bool {
        false
    }
}

struct Timing {
    /// The safe deadline (local monotonic clock).
    deadline: Instant,
    /// The TTL renewals use.
    ttl: Duration,
    /// When the last successful acquire or renewal was sent.
    renewed_at: Instant,
}

pub(crate) struct LeaseShared {
    instances: Arc<Instances>,
    name: String,
    keys: LockKeys,
    token: String,
    fence: FencingToken,
    hold_until: Option<Instant>,
    /// When the acquire that granted it was sent.
    acquired_at: Instant,
    status: AtomicU8,
    timing: Mutex<Timing>,
    /// Serializes renewals and extends.
    op: tokio::sync::Mutex<()>,
    /// Wakes the watchdog: released, or the timing changed.
    changed: Notify,
    signal: Mutex<Option<oneshot::Sender<()>>>,
    lost: Shared<oneshot::Receiver<()>>,
    handle: Handle,
}

enum Renewal {
    Renewed,
    Failed,
    CapReached,
    Stop,
}

impl LeaseShared {
    fn status(&self) -> u8 {
        self.status.load(Ordering::Acquire)
    }

    fn timing(&self) -> MutexGuard<'_, Timing> {
        self.timing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fire(&self) {
        let tx = self.signal.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(());
        }
        self.changed.notify_one();
    }

    /// Held or lost → released. `false` when it already was.
    fn mark_released(&self) -> bool {
        let was = self.status.swap(RELEASED, Ordering::AcqRel);
        if was == RELEASED {
            return false;
        }
        if was == HELD {
            let held = self.acquired_at.elapsed();
            self.instances.hold_times.record(&self.keys.lock, held);
        }
        self.fire();
        true
    }

    /// Held → lost.
    fn mark_lost(&self, why: &str) {
        if self
            .status
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::warn!(lock = %self.keys.lock, fence = self.fence.get(), why, "lease lost");
            self.fire();
        }
    }

    /// `ttl` cut to the max-hold cap; `None` when the cap leaves nothing.
    fn capped(&self, ttl: Duration, at: Instant) -> Option<Duration> {
        let ttl = match self.hold_until {
            Some(cap) => ttl.min(cap.saturating_duration_since(at)),
            None => ttl,
        };
        (ttl >= Duration::from_millis(1) && !self.instances.validity(ttl).is_zero()).then_some(ttl)
    }

    async fn renew(&self) -> Renewal {
        let deadline = self.timing().deadline;
        // Never wait past the deadline, even behind a slow extend().
        let Ok(_op) = tokio::time::timeout_at(deadline.into(), self.op.lock()).await else {
            return Renewal::Failed;
        };
        if self.status() != HELD {
            return Renewal::Stop;
        }
        let (ttl, deadline) = {
            let t = self.timing();
            (t.ttl, t.deadline)
        };
        let sent = Instant::now();
        let Some(applied) = self.capped(ttl, sent) else {
            return Renewal::CapReached;
        };
        let bound = self
            .instances
            .timeout
            .min(deadline.saturating_duration_since(sent));
        match self
            .instances
            .extend(&self.keys, &self.token, applied, bound)
            .await
        {
            Ok(true) => {
                let mut t = self.timing();
                t.deadline = instant_after(sent, self.instances.validity(applied));
                t.renewed_at = sent;
                Renewal::Renewed
            }
            Ok(false) => {
                self.mark_lost("the lock is no longer ours");
                Renewal::Stop
            }
            Err(e) => {
                tracing::debug!(lock = %self.keys.lock, error = %e, "lease renewal failed; retrying until the safe deadline");
                Renewal::Failed
            }
        }
    }

    /// The release round trip(s), in a task of their own (on the current
    /// runtime, else the lease's): dropping `release()` mid-flight does not
    /// leave the lock held, no longer renewed, until its TTL.
    async fn release_remote(&self) -> Result<bool> {
        let handle = Handle::try_current().unwrap_or_else(|_| self.handle.clone());
        self.instances
            .release(&self.keys, &self.token, &handle)
            .await
    }
}

/// Renews every TTL/3, retries sooner after a failure, and declares the
/// lease lost at its safe deadline. Ends at release, drop or loss.
async fn watchdog(s: Arc<LeaseShared>, renew: bool) {
    let mut renew = renew;
    let mut capped = false;
    let mut retry_at: Option<Instant> = None;
    loop {
        let changed = s.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if s.status() != HELD {
            return;
        }
        let (deadline, ttl, renewed_at) = {
            let t = s.timing();
            (t.deadline, t.ttl, t.renewed_at)
        };
        if Instant::now() >= deadline {
            s.mark_lost(if capped {
                "the max_hold cap was reached (LockOptions::max_hold, unbounded_hold)"
            } else {
                "no renewal succeeded before the safe deadline"
            });
            return;
        }
        let next = if renew {
            retry_at
                .unwrap_or_else(|| instant_after(renewed_at, ttl / 3))
                .min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            _ = &mut changed => continue,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        if !renew || Instant::now() >= deadline {
            continue;
        }
        match s.renew().await {
            Renewal::Renewed => retry_at = None,
            Renewal::Failed => {
                let pause = (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
                retry_at = Some(instant_after(Instant::now(), pause));
            }
            Renewal::CapReached => {
                renew = false;
                capped = true;
            }
            Renewal::Stop => return,
        }
    }
}

impl Lease {
    pub(crate) fn start(
        instances: Arc<Instances>,
        name: String,
        keys: LockKeys,
        granted: Granted,
        options: &LockOptions,
        first_ttl: Duration,
        handle: Handle,
    ) -> Lease {
        let (tx, rx) = oneshot::channel();
        let deadline = instant_after(granted.start, instances.validity(first_ttl));
        let shared = Arc::new(LeaseShared {
            name,
            keys,
            token: granted.token,
            fence: granted.fence,
            hold_until: options
                .max_hold_duration()
                .and_then(|cap| granted.start.checked_add(cap)),
            acquired_at: granted.start,
            status: AtomicU8::new(HELD),
            timing: Mutex::new(Timing {
                deadline,
                ttl: options.ttl_duration(),
                renewed_at: granted.start,
            }),
            op: tokio::sync::Mutex::new(()),
            changed: Notify::new(),
            signal: Mutex::new(Some(tx)),
            lost: rx.shared(),
            handle: handle.clone(),
            instances,
        });
        handle.spawn(watchdog(shared.clone(), options.renews()));
        tracing::debug!(lock = %shared.keys.lock, fence = shared.fence.get(), "lock acquired");
        Lease { shared }
    }

    /// The lock's name, as encoded in its key (plain names such as
    /// `"orders"` are unchanged; see [`Subject`](crate::Subject)).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The lock's key on the backend.
    pub fn key(&self) -> &str {
        &self.shared.keys.lock
    }

    /// The fencing token of this hold: send it with every write to the
    /// protected resource, which refuses tokens lower than the highest it has
    /// seen.
    pub fn fence(&self) -> FencingToken {
        self.shared.fence
    }

    /// Whether the lease can still be trusted: not released, not lost, and
    /// before its safe deadline.
    pub fn is_held(&self) -> bool {
        self.shared.status() == HELD && Instant::now() < self.shared.timing().deadline
    }

    /// Whether the lease was lost (as opposed to released, or still held).
    pub fn is_lost(&self) -> bool {
        self.shared.status() == LOST
            || (self.shared.status() == HELD && Instant::now() >= self.shared.timing().deadline)
    }

    /// How long the lease can still be trusted without another renewal: the
    /// time to its safe deadline, zero once lost or released.
    pub fn remaining(&self) -> Duration {
        if self.shared.status() != HELD {
            return Duration::ZERO;
        }
        self.shared
            .timing()
            .deadline
            .saturating_duration_since(Instant::now())
    }

    /// A future that resolves once the lease can no longer be trusted: when
    /// it is lost, and also when it is released or dropped (so a `select!`
    /// on it never hangs). See [`is_lost`](Lease::is_lost).
    pub fn lost(&self) -> LeaseLost {
        LeaseLost {
            inner: Some(self.shared.lost.clone()),
        }
    }

    /// Sets the lock's TTL to `ttl` from now if it is still ours
    /// (compare-and-pexpire), within the `max_hold` cap; the watchdog renews
    /// with this TTL from then on. `Ok(false)` when the lease is no longer
    /// held (released, lost — a lost lease stays lost — or taken) or the cap
    /// leaves no room; an error when the backend did not answer (the
    /// watchdog keeps trying; a shorter TTL may have been applied, so the
    /// lease is trusted only until the earlier of the two ends).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use std::time::Duration;
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let lease = locker.try_acquire("import", &LockOptions::new().renew(false)).await?;
    /// assert!(lease.extend(Duration::from_secs(120)).await?);
    /// assert!(lease.remaining() > Duration::from_secs(100));
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<bool> {
        let s = &self.shared;
        s.instances.check_ttl(ttl)?;
        let _op = s.op.lock().await;
        if s.status() != HELD {
            return Ok(false);
        }
        let sent = Instant::now();
        let deadline = s.timing().deadline;
        if sent >= deadline {
            s.mark_lost("no renewal succeeded before the safe deadline");
            return Ok(false);
        }
        let Some(applied) = s.capped(ttl, sent) else {
            return Ok(false);
        };
        // A shorter TTL may be applied on the store though its reply never
        // comes: from the moment it is sent, the lease is trusted only as
        // long as the shorter of the two would last.
        let trusted = instant_after(sent, s.instances.validity(applied));
        let deadline = {
            let mut t = s.timing();
            t.deadline = t.deadline.min(trusted);
            t.deadline
        };
        // The watchdog plans from the deadline: it must see the new one (to
        // renew before it, or to report the loss at it).
        s.changed.notify_one();
        // A reply after the deadline it must beat is of no use.
        let bound = s.instances.timeout.min(deadline - sent);
        if s.instances
            .extend(&s.keys, &s.token, applied, bound)
            .await?
        {
            // Lost while the reply was on its way (the watchdog reported
            // it at the shorter deadline): a lost lease stays lost.
            if s.status() != HELD || Instant::now() >= trusted {
                s.mark_lost("the extension came after the lease's safe deadline");
                return Ok(false);
            }
            {
                let mut t = s.timing();
                t.deadline = trusted;
                t.ttl = ttl;
                t.renewed_at = sent;
            }
            s.changed.notify_one();
            Ok(true)
        } else {
            s.mark_lost("the lock is no longer ours");
            Ok(false)
        }
    }

    /// Releases the lock (compare-and-delete, then waiters are notified) and
    /// stops renewal at once. `Ok(true)` when the lock was still ours,
    /// `Ok(false)` when it had expired or been taken (someone else's lock is
    /// left alone); an error when the backend did not answer — on a Redlock,
    /// when too few instances answered to tell either (the lock then expires
    /// at its TTL where it was not released). Dropping the lease afterwards
    /// does nothing more.
    ///
    /// Idempotent per owner token on the backend: when the client sends the
    /// release again because the first reply was lost (a caller retrying
    /// after a timeout, or a connection that sends again), the replay finds the marker the
    /// first run left (it lives
    /// [`RELEASE_MARKER_TTL`](super::RELEASE_MARKER_TTL), far longer than a
    /// round trip's bound) and the answer is still `Ok(true)`: the holder
    /// is not told it lost a lock it released. An expired lease leaves no
    /// marker, so its release still reports `Ok(false)`.
    ///
    /// Cancel-safe: the release runs in a task of its own, so dropping this
    /// future mid-flight still releases the lock.
    pub async fn release(self) -> Result<bool> {
        let shared = self.shared.clone();
        let first = shared.mark_released();
        drop(self);
        if !first {
            return Ok(false);
        }
        shared.release_remote().await
    }
}

impl Lease {
    /// The owner token: the idempotency store's fenced writes check it.
    pub(crate) fn token(&self) -> &str {
        &self.shared.token
    }

    /// Marks the lease released without a round trip, because a script has
    /// already deleted its lock (a completed or abandoned idempotency
    /// record): renewal stops, and dropping it does nothing more.
    pub(crate) fn settle(self) {
        self.shared.mark_released();
    }

    /// Stops renewal without a release: the lock ends at its TTL. For work
    /// that is done but not recorded (an idempotency response that could
    /// not be stored): a release would let a retry run it again.
    pub(crate) fn let_expire(self) {
        self.shared.mark_released();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.shared.mark_released() {
            return;
        }
        let shared = self.shared.clone();
        // Never block here: release on the runtime the lease was acquired on.
        // If that runtime is gone, the task is dropped and the lock expires at
        // its TTL.
        self.shared.handle.spawn(async move {
            if let Err(e) = shared.instances.release_here(&shared.keys, &shared.token).await {
                tracing::debug!(lock = %shared.keys.lock, error = %e, "release on drop failed; the lock expires by its TTL");
            }
        });
    }
}

impl fmt::Debug for Lease {
    // The owner token is a bearer secret for the lock: never in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.shared.status() {
            HELD if self.is_held() => "held",
            HELD | LOST => "lost",
            _ => "released",
        };
        f.debug_struct("Lease")
            .field("key", &self.shared.keys.lock)
            .field("fence", &self.shared.fence)
            .field("status", &status)
            .field("remaining", &self.remaining())
            .finish()
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
