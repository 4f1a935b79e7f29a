//! [`HeldPermit`]: one of a key's N concurrency permits, held for the
//! duration of a handler.

use std::fmt;
use std::marker::PhantomData;

use axum_core::extract::{FromRef, FromRequestParts};
use http::request::Parts;
use tollgate_core::{FencingToken, LockOptions, Permit, Result, Semaphore, Subject};
use tollgate_tower::concurrency;
use tollgate_tower::grpc::Protocol;
use tollgate_tower::headers::concurrency_policy;
use tollgate_tower::key::KeyExtractor;
use tollgate_tower::rejection::Rejection;

/// A concurrency limit a [`HeldPermit`] enforces: how a request names its
/// key (a [`KeyExtractor`], as for the layers), the permit options, and the
/// namespace — the same three things a
/// [`ConcurrencyLimitLayer`](tollgate_tower::ConcurrencyLimitLayer) takes,
/// so an extractor and a layer with the same namespace share permits and
/// answer alike.
///
/// ```
/// use std::time::Duration;
/// use tollgate::LockOptions;
/// use tollgate::tower::key::HeaderKey;
/// use tollgate::axum::PermitResource;
///
/// /// At most N exports in flight per tenant.
/// struct Exports;
///
/// impl<S> PermitResource<S> for Exports {
///     type Key = HeaderKey;
///
///     fn key(_: &S) -> HeaderKey {
///         HeaderKey::new("x-tenant")
///     }
///
///     fn namespace(_: &S) -> Option<&'static str> {
///         Some("export")
///     }
///
///     fn options(_: &S) -> LockOptions {
///         // Wait up to 1 s for a permit, then answer 429.
///         LockOptions::new().ttl(Duration::from_secs(30)).wait(Duration::from_secs(1))
///     }
/// }
/// ```
pub trait PermitResource<S>: 'static {
    /// How a request names its key. A request it leaves unkeyed
    /// (`Ok(None)`) is answered 500: a `HeldPermit` always needs a key.
    type Key: KeyExtractor;

    /// The extractor for this router's state.
    fn key(state: &S) -> Self::Key;

    /// The namespace keys are prefixed with (and the policy name of
    /// `RateLimit-Policy`), as [`ConcurrencyLimitLayer::namespace`](tollgate_tower::ConcurrencyLimitLayer::namespace).
    /// Default: none (policy `concurrency`).
    fn namespace(state: &S) -> Option<&'static str> {
        let _ = state;
        None
    }

    /// How the permit is taken: its TTL and wait bound. Default: the
    /// [`Semaphore`]'s own (its builder's `default_options`), as a
    /// [`ConcurrencyLimitLayer`](tollgate_tower::ConcurrencyLimitLayer) on
    /// it takes; unless set there, [`LockOptions::new`] — a 30 s TTL, no
    /// waiting. The permit is renewed every TTL/3 for as long as the
    /// [`HeldPermit`] lives, whatever these options say of renewal and the
    /// hold cap (as the layer's).
    fn options(state: &S) -> LockOptions
    where
        Semaphore: FromRef<S>,
    {
        Semaphore::from_ref(state).default_options().clone()
    }
}

/// One of a key's permits, held for the handler: an extractor that takes a
/// permit of the [`Semaphore`] in the router's state (through [`FromRef`])
/// for the key `R` names (see [`PermitResource`]).
///
/// Rejections are the [`ConcurrencyLimitLayer`](tollgate_tower::ConcurrencyLimitLayer)'s:
/// **429** with `Retry-After` and `RateLimit-Policy` (gRPC
/// RESOURCE_EXHAUSTED) when every permit is taken beyond the wait bound;
/// **503** when the backend is unavailable and the semaphore's failure
/// policy is deny. When it fails open, the handler runs without a permit
/// ([`is_held`](Self::is_held) is false, [`fence`](Self::fence) is `None`).
/// Dropping the guard releases the permit without blocking.
///
/// The permit is renewed for as long as the guard lives, with no hold cap
/// ([`LockOptions::max_hold`] bounds leases a holder may forget; a handler
/// in flight is not one), so "at most N in flight" holds for a handler
/// however long it runs. Keep the guard for the work it limits: moved into
/// a response stream it is held until the stream is dropped; stored
/// anywhere longer-lived, it keeps its permit until dropped. A permit is
/// lost only through a fault of the backend (unreachable past the safe
/// deadline, its key deleted): [`is_held`](Self::is_held) turns false and
/// the permit's [`lost`](tollgate_core::Lease::lost) future resolves; an
/// extractor cannot cancel its handler, so a handler that must not run
/// on without it watches that future.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use axum::{body::Body, routing::post, Router};
/// use http::{Request, StatusCode};
/// use tollgate::{MemoryBackend, Semaphore};
/// use tollgate::tower::key::GlobalKey;
/// use tollgate::axum::{HeldPermit, PermitResource};
/// use tower::ServiceExt;
///
/// /// Two renders at a time, fleet-wide.
/// struct Renders;
///
/// impl<S> PermitResource<S> for Renders {
///     type Key = GlobalKey;
///     fn key(_: &S) -> GlobalKey {
///         GlobalKey
///     }
/// }
///
/// async fn render(permit: HeldPermit<Renders>) -> String {
///     format!("rendered under {}", permit.fence().unwrap())
/// }
///
/// let renders = Semaphore::new(MemoryBackend::new(), 2)?;
/// let app = Router::new().route("/render", post(render)).with_state(renders);
/// let res = app.oneshot(Request::post("/render").body(Body::empty()).unwrap()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::OK);
/// # Ok(()) }
/// ```
#[must_use = "dropping a HeldPermit releases the permit at once"]
pub struct HeldPermit<R> {
    permit: Option<Permit>,
    _resource: PhantomData<fn() -> R>,
}

impl<R> fmt::Debug for HeldPermit<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldPermit")
            .field("resource", &std::any::type_name::<R>())
            .field("permit", &self.permit)
            .finish()
    }
}

impl<S, R> FromRequestParts<S> for HeldPermit<R>
where
    S: Send + Sync,
    R: PermitResource<S>,
    Semaphore: FromRef<S>,
{
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Rejection> {
        let shape = |r: Rejection| r.for_protocol(Protocol::Auto, &parts.headers);
        let key = crate::lock::required_key(&R::key(state), parts, "HeldPermit")?;
        let namespace = R::namespace(state);
        let key = match namespace {
            Some(ns) => Subject::compound([ns, key.as_encoded()]),
            None => key,
        };
        let semaphore = Semaphore::from_ref(state);
        let policy = concurrency_policy(namespace.unwrap_or("concurrency"), semaphore.permits());
        match concurrency::acquire(&semaphore, key, &R::options(state), &policy).await {
            Ok(permit) => Ok(HeldPermit {
                permit,
                _resource: PhantomData,
            }),
            Err(rejection) => Err(shape(rejection)),
        }
    }
}

impl<R> HeldPermit<R> {
    /// Wraps a permit taken elsewhere (`None`: let through without one).
    pub fn from_permit(permit: Option<Permit>) -> Self {
        HeldPermit {
            permit,
            _resource: PhantomData,
        }
    }

    /// The permit's fencing token; `None` when the request went ahead
    /// without a permit (the backend was down and the policy fails open).
    pub fn fence(&self) -> Option<FencingToken> {
        self.permit.as_ref().map(Permit::fence)
    }

    /// Whether a permit is held and can still be trusted.
    pub fn is_held(&self) -> bool {
        self.permit.as_ref().is_some_and(Permit::is_held)
    }

    /// The permit itself (its `lost()` future, `remaining()`, …), if any.
    pub fn permit(&self) -> Option<&Permit> {
        self.permit.as_ref()
    }

    /// Gives the permit back now; `Ok(false)` when it was no longer ours
    /// or there was none.
    pub async fn release(self) -> Result<bool> {
        match self.permit {
            Some(p) => p.release().await,
            None => Ok(false),
        }
    }
}
