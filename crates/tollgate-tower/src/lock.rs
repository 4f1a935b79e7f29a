//! [`LockLayer`]: a per-resource fenced mutex around the inner service.
//!
//! For each request, in the response future:
//!
//! 1. the [key extractor](crate::key) names the resource (or says "not
//!    locked": the request passes straight through; or refuses it);
//! 2. the lock for that resource is acquired — without waiting by default,
//!    or up to a [wait bound](LockLayer::wait);
//! 3. held: the lease's [`FencingToken`] goes into the request extensions
//!    (the handler passes it to the resource, which refuses lower tokens),
//!    with a [`LeaseLost`] future the handler may watch itself, and the
//!    inner service is called; the lease is renewed by its watchdog
//!    while the inner future runs (and, with [`HoldUntil::BodyEnd`], until
//!    the response body ends), then released — and the release is awaited
//!    before the response is returned, so the next request finds the lock
//!    free;
//! 4. busy: **409** with `Retry-After` from the holder's remaining TTL
//!    (rounded up), gRPC ABORTED with retry information; the backend down:
//!    **503**, gRPC UNAVAILABLE.
//!
//! If the lease is lost while the inner future runs (Redis paused past the
//! lease's safe deadline, the lock deleted or taken), the inner future is
//! **dropped** — the handler is cancelled at its next `.await` — and the
//! request is answered **503** (gRPC ABORTED); see [`OnLeaseLost`].
//!
//! Before reaching for a lock, prefer a unique constraint, an idempotency
//! key or a single-writer design (see `tollgate_core::lock`); a lock
//! protects data only together with the fencing token.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{body::Body, extract::Path, routing::post, Extension, Router};
//! use http::{Request, StatusCode};
//! use tollgate_core::{FencingToken, Locker, MemoryBackend};
//! use tollgate_tower::key::RouteKey;
//! use tollgate_tower::LockLayer;
//! use tower::ServiceExt;
//!
//! async fn import(Path(id): Path<u32>, Extension(fence): Extension<FencingToken>) -> String {
//!     // ... write to the store with `fence`; the store refuses lower fences ...
//!     format!("imported {id} with fence {fence}")
//! }
//!
//! // One import per account at a time.
//! let key = |req: &Request<Body>| {
//!     Ok(req.uri().path().split('/').nth(2).map(tollgate_core::Subject::new))
//! };
//! let app = Router::new()
//!     .route("/accounts/{id}/import", post(import))
//!     .layer(LockLayer::new(Locker::new(MemoryBackend::new()), key).namespace("import"));
//!
//! let res = app
//!     .oneshot(Request::post("/accounts/7/import").body(Body::empty())?)
//!     .await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! # Ok(()) }
//! ```
//!
//! # Configuration errors
//!
//! The lock options (TTL, hold cap) are checked when the layer is applied:
//! an invalid one (a zero TTL, a zero `max_hold`, …) **panics** with the
//! reason, at startup, like [`RateLimitLayer`](crate::RateLimitLayer) does,
//! instead of failing every request with a 500. Call
//! [`LockLayer::validate`] to get the error as a `Result` instead. See
//! [`Acquirer::check_options`] for what can be checked up front.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tollgate_core::{Error, Lease, LeaseLost, LockOptions, Locker, MemoryBackend, Subject};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{release, LeaseGuard, ResponseBody};
use crate::key::KeyExtractor;
use crate::response::{
    respond, retry_after_secs, Middleware, Protocol, Reason, Rejection, Responder,
};

// Re-exported so handlers can name what the middleware puts in the request
// extensions without another import.
pub use tollgate_core::FencingToken;

/// Something that hands out leases: [`Locker`] (one Redis, a cluster, or
/// memory, or a Redlock over several independent masters).
///
/// ```
/// use tollgate_core::{Locker, MemoryBackend};
/// use tollgate_tower::lock::Acquirer;
///
/// fn takes_any<A: Acquirer>(_: A) {}
/// takes_any(Locker::new(MemoryBackend::new()));
/// ```
pub trait Acquirer: Clone + Send + Sync + 'static {
    /// Acquires the lock `name`, waiting up to `options`' wait bound.
    fn acquire_lease(
        &self,
        name: Subject,
        options: LockOptions,
    ) -> BoxFuture<'static, Result<Lease, Error>>;

    /// The options a [`LockLayer`] starts from.
    fn default_options(&self) -> LockOptions;

    /// Checks `options` without a round trip; [`LockLayer`] calls it when it
    /// is applied (and from [`LockLayer::validate`]), so invalid options are
    /// reported at startup rather than as a 500 on every request.
    ///
    /// The default runs the rules every locker applies to options,
    /// whatever its settings — TTL and hold-cap bounds — through
    /// `tollgate_core`'s own validation (a throwaway locker with no drift
    /// allowance, the most lenient setting). It cannot see the drift
    /// allowance of the actual locker, so a TTL that is positive but left
    /// with no validity by that allowance (2 ms under the default 1 % + 2 ms)
    /// is still only refused at acquire.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{LockOptions, Locker, MemoryBackend};
    /// use tollgate_tower::lock::Acquirer;
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// assert!(locker.check_options(&LockOptions::new()).is_ok());
    /// assert!(locker.check_options(&LockOptions::new().ttl(Duration::ZERO)).is_err());
    /// ```
    fn check_options(&self, options: &LockOptions) -> Result<(), Error> {
        check_options_portably(options)
    }
}

/// The option rules of `tollgate_core` that hold for every locker: a locker
/// with no drift allowance refuses only what every locker refuses.
fn check_options_portably(options: &LockOptions) -> Result<(), Error> {
    Locker::builder(MemoryBackend::new())
        .drift(0.0, Duration::ZERO)
        .default_options(options.clone())
        .build()
        .map(drop)
}

impl Acquirer for Locker {
    fn acquire_lease(
        &self,
        name: Subject,
        options: LockOptions,
    ) -> BoxFuture<'static, Result<Lease, Error>> {
        let locker = self.clone();
        Box::pin(async move { locker.acquire(name, &options).await })
    }

    fn default_options(&self) -> LockOptions {
        Locker::default_options(self).clone()
    }

    fn check_options(&self, options: &LockOptions) -> Result<(), Error> {
        Locker::check_options(self, options)
    }
}

/// How long the lease is held.
///
/// ```
/// use tollgate_tower::lock::HoldUntil;
/// assert_eq!(HoldUntil::default(), HoldUntil::Response);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HoldUntil {
    /// Until the inner service's future has produced the response (the
    /// default): the handler's work is protected, streaming the body is not.
    #[default]
    Response,
    /// Until the response body has been sent to the end (or dropped): for
    /// handlers whose work happens while the body streams.
    BodyEnd,
}

/// What happens when the lease is lost while the request is being handled.
///
/// ```
/// use tollgate_tower::lock::OnLeaseLost;
/// assert_eq!(OnLeaseLost::default(), OnLeaseLost::Cancel);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLeaseLost {
    /// Drop the inner future (cancelling the handler) and answer 503 — or,
    /// while a body held with [`HoldUntil::BodyEnd`] streams, end the body
    /// with an error (the default).
    #[default]
    Cancel,
    /// Let the handler finish; it can watch the [`LeaseLost`] in the
    /// request extensions itself, and its writes must carry the fence.
    Continue,
}

#[derive(Clone)]
struct Shared<L> {
    locker: L,
    options: LockOptions,
    hold: HoldUntil,
    on_lost: OnLeaseLost,
    namespace: Option<String>,
    protocol: Protocol,
    responder: Option<Responder>,
}

impl<L: fmt::Debug> fmt::Debug for Shared<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("locker", &self.locker)
            .field("options", &self.options)
            .field("hold", &self.hold)
            .field("on_lost", &self.on_lost)
            .field("namespace", &self.namespace)
            .field("protocol", &self.protocol)
            .field("responder", &self.responder.is_some())
            .finish()
    }
}

impl<L> Shared<L> {
    fn reject(
        &self,
        parts: &http::request::Parts,
        reason: Reason<'_>,
        grpc: bool,
    ) -> Response<Bytes> {
        let mut headers = HeaderMap::new();
        if let Reason::Busy {
            retry_after: Some(wait),
        } = &reason
        {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(*wait)));
        }
        respond(
            self.responder.as_ref(),
            &Rejection::new(parts, Middleware::Lock, reason, grpc, headers),
        )
    }
}

#[cfg(feature = "metrics")]
fn count(outcome: &'static str) {
    metrics::counter!("tollgate_lock_requests_total", "outcome" => outcome).increment(1);
}

#[cfg(not(feature = "metrics"))]
fn count(_outcome: &'static str) {}

/// Wraps the inner service in a per-resource lock; see the
/// [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Locker, MemoryBackend};
/// use tollgate_tower::key::HeaderKey;
/// use tollgate_tower::lock::{HoldUntil, LockLayer, OnLeaseLost};
///
/// let layer = LockLayer::new(Locker::new(MemoryBackend::new()), HeaderKey::new("x-order").plain())
///     .namespace("orders")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .renew(true)
///     .max_hold(Duration::from_secs(120))
///     .hold_until(HoldUntil::BodyEnd)
///     .on_lease_lost(OnLeaseLost::Cancel);
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct LockLayer<K, L = Locker> {
    shared: Shared<L>,
    key: K,
}

impl<K, L: Acquirer> LockLayer<K, L> {
    /// Locks the resource named by `key` around each request, starting
    /// from `locker`'s default [`LockOptions`] (unless configured
    /// otherwise: TTL 30 s, renewed, no waiting, and a hold cap of
    /// max(20 × TTL, 10 min) — a stuck handler loses its lease then; use
    /// [`LockLayer::max_hold`] for longer streams).
    pub fn new(locker: L, key: K) -> Self {
        LockLayer {
            shared: Shared {
                options: locker.default_options(),
                locker,
                hold: HoldUntil::default(),
                on_lost: OnLeaseLost::default(),
                namespace: None,
                protocol: Protocol::Auto,
                responder: None,
            },
            key,
        }
    }

    /// All lock options at once (TTL, wait, renewal, cap).
    pub fn options(mut self, options: LockOptions) -> Self {
        self.shared.options = options;
        self
    }

    /// The lease TTL (default 30 s): how long the lock outlives a crashed
    /// holder.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.shared.options = self.shared.options.ttl(ttl);
        self
    }

    /// Waits up to `wait` for a busy lock (default: no waiting, answer 409
    /// at once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.shared.options = self.shared.options.wait(wait);
        self
    }

    /// Whether the watchdog renews the lease while it is held (default on).
    pub fn renew(mut self, renew: bool) -> Self {
        self.shared.options = self.shared.options.renew(renew);
        self
    }

    /// Caps the total hold time (default: as in the locker's default
    /// [`LockOptions`]; see [`LockOptions::max_hold`]).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.shared.options = self.shared.options.max_hold(max_hold);
        self
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
        self.shared.protocol = protocol;
        self
    }

    /// Replaces every rejection response (409, 503, key errors) with
    /// `responder`'s; see [`Rejection`].
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.shared.responder = Some(Arc::new(responder));
        self
    }

    /// Checks the lock options now (see [`Acquirer::check_options`]) and
    /// reports an invalid configuration, instead of panicking when the layer
    /// is applied.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_core::{Error, Locker, MemoryBackend};
    /// use tollgate_tower::key::GlobalKey;
    /// use tollgate_tower::LockLayer;
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let layer = LockLayer::new(locker.clone(), GlobalKey).ttl(Duration::from_secs(10)).validate();
    /// assert!(layer.is_ok());
    /// let err = LockLayer::new(locker, GlobalKey).ttl(Duration::ZERO).validate().unwrap_err();
    /// assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    /// ```
    pub fn validate(self) -> Result<Self, Error> {
        self.shared.locker.check_options(&self.shared.options)?;
        Ok(self)
    }
}

impl<S, K: Clone, L: Acquirer> Layer<S> for LockLayer<K, L> {
    type Service = Lock<S, K, L>;

    /// Panics if the lock options are invalid (see
    /// [`LockLayer::validate`]).
    fn layer(&self, inner: S) -> Self::Service {
        if let Err(e) = self.shared.locker.check_options(&self.shared.options) {
            panic!("tollgate: invalid LockLayer configuration: {e}");
        }
        Lock {
            inner,
            shared: Arc::new(self.shared.clone()),
            key: self.key.clone(),
        }
    }
}

/// The locking service made by [`LockLayer`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tollgate_core::{FencingToken, Locker, MemoryBackend};
/// use tollgate_tower::key::GlobalKey;
/// use tollgate_tower::LockLayer;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// let svc = ServiceBuilder::new()
///     .layer(LockLayer::new(Locker::new(MemoryBackend::new()), GlobalKey))
///     .service(service_fn(|req: Request<()>| async move {
///         let fence = req.extensions().get::<FencingToken>().copied().unwrap();
///         Ok::<_, Infallible>(Response::new(http_body_util::Full::new(bytes::Bytes::from(fence.to_string()))))
///     }));
/// let res = svc.oneshot(Request::new(())).await?;
/// assert_eq!(res.status(), StatusCode::OK);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Lock<S, K, L = Locker> {
    inner: S,
    shared: Arc<Shared<L>>,
    key: K,
}

impl<S: Clone, K: Clone, L> Clone for Lock<S, K, L> {
    fn clone(&self) -> Self {
        Lock {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            key: self.key.clone(),
        }
    }
}

impl<S, K, L> Lock<S, K, L> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The head of a request without its extensions (which need not be
/// cloneable), kept for a rejection after the request was handed on.
fn head_of<B>(req: &Request<B>) -> http::request::Parts {
    let mut head = Request::new(());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = req.uri().clone();
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    head.into_parts().0
}

impl<S, K, L, ReqB, ResB> Service<Request<ReqB>> for Lock<S, K, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    K: KeyExtractor<ReqB>,
    L: Acquirer,
    ReqB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, L>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let grpc = shared.protocol.is_grpc(req.headers());
        let subject = match self.key.extract(&req) {
            Ok(Some(subject)) => subject,
            Ok(None) => {
                return ResponseFuture::new(State::Calling {
                    fut: inner.call(req),
                    lease: None,
                    lost: None,
                    head: None,
                    shared,
                    grpc,
                })
            }
            Err(e) => {
                count("key_error");
                tracing::debug!(target: "tollgate_tower::lock", status = e.status().as_u16(), error = %e, "request could not be keyed");
                let (parts, _body) = req.into_parts();
                let response = shared.reject(&parts, Reason::Key(&e), grpc);
                return ResponseFuture::new(State::Reply {
                    response: Some(response),
                });
            }
        };
        let subject = match &shared.namespace {
            Some(ns) => Subject::compound([ns.as_str(), subject.as_encoded()]),
            None => subject,
        };
        // Kept for the trace; digested only if the event is enabled.
        let resource = subject.clone();
        let acquire = shared.locker.acquire_lease(subject, shared.options.clone());
        ResponseFuture::new(State::Acquiring {
            acquire,
            inner: Some(inner),
            req: Some(req),
            shared,
            grpc,
            resource,
        })
    }
}

pin_project! {
    /// The response future of [`Lock`]: acquires, calls the inner service
    /// while watching the lease, releases.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::convert::Infallible;
    /// use http::Request;
    /// use tollgate_core::{Locker, MemoryBackend};
    /// use tollgate_tower::key::GlobalKey;
    /// use tollgate_tower::LockLayer;
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// let mut svc = LockLayer::new(Locker::new(MemoryBackend::new()), GlobalKey)
    ///     .layer(service_fn(|_: Request<()>| async {
    ///         Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    ///     }));
    /// // Nothing is acquired until the future is polled.
    /// let future = svc.ready().await?.call(Request::new(()));
    /// assert_eq!(future.await?.status(), 200);
    /// # Ok(()) }
    /// ```
    pub struct ResponseFuture<S, ReqB, L>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB, L>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB, L>
    where
        S: Service<Request<ReqB>>,
    {
        Acquiring {
            acquire: BoxFuture<'static, Result<Lease, Error>>,
            inner: Option<S>,
            req: Option<Request<ReqB>>,
            shared: Arc<Shared<L>>,
            grpc: bool,
            resource: Subject,
        },
        Calling {
            #[pin]
            fut: S::Future,
            lease: Option<Lease>,
            lost: Option<LeaseLost>,
            head: Option<http::request::Parts>,
            shared: Arc<Shared<L>>,
            grpc: bool,
        },
        Releasing {
            release: BoxFuture<'static, ()>,
            response: Option<S::Response>,
        },
        Reply {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB, L> ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
{
    fn new(state: State<S, ReqB, L>) -> Self {
        ResponseFuture { state }
    }
}

impl<S, ReqB, L> fmt::Debug for ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Calling { .. } => "calling",
            State::Releasing { .. } => "releasing",
            State::Reply { .. } => "reply",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqB, L, ResB> Future for ResponseFuture<S, ReqB, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    inner,
                    req,
                    shared,
                    grpc,
                    resource,
                } => {
                    let result = ready!(acquire.as_mut().poll(cx));
                    let mut req = req.take().expect("polled after completion");
                    let mut inner = inner.take().expect("polled after completion");
                    let shared = Arc::clone(shared);
                    let grpc = *grpc;
                    match result {
                        Ok(lease) => {
                            count("acquired");
                            tracing::debug!(target: "tollgate_tower::lock", resource = %resource.digest(), fence = lease.fence().get(), "lock acquired");
                            req.extensions_mut().insert(lease.fence());
                            req.extensions_mut().insert(lease.lost());
                            let cancel = shared.on_lost == OnLeaseLost::Cancel;
                            let head = cancel.then(|| head_of(&req));
                            let lost = cancel.then(|| lease.lost());
                            let fut = inner.call(req);
                            this.state.set(State::Calling {
                                fut,
                                lease: Some(lease),
                                lost,
                                head,
                                shared,
                                grpc,
                            });
                        }
                        Err(e) => {
                            let (parts, _body) = req.into_parts();
                            let reason = match &e {
                                Error::Busy { retry_after, .. } => {
                                    count("busy");
                                    tracing::info!(target: "tollgate_tower::lock", resource = %resource.digest(), retry_after = ?retry_after, "lock busy");
                                    Reason::Busy {
                                        retry_after: *retry_after,
                                    }
                                }
                                e if e.is_unavailable() => {
                                    count("unavailable");
                                    tracing::warn!(target: "tollgate_tower::lock", resource = %resource.digest(), error = %e, "lock backend unavailable");
                                    Reason::Unavailable(e)
                                }
                                e => {
                                    count("error");
                                    tracing::warn!(target: "tollgate_tower::lock", resource = %resource.digest(), error = %e, "lock acquire failed");
                                    Reason::Internal(e)
                                }
                            };
                            let response = shared.reject(&parts, reason, grpc);
                            this.state.set(State::Reply { response: None });
                            return Poll::Ready(Ok(response.map(ResponseBody::full)));
                        }
                    }
                }
                StateProj::Calling {
                    fut,
                    lease,
                    lost,
                    head,
                    shared,
                    grpc,
                } => {
                    // The lease first: once it is lost, the handler must not
                    // run another step.
                    if let Some(l) = lost.as_mut() {
                        if Pin::new(l).poll(cx).is_ready() {
                            *lost = None;
                            if lease.as_ref().is_some_and(Lease::is_lost) {
                                count("lost");
                                tracing::warn!(target: "tollgate_tower::lock", "lock lease lost mid-request; the handler is cancelled");
                                let head = head.take().expect("kept when cancelling");
                                let response = shared.reject(&head, Reason::LeaseLost, *grpc);
                                // Dropping the state drops the inner future.
                                this.state.set(State::Reply { response: None });
                                return Poll::Ready(Ok(response.map(ResponseBody::full)));
                            }
                        }
                    }
                    let response = ready!(fut.poll(cx))?;
                    let Some(lease) = lease.take() else {
                        return Poll::Ready(Ok(response.map(ResponseBody::new)));
                    };
                    match shared.hold {
                        HoldUntil::BodyEnd => {
                            let guard =
                                LeaseGuard::new(lease, shared.on_lost == OnLeaseLost::Cancel);
                            return Poll::Ready(Ok(
                                response.map(|b| ResponseBody::new(b).with_guard(guard))
                            ));
                        }
                        _ => {
                            this.state.set(State::Releasing {
                                release: release(lease),
                                response: Some(response),
                            });
                        }
                    }
                }
                StateProj::Releasing { release, response } => {
                    ready!(release.as_mut().poll(cx));
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::new)));
                }
                StateProj::Reply { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt;
    use tower::{service_fn, ServiceExt};

    use super::*;
    use crate::key::GlobalKey;

    /// A lock that is always held by someone else, for `wait` more.
    #[derive(Clone)]
    struct AlwaysBusy(Option<Duration>);

    impl Acquirer for AlwaysBusy {
        fn acquire_lease(
            &self,
            name: Subject,
            _options: LockOptions,
        ) -> BoxFuture<'static, Result<Lease, Error>> {
            let busy = Error::Busy {
                name: name.as_encoded().to_owned(),
                retry_after: self.0,
            };
            Box::pin(async move { Err(busy) })
        }

        fn default_options(&self) -> LockOptions {
            LockOptions::new()
        }
    }

    async fn busy(wait: Option<Duration>, protocol: Protocol) -> (HeaderMap, String) {
        let svc = LockLayer::new(AlwaysBusy(wait), GlobalKey)
            .protocol(protocol)
            .layer(service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
            }));
        let res = svc.oneshot(Request::new(())).await.unwrap();
        let status = res.status();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let expected = if protocol == Protocol::Grpc { 200 } else { 409 };
        assert_eq!(status, expected);
        (parts.headers, String::from_utf8(body.to_vec()).unwrap())
    }

    /// A busy lock's wait is announced in whole seconds, rounded up, never
    /// 0 — also when the holder's lease is about to run out (a remaining
    /// TTL of 0 or 1 ms) — over HTTP and gRPC alike; an unknown wait is not
    /// announced at all.
    #[tokio::test]
    async fn busy_retry_after_rounds_up_and_is_never_zero() {
        let ms = Duration::from_millis;
        for (wait, secs) in [
            (Some(Duration::ZERO), Some("1")),
            (Some(Duration::from_nanos(1)), Some("1")),
            (Some(ms(1)), Some("1")),
            (Some(ms(1000)), Some("1")),
            (Some(ms(1001)), Some("2")),
            (Some(ms(29_999)), Some("30")),
            (None, None),
        ] {
            let (h, body) = busy(wait, Protocol::Http).await;
            assert_eq!(
                h.get(RETRY_AFTER).map(|v| v.to_str().unwrap()),
                secs,
                "{wait:?}"
            );
            match secs {
                Some(s) => assert_eq!(body, format!("resource is busy; retry in {s} s\n")),
                None => assert_eq!(body, "resource is busy\n"),
            }

            let (h, _) = busy(wait, Protocol::Grpc).await;
            assert_eq!(h["grpc-status"], "10", "{wait:?}");
            assert_eq!(
                h.get(RETRY_AFTER).map(|v| v.to_str().unwrap()),
                secs,
                "{wait:?}"
            );
            assert_eq!(
                h.contains_key("grpc-status-details-bin"),
                wait.is_some(),
                "{wait:?}"
            );
            if let Some(s) = secs {
                let message = h["grpc-message"].to_str().unwrap();
                assert_eq!(message, format!("resource is busy; retry in {s} s"));
            }
        }
    }
}
