//! [`RateLimit`]: the service, and what all its clones share.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_core::{Decision, DecisionSource, Error, RateLimiter, Subject};
use tower_service::Service;

use super::future::ResponseFuture;
use super::RequestCost;
use crate::body::ResponseBody;
use crate::headers::{DecisionHeaders, RateLimitHeaders};
use crate::key::{GlobalKey, KeyError, KeyExtractor};
use crate::middleware::{take_readied, Answer};
use crate::rejection::Rejection;

/// The HTTP concerns of a [`RateLimitLayer`](super::RateLimitLayer).
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) headers: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) shadow: bool,
    pub(crate) answer: Answer,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            headers: true,
            legacy_headers: false,
            shadow: false,
            answer: Answer::default(),
        }
    }
}

/// What every service made by one layer shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) limiter: RateLimiter,
    /// The limiter's policy name, shared so that each decision's metric
    /// label is a reference count, not a fresh `String`.
    policy: Arc<str>,
    /// One structured-field String per quota (`"api"`, or `"api-q0"`, …).
    formatter: Arc<RateLimitHeaders>,
    pub(crate) options: Options,
}

impl Shared {
    pub(crate) fn new(
        limiter: RateLimiter,
        formatter: Arc<RateLimitHeaders>,
        options: Options,
    ) -> Self {
        Shared {
            policy: Arc::from(limiter.keyspace().policy()),
            formatter,
            limiter,
            options,
        }
    }

    /// The headers of an admitted (or shadow-denied) response.
    pub(crate) fn admitted_headers(&self, decision: &Decision) -> DecisionHeaders {
        DecisionHeaders::new(
            &self.formatter,
            decision,
            self.options.headers,
            self.options.legacy_headers,
        )
    }

    /// The rejection for a refused check.
    pub(crate) fn rejection(&self, outcome: Result<Decision, Error>) -> Rejection {
        match outcome {
            Ok(d) => {
                let headers = self.admitted_headers(&d);
                Rejection::limited(d, headers)
            }
            Err(e) => {
                let r = Rejection::from_limiter_error(&self.formatter, e);
                if self.options.headers {
                    r
                } else {
                    r.without_headers()
                }
            }
        }
    }

    /// One tracing event (and counter) per decision.
    pub(crate) fn observe(&self, subject: &Subject, cost: u64, result: &Result<Decision, Error>) {
        let shadow = self.options.shadow;
        let policy = &*self.policy;
        let (outcome, source) = match result {
            Ok(d) => {
                let source = source_label(d.source);
                if d.allowed {
                    tracing::debug!(
                        target: "tollgate_tower::rate_limit",
                        policy, subject = %subject.digest(), cost, remaining = d.remaining,
                        source, "request admitted"
                    );
                    ("allowed", source)
                } else if shadow {
                    tracing::info!(
                        target: "tollgate_tower::rate_limit",
                        policy, subject = %subject.digest(), cost, retry_after = ?d.retry_after,
                        source, "request would be rate limited (shadow mode: admitted)"
                    );
                    ("shadow_denied", source)
                } else {
                    tracing::info!(
                        target: "tollgate_tower::rate_limit",
                        policy, subject = %subject.digest(), cost, retry_after = ?d.retry_after,
                        source, "request rate limited"
                    );
                    ("denied", source)
                }
            }
            Err(Error::CostExceedsCapacity { capacity, .. }) => {
                tracing::info!(
                    target: "tollgate_tower::rate_limit",
                    policy, subject = %subject.digest(), cost, capacity, shadow,
                    "request cost exceeds the limit's capacity"
                );
                ("too_costly", "none")
            }
            Err(e) => {
                tracing::warn!(
                    target: "tollgate_tower::rate_limit",
                    policy, subject = %subject.digest(), cost, error = %e, shadow,
                    "rate limit check failed"
                );
                ("unavailable", "none")
            }
        };
        self.count(outcome, source);
    }

    pub(crate) fn observe_key_error(&self, e: &KeyError) {
        tracing::debug!(
            target: "tollgate_tower::rate_limit",
            policy = &*self.policy, status = e.status().as_u16(), error = %e,
            shadow = self.options.shadow, "request could not be keyed"
        );
        self.count("key_error", "none");
    }

    #[cfg(feature = "metrics")]
    fn count(&self, outcome: &'static str, source: &'static str) {
        metrics::counter!(
            "tollgate_decisions_total",
            "policy" => Arc::clone(&self.policy),
            "outcome" => outcome,
            "source" => source,
        )
        .increment(1);
    }

    #[cfg(not(feature = "metrics"))]
    fn count(&self, _outcome: &'static str, _source: &'static str) {}
}

fn source_label(source: DecisionSource) -> &'static str {
    match source {
        DecisionSource::Backend => "backend",
        DecisionSource::DenyCache => "deny_cache",
        DecisionSource::FailOpen => "fail_open",
        DecisionSource::Fallback => "fallback",
        _ => "other",
    }
}

/// The rate-limiting service made by [`RateLimitLayer`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tollgate_core::{MemoryBackend, Quota};
/// use tollgate_tower::RateLimitLayer;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
///
/// let svc = ServiceBuilder::new()
///     .layer(RateLimitLayer::fixed_window(MemoryBackend::new(), Quota::per_minute(1)))
///     .service(service_fn(|_req: Request<String>| async {
///         Ok::<_, Infallible>(Response::new(http_body_util::Full::new(bytes::Bytes::from("hi"))))
///     }));
/// let res = svc.clone().oneshot(Request::new(String::new())).await?;
/// assert_eq!(res.status(), StatusCode::OK);
/// let res = svc.clone().oneshot(Request::new(String::new())).await?;
/// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimit<S, K = GlobalKey, C = u64> {
    inner: S,
    shared: Arc<Shared>,
    key: K,
    cost: C,
}

impl<S, K, C> RateLimit<S, K, C> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, key: K, cost: C) -> Self {
        RateLimit {
            inner,
            shared,
            key,
            cost,
        }
    }

    /// The limiter this service checks.
    pub fn limiter(&self) -> &RateLimiter {
        &self.shared.limiter
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, K, C, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, K, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    K: KeyExtractor,
    C: RequestCost,
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
                return ResponseFuture::calling(inner.call(Request::from_parts(parts, body)), None)
            }
            Err(e) => {
                shared.observe_key_error(&e);
                if shared.options.shadow {
                    let req = Request::from_parts(parts, body);
                    return ResponseFuture::calling(inner.call(req), None);
                }
                let response = shared.options.answer.reject(&parts, Rejection::key(e));
                return ResponseFuture::reply(response);
            }
        };
        let cost = self.cost.cost(&parts);
        // Lazy: nothing happens until the response future is polled.
        ResponseFuture::checking(
            subject,
            cost,
            inner,
            Request::from_parts(parts, body),
            shared,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http::header::RETRY_AFTER;
    use tollgate_core::{Algorithm, MemoryBackend, Quota};

    use super::*;
    use crate::grpc::Protocol;
    use crate::RateLimitLayer;

    /// Stacked limiters each report their policy (the structured-field
    /// lists are appended, inner first) while the legacy `X-RateLimit-*`
    /// headers keep the inner limiter's figures (set only if absent).
    #[tokio::test]
    async fn stacked_limiters_append_lists_and_keep_the_inner_legacy_headers() {
        use tower::{service_fn, ServiceBuilder, ServiceExt};

        let layer = |name: &str, limit: u64| {
            let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
                .quota(Quota::per_minute(limit))
                .name(name)
                .build()
                .unwrap();
            RateLimitLayer::new(limiter)
                .key(crate::key::GlobalKey)
                .legacy_headers(true)
        };
        let svc = ServiceBuilder::new()
            .layer(layer("outer", 10))
            .layer(layer("inner", 3))
            .service(service_fn(|_: Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(
                    http_body_util::Empty::<Bytes>::new(),
                ))
            }));
        let res = svc.oneshot(Request::new(())).await.unwrap();
        let all = |name: &str| -> Vec<String> {
            res.headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            all("ratelimit-policy"),
            [r#""inner";q=3;w=60"#, r#""outer";q=10;w=60"#]
        );
        // t= counts down to the end of the epoch-aligned minute.
        let lists = all("ratelimit");
        assert_eq!(lists.len(), 2, "{lists:?}");
        assert!(lists[0].starts_with(r#""inner";r=2;t="#), "{lists:?}");
        assert!(lists[1].starts_with(r#""outer";r=9;t="#), "{lists:?}");
        assert_eq!(all("x-ratelimit-limit"), ["3"]);
        assert_eq!(all("x-ratelimit-remaining"), ["2"]);
    }

    /// A denial announces its wait in whole seconds, rounded up and never 0,
    /// over HTTP and gRPC, whatever the decision says (no wait, a zero or
    /// sub-second wait); legacy headers on or off.
    #[tokio::test]
    async fn a_denial_never_announces_retry_after_zero() {
        let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
            .quota(Quota::per_second(10))
            .build()
            .unwrap();
        let mut decision = limiter.check("k").await.unwrap();
        decision.allowed = false;
        for legacy_headers in [false, true] {
            let options = Options {
                legacy_headers,
                ..Options::default()
            };
            let shared = Shared::new(
                limiter.clone(),
                Arc::new(RateLimitHeaders::new(&limiter)),
                options,
            );
            for (wait, secs) in [
                (None, "1"),
                (Some(Duration::ZERO), "1"),
                (Some(Duration::from_micros(1)), "1"),
                (Some(Duration::from_millis(100)), "1"),
                (Some(Duration::from_secs(1)), "1"),
                (Some(Duration::new(1, 1)), "2"),
            ] {
                decision.retry_after = wait;
                for grpc in [false, true] {
                    let protocol = if grpc { Protocol::Grpc } else { Protocol::Http };
                    let res = shared
                        .rejection(Ok(decision.clone()))
                        .for_protocol(protocol, &http::HeaderMap::new())
                        .default_response();
                    let all: Vec<_> = res.headers().get_all(RETRY_AFTER).iter().collect();
                    assert_eq!(all, [secs], "{wait:?}, grpc {grpc}");
                    let expected = if grpc { 200 } else { 429 };
                    assert_eq!(res.status(), expected);
                }
            }
        }
    }
}
