//! [`ResponseFuture`]: takes a slot of the budget, calls the inner service,
//! learns from its response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use futures_util::future::BoxFuture;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::task::JoinHandle;
use tollgate_core::{Charge, Subject};
use tower_service::Service;

use super::service::{Shared, Slot};
use crate::body::BoxError;

pin_project! {
    /// The response future of [`Pace`](super::Pace): takes a slot of the
    /// budget, calls the inner service, learns from its response.
    ///
    /// Nothing is taken until it is polled. Dropped while waiting for its
    /// slot, it makes no call and gives the slot back (while no later call
    /// is reserved behind it; else the slot passes unused); dropped (or failed)
    /// after, its charge stays: the call may have reached the upstream.
    /// Dropped while the block or settle its response asked for is being
    /// made, that work still completes (it runs in a task of its own).
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
        Pacing {
            taking: BoxFuture<'static, Result<Option<Charge>, BoxError>>,
            inner: Option<S>,
            req: Option<Request<ReqB>>,
            subject: Option<Subject>,
            shared: Arc<Shared>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            slot: Option<Slot>,
        },
        Learning {
            applying: JoinHandle<()>,
            response: Option<S::Response>,
        },
        Failed {
            error: Option<BoxError>,
        },
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    /// A call under no budget (its key extractor said "not paced").
    pub(crate) fn unpaced(mut inner: S, req: Request<ReqB>) -> Self {
        ResponseFuture {
            state: State::Calling {
                fut: inner.call(req),
                slot: None,
            },
        }
    }

    /// A call that ends with `error` and is never made.
    pub(crate) fn failed(error: BoxError) -> Self {
        ResponseFuture {
            state: State::Failed { error: Some(error) },
        }
    }

    /// A call that takes `cost` units of `subject`'s budget first.
    pub(crate) fn pacing(
        shared: Arc<Shared>,
        subject: Subject,
        cost: u64,
        inner: S,
        req: Request<ReqB>,
    ) -> Self {
        let taking = {
            let (shared, subject) = (Arc::clone(&shared), subject.clone());
            Box::pin(async move { shared.take_slot(&subject, cost).await })
        };
        ResponseFuture {
            state: State::Pacing {
                taking,
                inner: Some(inner),
                req: Some(req),
                subject: Some(subject),
                shared,
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
            State::Pacing { .. } => "pacing",
            State::Calling { .. } => "calling",
            State::Learning { .. } => "learning",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<Response<ResB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Pacing {
                    taking,
                    inner,
                    req,
                    subject,
                    shared,
                } => {
                    let charge = ready!(taking.as_mut().poll(cx))?;
                    let mut inner = inner.take().expect("polled after completion");
                    let req = req.take().expect("polled after completion");
                    let slot = Slot {
                        shared: Arc::clone(shared),
                        subject: subject.take().expect("polled after completion"),
                        charge,
                    };
                    let fut = inner.call(req);
                    this.state.set(State::Calling {
                        fut,
                        slot: Some(slot),
                    });
                }
                StateProj::Calling { fut, slot } => {
                    // An error keeps the charge: the call may have reached
                    // the upstream.
                    let response = ready!(fut.poll(cx)).map_err(Into::into)?;
                    let Some(slot) = slot.take() else {
                        return Poll::Ready(Ok(response));
                    };
                    let (parts, body) = response.into_parts();
                    let Some(lesson) = slot.lesson(&parts) else {
                        return Poll::Ready(Ok(Response::from_parts(parts, body)));
                    };
                    // In a task of its own: a caller that stops waiting for
                    // the response does not undo what it taught.
                    let applying = tokio::spawn(slot.apply(lesson));
                    this.state.set(State::Learning {
                        applying,
                        response: Some(Response::from_parts(parts, body)),
                    });
                }
                StateProj::Learning { applying, response } => {
                    // The task never fails the call (a panic in it is its own).
                    let _ = ready!(Pin::new(applying).poll(cx));
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response));
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error.take().expect("polled after completion")));
                }
            }
        }
    }
}
