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
//!   holder whose claim was superseded (the key claimed again) stores
//!   nothing, so it never overwrites a newer record; one whose lease merely
//!   expired, with nobody claiming since, still stores. A completion that fails as an outage is
//!   sent again (a replay after it stored answers `true`) until it lands or
//!   the lease's safe deadline passes; one that cannot be stored is never
//!   released: the handler has run, so a retry is told the key is in
//!   flight until the lease expires instead of running it again. After
//!   that (a fault longer than the lease's TTL) the record looks like a
//!   crashed holder's, and the next claim runs the handler again.
//!   [`Claimed::abandon`] (or dropping the claim before completing it)
//!   removes an in-flight record so that a retry may run.
//!
//! Every key written has a TTL: the lease's, the fence's, the record's.
//! The HTTP side (the draft's statuses, fingerprinting, which responses are
//! stored) is `tollgate-tower`'s `IdempotencyLayer`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! use tollgate::idempotency::{Claim, Fingerprint, IdempotencyStore, StoredResponse};
//! use tollgate::{MemoryBackend, Subject};
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

mod store;

pub use self::store::{
    Claim, Claimed, IdempotencyStore, IdempotencyStoreBuilder, DEFAULT_RECORD_TTL,
};
pub use crate::store::{
    ClaimReply, ClaimRequest, Fingerprint, IdempotencyBackend, InFlightRecord, RecordKeys,
    StoredResponse,
};

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
        let (headers, trailers) = StoredResponse::decode_headers(&bytes).unwrap();
        assert_eq!((headers, trailers), (r.headers.clone(), vec![]));
        let t = r.clone().with_trailers(vec![
            ("grpc-status".into(), b"0".to_vec()),
            ("grpc-message".into(), Vec::new()),
        ]);
        let (headers, trailers) = StoredResponse::decode_headers(&t.encode_headers()).unwrap();
        assert_eq!((headers, trailers), (t.headers, t.trailers));
        assert_eq!(
            StoredResponse::decode_headers(b"").unwrap(),
            (vec![], vec![])
        );
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
