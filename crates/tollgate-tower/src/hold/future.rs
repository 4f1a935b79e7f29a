//! [`ResponseFuture`]: acquires, calls the inner service while watching
//! the lease, releases.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tollgate_core::{Lease, LeaseLost};
use tower_service::Service;

use super::gate::Acquired;
use super::service::{head_of, Shared};
use crate::body::{release, LeaseGuard, ResponseBody};
use crate::lock::{HoldUntil, OnLeaseLost};
use crate::middleware::Reply;

pin_project! {
    /// The response future of [`Hold`](super::Hold): acquires, calls the inner service
    /// while watching the lease, releases.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::convert::Infallible;
    /// use http::Request;
    /// use tollgate::{Locker, MemoryBackend};
    /// use tollgate::tower::key::GlobalKey;
    /// use tollgate::tower::LockLayer;
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
    pub(crate) enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Acquiring {
            acquire: BoxFuture<'static, Acquired>,
            inner: Option<S>,
            req: Option<Request<ReqB>>,
            shared: Arc<Shared>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            lease: Option<Lease>,
            lost: Option<LeaseLost>,
            head: Option<http::request::Parts>,
            shared: Arc<Shared>,
        },
        // The inner service's answer, a response or an error, waits for
        // the release: a retry at once finds the lock free either way.
        Releasing {
            release: BoxFuture<'static, ()>,
            outcome: Option<Result<S::Response, S::Error>>,
        },
        Reply {
            reply: Reply,
        },
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn new(state: State<S, ReqB>) -> Self {
        ResponseFuture { state }
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
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

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
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
                } => {
                    let result = ready!(acquire.as_mut().poll(cx));
                    let mut req = req.take().expect("polled after completion");
                    let mut inner = inner.take().expect("polled after completion");
                    let shared = Arc::clone(shared);
                    match result {
                        Acquired::Held(lease) => {
                            req.extensions_mut().insert(lease.fence());
                            req.extensions_mut().insert(lease.lost());
                            let cancel = shared.on_lost == OnLeaseLost::Cancel;
                            let head = cancel.then(|| head_of(&req));
                            // Watched either way: a loss is always reported.
                            let lost = Some(lease.lost());
                            let fut = inner.call(req);
                            this.state.set(State::Calling {
                                fut,
                                lease: Some(lease),
                                lost,
                                head,
                                shared,
                            });
                        }
                        Acquired::Pass => {
                            this.state.set(State::Calling {
                                fut: inner.call(req),
                                lease: None,
                                lost: None,
                                head: None,
                                shared,
                            });
                        }
                        Acquired::Refused(rejection) => {
                            let (parts, _body) = req.into_parts();
                            let response = shared.answer.reject(&parts, *rejection);
                            this.state.set(State::Reply {
                                reply: Reply::new(response),
                            });
                        }
                    }
                }
                StateProj::Calling {
                    fut,
                    lease,
                    lost,
                    head,
                    shared,
                } => {
                    // The lease first: once it is lost, the handler must not
                    // run another step. Its deadline is read too: the
                    // watchdog that signals a loss may not have run yet (a
                    // starved runtime, a handler that blocked the thread).
                    if let Some(l) = lost.as_mut() {
                        let signalled = Pin::new(l).poll(cx).is_ready();
                        if lease.as_ref().is_some_and(Lease::is_lost) {
                            *lost = None;
                            if let Some(response) = lost_answer(shared, head.take()) {
                                // Dropping the state drops the inner future.
                                this.state.set(State::Reply {
                                    reply: Reply::new(response),
                                });
                            }
                            continue;
                        }
                        if signalled {
                            // Released: nothing to watch any more.
                            *lost = None;
                        }
                    }
                    let outcome = ready!(fut.poll(cx));
                    let Some(lease) = lease.take() else {
                        return Poll::Ready(outcome.map(|r| r.map(ResponseBody::new)));
                    };
                    // The handler's last step may have run past the lease's
                    // deadline: its answer was not made under the lock.
                    if lost.is_some() && lease.is_lost() {
                        *lost = None;
                        if let Some(response) = lost_answer(shared, head.take()) {
                            // A lost lease holds nothing to release (its
                            // drop ends its watchdog).
                            drop(lease);
                            this.state.set(State::Reply {
                                reply: Reply::new(response),
                            });
                            continue;
                        }
                    }
                    let response = match outcome {
                        Ok(response) => response,
                        Err(e) => {
                            this.state.set(State::Releasing {
                                release: release(lease),
                                outcome: Some(Err(e)),
                            });
                            continue;
                        }
                    };
                    match shared.hold {
                        HoldUntil::BodyEnd => {
                            let grpc = response
                                .headers()
                                .get(http::header::CONTENT_TYPE)
                                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                            let guard = LeaseGuard::new(
                                lease,
                                lost.take(),
                                shared.on_lost == OnLeaseLost::Cancel,
                                shared.gate.clone(),
                            )
                            .for_grpc(grpc);
                            return Poll::Ready(Ok(
                                response.map(|b| ResponseBody::new(b).with_guard(guard))
                            ));
                        }
                        _ => {
                            this.state.set(State::Releasing {
                                release: release(lease),
                                outcome: Some(Ok(response)),
                            });
                        }
                    }
                }
                StateProj::Releasing { release, outcome } => {
                    ready!(release.as_mut().poll(cx));
                    let outcome = outcome.take().expect("polled after completion");
                    return Poll::Ready(outcome.map(|r| r.map(ResponseBody::new)));
                }
                StateProj::Reply { reply } => return Poll::Ready(Ok(reply.take())),
            }
        }
    }
}

/// Reports a lost lease, and answers in the handler's place when the loss
/// cancels it (`head` is kept only with [`OnLeaseLost::Cancel`]); `None`:
/// reported, not cancelled.
fn lost_answer(
    shared: &Shared,
    head: Option<http::request::Parts>,
) -> Option<Response<bytes::Bytes>> {
    shared.gate.lost(head.is_some());
    head.map(|head| shared.answer.reject(&head, shared.gate.lost_rejection()))
}
