//! [`RateLimitLayer`]: rate limiting as tower middleware.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{routing::get, Router};
//! use tollgate_core::{MemoryBackend, Quota};
//! use tollgate_tower::key::PeerIp;
//! use tollgate_tower::RateLimitLayer;
//!
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(10)).key(PeerIp::new()));
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! # What the middleware does
//!
//! For each request, in the response future (never in `poll_ready`, which
//! only asks the inner service):
//!
//! 1. the [key extractor](crate::key) yields a key, "not limited" (the
//!    request passes straight through) or an error (answered with the
//!    error's status);
//! 2. the [cost](RequestCost) is computed (default 1);
//! 3. the limiter decides, in one round trip for all quotas;
//! 4. admitted: the inner service is called with the [`Decision`] in the
//!    request extensions, and the response gets the `RateLimit-Policy` and
//!    `RateLimit` headers (draft-ietf-httpapi-ratelimit-headers-10);
//!    refused: 429 with `Retry-After` (whole seconds, rounded up, never 0),
//!    the same headers and a short text body — or, for gRPC requests, a
//!    trailers-only response with `grpc-status: 8` (RESOURCE_EXHAUSTED) and
//!    the retry information in metadata, never an HTTP 429.
//!
//! A cost larger than the limit can ever admit is answered **413** (no
//! `Retry-After`: waiting cannot help) — gRPC RESOURCE_EXHAUSTED without
//! retry information. When the backend fails, the limiter's
//! [`FailurePolicy`] applies: allow (default; no made-up rate-limit headers
//! on such responses), deny (503, gRPC UNAVAILABLE), or a local fallback
//! limiter. Each check is bounded by a timeout (default 100 ms) and a
//! circuit breaker skips a dead backend altogether, so it adds no latency.
//!
//! In [shadow mode](RateLimitLayer::shadow) everything is decided and
//! reported (headers, tracing, metrics) but nothing is refused.
//!
//! # Configuration errors
//!
//! The algorithm constructors ([`RateLimitLayer::token_bucket`], …) cannot
//! fail, so they chain naturally into `.layer(..)`; the limiter is built
//! (and its configuration checked) once, when the layer is first applied.
//! An invalid configuration (a burst on a window algorithm, a `{` in a
//! prefix, …) then **panics** with the reason, at startup, like tower-http
//! does with invalid settings. Call [`RateLimitLayer::validate`] to get the
//! error as a `Result` instead.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tollgate_core::{
    Algorithm, Clock, Decision, DecisionSource, Error, FailurePolicy, Quota, RateBackend,
    RateLimiter, Subject,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::key::{GlobalKey, KeyError, KeyExtractor};
use crate::response::{
    ceil_secs, respond, retry_after_secs, Middleware, Protocol, RateLimitHeaders, Reason,
    Rejection, Responder, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};

/// How much of the limit a request uses.
///
/// Implemented by `u64` (a constant cost; the default is `1`) and by
/// closures `Fn(&Request<B>) -> u64`:
///
/// ```
/// use http::Request;
/// use tollgate_tower::rate_limit::RequestCost;
///
/// // Bulk endpoints cost one unit per item.
/// let cost = |req: &Request<()>| -> u64 {
///     req.headers()
///         .get("x-batch-size")
///         .and_then(|v| v.to_str().ok()?.parse().ok())
///         .unwrap_or(1)
/// };
/// let req = Request::post("/bulk").header("x-batch-size", "25").body(()).unwrap();
/// assert_eq!(cost.cost(&req), 25);
/// assert_eq!(RequestCost::<()>::cost(&3u64, &req), 3);
/// ```
pub trait RequestCost<B>: Clone + Send + Sync + 'static {
    /// The cost of `req`.
    fn cost(&self, req: &Request<B>) -> u64;
}

impl<B> RequestCost<B> for u64 {
    fn cost(&self, _req: &Request<B>) -> u64 {
        *self
    }
}

impl<B, F> RequestCost<B> for F
where
    F: Fn(&Request<B>) -> u64 + Clone + Send + Sync + 'static,
{
    fn cost(&self, req: &Request<B>) -> u64 {
        self(req)
    }
}

/// A `Clock` shared behind an `Arc`.
#[derive(Debug, Clone)]
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_micros(&self) -> u64 {
        self.0.now_micros()
    }
}

/// Everything needed to build a limiter, kept until the layer is applied.
#[derive(Clone)]
struct Spec {
    backend: Arc<dyn RateBackend>,
    algorithm: Algorithm,
    quotas: Vec<Quota>,
    name: Option<String>,
    prefix: Option<String>,
    clock: Option<SharedClock>,
    timeout: Option<Duration>,
    policy: Option<FailurePolicy>,
    breaker: Option<(u32, Duration)>,
    deny_cache: Option<usize>,
}

impl Spec {
    fn build(&self) -> Result<RateLimiter, Error> {
        let mut b = RateLimiter::builder(Arc::clone(&self.backend), self.algorithm);
        for q in &self.quotas {
            b = b.quota(*q);
        }
        if let Some(n) = &self.name {
            b = b.name(n.clone());
        }
        if let Some(p) = &self.prefix {
            b = b.prefix(p.clone());
        }
        if let Some(c) = &self.clock {
            b = b.clock(c.clone());
        }
        if let Some(t) = self.timeout {
            b = b.timeout(t);
        }
        if let Some(p) = self.policy {
            b = b.failure_policy(p);
        }
        if let Some((n, cooldown)) = self.breaker {
            b = b.circuit_breaker(n, cooldown);
        }
        if let Some(n) = self.deny_cache {
            b = b.deny_cache(n);
        }
        b.build()
    }
}

#[derive(Clone)]
enum Source {
    Spec(Box<Spec>),
    Ready(RateLimiter),
}

#[derive(Clone)]
struct Options {
    headers: bool,
    legacy_headers: bool,
    shadow: bool,
    protocol: Protocol,
    responder: Option<Responder>,
}

/// What every service made by one layer shares.
struct Shared {
    limiter: RateLimiter,
    /// The limiter's policy name, shared so that each decision's metric
    /// label is a reference count, not a fresh `String`.
    policy: Arc<str>,
    /// One structured-field String per quota (`"api"`, or `"api-q0"`, …).
    formatter: RateLimitHeaders,
    options: Options,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("limiter", &self.limiter)
            .field("headers", &self.options.headers)
            .field("legacy_headers", &self.options.legacy_headers)
            .field("shadow", &self.options.shadow)
            .field("protocol", &self.options.protocol)
            .field("responder", &self.options.responder.is_some())
            .finish()
    }
}

impl Shared {
    fn new(limiter: RateLimiter, options: Options) -> Self {
        Shared {
            policy: Arc::from(limiter.keyspace().policy()),
            formatter: RateLimitHeaders::new(&limiter),
            limiter,
            options,
        }
    }

    /// The headers of a denial: `Retry-After`, then the same rate-limit
    /// headers an admitted response gets.
    fn denial_headers(&self, decision: &Decision) -> HeaderMap {
        let mut h = HeaderMap::new();
        let wait = decision.retry_after.unwrap_or(Duration::from_secs(1));
        h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
        self.admitted_headers(decision).apply(&mut h);
        h
    }

    /// The headers of an admitted (or shadow-denied) response, made before
    /// the decision moves into the request's extensions; applied to the
    /// inner service's response without building a map.
    fn admitted_headers(&self, decision: &Decision) -> AdmittedHeaders {
        let (policy, ratelimit) = if self.options.headers {
            (
                self.formatter.policy().cloned(),
                self.formatter.ratelimit_value(decision),
            )
        } else {
            (None, None)
        };
        let legacy = (self.options.legacy_headers && decision.source != DecisionSource::FailOpen)
            .then(|| {
                Box::new([
                    HeaderValue::from(decision.limit),
                    HeaderValue::from(decision.remaining),
                    HeaderValue::from(ceil_secs(decision.reset_after)),
                ])
            });
        AdmittedHeaders {
            policy,
            ratelimit,
            legacy,
        }
    }

    fn policy_only_headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        if self.options.headers {
            if let Some(p) = self.formatter.policy() {
                h.append(RATELIMIT_POLICY, p.clone());
            }
        }
        h
    }

    fn reject(
        &self,
        parts: &http::request::Parts,
        reason: Reason<'_>,
        grpc: bool,
    ) -> Response<Bytes> {
        let headers = match &reason {
            Reason::Limited(d) => self.denial_headers(d),
            Reason::CostExceedsCapacity { .. } => self.policy_only_headers(),
            _ => HeaderMap::new(),
        };
        let rejection = Rejection::new(parts, Middleware::RateLimit, reason, grpc, headers);
        respond(self.options.responder.as_ref(), &rejection)
    }

    /// One tracing event (and counter) per decision.
    fn observe(&self, subject: &Subject, cost: u64, result: &Result<Decision, Error>) {
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

    fn observe_key_error(&self, e: &KeyError) {
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

/// Applies a rate limit to requests; see the [module docs](self).
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
/// use tollgate_core::{FailurePolicy, ManualClock, MemoryBackend, Quota};
/// use tollgate_tower::key::HeaderKey;
/// use tollgate_tower::RateLimitLayer;
/// use tower::ServiceExt;
///
/// // 2 per second and 100 per hour, checked together in one round trip.
/// let layer = RateLimitLayer::fixed_window(MemoryBackend::new(), Quota::per_second(2))
///     .quota(Quota::per_hour(100))
///     .name("api")
///     .clock(ManualClock::new(1_800_000_000_000_000)) // a fixed instant, on an hour boundary
///     .key(HeaderKey::new("x-api-key"))
///     .failure_policy(FailurePolicy::Deny)
///     .timeout(Duration::from_millis(50))
///     .legacy_headers(true)
///     .validate()?;
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
/// [name](RateLimitLayer::name) and the subject. Without `.name(..)`, the
/// name is derived from the algorithm and the quotas, so **layers with the
/// same algorithm and quotas and no name share their counters for a
/// subject** — on one backend (one Redis, or clones of one
/// `MemoryBackend`), whichever routes, services or processes they are on.
/// Two identical per-IP layers on `/login` and `/signup` therefore enforce
/// **one** budget per IP across both routes. That is what several instances
/// of one service want; for separate budgets, give each layer its own
/// `.name(..)` (differently configured layers never share counters).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::net::SocketAddr;
/// use axum::{body::Body, routing::post, Router};
/// use http::{Request, StatusCode};
/// use tollgate_core::{MemoryBackend, Quota};
/// use tollgate_tower::key::PeerIp;
/// use tollgate_tower::RateLimitLayer;
/// use tower::ServiceExt;
///
/// // One store for the whole app, as one Redis would be.
/// let backend = MemoryBackend::new();
/// let per_ip = || {
///     RateLimitLayer::token_bucket(backend.clone(), Quota::per_minute(1)).key(PeerIp::new())
/// };
/// let from = |path: &str, peer: &str| {
///     let mut req = Request::post(path).body(Body::empty()).unwrap();
///     req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
///     req
/// };
///
/// // Named layers: a separate budget per route.
/// let app = Router::new()
///     .route("/login", post(|| async { "welcome back" }).layer(per_ip().name("login")))
///     .route("/signup", post(|| async { "welcome" }).layer(per_ip().name("signup")));
/// let ip = "203.0.113.9:50000";
/// assert_eq!(app.clone().oneshot(from("/login", ip)).await?.status(), StatusCode::OK);
/// assert_eq!(app.clone().oneshot(from("/login", ip)).await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(app.clone().oneshot(from("/signup", ip)).await?.status(), StatusCode::OK);
///
/// // The same layers without names: one budget per IP for both routes.
/// let app = Router::new()
///     .route("/login", post(|| async { "welcome back" }).layer(per_ip()))
///     .route("/signup", post(|| async { "welcome" }).layer(per_ip()));
/// let ip = "198.51.100.7:50000";
/// assert_eq!(app.clone().oneshot(from("/login", ip)).await?.status(), StatusCode::OK);
/// assert_eq!(app.clone().oneshot(from("/signup", ip)).await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer<K = GlobalKey, C = u64> {
    source: Source,
    options: Options,
    misuse: Option<String>,
    built: Arc<OnceLock<Result<Arc<Shared>, String>>>,
    key: K,
    cost: C,
}

impl<K: fmt::Debug, C: fmt::Debug> fmt::Debug for RateLimitLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RateLimitLayer");
        match &self.source {
            Source::Ready(l) => d.field("limiter", l),
            Source::Spec(s) => d
                .field("algorithm", &s.algorithm)
                .field("quotas", &s.quotas)
                .field("name", &s.name),
        };
        d.field("key", &self.key)
            .field("cost", &self.cost)
            .field("headers", &self.options.headers)
            .field("legacy_headers", &self.options.legacy_headers)
            .field("shadow", &self.options.shadow)
            .field("protocol", &self.options.protocol)
            .finish_non_exhaustive()
    }
}

macro_rules! algorithm_constructor {
    ($(#[$doc:meta])* $name:ident, $alg:expr) => {
        $(#[$doc])*
        pub fn $name(backend: impl RateBackend, quota: Quota) -> Self {
            Self::with_algorithm(backend, $alg, quota)
        }
    };
}

impl RateLimitLayer {
    /// A layer around a prepared limiter (built with
    /// [`RateLimiter::builder`]): all its settings (quotas, failure policy,
    /// timeout, circuit breaker, …) are the limiter's. Use it to share one
    /// limiter between the middleware and handler-level checks.
    ///
    /// ```
    /// # fn main() -> Result<(), tollgate_core::Error> {
    /// use tollgate_core::{Algorithm, FailurePolicy, MemoryBackend, Quota, RateLimiter};
    /// use tollgate_tower::RateLimitLayer;
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
        Self::from_source(Source::Ready(limiter))
    }

    /// A layer running `algorithm` on `backend` with one quota (add more
    /// with [`quota`](Self::quota)).
    pub fn with_algorithm(backend: impl RateBackend, algorithm: Algorithm, quota: Quota) -> Self {
        Self::from_source(Source::Spec(Box::new(Spec {
            backend: Arc::new(backend),
            algorithm,
            quotas: vec![quota],
            name: None,
            prefix: None,
            clock: None,
            timeout: None,
            policy: None,
            breaker: None,
            deny_cache: None,
        })))
    }

    algorithm_constructor!(
        /// A token bucket: bursts up to the quota's burst, refilled at the
        /// quota's rate.
        ///
        /// ```
        /// use tollgate_core::{MemoryBackend, Quota};
        /// use tollgate_tower::RateLimitLayer;
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
        /// use tollgate_core::{MemoryBackend, Quota};
        /// use tollgate_tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(10));
        /// # let _ = layer;
        /// ```
        gcra, Algorithm::Gcra);
    algorithm_constructor!(
        /// A fixed window: a counter per epoch-aligned window.
        ///
        /// ```
        /// use tollgate_core::{MemoryBackend, Quota};
        /// use tollgate_tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::fixed_window(MemoryBackend::new(), Quota::per_minute(100));
        /// # let _ = layer;
        /// ```
        fixed_window, Algorithm::FixedWindow);
    algorithm_constructor!(
        /// A sliding window log: exact, one entry per admitted unit.
        ///
        /// ```
        /// use tollgate_core::{MemoryBackend, Quota};
        /// use tollgate_tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::sliding_window_log(MemoryBackend::new(), Quota::per_minute(100));
        /// # let _ = layer;
        /// ```
        sliding_window_log, Algorithm::SlidingWindowLog);
    algorithm_constructor!(
        /// A sliding window counter: previous and current window, weighted.
        ///
        /// ```
        /// use tollgate_core::{MemoryBackend, Quota};
        /// use tollgate_tower::RateLimitLayer;
        ///
        /// let layer = RateLimitLayer::sliding_window_counter(MemoryBackend::new(), Quota::per_hour(1000));
        /// # let _ = layer;
        /// ```
        sliding_window_counter, Algorithm::SlidingWindowCounter);

    fn from_source(source: Source) -> Self {
        RateLimitLayer {
            source,
            options: Options {
                headers: true,
                legacy_headers: false,
                shadow: false,
                protocol: Protocol::Auto,
                responder: None,
            },
            misuse: None,
            built: Arc::default(),
            key: GlobalKey,
            cost: 1,
        }
    }
}

impl<K, C> RateLimitLayer<K, C> {
    fn changed(mut self) -> Self {
        self.built = Arc::default();
        self
    }

    fn spec(mut self, what: &str, f: impl FnOnce(&mut Spec)) -> Self {
        match &mut self.source {
            Source::Spec(spec) => f(spec),
            Source::Ready(_) => {
                self.misuse.get_or_insert_with(|| {
                    format!(
                        "`{what}` cannot change a prepared RateLimiter (RateLimitLayer::new); set it on the RateLimiterBuilder"
                    )
                });
            }
        }
        self.changed()
    }

    /// Keys requests with `key` (default [`GlobalKey`]: one budget for all).
    pub fn key<K2>(self, key: K2) -> RateLimitLayer<K2, C> {
        RateLimitLayer {
            source: self.source,
            options: self.options,
            misuse: self.misuse,
            built: self.built,
            key,
            cost: self.cost,
        }
    }

    /// Charges each request `cost` units: a constant or a closure
    /// (see [`RequestCost`]). Default 1.
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<K, C2> {
        RateLimitLayer {
            source: self.source,
            options: self.options,
            misuse: self.misuse,
            built: self.built,
            key: self.key,
            cost,
        }
    }

    /// Adds a quota: all quotas are checked in one round trip, a request is
    /// admitted only if every quota admits it, the strictest decides the
    /// figures and all are reported in the headers.
    pub fn quota(self, quota: Quota) -> Self {
        self.spec("quota", |s| s.quotas.push(quota))
    }

    /// Names the policy (keys, headers, traces and metrics). Default:
    /// derived from the algorithm and quotas, so that unnamed layers with the
    /// same algorithm and quotas **share their counters** for a subject;
    /// give each layer its own name for separate budgets (see
    /// [Which layers share a budget](RateLimitLayer#which-layers-share-a-budget)).
    pub fn name(self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.spec("name", |s| s.name = Some(name))
    }

    /// The key prefix (default `tollgate`).
    pub fn prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.spec("prefix", |s| s.prefix = Some(prefix))
    }

    /// What to do when the backend fails: [`FailurePolicy::Allow`] (default),
    /// [`FailurePolicy::Deny`] (503 / gRPC UNAVAILABLE) or
    /// [`FailurePolicy::Fallback`] (a local in-memory limiter).
    pub fn failure_policy(self, policy: FailurePolicy) -> Self {
        self.spec("failure_policy", |s| s.policy = Some(policy))
    }

    /// Bounds each check's round trip (default 100 ms); past it the failure
    /// policy applies.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.spec("timeout", |s| s.timeout = Some(timeout))
    }

    /// After `threshold` consecutive backend failures, skip the backend for
    /// `cooldown` (then probe once): a dead backend adds no latency.
    /// Default: 5 failures, 1 s.
    pub fn circuit_breaker(self, threshold: u32, cooldown: Duration) -> Self {
        self.spec("circuit_breaker", |s| {
            s.breaker = Some((threshold, cooldown))
        })
    }

    /// Remembers up to `capacity` denied keys locally until their
    /// retry-after (0 turns it off; default 10 000).
    pub fn deny_cache(self, capacity: usize) -> Self {
        self.spec("deny_cache", |s| s.deny_cache = Some(capacity))
    }

    /// Times decisions with `clock` instead of the backend's clock (tests,
    /// managed Redis without `TIME` in scripts).
    pub fn clock(self, clock: impl Clock) -> Self {
        let clock = SharedClock(Arc::new(clock));
        self.spec("clock", |s| s.clock = Some(clock))
    }

    /// Whether responses carry `RateLimit-Policy` and `RateLimit`
    /// (default: yes).
    pub fn headers(mut self, on: bool) -> Self {
        self.options.headers = on;
        self.changed()
    }

    /// Whether responses also carry the legacy `X-RateLimit-Limit`,
    /// `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds from now,
    /// rounded up) of the strictest quota (default: no).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.options.legacy_headers = on;
        self.changed()
    }

    /// Shadow mode: decide and report (headers, tracing, metrics), but never
    /// refuse a request — for rolling out a new limit safely.
    pub fn shadow(mut self, on: bool) -> Self {
        self.options.shadow = on;
        self.changed()
    }

    /// How rejections are shaped (default [`Protocol::Auto`]: gRPC for
    /// `application/grpc*` requests, HTTP otherwise).
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.options.protocol = protocol;
        self.changed()
    }

    /// Replaces every rejection response (429, 413, 503, key errors) with
    /// `responder`'s; see [`Rejection`].
    pub fn responder(
        mut self,
        responder: impl Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.options.responder = Some(Arc::new(responder));
        self.changed()
    }

    fn build(&self) -> Result<Shared, Error> {
        if let Some(m) = &self.misuse {
            return Err(Error::InvalidConfig(m.clone()));
        }
        let limiter = match &self.source {
            Source::Ready(l) => l.clone(),
            Source::Spec(s) => s.build()?,
        };
        Ok(Shared::new(limiter, self.options.clone()))
    }

    fn shared(&self) -> Result<Arc<Shared>, String> {
        self.built
            .get_or_init(|| self.build().map(Arc::new).map_err(|e| e.to_string()))
            .clone()
    }

    /// Builds the limiter now and reports a configuration error, instead of
    /// panicking when the layer is applied.
    pub fn validate(self) -> Result<Self, Error> {
        let shared = self.build()?;
        let _ = self.built.set(Ok(Arc::new(shared)));
        Ok(self)
    }

    /// The limiter the middleware uses (built now if needed), to run
    /// handler-level checks against the same state; `None` if the
    /// configuration is invalid.
    pub fn limiter(&self) -> Option<RateLimiter> {
        self.shared().ok().map(|s| s.limiter.clone())
    }
}

impl<S, K: Clone, C: Clone> Layer<S> for RateLimitLayer<K, C> {
    type Service = RateLimit<S, K, C>;

    /// Panics if the configuration is invalid (see
    /// [`RateLimitLayer::validate`]).
    fn layer(&self, inner: S) -> Self::Service {
        let shared = self
            .shared()
            .unwrap_or_else(|e| panic!("tollgate: invalid RateLimitLayer configuration: {e}"));
        RateLimit {
            inner,
            shared,
            key: self.key.clone(),
            cost: self.cost.clone(),
        }
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
    K: KeyExtractor<ReqB>,
    C: RequestCost<ReqB>,
    ReqB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The readied service is the one that gets called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let grpc = shared.options.protocol.is_grpc(req.headers());
        let subject = match self.key.extract(&req) {
            Ok(Some(subject)) => subject,
            Ok(None) => return ResponseFuture::calling(inner.call(req), None),
            Err(e) => {
                shared.observe_key_error(&e);
                if shared.options.shadow {
                    return ResponseFuture::calling(inner.call(req), None);
                }
                let (parts, _body) = req.into_parts();
                return ResponseFuture::reply(shared.reject(&parts, Reason::Key(&e), grpc));
            }
        };
        let cost = self.cost.cost(&req);
        // Lazy: nothing happens until the response future is polled.
        ResponseFuture {
            state: State::Checking {
                subject,
                cost,
                pending: None,
                inner: Some(inner),
                req: Some(req),
                shared,
                grpc,
            },
        }
    }
}

pin_project! {
    /// The response future of [`RateLimit`]: checks the limit, then calls
    /// the inner service or answers with a rejection.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::convert::Infallible;
    /// use http::Request;
    /// use tollgate_core::{MemoryBackend, Quota};
    /// use tollgate_tower::RateLimitLayer;
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// let mut svc = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(5))
    ///     .layer(service_fn(|_: Request<()>| async {
    ///         Ok::<_, Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
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
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Checking {
            subject: Subject,
            cost: u64,
            // Only a check that needs a round trip is boxed.
            pending: Option<BoxFuture<'static, Result<Decision, Error>>>,
            inner: Option<S>,
            req: Option<Request<ReqB>>,
            shared: Arc<Shared>,
            grpc: bool,
        },
        Calling {
            #[pin]
            fut: S::Future,
            headers: Option<AdmittedHeaders>,
        },
        Reply {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn calling(fut: S::Future, headers: Option<AdmittedHeaders>) -> Self {
        ResponseFuture {
            state: State::Calling { fut, headers },
        }
    }

    fn reply(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Reply {
                response: Some(response),
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
            State::Checking { .. } => "checking",
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
                StateProj::Checking {
                    subject,
                    cost,
                    pending,
                    inner,
                    req,
                    shared,
                    grpc,
                } => {
                    let result = match pending {
                        Some(check) => ready!(check.as_mut().poll(cx)),
                        None => match shared.limiter.try_check_now(subject, *cost) {
                            Ok(decided) => decided,
                            Err(round_trip) => {
                                *pending = Some(Box::pin(round_trip.send()));
                                continue;
                            }
                        },
                    };
                    shared.observe(subject, *cost, &result);
                    let shadow = shared.options.shadow;
                    let mut req = req.take().expect("polled after completion");
                    let mut inner = inner.take().expect("polled after completion");
                    let headers = match result {
                        Ok(d) if d.allowed || shadow => {
                            let headers = shared.admitted_headers(&d);
                            req.extensions_mut().insert(d);
                            Some(headers)
                        }
                        Err(_) if shadow => None,
                        outcome => {
                            let (parts, _body) = req.into_parts();
                            let reason = match &outcome {
                                Ok(d) => Reason::Limited(d),
                                Err(Error::CostExceedsCapacity { cost, capacity }) => {
                                    Reason::CostExceedsCapacity {
                                        cost: *cost,
                                        capacity: *capacity,
                                    }
                                }
                                Err(e) if e.is_unavailable() => Reason::Unavailable(e),
                                Err(e) => Reason::Internal(e),
                            };
                            let response = shared.reject(&parts, reason, *grpc);
                            this.state.set(State::Reply { response: None });
                            return Poll::Ready(Ok(response.map(ResponseBody::full)));
                        }
                    };
                    let fut = inner.call(req);
                    this.state.set(State::Calling { fut, headers });
                }
                StateProj::Calling { fut, headers } => {
                    let mut response = ready!(fut.poll(cx))?;
                    if let Some(extra) = headers.take() {
                        extra.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(ResponseBody::new)));
                }
                StateProj::Reply { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
            }
        }
    }
}

/// The rate-limit headers an admitted response gets.
struct AdmittedHeaders {
    policy: Option<HeaderValue>,
    ratelimit: Option<HeaderValue>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (boxed: rarely on).
    legacy: Option<Box<[HeaderValue; 3]>>,
}

impl AdmittedHeaders {
    /// Adds the headers to a response: the structured-field lists
    /// (`RateLimit`, `RateLimit-Policy`) are appended, so stacked limiters
    /// each report their own policy; the legacy ones are set only if absent.
    fn apply(self, target: &mut HeaderMap) {
        if let Some(v) = self.policy {
            target.append(RATELIMIT_POLICY, v);
        }
        if let Some(v) = self.ratelimit {
            target.append(RATELIMIT, v);
        }
        if let Some(legacy) = self.legacy {
            let [limit, remaining, reset] = *legacy;
            for (name, value) in [
                (X_RATELIMIT_LIMIT, limit),
                (X_RATELIMIT_REMAINING, remaining),
                (X_RATELIMIT_RESET, reset),
            ] {
                if !target.contains_key(&name) {
                    target.insert(name, value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::MemoryBackend;

    use super::*;

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
        let parts = Request::new(()).into_parts().0;
        for legacy_headers in [false, true] {
            let shared = Shared::new(
                limiter.clone(),
                Options {
                    headers: true,
                    legacy_headers,
                    shadow: false,
                    protocol: Protocol::Auto,
                    responder: None,
                },
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
                    let res = shared.reject(&parts, Reason::Limited(&decision), grpc);
                    let all: Vec<_> = res.headers().get_all(RETRY_AFTER).iter().collect();
                    assert_eq!(all, [secs], "{wait:?}, grpc {grpc}");
                    let expected = if grpc { 200 } else { 429 };
                    assert_eq!(res.status(), expected);
                }
            }
        }
    }
}
