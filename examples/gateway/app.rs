//! The gateway's application: API keys and its routes. Kept apart from
//! `main.rs` so the end-to-end tests run exactly this router.
//!
//! The contract (kept exactly; checked from outside):
//!
//! - Every `/v1/*` request needs `X-Api-Key`: 1–64 characters of
//!   `[A-Za-z0-9_-]`. Missing or invalid → 401 with an
//!   `application/problem+json` body. Keys that start with `pro-` are on the
//!   pro plan, all others on the free plan.
//! - `POST /v1/generate?ms=<n>` (n in 0..=10000, default 500; anything else
//!   → 400): at most 2 requests in flight per API key across all instances
//!   on the same backend. It works for n ms and answers 200 with JSON
//!   `{"permit_fence": <integer>}`; a third concurrent request with the same
//!   key gets 429 with `Retry-After` (whole seconds, ≥ 1). Permits have a
//!   5 s TTL, renewed while held: a permit of an instance that was killed is
//!   free again within 7 s. While the backend is unreachable, 503 (the limit
//!   is never lifted).
//! - `POST /v1/orders` with `Idempotency-Key` and a JSON body: works 300 ms
//!   and answers 201 with JSON `{"order":"<unique id>","echo":<the request
//!   body>}`. The same API key + the same Idempotency-Key + the same body →
//!   the stored response (same status, same body) plus
//!   `Idempotent-Replayed: true`; the same key with another body → 422;
//!   repeated while the first is in flight → 409 with `Retry-After`; a
//!   missing or invalid key → 400; the same Idempotency-Key under another
//!   API key creates another order. Holds across instances sharing Redis;
//!   records live 1 hour.
//! - `GET /v1/quota`: limited per API key by plan — free 10 per minute, pro
//!   100 per minute, each a token bucket of capacity equal to its limit,
//!   shared by all instances on the same backend. `RateLimit-Policy` carries
//!   the caller's plan quota (`q=10;w=60` or `q=100;w=60`). Answers 200 with
//!   JSON `{"plan":"free"|"pro","remaining":<integer>}` (what is left after
//!   this request); over the limit, 429 with `Retry-After`. While the
//!   backend is unreachable, 503 (no made-up remaining count).
//! - `POST /v1/login` with JSON `{"password": "..."}`: `open-sesame` → 200
//!   with JSON `{"login":"ok"}`; anything else (another password, a body
//!   that is not such JSON) → 401 as a problem. Failed attempts are counted
//!   per API key, 3 per 60 s (a sliding window log named `login`, shared
//!   by all instances on the same backend): after 3 failures every login —
//!   the right password too — gets 429 with `Retry-After` until the window
//!   lets one more; successful logins consume nothing; concurrent failed
//!   attempts never get past the bound. Every attempt holds one of the 3
//!   while its password is checked (that is what keeps the bound under
//!   concurrency) and a success gives it back before it is answered, so a
//!   login that arrives while others are being checked may see them as
//!   taken. While the backend is unreachable, 503; a body over 2 MB is 413.
//! - `POST /v1/chat` with JSON `{"max_tokens": <integer>}`: a budget of
//!   1000 tokens per minute per API key (a token bucket named `chat` of
//!   capacity 1000, refilled over 60 s, shared by all instances on the same
//!   backend). `max_tokens` (the estimate) is reserved before the handler
//!   runs; the handler answers 200 with JSON `{"tokens": <n>}`, n a random
//!   number in 0..=max_tokens (the tokens it used), and the charge is
//!   settled to n before the answer leaves: `RateLimit-Policy` is
//!   `"chat";q=1000;qu="tokens";w=60` and `RateLimit` shows what is left
//!   after settling (a fresh key, max_tokens 300, tokens 120 → `r=880`).
//!   When max_tokens is more than is left, 429 with `Retry-After` (nothing
//!   is taken). `max_tokens` missing, not a positive integer, or a body
//!   that is not such JSON → 400 as a problem; more than 1000 → 413 as a
//!   problem with `RateLimit-Policy` and no `Retry-After` (it can never
//!   fit the budget); a body over 2 MB is 413. While the backend is
//!   unreachable, 503.
//! - Callers are keyed by a digest of their API key (the subject id the
//!   operator plane shows), labelled with the key's first 4 characters and
//!   `…`.
//! - With `TOLLGATE_ADMIN_TOKEN` set, the operator plane is mounted at
//!   `/admin` (otherwise `/admin` is 404): `/admin/api/*` needs
//!   `Authorization: Bearer <token>` (else 401 problem+json).
//!   `GET /admin/api/limiters` lists `chat`, `login`, `quota-free` and
//!   `quota-pro`;
//!   `GET /admin/api/subjects?limiter=<name>&key=<raw X-Api-Key>` (or
//!   `&subject=<id>`) gives the subject's state, 404 for an unknown limiter;
//!   `POST /admin/api/reset`, `/block` (with `"seconds"`) and `/unblock`
//!   with `{"limiter", "key" | "subject"}` answer 204 and take effect on
//!   every instance within 1 s; `GET /admin/api/throttled` lists the most
//!   denied subjects (within 2 s of a denial on any instance);
//!   `GET /admin/api/holders` lists a running `/v1/generate` as a `permit`
//!   named `generate` held by `<host>:<pid>`; `GET /admin/` is the
//!   dashboard page.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, RawQuery, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::json;
use tollgate::admin::{Admin, AdminRouter};
use tollgate::idempotency::{IdempotencyBackend, IdempotencyStore};
use tollgate::tower::key::{hashed_subject, ExtensionKey};
use tollgate::tower::rate_limit::{ActualCost, CostExtension, PlanExtension};
use tollgate::tower::{ConcurrencyLimitLayer, IdempotencyLayer, RateLimitLayer};
use tollgate::{
    Algorithm, Backend, Decision, FailurePolicy, FencingToken, LockOptions, Plan, PlanTable, Plans,
    Quota, RateBackend, RateLimiter, Semaphore, Subject,
};

/// Requests in flight per API key on `/v1/generate`.
const GENERATE_IN_FLIGHT: u32 = 2;
/// The TTL of a generate permit; renewed every third of it while held.
const PERMIT_TTL: Duration = Duration::from_secs(5);
/// Failed `/v1/login` attempts per API key, per minute.
const LOGIN_FAILURES_PER_MINUTE: u64 = 3;
/// The one password `/v1/login` accepts.
const PASSWORD: &str = "open-sesame";
/// How long an order's idempotency record is kept.
const ORDER_RECORD_TTL: Duration = Duration::from_secs(3600);
/// `/v1/quota` per minute, by plan.
const QUOTA_PLANS: [(&str, u64); 2] = [("free", 10), ("pro", 100)];
/// `/v1/chat` tokens per API key, per minute.
const CHAT_TOKENS_PER_MINUTE: u64 = 1000;

/// A caller's API key, checked by [`require_api_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiKey(String);

impl ApiKey {
    /// 1–64 characters of `[A-Za-z0-9_-]`.
    fn parse(raw: &[u8]) -> Option<ApiKey> {
        let valid = (1..=64).contains(&raw.len())
            && raw
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-');
        valid.then(|| ApiKey(String::from_utf8_lossy(raw).into_owned()))
    }
}

impl ApiKey {
    /// What the gateway keys a caller by: a digest of the key (the
    /// operator plane shows subject ids, and an API key is a secret),
    /// labelled with its first 4 characters and `…` — fewer for a key of 4
    /// or less, so the label never shows a whole key.
    pub(crate) fn subject(&self) -> Subject {
        let n = self.0.chars().count().saturating_sub(1).min(4);
        let shown: String = self.0.chars().take(n).collect();
        hashed_subject(self.0.as_bytes()).with_label(format!("{shown}…"))
    }

    /// The caller's plan: keys that start with `pro-` are on pro.
    fn plan(&self) -> &'static str {
        if self.0.starts_with("pro-") {
            "pro"
        } else {
            "free"
        }
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An RFC 9457 problem response.
fn problem(status: StatusCode, detail: &str) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut res = (status, Json(body)).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// 401 unless `X-Api-Key` is valid; puts the [`ApiKey`] (and so the plan)
/// into the request for the layers and handlers behind it.
async fn require_api_key(mut req: Request, next: Next) -> Response {
    let key = req.headers().get("x-api-key").map(|v| v.as_bytes());
    match key.and_then(ApiKey::parse) {
        Some(key) => {
            req.extensions_mut().insert(key);
            next.run(req).await
        }
        None if key.is_none() => problem(StatusCode::UNAUTHORIZED, "missing X-Api-Key header"),
        None => problem(
            StatusCode::UNAUTHORIZED,
            "X-Api-Key must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'",
        ),
    }
}

/// How long a generate request works, from `?ms=` (checked before a permit
/// is taken).
#[derive(Debug, Clone, Copy)]
struct WorkMs(u64);

/// `ms` in 0..=10000, default 500; anything else is refused with 400.
fn work_ms(query: Option<&str>) -> Result<WorkMs, String> {
    let mut ms = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "ms" {
            continue;
        }
        if ms.is_some() {
            return Err("ms is given more than once".into());
        }
        // Digits only: `parse` would also take a sign (`+5`).
        let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
        match value.parse::<u64>() {
            Ok(n) if digits && n <= 10_000 => ms = Some(n),
            _ => {
                return Err(format!(
                    "ms must be an integer from 0 to 10000, got {value:?}"
                ))
            }
        }
    }
    Ok(WorkMs(ms.unwrap_or(500)))
}

async fn check_work_ms(RawQuery(query): RawQuery, mut req: Request, next: Next) -> Response {
    match work_ms(query.as_deref()) {
        Ok(ms) => {
            req.extensions_mut().insert(ms);
            next.run(req).await
        }
        Err(detail) => problem(StatusCode::BAD_REQUEST, &detail),
    }
}

/// Works `ms` milliseconds under one of the key's permits.
async fn generate(
    Extension(WorkMs(ms)): Extension<WorkMs>,
    Extension(fence): Extension<FencingToken>,
) -> Json<serde_json::Value> {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Json(json!({ "permit_fence": fence.get() }))
}

/// A new order id: unique across instances (time, process, counter).
fn order_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ord_{nanos:x}_{:x}_{n:x}", std::process::id())
}

/// Creates an order: 300 ms of work, then 201 with the order id and the
/// request body echoed.
async fn create_order(Json(body): Json<serde_json::Value>) -> Response {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let order = json!({ "order": order_id(), "echo": body });
    (StatusCode::CREATED, Json(order)).into_response()
}

/// The `/v1/quota` plans on `backend`: a token bucket per plan, its
/// capacity the plan's limit, under a name of its own (`quota-free`,
/// `quota-pro`: its keys and its `RateLimit-Policy`). Refused while the
/// backend is unreachable: the answer reports a real remaining count or
/// none.
fn quota_plans<B: RateBackend + Clone>(backend: &B) -> Plans {
    let mut table = PlanTable::builder().default_plan("free");
    for (plan, per_minute) in QUOTA_PLANS {
        let limiter = RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
            .quota(Quota::per_minute(per_minute))
            .prefix("gateway")
            .name(format!("quota-{plan}"))
            .failure_policy(FailurePolicy::Deny)
            .build()
            .expect("valid quota settings");
        table = table.plan(plan, limiter);
    }
    Plans::new(table.build().expect("a valid plan table"))
}

/// The caller's plan and what it has left, from the layer's plan and
/// decision.
async fn quota(
    Extension(plan): Extension<Plan>,
    Extension(decision): Extension<Decision>,
) -> Json<serde_json::Value> {
    Json(json!({ "plan": plan.name(), "remaining": decision.remaining }))
}

/// 200 for the right password, 401 for anything else.
async fn login(body: axum::body::Bytes) -> Response {
    let password = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| Some(v.get("password")?.as_str()? == PASSWORD));
    if password == Some(true) {
        Json(json!({ "login": "ok" })).into_response()
    } else {
        problem(StatusCode::UNAUTHORIZED, "wrong password")
    }
}

/// The tokens a `/v1/chat` request may use (its estimate, reserved before
/// the handler runs), from its body.
#[derive(Debug, Clone, Copy)]
struct MaxTokens(u64);

/// `{"max_tokens": <n>}` with n a positive integer; anything else is
/// refused with 400. An n over the budget passes: the rate limit answers
/// it (413: it can never fit).
fn max_tokens(body: &[u8]) -> Result<MaxTokens, String> {
    let body: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| r#"the body must be JSON: {"max_tokens": <integer>}"#.to_owned())?;
    match body.get("max_tokens") {
        None => Err("max_tokens is missing".into()),
        Some(n) => match n.as_u64() {
            Some(n) if n > 0 => Ok(MaxTokens(n)),
            _ => Err(format!("max_tokens must be a positive integer, got {n}")),
        },
    }
}

/// Reads a chat body (at most 2 MB, axum's default, as `/v1/login`'s) and
/// puts its [`MaxTokens`] into the request, for the rate limit behind it
/// to reserve: the cost must be known before the handler runs.
async fn check_chat_estimate(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let body = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(body) => body,
        // 413 over 2 MB, 400 for a body that cannot be read.
        Err(rejection) => return problem(rejection.status(), &rejection.body_text()),
    };
    match max_tokens(&body) {
        Ok(estimate) => {
            let mut req = Request::from_parts(parts, Body::from(body));
            req.extensions_mut().insert(estimate);
            next.run(req).await
        }
        Err(detail) => problem(StatusCode::BAD_REQUEST, &detail),
    }
}

/// What a chat request reserves: its `max_tokens`.
fn chat_estimate(req: &Parts) -> u64 {
    // Set by `check_chat_estimate` in front; without it, a cost that never
    // fits (413) rather than a guess.
    req.extensions.get::<MaxTokens>().map_or(u64::MAX, |m| m.0)
}

/// A number in 0..=max, different on every call.
fn tokens_used(max: u64) -> u64 {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let draw = RandomState::new().hash_one(DRAWS.fetch_add(1, Ordering::Relaxed));
    max.checked_add(1).map_or(draw, |n| draw % n)
}

/// "Answers" a chat: uses a random number of tokens up to the estimate,
/// says how many, and tells the rate limit in the response's extensions.
async fn chat(Extension(MaxTokens(max)): Extension<MaxTokens>) -> Response {
    let used = tokens_used(max);
    let mut res = Json(json!({ "tokens": used })).into_response();
    res.extensions_mut().insert(ActualCost(used));
    res
}

/// Chat tokens per API key: a token bucket of 1000 a minute named `chat`.
/// The estimate is reserved before the handler runs (so concurrent chats
/// never overdraw) and settled to the tokens used before the answer
/// leaves. Refused while the backend is unreachable, as the other routes.
fn chat_budget<B: RateBackend>(backend: B) -> RateLimitLayer<ExtensionKey<ApiKey>, ChatEstimate> {
    let tokens = RateLimiter::builder(backend, Algorithm::TokenBucket)
        .quota(Quota::per_minute(CHAT_TOKENS_PER_MINUTE))
        .prefix("gateway")
        .name("chat")
        .failure_policy(FailurePolicy::Deny)
        .build()
        .expect("valid chat settings");
    RateLimitLayer::new(tokens)
        .key(by_api_key())
        .cost(chat_estimate as ChatEstimate)
        .settle_from(CostExtension)
        .quota_unit("tokens")
}

/// The cost of a chat request ([`chat_estimate`]).
type ChatEstimate = fn(&Parts) -> u64;

/// Failed logins per API key: a sliding window log of 3 a minute that
/// counts only the 401s. Every attempt reserves one before the password is
/// looked at (so concurrent failures never get past 3) and a success gives
/// its one back before it is answered. Refused while the backend is
/// unreachable: a throttle on guessing is never lifted.
fn login_failures<B: RateBackend>(backend: B) -> RateLimitLayer<ExtensionKey<ApiKey>> {
    let failures = RateLimiter::builder(backend, Algorithm::SlidingWindowLog)
        .quota(Quota::per_minute(LOGIN_FAILURES_PER_MINUTE))
        .prefix("gateway")
        .name("login")
        .failure_policy(FailurePolicy::Deny)
        .build()
        .expect("valid login settings");
    RateLimitLayer::new(failures)
        .key(by_api_key())
        .count_if(|status: StatusCode| status == StatusCode::UNAUTHORIZED)
}

/// The subject a raw `X-Api-Key` value is keyed by, exactly as the routes
/// key it (`None` for a value the routes refuse).
pub(crate) fn subject_of(raw: &str) -> Option<Subject> {
    ApiKey::parse(raw.as_bytes()).map(|k| k.subject())
}

/// Keys a request by its caller's API key ([`ApiKey::subject`]).
fn by_api_key() -> ExtensionKey<ApiKey> {
    ExtensionKey::with(ApiKey::subject)
}

/// The gateway's router on `backend` (see the module docs for the
/// contract), with the admin router at `/admin` when
/// `TOLLGATE_ADMIN_TOKEN` is set.
pub(crate) fn router<B>(backend: B) -> Router
where
    B: RateBackend + IdempotencyBackend + Clone + Into<Backend>,
{
    let token = std::env::var("TOLLGATE_ADMIN_TOKEN").ok();
    router_with_admin(backend, token.filter(|t| !t.trim().is_empty()))
}

/// The operator plane at `/admin`, behind `token`: every limiter of the
/// gateway resolves a raw `X-Api-Key` as its routes key it.
fn admin_router(backend: Backend, token: String) -> Router {
    let admin = Admin::new(backend).with_prefix("gateway");
    let mut routes = match AdminRouter::new(admin, token) {
        Ok(routes) => routes,
        Err(e) => {
            // Said and ended, not a panic: the operator set it by hand.
            eprintln!("gateway: TOLLGATE_ADMIN_TOKEN is not usable: {e}");
            std::process::exit(2);
        }
    };
    for limiter in ["chat", "login", "quota-free", "quota-pro"] {
        routes = routes.try_resolve_key(limiter, subject_of);
    }
    Router::new().merge(routes.mount_at("/admin"))
}

/// The gateway's router on `backend`, with the admin router at `/admin`
/// when given a token (else `/admin` is 404).
pub(crate) fn router_with_admin<B>(backend: B, admin_token: Option<String>) -> Router
where
    B: RateBackend + IdempotencyBackend + Clone + Into<Backend>,
{
    let admin = admin_token.map(|token| admin_router(backend.clone().into(), token));
    let orders = IdempotencyStore::builder(backend.clone())
        .prefix("gateway")
        .record_ttl(ORDER_RECORD_TTL)
        .build()
        .expect("valid idempotency settings");
    let once_per_key = IdempotencyLayer::new(orders, by_api_key());
    let by_plan = PlanExtension::with(|key: &ApiKey| Some(key.plan()));
    let per_key_by_plan = RateLimitLayer::plans(quota_plans(&backend), by_plan).key(by_api_key());
    let failed_logins = login_failures(backend.clone());
    let chat_tokens = chat_budget(backend.clone());
    // Redis down: 503, so "at most 2 in flight" holds even then.
    let generate_permits = Semaphore::builder(backend, GENERATE_IN_FLIGHT)
        .prefix("gateway")
        // Its holders are listed by the operator plane as `generate`.
        .name("generate")
        .on_failure(FailurePolicy::Deny)
        .build()
        .expect("valid semaphore settings");
    let in_flight = ConcurrencyLimitLayer::new(generate_permits, by_api_key())
        .options(LockOptions::new().ttl(PERMIT_TTL));
    let v1 = Router::new()
        .route(
            "/generate",
            // route_layer: a wrong method is a plain 405, never a 400 or 429.
            post(generate)
                .route_layer(in_flight)
                .route_layer(middleware::from_fn(check_work_ms)),
        )
        .route("/orders", post(create_order).route_layer(once_per_key))
        .route("/quota", get(quota).route_layer(per_key_by_plan))
        .route("/login", post(login).route_layer(failed_logins))
        .route(
            "/chat",
            // The estimate is read from the body before the limit reserves it.
            post(chat)
                .route_layer(chat_tokens)
                .route_layer(middleware::from_fn(check_chat_estimate)),
        );
    let app = Router::new().nest("/v1", v1.layer(middleware::from_fn(require_api_key)));
    match admin {
        Some(admin) => app.merge(admin),
        None => app,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys() {
        assert!(ApiKey::parse(b"a").is_some());
        assert!(ApiKey::parse(&[b'k'; 64]).is_some());
        for bad in [
            &b""[..],
            &[b'k'; 65],
            b"a b",
            b"a:b",
            b"\xc3\xa9",
            b"a\r\nb",
        ] {
            assert!(ApiKey::parse(bad).is_none(), "{bad:?}");
        }
    }

    /// The operator plane's label: the first 4 characters, never the
    /// whole key.
    #[test]
    fn labels_never_show_a_whole_key() {
        let label = |k: &str| {
            let s = ApiKey::parse(k.as_bytes()).unwrap().subject();
            s.label().unwrap().to_owned()
        };
        assert_eq!(label("sk_live_7Hq2mZ"), "sk_l…");
        assert_eq!(label("abcde"), "abcd…");
        assert_eq!(label("demo"), "dem…");
        assert_eq!(label("a"), "…");
    }

    #[test]
    fn plans_of_api_keys() {
        let plan = |k: &str| ApiKey::parse(k.as_bytes()).unwrap().plan();
        assert_eq!(plan("pro-1"), "pro");
        assert_eq!(plan("pro-"), "pro");
        for free in ["pro", "Pro-1", "xpro-1", "pro_1", "demo"] {
            assert_eq!(plan(free), "free", "{free}");
        }
    }

    #[test]
    fn chat_estimates() {
        assert_eq!(max_tokens(br#"{"max_tokens":1}"#).unwrap().0, 1);
        assert_eq!(
            max_tokens(br#"{"max_tokens":1001,"x":[]}"#).unwrap().0,
            1001
        );
        for bad in [
            &b""[..],
            b"300",
            b"{}",
            br#"{"max_tokens":0}"#,
            br#"{"max_tokens":-1}"#,
            br#"{"max_tokens":1.5}"#,
            br#"{"max_tokens":"300"}"#,
            br#"{"max_tokens":1e30}"#,
            br#"{"max_tokens":null}"#,
            br#"{"max_tokens":300"#,
        ] {
            assert!(max_tokens(bad).is_err(), "{bad:?}");
        }
        for max in [0, 1, 7, 1000] {
            assert!((0..50).all(|_| tokens_used(max) <= max));
        }
        // Not a constant: 50 draws of 0..=1000 are not all the same.
        let first = tokens_used(1000);
        assert!((0..50).any(|_| tokens_used(1000) != first));
    }

    #[test]
    fn work_ms_bounds() {
        assert_eq!(work_ms(None).unwrap().0, 500);
        assert_eq!(work_ms(Some("ms=0")).unwrap().0, 0);
        assert_eq!(work_ms(Some("x=1&ms=10000")).unwrap().0, 10_000);
        for bad in [
            "ms=10001",
            "ms=-1",
            "ms=+5",
            "ms=abc",
            "ms=",
            "ms",
            "ms=1&ms=2",
            "ms=1.5",
        ] {
            assert!(work_ms(Some(bad)).is_err(), "{bad}");
        }
    }
}
