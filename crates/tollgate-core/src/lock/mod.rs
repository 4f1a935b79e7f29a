//! Fenced distributed locks: [`Locker`], [`Lease`], [`FencingToken`], over
//! one backend or, with [`Locker::redlock`], across independent masters.
//!
//! # Before you take a lock
//!
//! A lock is the last resort. In order of preference:
//!
//! 1. **A unique constraint** in the database that holds the data: the second
//!    insert fails, whoever runs it and whenever.
//! 2. **An idempotency key**: do the work as often as it happens, and let the
//!    resource apply it once.
//! 3. **A single-writer design**: route all writes for a key to one owner (a
//!    partitioned queue, an actor).
//! 4. **A lock with a fencing token checked by the resource.** A lease can
//!    always be lost without the holder knowing in time (a process pause, a
//!    network partition), so mutual exclusion alone never protects data. The
//!    resource must remember the highest [`FencingToken`] it has accepted and
//!    refuse writes that carry a lower one.
//!
//! Locks remain the right tool for *efficiency* (not doing expensive work
//! twice, e.g. [`Locker::fill_once`]) and, with fencing, for correctness.
//!
//! # Guarantees
//!
//! - **Mutual exclusion while valid.** A lock is `SET key token NX PX ttl` in
//!   one script with a 128-bit owner token from the OS CSPRNG; only the
//!   token's holder can extend it (compare-and-`PEXPIRE`) or release it
//!   (compare-and-`DEL`, then `PUBLISH` to waiters).
//! - **Fencing tokens strictly increase per lock name**, across all holders,
//!   processes and restarts. The acquire script computes
//!   `max(previous + 1, server time in µs)` and keeps `previous` in a sibling
//!   key of the same cluster slot. Because the server time is a floor, the
//!   tokens keep increasing after Redis loses that key: a restart without
//!   persistence, a failover to a lagging replica, or expiry. So the key can
//!   be short-lived: it lives 1 hour after the last acquire of its lock, and
//!   at least 10 × the lock's TTL ([`DEFAULT_FENCE_TTL`], [`FENCE_TTL_TTLS`],
//!   [`LockerBuilder::fence_ttl`]) — one key per lock name in use, not per
//!   name ever used. While it lives, it also covers many acquires within one
//!   microsecond and a server clock that steps back.
//!   **Assumption:** the Redis server's clock does not step back by more
//!   than the time since the last acquire of a lock (and, once its fence key
//!   has expired, not at all). Run NTP in slewing mode on Redis hosts.
//!   Across a failover "the server" is the new master: a replica promoted
//!   before the fence key reached it must not have a clock behind the last
//!   fence the old master handed out, or a holder within that gap gets a
//!   lower fence. Keep the nodes' clocks in step (NTP on all of them).
//! - **What a failover may lose.** Redis replicates asynchronously, so a
//!   lock taken just before its master dies may be missing on the promoted
//!   replica, and another process may take it while the first still holds
//!   its lease: two holders, told apart by their fences (above), which is
//!   why the resource must check them. `WAIT` after an acquire would narrow
//!   this window, not close it (a replica that acknowledged can still lose
//!   the write if it is not the one promoted), and would add a round trip
//!   to every acquire; tollgate does not send it. A [Redlock](Locker::redlock)
//!   of independent masters does not depend on replication.
//! - **Loss is reported before expiry.** A watchdog renews the lease every
//!   TTL/3. Its safe deadline is measured on the OS's monotonic clock
//!   from *before* the acquire was sent, minus a drift allowance (1 % of the
//!   TTL + 2 ms by default); when no renewal succeeds before it, or a renewal
//!   finds the lock taken, [`Lease::lost`] resolves and [`Lease::is_held`]
//!   turns false — while the lock still exists on Redis. Middleware uses this
//!   to cancel the protected work. A cap on the total hold time bounds stuck
//!   holders: by default `max(20 × ttl, 10 min)` ([`LockOptions::max_hold`];
//!   [`LockOptions::unbounded_hold`] opts out); renewal stops at release.
//! - **No orphaned locks on cancellation.** Each acquire attempt (the round
//!   trips that may create the lock, and the lease built from them) and each
//!   release runs in a task of its own: dropping `acquire`, `try_acquire` or
//!   `release` mid-flight (a `timeout`, a client that disconnects) lets the
//!   task finish, and a lock it created is released at once rather than left
//!   ownerless until its TTL. Acquires are idempotent on the backend, so a
//!   client that retries one after a connection error (a connection of the
//!   user's may) gets its own lock back, not [`Error::Busy`](crate::Error::Busy).
//!   Releases are idempotent per owner token: a release replayed after its
//!   reply was lost reports that the lock was ours (a short-lived marker,
//!   [`RELEASE_MARKER_TTL`], remembers it), not that it was lost; a token
//!   whose lease expired, or that never held the lock, still gets "not held".
//! - **No hang, no blocking drop, no panic.** Every round trip is bounded
//!   ([`LockerBuilder::timeout`]); dropping a [`Lease`] releases it on the
//!   runtime it was acquired on, without blocking. TTLs, hold caps and fence
//!   TTLs above [`MAX_LOCK_DURATION`] (one year) are refused with
//!   [`Error::InvalidConfig`](crate::Error::InvalidConfig) before any round
//!   trip; a wait bound too long for the clock waits forever.
//! - **Waiting is cheap.** Waiters of one [`Locker`] share a single pub/sub
//!   subscription (one pattern for all lock names, started on first wait,
//!   stopped with the locker; a Redlock has one per instance), and fall
//!   back to a jittered poll bounded by the holder's remaining TTL, so a
//!   missed notification never strands a waiter; the wait bound is honoured
//!   (an attempt still in flight at the bound is left to finish on its own,
//!   and releases what it takes; only a first attempt, which a free lock
//!   must not lose to a short bound, is always waited for).
//!   A backend without pub/sub (a [`RedisBackend`](crate::RedisBackend)
//!   built without [`with_pubsub`](crate::RedisBackend::with_pubsub)) is
//!   polled.
//! - **Loss is a signal, release too.** [`Lease::lost`] resolves when the
//!   lease is lost *or* released/dropped, so a `select!` on it never hangs;
//!   [`Lease::is_lost`] tells the two apart.
//!
//! Everything works the same on [`MemoryBackend`](crate::MemoryBackend) (one
//! process), on a standalone Redis, Sentinel, and Redis Cluster (all keys of a
//! lock share its hash tag; `PUBLISH` reaches every node).
//! [`Locker::redlock`] runs the same lock over several independent masters —
//! read its docs for when not to.
//!
//! # A resource that rejects stale tokens
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! use std::sync::Mutex;
//! use tollgate::{FencingToken, LockOptions, Locker, MemoryBackend};
//!
//! /// The protected resource: it keeps the highest fence it has accepted.
//! #[derive(Default)]
//! struct Storage {
//!     highest: Mutex<Option<FencingToken>>,
//!     data: Mutex<Vec<String>>,
//! }
//!
//! impl Storage {
//!     fn write(&self, fence: FencingToken, value: &str) -> Result<(), String> {
//!         let mut highest = self.highest.lock().unwrap();
//!         if highest.is_some_and(|h| fence < h) {
//!             return Err(format!("stale fencing token {fence}"));
//!         }
//!         *highest = Some(fence);
//!         self.data.lock().unwrap().push(value.to_owned());
//!         Ok(())
//!     }
//! }
//!
//! let storage = Storage::default();
//! let locker = Locker::new(MemoryBackend::new());
//! let opts = LockOptions::new();
//!
//! // Client 1 takes the lock, then stalls (a GC pause, say) while its lease is
//! // lost and client 2 takes over.
//! let first = locker.try_acquire("file", &opts).await?;
//! let stale = first.fence();
//! drop(first);
//! tokio::task::yield_now().await; // let the drop's release run
//! let second = locker.try_acquire("file", &opts).await?;
//! storage.write(second.fence(), "from client 2").unwrap();
//!
//! // Client 1 wakes up and writes with its old token: refused.
//! assert!(storage.write(stale, "from client 1").is_err());
//! assert_eq!(*storage.data.lock().unwrap(), ["from client 2"]);
//! # Ok(()) }
//! ```
//!
//! In a database the check is one conditional write, e.g.
//! `UPDATE files SET body = $1, fence = $2 WHERE id = $3 AND fence <= $2`.

// Dependencies run one way (a DAG): util, options and hold_times are leaves; waiters
// use util; instances use waiters; lease uses instances; core uses lease
// and instances; locker uses core.
pub(crate) mod core;
mod hold_times;
mod instances;
mod lease;
mod locker;
mod options;
mod semaphore;
pub(crate) mod settings;
pub(crate) mod util;
mod waiters;

pub use self::lease::{Lease, LeaseLost};
pub use self::locker::{Locker, LockerBuilder};
pub use self::options::{
    LockOptions, DEFAULT_MAX_HOLD_FLOOR, DEFAULT_MAX_HOLD_TTLS, DEFAULT_TTL, MAX_LOCK_DURATION,
};
pub use crate::store::{
    AcquireReply, AcquireRequest, FencingToken, Holders, LockBackend, LockHolder, LockKeys,
    ReleaseEvent, ReleaseEvents,
};

/// The largest permit count a name may have. A holder of weight k is k
/// members of a sorted set, so the bound keeps every script call short
/// (the sliding log caps its limit for the same reason).
pub const MAX_PERMITS: u32 = 10_000;
pub use self::semaphore::{Permit, Semaphore, SemaphoreBuilder};
pub use self::settings::{
    DEFAULT_FENCE_TTL, DEFAULT_LOCK_TIMEOUT, DEFAULT_POLL_INTERVAL, FENCE_TTL_TTLS,
    RELEASE_MARKER_TTL,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync + std::fmt::Debug + 'static>() {}
    fn lost_future<T>()
    where
        T: std::future::Future<Output = ()>
            + Send
            + Sync
            + Unpin
            + Clone
            + std::fmt::Debug
            + 'static,
    {
    }

    #[test]
    fn public_types_are_thread_safe() {
        send_sync::<Locker>();
        send_sync::<LockerBuilder>();
        send_sync::<Semaphore>();
        send_sync::<SemaphoreBuilder>();
        send_sync::<Lease>();
        send_sync::<LockOptions>();
        send_sync::<FencingToken>();
        lost_future::<LeaseLost>();
        let _: &dyn LockBackend = &crate::MemoryBackend::new();
    }

    fn send<T: Send>(_: &T) {}

    #[tokio::test]
    async fn futures_are_send() {
        let locker = Locker::new(crate::MemoryBackend::new());
        let redlock = Locker::redlock([crate::MemoryBackend::new()]).unwrap();
        let opts = LockOptions::new();
        send(&locker.acquire("a", &opts));
        send(&locker.try_acquire("a", &opts));
        send(&redlock.acquire("a", &opts));
        let lease = locker.try_acquire("b", &opts).await.unwrap();
        send(&lease.extend(std::time::Duration::from_secs(1)));
        send(&lease.release());
    }

    #[tokio::test]
    async fn lost_can_be_polled_again_after_it_resolved() {
        let locker = Locker::new(crate::MemoryBackend::new());
        let lease = locker.try_acquire("x", &LockOptions::new()).await.unwrap();
        let mut lost = lease.lost();
        assert!(futures_util::poll!(&mut lost).is_pending());
        assert!(!lease.is_lost());
        let kept = lease.lost();
        assert!(lease.release().await.unwrap());
        (&mut lost).await;
        (&mut lost).await;
        kept.clone().await;
        assert!(format!("{lost:?}").contains("resolved: true"));
    }
}
