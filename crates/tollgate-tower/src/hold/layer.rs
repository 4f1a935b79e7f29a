//! [`HoldLayer`]: what the lock and concurrency-limit layers share — the
//! gate, the options and the HTTP concerns — written once; each layer is
//! this type with its own marker and constructor.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Response;
use tollgate_core::{Error, LockOptions};
use tower_layer::Layer;

use super::{Gate, Hold, Shared};
use crate::grpc::Protocol;
use crate::headers::concurrency_policy;
use crate::lock::{HoldUntil, OnLeaseLost};
use crate::rejection::Rejection;

/// Which layer a [`HoldLayer`] is: its name in `Debug` output and panics.
pub trait HoldKind: 'static {
    /// The layer's type name.
    const NAME: &'static str;
}

/// A layer that runs the inner service while something is held: a lease
/// ([`LockLayer`](crate::LockLayer)) or one of N permits
/// ([`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer)). Use those
/// names; their constructors live with them.
pub struct HoldLayer<K, M> {
    pub(crate) shared: Shared,
    pub(crate) key: K,
    pub(crate) kind: PhantomData<fn() -> M>,
}

impl<K: Clone, M> Clone for HoldLayer<K, M> {
    fn clone(&self) -> Self {
        HoldLayer {
            shared: self.shared.clone(),
            key: self.key.clone(),
            kind: PhantomData,
        }
    }
}

impl<K: fmt::Debug, M: HoldKind> fmt::Debug for HoldLayer<K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(M::NAME)
            .field("shared", &self.shared)
            .field("key", &self.key)
            .finish()
    }
}

impl<K, M: HoldKind> HoldLayer<K, M> {
    pub(crate) fn with(shared: Shared, key: K) -> Self {
        HoldLayer {
            shared,
            key,
            kind: PhantomData,
        }
    }

    /// Takes the lease or permit with `options` (TTL, wait bound, renewal,
    /// hold cap). A concurrency limit's permit is renewed for as long as its
    /// request runs, whatever `options` say of renewal and the hold cap (see
    /// [`concurrency`](crate::concurrency)); a lock's lease follows them.
    ///
    /// # Panics
    ///
    /// If the locker or semaphore refuses `options` (a zero TTL, a TTL left
    /// with no validity by the drift allowance, …): a configuration error at
    /// startup, not a 500 on every request. Use
    /// [`try_options`](Self::try_options) for options computed at runtime.
    pub fn options(self, options: LockOptions) -> Self {
        match self.try_options(options) {
            Ok(layer) => layer,
            Err(e) => panic!("tollgate: invalid {} options: {e}", M::NAME),
        }
    }

    /// Takes the lease or permit with `options`, or says why they are
    /// refused.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Error, LockOptions, Locker, MemoryBackend};
    /// use tollgate::tower::key::GlobalKey;
    /// use tollgate::tower::LockLayer;
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let ok = LockLayer::new(locker.clone(), GlobalKey).try_options(LockOptions::new().ttl(Duration::from_secs(10)));
    /// assert!(ok.is_ok());
    /// let err = LockLayer::new(locker, GlobalKey).try_options(LockOptions::new().ttl(Duration::ZERO)).unwrap_err();
    /// assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    /// ```
    pub fn try_options(mut self, options: LockOptions) -> Result<Self, Error> {
        self.shared.gate.check_options(&options)?;
        self.shared.options = options;
        Ok(self)
    }

    /// How long the lease or permit is held (the lock layer's default is
    /// [`HoldUntil::Response`], the concurrency limit's
    /// [`HoldUntil::BodyEnd`]).
    pub fn hold_until(mut self, hold: HoldUntil) -> Self {
        self.shared.hold = hold;
        self
    }

    /// What to do when the lease or permit is lost mid-request (the lock
    /// layer's default is [`OnLeaseLost::Cancel`], the concurrency limit's
    /// [`OnLeaseLost::Continue`]; a loss is always reported).
    pub fn on_lease_lost(mut self, on_lost: OnLeaseLost) -> Self {
        self.shared.on_lost = on_lost;
        self
    }

    /// Prefixes every key with `namespace`, so two layers keyed the same way
    /// (say by user) hold different things; for a concurrency limit it also
    /// names the policy in `RateLimit-Policy`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        if let Gate::Permits { semaphore, policy } = &mut self.shared.gate {
            *policy = concurrency_policy(&namespace, semaphore.permits());
        }
        self.shared.namespace = Some(namespace);
        self
    }

    /// How rejections are shaped (default [`Protocol::Auto`]).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.shared.answer.protocol = protocol;
        self
    }

    /// Replaces every rejection response (409 or 429, 503, key errors) with
    /// `responder`'s, given the [`Rejection`] and the request's head.
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection, &Parts) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.shared.answer.responder = Some(Arc::new(responder));
        self
    }
}

impl<S, K: Clone, M> Layer<S> for HoldLayer<K, M> {
    type Service = Hold<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Hold::new(inner, Arc::new(self.shared.clone()), self.key.clone())
    }
}
