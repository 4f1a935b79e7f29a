//! [`Hold`]: the service of the lock and concurrency-limit layers, and what
//! all its clones share.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_core::{LockOptions, Subject};
use tower_service::Service;

use super::future::{ResponseFuture, State};
use super::gate::Gate;
use crate::body::ResponseBody;
use crate::key::KeyExtractor;
use crate::lock::{HoldUntil, OnLeaseLost};
use crate::middleware::{take_readied, Answer, Reply};
use crate::rejection::Rejection;

/// What every service made by one layer shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) gate: Gate,
    pub(crate) options: LockOptions,
    pub(crate) hold: HoldUntil,
    pub(crate) on_lost: OnLeaseLost,
    pub(crate) namespace: Option<String>,
    pub(crate) answer: Answer,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("gate", &self.gate)
            .field("options", &self.options)
            .field("hold", &self.hold)
            .field("on_lost", &self.on_lost)
            .field("namespace", &self.namespace)
            .field("answer", &self.answer)
            .finish()
    }
}

/// The service made by [`LockLayer`](crate::LockLayer) (as
/// [`Lock`](crate::lock::Lock)): the inner service runs while a lease is held.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tollgate::{FencingToken, Locker, MemoryBackend};
/// use tollgate::tower::key::GlobalKey;
/// use tollgate::tower::LockLayer;
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
pub struct Hold<S, K> {
    inner: S,
    shared: Arc<Shared>,
    key: K,
}

impl<S: Clone, K: Clone> Clone for Hold<S, K> {
    fn clone(&self) -> Self {
        Hold {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            key: self.key.clone(),
        }
    }
}

impl<S, K> Hold<S, K> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, key: K) -> Self {
        Hold { inner, shared, key }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// The head of a request without its extensions (which need not be
/// cloneable), kept for a rejection after the request was handed on.
pub(crate) fn head_of<B>(req: &Request<B>) -> http::request::Parts {
    let mut head = Request::new(());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = req.uri().clone();
    *head.version_mut() = req.version();
    *head.headers_mut() = req.headers().clone();
    head.into_parts().0
}

impl<S, K, ReqB, ResB> Service<Request<ReqB>> for Hold<S, K>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    K: KeyExtractor,
    ReqB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let mut inner = take_readied(&mut self.inner);
        let shared = Arc::clone(&self.shared);
        let (parts, body) = req.into_parts();
        let subject = match self.key.extract(&parts) {
            Ok(Some(subject)) => subject,
            Ok(None) => {
                return ResponseFuture::new(State::Calling {
                    fut: inner.call(Request::from_parts(parts, body)),
                    lease: None,
                    lost: None,
                    head: None,
                    shared,
                })
            }
            Err(e) => {
                shared.gate.key_error(&e);
                let response = shared.answer.reject(&parts, Rejection::key(e));
                return ResponseFuture::new(State::Reply {
                    reply: Reply::new(response),
                });
            }
        };
        let req = Request::from_parts(parts, body);
        let subject = match &shared.namespace {
            Some(ns) => Subject::compound([ns.as_str(), subject.as_encoded()]),
            None => subject,
        };
        let acquire = shared.gate.acquire(subject, shared.options.clone());
        ResponseFuture::new(State::Acquiring {
            acquire,
            inner: Some(inner),
            req: Some(req),
            shared,
        })
    }
}
