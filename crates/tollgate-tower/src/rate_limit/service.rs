//! [`RateLimit`]: the service, and what all its clones share.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response};
use tollgate_core::{Decision, Error, Plan, Plans, RateLimiter, Subject};
use tower_service::Service;

use super::counts;
use super::future::{Check, ResponseFuture};
use super::outcome::Counting;
use super::plan::{PlanEntries, PlanSelector};
use super::RequestCost;
use crate::headers::{DecisionHeaders, RateLimitHeaders};
use crate::key::{GlobalKey, KeyError, KeyExtractor};
use crate::middleware::{take_readied, Answer};
use crate::rejection::{Rejection, RejectionBody};

/// The HTTP concerns of a [`RateLimitLayer`](super::RateLimitLayer).
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) headers: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) shadow: bool,
    pub(crate) answer: Answer,
    pub(crate) counting: Counting,
    /// How long a request may wait for its slot instead of a 429
    /// (`wait_up_to`); `None`: it never waits.
    pub(crate) wait: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            headers: true,
            legacy_headers: false,
            shadow: false,
            answer: Answer::default(),
            counting: Counting::default(),
            wait: None,
        }
    }
}

/// What every service made by one layer shares.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The layer's limiter: the one it checks, or, over plans, the default
    /// plan's as of when the layer was made (reported by `limiter()`).
    pub(crate) one: Entry,
    /// Over plans: the table and each plan's entry. `None` keeps the one
    /// limiter's path free of any table lookup.
    plans: Option<PlanEntries>,
    pub(crate) options: Options,
}

/// One limiter and what its decisions are reported with.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) limiter: RateLimiter,
    /// The limiter's policy name, shared so that each decision's metric
    /// label is a reference count, not a fresh `String`.
    policy: Arc<str>,
    /// One structured-field String per quota (`"api"`, or `"api-q0"`, …).
    formatter: Arc<RateLimitHeaders>,
    /// The plan the limiter is for (put into the request's extensions).
    pub(crate) plan: Option<Plan>,
}

impl Entry {
    pub(crate) fn new(
        limiter: RateLimiter,
        formatter: Arc<RateLimitHeaders>,
        plan: Option<Plan>,
    ) -> Self {
        Entry {
            policy: Arc::from(limiter.keyspace().policy()),
            formatter,
            limiter,
            plan,
        }
    }
}

impl Shared {
    pub(crate) fn new(
        limiter: RateLimiter,
        formatter: Arc<RateLimitHeaders>,
        options: Options,
    ) -> Self {
        Shared {
            one: Entry::new(limiter, formatter, None),
            plans: None,
            options,
        }
    }

    /// Over `plans`, chosen per request by `selector`; `formatter` holds the
    /// header settings every plan's headers are made with.
    pub(crate) fn with_plans(
        plans: Plans,
        selector: Arc<dyn PlanSelector>,
        formatter: Arc<RateLimitHeaders>,
        options: Options,
    ) -> Self {
        let default = plans.select(None).limiter().clone();
        Shared {
            one: Entry::new(default, Arc::clone(&formatter), None),
            plans: Some(PlanEntries::new(plans, selector, formatter)),
            options,
        }
    }

    /// The entry of `req`'s plan, or `None` for a layer over one limiter
    /// (then [`Shared::one`] decides).
    pub(crate) fn select(&self, req: &Parts) -> Option<Arc<Entry>> {
        self.plans.as_ref().map(|p| p.select(req))
    }

    /// How long a request may wait for its slot: never in shadow mode,
    /// which only reports.
    pub(crate) fn wait(&self) -> Option<Duration> {
        self.options.wait.filter(|_| !self.options.shadow)
    }

    /// The plan table, for a layer over plans.
    pub(crate) fn plans(&self) -> Option<&Plans> {
        self.plans.as_ref().map(PlanEntries::plans)
    }

    /// The entry that decides: the selected plan's, else the one limiter's.
    pub(crate) fn entry<'a>(&'a self, selected: &'a Option<Arc<Entry>>) -> &'a Entry {
        selected.as_deref().unwrap_or(&self.one)
    }

    /// The headers of an admitted (or shadow-denied) response.
    pub(crate) fn admitted_headers(&self, entry: &Entry, decision: &Decision) -> DecisionHeaders {
        let mut headers = DecisionHeaders::default();
        self.write_admitted_headers(entry, decision, &mut headers);
        headers
    }

    /// Writes [`admitted_headers`](Self::admitted_headers) into `headers`
    /// (empty), in place.
    pub(crate) fn write_admitted_headers(
        &self,
        entry: &Entry,
        decision: &Decision,
        headers: &mut DecisionHeaders,
    ) {
        headers.write(
            &entry.formatter,
            decision,
            self.options.headers,
            self.options.legacy_headers,
        );
    }

    /// The rejection for a refused check.
    pub(crate) fn rejection(&self, entry: &Entry, outcome: Result<Decision, Error>) -> Rejection {
        match outcome {
            Ok(d) => {
                let headers = self.admitted_headers(entry, &d);
                Rejection::limited(d, headers)
            }
            Err(e) => {
                let r = Rejection::from_limiter_error(&entry.formatter, e);
                if self.options.headers {
                    r
                } else {
                    r.without_headers()
                }
            }
        }
    }

    /// One tracing event (and counter) per decision.
    pub(crate) fn observe(
        &self,
        entry: &Entry,
        subject: &Subject,
        cost: u64,
        result: &Result<Decision, Error>,
    ) {
        let shadow = self.options.shadow;
        let policy = &*entry.policy;
        let (outcome, source) = counts::labels(result, shadow);
        match result {
            Ok(d) if d.allowed => tracing::debug!(
                target: "tollgate_tower::rate_limit",
                policy, subject = %subject.digest(), cost, remaining = d.remaining,
                source, "request admitted"
            ),
            Ok(d) if shadow => tracing::info!(
                target: "tollgate_tower::rate_limit",
                policy, subject = %subject.digest(), cost, retry_after = ?d.retry_after,
                source, "request would be rate limited (shadow mode: admitted)"
            ),
            Ok(d) => tracing::info!(
                target: "tollgate_tower::rate_limit",
                policy, subject = %subject.digest(), cost, retry_after = ?d.retry_after,
                source, "request rate limited"
            ),
            Err(Error::CostExceedsCapacity { capacity, .. }) => tracing::info!(
                target: "tollgate_tower::rate_limit",
                policy, subject = %subject.digest(), cost, capacity, shadow,
                "request cost exceeds the limit's capacity"
            ),
            Err(e) => tracing::warn!(
                target: "tollgate_tower::rate_limit",
                policy, subject = %subject.digest(), cost, error = %e, shadow,
                "rate limit check failed"
            ),
        }
        counts::count(&entry.policy, outcome, source);
    }

    pub(crate) fn observe_key_error(&self, entry: &Entry, e: &KeyError) {
        tracing::debug!(
            target: "tollgate_tower::rate_limit",
            policy = &*entry.policy, status = e.status().as_u16(), error = %e,
            shadow = self.options.shadow, "request could not be keyed"
        );
        counts::count(&entry.policy, "key_error", "none");
    }
}

/// The rate-limiting service made by [`RateLimitLayer`](super::RateLimitLayer).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use tollgate::{MemoryBackend, Quota};
/// use tollgate::tower::RateLimitLayer;
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

    /// The limiter this service checks; over plans, the default plan's
    /// limiter as of when the layer was made (see [`plan_table`](Self::plan_table)).
    pub fn limiter(&self) -> &RateLimiter {
        &self.shared.one.limiter
    }

    /// The plan table this service chooses from per request, if it was
    /// made by [`RateLimitLayer::plans`](super::RateLimitLayer::plans).
    pub fn plan_table(&self) -> Option<&Plans> {
        self.shared.plans()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, K, C, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, K, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    ResB: RejectionBody,
    K: KeyExtractor,
    C: RequestCost,
    ReqB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let subject = match self.key.extract(&parts) {
            Ok(Some(subject)) => subject,
            Ok(None) => {
                let req = Request::from_parts(parts, body);
                return ResponseFuture::calling(self.inner.call(req));
            }
            Err(e) => {
                let shared = &self.shared;
                let selected = shared.select(&parts);
                shared.observe_key_error(shared.entry(&selected), &e);
                if shared.options.shadow {
                    let req = Request::from_parts(parts, body);
                    return ResponseFuture::calling(self.inner.call(req));
                }
                let response = shared.options.answer.reject(&parts, Rejection::key(e));
                return ResponseFuture::reply(response);
            }
        };
        let cost = self.cost.cost(&parts);
        // Over plans, the plan is chosen now, from the head; over one
        // limiter, nothing is looked up.
        let selected = self.shared.select(&parts);
        let check = Check {
            subject,
            cost,
            shared: Arc::clone(&self.shared),
            selected,
        };
        // Lazy: nothing is checked until the response future is polled (a
        // caller that drops it unpolled has taken nothing).
        let inner = take_readied(&mut self.inner);
        ResponseFuture::checking(check, inner, parts, body)
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

    /// An inner service that answers every request with an empty 200.
    async fn ok(
        _: Request<()>,
    ) -> Result<http::Response<http_body_util::Full<Bytes>>, std::convert::Infallible> {
        Ok(http::Response::new(http_body_util::Full::default()))
    }

    /// The check runs when the response future is polled, even on a store
    /// that answers at once: a future dropped unpolled takes nothing.
    #[tokio::test]
    async fn a_future_dropped_unpolled_takes_nothing() {
        use tower::{service_fn, Layer, ServiceExt};

        let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
            .quota(Quota::per_minute(5))
            .build()
            .unwrap();
        let mut svc = RateLimitLayer::new(limiter.clone())
            .key(crate::key::GlobalKey)
            .layer(service_fn(ok));
        for _ in 0..10 {
            drop(svc.ready().await.unwrap().call(Request::new(())));
        }
        let left = limiter.check(Subject::new("global")).await.unwrap();
        assert_eq!(left.remaining, 4, "only this check took a unit");
    }

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
            .service(service_fn(ok));
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
                        .rejection(&shared.one, Ok(decision.clone()))
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
