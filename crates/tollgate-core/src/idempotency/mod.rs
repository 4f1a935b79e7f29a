//! Idempotency keys on the library's own fenced leases: the first request
//! with a key runs, a retry after it completed gets the stored response, a
//! retry while it runs is told so, and the same key with another payload is
//! refused — across every process that shares the backend.
//!
//! A record per key (the caller's scope, method, route and
//! `Idempotency-Key`, in one hash tag) goes through two states:
//!
//! - **in flight**: [`IdempotencyStore::claim`] takes a lease on the key
//!   (a lock: TTL, renewed by its watchdog, a [`FencingToken`]) and records
//!   the request's [`Fingerprint`], in one script;
//! - **completed**: [`Claimed::complete`] stores the response (status, the
//!   headers the caller chose, the body) with the record's TTL — fenced: a
//!   holder whose lease was lost or superseded stores nothing, so it never
//!   overwrites a newer record. [`Claimed::abandon`] (or dropping the
//!   claim) removes an in-flight record so that a retry may run.
//!
//! Every key written has a TTL: the lease's, the fence's, the record's.
//! The HTTP side (the draft's statuses, fingerprinting, which responses are
//! stored) is `tollgate-tower`'s `IdempotencyLayer`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate_core::Error> {
//! use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore, StoredResponse};
//! use tollgate_core::{MemoryBackend, Subject};
//!
//! let store = IdempotencyStore::new(MemoryBackend::new());
//! let key = Subject::compound(["tenant-1", "POST /orders", "key-123"]);
//! let payload = Fingerprint::of(b"POST /orders {\"qty\":1}");
//!
//! let Claim::Claimed(claim) = store.claim(key.clone(), payload).await? else { unreachable!() };
//! // ... run the handler once ...
//! let response = StoredResponse::new(201, vec![("location".into(), b"/orders/9".to_vec())], b"{\"order\":9}".to_vec());
//! assert!(claim.complete(&response).await?);
//!
//! // A retry gets the stored response; another payload is refused.
//! assert!(matches!(store.claim(key.clone(), payload).await?, Claim::Completed(r) if r == response));
//! assert!(matches!(store.claim(key, Fingerprint::of(b"other")).await?, Claim::Mismatch));
//! # Ok(()) }
//! ```
//!
//! [`FencingToken`]: crate::FencingToken

mod backend;
pub(crate) mod memory;
mod redis;
mod store;

pub use self::backend::{ClaimReply, ClaimRequest, IdempotencyBackend, RecordKeys};
pub use self::store::{
    Claim, Claimed, IdempotencyStore, IdempotencyStoreBuilder, DEFAULT_RECORD_TTL,
};

use std::fmt;

use sha2::{Digest, Sha256};

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
}

impl StoredResponse {
    /// A replayable response.
    pub fn new(status: u16, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Self {
        StoredResponse {
            status,
            headers,
            body: Some(body),
        }
    }

    /// A completed request whose response was not kept (too large).
    pub fn not_replayable(status: u16) -> Self {
        StoredResponse {
            status,
            headers: Vec::new(),
            body: None,
        }
    }

    /// Headers as stored: `name NUL value NUL …` (HTTP header names and
    /// values cannot contain NUL).
    pub(crate) fn encode_headers(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            out.extend_from_slice(value);
            out.push(0);
        }
        out
    }

    /// The inverse of [`encode_headers`](Self::encode_headers); `None` for a
    /// value that is not one.
    pub(crate) fn decode_headers(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
        if bytes.is_empty() {
            return Some(Vec::new());
        }
        let parts: Vec<&[u8]> = bytes.strip_suffix(&[0])?.split(|b| *b == 0).collect();
        if !parts.len().is_multiple_of(2) {
            return None;
        }
        parts
            .chunks(2)
            .map(|kv| Some((String::from_utf8(kv[0].to_vec()).ok()?, kv[1].to_vec())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let r = StoredResponse::new(
            201,
            vec![
                ("location".into(), b"/a".to_vec()),
                ("etag".into(), b"\"x\"".to_vec()),
                ("x-empty".into(), Vec::new()),
            ],
            Vec::new(),
        );
        let bytes = r.encode_headers();
        assert_eq!(StoredResponse::decode_headers(&bytes).unwrap(), r.headers);
        assert_eq!(StoredResponse::decode_headers(b"").unwrap(), vec![]);
        assert!(StoredResponse::decode_headers(b"a\0").is_none());
        assert!(StoredResponse::decode_headers(b"a\0b").is_none());
    }

    #[test]
    fn fingerprints() {
        assert_eq!(
            Fingerprint::of(b"").to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_ne!(Fingerprint::of(b"a"), Fingerprint::of(b"b"));
    }
}
