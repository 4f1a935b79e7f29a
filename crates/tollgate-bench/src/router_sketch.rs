//! A bound for the router row: the least a rate-limit layer of tollgate's
//! shape can add to a request. The shape is the design's: the check runs
//! in the response future (so the future owns a clone of the inner
//! service, as tower's pattern has it, and a future dropped unpolled takes
//! nothing), an admitted request carries its `Decision` in its extensions,
//! and the response gets the draft-10 `RateLimit-Policy` (made once) and
//! `RateLimit` (made per decision) fields. The check is the least-work one
//! of [`crate::micro_sketch`] (governor's keyed GCRA on its TSC clock,
//! answering a `Decision`). No keyspace, metrics, tracing, plans, shadow
//! mode or failure policy: whatever tollgate's layer does costs at least
//! this.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::extract::ConnectInfo;
use governor::clock::DefaultClock;
use governor::state::keyed::DefaultKeyedStateStore;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::micro_sketch::{decide, Decision, Sketch};

type Limiter = Sketch<IpAddr, DefaultKeyedStateStore<IpAddr>, DefaultClock>;

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The layer: one limiter and its fixed policy field.
#[derive(Clone)]
pub(crate) struct SketchLayer {
    shared: Arc<Shared>,
}

struct Shared {
    limiter: Limiter,
    per_second: u64,
    policy: HeaderValue,
}

impl SketchLayer {
    /// `per_second` with a burst of as many, per peer address.
    pub(crate) fn new(per_second: u32) -> Self {
        let policy = format!("\"http\";q={per_second};w=1");
        SketchLayer {
            shared: Arc::new(Shared {
                limiter: crate::micro_sketch::sketch(per_second, DefaultClock::default()),
                per_second: u64::from(per_second),
                policy: HeaderValue::from_str(&policy).expect("a valid header value"),
            }),
        }
    }
}

impl<S> Layer<S> for SketchLayer {
    type Service = SketchService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SketchService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

#[derive(Clone)]
pub(crate) struct SketchService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B, ResB> Service<Request<B>> for SketchService<S>
where
    S: Service<Request<B>, Response = Response<ResB>> + Clone,
    ResB: Default,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = SketchFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        SketchFuture {
            state: State::Checking {
                inner: Some(inner),
                req: Some(req),
                peer,
                shared: Arc::clone(&self.shared),
            },
            headers: None,
        }
    }
}

pin_project! {
    pub(crate) struct SketchFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        headers: Option<(HeaderValue, HeaderValue)>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Checking {
            inner: Option<S>,
            req: Option<Request<B>>,
            peer: Option<IpAddr>,
            shared: Arc<Shared>,
        },
        Calling {
            #[pin]
            fut: S::Future,
        },
    }
}

impl<S, B, ResB> Future for SketchFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    inner,
                    req,
                    peer,
                    shared,
                } => {
                    let decision: Option<Decision> = peer
                        .as_ref()
                        .and_then(|ip| decide(&shared.limiter, shared.per_second, ip));
                    let Some(decision) = decision else {
                        let mut res = Response::new(ResB::default());
                        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                        return Poll::Ready(Ok(res));
                    };
                    let value = decision.ratelimit_value("\"http\"");
                    *this.headers = Some((shared.policy.clone(), value));
                    let mut req = req.take().expect("polled once");
                    req.extensions_mut().insert(decision);
                    let fut = inner.take().expect("polled once").call(req);
                    this.state.set(State::Calling { fut });
                }
                StateProj::Calling { fut } => {
                    let mut res = ready!(fut.poll(cx))?;
                    if let Some((policy, value)) = this.headers.take() {
                        res.headers_mut().append(RATELIMIT_POLICY, policy);
                        res.headers_mut().append(RATELIMIT, value);
                    }
                    return Poll::Ready(Ok(res));
                }
            }
        }
    }
}
