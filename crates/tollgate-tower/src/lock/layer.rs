//! [`LockLayer`]: the locker, the lock options and the HTTP concerns (the
//! setters are [`HoldLayer`]'s, shared with the concurrency limit).

use tollgate_core::Locker;

use super::{HoldUntil, OnLeaseLost};
use crate::hold::{Gate, HoldKind, HoldLayer, Shared};
use crate::middleware::Answer;

/// Wraps the inner service in a per-resource lock; see the
/// [module docs](super).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{LockOptions, Locker, MemoryBackend};
/// use tollgate::tower::key::HeaderKey;
/// use tollgate::tower::lock::{HoldUntil, LockLayer, OnLeaseLost};
///
/// let options = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .max_hold(Duration::from_secs(120));
/// let layer = LockLayer::new(Locker::new(MemoryBackend::new()), HeaderKey::new("x-order").plain())
///     .namespace("orders")
///     .options(options)
///     .hold_until(HoldUntil::BodyEnd)
///     .on_lease_lost(OnLeaseLost::Cancel);
/// # let _ = layer;
/// ```
pub type LockLayer<K> = HoldLayer<K, ForLock>;

/// Marks a [`HoldLayer`] as a [`LockLayer`].
#[derive(Debug)]
pub enum ForLock {}

impl HoldKind for ForLock {
    const NAME: &'static str = "LockLayer";
}

impl<K> LockLayer<K> {
    /// Locks the resource named by `key` around each request, with
    /// `locker`'s default [`LockOptions`](tollgate_core::LockOptions) (unless
    /// configured otherwise: TTL 30 s, renewed, no waiting, and a hold cap of
    /// max(20 × TTL, 10 min) — a stuck handler loses its lease then). The
    /// lease is held until the response ([`HoldUntil::Response`]); a lost
    /// lease cancels the handler ([`OnLeaseLost::Cancel`]).
    pub fn new(locker: Locker, key: K) -> Self {
        HoldLayer::with(
            Shared {
                options: locker.default_options().clone(),
                gate: Gate::Lock(locker),
                hold: HoldUntil::default(),
                on_lost: OnLeaseLost::default(),
                namespace: None,
                answer: Answer::default(),
            },
            key,
        )
    }
}
