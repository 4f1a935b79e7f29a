//! [`ConcurrencyLimitLayer`]: the semaphore, the permit options and the HTTP
//! concerns.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Response;
use tollgate_core::{Error, LockOptions, Semaphore};
use tower_layer::Layer;

use super::{ConcurrencyLimit, HoldUntil, OnLeaseLost};
use crate::grpc::Protocol;
use crate::headers::concurrency_policy;
use crate::hold::{Gate, Shared};
use crate::middleware::Answer;
use crate::rejection::Rejection;

/// At most the semaphore's N requests in flight per key, fleet-wide; see
/// the [module docs](super).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{LockOptions, MemoryBackend, Semaphore};
/// use tollgate_tower::concurrency::{ConcurrencyLimitLayer, HoldUntil};
/// use tollgate_tower::key::HeaderKey;
///
/// let permits = Semaphore::new(MemoryBackend::new(), 4)?;
/// let layer = ConcurrencyLimitLayer::new(permits, HeaderKey::new("x-api-key"))
///     .namespace("llm")
///     // Wait up to 2 s for a permit before answering 429.
///     .options(LockOptions::new().ttl(Duration::from_secs(30)).wait(Duration::from_secs(2)))
///     .hold_until(HoldUntil::BodyEnd);
/// # let _ = layer;
/// # Ok::<(), tollgate_core::Error>(())
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimitLayer<K> {
    shared: Shared,
    key: K,
}

impl<K: fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("shared", &self.shared)
            .field("key", &self.key)
            .finish()
    }
}

/// The policy name of a layer: its namespace, or `concurrency`.
fn policy_name(namespace: Option<&str>) -> &str {
    namespace.unwrap_or("concurrency")
}

impl<K> ConcurrencyLimitLayer<K> {
    /// Limits each key that `key` names to `semaphore`'s permits, with the
    /// semaphore's default [`LockOptions`] (unless configured otherwise: TTL
    /// 30 s renewed while held, no waiting). Permits are held until the
    /// response body ends ([`HoldUntil::BodyEnd`]); a lost permit is
    /// reported and the request goes on ([`OnLeaseLost::Continue`]).
    pub fn new(semaphore: Semaphore, key: K) -> Self {
        let permits = semaphore.permits();
        ConcurrencyLimitLayer {
            shared: Shared {
                options: semaphore.default_options().clone(),
                gate: Gate::Permits {
                    semaphore,
                    policy: concurrency_policy(policy_name(None), permits),
                },
                hold: HoldUntil::BodyEnd,
                on_lost: OnLeaseLost::Continue,
                namespace: None,
                answer: Answer::default(),
            },
            key,
        }
    }

    /// Takes permits with `options` (TTL, wait bound, renewal, hold cap).
    ///
    /// # Panics
    ///
    /// If the semaphore refuses `options` (a zero TTL, …): a configuration
    /// error at startup. Use [`try_options`](Self::try_options) for options
    /// computed at runtime.
    pub fn options(self, options: LockOptions) -> Self {
        match self.try_options(options) {
            Ok(layer) => layer,
            Err(e) => panic!("tollgate: invalid ConcurrencyLimitLayer options: {e}"),
        }
    }

    /// Takes permits with `options`, or says why the semaphore refuses them.
    pub fn try_options(mut self, options: LockOptions) -> Result<Self, Error> {
        self.shared.gate.check_options(&options)?;
        self.shared.options = options;
        Ok(self)
    }

    /// How long a permit is held (default [`HoldUntil::BodyEnd`]).
    pub fn hold_until(mut self, hold: HoldUntil) -> Self {
        self.shared.hold = hold;
        self
    }

    /// What to do when a permit is lost mid-request (default
    /// [`OnLeaseLost::Continue`]: reported, not cancelled).
    pub fn on_permit_lost(mut self, on_lost: OnLeaseLost) -> Self {
        self.shared.on_lost = on_lost;
        self
    }

    /// Prefixes every key with `namespace`, so two layers keyed the same way
    /// (say by API key) count separately; it also names the policy in
    /// `RateLimit-Policy`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        if let Gate::Permits { semaphore, policy } = &mut self.shared.gate {
            *policy = concurrency_policy(policy_name(Some(&namespace)), semaphore.permits());
        }
        self.shared.namespace = Some(namespace);
        self
    }

    /// How rejections are shaped (default [`Protocol::Auto`]).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.shared.answer.protocol = protocol;
        self
    }

    /// Replaces every rejection response (429, 503, key errors) with
    /// `responder`'s, given the [`Rejection`] and the request's head.
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection, &Parts) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.shared.answer.responder = Some(Arc::new(responder));
        self
    }
}

impl<S, K: Clone> Layer<S> for ConcurrencyLimitLayer<K> {
    type Service = ConcurrencyLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::new(inner, Arc::new(self.shared.clone()), self.key.clone())
    }
}
