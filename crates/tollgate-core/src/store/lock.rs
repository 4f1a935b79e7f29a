//! [`LockBackend`]: the four lock operations and release notifications, as a
//! backend provides them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

pub use super::fence::FencingToken;
use super::holders::LockHolder;
use crate::error::{Error, Result};
use crate::keyspace::{Keyspace, Subject};

/// The keys and channel of one lock name: `<prefix>:lock:{<name>}`, its fence
/// key `<prefix>:lock:{<name>}:fence` (same hash tag, so the same cluster
/// slot) and the channel `<prefix>:lock:{<name>}:released` on which a release
/// is announced — and [how many may hold it](Holders). A semaphore's name
/// ([`LockKeys::permits`]) keeps its holders in the first key (a sorted set
/// scored by expiry) and, when fair, its waiters' tickets in
/// `…:queue` and `…:tickets` beside it.
///
/// ```
/// use tollgate::lock::LockKeys;
/// use tollgate::{Keyspace, Subject};
///
/// let keys = LockKeys::new(&Keyspace::new("app", "lock")?, &Subject::new("orders"));
/// assert_eq!(keys.lock, "app:lock:{orders}");
/// assert_eq!(keys.fence, "app:lock:{orders}:fence");
/// assert_eq!(keys.channel, "app:lock:{orders}:released");
/// # Ok::<(), tollgate::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockKeys {
    /// The lock key; its value is the holder's owner token, then who holds
    /// it (`token|fence|since_ms|host:pid`).
    pub lock: String,
    /// The fence key: the last fencing token handed out for this name.
    pub fence: String,
    /// The channel a release is published on.
    pub channel: String,
    /// How many may hold the name at once, and what this holder takes.
    pub holders: Holders,
}

impl LockKeys {
    /// The keys of the lock `subject` in `keyspace` (one holder).
    pub fn new(keyspace: &Keyspace, subject: &Subject) -> Self {
        Self::with_holders(keyspace, subject, Holders::One)
    }

    /// The keys of the semaphore `subject` in `keyspace`: up to `limit`
    /// permits, of which this holder takes `weight`; `fair` serves waiters in
    /// arrival order.
    ///
    /// ```
    /// use tollgate::lock::{Holders, LockKeys};
    /// use tollgate::{Keyspace, Subject};
    ///
    /// let keys = LockKeys::permits(&Keyspace::new("app", "sem")?, &Subject::new("gpu"), 4, 1, true);
    /// assert_eq!(keys.lock, "app:sem:{gpu}");
    /// assert_eq!(keys.queue(), "app:sem:{gpu}:queue");
    /// assert_eq!(keys.holders, Holders::Permits { limit: 4, weight: 1, fair: true });
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn permits(
        keyspace: &Keyspace,
        subject: &Subject,
        limit: u32,
        weight: u32,
        fair: bool,
    ) -> Self {
        Self::with_holders(
            keyspace,
            subject,
            Holders::Permits {
                limit,
                weight,
                fair,
            },
        )
    }

    fn with_holders(keyspace: &Keyspace, subject: &Subject, holders: Holders) -> Self {
        let lock = keyspace.key(subject, None);
        LockKeys {
            fence: keyspace.key(subject, Some("fence")),
            channel: format!("{lock}:released"),
            lock,
            holders,
        }
    }

    /// A fair name's queue: waiter tickets scored by arrival (server µs).
    pub fn queue(&self) -> String {
        format!("{}:queue", self.lock)
    }

    /// A fair name's ticket expiries: waiter tickets scored by the time
    /// they fall out of the queue unless refreshed (server µs).
    pub fn tickets(&self) -> String {
        format!("{}:tickets", self.lock)
    }

    /// The marker a successful release of `token` leaves for
    /// [`RELEASE_MARKER_TTL`](crate::lock::RELEASE_MARKER_TTL): `<lock>:released:<token>`
    /// (same hash tag, so the same cluster slot). A replay of that release
    /// finds it and reports "released" (see [`LockBackend::release_lock`]).
    ///
    /// ```
    /// use tollgate::lock::LockKeys;
    /// use tollgate::{Keyspace, Subject};
    ///
    /// let keys = LockKeys::new(&Keyspace::new("app", "lock")?, &Subject::new("orders"));
    /// assert_eq!(keys.release_marker("ab12"), "app:lock:{orders}:released:ab12");
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn release_marker(&self, token: &str) -> String {
        format!("{}:released:{token}", self.lock)
    }

    /// Where a permit holder's description lives while it holds:
    /// `<lock>:holder:<token>` (same hash tag), with the permits' TTL. A
    /// lock's holder keeps its description in the lock's own value.
    ///
    /// ```
    /// use tollgate::lock::LockKeys;
    /// use tollgate::{Keyspace, Subject};
    ///
    /// let keys = LockKeys::permits(&Keyspace::new("app", "sem")?, &Subject::new("gpu"), 2, 1, false);
    /// assert_eq!(keys.holder_key("ab12"), "app:sem:{gpu}:holder:ab12");
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn holder_key(&self, token: &str) -> String {
        format!("{}:holder:{token}", self.lock)
    }
}

/// How many may hold one name at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Holders {
    /// One holder: a lock, stored as `SET key token NX PX ttl`.
    One,
    /// Permits: at most `limit` in use at once, stored as a sorted set of
    /// holders scored by expiry. A fair lock is `limit: 1, fair: true`.
    Permits {
        /// How many permits the name has.
        limit: u32,
        /// How many of them this holder takes (1..=limit).
        weight: u32,
        /// Waiters take permits in arrival order through an expiring queue.
        fair: bool,
    },
}

/// One acquire attempt: `SET lock token NX PX ttl` (or, for permits, a place
/// among the holders), and on success the next fencing token, atomically.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The keys of the lock.
    pub keys: LockKeys,
    /// The owner token (128 bits from the OS CSPRNG, hex); only its holder can
    /// extend or release the lock.
    pub token: String,
    /// How long the lock lives unless extended.
    pub ttl: Duration,
    /// How long the fence key lives (refreshed by every acquire).
    pub fence_ttl: Duration,
    /// A fair name's waiter: its ticket (the same for every attempt of one
    /// wait, so it keeps its place) and how long the ticket lives unless
    /// the next attempt refreshes it. `None`: do not queue — admitted only
    /// when nobody waits (a `try_acquire`), or the name is not fair.
    pub ticket: Option<(String, Duration)>,
    /// Who acquires, stored with the holder for operators' listings:
    /// `host:pid` of this process unless set otherwise. Holds no `|`.
    pub holder: String,
}

impl AcquireRequest {
    /// A request from its parts.
    pub fn new(keys: LockKeys, token: String, ttl: Duration, fence_ttl: Duration) -> Self {
        AcquireRequest {
            keys,
            token,
            ttl,
            fence_ttl,
            ticket: None,
            holder: super::holders::this_process().to_owned(),
        }
    }

    /// The same request, queued under `ticket` for `ticket_ttl` (fair names).
    pub fn with_ticket(mut self, ticket: String, ticket_ttl: Duration) -> Self {
        self.ticket = Some((ticket, ticket_ttl));
        self
    }
}

impl fmt::Debug for AcquireRequest {
    // The token is a bearer secret for the lock: never in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireRequest")
            .field("keys", &self.keys)
            .field("ttl", &self.ttl)
            .field("fence_ttl", &self.fence_ttl)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// A backend's answer to an [`AcquireRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireReply {
    /// The lock is ours, with this fencing token.
    Acquired {
        /// `max(previous + 1, backend time in µs)`.
        fence: FencingToken,
    },
    /// Someone else holds the lock.
    Held {
        /// How long the holder's lock still lives, when known.
        pttl: Option<Duration>,
    },
}

/// What a release subscription reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseEvent {
    /// The lock whose release channel is this one was released.
    Released {
        /// The channel ([`LockKeys::channel`]).
        channel: String,
    },
    /// Notifications may have been missed (a slow consumer); every waiter
    /// should look again.
    Resync,
}

/// A stream of release notifications; it ends when the subscription breaks.
pub type ReleaseEvents = BoxStream<'static, ReleaseEvent>;

/// Where locks live. Implemented by [`RedisBackend`](crate::RedisBackend)
/// (one Lua script per operation, any `ConnectionLike + Clone + Send + Sync`
/// connection: standalone, Sentinel, Cluster) and
/// [`MemoryBackend`](crate::MemoryBackend); a [`Locker`](crate::Locker) runs
/// over one, a Redlock ([`Locker::redlock`](crate::Locker::redlock)) over several.
///
/// Every operation is atomic on the backend. Callers bound each call with a
/// timeout; implementations need not.
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// `SET lock token NX PX ttl`; on success, the next fencing token
    /// (`max(previous + 1, backend time in µs)`, stored in the fence key with
    /// `fence_ttl`). One round trip.
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<AcquireReply>>;

    /// Deletes the lock if its value is `token`, and then publishes on its
    /// channel. `true` when it was ours; for permits
    /// ([`Holders::Permits`]), removes `token`'s permits (or its waiter
    /// ticket, which reports `false`).
    ///
    /// Idempotent per token: a successful release leaves a marker
    /// ([`LockKeys::release_marker`]) for
    /// [`RELEASE_MARKER_TTL`](crate::lock::RELEASE_MARKER_TTL), so the same
    /// release sent again in that time — a client retrying after the reply
    /// was lost — answers `true` again (and
    /// leaves whoever holds the name now alone), instead of telling the
    /// holder it lost a lock it released. `false` only when `token` did not
    /// release it: it expired (taken by someone else or not), or never held.
    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Sets the lock's TTL to `ttl` if its value is `token`. `true` when it
    /// was ours.
    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Redlock: raises the stored fence to at least `fence` while the lock is
    /// ours (`token`). `true` when the stored fence is now at least `fence`.
    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Subscribes to the release notifications of every channel starting
    /// with `channel_prefix` (one subscription for all lock names of a
    /// prefix). `None` when the backend cannot notify (waiters then poll).
    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, Result<ReleaseEvents>>>;

    /// How many permits of a semaphore name are held now (expired holders
    /// not counted). Backends without semaphores keep the default, an error.
    fn permits_in_use<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        let _ = keys;
        Box::pin(std::future::ready(Err(crate::error::Error::InvalidConfig(
            format!(
                "the {} backend does not support semaphores",
                self.lock_kind()
            ),
        ))))
    }

    /// Every holder of a lock or of permits under `prefix` now: the keys
    /// `<prefix>:<name>:{<subject>}` (a name without `:`) that a lock or
    /// permit holder left its description in — every one this version
    /// acquired (an idempotency record's lease carries none, and is not
    /// listed). For operators: it walks the keyspace (`SCAN` on every
    /// master of a cluster), so it costs time in proportion to all keys,
    /// never anything on the acquire path. Backends without it keep the
    /// default, an error.
    fn lock_holders<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockHolder>>> {
        let _ = prefix;
        Box::pin(std::future::ready(Err(unsupported(
            self.lock_kind(),
            "listing holders",
        ))))
    }

    /// Removes whoever holds `keys` — the lock, or every permit of the name
    /// (the stored kind decides, not [`LockKeys::holders`]) — and tells
    /// waiters. The fence key stays, so the next holder's fence is still
    /// higher than every earlier one; the holders learn it at their next
    /// renewal. Returns how many holders were removed (0 or 1 for a lock).
    /// Backends without it keep the default, an error.
    fn break_holders<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        let _ = keys;
        Box::pin(std::future::ready(Err(unsupported(
            self.lock_kind(),
            "breaking holders",
        ))))
    }

    /// A store in this process to hold permits on while this one is down:
    /// the local semaphore of [`FailurePolicy::Fallback`](crate::FailurePolicy::Fallback).
    fn local_lock(&self) -> Arc<dyn LockBackend>;

    /// A short name for logs: `"memory"`, `"redis"`, `"cluster"`, ….
    fn lock_kind(&self) -> &'static str;

    /// The operator plane of this store, if it has one (where a semaphore
    /// registers). The default is none.
    fn lock_admin(&self) -> Option<Arc<dyn super::AdminBackend>> {
        None
    }
}

impl<T: LockBackend + ?Sized> LockBackend for Arc<T> {
    fn acquire_lock<'a>(
        &'a self,
        request: &'a AcquireRequest,
    ) -> BoxFuture<'a, Result<AcquireReply>> {
        (**self).acquire_lock(request)
    }

    fn release_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
    ) -> BoxFuture<'a, Result<bool>> {
        (**self).release_lock(keys, token)
    }

    fn extend_lock<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        (**self).extend_lock(keys, token, ttl)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        fence: FencingToken,
        fence_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        (**self).raise_fence(keys, token, fence, fence_ttl)
    }

    fn release_events(
        &self,
        channel_prefix: &str,
    ) -> Option<BoxFuture<'static, Result<ReleaseEvents>>> {
        (**self).release_events(channel_prefix)
    }

    fn permits_in_use<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        (**self).permits_in_use(keys)
    }

    fn lock_holders<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<LockHolder>>> {
        (**self).lock_holders(prefix)
    }

    fn break_holders<'a>(&'a self, keys: &'a LockKeys) -> BoxFuture<'a, Result<u32>> {
        (**self).break_holders(keys)
    }

    fn local_lock(&self) -> Arc<dyn LockBackend> {
        (**self).local_lock()
    }

    fn lock_kind(&self) -> &'static str {
        (**self).lock_kind()
    }

    fn lock_admin(&self) -> Option<Arc<dyn super::AdminBackend>> {
        (**self).lock_admin()
    }
}

pub(super) fn unsupported(kind: &str, what: &str) -> Error {
    Error::InvalidConfig(format!("the {kind} backend does not support {what}"))
}

/// `(limit, weight, fair)` of a permit name; an error for a lock's keys.
pub(crate) fn shape(keys: &LockKeys) -> Result<(u32, u32, bool)> {
    match keys.holders {
        Holders::Permits {
            limit,
            weight,
            fair,
        } => Ok((limit, weight, fair)),
        Holders::One => Err(Error::InvalidConfig(
            "a lock name was passed to a permit operation".into(),
        )),
    }
}

/// Milliseconds for a Redis `PX` argument: rounded up, at least 1.
pub(crate) fn millis_ceil(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if Duration::from_millis(ms as u64) < d {
        ms + 1
    } else {
        ms
    };
    (ms.max(1)).min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn px_rounds_up() {
        assert_eq!(millis_ceil(Duration::ZERO), 1);
        assert_eq!(millis_ceil(Duration::from_micros(1)), 1);
        assert_eq!(millis_ceil(Duration::from_micros(1001)), 2);
        assert_eq!(millis_ceil(Duration::from_secs(30)), 30_000);
        assert_eq!(millis_ceil(Duration::MAX), u64::MAX);
    }

    #[test]
    fn tokens_stay_out_of_debug_output() {
        let keys = LockKeys::new(&Keyspace::new("p", "lock").unwrap(), &Subject::new("x"));
        let req = AcquireRequest::new(
            keys,
            "deadbeefdeadbeef".into(),
            Duration::from_secs(1),
            Duration::from_secs(60),
        );
        assert!(!format!("{req:?}").contains("deadbeef"));
    }
}
