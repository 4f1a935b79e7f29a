//! [`IdempotencyBackend`]: the three record operations, as a backend
//! provides them (Lua scripts on Redis, their twin in memory).

use std::fmt;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Fingerprint, StoredResponse};
use crate::error::Result;
use crate::lock::{LockBackend, LockKeys};
use crate::FencingToken;

/// The keys of one idempotency record: the lease's lock keys
/// (`<prefix>:idem:{<key>}`, its fence and release channel) and the record
/// `<prefix>:idem:{<key>}:record`, all in one hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordKeys {
    /// The lease's keys.
    pub lease: LockKeys,
    /// The record (a hash).
    pub record: String,
}

impl RecordKeys {
    /// The record keys beside a lease's lock keys.
    pub fn new(lease: LockKeys) -> Self {
        RecordKeys {
            record: format!("{}:record", lease.lock),
            lease,
        }
    }
}

/// One claim: take the key's lease (owner `token`, `ttl`) unless a record
/// is completed or in flight, and record `fingerprint`.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The keys.
    pub keys: RecordKeys,
    /// The lease's owner token (fresh per claim).
    pub token: String,
    /// The lease's TTL.
    pub ttl: Duration,
    /// The fence key's TTL.
    pub fence_ttl: Duration,
    /// The record's TTL (refreshed on completion).
    pub record_ttl: Duration,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
}

impl ClaimRequest {
    /// A claim of `keys` by the lease token `token` for a request of
    /// `fingerprint`, with the lease's, the fence key's and the record's TTL.
    pub fn new(
        keys: RecordKeys,
        token: String,
        ttl: Duration,
        fence_ttl: Duration,
        record_ttl: Duration,
        fingerprint: Fingerprint,
    ) -> Self {
        ClaimRequest {
            keys,
            token,
            ttl,
            fence_ttl,
            record_ttl,
            fingerprint,
        }
    }
}

impl fmt::Debug for ClaimRequest {
    // The token is a bearer secret for the lease: never in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimRequest")
            .field("keys", &self.keys)
            .field("ttl", &self.ttl)
            .field("record_ttl", &self.record_ttl)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// A backend's answer to a [`ClaimRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimReply {
    /// The lease is ours, with this fence.
    Claimed {
        /// The claim's fencing token.
        fence: FencingToken,
    },
    /// Another holder has the key in flight.
    InFlight {
        /// Whether its payload is this request's.
        same_payload: bool,
        /// How long its lease still runs, when known.
        pttl: Option<Duration>,
    },
    /// The key completed.
    Completed {
        /// Whether its payload was this request's.
        same_payload: bool,
        /// What was stored.
        response: StoredResponse,
    },
}

/// Where idempotency records live: [`RedisBackend`](crate::RedisBackend)
/// (standalone, Sentinel, Cluster) and [`MemoryBackend`](crate::MemoryBackend).
/// Leases are locks of the backend's [`LockBackend`] (renewed and released
/// as any lock). Callers bound each call with a timeout.
pub trait IdempotencyBackend: LockBackend {
    /// The claim script: one round trip.
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<ClaimReply>>;

    /// Stores `response` while the lease is `token`'s and the record
    /// carries `fence`, then deletes the lease. `true` when stored —
    /// also when sent again after it stored (the record is done with
    /// `fence`, which only this claim was given), so a retry after a lost
    /// reply tells the truth.
    fn complete<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
        response: &'a StoredResponse,
        record_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Deletes the in-flight record and the lease while they are `token`'s.
    /// `true` when abandoned.
    fn abandon<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<bool>>;
}
