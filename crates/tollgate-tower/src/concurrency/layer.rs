//! [`ConcurrencyLimitLayer`]: the semaphore, the permit options and the HTTP
//! concerns (the setters are [`HoldLayer`]'s, shared with the lock layer).

use tollgate_core::Semaphore;

use super::{HoldUntil, OnLeaseLost};
use crate::headers::concurrency_policy;
use crate::hold::{Gate, HoldKind, HoldLayer, Shared};
use crate::middleware::Answer;

/// At most the semaphore's N requests in flight per key, fleet-wide; see
/// the [module docs](super).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{LockOptions, MemoryBackend, Semaphore};
/// use tollgate::tower::concurrency::{ConcurrencyLimitLayer, HoldUntil};
/// use tollgate::tower::key::HeaderKey;
///
/// let permits = Semaphore::new(MemoryBackend::new(), 4)?;
/// let layer = ConcurrencyLimitLayer::new(permits, HeaderKey::new("x-api-key"))
///     .namespace("llm")
///     // Wait up to 2 s for a permit before answering 429.
///     .options(LockOptions::new().ttl(Duration::from_secs(30)).wait(Duration::from_secs(2)))
///     .hold_until(HoldUntil::BodyEnd);
/// # let _ = layer;
/// # Ok::<(), tollgate::Error>(())
/// ```
pub type ConcurrencyLimitLayer<K> = HoldLayer<K, ForPermits>;

/// Marks a [`HoldLayer`] as a [`ConcurrencyLimitLayer`].
#[derive(Debug)]
pub enum ForPermits {}

impl HoldKind for ForPermits {
    const NAME: &'static str = "ConcurrencyLimitLayer";
}

impl<K> ConcurrencyLimitLayer<K> {
    /// Limits each key that `key` names to `semaphore`'s permits, with the
    /// semaphore's default [`LockOptions`](tollgate_core::LockOptions)
    /// (unless configured otherwise: TTL 30 s, no waiting). Permits are held
    /// until the response body ends ([`HoldUntil::BodyEnd`]), renewed with
    /// no hold cap for as long as the request runs; a permit lost to a
    /// fault is reported and the request goes on
    /// ([`OnLeaseLost::Continue`]; see the [module docs](super)). The policy
    /// is named `concurrency` until a [`namespace`](HoldLayer::namespace)
    /// names it.
    pub fn new(semaphore: Semaphore, key: K) -> Self {
        let policy = concurrency_policy("concurrency", semaphore.permits());
        HoldLayer::with(
            Shared {
                options: semaphore.default_options().clone(),
                gate: Gate::Permits { semaphore, policy },
                hold: HoldUntil::BodyEnd,
                on_lost: OnLeaseLost::Continue,
                namespace: None,
                answer: Answer::default(),
            },
            key,
        )
    }

    /// What to do when a permit is lost mid-request — which, since the
    /// permit is renewed for as long as the request runs, takes a fault of
    /// the backend (default [`OnLeaseLost::Continue`]: reported, not
    /// cancelled; [`OnLeaseLost::Cancel`] keeps the bound through faults by
    /// ending the request); the same as
    /// [`on_lease_lost`](HoldLayer::on_lease_lost).
    pub fn on_permit_lost(self, on_lost: OnLeaseLost) -> Self {
        self.on_lease_lost(on_lost)
    }
}
