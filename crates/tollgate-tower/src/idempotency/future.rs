//! [`ResponseFuture`]: reads the body, claims the key, then replays, refuses,
//! or runs the inner service and stores its response.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use pin_project_lite::pin_project;
use tollgate_core::failure::is_outage;
use tollgate_core::idempotency::{Claim, StoredResponse};
use tollgate_core::{FencingToken, Subject};
use tower_service::Service;

use super::holding::Holding;
use super::relay::{self, is_grpc_status, Answer};
use super::shared::Shared;
use super::{count, fingerprint, OnUnavailable, IDEMPOTENT_REPLAYED};
use crate::body::{BoxError, ResponseBody, Tail};
use crate::hold::head_of;
use crate::lock::OnLeaseLost;
use crate::middleware::Reply;
use crate::rejection::{Middleware, Rejection};

const T: &str = "tollgate_tower::idempotency";

/// A response the layer read to its end, or made (a replay, a rejection),
/// or stopped reading past what it stores.
pub(crate) enum Buffered {
    /// The whole body: its data, then its trailers or its error.
    Whole { data: Bytes, tail: Option<Tail> },
    /// The handler's response, passed on as it is read (see `relay`).
    Relayed {
        body: UnsyncBoxBody<Bytes, BoxError>,
    },
}

impl Buffered {
    fn into_body<B>(self) -> ResponseBody<B> {
        match self {
            Buffered::Whole { data, tail } => ResponseBody::buffered(data, tail),
            Buffered::Relayed { body } => ResponseBody::rest(VecDeque::new(), body),
        }
    }
}

/// Where a claimed (or refused) request goes next.
// Moved once, out of the boxed future: boxing `Done` would only add an
// allocation per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Step<F> {
    /// Call the inner service unprotected (the store is unavailable and the
    /// layer passes through): its body streams as it comes.
    Call(F),
    /// Answer with this response.
    Done(Response<Buffered>),
}

impl<F> Step<F> {
    fn made(response: Response<Bytes>) -> Self {
        Step::Done(response.map(|data| Buffered::Whole { data, tail: None }))
    }
}

type Run<F, E> = BoxFuture<'static, Result<Step<F>, E>>;

pin_project! {
    /// The response future of [`Idempotency`](super::Idempotency): reads the
    /// request body, claims the key, then replays, refuses, or runs the inner
    /// service and stores its response. Nothing happens until it is polled.
    pub struct ResponseFuture<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Running { run: Run<S::Future, S::Error> },
        Calling { #[pin] fut: S::Future },
        Reply { reply: Reply },
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn running(run: Run<S::Future, S::Error>) -> Self {
        ResponseFuture {
            state: State::Running { run },
        }
    }

    pub(crate) fn calling(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling { fut },
        }
    }

    pub(crate) fn reply(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Reply {
                reply: Reply::new(response),
            },
        }
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Running { .. } => "running",
            State::Calling { .. } => "calling",
            State::Reply { .. } => "reply",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
{
    type Output = Result<Response<ResponseBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Running { run } => match ready!(run.as_mut().poll(cx))? {
                    Step::Call(fut) => this.state.set(State::Calling { fut }),
                    Step::Done(response) => {
                        return Poll::Ready(Ok(response.map(Buffered::into_body)));
                    }
                },
                StateProj::Calling { fut } => {
                    let response = ready!(fut.poll(cx))?;
                    return Poll::Ready(Ok(response.map(ResponseBody::new)));
                }
                StateProj::Reply { reply } => return Poll::Ready(Ok(reply.take())),
            }
        }
    }
}

/// The claimed path, after the key was validated and scoped.
pub(crate) async fn run<S, ReqB, ResB>(
    mut inner: S,
    parts: Parts,
    body: ReqB,
    record: Subject,
    shared: Arc<Shared>,
) -> Result<Step<S::Future>, S::Error>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ReqB: Body<Data = Bytes> + From<Bytes>,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    let reject = |r: Rejection| Ok(Step::made(shared.answer.reject(&parts, r)));
    let digest = record.digest();
    let bytes = match Limited::new(body, shared.max_request_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            count("too_large");
            tracing::debug!(target: T, record = %digest, "request body over the limit");
            return reject(Rejection::payload_too_large(shared.max_request_body));
        }
        Err(e) => {
            tracing::debug!(target: T, record = %digest, error = %e, "request body could not be read");
            return reject(Rejection::unreadable_body());
        }
    };
    let claim = shared
        .store
        .claim(record, fingerprint(&parts, &bytes))
        .await;
    let claimed = match claim {
        Ok(Claim::Claimed(claimed)) => claimed,
        Ok(Claim::Completed(stored)) => return Ok(replay(&shared, &parts, stored, &digest)),
        Ok(Claim::InFlight { retry_after }) => {
            count("in_flight");
            tracing::info!(target: T, record = %digest, ?retry_after, "Idempotency-Key in flight");
            return reject(Rejection::idempotency_in_flight(retry_after));
        }
        Ok(Claim::Mismatch) => {
            count("mismatch");
            tracing::info!(target: T, record = %digest, "Idempotency-Key reused with another payload");
            return reject(Rejection::idempotency_mismatch());
        }
        Ok(other) => {
            tracing::error!(target: T, record = %digest, claim = ?other, "unknown claim outcome");
            return reject(Rejection::misconfigured(
                "unknown idempotency claim outcome",
            ));
        }
        // Only an outage passes through: an error about this record's data
        // would let every request with its key run unprotected.
        Err(e) if is_outage(&e) && shared.on_unavailable == OnUnavailable::PassThrough => {
            count("pass_through");
            tracing::warn!(target: T, record = %digest, error = %e, "idempotency store unavailable; the request runs unprotected");
            let req = Request::from_parts(parts, ReqB::from(bytes));
            return Ok(Step::Call(inner.call(req)));
        }
        Err(e) => {
            count("unavailable");
            tracing::warn!(target: T, record = %digest, error = %e, "idempotency store unavailable");
            return reject(Rejection::from_error(Middleware::Idempotency, e));
        }
    };
    count("claimed");
    tracing::debug!(target: T, record = %digest, fence = claimed.fence().get(), "Idempotency-Key claimed");
    let lost = claimed.lost();
    let mut req = Request::from_parts(parts, ReqB::from(bytes));
    // A lock's token, from a layer outside this one, stays: it fences the
    // resource, while this layer watches its claim itself. Unless the
    // handler is to go on past a lost claim: then it needs the claim's.
    let outside = req.extensions().get::<FencingToken>().is_some();
    if !outside || shared.on_lost == OnLeaseLost::Continue {
        req.extensions_mut().insert(claimed.fence());
        req.extensions_mut().insert(lost.clone());
    }
    // Kept to answer with when the handler is cancelled.
    let head = (shared.on_lost == OnLeaseLost::Cancel).then(|| head_of(&req));
    let mut holding = Holding {
        claim: Some(claimed),
        digest,
    };
    let call = inner.call(req);
    let called = match &head {
        Some(_) => {
            let mut call = std::pin::pin!(call);
            // The lease first: once it is lost (its safe deadline is before
            // the backend lets the key go), the handler must not run another
            // step, or a retry's claim could run beside it.
            tokio::select! {
                biased;
                () = lost => None,
                called = &mut call => Some(called),
            }
        }
        None => Some(call.await),
    };
    let response = match called {
        Some(Ok(response)) => response,
        Some(Err(e)) => {
            holding
                .abandon("abandoned", "the inner service failed")
                .await;
            return Err(e);
        }
        None => {
            // The handler is dropped (cancelled, not finished): giving the
            // claim up lets a retry run it.
            tracing::warn!(target: T, record = %holding.digest, "the claim's lease was lost; the handler was cancelled");
            holding
                .abandon("lost", "the lease was lost mid-handler")
                .await;
            let head = head.expect("kept when cancelling");
            let r = Rejection::idempotency_claim_lost();
            return Ok(Step::made(shared.answer.reject(&head, r)));
        }
    };
    let (head, body) = response.into_parts();
    let body = body.map_err(Into::into).boxed_unsync();
    let relay = relay::start(head.status, &head.headers, body, holding, &shared);
    // A body that fits the record is recorded before the client is
    // answered; any other streams at once (see `relay`).
    let body = match relay.answer.await {
        Ok(Answer::Whole { data, tail }) => Buffered::Whole { data, tail },
        Ok(Answer::Streams(body)) => Buffered::Relayed { body },
        Err(_) => match relay.task.await {
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            _ => {
                // The runtime is shutting down; the claim may not be settled.
                let mut res = Response::new(Bytes::new());
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                return Ok(Step::made(res));
            }
        },
    };
    Ok(Step::Done(Response::from_parts(head, body)))
}

/// The stored response, replayed: status, allow-listed headers, the body
/// byte for byte, and `Idempotent-Replayed: true`.
fn replay<F>(shared: &Shared, parts: &Parts, stored: StoredResponse, digest: &str) -> Step<F> {
    let Some(body) = stored.body else {
        count("not_replayable");
        tracing::info!(target: T, record = %digest, "Idempotency-Key completed; its response was not stored");
        let r = Rejection::idempotency_not_replayable(stored.status);
        return Step::made(shared.answer.reject(parts, r));
    };
    count("replayed");
    tracing::debug!(target: T, record = %digest, status = stored.status, "stored response replayed");
    let mut res = Response::new(Bytes::from(body));
    *res.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let h = res.headers_mut();
    *h = replayed(shared, stored.headers);
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    let trailers = (!stored.trailers.is_empty()).then(|| replayed(shared, stored.trailers));
    Step::Done(res.map(|data| Buffered::Whole {
        data,
        tail: trailers.map(Tail::Trailers),
    }))
}

/// The stored `fields` a replay carries (the allow-list, and a gRPC
/// call's status), in order.
fn replayed(shared: &Shared, fields: Vec<(String, Vec<u8>)>) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (name, value) in fields {
        let name = HeaderName::from_bytes(name.as_bytes());
        let value = HeaderValue::from_bytes(&value);
        if let (Ok(name), Ok(value)) = (name, value) {
            if shared.replays(&name) || is_grpc_status(&name) {
                map.append(name, value);
            }
        }
    }
    map
}
