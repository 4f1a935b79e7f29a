//! [`HeldLock`]: a fenced lock held for the duration of a handler.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use axum_core::extract::{FromRef, FromRequestParts};
use http::request::Parts;
use tollgate_core::{FencingToken, Lease, LeaseLost, LockOptions, Locker, Result, Subject};
use tollgate_tower::grpc::Protocol;
use tollgate_tower::key::{KeyExtractor, RouteParams};
use tollgate_tower::rejection::{Middleware, Rejection};

/// A kind of resource a [`HeldLock`] protects: how a request names the
/// resource it works on (a [`KeyExtractor`], the same trait the tower
/// layers key requests with), and how its lock is taken.
///
/// Implemented by a marker type per kind of resource (`Job`, `Invoice`, …),
/// generic over the router's state `S` (write `impl<S: Send + Sync>
/// LockResource<S> for Job` when the state is not needed). The common case
/// needs no impl at all: [`RouteParams`] locks one resource per route and
/// path parameters (`HeldLock<RouteParams>`).
///
/// Include the kind of resource in the name (a compound with a constant) so
/// that two kinds of resource with the same id never share a lock.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{LockOptions, Subject};
/// use tollgate::tower::key::PathParam;
/// use tollgate::axum::LockResource;
///
/// /// `/tenants/{tenant}/invoices/{id}`: one lock per invoice.
/// struct Invoice;
///
/// impl<S> LockResource<S> for Invoice {
///     type Key = (Subject, PathParam, PathParam);
///
///     fn key(_: &S) -> Self::Key {
///         (Subject::new("invoice"), PathParam::new("tenant"), PathParam::new("id"))
///     }
///
///     fn options(_: &S) -> LockOptions {
///         // Wait up to 2 s for a concurrent writer, then answer 409.
///         LockOptions::new()
///             .ttl(Duration::from_secs(15))
///             .wait(Duration::from_secs(2))
///             .max_hold(Duration::from_secs(60))
///     }
/// }
/// ```
pub trait LockResource<S>: 'static {
    /// How a request names the resource. A request it leaves unkeyed
    /// (`Ok(None)`) is answered 500: a `HeldLock` always needs a resource.
    type Key: KeyExtractor;

    /// The extractor for this router's state.
    fn key(state: &S) -> Self::Key;

    /// How the lock is taken: TTL, wait bound, renewal, hold cap. The
    /// default is the [`Locker`]'s own
    /// ([`default_options`](tollgate_core::lock::LockerBuilder::default_options)),
    /// as a [`LockLayer`](tollgate_tower::LockLayer) on it takes: unless set
    /// there, [`LockOptions::new`] — a 30 s TTL renewed while held for at
    /// most max(20 × TTL, 10 min), and no waiting (a busy resource answers
    /// 409 at once).
    fn options(state: &S) -> LockOptions
    where
        Locker: FromRef<S>,
    {
        Locker::from_ref(state).default_options().clone()
    }
}

/// One lock per route and path parameters, with the default options.
impl<S> LockResource<S> for RouteParams {
    type Key = RouteParams;

    fn key(_: &S) -> RouteParams {
        RouteParams
    }
}

/// A lock held for the handler: an extractor that acquires the lock of the
/// resource `R` names (see [`LockResource`]) with the [`Locker`] taken from
/// the router's state through [`FromRef`] (so the state is a `Locker`, or a
/// struct with `#[derive(FromRef)]` and a `Locker` field).
///
/// The handler runs only while the lock is held; it gets the
/// [`fence`](HeldLock::fence) to send to the protected resource, a
/// [`lost`](HeldLock::lost) future to stop the work when the lease is lost,
/// and may [`release`](HeldLock::release) early. When the guard is dropped —
/// the handler returns, panics, or is cancelled because the client went away
/// — the lock is released without blocking, in the background: the response
/// may reach the client a moment before the lock is free. Call
/// [`release`](HeldLock::release)`.await` before answering when the client
/// may come straight back for the same resource.
///
/// Rejections ([`Rejection`]): **409** with `Retry-After` when the resource is
/// held by someone else beyond the wait bound; **503** when the backend is
/// unavailable (the acquire is bounded by the locker's timeout); **500** for
/// invalid options; the key extractor's status when it fails on the
/// request (`R::key`), and **500** when it names no resource for it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use axum::{body::Body, routing::post, Router};
/// use http::{Request, StatusCode};
/// use tollgate::{Locker, MemoryBackend, Subject};
/// use tollgate::tower::key::PathParam;
/// use tollgate::axum::{HeldLock, LockResource};
/// use tower::ServiceExt;
///
/// /// `job:{id}`.
/// struct Job;
///
/// impl<S> LockResource<S> for Job {
///     type Key = (Subject, PathParam);
///
///     fn key(_: &S) -> Self::Key {
///         (Subject::new("job"), PathParam::new("id"))
///     }
/// }
///
/// async fn run(lock: HeldLock<Job>) -> String {
///     lock.fence().to_string()
/// }
///
/// let locker = Locker::new(MemoryBackend::new());
/// let app = Router::new().route("/jobs/{id}", post(run)).with_state(locker.clone());
///
/// // While someone else holds job 7, a request for it is answered 409.
/// let other = locker.try_acquire(Subject::compound(["job", "7"]), &Default::default()).await.unwrap();
/// let req = || Request::post("/jobs/7").body(Body::empty()).unwrap();
/// let res = app.clone().oneshot(req()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::CONFLICT);
/// assert!(res.headers().contains_key("retry-after"));
///
/// other.release().await.unwrap();
/// let res = app.oneshot(req()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::OK);
/// # }
/// ```
#[must_use = "dropping a HeldLock releases the lock at once"]
pub struct HeldLock<R> {
    lease: Lease,
    _resource: PhantomData<fn() -> R>,
}

impl<R> fmt::Debug for HeldLock<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLock")
            .field("resource", &std::any::type_name::<R>())
            .field("lease", &self.lease)
            .finish()
    }
}

impl<S, R> FromRequestParts<S> for HeldLock<R>
where
    S: Send + Sync,
    R: LockResource<S>,
    Locker: FromRef<S>,
{
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Rejection> {
        let shape = |r: Rejection| r.for_protocol(Protocol::Auto, &parts.headers);
        let name = required_key(&R::key(state), parts, "HeldLock")?;
        let options = R::options(state);
        let locker = Locker::from_ref(state);
        match locker.acquire(name, &options).await {
            Ok(lease) => Ok(HeldLock::from_lease(lease)),
            Err(e) => Err(shape(Rejection::from_error(Middleware::Lock, e))),
        }
    }
}

/// The key `extractor` names for a request to an extractor (`what`) that
/// always needs one: unkeyed is a 500, a key error its status; rejections
/// shaped for the request's protocol.
// The extractors' own rejection type is this `Rejection`: boxing it here
// would only unbox it again.
#[allow(clippy::result_large_err)]
pub(crate) fn required_key(
    extractor: &impl KeyExtractor,
    parts: &Parts,
    what: &str,
) -> Result<Subject, Rejection> {
    let shape = |r: Rejection| r.for_protocol(Protocol::Auto, &parts.headers);
    match extractor.extract(parts) {
        Ok(Some(key)) => Ok(key),
        Ok(None) => Err(shape(Rejection::misconfigured(format!(
            "the {what} resource's key extractor named no key for this request"
        )))),
        Err(e) => Err(shape(Rejection::key(e))),
    }
}

impl<R> HeldLock<R> {
    /// Wraps a lease acquired elsewhere (e.g. in a test, or by a custom
    /// extractor).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("x", &LockOptions::new()).await?;
    /// let lock: HeldLock<()> = HeldLock::from_lease(lease);
    /// assert!(lock.is_held());
    /// # Ok(()) }
    /// ```
    pub fn from_lease(lease: Lease) -> Self {
        HeldLock {
            lease,
            _resource: PhantomData,
        }
    }

    /// The fencing token of this hold: send it with every write to the
    /// protected resource, which refuses tokens lower than the highest it has
    /// seen.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let first = HeldLock::<()>::from_lease(locker.try_acquire("x", &LockOptions::new()).await?);
    /// let f1 = first.fence();
    /// first.release().await?;
    /// let second = HeldLock::<()>::from_lease(locker.try_acquire("x", &LockOptions::new()).await?);
    /// assert!(second.fence() > f1);
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> FencingToken {
        self.lease.fence()
    }

    /// The lock's name, as encoded in its key.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("reports", &LockOptions::new()).await?;
    /// assert_eq!(HeldLock::<()>::from_lease(lease).name(), "reports");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// Whether the lease can still be trusted (not lost, not released).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("x", &LockOptions::new()).await?;
    /// assert!(HeldLock::<()>::from_lease(lease).is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.lease.is_held()
    }

    /// How long the lease can still be trusted without another renewal.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use std::time::Duration;
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let opts = LockOptions::new().ttl(Duration::from_secs(10));
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("x", &opts).await?;
    /// assert!(HeldLock::<()>::from_lease(lease).remaining() <= Duration::from_secs(10));
    /// # Ok(()) }
    /// ```
    pub fn remaining(&self) -> Duration {
        self.lease.remaining()
    }

    /// A future that resolves once the lease can no longer be trusted (lost
    /// — e.g. Redis unreachable past the safe deadline — or released). Race
    /// the protected work against it:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("x", &LockOptions::new()).await?;
    /// let lock = HeldLock::<()>::from_lease(lease);
    /// let done = tokio::select! {
    ///     _ = lock.lost() => false,
    ///     _ = async { /* the work */ } => true,
    /// };
    /// assert!(done);
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> LeaseLost {
        self.lease.lost()
    }

    /// Releases the lock now (before the handler finishes) and reports
    /// whether it was still ours; an error when the backend did not answer
    /// (the lock then expires at its TTL).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("x", &LockOptions::new()).await?;
    /// assert!(HeldLock::<()>::from_lease(lease).release().await?);
    /// # Ok(()) }
    /// ```
    pub async fn release(self) -> Result<bool> {
        self.lease.release().await
    }

    /// The underlying lease.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("x", &LockOptions::new()).await?;
    /// let lock = HeldLock::<()>::from_lease(lease);
    /// assert_eq!(lock.lease().fence(), lock.fence());
    /// # Ok(()) }
    /// ```
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The underlying lease, to keep the lock beyond the handler (e.g. in a
    /// spawned task that finishes the work).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    /// use tollgate::axum::HeldLock;
    ///
    /// let lease = Locker::new(MemoryBackend::new()).try_acquire("x", &LockOptions::new()).await?;
    /// let lease = HeldLock::<()>::from_lease(lease).into_lease();
    /// assert!(lease.release().await?);
    /// # Ok(()) }
    /// ```
    pub fn into_lease(self) -> Lease {
        self.lease
    }
}
