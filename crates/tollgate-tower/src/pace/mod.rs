//! [`PaceLayer`]: paces outbound calls — to an LLM provider, a third-party
//! API — against a budget the whole fleet shares, and stops the fleet when
//! the upstream says stop.
//!
//! The layer wraps a client: any `Service<http::Request<B>, Response =
//! http::Response<R>>` (a hyper-util client, reqwest through tower, a
//! router in tests). For each call, in the response future (never in
//! `poll_ready`, which only asks the client):
//!
//! 1. the [key](crate::key) names the budget the call draws on (default:
//!    one for every call) and its [cost](crate::rate_limit::RequestCost)
//!    says how much (default 1);
//! 2. the call waits for a slot of the [`RateLimiter`] — a budget on Redis
//!    shared by every instance whose limiter has the same name — for up to
//!    [`max_wait`](PaceLayer::max_wait) (default 30 s); when there is none
//!    that soon, the call ends with [`Throttled`] and is never made;
//! 3. the client is called; its response is read for what it says about
//!    waiting (below) and, with [`settle_from`](PaceLayer::settle_from),
//!    for its real cost, and then handed back as it is — a 429 stays a 429.
//!
//! Errors are a [`BoxError`](crate::BoxError): the client's own error,
//! boxed and otherwise unchanged; [`Throttled`]; [`Unavailable`] when the
//! budget's store fails under [`FailurePolicy::Deny`](tollgate_core::FailurePolicy)
//! (under `Allow`, the default, such a call goes ahead); or the
//! [`KeyError`](crate::key::KeyError) of a call that could not be keyed.
//! A call that fails or is dropped after taking its slot keeps its charge:
//! it may have reached the upstream.
//!
//! # Learning from the upstream
//!
//! A response that asks callers to wait blocks the call's budget on every
//! instance ([`RateLimiter::block`], the operator plane's block) before it
//! is handed back, so no instance keeps calling a provider that said stop:
//!
//! - a **429 or 503 with `Retry-After`**, in seconds or as an HTTP-date
//!   (RFC 9110);
//! - a **`RateLimit`** field (draft-ietf-httpapi-ratelimit-headers) with an
//!   item that has nothing left, `"name";r=0;t=30`: blocked for `t`, the
//!   longest of such items;
//! - **`X-RateLimit-Remaining: 0`** with `X-RateLimit-Reset` (seconds from
//!   now, or a Unix time).
//!
//! The longest of these counts, cut to [`max_block`](PaceLayer::max_block)
//! (default 10 min). Calls waiting for a slot wait the block out when it
//! ends within their `max_wait`; others end with [`Throttled`]. A block
//! that cannot be set (within 1 s) is logged at WARN and never fails the
//! call.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::tower::BoxError> {
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use http::{Request, Response, StatusCode};
//! use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter};
//! use tollgate::tower::pace::Throttled;
//! use tollgate::tower::PaceLayer;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! // The provider's budget, shared by every instance on the same store.
//! let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
//!     .quota(Quota::per_second(10))
//!     .name("provider")
//!     .build()?;
//! // Stands in for the HTTP client: the provider says stop for 2 s once.
//! let calls = Arc::new(AtomicUsize::new(0));
//! let client = service_fn({
//!     let calls = Arc::clone(&calls);
//!     move |_req: Request<String>| {
//!         let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
//!         async move {
//!             let res = match first {
//!                 true => Response::builder().status(429).header("retry-after", "2"),
//!                 false => Response::builder(),
//!             };
//!             Ok::<_, Infallible>(res.body(String::new()).unwrap())
//!         }
//!     }
//! });
//! let client = PaceLayer::new(limiter).max_wait(Duration::from_millis(500)).layer(client);
//!
//! let res = client.clone().oneshot(Request::new(String::new())).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! // The budget is blocked for 2 s: more than this call may wait.
//! let err = client.clone().oneshot(Request::new(String::new())).await.unwrap_err();
//! let throttled = err.downcast_ref::<Throttled>().expect("refused by the budget");
//! assert!(throttled.retry_after().unwrap() > Duration::from_secs(1));
//! assert_eq!(calls.load(Ordering::SeqCst), 1, "no second call was made");
//! # Ok(()) }
//! ```
//!
//! # Settling to the real cost
//!
//! An LLM call's tokens are known only from its response: charge an
//! estimate with [`cost`](PaceLayer::cost) and settle it with
//! [`settle_from`](PaceLayer::settle_from) (a header such as
//! `x-tokens-used`, or a closure); the budget then holds what was really
//! used. A settle that fails is logged and never fails the call.
//!
//! # Waiting, and round trips
//!
//! A call takes its slot with one [`RateLimiter::acquire`] (one round trip
//! on Redis): a slot now, and the call goes; else the earliest slot within
//! `max_wait`, reserved on the store (calls across the fleet are served in
//! the order they reserved) and waited for locally. Since the upstream may
//! have asked the fleet to stop while it waited, `acquire` reads the block
//! once more when a reserved slot comes (one round trip, only after a
//! wait); blocked, it gives the slot back (one) and waits the block out.
//! A response asking to wait costs one more round trip (the block, with its
//! announcement to every instance), a settle one more.
//!
//! A call already sent when the upstream says stop cannot be held back:
//! pace the budget so that the upstream's limit is rarely reached, and the
//! block stops the rest.
//!
//! [`RateLimiter`]: tollgate_core::RateLimiter
//! [`RateLimiter::block`]: tollgate_core::RateLimiter::block
//! [`RateLimiter::acquire`]: tollgate_core::RateLimiter::acquire

mod error;
mod future;
mod layer;
mod learn;
mod service;

pub use self::error::{Throttled, Unavailable};
pub use self::future::ResponseFuture;
pub use self::layer::PaceLayer;
pub use self::service::Pace;
