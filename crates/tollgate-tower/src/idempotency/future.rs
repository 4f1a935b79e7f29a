//! [`ResponseFuture`]: reads the body, claims the key, then replays, refuses,
//! or runs the inner service and stores its response.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use pin_project_lite::pin_project;
use tollgate_core::failure::is_outage;
use tollgate_core::idempotency::{Claim, Claimed, StoredResponse};
use tollgate_core::Subject;
use tower_service::Service;

use super::service::Shared;
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
    /// Too large to store: the chunks read, then the rest, streamed.
    Rest {
        read: VecDeque<Bytes>,
        body: UnsyncBoxBody<Bytes, BoxError>,
    },
}

impl Buffered {
    fn into_body<B>(self) -> ResponseBody<B> {
        match self {
            Buffered::Whole { data, tail } => ResponseBody::buffered(data, tail),
            Buffered::Rest { read, body } => ResponseBody::rest(read, body),
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
    req.extensions_mut().insert(claimed.fence());
    req.extensions_mut().insert(lost.clone());
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
    // The handler has returned: its side effect is done. From here the body
    // is read and the claim settled in a task of its own, so that a client
    // going away now (this future dropped) no longer cancels them — the
    // response is still stored, and a retry replays it instead of running
    // the handler again.
    let settling = tokio::spawn(settle(head, body, holding, Arc::clone(&shared)));
    match settling.await {
        Ok((head, read)) => Ok(Step::Done(Response::from_parts(head, read))),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => {
            // The runtime is shutting down; the claim may not be settled.
            let mut res = Response::new(Bytes::new());
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            Ok(Step::made(res))
        }
    }
}

/// Reads the claimed request's response body (up to what is stored) and
/// settles the claim: completed with the response, or as not replayable,
/// or abandoned.
async fn settle(
    head: http::response::Parts,
    body: UnsyncBoxBody<Bytes, BoxError>,
    mut holding: Holding,
    shared: Arc<Shared>,
) -> (http::response::Parts, Buffered) {
    let read = read_capped(body, shared.max_stored_body).await;
    let failed = grpc_failed(&head.headers, &read);
    match &read {
        Buffered::Whole {
            tail: Some(Tail::Error(_)),
            ..
        } => {
            holding
                .abandon("abandoned", "the response body failed")
                .await;
        }
        // A gRPC call's outcome is its `grpc-status`, not its HTTP 200: a
        // failed call is not stored (a retry runs again), as a 5xx is not.
        _ if failed => {
            holding
                .abandon("not_stored", "the gRPC status is not OK")
                .await;
        }
        _ if !(shared.store_when)(head.status) => {
            holding
                .abandon("not_stored", "the status is not stored")
                .await;
        }
        Buffered::Whole { data, tail: None } => {
            // A trailers-only gRPC answer carries its status in its headers.
            let headers = head
                .headers
                .iter()
                .filter(|(n, _)| shared.replays(n) || is_grpc_status(n));
            let headers = headers.map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()));
            let stored =
                StoredResponse::new(head.status.as_u16(), headers.collect(), data.to_vec());
            holding.complete(stored, &shared).await;
        }
        Buffered::Whole { tail: Some(_), .. } => {
            // Trailers are not stored: the response cannot be replayed.
            let stored = StoredResponse::not_replayable(head.status.as_u16());
            holding.complete(stored, &shared).await;
        }
        Buffered::Rest { .. } => {
            tracing::debug!(target: T, record = %holding.digest, max = shared.max_stored_body, "response body too large to store; streamed");
            let stored = StoredResponse::not_replayable(head.status.as_u16());
            holding.complete(stored, &shared).await;
        }
    }
    (head, read)
}

/// Whether a gRPC response says its call failed: a `grpc-status` other
/// than 0 in its headers (a trailers-only answer) or its trailers.
fn grpc_failed(headers: &http::HeaderMap, read: &Buffered) -> bool {
    let trailers = match read {
        Buffered::Whole {
            tail: Some(Tail::Trailers(t)),
            ..
        } => Some(t),
        _ => None,
    };
    let status = headers
        .get("grpc-status")
        .or_else(|| trailers.and_then(|t| t.get("grpc-status")));
    status.is_some_and(|s| s.as_bytes() != b"0")
}

/// `grpc-status` and `grpc-message`: stored and replayed with a
/// trailers-only gRPC answer, whatever the allow-list.
fn is_grpc_status(name: &HeaderName) -> bool {
    name.as_str() == "grpc-status" || name.as_str() == "grpc-message"
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
    for (name, value) in stored.headers {
        let name = HeaderName::from_bytes(name.as_bytes());
        let value = HeaderValue::from_bytes(&value);
        if let (Ok(name), Ok(value)) = (name, value) {
            if shared.replays(&name) || is_grpc_status(&name) {
                h.append(name, value);
            }
        }
    }
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    Step::made(res)
}

/// Reads `body` to its end (the data, then its trailers or its error), or
/// until more than `max` bytes were read: then the chunks read so far and
/// the rest of the body, unread. Never holds more than `max` bytes and the
/// chunk that went past them.
async fn read_capped(mut body: UnsyncBoxBody<Bytes, BoxError>, max: usize) -> Buffered {
    let mut read = VecDeque::new();
    let mut len = 0usize;
    let tail = loop {
        match body.frame().await.map(|f| f.map(Frame::into_data)) {
            None => break None,
            Some(Ok(Ok(chunk))) => {
                if chunk.is_empty() {
                    continue;
                }
                len = len.saturating_add(chunk.len());
                read.push_back(chunk);
                if len > max {
                    return Buffered::Rest { read, body };
                }
            }
            Some(Ok(Err(frame))) => {
                if let Ok(trailers) = frame.into_trailers() {
                    break Some(Tail::Trailers(trailers));
                }
            }
            Some(Err(e)) => break Some(Tail::Error(e)),
        }
    };
    let data = match read.len() {
        0 => Bytes::new(),
        1 => read.pop_front().expect("one chunk"),
        _ => {
            let mut data = BytesMut::with_capacity(len);
            read.iter().for_each(|chunk| data.extend_from_slice(chunk));
            data.freeze()
        }
    };
    Buffered::Whole { data, tail }
}

/// A claim while its request runs. Dropped before it was settled (the
/// request future dropped before the handler returned: the client went
/// away), it is counted as abandoned, and [`Claimed`]'s own drop abandons
/// it in the background. After the handler returned, it is settled in a
/// task that the request future only awaits.
struct Holding {
    claim: Option<Claimed>,
    digest: String,
}

impl Holding {
    /// Gives the claim up and waits for it, so that a retry right after
    /// this response runs again.
    async fn abandon(&mut self, outcome: &'static str, why: &'static str) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        count(outcome);
        tracing::debug!(target: T, record = %self.digest, why, "Idempotency-Key claim abandoned");
        if let Err(e) = claim.abandon().await {
            tracing::debug!(target: T, record = %self.digest, error = %e, "abandoning the claim failed; it expires by its lease");
        }
    }

    /// Stores `response` (fenced: nothing when the claim was lost). The
    /// store sends a failed completion again until its lease's safe
    /// deadline, and never releases the claim unstored; the response waits
    /// for that at most two round-trip bounds (the first try and the next),
    /// then goes out while the completion goes on in the background — a
    /// retry meanwhile is told the key is in flight.
    async fn complete(&mut self, response: StoredResponse, shared: &Shared) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let digest = self.digest.clone();
        let mut completing = tokio::spawn(async move {
            match claim.complete(&response).await {
                Ok(true) => {
                    count("stored");
                    tracing::debug!(target: T, record = %digest, status = response.status, replayable = response.body.is_some(), "response stored");
                }
                Ok(false) => {
                    count("lost");
                    tracing::warn!(target: T, record = %digest, "the claim was lost or superseded; the response was not stored");
                }
                Err(e) => {
                    count("unavailable");
                    tracing::warn!(target: T, record = %digest, error = %e, "storing the response failed; the key stays in flight until its lease expires");
                }
            }
        });
        let wait = shared.store.timeout().saturating_mul(2);
        match tokio::time::timeout(wait, &mut completing).await {
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(_) => {}
            Err(_) => {
                tracing::debug!(target: T, record = %self.digest, "the response is still being stored; it goes out meanwhile");
            }
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if self.claim.is_some() {
            count("abandoned");
            tracing::debug!(target: T, record = %self.digest, "request dropped; Idempotency-Key claim abandoned");
        }
    }
}
