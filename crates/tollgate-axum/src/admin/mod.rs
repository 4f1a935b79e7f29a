//! The operator plane over HTTP: an axum [`Router`] with the admin JSON API
//! and a live dashboard page, for an application to mount wherever it
//! likes (feature `admin`).
//!
//! [`AdminRouter`] serves, relative to where it is mounted:
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | the dashboard page (`text/html`; no token needed: it holds no data) |
//! | `GET /dashboard.js`, `GET /dashboard.css` | its script and styles, embedded in the binary |
//! | `GET /api/limiters` | `{"limiters":[{"name","algorithm","quotas":[{"limit","period_seconds",…}]}]}` |
//! | `GET /api/subjects?limiter=L&key=K` (or `&subject=ID`) | `{"limiter","subject","remaining","limit","retry_after_ms","blocked_until_ms",…}` |
//! | `POST /api/reset` `{"limiter","key"}` (or `"subject"`) | 204 |
//! | `POST /api/block` `{"limiter","key"\|"subject","seconds"}` | 204 |
//! | `POST /api/unblock` `{"limiter","key"\|"subject"}` | 204 |
//! | `GET /api/throttled` | `{"subjects":[{"limiter","subject","label","denied","last_denied_ms"}]}`, most denied first |
//! | `GET /api/holders` | `{"holders":[{"kind","name","subject","fence","holder","held_ms","ttl_ms"}]}` |
//! | `GET /api/idempotency` | `{"in_flight":[{"name","key","fence","held_ms","ttl_ms"}]}`: idempotency keys claimed, not completed |
//!
//! Every `/api/*` request needs `Authorization: Bearer <token>` (compared in
//! constant time); without it, or with another token, the answer is 401.
//! Refusals are `application/problem+json` documents, the same format as
//! every tollgate rejection: 400 for bad input, 404 for a limiter nobody
//! registered, 503 when the store fails. A read answers within 5 s or is a
//! 503; `holders` and `idempotency` walk the store's keys under the prefix
//! (`SCAN`, keeping only the keys they read), so on a keyspace too large
//! to walk in that time they are 503s — the CLI's `--timeout` waits longer.
//! An action (reset, block, unblock) bounds each of its round trips
//! instead, so one whose write fails still tells the other instances.
//! Each admin action is logged through
//! `tracing` (target `tollgate::admin`) with the action, the limiter and the
//! subject id.
//!
//! A `key` is the raw value a request carries (an API key as the client
//! sends it); [`AdminRouter::resolve_key`] and
//! [`AdminRouter::resolve_header`] teach the router how a limiter's routes
//! turn it into a subject, so the operator finds the customer by what the
//! customer sees. A `subject` is the id `throttled` and `subjects` print.
//!
//! ```
//! use axum::Router;
//! use tollgate::admin::{Admin, AdminRouter};
//! use tollgate::tower::key::HeaderKey;
//! use tollgate::MemoryBackend;
//!
//! # fn main() -> Result<(), tollgate::Error> {
//! let backend = MemoryBackend::new();
//! let admin = AdminRouter::new(Admin::new(backend), "s3cret-admin-token")?
//!     // The `api` limiter's routes key requests by a hashed `X-Api-Key`.
//!     .resolve_header("api", "x-api-key", HeaderKey::new("x-api-key"));
//! // The page at /admin/ (and /admin), the API at /admin/api/*.
//! let app: Router = Router::new().merge(admin.mount_at("/admin"));
//! # let _ = app;
//! # Ok(()) }
//! ```
//!
//! [`AdminRouter::into_router`] gives the bare router, for
//! `Router::nest("/admin/", …)` (the page at `/admin/`) or
//! `Router::nest("/admin", …)` (the page at `/admin` only: axum routes
//! `/admin/` to neither). The page links its script, styles and API
//! relative to itself, so any mount point (behind a proxy's prefix too)
//! works. Open it as `/admin/#token=<token>` to skip the token prompt —
//! the fragment never reaches the server, and the page drops it from the
//! address bar.

mod api;
mod auth;
mod page;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use axum::routing::{any, get, post};
use axum::Router;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Request};
use tollgate_core::admin::Admin;
use tollgate_core::{Error, Result, Subject};
use tollgate_tower::key::KeyExtractor;

use self::auth::Token;

/// How many throttled subjects `/api/throttled` lists unless told otherwise.
const DEFAULT_THROTTLED_LIMIT: usize = 20;

/// Turns the raw key an operator types into the subject a limiter's routes
/// would have keyed the request under.
type Resolver = Arc<dyn Fn(&str) -> std::result::Result<Subject, String> + Send + Sync>;

/// Builds the admin [`Router`]: the JSON API and the dashboard page over an
/// [`Admin`], behind a bearer token. See the [module docs](self) for the
/// routes and their answers.
#[derive(Clone)]
pub struct AdminRouter {
    admin: Admin,
    token: Token,
    resolvers: HashMap<String, Resolver>,
    throttled_limit: usize,
}

impl fmt::Debug for AdminRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token stays out of logs.
        f.debug_struct("AdminRouter")
            .field("admin", &self.admin)
            .field("resolvers", &self.resolvers.keys().collect::<Vec<_>>())
            .field("throttled_limit", &self.throttled_limit)
            .finish_non_exhaustive()
    }
}

impl AdminRouter {
    /// The admin API and page over `admin`, answering only requests that
    /// carry `Authorization: Bearer <token>`.
    ///
    /// Fails with [`Error::InvalidConfig`] when `token` is empty or blank
    /// (an operator plane without a secret would let anyone unblock anyone),
    /// or when no request could present it: whitespace around it (a secret
    /// file's last newline, say) or a character a header value cannot carry.
    ///
    /// ```
    /// use tollgate::admin::{Admin, AdminRouter};
    /// use tollgate::MemoryBackend;
    ///
    /// assert!(AdminRouter::new(Admin::new(MemoryBackend::new()), "").is_err());
    /// assert!(AdminRouter::new(Admin::new(MemoryBackend::new()), "s3cret\n").is_err());
    /// ```
    pub fn new(admin: Admin, token: impl Into<String>) -> Result<Self> {
        let token = token.into();
        if token.trim().is_empty() {
            return Err(Error::InvalidConfig(
                "the admin router needs a non-empty bearer token".into(),
            ));
        }
        if token.trim() != token || !token.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return Err(Error::InvalidConfig(
                "the admin token has whitespace around it or a character other than \
                 visible ASCII, so no request could present it (a secret file's last \
                 newline?)"
                    .into(),
            ));
        }
        Ok(AdminRouter {
            admin,
            token: Token::new(&token),
            resolvers: HashMap::new(),
            throttled_limit: DEFAULT_THROTTLED_LIMIT,
        })
    }

    /// How the routes of limiter `limiter` key a request: `resolve` maps the
    /// raw key (as in `key=` of the API) to the subject. Without one, a key
    /// is the subject `Subject::new(key)`, as the plain API keys
    /// `limiter.check(key)`.
    ///
    /// ```
    /// use tollgate::admin::{Admin, AdminRouter};
    /// use tollgate::{MemoryBackend, Subject};
    ///
    /// # fn main() -> Result<(), tollgate::Error> {
    /// // The `orders` routes key by tenant and route.
    /// let admin = AdminRouter::new(Admin::new(MemoryBackend::new()), "t0ken")?
    ///     .resolve_key("orders", |tenant| Subject::compound([tenant, "orders"]));
    /// # let _ = admin;
    /// # Ok(()) }
    /// ```
    pub fn resolve_key(
        mut self,
        limiter: impl Into<String>,
        resolve: impl Fn(&str) -> Subject + Send + Sync + 'static,
    ) -> Self {
        self.resolvers
            .insert(limiter.into(), Arc::new(move |raw| Ok(resolve(raw))));
        self
    }

    /// As [`resolve_key`](Self::resolve_key), for keys the routes may
    /// refuse (a malformed API key): `None` answers the lookup or action
    /// 400.
    pub fn try_resolve_key(
        mut self,
        limiter: impl Into<String>,
        resolve: impl Fn(&str) -> Option<Subject> + Send + Sync + 'static,
    ) -> Self {
        let resolve = move |raw: &str| {
            resolve(raw).ok_or_else(|| "the limiter's routes accept no such key".to_owned())
        };
        self.resolvers.insert(limiter.into(), Arc::new(resolve));
        self
    }

    /// The routes of limiter `limiter` key a request with `key` reading
    /// header `header` (a [`HeaderKey`](tollgate_tower::key::HeaderKey),
    /// hashed or plain, or any extractor of that header): the raw key is
    /// put in that header of an empty request and `key` extracts the
    /// subject from it, exactly as on the route. Panics if `header` is not
    /// a valid header name.
    pub fn resolve_header(
        mut self,
        limiter: impl Into<String>,
        header: &str,
        key: impl KeyExtractor,
    ) -> Self {
        let name = HeaderName::from_bytes(header.as_bytes())
            .unwrap_or_else(|_| panic!("tollgate: {header:?} is not a valid header name"));
        let resolve = move |raw: &str| {
            let value = HeaderValue::from_str(raw)
                .map_err(|_| format!("the key is not a valid {name} header value"))?;
            let parts = request_with(&name, value);
            match key.extract(&parts) {
                Ok(Some(subject)) => Ok(subject),
                Ok(None) => Err(format!("the route keys no subject from this {name}")),
                Err(e) => Err(e.message().to_owned()),
            }
        };
        self.resolvers.insert(limiter.into(), Arc::new(resolve));
        self
    }

    /// At most `n` subjects in `/api/throttled` (default 20; at least 1).
    pub fn throttled_limit(mut self, n: usize) -> Self {
        self.throttled_limit = n.max(1);
        self
    }

    /// The bare router, its routes relative to where it is nested:
    /// `Router::nest("/admin/", …)` serves the page at `/admin/` (see
    /// [`mount_at`](Self::mount_at) for `/admin` too). It carries its own
    /// state, so it nests into a router of any state.
    pub fn into_router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let state = Arc::new(self);
        let api = Router::new()
            .route("/api/limiters", get(api::limiters))
            .route("/api/subjects", get(api::subject))
            .route("/api/reset", post(api::reset))
            .route("/api/block", post(api::block))
            .route("/api/unblock", post(api::unblock))
            .route("/api/throttled", get(api::throttled))
            .route("/api/holders", get(api::holders))
            .route("/api/idempotency", get(api::idempotency))
            // Unknown API paths ask for the token too: they reveal nothing
            // without it.
            .route("/api/{*rest}", any(api::not_found))
            .route_layer(axum::middleware::from_fn_with_state(
                Arc::clone(&state),
                auth::require_token,
            ));
        Router::new()
            .route("/", get(page::index))
            .route("/dashboard.js", get(page::script))
            .route("/dashboard.css", get(page::styles))
            .merge(api)
            .with_state(state)
    }

    /// The router with the admin plane at `path` (`"/admin"`): the page at
    /// `/admin/` (and `/admin` redirecting there), the API at
    /// `/admin/api/*`. Merge it into the application's router.
    ///
    /// axum's `Router::nest("/admin", …)` does not route `/admin/` (with
    /// the slash) into the nested router; this does.
    ///
    /// ```
    /// use axum::Router;
    /// use tollgate::admin::{Admin, AdminRouter};
    /// use tollgate::MemoryBackend;
    ///
    /// # fn main() -> Result<(), tollgate::Error> {
    /// let admin = AdminRouter::new(Admin::new(MemoryBackend::new()), "s3cret-admin-token")?;
    /// let app: Router = Router::new().merge(admin.mount_at("/admin"));
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    pub fn mount_at<S>(self, path: &str) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let path = path.trim_end_matches('/');
        if path.is_empty() {
            return self.into_router();
        }
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        Router::new()
            .route(&path, get(page::to_page))
            .nest(&format!("{path}/"), self.into_router())
    }

    /// The subject a request to `limiter`'s routes with raw key `raw` is
    /// keyed under.
    fn resolve(&self, limiter: &str, raw: &str) -> std::result::Result<Subject, String> {
        match self.resolvers.get(limiter) {
            Some(resolve) => resolve(raw),
            None => Ok(Subject::new(raw)),
        }
    }
}

/// The head of an empty request carrying `name: value`.
fn request_with(name: &HeaderName, value: HeaderValue) -> Parts {
    let mut req = Request::new(());
    req.headers_mut().insert(name.clone(), value);
    req.into_parts().0
}
