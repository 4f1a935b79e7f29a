//! The JSON API under `/api`: what the dashboard, scripts and the gateway
//! contract read and do. Every answer that is not a success is a problem
//! document, as tollgate's rejections are.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header::RETRY_AFTER;
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use tollgate_core::admin::{Holder, InFlightKey, LimiterInfo, ThrottledSubject};
use tollgate_core::{Error, Subject};
use tollgate_tower::key::KeyError;
use tollgate_tower::rejection::Rejection;

use super::AdminRouter;

/// The longest block the API accepts: longer is a typo, not a penalty box
/// (an operator who means it blocks again later).
pub(super) const MAX_BLOCK_SECONDS: u64 = tollgate_core::admin::LONGEST_BLOCK.as_secs();

/// The longest an admin request waits for the store: a store that does
/// not answer is a 503 the operator can retry, not a page that hangs.
const STORE_WAIT: Duration = Duration::from_secs(5);

/// `call`'s answer, or [`Error::Timeout`] after [`STORE_WAIT`].
async fn bounded<T>(
    call: impl std::future::Future<Output = tollgate_core::Result<T>>,
) -> tollgate_core::Result<T> {
    tokio::time::timeout(STORE_WAIT, call)
        .await
        .unwrap_or(Err(Error::Timeout(STORE_WAIT)))
}

/// A problem document with `status` and `detail`: the same `about:blank`
/// body every tollgate rejection sends.
pub(super) fn problem(status: StatusCode, detail: impl Into<String>) -> Rejection {
    Rejection::key(KeyError::new(status, detail.into()))
}

/// Input the API cannot act on: a 400 saying what is wrong.
struct BadInput(String);

fn bad_request(detail: impl Into<String>) -> BadInput {
    BadInput(detail.into())
}

impl IntoResponse for BadInput {
    fn into_response(self) -> Response {
        problem(StatusCode::BAD_REQUEST, self.0).into_response()
    }
}

/// The answer for an error of the core: 404 for a limiter nobody
/// registered, 503 (retry in 1 s) when the store failed, 500 otherwise.
fn failure(action: &str, error: Error) -> Response {
    if let Error::NotRegistered(what) = &error {
        return problem(StatusCode::NOT_FOUND, format!("no {what} is registered")).into_response();
    }
    let unavailable = error.is_unavailable()
        || matches!(
            error,
            Error::Backend(_) | Error::Protocol(_) | Error::Timeout(_) | Error::CircuitOpen
        );
    tracing::warn!(target: "tollgate::admin", action, error = %error, "admin request failed");
    if unavailable {
        // An action cut short may have reached the store: retrying it is
        // safe (each one sets a state, none adds).
        let retry = match action {
            "reset" | "block" | "unblock" => "; it may have been applied: retry it",
            _ => "",
        };
        let mut res = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store is unavailable: {error}{retry}"),
        )
        .into_response();
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        res
    } else {
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{action} failed: {error}"),
        )
        .into_response()
    }
}

/// Which subject of which limiter a request names: a raw `key` (resolved
/// as the limiter's routes key requests) or a `subject` id.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Target {
    limiter: Option<String>,
    key: Option<String>,
    subject: Option<String>,
    /// Only for `block`.
    seconds: Option<serde_json::Value>,
}

impl Target {
    /// The limiter's name and the subject, or a 400.
    fn resolve(&self, admin: &AdminRouter) -> Result<(String, Subject), BadInput> {
        let limiter = match self.limiter.as_deref().map(str::trim) {
            Some(l) if !l.is_empty() => l.to_owned(),
            _ => return Err(bad_request("missing limiter: name the limiter")),
        };
        let subject = match (&self.key, &self.subject) {
            (Some(_), Some(_)) => {
                return Err(bad_request("give either key or subject, not both"));
            }
            (Some(key), None) if key.is_empty() => return Err(bad_request("the key is empty")),
            (Some(key), None) => admin
                .resolve(&limiter, key)
                .map_err(|e| bad_request(format!("the key names no subject: {e}")))?,
            (None, Some(id)) => Subject::from_encoded(id)
                .map_err(|e| bad_request(format!("invalid subject id: {e}")))?,
            (None, None) => {
                return Err(bad_request(
                    "missing key or subject: give the raw key or the subject id",
                ));
            }
        };
        Ok((limiter, subject))
    }

    /// The block's duration: whole seconds, 1 to [`MAX_BLOCK_SECONDS`].
    fn duration(&self) -> Result<Duration, BadInput> {
        let seconds = match &self.seconds {
            None => return Err(bad_request("missing seconds: how long to block")),
            Some(v) => v.as_u64().ok_or_else(|| {
                bad_request("seconds must be a whole number of seconds, at least 1")
            })?,
        };
        if seconds == 0 || seconds > MAX_BLOCK_SECONDS {
            return Err(bad_request(format!(
                "seconds must be between 1 and {MAX_BLOCK_SECONDS}, not {seconds}"
            )));
        }
        Ok(Duration::from_secs(seconds))
    }
}

/// A POST body: a JSON object, whatever its content type says (scripts
/// often send none).
fn body(bytes: &Bytes) -> Result<Target, BadInput> {
    serde_json::from_slice(bytes)
        .map_err(|e| bad_request(format!("the body is not valid JSON: {e}")))
}

/// `GET /api/limiters`.
pub(super) async fn limiters(State(admin): State<Arc<AdminRouter>>) -> Response {
    #[derive(Serialize)]
    struct Limiters {
        limiters: Vec<LimiterInfo>,
    }
    match bounded(admin.admin.limiters()).await {
        Ok(limiters) => Json(Limiters { limiters }).into_response(),
        Err(e) => failure("limiters", e),
    }
}

/// `GET /api/subjects?limiter=…&key=…` (or `&subject=…`).
pub(super) async fn subject(
    State(admin): State<Arc<AdminRouter>>,
    query: Result<Query<Target>, QueryRejection>,
) -> Response {
    let Ok(Query(target)) = query else {
        return bad_request("the query string is malformed").into_response();
    };
    let (limiter, subject) = match target.resolve(&admin) {
        Ok(t) => t,
        Err(bad) => return bad.into_response(),
    };
    match bounded(admin.admin.inspect(&limiter, &subject)).await {
        Ok(state) => Json(state).into_response(),
        Err(e) => failure("inspect", e),
    }
}

/// What an action does to its subject.
#[derive(Clone, Copy)]
enum Action {
    Reset,
    Block,
    Unblock,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Reset => "reset",
            Action::Block => "block",
            Action::Unblock => "unblock",
        }
    }
}

/// Runs `action` on the body's subject: 204, or the problem.
async fn act(admin: &AdminRouter, action: Action, bytes: &Bytes) -> Response {
    let target = match body(bytes) {
        Ok(t) => t,
        Err(bad) => return bad.into_response(),
    };
    let (limiter, subject) = match target.resolve(admin) {
        Ok(t) => t,
        Err(bad) => return bad.into_response(),
    };
    let core = &admin.admin;
    // Not bounded as a whole: each of the action's round trips is (5 s),
    // and one whose write fails still tells the other instances, which a
    // bound around the whole would cut short.
    let (done, seconds) = match action {
        Action::Reset => (core.reset(&limiter, &subject).await, None),
        Action::Unblock => (core.unblock(&limiter, &subject).await, None),
        Action::Block => match target.duration() {
            Ok(d) => (core.block(&limiter, &subject, d).await, Some(d.as_secs())),
            Err(bad) => return bad.into_response(),
        },
    };
    match done {
        Ok(()) => {
            tracing::info!(
                target: "tollgate::admin",
                action = action.name(),
                limiter = %limiter,
                subject = subject.as_encoded(),
                seconds,
                "admin action",
            );
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => failure(action.name(), e),
    }
}

/// `POST /api/reset` `{"limiter","key"|"subject"}`.
pub(super) async fn reset(State(admin): State<Arc<AdminRouter>>, bytes: Bytes) -> Response {
    act(&admin, Action::Reset, &bytes).await
}

/// `POST /api/block` `{"limiter","key"|"subject","seconds"}`.
pub(super) async fn block(State(admin): State<Arc<AdminRouter>>, bytes: Bytes) -> Response {
    act(&admin, Action::Block, &bytes).await
}

/// `POST /api/unblock` `{"limiter","key"|"subject"}`.
pub(super) async fn unblock(State(admin): State<Arc<AdminRouter>>, bytes: Bytes) -> Response {
    act(&admin, Action::Unblock, &bytes).await
}

/// `GET /api/throttled`: the most denied subjects, fleet-wide.
pub(super) async fn throttled(State(admin): State<Arc<AdminRouter>>) -> Response {
    #[derive(Serialize)]
    struct Throttled {
        subjects: Vec<ThrottledSubject>,
    }
    match bounded(admin.admin.throttled(admin.throttled_limit)).await {
        Ok(subjects) => Json(Throttled { subjects }).into_response(),
        Err(e) => failure("throttled", e),
    }
}

/// `GET /api/holders`: who holds which lock and which permits, read from
/// the store (every master of a cluster).
pub(super) async fn holders(State(admin): State<Arc<AdminRouter>>) -> Response {
    #[derive(Serialize)]
    struct Holders {
        holders: Vec<Holder>,
    }
    match bounded(admin.admin.holders()).await {
        Ok(holders) => Json(Holders { holders }).into_response(),
        Err(e) => failure("holders", e),
    }
}

/// `GET /api/idempotency`: the idempotency keys in flight (claimed, not
/// completed), read from the store (every master of a cluster).
pub(super) async fn idempotency(State(admin): State<Arc<AdminRouter>>) -> Response {
    #[derive(Serialize)]
    struct InFlight {
        in_flight: Vec<InFlightKey>,
    }
    match bounded(admin.admin.idempotency_in_flight()).await {
        Ok(in_flight) => Json(InFlight { in_flight }).into_response(),
        Err(e) => failure("idempotency", e),
    }
}

/// Any other path under `/api` (after the token was checked).
pub(super) async fn not_found() -> Response {
    problem(StatusCode::NOT_FOUND, "no such admin API route").into_response()
}
