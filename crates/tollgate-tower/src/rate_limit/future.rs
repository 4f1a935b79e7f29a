//! [`ResponseFuture`]: checks the limit, then calls the inner service or
//! answers with a rejection.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tollgate_core::{Decision, Error, Subject};
use tower_service::Service;

use super::outcome::{Reservation, Settling};
use super::service::{Entry, Shared};
use crate::headers::DecisionHeaders;
use crate::middleware::Reply;
use crate::rejection::RejectionBody;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): checks the limit, then calls
    /// the inner service or answers with a rejection.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::convert::Infallible;
    /// use http::Request;
    /// use tollgate::{MemoryBackend, Quota};
    /// use tollgate::tower::RateLimitLayer;
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// let mut svc = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(5))
    ///     .layer(service_fn(|_: Request<()>| async {
    ///         Ok::<_, Infallible>(http::Response::new(http_body_util::Full::<bytes::Bytes>::default()))
    ///     }));
    /// let future = svc.ready().await?.call(Request::new(()));
    /// // Nothing has been checked yet: the check runs when the future is polled.
    /// let response = future.await?;
    /// assert_eq!(response.headers()["ratelimit"].to_str()?.split(';').nth(1), Some("r=4"));
    /// # Ok(()) }
    /// ```
    pub struct ResponseFuture<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB>,
        // What the response gets, written in place by the check (kept out
        // of the states: a change of state moves less).
        headers: Option<DecisionHeaders>,
        // Counting by outcome: the charge, until the response settles it.
        reservation: Option<Reservation>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Checking {
            // Taken once decided: an admission's reservation keeps it.
            check: Option<Check>,
            // Only a check that needs a round trip is boxed.
            pending: Option<BoxFuture<'static, Result<Decision, Error>>>,
            inner: Option<S>,
            // The request's head and body, kept apart until the inner
            // service is called: the check reads and extends the head.
            head: Option<(Parts, ReqB)>,
        },
        Calling {
            #[pin]
            fut: S::Future,
        },
        // The response does not count (given back whole), says its actual
        // cost (settled to it), or the inner service failed and that does
        // not count: the charge is settled first, and the response gets the
        // figures after it (else those of the check).
        Settling {
            settling: Settling,
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
    /// A check to make when polled (at once in process, else its round
    /// trip or its wait for a slot).
    pub(crate) fn checking(check: Check, inner: S, parts: Parts, body: ReqB) -> Self {
        ResponseFuture {
            state: State::Checking {
                check: Some(check),
                pending: None,
                inner: Some(inner),
                head: Some((parts, body)),
            },
            headers: None,
            reservation: None,
        }
    }

    pub(crate) fn calling(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Calling { fut },
            headers: None,
            reservation: None,
        }
    }

    pub(crate) fn reply(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Reply {
                reply: Reply::new(response),
            },
            headers: None,
            reservation: None,
        }
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Calling { .. } => "calling",
            State::Settling { .. } => "settling",
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
    ResB: RejectionBody,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    pending,
                    inner,
                    head,
                } => {
                    let Check {
                        subject,
                        cost,
                        shared,
                        selected,
                    } = check.as_ref().expect("polled after completion");
                    let entry = shared.entry(selected);
                    let result = match pending {
                        Some(check) => ready!(check.as_mut().poll(cx)),
                        None => match shared.wait() {
                            // Waiting for a slot: dropping this future
                            // before it comes gives the slot back.
                            Some(max_wait) => {
                                let (limiter, subject) = (entry.limiter.clone(), subject.clone());
                                let cost = *cost;
                                *pending = Some(Box::pin(async move {
                                    limiter.acquire(subject, cost, max_wait).await
                                }));
                                continue;
                            }
                            None => match entry.limiter.try_check_now(subject, *cost) {
                                Ok(decided) => decided,
                                Err(round_trip) => {
                                    *pending = Some(Box::pin(round_trip.send()));
                                    continue;
                                }
                            },
                        },
                    };
                    let check = check.take().expect("polled after completion");
                    let (parts, _) = head.as_mut().expect("polled after completion");
                    if let Some(response) =
                        decided(check, result, parts, this.headers, this.reservation)
                    {
                        this.state.set(State::Reply {
                            reply: Reply::new(response),
                        });
                        continue;
                    }
                    let (parts, body) = head.take().expect("polled after completion");
                    let mut inner = inner.take().expect("polled after completion");
                    let fut = inner.call(Request::from_parts(parts, body));
                    this.state.set(State::Calling { fut });
                }
                StateProj::Calling { fut } => {
                    let outcome = ready!(fut.poll(cx));
                    let (outcome, settling) = match (outcome, this.reservation.take()) {
                        (outcome, None) => (outcome, None),
                        (Ok(res), Some(r)) if r.reads_head() => {
                            // The head is read in place: moved out and back.
                            let (head, body) = res.into_parts();
                            let settling = r.settle(&head);
                            (Ok(Response::from_parts(head, body)), settling)
                        }
                        (Ok(res), Some(r)) => {
                            let settling = r.settle_refused(res.extensions());
                            (Ok(res), settling)
                        }
                        // No response: counted or refunded as the layer's
                        // count_unfinished says.
                        (Err(e), Some(r)) => (Err(e), r.fail()),
                    };
                    match settling {
                        Some(settling) => this.state.set(State::Settling {
                            settling,
                            outcome: Some(outcome),
                        }),
                        None => return Poll::Ready(finish(outcome, this.headers.take())),
                    }
                }
                StateProj::Settling { settling, outcome } => {
                    let settled = ready!(settling.poll(cx));
                    let outcome = outcome.take().expect("polled after completion");
                    // The figures after settling when the store told them,
                    // else those of the check.
                    let headers = settled.or_else(|| this.headers.take());
                    return Poll::Ready(finish(outcome, headers));
                }
                StateProj::Reply { reply } => return Poll::Ready(Ok(reply.answer())),
            }
        }
    }
}

/// What a request is checked with: its subject and cost, and the layer's
/// shared state with the plan entry that decides.
pub(crate) struct Check {
    pub(crate) subject: Subject,
    pub(crate) cost: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) selected: Option<Arc<Entry>>,
}

/// Reports `result` (of `check`) of the request with head `req`: admitted,
/// the [`Decision`] joins its extensions, and the response's `headers` and
/// `reservation` are written; refused, the answer instead of calling the
/// inner service.
fn decided(
    check: Check,
    result: Result<Decision, Error>,
    req: &mut Parts,
    headers: &mut Option<DecisionHeaders>,
    reservation: &mut Option<Reservation>,
) -> Option<Response<Bytes>> {
    let Check {
        subject,
        cost,
        shared,
        selected,
    } = check;
    let entry = shared.entry(&selected);
    shared.observe(entry, &subject, cost, &result);
    let shadow = shared.options.shadow;
    match result {
        // Read in place, then moved once, into the extensions.
        Ok(d) if d.allowed || shadow => {
            let written = headers.insert(DecisionHeaders::default());
            shared.write_admitted_headers(entry, &d, written);
            let counting = &shared.options.counting;
            // Held by every admission that charged: a rate limit inside
            // this layer may refuse the request, and then it does not
            // count here (several limits never burn one's unit on
            // another's refusal).
            if let Some(plan) = &entry.plan {
                req.extensions.insert(plan.clone());
            }
            if let Some(charge) = d.charge.filter(|c| counting.holds(c)) {
                *reservation = Some(Reservation::new(shared, selected, subject, charge));
            }
            req.extensions.insert(d);
            None
        }
        Err(_) if shadow => None,
        outcome => Some(
            shared
                .options
                .answer
                .reject(req, shared.rejection(entry, outcome)),
        ),
    }
}

/// The response with the rate-limit `headers` added; its body is left as
/// it is.
fn finish<ResB, E>(
    outcome: Result<Response<ResB>, E>,
    headers: Option<DecisionHeaders>,
) -> Result<Response<ResB>, E> {
    outcome.map(|mut response| {
        if let Some(mut extra) = headers {
            extra.apply(response.headers_mut());
        }
        response
    })
}
