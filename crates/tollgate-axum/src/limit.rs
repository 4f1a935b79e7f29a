//! Handler-level rate limits ([`RateLimited`]) and the decision of a layer
//! ([`RateLimitStatus`]).

use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponseParts, ResponseParts};
use http::request::Parts;
use http::HeaderMap;
use tollgate_core::{Charge, Decision, RateLimiter, Subject};

use tollgate_tower::grpc::Protocol;
use tollgate_tower::headers::rate_limit_headers;
use tollgate_tower::key::KeyExtractor;
use tollgate_tower::rate_limit::{count_decision, count_key_error};
use tollgate_tower::rejection::Rejection;

/// A rate limit for one handler: which limiter, which key, what cost.
///
/// Implemented by a marker type per policy, generic over the router's state
/// `S`; the limiter usually lives in the state. The key is a
/// [`KeyExtractor`], the same trait the tower layers key requests with; a
/// request it leaves unkeyed (`Ok(None)`) is answered 500, since a
/// `RateLimited` extractor always needs a key.
///
/// ```
/// use axum::extract::FromRef;
/// use tollgate::RateLimiter;
/// use tollgate::tower::key::HeaderKey;
/// use tollgate::axum::RateLimitPolicy;
///
/// #[derive(Clone, FromRef)]
/// struct AppState {
///     exports: RateLimiter,
/// }
///
/// /// Exports are limited per API key.
/// struct Exports;
///
/// impl RateLimitPolicy<AppState> for Exports {
///     type Key = HeaderKey;
///
///     fn limiter(state: &AppState) -> RateLimiter {
///         state.exports.clone()
///     }
///
///     fn key(_: &AppState) -> HeaderKey {
///         HeaderKey::new("x-api-key")
///     }
/// }
/// ```
pub trait RateLimitPolicy<S>: 'static {
    /// How a request is keyed.
    type Key: KeyExtractor;

    /// The limiter to check (cheap to clone: clones share state).
    fn limiter(state: &S) -> RateLimiter;

    /// The limiter for this request (default: [`limiter`](Self::limiter)).
    /// Override it to choose per request — a plan from a
    /// [`Plans`](tollgate_core::Plans) table, named by the request's head;
    /// each plan's limiter counts on its own keys and the `RateLimit-Policy`
    /// sent is the chosen limiter's:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use axum::{body::Body, routing::post, Router};
    /// use http::{request::Parts, Request, StatusCode};
    /// use tollgate::{Algorithm, MemoryBackend, PlanTable, Plans, Quota, RateLimiter};
    /// use tollgate::tower::key::HeaderKey;
    /// use tollgate::axum::{RateLimitPolicy, RateLimited};
    /// use tower::ServiceExt;
    ///
    /// /// Exports per API key, by plan: `X-Plan` set by the gateway in front.
    /// struct Exports;
    ///
    /// impl RateLimitPolicy<Plans> for Exports {
    ///     type Key = HeaderKey;
    ///
    ///     fn limiter(plans: &Plans) -> RateLimiter {
    ///         plans.select(None).limiter().clone()
    ///     }
    ///
    ///     fn limiter_for(parts: &Parts, plans: &Plans) -> RateLimiter {
    ///         let name = parts.headers.get("x-plan").and_then(|v| v.to_str().ok());
    ///         plans.select(name).limiter().clone()
    ///     }
    ///
    ///     fn key(_: &Plans) -> HeaderKey {
    ///         HeaderKey::new("x-api-key")
    ///     }
    /// }
    ///
    /// async fn export(limited: RateLimited<Exports>) -> (RateLimited<Exports>, &'static str) {
    ///     (limited, "exported")
    /// }
    ///
    /// let backend = MemoryBackend::new();
    /// let limiter = |name: &str, n| {
    ///     RateLimiter::builder(backend.clone(), Algorithm::FixedWindow)
    ///         .quota(Quota::per_hour(n))
    ///         .name(name)
    ///         .build()
    /// };
    /// let plans = Plans::new(
    ///     PlanTable::builder()
    ///         .plan("free", limiter("exports-free", 1)?)
    ///         .plan("pro", limiter("exports-pro", 50)?)
    ///         .default_plan("free")
    ///         .build()?,
    /// );
    /// let app = Router::new().route("/export", post(export)).with_state(plans);
    /// let req = |plan: &str| {
    ///     Request::post("/export").header("x-api-key", "k").header("x-plan", plan).body(Body::empty()).unwrap()
    /// };
    ///
    /// let res = app.clone().oneshot(req("pro")).await.unwrap();
    /// assert_eq!(res.headers()["ratelimit-policy"], r#""exports-pro";q=50;w=3600"#);
    /// let res = app.clone().oneshot(req("free")).await.unwrap();
    /// assert_eq!(res.headers()["ratelimit-policy"], r#""exports-free";q=1;w=3600"#);
    /// let res = app.oneshot(req("unknown")).await.unwrap();
    /// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok(()) }
    /// ```
    fn limiter_for(parts: &Parts, state: &S) -> RateLimiter {
        let _ = parts;
        Self::limiter(state)
    }

    /// The extractor for this router's state.
    fn key(state: &S) -> Self::Key;

    /// What this request costs (default 1).
    fn cost(parts: &Parts, state: &S) -> u64 {
        let _ = (parts, state);
        1
    }
}

/// An admitted request under the policy `P`: an extractor that checks `P`'s
/// limiter before the handler runs, so one handler is limited without a
/// layer.
///
/// A denied request is answered **429** with `Retry-After` (whole seconds,
/// rounded up, at least 1) and the `RateLimit-Policy` / `RateLimit` headers;
/// a request whose cost the limit can never admit, **413** (no
/// `Retry-After`: waiting cannot help); a failing backend follows the limiter's
/// [`FailurePolicy`](tollgate_core::FailurePolicy) (admitted by default;
/// **503** under `Deny`). Return the extractor as part of the response
/// (`(limited, body)`) to send the `RateLimit-Policy` / `RateLimit` headers on
/// success too.
///
/// Several on one handler stack as layers do: a request a later one refuses
/// does not count on the earlier ones (they give their charges back before
/// the 429 goes out), and a response that returns them all carries each
/// one's headers.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use axum::{body::Body, routing::post, Router};
/// use http::{Request, StatusCode};
/// use tollgate::{MemoryBackend, Quota, RateLimiter, Subject};
/// use tollgate::axum::{RateLimitPolicy, RateLimited};
/// use tower::ServiceExt;
///
/// /// One budget for all sign-ups.
/// struct Signups;
///
/// impl RateLimitPolicy<RateLimiter> for Signups {
///     type Key = Subject;
///
///     fn limiter(state: &RateLimiter) -> RateLimiter {
///         state.clone()
///     }
///
///     fn key(_: &RateLimiter) -> Subject {
///         Subject::new("all-signups")
///     }
/// }
///
/// async fn signup(limited: RateLimited<Signups>) -> (RateLimited<Signups>, &'static str) {
///     (limited, "welcome")
/// }
///
/// let limiter = RateLimiter::token_bucket(MemoryBackend::new(), Quota::per_minute(1))?;
/// let app = Router::new().route("/signup", post(signup)).with_state(limiter);
/// let req = || Request::post("/signup").body(Body::empty()).unwrap();
///
/// let res = app.clone().oneshot(req()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::OK);
/// assert!(res.headers().contains_key("ratelimit"));
///
/// let res = app.oneshot(req()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
/// let secs: u64 = res.headers()["retry-after"].to_str().unwrap().parse().unwrap();
/// assert!(secs >= 1 && secs <= 60);
/// # Ok(()) }
/// ```
pub struct RateLimited<P> {
    status: RateLimitStatus,
    headers: HeaderMap,
    _policy: PhantomData<fn() -> P>,
}

impl<P> fmt::Debug for RateLimited<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimited")
            .field("policy", &std::any::type_name::<P>())
            .field("decision", &self.status.decision)
            .finish()
    }
}

impl<P> Clone for RateLimited<P> {
    fn clone(&self) -> Self {
        RateLimited {
            status: self.status.clone(),
            headers: self.headers.clone(),
            _policy: PhantomData,
        }
    }
}

impl<S, P> FromRequestParts<S> for RateLimited<P>
where
    S: Send + Sync,
    P: RateLimitPolicy<S>,
{
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Rejection> {
        let shape = |r: Rejection| r.for_protocol(Protocol::Auto, &parts.headers);
        let limiter = P::limiter_for(parts, state);
        let key = match P::key(state).extract(parts) {
            Ok(Some(key)) => key,
            Ok(None) => {
                return Err(shape(Rejection::misconfigured(
                    "the RateLimitPolicy's key extractor gave no key for this request",
                )))
            }
            Err(e) => {
                count_key_error(&limiter);
                return Err(shape(Rejection::key(e)));
            }
        };
        let cost = P::cost(parts, state);
        let result = limiter.check_n(key.clone(), cost).await;
        // Counted as a layer counts its decisions (feature `metrics`).
        count_decision(&limiter, &result);
        match result {
            Ok(decision) if decision.allowed => {
                if let Some(charge) = decision.charge {
                    let taken = parts.extensions.get_or_insert_default::<Taken>();
                    taken.0.push((limiter.clone(), key, charge));
                }
                Ok(RateLimited {
                    headers: rate_limit_headers(&limiter, &decision),
                    status: RateLimitStatus { decision },
                    _policy: PhantomData,
                })
            }
            Ok(decision) => {
                let refused = Rejection::rate_limited(&limiter, decision);
                give_back(parts).await;
                Err(refused.for_protocol(Protocol::Auto, &parts.headers))
            }
            Err(e) => Err(shape(Rejection::limiter_error(&limiter, e))),
        }
    }
}

/// What the `RateLimited` extractors of a request took so far. A later one
/// that refuses gives it all back before its 429 goes out: the request was
/// not served, so no limit counts it (as a layer gives its charge back when
/// a rate limit inside it refuses). Other refusals count.
#[derive(Clone, Default)]
struct Taken(Vec<(RateLimiter, Subject, Charge)>);

async fn give_back(parts: &mut Parts) {
    let Some(Taken(taken)) = parts.extensions.remove::<Taken>() else {
        return;
    };
    for (limiter, subject, charge) in taken {
        // A give-back that fails leaves the unit taken: under-admission,
        // never over.
        let _ = limiter.refund(subject, &charge).await;
    }
}

/// The decision that admitted the request, with
/// [`RateLimitStatus`]'s accessors (`decision()`, `remaining()`,
/// `reset_after()`).
///
/// ```
/// # use tollgate::axum::RateLimited;
/// fn show<P>(limited: &RateLimited<P>) -> String {
///     format!("{} left of {}", limited.remaining(), limited.decision().limit)
/// }
/// ```
impl<P> std::ops::Deref for RateLimited<P> {
    type Target = RateLimitStatus;

    fn deref(&self) -> &RateLimitStatus {
        &self.status
    }
}

impl<P> IntoResponseParts for RateLimited<P> {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Infallible> {
        // Appended, not replaced: each limiter of the response (two
        // extractors, a layer) reports its own policy and figures.
        let mut name = None;
        for (next, value) in self.headers {
            name = next.or(name);
            if let Some(name) = &name {
                res.headers_mut().append(name.clone(), value);
            }
        }
        Ok(res)
    }
}

/// The decision a `RateLimitLayer` (crate `tollgate-tower`) made for this
/// request, for handlers that show the remaining budget.
///
/// The layer stores its [`Decision`] in the request's extensions; this
/// extractor reads it. Without the layer on the route (or when its key
/// extractor left the request unlimited) there is no decision: `RateLimitStatus`
/// then answers **500** with a message saying to add the layer, and
/// `Option<RateLimitStatus>` gives `None`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use axum::{body::Body, routing::get, Router};
/// use http::{Request, StatusCode};
/// use tollgate::axum::RateLimitStatus;
/// use tower::ServiceExt;
///
/// async fn show(status: RateLimitStatus) -> String {
///     format!("{} requests left", status.decision().remaining)
/// }
/// async fn maybe(status: Option<RateLimitStatus>) -> String {
///     format!("limited: {}", status.is_some())
/// }
///
/// // Without the layer: 500 telling what to add, or `None`.
/// let app = Router::new().route("/", get(show)).route("/maybe", get(maybe));
/// let res = app.clone().oneshot(Request::get("/").body(Body::empty()).unwrap()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
/// let res = app.oneshot(Request::get("/maybe").body(Body::empty()).unwrap()).await.unwrap();
/// assert_eq!(res.status(), StatusCode::OK);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitStatus {
    decision: Decision,
}

const MISSING_LAYER: &str = "no rate-limit decision for this request: add \
`tollgate::tower::RateLimitLayer` to this route (`.route_layer(..)` or `.layer(..)` on the \
router) so that it runs before the handler, or take `Option<RateLimitStatus>` where the \
layer may not apply";

impl RateLimitStatus {
    /// The layer's decision.
    ///
    /// ```
    /// # use tollgate::axum::RateLimitStatus;
    /// fn left(status: &RateLimitStatus) -> u64 {
    ///     status.decision().remaining
    /// }
    /// ```
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Units left under the strictest quota.
    ///
    /// ```
    /// # use tollgate::axum::RateLimitStatus;
    /// fn left(status: &RateLimitStatus) -> u64 {
    ///     status.remaining()
    /// }
    /// ```
    pub fn remaining(&self) -> u64 {
        self.decision.remaining
    }

    /// Time until the strictest quota is back to full.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::axum::RateLimitStatus;
    /// fn reset(status: &RateLimitStatus) -> Duration {
    ///     status.reset_after()
    /// }
    /// ```
    pub fn reset_after(&self) -> Duration {
        self.decision.reset_after
    }

    /// The decision, owned.
    ///
    /// ```
    /// # use tollgate::Decision;
    /// # use tollgate::axum::RateLimitStatus;
    /// fn take(status: RateLimitStatus) -> Decision {
    ///     status.into_decision()
    /// }
    /// ```
    pub fn into_decision(self) -> Decision {
        self.decision
    }

    fn find(parts: &Parts) -> Option<Self> {
        parts
            .extensions
            .get::<Decision>()
            .cloned()
            .map(|decision| RateLimitStatus { decision })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RateLimitStatus {
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Rejection> {
        Self::find(parts).ok_or_else(|| {
            Rejection::misconfigured(MISSING_LAYER).for_protocol(Protocol::Auto, &parts.headers)
        })
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for RateLimitStatus {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Infallible> {
        Ok(Self::find(parts))
    }
}
