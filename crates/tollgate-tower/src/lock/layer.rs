//! [`LockLayer`]: the locker, the lock options and the HTTP concerns.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Response;
use tollgate_core::{Error, LockOptions, Locker};
use tower_layer::Layer;

use super::{HoldUntil, Lock, OnLeaseLost};
use crate::grpc::Protocol;
use crate::hold::{Gate, Shared};
use crate::middleware::Answer;
use crate::rejection::Rejection;

/// Wraps the inner service in a per-resource lock; see the
/// [module docs](super).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{LockOptions, Locker, MemoryBackend};
/// use tollgate_tower::key::HeaderKey;
/// use tollgate_tower::lock::{HoldUntil, LockLayer, OnLeaseLost};
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
#[derive(Clone)]
pub struct LockLayer<K> {
    shared: Shared,
    key: K,
}

impl<K: fmt::Debug> fmt::Debug for LockLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("shared", &self.shared)
            .field("key", &self.key)
            .finish()
    }
}

impl<K> LockLayer<K> {
    /// Locks the resource named by `key` around each request, with
    /// `locker`'s default [`LockOptions`] (unless configured otherwise: TTL
    /// 30 s, renewed, no waiting, and a hold cap of max(20 × TTL, 10 min) —
    /// a stuck handler loses its lease then).
    pub fn new(locker: Locker, key: K) -> Self {
        LockLayer {
            shared: Shared {
                options: locker.default_options().clone(),
                gate: Gate::Lock(locker),
                hold: HoldUntil::default(),
                on_lost: OnLeaseLost::default(),
                namespace: None,
                answer: Answer::default(),
            },
            key,
        }
    }

    /// Takes the lease with `options` (TTL, wait bound, renewal, hold cap).
    ///
    /// # Panics
    ///
    /// If the locker refuses `options` (a zero TTL, a TTL left with no
    /// validity by the locker's drift allowance, …): a configuration error
    /// at startup, not a 500 on every request. Use
    /// [`try_options`](Self::try_options) for options computed at runtime.
    pub fn options(self, options: LockOptions) -> Self {
        match self.try_options(options) {
            Ok(layer) => layer,
            Err(e) => panic!("tollgate: invalid LockLayer options: {e}"),
        }
    }

    /// Takes the lease with `options`, or says why the locker refuses them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Error, LockOptions, Locker, MemoryBackend};
    /// use tollgate_tower::key::GlobalKey;
    /// use tollgate_tower::LockLayer;
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

    /// How long the lease is held (default [`HoldUntil::Response`]).
    pub fn hold_until(mut self, hold: HoldUntil) -> Self {
        self.shared.hold = hold;
        self
    }

    /// What to do when the lease is lost mid-request (default
    /// [`OnLeaseLost::Cancel`]).
    pub fn on_lease_lost(mut self, on_lost: OnLeaseLost) -> Self {
        self.shared.on_lost = on_lost;
        self
    }

    /// Prefixes every lock name with `namespace`, so two layers keyed the
    /// same way (say by user) lock different things.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.shared.namespace = Some(namespace.into());
        self
    }

    /// How rejections are shaped (default [`Protocol::Auto`]).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.shared.answer.protocol = protocol;
        self
    }

    /// Replaces every rejection response (409, 503, key errors) with
    /// `responder`'s, given the [`Rejection`] and the request's head.
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection, &Parts) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.shared.answer.responder = Some(Arc::new(responder));
        self
    }
}

impl<S, K: Clone> Layer<S> for LockLayer<K> {
    type Service = Lock<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        Lock::new(inner, Arc::new(self.shared.clone()), self.key.clone())
    }
}
