//! [`IdempotencyBackend`]: the three record operations, as a backend
//! provides them (Lua scripts on Redis, their twin in memory), and the
//! operator's listing of the records in flight ([`InFlightRecord`]).

use std::fmt;
use std::time::Duration;

use futures_util::future::BoxFuture;

use sha2::{Digest, Sha256};

use super::holders::parse_lock_key;
use super::lock::{unsupported, FencingToken, LockBackend, LockKeys};
use crate::error::Result;

/// What identifies a request's payload: a SHA-256 digest (of the method,
/// path and query, content type and body, as the layer computes it).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// A digest computed elsewhere (e.g. incrementally over a body).
    pub fn from_digest(digest: [u8; 32]) -> Fingerprint {
        Fingerprint(digest)
    }

    /// Lower-case hex, as stored.
    pub fn to_hex(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        s
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

/// A stored response: the status, the headers the caller chose to keep
/// (an allow-list: never `Set-Cookie`), and the body — or no body when it
/// was too large to store, in which case the record only says the request
/// completed and cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredResponse {
    /// The HTTP status code.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, byte for byte; `None`: completed, but not replayable.
    pub body: Option<Vec<u8>>,
    /// Trailer names (lower case) and values, in order: what follows the
    /// body (a gRPC call's `grpc-status`).
    pub trailers: Vec<(String, Vec<u8>)>,
}

/// What marks a trailer among the stored header fields: `:` is no header
/// name's character, so no header reads as one.
const TRAILER: &str = ":trailer:";

impl StoredResponse {
    /// A replayable response.
    pub fn new(status: u16, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Self {
        StoredResponse {
            status,
            headers,
            body: Some(body),
            trailers: Vec::new(),
        }
    }

    /// With `trailers` after the body.
    pub fn with_trailers(mut self, trailers: Vec<(String, Vec<u8>)>) -> Self {
        self.trailers = trailers;
        self
    }

    /// A completed request whose response was not kept (too large).
    pub fn not_replayable(status: u16) -> Self {
        StoredResponse {
            status,
            headers: Vec::new(),
            body: None,
            trailers: Vec::new(),
        }
    }

    /// Headers, then trailers, as stored: `name NUL value NUL …`, each
    /// trailer's name after `:trailer:` (HTTP field names and values
    /// cannot contain NUL, nor names `:`).
    pub(crate) fn encode_headers(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let trailers = self.trailers.iter().map(|(n, v)| (TRAILER, n, v));
        for (mark, name, value) in self.headers.iter().map(|(n, v)| ("", n, v)).chain(trailers) {
            out.extend_from_slice(mark.as_bytes());
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            out.extend_from_slice(value);
            out.push(0);
        }
        out
    }

    /// The inverse of [`encode_headers`](Self::encode_headers): the
    /// headers and the trailers; `None` for a value that is not one.
    pub(crate) fn decode_headers(bytes: &[u8]) -> Option<Fields> {
        let (mut headers, mut trailers) = (Vec::new(), Vec::new());
        if bytes.is_empty() {
            return Some((headers, trailers));
        }
        let parts: Vec<&[u8]> = bytes.strip_suffix(&[0])?.split(|b| *b == 0).collect();
        if !parts.len().is_multiple_of(2) {
            return None;
        }
        for kv in parts.chunks(2) {
            let name = String::from_utf8(kv[0].to_vec()).ok()?;
            match name.strip_prefix(TRAILER) {
                Some(trailer) => trailers.push((trailer.to_owned(), kv[1].to_vec())),
                None => headers.push((name, kv[1].to_vec())),
            }
        }
        Some((headers, trailers))
    }
}

/// Stored header fields: the headers, then the trailers.
pub(crate) type Fields = (Vec<(String, Vec<u8>)>, Vec<(String, Vec<u8>)>);

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

/// `(name, subject)` of an idempotency record key under `prefix`:
/// `<prefix>:<name>:{<subject>}:record`, read as
/// [`parse_lock_key`] reads its lease's key. `None` for any other key.
pub(crate) fn parse_record_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str)> {
    parse_lock_key(prefix, key.strip_suffix(":record")?)
}

/// One idempotency record in flight — claimed under a live lease, not
/// completed — as the store keeps it: what an operator's listing shows.
/// Neither the lease's owner token nor the request's fingerprint is in it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InFlightRecord {
    /// The keyspace policy of the idempotency store (`idem` by default).
    pub name: String,
    /// The key's subject as it appears in keys
    /// ([`Subject::as_encoded`](crate::Subject::as_encoded)).
    pub subject: String,
    /// The claim's fence.
    pub fence: FencingToken,
    /// How long since the claim, by the store's clock; `None` for a record
    /// claimed by a version that did not store when.
    pub held: Option<Duration>,
    /// How long its lease still runs unless renewed.
    pub ttl: Duration,
}

impl InFlightRecord {
    pub(crate) fn new(name: &str, subject: &str, fence: u64, ttl: Duration) -> Self {
        InFlightRecord {
            name: name.to_owned(),
            subject: subject.to_owned(),
            fence: FencingToken(fence),
            held: None,
            ttl,
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

    /// Every record under `prefix` in flight now: the keys
    /// `<prefix>:<name>:{<subject>}:record` claimed under a lease that still
    /// runs and not completed (an abandoned record is gone; one whose lease
    /// expired is not listed). For operators: it walks the keyspace (`SCAN`
    /// on every master of a cluster), so it costs time in proportion to all
    /// keys, never anything on the claim path. Backends without it keep the
    /// default, an error.
    fn records_in_flight<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<InFlightRecord>>> {
        let _ = prefix;
        Box::pin(std::future::ready(Err(unsupported(
            self.lock_kind(),
            "listing idempotency keys in flight",
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_are_told_from_the_others() {
        assert_eq!(
            parse_record_key("app", "app:idem:{k%3A1}:record"),
            Some(("idem", "k%3A1"))
        );
        assert_eq!(parse_record_key("app", "app:idem:{k}"), None);
        assert_eq!(parse_record_key("app", "app:idem:{k}:fence"), None);
        assert_eq!(parse_record_key("app", "app:x:idem:{k}:record"), None);
        assert_eq!(parse_record_key("app", "app:idem:{}:record"), None);
        assert_eq!(
            parse_record_key("a:b", "a:b:idem:{k}:record"),
            Some(("idem", "k"))
        );
    }
}
