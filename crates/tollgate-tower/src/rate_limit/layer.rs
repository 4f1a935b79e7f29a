//! [`RateLimitLayer`]: the limiter and the HTTP concerns around it.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Response;
use tollgate_core::{Algorithm, Plans, Quota, RateBackend, RateLimiter};
use tower_layer::Layer;

use super::plan::PlanSelector;
use super::service::{Options, RateLimit, Shared};
use crate::grpc::Protocol;
use crate::headers::{HeaderFormat, RateLimitHeaders};
use crate::key::GlobalKey;
use crate::rejection::Rejection;

/// Applies a rate limit to requests; see the [module docs](super).
///
/// Clones share the limiter (and its state on the backend): an axum
/// `Router::layer`, which applies the layer to every route and clones the
/// service per request, enforces one limit, not one per clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use axum::{body::Body, routing::get, Router};
/// use http::{Request, StatusCode};
/// use tollgate::{Algorithm, FailurePolicy, ManualClock, MemoryBackend, Quota, RateLimiter};
/// use tollgate::tower::key::HeaderKey;
/// use tollgate::tower::RateLimitLayer;
/// use tower::ServiceExt;
///
/// // 2 per second and 100 per hour, checked together in one round trip.
/// let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
///     .quota(Quota::per_second(2))
///     .quota(Quota::per_hour(100))
///     .name("api")
///     .clock(ManualClock::new(1_800_000_000_000_000)) // a fixed instant, on an hour boundary
///     .failure_policy(FailurePolicy::Deny)
///     .timeout(Duration::from_millis(50))
///     .build()?;
/// let layer = RateLimitLayer::new(limiter).key(HeaderKey::new("x-api-key")).legacy_headers(true);
/// let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
///
/// let req = || Request::get("/").header("x-api-key", "k1").body(Body::empty()).unwrap();
/// let res = app.clone().oneshot(req()).await?;
/// assert_eq!(res.status(), StatusCode::OK);
/// assert_eq!(res.headers()["ratelimit"], r#""api-q0";r=1;t=1, "api-q1";r=99;t=3600"#);
/// app.clone().oneshot(req()).await?;
/// let res = app.clone().oneshot(req()).await?;
/// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(res.headers()["retry-after"], "1");
/// # Ok(()) }
/// ```
///
/// # Which layers share a budget
///
/// Counters live on the backend under the prefix, the policy
/// [name](tollgate_core::RateLimiterBuilder::name) and the subject. Without `.name(..)`, the
/// name is derived from the algorithm and the quotas, so **layers with the
/// same algorithm and quotas and no name share their counters for a
/// subject** — on one backend (one Redis, or clones of one
/// `MemoryBackend`), whichever routes, services or processes they are on.
/// Two identical per-IP layers on `/login` and `/signup` therefore enforce
/// **one** budget per IP across both routes. That is what several instances
/// of one service want; for separate budgets, give each limiter its own
/// `.name(..)` (differently configured layers never share counters).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::net::SocketAddr;
/// use axum::{body::Body, routing::post, Router};
/// use http::{Request, StatusCode};
/// use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter};
/// use tollgate::tower::key::PeerIp;
/// use tollgate::tower::RateLimitLayer;
/// use tower::ServiceExt;
///
/// // One store for the whole app, as one Redis would be.
/// let backend = MemoryBackend::new();
/// let per_ip = |name: Option<&str>| {
///     let mut limiter = RateLimiter::builder(backend.clone(), Algorithm::TokenBucket).quota(Quota::per_minute(1));
///     if let Some(name) = name {
///         limiter = limiter.name(name);
///     }
///     RateLimitLayer::new(limiter.build().unwrap()).key(PeerIp::new())
/// };
/// let from = |path: &str, peer: &str| {
///     let mut req = Request::post(path).body(Body::empty()).unwrap();
///     req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
///     req
/// };
///
/// // Named layers: a separate budget per route.
/// let app = Router::new()
///     .route("/login", post(|| async { "welcome back" }).layer(per_ip(Some("login"))))
///     .route("/signup", post(|| async { "welcome" }).layer(per_ip(Some("signup"))));
/// let ip = "203.0.113.9:50000";
/// assert_eq!(app.clone().oneshot(from("/login", ip)).await?.status(), StatusCode::OK);
/// assert_eq!(app.clone().oneshot(from("/login", ip)).await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(app.clone().oneshot(from("/signup", ip)).await?.status(), StatusCode::OK);
///
/// // The same layers without names: one budget per IP for both routes.
/// let app = Router::new()
///     .route("/login", post(|| async { "welcome back" }).layer(per_ip(None)))
///     .route("/signup", post(|| async { "welcome" }).layer(per_ip(None)));
/// let ip = "198.51.100.7:50000";
/// assert_eq!(app.clone().oneshot(from("/login", ip)).await?.status(), StatusCode::OK);
/// assert_eq!(app.clone().oneshot(from("/signup", ip)).await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer<K = GlobalKey, C = u64> {
    limiter: RateLimiter,
    formatter: Arc<RateLimitHeaders>,
    /// Over plans: the table and what picks a request's plan.
    plans: Option<(Plans, Arc<dyn PlanSelector>)>,
    pub(super) options: Options,
    key: K,
    cost: C,
}

impl<K: fmt::Debug, C: fmt::Debug> fmt::Debug for RateLimitLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("plans", &self.plans.as_ref().map(|(plans, _)| plans))
            .field("key", &self.key)
            .field("cost", &self.cost)
            .field("options", &self.options)
            .finish()
    }
}

macro_rules! algorithm_constructor {
    ($(#[$doc:meta])* $name:ident, $alg:expr) => {
        $(#[$doc])*
        ///
        /// # Panics
        ///
        /// If the quota does not suit the algorithm (a burst on a window
        /// algorithm): build the limiter with [`RateLimiter::builder`] and
        /// use [`RateLimitLayer::new`] to get that error as a `Result`.
        pub fn $name(backend: impl RateBackend, quota: Quota) -> Self {
            Self::with_algorithm(backend, $alg, quota)
        }
    };
}

impl RateLimitLayer {
    /// A layer around `limiter` (built with [`RateLimiter::builder`]):
    /// quotas, name, failure policy, timeout, circuit breaker, … are the
    /// limiter's. Clones of a limiter share its state, so the same limiter
    /// can serve the middleware and handler-level checks.
    ///
    /// ```
    /// # fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{Algorithm, FailurePolicy, MemoryBackend, Quota, RateLimiter};
    /// use tollgate::tower::RateLimitLayer;
    ///
    /// let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
    ///     .quota(Quota::per_minute(600))
    ///     .failure_policy(FailurePolicy::Deny)
    ///     .build()?;
    /// let layer = RateLimitLayer::new(limiter.clone());
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn new(limiter: RateLimiter) -> Self {
        RateLimitLayer {
            formatter: Arc::new(RateLimitHeaders::new(&limiter)),
            limiter,
            plans: None,
            options: Options::default(),
            key: GlobalKey,
            cost: 1,
        }
    }

    /// A layer that chooses its limiter per request: `selector` names the
    /// request's plan from its head (an extension set by authentication, a
    /// header, a claim; see [`PlanSelector`]), and the plan's limiter
    /// decides — the default plan's when the name is missing or unknown.
    ///
    /// Each plan counts on its own keys and sends its own
    /// `RateLimit-Policy`. The admitted request carries the
    /// [`Plan`](tollgate_core::Plan) in its
    /// extensions, beside the [`Decision`](tollgate_core::Decision).
    /// Replacing the table ([`Plans::replace`], through any clone of
    /// `plans`) applies from the next request on, without a restart; see
    /// [`tollgate::rate::plans`](tollgate_core::rate::plans) for what happens to stored state.
    /// The plan is chosen when the service is called, and checked when the
    /// response future is polled, as with one limiter.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use axum::{body::Body, routing::get, Extension, Router};
    /// use http::{request::Parts, Request, StatusCode};
    /// use tollgate::{Algorithm, MemoryBackend, Plan, PlanTable, Plans, Quota, RateLimiter};
    /// use tollgate::tower::key::HeaderKey;
    /// use tollgate::tower::RateLimitLayer;
    /// use tower::ServiceExt;
    ///
    /// let backend = MemoryBackend::new();
    /// let table = |free, pro| -> Result<PlanTable, tollgate::Error> {
    ///     let limiter = |name: &str, n| {
    ///         RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
    ///             .quota(Quota::per_minute(n))
    ///             .name(name)
    ///             .build()
    ///     };
    ///     PlanTable::builder()
    ///         .plan("free", limiter("free", free)?)
    ///         .plan("pro", limiter("pro", pro)?)
    ///         .default_plan("free")
    ///         .build()
    /// };
    /// let plans = Plans::new(table(1, 100)?);
    /// // API keys that start with `pro-` are on the pro plan.
    /// let by_key = |req: &Parts| {
    ///     let key = req.headers.get("x-api-key")?.as_bytes();
    ///     Some(if key.starts_with(b"pro-") { "pro" } else { "free" })
    /// };
    /// let layer = RateLimitLayer::plans(plans.clone(), by_key).key(HeaderKey::new("x-api-key"));
    /// let app = Router::new()
    ///     .route("/", get(|Extension(plan): Extension<Plan>| async move { plan.name().to_owned() }))
    ///     .layer(layer);
    /// let req = |key: &str| Request::get("/").header("x-api-key", key).body(Body::empty()).unwrap();
    ///
    /// let res = app.clone().oneshot(req("pro-1")).await?;
    /// assert_eq!(res.headers()["ratelimit-policy"], r#""pro";q=100;w=60"#);
    /// let res = app.clone().oneshot(req("k-1")).await?;
    /// assert_eq!(res.headers()["ratelimit-policy"], r#""free";q=1;w=60"#);
    /// assert_eq!(app.clone().oneshot(req("k-1")).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    ///
    /// // Free grows to 10 a minute: the next request is checked against it.
    /// plans.replace(table(10, 100)?)?;
    /// let res = app.clone().oneshot(req("k-2")).await?;
    /// assert_eq!(res.headers()["ratelimit-policy"], r#""free";q=10;w=60"#);
    /// assert!(res.headers()["ratelimit"].to_str()?.starts_with(r#""free";r=9;"#));
    /// // k-1 used its whole minute: it refills at the new rate, one every 6 s.
    /// let res = app.clone().oneshot(req("k-1")).await?;
    /// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(res.headers()["retry-after"], "6");
    /// # Ok(()) }
    /// ```
    pub fn plans(plans: Plans, selector: impl PlanSelector) -> Self {
        let default = plans.select(None).limiter().clone();
        RateLimitLayer {
            plans: Some((plans, Arc::new(selector))),
            ..Self::new(default)
        }
    }

    /// A layer running `algorithm` on `backend` with one quota and the
    /// limiter's defaults.
    ///
    /// # Panics
    ///
    /// If the quota does not suit the algorithm; see [`RateLimitLayer::new`].
    pub fn with_algorithm(backend: impl RateBackend, algorithm: Algorithm, quota: Quota) -> Self {
        match RateLimiter::builder(backend, algorithm)
            .quota(quota)
            .build()
        {
            Ok(limiter) => Self::new(limiter),
            Err(e) => panic!("tollgate: invalid RateLimitLayer::{algorithm:?} quota: {e}"),
        }
    }

    algorithm_constructor!(
        /// A token bucket: bursts up to the quota's burst, refilled at the
        /// quota's rate.
        ///
        /// ```
        /// use tollgate::{MemoryBackend, Quota};
        /// use tollgate::tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::token_bucket(
        ///     MemoryBackend::new(),
        ///     Quota::per_second(10).with_burst(50).unwrap(),
        /// );
        /// # let _ = layer;
        /// ```
        token_bucket, Algorithm::TokenBucket);
    algorithm_constructor!(
        /// GCRA: the token bucket's admissions, as a schedule.
        ///
        /// ```
        /// use tollgate::{MemoryBackend, Quota};
        /// use tollgate::tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(10));
        /// # let _ = layer;
        /// ```
        gcra, Algorithm::Gcra);
    algorithm_constructor!(
        /// A fixed window: a counter per epoch-aligned window.
        ///
        /// ```
        /// use tollgate::{MemoryBackend, Quota};
        /// use tollgate::tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::fixed_window(MemoryBackend::new(), Quota::per_minute(100));
        /// # let _ = layer;
        /// ```
        fixed_window, Algorithm::FixedWindow);
    algorithm_constructor!(
        /// A sliding window log: exact, one entry per admitted unit.
        ///
        /// ```
        /// use tollgate::{MemoryBackend, Quota};
        /// use tollgate::tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::sliding_window_log(MemoryBackend::new(), Quota::per_minute(100));
        /// # let _ = layer;
        /// ```
        sliding_window_log, Algorithm::SlidingWindowLog);
    algorithm_constructor!(
        /// A sliding window counter: previous and current window, weighted.
        ///
        /// ```
        /// use tollgate::{MemoryBackend, Quota};
        /// use tollgate::tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::sliding_window_counter(MemoryBackend::new(), Quota::per_hour(1000));
        /// # let _ = layer;
        /// ```
        sliding_window_counter, Algorithm::SlidingWindowCounter);
}

impl<K, C> RateLimitLayer<K, C> {
    /// Keys requests with `key` (default [`GlobalKey`]: one budget for all).
    pub fn key<K2>(self, key: K2) -> RateLimitLayer<K2, C> {
        RateLimitLayer {
            limiter: self.limiter,
            formatter: self.formatter,
            plans: self.plans,
            options: self.options,
            key,
            cost: self.cost,
        }
    }

    /// Charges each request `cost` units: a constant or a closure
    /// (see [`RequestCost`](super::RequestCost)). Default 1.
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<K, C2> {
        RateLimitLayer {
            limiter: self.limiter,
            formatter: self.formatter,
            plans: self.plans,
            options: self.options,
            key: self.key,
            cost,
        }
    }

    /// Whether responses carry `RateLimit-Policy` and `RateLimit`
    /// (default: yes).
    pub fn headers(mut self, on: bool) -> Self {
        self.options.headers = on;
        self
    }

    /// Whether responses also carry the legacy `X-RateLimit-Limit`,
    /// `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds from now,
    /// rounded up) of the strictest quota (default: no).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.options.legacy_headers = on;
        self
    }

    /// Which fields carry the figures (default [`HeaderFormat::Draft10`]:
    /// `RateLimit-Policy` and `RateLimit`); [`HeaderFormat::Legacy`] sends
    /// only `X-RateLimit-*`. [`headers(false)`](Self::headers) turns the
    /// format off; [`legacy_headers`](Self::legacy_headers) adds the legacy
    /// fields to it.
    ///
    /// ```
    /// use tollgate::{MemoryBackend, Quota};
    /// use tollgate::tower::headers::HeaderFormat;
    /// use tollgate::tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(5))
    ///     .header_format(HeaderFormat::Legacy);
    /// # let _ = layer;
    /// ```
    pub fn header_format(mut self, format: HeaderFormat) -> Self {
        self.formatter = Arc::new(Arc::unwrap_or_clone(self.formatter).format(format));
        self
    }

    /// The unit the quotas count, for limits whose [cost](Self::cost) is
    /// not one per request: `RateLimit-Policy` says `qu="<unit>"` (see
    /// [`RateLimitHeaders::quota_unit`]).
    ///
    /// ```
    /// use tollgate::{MemoryBackend, Quota};
    /// use tollgate::tower::RateLimitLayer;
    ///
    /// // 1 MB per minute of request bodies, charged by Content-Length.
    /// let layer = RateLimitLayer::token_bucket(MemoryBackend::new(), Quota::per_minute(1_000_000))
    ///     .cost(|req: &http::request::Parts| {
    ///         req.headers.get("content-length").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1)
    ///     })
    ///     .quota_unit("content-bytes");
    /// # let _ = layer;
    /// ```
    pub fn quota_unit(mut self, unit: &str) -> Self {
        self.formatter = Arc::new(Arc::unwrap_or_clone(self.formatter).quota_unit(unit));
        self
    }

    /// Shadow mode: decide and report (headers, tracing, metrics), but never
    /// refuse a request — for rolling out a new limit safely.
    pub fn shadow(mut self, on: bool) -> Self {
        self.options.shadow = on;
        self
    }

    /// How rejections are shaped (default [`Protocol::Auto`]: gRPC for
    /// `application/grpc*` requests, HTTP otherwise).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.options.answer.protocol = protocol;
        self
    }

    /// Replaces every rejection response (429, 413, 503, key errors) with
    /// `responder`'s, given the [`Rejection`] and the request's head; start
    /// from [`Rejection::default_response`] to adjust the default.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::request::Parts;
    /// use tollgate::{MemoryBackend, Quota};
    /// use tollgate::tower::rejection::{Rejection, RejectionReason};
    /// use tollgate::tower::RateLimitLayer;
    ///
    /// // A JSON body of its own instead of the default problem document.
    /// let layer = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(5))
    ///     .responder(|rej: &Rejection, _req: &Parts| {
    ///         let mut res = rej.default_response();
    ///         if let Some(d) = rej.decision() {
    ///             *res.body_mut() = Bytes::from(format!(r#"{{"remaining":{}}}"#, d.remaining));
    ///             res.headers_mut().insert("content-type", "application/json".parse().unwrap());
    ///         }
    ///         res
    ///     });
    /// # let _ = layer;
    /// ```
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection, &Parts) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.options.answer.responder = Some(Arc::new(responder));
        self
    }

    /// The limiter the middleware checks, to run handler-level checks
    /// against the same state. Over [plans](RateLimitLayer::plans): the
    /// default plan's limiter as of when the layer was made (see
    /// [`plan_table`](Self::plan_table) for the current table).
    pub fn limiter(&self) -> &RateLimiter {
        &self.limiter
    }

    /// The plan table of a layer made by [`RateLimitLayer::plans`]: the
    /// same table, so a replacement through it (or any clone of it) applies
    /// to the layer's next decision.
    pub fn plan_table(&self) -> Option<&Plans> {
        self.plans.as_ref().map(|(plans, _)| plans)
    }
}

impl<S, K: Clone, C: Clone> Layer<S> for RateLimitLayer<K, C> {
    type Service = RateLimit<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        let shared = match &self.plans {
            None => Shared::new(
                self.limiter.clone(),
                Arc::clone(&self.formatter),
                self.options.clone(),
            ),
            Some((plans, selector)) => Shared::with_plans(
                plans.clone(),
                Arc::clone(selector),
                Arc::clone(&self.formatter),
                self.options.clone(),
            ),
        };
        RateLimit::new(inner, Arc::new(shared), self.key.clone(), self.cost.clone())
    }
}
