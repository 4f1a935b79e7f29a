//! What the operator plane reports: plain data, serialised as the admin
//! API's JSON (the CLI's `--json` prints the same).

use serde::{Deserialize, Serialize};

use crate::store::Algorithm;

/// A registered limiter, as its application described it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimiterInfo {
    /// Its name (the keyspace's policy).
    pub name: String,
    /// Its algorithm, by its long name (`"sliding_window_log"`).
    pub algorithm: String,
    /// Its quotas, in order.
    pub quotas: Vec<QuotaInfo>,
    /// What it decided lately (filled by [`Admin::limiters`](crate::admin::Admin::limiters);
    /// never stored in the registry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<Traffic>,
}

/// What a limiter decided lately, fleet-wide (the last few whole seconds,
/// averaged; each instance adds its counts once a second).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Checks admitted per second.
    pub allowed_per_second: f64,
    /// Checks refused per second.
    pub denied_per_second: f64,
}

/// One quota of a registered limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaInfo {
    /// Units per period.
    pub limit: u64,
    /// The period, in whole seconds (rounded up).
    pub period_seconds: u64,
    /// The period in µs, exact.
    pub period_micros: u64,
    /// The most admitted at once (the limit unless set apart).
    pub burst: u64,
}

/// Kinds of things an application registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Registered {
    /// A rate limiter.
    Limiter(LimiterInfo),
    /// A semaphore (a concurrency limit) with its permits per name.
    Semaphore {
        /// Its name (the keyspace's policy).
        name: String,
        /// Permits per subject.
        permits: u32,
    },
    /// An idempotency store.
    Idempotency {
        /// Its name (the keyspace's policy).
        name: String,
    },
}

/// One subject of one limiter, as the store holds it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubjectState {
    /// The limiter's name.
    pub limiter: String,
    /// The subject's id (its escaped form, as keys and `throttled` show it).
    pub subject: String,
    /// Units left now (the strictest quota), not counting a block.
    pub remaining: u64,
    /// The strictest quota's limit (or burst).
    pub limit: u64,
    /// Until one unit could be admitted (a block included), in ms; `None`
    /// when one would be admitted now.
    pub retry_after_ms: Option<u64>,
    /// Until every quota is full again, in ms.
    pub reset_after_ms: u64,
    /// When a block ends (ms since the epoch), if blocked.
    pub blocked_until_ms: Option<u64>,
}

/// A subject refused often lately (fleet-wide, merged from every instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThrottledSubject {
    /// The limiter's name.
    pub limiter: String,
    /// The subject's id.
    pub subject: String,
    /// The label the application gave the subject (never a secret), if any.
    pub label: Option<String>,
    /// Denials counted lately.
    pub denied: u64,
    /// The last denial (ms since the epoch).
    pub last_denied_ms: u64,
}

/// What a holder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderKind {
    /// A lock.
    Lock,
    /// A permit of a semaphore.
    Permit,
}

/// One holder of a lock or a permit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Lock or permit.
    pub kind: HolderKind,
    /// The locker's or semaphore's name.
    pub name: String,
    /// The subject (lock name) id.
    pub subject: String,
    /// The fence it was given.
    pub fence: u64,
    /// Who: `host:pid`.
    pub holder: String,
    /// How long it has held (ms).
    pub held_ms: u64,
    /// How long its lease still runs (ms).
    pub ttl_ms: u64,
}

/// One idempotency key in flight: claimed, its handler running, not
/// completed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlightKey {
    /// The idempotency store's name (its keyspace policy, `idem` by
    /// default).
    pub name: String,
    /// The key's subject id, as stored (the caller's scope, route and
    /// `Idempotency-Key`; never the request's payload).
    pub key: String,
    /// The claim's fence.
    pub fence: u64,
    /// How long since the claim (ms); `None` for a key claimed by a version
    /// that did not store when.
    pub held_ms: Option<u64>,
    /// How long its lease still runs unless renewed (ms).
    pub ttl_ms: u64,
}

impl LimiterInfo {
    /// The algorithm, parsed (`None` for a name this version does not know).
    pub fn algorithm(&self) -> Option<Algorithm> {
        Algorithm::ALL
            .iter()
            .copied()
            .find(|a| a.long_name() == self.algorithm)
    }
}
