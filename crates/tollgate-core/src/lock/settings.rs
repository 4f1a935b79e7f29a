//! The defaults of a `Locker` and the settings its builder collects.

use std::time::Duration;

use super::options::LockOptions;
use crate::failure::FailurePolicy;
use crate::keyspace::DEFAULT_PREFIX;

/// Default bound on one lock round trip.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(500);
/// Default upper bound of the fallback poll of a waiter (it is also bounded
/// by the lock's remaining TTL).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Default TTL of fence keys: 1 hour after the last acquire of a lock, and
/// never less than [`FENCE_TTL_TTLS`] × the lock's TTL. The server-time
/// floor of the fencing token keeps tokens increasing after the key is gone;
/// the key only covers bursts within one microsecond and clock steps back
/// while it lives (see the [module docs](crate::lock)).
pub const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(3600);
/// At every acquire, the fence key lives at least this many lock TTLs.
pub const FENCE_TTL_TTLS: u32 = 10;
/// How long a release is remembered: a successful release leaves a marker
/// of its owner token (a key beside the lock, in the same hash tag) that
/// lives this long, so that the same release sent again — a client retrying
/// after the reply was lost (a caller retrying after a timeout, a
/// connection of the user's that sends again) — reports "released", the truth, instead of "not held". Ten
/// times the [default round-trip bound](DEFAULT_LOCK_TIMEOUT): a replay
/// comes within the call that sent it. One short-lived key per release,
/// never an immortal one; an expired lease leaves none, so its release still
/// reports "not held".
pub const RELEASE_MARKER_TTL: Duration = Duration::from_secs(5);
/// Default drift allowance: 1 % of the TTL plus 2 ms.
/// The default names (keyspace policies) of each kind that holds keys
/// through the lock engine; a named locker may not take another kind's.
pub(crate) const LOCK_POLICY: &str = "lock";
pub(crate) const SEMAPHORE_POLICY: &str = "sem";
pub(crate) const IDEMPOTENCY_POLICY: &str = "idem";

pub(crate) const DEFAULT_DRIFT_RATIO: f64 = 0.01;
pub(crate) const DEFAULT_DRIFT_FIXED: Duration = Duration::from_millis(2);

/// What a [`LockerBuilder`](super::LockerBuilder) collects, for one
/// backend or a Redlock alike; checked by `Core::new`.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) defaults: LockOptions,
    pub(crate) drift_ratio: f64,
    pub(crate) drift_fixed: Duration,
    pub(crate) timeout: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) fence_ttl: Duration,
    /// `None`: a lock; `Some(n)`: a semaphore of n permits.
    pub(crate) permits: Option<u32>,
    /// Waiters are served in arrival order.
    pub(crate) fair: bool,
    /// Semaphores: what an acquire does when the backend fails.
    pub(crate) failure: FailurePolicy,
    /// The keyspace policy of a lock's keys (`lock` by default; the
    /// idempotency store's leases use `idem`).
    pub(crate) policy: &'static str,
    /// A name given with `LockerBuilder::name`: the policy instead.
    pub(crate) name: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            prefix: DEFAULT_PREFIX.to_owned(),
            defaults: LockOptions::default(),
            drift_ratio: DEFAULT_DRIFT_RATIO,
            drift_fixed: DEFAULT_DRIFT_FIXED,
            timeout: DEFAULT_LOCK_TIMEOUT,
            poll_interval: DEFAULT_POLL_INTERVAL,
            fence_ttl: DEFAULT_FENCE_TTL,
            permits: None,
            fair: false,
            failure: FailurePolicy::Allow,
            policy: LOCK_POLICY,
            name: None,
        }
    }
}
