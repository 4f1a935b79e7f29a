//! What a [`RateLimitLayer`] charges once it has admitted a request:
//! counting by outcome, settling to the actual cost, and waiting for a
//! slot instead of a refusal.

use std::sync::Arc;
use std::time::Duration;

use super::actual::ResponseCost;
use super::outcome::CountResponse;
use super::RateLimitLayer;
#[cfg(doc)]
use tollgate_core::RateLimiter;

impl<K, C> RateLimitLayer<K, C> {
    /// Counts only the responses `counts` accepts (a closure
    /// `Fn(StatusCode) -> bool` or a [`CountResponse`]); the others get
    /// their charge back — for login throttling, count failures only.
    ///
    /// The check still reserves the cost before the handler runs (and
    /// refuses when the limit is used up), so concurrent requests never get
    /// past the bound; a response that does not count is refunded
    /// ([`RateLimiter::refund`]: at most once, bounded by the limiter's
    /// timeout) before it is returned, so a client's next request already
    /// sees the quota back, and its `RateLimit` header says what is left
    /// after the refund. A refund that fails (or is skipped while the
    /// limiter's circuit breaker is open) leaves the charge in place and
    /// the header of the check; so does one a token bucket or GCRA refuses
    /// because later reservations wait behind the charge, or the subject
    /// is in debt (see [`RateLimiter::settle`]): an under-admission, never
    /// an over-admission. A
    /// handler may refund through the [`Decision`](tollgate_core::Decision)'s
    /// charge itself; refunds are at most once per charge, so the layer's
    /// then gives nothing more.
    /// See [`count_unfinished`](Self::count_unfinished) for requests that
    /// end without a response.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use axum::{body::Body, routing::post, Router};
    /// use http::{Request, StatusCode};
    /// use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter};
    /// use tollgate::tower::key::HeaderKey;
    /// use tollgate::tower::RateLimitLayer;
    /// use tower::ServiceExt;
    ///
    /// // 3 failed logins a minute per user; a right password costs nothing.
    /// let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::SlidingWindowLog)
    ///     .quota(Quota::per_minute(3))
    ///     .name("login")
    ///     .build()?;
    /// let failures = RateLimitLayer::new(limiter)
    ///     .key(HeaderKey::new("x-user"))
    ///     .count_if(|status: StatusCode| status == StatusCode::UNAUTHORIZED);
    /// let login = |body: String| async move {
    ///     if body == "open-sesame" { StatusCode::OK } else { StatusCode::UNAUTHORIZED }
    /// };
    /// let app = Router::new().route("/login", post(login)).layer(failures);
    /// let attempt = |password: &str| {
    ///     let req = Request::post("/login").header("x-user", "alice");
    ///     app.clone().oneshot(req.body(Body::from(password.to_owned())).unwrap())
    /// };
    ///
    /// for _ in 0..5 {
    ///     assert_eq!(attempt("open-sesame").await?.status(), StatusCode::OK);
    /// }
    /// for _ in 0..3 {
    ///     assert_eq!(attempt("guess").await?.status(), StatusCode::UNAUTHORIZED);
    /// }
    /// // Three failures: every attempt is refused, the right password too.
    /// assert_eq!(attempt("open-sesame").await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok(()) }
    /// ```
    pub fn count_if(mut self, counts: impl CountResponse) -> Self {
        self.options.counting.counts = Some(Arc::new(counts));
        self
    }

    /// Settles each admitted charge to the actual cost its response says
    /// ([`ResponseCost`]: a [`CostHeader`](super::CostHeader), the
    /// [`ActualCost`](super::ActualCost) a handler put in the response's
    /// extensions, or a closure) before the response leaves — for limits
    /// whose cost is known only afterwards, such as an LLM call's tokens.
    /// The [cost](Self::cost) from the request is the estimate the check
    /// reserves, so concurrent requests never overdraw; the response then
    /// corrects it ([`RateLimiter::settle`]): under the estimate the
    /// difference is given back, over it the subject goes into debt (up to
    /// the limiter's [`max_debt`](tollgate_core::RateLimiterBuilder::max_debt))
    /// and waits it out. The response's `RateLimit` (and legacy
    /// `X-RateLimit-*`) header says what is left after settling;
    /// `RateLimit-Policy` is unchanged.
    ///
    /// A response that says nothing keeps the estimate, as does one whose
    /// actual cost is the estimate (no round trip then). With
    /// [`count_if`](Self::count_if), a response that does not count is
    /// given back whole whatever it says; a request that ends without a
    /// response is counted at its estimate or given back as
    /// [`count_unfinished`](Self::count_unfinished) says. A settlement
    /// that fails (the backend is down, the circuit is open, the limiter's
    /// timeout) keeps the charge as reserved and the response with the
    /// check's headers, and is logged at WARN: it never fails the request.
    /// Settling is at most once per charge: a handler that settled or
    /// refunded the [`Decision`](tollgate_core::Decision)'s charge itself
    /// leaves nothing for the layer to change.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use axum::{body::Body, response::IntoResponse, routing::post, Router};
    /// use http::Request;
    /// use tollgate::{Algorithm, ManualClock, MemoryBackend, Quota, RateLimiter};
    /// use tollgate::tower::rate_limit::{ActualCost, CostExtension};
    /// use tollgate::tower::RateLimitLayer;
    /// use tower::ServiceExt;
    ///
    /// let tokens = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
    ///     .quota(Quota::per_minute(100))
    ///     .name("tokens")
    ///     .clock(ManualClock::new(1_800_000_000_000_000))
    ///     .build()?;
    /// // Each request reserves 40; the handler says what it used.
    /// let app = Router::new()
    ///     .route("/", post(|| async {
    ///         let mut res = "done".into_response();
    ///         res.extensions_mut().insert(ActualCost(5));
    ///         res
    ///     }))
    ///     .layer(RateLimitLayer::new(tokens).cost(40).settle_from(CostExtension));
    /// let res = app.clone().oneshot(Request::post("/").body(Body::empty())?).await?;
    /// assert!(res.headers()["ratelimit"].to_str()?.starts_with(r#""tokens";r=95;"#));
    /// let res = app.oneshot(Request::post("/").body(Body::empty())?).await?;
    /// assert!(res.headers()["ratelimit"].to_str()?.starts_with(r#""tokens";r=90;"#));
    /// # Ok(()) }
    /// ```
    pub fn settle_from(mut self, actual: impl ResponseCost) -> Self {
        self.options.counting.settle_from(actual);
        self
    }

    /// Lets a request wait up to `max_wait` for its slot instead of being
    /// refused: on a token bucket or GCRA, when the limit would admit it
    /// within `max_wait`, the slot is reserved on the store at once
    /// ([`RateLimiter::acquire`]; waiters across all instances are served
    /// in reservation order and never over-admitted) and the request goes
    /// to the inner service when the slot comes. The window algorithms
    /// reserve nothing: a request waits out the announced retry-after when
    /// it fits and is checked again, unordered — at a contended window
    /// boundary another caller may take the unit first, and the request is
    /// then refused if its wait is spent. When the wait is longer, it is
    /// refused as without waiting: 429 with the honest `Retry-After`. A
    /// request dropped while it waits (the client went away, a timeout
    /// layer gave up) gives its slot back while it is the last one
    /// reserved; with others reserved behind it, the slot passes unused
    /// (an under-admission, never two requests on one slot).
    /// `Duration::ZERO` (the default) never waits; shadow mode, which never
    /// refuses, never waits either.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tollgate::{MemoryBackend, Quota};
    /// use tollgate::tower::RateLimitLayer;
    /// use tower::ServiceExt;
    ///
    /// // 20 a second, one at a time: a slot every 50 ms, waited for up to 60 ms.
    /// let layer = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(20).with_burst(1)?)
    ///     .wait_up_to(Duration::from_millis(60));
    /// let app = Router::new().route("/", get(|| async { "ok" })).layer(layer);
    /// let req = || Request::get("/").body(Body::empty()).unwrap();
    /// // The second waits for its slot, 50 ms on; the third's, 100 ms on, is too far.
    /// let (first, second, third) = tokio::join!(
    ///     app.clone().oneshot(req()),
    ///     app.clone().oneshot(req()),
    ///     app.clone().oneshot(req()),
    /// );
    /// assert_eq!(first?.status(), StatusCode::OK);
    /// assert_eq!(second?.status(), StatusCode::OK);
    /// assert_eq!(third?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok(()) }
    /// ```
    pub fn wait_up_to(mut self, max_wait: Duration) -> Self {
        self.options.wait = (!max_wait.is_zero()).then_some(max_wait);
        self
    }

    /// Whether an admitted request that ends without a response counts:
    /// its response future dropped (the client went away, a timeout layer
    /// gave up) or the inner service returned an error. Default: it counts,
    /// so that hanging up cannot dodge a limit on failures; `false` gives
    /// its charge back (before the error is returned; in a task of its own
    /// on the current Tokio runtime when the future was dropped — lost if
    /// the runtime is shutting down). A future dropped while the check
    /// itself is in flight has no receipt yet: what that check took stays
    /// (one dropped while [waiting](Self::wait_up_to) for its slot gives
    /// the slot back).
    /// Applies with or without [`count_if`](Self::count_if).
    pub fn count_unfinished(mut self, on: bool) -> Self {
        self.options.counting.unfinished = on;
        self
    }
}
