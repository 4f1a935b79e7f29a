//! [`IdempotencyLayer`]: the store, the caller's scope and the HTTP concerns.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderName;
use http::request::Parts;
use http::{Response, StatusCode};
use tollgate_core::idempotency::IdempotencyStore;
use tower_layer::Layer;

use super::service::Idempotency;
use super::shared::Shared;
use super::{default_store_when, never_replayed, OnUnavailable};
use super::{DEFAULT_REPLAY_HEADERS, REPRESENTATION_HEADERS};
use crate::grpc::Protocol;
use crate::lock::OnLeaseLost;
use crate::middleware::Answer;
use crate::rejection::Rejection;

/// The default body limits: 1 MiB.
const MIB: usize = 1024 * 1024;

/// `Idempotency-Key` on `POST` and `PATCH`; see the [module docs](super).
///
/// Clones share the store: an axum `Router::layer` protects every route
/// with one set of records (each keyed by its own route).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderName, StatusCode};
/// use tollgate::idempotency::IdempotencyStore;
/// use tollgate::{LockOptions, MemoryBackend};
/// use tollgate::tower::idempotency::{IdempotencyLayer, OnUnavailable};
/// use tollgate::tower::key::HeaderKey;
///
/// let store = IdempotencyStore::builder(MemoryBackend::new())
///     .record_ttl(Duration::from_secs(3600))
///     .lease(LockOptions::new().ttl(Duration::from_secs(10)))
///     .build()?;
/// let layer = IdempotencyLayer::new(store, HeaderKey::new("x-api-key"))
///     .max_request_body(64 * 1024)
///     .store_when(|s: StatusCode| s.is_success())
///     .replay_headers([http::header::CONTENT_TYPE, HeaderName::from_static("x-order-id")])
///     .on_unavailable(OnUnavailable::Deny);
/// # let _ = layer;
/// # Ok::<(), tollgate::Error>(())
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer<K> {
    shared: Shared,
    scope: K,
}

impl<K: fmt::Debug> fmt::Debug for IdempotencyLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("shared", &self.shared)
            .field("scope", &self.scope)
            .finish()
    }
}

impl<K> IdempotencyLayer<K> {
    /// Records in `store`, scoped by the caller that `scope` names (an API
    /// key, a user id put in the extensions by an authentication layer, …;
    /// a scope that yields no key puts the request in the shared scope
    /// `-`, and a scope error answers with its status). Defaults: the key
    /// required, 1 MiB request and stored bodies, 2xx and 4xx stored
    /// (except 408, 409, 429), [`DEFAULT_REPLAY_HEADERS`] replayed, 503
    /// when the store is unavailable.
    pub fn new(store: IdempotencyStore, scope: K) -> Self {
        IdempotencyLayer {
            shared: Shared {
                store,
                required: true,
                max_request_body: MIB,
                max_stored_body: MIB,
                store_when: Arc::new(default_store_when),
                replay_headers: Arc::from(DEFAULT_REPLAY_HEADERS.to_vec()),
                on_unavailable: OnUnavailable::Deny,
                on_lost: OnLeaseLost::Cancel,
                answer: Answer::default(),
            },
            scope,
        }
    }

    /// Whether a `POST` or `PATCH` without `Idempotency-Key` is refused
    /// with 400 (default: yes). When not, it passes through unprotected.
    pub fn required(mut self, required: bool) -> Self {
        self.shared.required = required;
        self
    }

    /// The largest request body read (default 1 MiB); a larger one is
    /// answered 413 and nothing is stored.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.shared.max_request_body = bytes;
        self
    }

    /// The largest response body stored (default 1 MiB): a larger
    /// response is recorded as completed but not replayable (a retry gets
    /// 409) as soon as it grows past this, and streams on to its client.
    /// A body of known length up to this is read whole before its client
    /// is answered; any other streams as it comes (see the module docs).
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.shared.max_stored_body = bytes;
        self
    }

    /// Which response statuses are stored (default [`default_store_when`]:
    /// 2xx and 4xx except 408, 409, 429). A status not stored abandons the
    /// claim, so a retry runs the handler again.
    pub fn store_when(
        mut self,
        store_when: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.shared.store_when = Arc::new(store_when);
        self
    }

    /// The response headers stored and replayed besides
    /// [`REPRESENTATION_HEADERS`], which always are (`content-type`,
    /// `content-encoding`, `content-language`, `content-location`,
    /// `content-range`, `content-disposition`, `vary`, `etag`,
    /// `last-modified`, `location`: the body cannot be read right without
    /// them). Default: `link` ([`DEFAULT_REPLAY_HEADERS`] in all).
    /// `Set-Cookie`, the rate-limit headers, `Retry-After`,
    /// `Content-Length` and hop-by-hop headers are never replayed, even
    /// when listed.
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let mut all = REPRESENTATION_HEADERS.to_vec();
        for name in names {
            if !never_replayed(&name) && !all.contains(&name) {
                all.push(name);
            }
        }
        self.shared.replay_headers = Arc::from(all);
        self
    }

    /// What to do when the store is unavailable (default
    /// [`OnUnavailable::Deny`]: 503 with `Retry-After: 1`).
    pub fn on_unavailable(mut self, on_unavailable: OnUnavailable) -> Self {
        self.shared.on_unavailable = on_unavailable;
        self
    }

    /// What happens when the claim's lease is lost while the handler runs
    /// (Redis unreachable past the lease's safe deadline, or the hold cap
    /// of the store's [`LockOptions`](tollgate_core::LockOptions::max_hold)
    /// reached — 10 minutes by default). [`OnLeaseLost::Cancel`], the
    /// default: the handler is dropped (cancelled at its next `.await`),
    /// the claim abandoned, and the request answered **503**, so a retry
    /// never runs beside it. [`OnLeaseLost::Continue`]: the handler
    /// finishes and its client gets the response, but a retry may run
    /// while it finishes — its writes must carry the
    /// [`FencingToken`](tollgate_core::FencingToken) — and its completion
    /// stores nothing once the key is no longer its own (a newer claim's
    /// record is never overwritten).
    pub fn on_lease_lost(mut self, on_lost: OnLeaseLost) -> Self {
        self.shared.on_lost = on_lost;
        self
    }

    /// How rejections are shaped (default [`Protocol::Auto`]).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.shared.answer.protocol = protocol;
        self
    }

    /// Replaces every rejection response (400, 409, 413, 422, 503, scope
    /// errors) with `responder`'s, given the [`Rejection`] and the request's
    /// head. Replays are not rejections: they are not passed to it.
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection, &Parts) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.shared.answer.responder = Some(Arc::new(responder));
        self
    }

    /// The store the records are kept in.
    pub fn store(&self) -> &IdempotencyStore {
        &self.shared.store
    }
}

impl<S, K: Clone> Layer<S> for IdempotencyLayer<K> {
    type Service = Idempotency<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, Arc::new(self.shared.clone()), self.scope.clone())
    }
}
