//! [`Sending`]: the give-backs of ended slices on their way in tasks of
//! their own (a revocation, a slice that aged out at a check), which
//! [`RateLimiter::return_leases`](crate::RateLimiter::return_leases) waits
//! for: a process that stops right after it loses none of them.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

#[derive(Default)]
pub(super) struct Sending {
    count: AtomicUsize,
    drained: Notify,
}

impl Sending {
    /// Sends `work` from a task of its own (nothing without a runtime: the
    /// units then return as the quota refills).
    pub(super) fn spawn(self: &Arc<Self>, work: impl Future<Output = ()> + Send + 'static) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.count.fetch_add(1, Ordering::SeqCst);
        // Dropped when the work ends, or with its task if that never runs.
        let sent = Sent(Arc::clone(self));
        drop(runtime.spawn(async move {
            work.await;
            drop(sent);
        }));
    }

    /// Waits until no give-back is on its way.
    pub(super) async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            // Registered before the count is read: an end between the two
            // still wakes this.
            notified.as_mut().enable();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct Sent(Arc<Sending>);

impl Drop for Sent {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.drained.notify_waiters();
        }
    }
}
