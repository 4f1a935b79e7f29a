//! [`ResponseBody`]: the response body of tollgate's middleware.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use pin_project_lite::pin_project;
use tollgate_core::{Lease, LeaseLost};

use crate::hold::Gate;

/// The boxed error of [`ResponseBody`]: the inner body's error, or the
/// error a body ends with when its lock's lease is lost mid-stream.
///
/// ```
/// let e: tollgate::tower::BoxError = "boom".into();
/// assert_eq!(e.to_string(), "boom");
/// ```
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Releases `lease`, logging (target `tollgate_tower::lock`) a lock that
/// was no longer held or a release that failed; shared by the lock's
/// response future and [`LeaseGuard`].
pub(crate) fn release(lease: Lease) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        match lease.release().await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(target: "tollgate_tower::lock", "the lock was no longer held at release")
            }
            Err(e) => {
                tracing::debug!(target: "tollgate_tower::lock", error = %e, "lock release failed; it expires by its TTL")
            }
        }
    })
}

/// A lease kept until the body ends: released (and the release awaited)
/// when the last frame has been read, dropped (released in the background)
/// when the body is dropped early. A loss while the body is streaming is
/// reported through the gate (warning, `lost` counter) and — when `cancel`
/// is set — ends the body with an error (a gRPC response's with trailers
/// saying ABORTED).
pub(crate) struct LeaseGuard {
    lease: Option<Lease>,
    lost: Option<LeaseLost>,
    cancel: bool,
    gate: Gate,
    releasing: Option<BoxFuture<'static, ()>>,
    /// A gRPC response: a loss ends it with ABORTED trailers, which a gRPC
    /// client reads as the call's status (a broken stream reads INTERNAL).
    grpc: bool,
}

impl LeaseGuard {
    /// `lost` watches the lease (`None` when its loss was already
    /// reported while the handler ran).
    pub(crate) fn new(
        lease: Lease,
        lost: Option<LeaseLost>,
        cancel_on_loss: bool,
        gate: Gate,
    ) -> Self {
        LeaseGuard {
            lost,
            lease: Some(lease),
            cancel: cancel_on_loss,
            gate,
            releasing: None,
            grpc: false,
        }
    }

    /// For a gRPC response (its `content-type`): a loss ends it with
    /// trailers saying ABORTED.
    pub(crate) fn for_grpc(mut self, grpc: bool) -> Self {
        self.grpc = grpc;
        self
    }

    /// Whether the lease was lost and the body must be cut off (a loss is
    /// reported either way).
    fn poll_lost(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(lost) = self.lost.as_mut() else {
            return false;
        };
        // The deadline too: the watchdog that signals a loss may not have
        // run yet.
        let signalled = Pin::new(lost).poll(cx).is_ready();
        if !self.lease.as_ref().is_some_and(Lease::is_lost) {
            if signalled {
                self.lost = None;
            }
            return false;
        }
        self.lost = None;
        self.gate.lost(self.cancel);
        self.cancel
    }

    /// Releases the lease and waits for the release (bounded by the
    /// locker's round-trip timeout), so the next request finds it free.
    fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(lease) = self.lease.take() {
            self.lost = None;
            self.releasing = Some(release(lease));
        }
        match self.releasing.as_mut().map(|f| f.as_mut().poll(cx)) {
            Some(Poll::Pending) => Poll::Pending,
            Some(Poll::Ready(())) | None => {
                self.releasing = None;
                Poll::Ready(())
            }
        }
    }
}

pin_project! {
    /// The response body of the layers that hold something while the body
    /// streams — [`Lock`](crate::lock::Lock), the
    /// [concurrency limit](crate::concurrency) and the
    /// [idempotency layer](crate::idempotency): the inner service's body,
    /// or the short body of a rejection built by the middleware, or a
    /// response the idempotency layer read to its end (to store it) or
    /// replayed from its record, or one it passes on as it reads it. (The
    /// [rate limit](crate::rate_limit::RateLimit) holds nothing past the
    /// response's head, and keeps the inner body type: see
    /// [`RejectionBody`](crate::RejectionBody).)
    ///
    /// Like tower-http's `ResponseBody` types, it wraps the inner body so
    /// that rejections can carry their problem document whatever the inner
    /// body type is. It works wherever the inner body works: axum's
    /// `Router::layer` and tonic's `Server::builder().layer(..)` both accept
    /// it. A [`Lock`](crate::lock::Lock) configured to hold its lease until
    /// the body ends keeps the lease in here: it is released when the last
    /// frame has been read (the end of the body waits for the release), or
    /// when the body is dropped; if the lease is lost while the body
    /// streams, the body ends with an error, so the client sees a broken
    /// response rather than a truncated one.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body::Body as _;
    /// use tollgate::tower::ResponseBody;
    ///
    /// let body: ResponseBody<http_body_util::Empty<Bytes>> = ResponseBody::full("busy\n");
    /// assert_eq!(body.size_hint().exact(), Some(5));
    /// assert!(ResponseBody::<http_body_util::Empty<Bytes>>::empty().is_end_stream());
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // Boxed, as the rare kinds' parts are: every response is moved
        // whole several times on its way out, so this is kept to 64 bytes.
        guard: Option<Box<LeaseGuard>>,
        done: bool,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes>, tail: Option<Box<Tail>> },
        Rest { rest: Box<Rest> },
    }
}

/// A body read in part: the chunks read, then the rest of the body.
struct Rest {
    read: VecDeque<Bytes>,
    body: UnsyncBoxBody<Bytes, BoxError>,
}

/// What a buffered body ends with after its data: the inner body's
/// trailers, or the error it failed with.
pub(crate) enum Tail {
    Trailers(http::HeaderMap),
    Error(BoxError),
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn new(body: B) -> Self {
        Self::of(Kind::Inner { body })
    }

    /// A body of `data`, in one frame.
    pub fn full(data: impl Into<Bytes>) -> Self {
        Self::buffered(data.into(), None)
    }

    /// A body the middleware read to its end (the idempotency layer's):
    /// `data` in one frame, then `tail`, if any.
    pub(crate) fn buffered(data: Bytes, tail: Option<Tail>) -> Self {
        Self::of(Kind::Full {
            data: (!data.is_empty()).then_some(data),
            tail: tail.map(Box::new),
        })
    }

    /// A body the middleware started reading and stopped (the idempotency
    /// layer's, past what it stores): the chunks `read`, then the rest of
    /// `body`, streamed.
    pub(crate) fn rest(read: VecDeque<Bytes>, body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        Self::of(Kind::Rest {
            rest: Box::new(Rest { read, body }),
        })
    }

    /// An empty body (a gRPC trailers-only response).
    pub fn empty() -> Self {
        Self::of(Kind::Full {
            data: None,
            tail: None,
        })
    }

    fn of(kind: Kind<B>) -> Self {
        ResponseBody {
            kind,
            guard: None,
            done: false,
        }
    }

    /// Keeps `guard`'s lease until the body has ended or is dropped.
    pub(crate) fn with_guard(mut self, guard: LeaseGuard) -> Self {
        self.guard = Some(Box::new(guard));
        self
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Full { .. } => "full",
            Kind::Rest { .. } => "rest",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .field("holds_lease", &self.guard.is_some())
            .finish()
    }
}

impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        Self::empty()
    }
}

/// The error a body ends with when its lease is lost mid-stream.
#[derive(Debug)]
struct LeaseLostError;

impl fmt::Display for LeaseLostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the lock's lease was lost while the response body was streaming")
    }
}

impl std::error::Error for LeaseLostError {}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if *this.done {
            // The inner body has ended; finish the release before ending.
            if let Some(g) = this.guard.as_mut() {
                if g.poll_release(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            *this.guard = None;
            return Poll::Ready(None);
        }
        if let Some(g) = this.guard.as_mut() {
            if g.poll_lost(cx) {
                let grpc = g.grpc;
                *this.guard = None;
                *this.done = true;
                if grpc {
                    let status = crate::grpc::status_trailers(
                        crate::grpc::GrpcCode::Aborted,
                        &LeaseLostError.to_string(),
                    );
                    return Poll::Ready(Some(Ok(Frame::trailers(status))));
                }
                return Poll::Ready(Some(Err(Box::new(LeaseLostError))));
            }
        }
        let polled = match this.kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Full { data, tail } => Poll::Ready(match (data.take(), tail.take()) {
                (Some(d), t) => {
                    *tail = t;
                    Some(Ok(Frame::data(d)))
                }
                (None, Some(t)) => Some(match *t {
                    Tail::Trailers(t) => Ok(Frame::trailers(t)),
                    Tail::Error(e) => Err(e),
                }),
                (None, None) => None,
            }),
            KindProj::Rest { rest } => match rest.read.pop_front() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => Pin::new(&mut rest.body).poll_frame(cx),
            },
        };
        match polled {
            Poll::Ready(None) => {
                *this.done = true;
                if let Some(g) = this.guard.as_mut() {
                    if g.poll_release(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                *this.guard = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                // Dropping the lease releases it in the background.
                *this.guard = None;
                *this.done = true;
                Poll::Ready(Some(Err(e)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.guard.is_some() {
            // The end must be polled, so that the lease is released.
            return false;
        }
        self.done
            || match &self.kind {
                Kind::Inner { body } => body.is_end_stream(),
                Kind::Full { data, tail } => data.is_none() && tail.is_none(),
                Kind::Rest { rest } => rest.read.is_empty() && rest.body.is_end_stream(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Rest { rest } => {
                let read: u64 = rest.read.iter().map(|d| d.len() as u64).sum();
                let rest = rest.body.size_hint();
                let mut hint = SizeHint::new();
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint.set_lower(rest.lower().saturating_add(read));
                hint
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Empty};

    use super::*;

    type Buffered = ResponseBody<Empty<Bytes>>;

    /// A buffered body gives its data, then its trailers or its error.
    #[tokio::test]
    async fn buffered_bodies_end_with_their_tail() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = Buffered::buffered(Bytes::from("ab"), Some(Tail::Trailers(trailers.clone())));
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes(), "ab");

        let mut body = Buffered::buffered(Bytes::from("ab"), Some(Tail::Error("cut".into())));
        assert!(!body.is_end_stream());
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(data, "ab");
        assert_eq!(body.frame().await.unwrap().unwrap_err().to_string(), "cut");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    /// A body read in part gives the chunks read, then the rest.
    #[tokio::test]
    async fn rest_bodies_give_what_was_read_then_the_rest() {
        let rest = http_body_util::Full::new(Bytes::from("cd"))
            .map_err(|e| match e {})
            .boxed_unsync();
        let read = VecDeque::from([Bytes::from("a"), Bytes::from("b")]);
        let body = Buffered::rest(read, rest);
        assert_eq!(body.size_hint().exact(), Some(4));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcd");
    }
}
