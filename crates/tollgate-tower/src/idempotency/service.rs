//! [`Idempotency`]: the service, and what all its clones share.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{Method, Request, Response};
use http_body::Body;
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::Subject;
use tower_service::Service;

use super::future::{run, ResponseFuture};
use super::shared::Shared;
use super::{count, parse_key};
use crate::body::{BoxError, ResponseBody};
use crate::key::{route_of, KeyExtractor};
use crate::middleware::take_readied;
use crate::rejection::Rejection;

/// The service made by [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::Full;
/// use tollgate::idempotency::IdempotencyStore;
/// use tollgate::{MemoryBackend, Subject};
/// use tollgate::tower::IdempotencyLayer;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(IdempotencyStore::new(MemoryBackend::new()), Subject::new("app")))
///     .service(service_fn(|_req: Request<Full<Bytes>>| async {
///         Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("done"))))
///     }));
/// let req = Request::post("/jobs").body(Full::new(Bytes::new()))?;
/// // No Idempotency-Key: 400.
/// assert_eq!(svc.clone().oneshot(req).await?.status(), StatusCode::BAD_REQUEST);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Idempotency<S, K> {
    inner: S,
    shared: Arc<Shared>,
    scope: K,
}

impl<S: Clone, K: Clone> Clone for Idempotency<S, K> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            scope: self.scope.clone(),
        }
    }
}

impl<S, K> Idempotency<S, K> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, scope: K) -> Self {
        Idempotency {
            inner,
            shared,
            scope,
        }
    }

    /// The store the records are kept in.
    pub fn store(&self) -> &IdempotencyStore {
        &self.shared.store
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

const T: &str = "tollgate_tower::idempotency";

impl<S, K, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S, K>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: KeyExtractor,
    ReqB: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let mut inner = take_readied(&mut self.inner);
        if !matches!(*req.method(), Method::POST | Method::PATCH) {
            return ResponseFuture::calling(inner.call(req));
        }
        let shared = Arc::clone(&self.shared);
        let (parts, body) = req.into_parts();
        let reject = |parts: &http::request::Parts, r: Rejection| {
            ResponseFuture::reply(shared.answer.reject(parts, r))
        };
        let key = match parse_key(&parts.headers) {
            Ok(Some(key)) => key,
            Ok(None) if !shared.required => {
                return ResponseFuture::calling(inner.call(Request::from_parts(parts, body)));
            }
            Ok(None) => {
                count("invalid_key");
                tracing::debug!(target: T, "request without Idempotency-Key");
                let r = Rejection::invalid_idempotency_key(
                    "this request requires an Idempotency-Key header",
                );
                return reject(&parts, r);
            }
            Err(message) => {
                count("invalid_key");
                tracing::debug!(target: T, message, "invalid Idempotency-Key");
                return reject(&parts, Rejection::invalid_idempotency_key(message));
            }
        };
        let scope = match self.scope.extract(&parts) {
            Ok(scope) => scope,
            Err(e) => {
                count("key_error");
                tracing::debug!(target: T, status = e.status().as_u16(), error = %e, "request could not be scoped");
                return reject(&parts, Rejection::key(e));
            }
        };
        // A declared length over the limit is refused before any byte is read.
        let declared = parts.headers.get(CONTENT_LENGTH);
        let declared = declared.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > shared.max_request_body as u64) {
            count("too_large");
            let r = Rejection::payload_too_large(shared.max_request_body);
            return reject(&parts, r);
        }
        let record = Subject::compound([
            scope_part(scope.as_ref()),
            parts.method.as_str(),
            route_of(&parts),
            key.as_str(),
        ]);
        // Lazy: nothing is read or claimed until the future is polled.
        ResponseFuture::running(Box::pin(run(inner, parts, body, record, shared)))
    }
}

/// The record key's scope part: the scope's encoded form, or `-` for a
/// request without one. A scope that encodes as `-` itself becomes `%-`,
/// which no encoded subject can be, so it never shares the unscoped records.
fn scope_part(scope: Option<&Subject>) -> &str {
    match scope.map(Subject::as_encoded) {
        None => "-",
        Some("-") => "%-",
        Some(encoded) => encoded,
    }
}
