//! Conformance of what a `RateLimitLayer` sends, read the way a client
//! would: every `RateLimit-Policy` and `RateLimit` field through an
//! independent structured-field parser (`sfv`, RFC 9651) and every 429 body
//! through `serde_json`, for every algorithm, admitted and denied, on the
//! memory backend and a real standalone Redis. Time comes from a
//! `ManualClock` starting on an hour boundary, so every `t` is exact.
//!
//! Checked on every answer ([`exchange`]): both fields are sf-lists of
//! Strings with Integer parameters `q`, `w` (window in whole seconds), `r`,
//! `t`; every `RateLimit` member names a policy and `r ≤ q`. On a denial:
//! `Retry-After` is an integer ≥ 1 and ≥ the `t` of every violated policy;
//! the body is draft-10's quota-exceeded problem whose `violated-policies`
//! are policy names with `r` short of the cost. Per algorithm: `t` is the
//! time until more quota is made available — the next unit of a bucket
//! (one emission interval after the burst is spent, not the whole refill),
//! the end of a fixed window, the moment one more unit fits a sliding
//! window — and a request is refused at `t - 1` s and admitted at `t` s.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::routing::get as route_get;
use axum::Router;
use http::StatusCode;
use serde_json::Value;
use tollgate_core::{Algorithm, ManualClock, Quota, RateLimiter};
use tollgate_tower::headers::HeaderFormat;
use tollgate_tower::rejection::QUOTA_EXCEEDED;
use tollgate_tower::RateLimitLayer;

use common::suite::{clock, Backend};
use common::{get, send, unique};

/// One member of a parsed list: its String and its parameters.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    ints: BTreeMap<String, i64>,
    strings: BTreeMap<String, String>,
}

impl Member {
    fn int(&self, key: &str) -> i64 {
        *self
            .ints
            .get(key)
            .unwrap_or_else(|| panic!("no integer {key} in {self:?}"))
    }
}

/// Every line of `name` combined into one list (RFC 9651 §4.2: lines join
/// with commas), parsed by `sfv`; each member must be an Item whose bare
/// item is a String, with Integer or String parameters only.
fn parse_list(headers: &http::HeaderMap, name: &str) -> Vec<Member> {
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("visible ASCII"))
        .collect();
    assert!(!lines.is_empty(), "no {name} field");
    let joined = lines.join(", ");
    let list: sfv::List = sfv::Parser::new(&joined)
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {joined:?} is not an sf-list: {e}"));
    assert!(!list.is_empty(), "{name}: empty list");
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{name}: an inner list in {joined:?}");
            };
            let name_str = item
                .bare_item
                .as_string()
                .unwrap_or_else(|| panic!("{name}: a member of {joined:?} is not a String"))
                .as_str()
                .to_owned();
            let mut m = Member {
                name: name_str,
                ints: BTreeMap::new(),
                strings: BTreeMap::new(),
            };
            for (key, value) in &item.params {
                if let Some(i) = value.as_integer() {
                    m.ints.insert(key.as_str().to_owned(), i64::from(i));
                } else if let Some(s) = value.as_string() {
                    m.strings
                        .insert(key.as_str().to_owned(), s.as_str().to_owned());
                } else {
                    panic!(
                        "{name}: parameter {} of {joined:?} is neither Integer nor String",
                        key.as_str()
                    );
                }
            }
            m
        })
        .collect()
}

/// What one answer said, after [`exchange`] checked it.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    policy: Vec<Member>,
    limits: Vec<Member>,
    retry_after: Option<u64>,
    violated: Vec<String>,
}

impl Seen {
    /// The `RateLimit` member of policy `name`.
    fn limit(&self, name: &str) -> &Member {
        self.limits
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no RateLimit member {name} in {self:?}"))
    }

    /// The only `RateLimit` member's `r` and `t`.
    fn r_t(&self) -> (i64, i64) {
        assert_eq!(self.limits.len(), 1, "{self:?}");
        (self.limits[0].int("r"), self.limits[0].int("t"))
    }
}

/// Sends `GET /` to `app` (each request costs `cost`) and checks what every
/// answer must satisfy (see the module docs).
async fn exchange(app: &Router, cost: i64) -> Seen {
    let reply = send(app, get("/")).await;
    let policy = parse_list(&reply.headers, "ratelimit-policy");
    for p in &policy {
        assert!(p.int("q") >= 0, "{p:?}");
        if p.ints.contains_key("w") {
            assert!(p.int("w") > 0, "{p:?}");
        }
        assert!(
            p.ints.keys().all(|k| k == "q" || k == "w"),
            "unexpected integer parameters in {p:?}"
        );
        assert!(p.strings.keys().all(|k| k == "qu"), "{p:?}");
    }
    let limits = parse_list(&reply.headers, "ratelimit");
    for m in &limits {
        let p = policy
            .iter()
            .find(|p| p.name == m.name)
            .unwrap_or_else(|| panic!("RateLimit member {m:?} names no policy in {policy:?}"));
        let (r, t) = (m.int("r"), m.int("t"));
        assert!(r >= 0 && t >= 0, "{m:?}");
        assert!(r <= p.int("q"), "r > q: {m:?} {p:?}");
        assert_eq!(m.ints.len(), 2, "only r and t: {m:?}");
    }
    let mut seen = Seen {
        status: reply.status,
        policy,
        limits,
        retry_after: None,
        violated: Vec::new(),
    };
    match reply.status {
        StatusCode::OK => {
            assert_eq!(reply.body, "ok");
            assert_eq!(reply.header("retry-after"), None);
        }
        StatusCode::TOO_MANY_REQUESTS => {
            let ra: u64 = reply
                .expect_header("retry-after")
                .parse()
                .expect("Retry-After in integer seconds");
            assert!(ra >= 1);
            assert_eq!(
                reply.expect_header("content-type"),
                "application/problem+json"
            );
            let v: Value = serde_json::from_str(&reply.body)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", reply.body));
            assert_eq!(v["type"], QUOTA_EXCEEDED, "{v}");
            assert_eq!(v["status"], 429, "{v}");
            assert!(v["title"].is_string() && v["detail"].is_string(), "{v}");
            let violated: Vec<String> = v["violated-policies"]
                .as_array()
                .unwrap_or_else(|| panic!("violated-policies is not an array: {v}"))
                .iter()
                .map(|n| n.as_str().expect("policy names are strings").to_owned())
                .collect();
            assert!(!violated.is_empty(), "{v}");
            for name in &violated {
                let m = seen.limit(name);
                assert!(m.int("r") < cost, "violated {name} has room: {m:?}");
                assert!(
                    ra >= m.int("t") as u64,
                    "Retry-After {ra} earlier than t of {m:?}"
                );
            }
            seen.retry_after = Some(ra);
            seen.violated = violated;
        }
        other => panic!("unexpected {other}: {reply:?}"),
    }
    seen
}

/// A router behind `layer`: `GET /` → `ok`.
fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", route_get(|| async { "ok" }))
        .layer(layer)
}

fn limiter(
    backend: Backend,
    algorithm: Algorithm,
    quotas: &[Quota],
    clock: &ManualClock,
) -> RateLimiter {
    let mut b = RateLimiter::builder(backend, algorithm)
        .name(unique("conf"))
        .clock(clock.clone());
    for q in quotas {
        b = b.quota(*q);
    }
    b.build().unwrap()
}

/// The first denial's `t` means what it says: refused `t - 1` s later,
/// admitted `t` s later (one more unit fits by then, not before).
async fn t_is_when_one_more_fits(app: &Router, clock: &ManualClock, denial: &Seen) {
    let (_, t) = denial.r_t();
    assert!(t >= 1, "a denial's t is at least 1: {denial:?}");
    clock.advance(Duration::from_secs(t as u64 - 1));
    let before = exchange(app, 1).await;
    assert_eq!(before.status, StatusCode::TOO_MANY_REQUESTS, "{before:?}");
    assert_eq!(before.r_t().1, 1, "{before:?}");
    clock.advance(Duration::from_secs(1));
    let after = exchange(app, 1).await;
    assert_eq!(after.status, StatusCode::OK, "at t: {after:?}");
}

/// Token bucket and GCRA: a burst of 5, one unit per 2 s. Spending the
/// burst at once leaves r=0 with t=2 (the next unit), not 10 (full).
async fn bucket(backend: Backend, algorithm: Algorithm) {
    let clock = clock();
    let quota = Quota::new(1, Duration::from_secs(2))
        .unwrap()
        .with_burst(5)
        .unwrap();
    let app = app(RateLimitLayer::new(limiter(
        backend,
        algorithm,
        &[quota],
        &clock,
    )));
    for left in (0..5).rev() {
        let s = exchange(&app, 1).await;
        assert_eq!(s.status, StatusCode::OK, "{s:?}");
        assert_eq!(s.policy[0].int("q"), 5);
        assert_eq!(s.policy[0].int("w"), 10);
        assert_eq!(s.r_t(), (left, 2), "{algorithm:?}: {s:?}");
    }
    let denial = exchange(&app, 1).await;
    assert_eq!(denial.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denial.r_t(), (0, 2), "{algorithm:?}: {denial:?}");
    assert_eq!(denial.retry_after, Some(2));
    t_is_when_one_more_fits(&app, &clock, &denial).await;
    // 1.5 s into the next interval: t rounds the 0.5 s left up to 1.
    clock.advance(Duration::from_millis(1500));
    let s = exchange(&app, 1).await;
    assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS, "{s:?}");
    assert_eq!(s.r_t(), (0, 1), "{algorithm:?}: {s:?}");
}

/// A fixed window of 3 per minute: t is the time to the window's end.
async fn fixed_window(backend: Backend) {
    let clock = clock();
    let limiter = limiter(
        backend,
        Algorithm::FixedWindow,
        &[Quota::per_minute(3)],
        &clock,
    );
    let app = app(RateLimitLayer::new(limiter));
    for left in (0..3).rev() {
        let s = exchange(&app, 1).await;
        assert_eq!(s.status, StatusCode::OK);
        assert_eq!(s.policy[0].int("w"), 60);
        // One request every 5 s: the window's end draws nearer.
        assert_eq!(s.r_t(), (left, 60 - 5 * (2 - left)), "{s:?}");
        clock.advance(Duration::from_secs(5));
    }
    // 15 s into the window.
    let denial = exchange(&app, 1).await;
    assert_eq!(denial.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denial.r_t(), (0, 45), "{denial:?}");
    assert_eq!(denial.retry_after, Some(45));
    t_is_when_one_more_fits(&app, &clock, &denial).await;
}

/// A sliding window log of 3 per minute, one request every 10 s: at r=0,
/// t is when the oldest entry leaves the window.
async fn sliding_window_log(backend: Backend) {
    let clock = clock();
    let limiter = limiter(
        backend,
        Algorithm::SlidingWindowLog,
        &[Quota::per_minute(3)],
        &clock,
    );
    let app = app(RateLimitLayer::new(limiter));
    for left in (0..3).rev() {
        let s = exchange(&app, 1).await;
        assert_eq!(s.status, StatusCode::OK);
        assert_eq!(s.r_t().0, left);
        clock.advance(Duration::from_secs(10));
    }
    // At 30 s: the entry of 0 s leaves at 60 s.
    let denial = exchange(&app, 1).await;
    assert_eq!(denial.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denial.r_t(), (0, 30), "{denial:?}");
    assert_eq!(denial.retry_after, Some(30));
    t_is_when_one_more_fits(&app, &clock, &denial).await;
    // At 60 s, r=0 again: the next entry (10 s) leaves at 70 s.
    let s = exchange(&app, 1).await;
    assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS, "{s:?}");
    assert_eq!(s.r_t(), (0, 10), "{s:?}");
}

/// A sliding window counter of 3 per minute: t is when the weighted count
/// lets one more unit in (checked by the clock, whatever the weighting).
async fn sliding_window_counter(backend: Backend) {
    let clock = clock();
    let limiter = limiter(
        backend,
        Algorithm::SlidingWindowCounter,
        &[Quota::per_minute(3)],
        &clock,
    );
    let app = app(RateLimitLayer::new(limiter));
    for left in (0..3).rev() {
        let s = exchange(&app, 1).await;
        assert_eq!(s.status, StatusCode::OK);
        assert_eq!(s.policy[0].int("w"), 60);
        assert_eq!(s.r_t().0, left);
        clock.advance(Duration::from_secs(10));
    }
    let denial = exchange(&app, 1).await;
    assert_eq!(denial.status, StatusCode::TOO_MANY_REQUESTS);
    t_is_when_one_more_fits(&app, &clock, &denial).await;
}

/// Two quotas, one tripped: both are listed, only the tripped one is
/// violated, and Retry-After covers its t.
async fn several_quotas(backend: Backend) {
    let clock = clock();
    let quotas = [Quota::per_second(2), Quota::per_hour(100)];
    let limiter = limiter(backend, Algorithm::FixedWindow, &quotas, &clock);
    let name = limiter.keyspace().policy().to_owned();
    let app = app(RateLimitLayer::new(limiter));
    exchange(&app, 1).await;
    let s = exchange(&app, 1).await;
    let names: Vec<_> = s.policy.iter().map(|p| p.name.clone()).collect();
    assert_eq!(names, [format!("{name}-q0"), format!("{name}-q1")]);
    assert_eq!(s.limit(&names[1]).int("t"), 3600);
    let denial = exchange(&app, 1).await;
    assert_eq!(denial.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denial.violated, [names[0].clone()]);
    assert_eq!(denial.limit(&names[0]).int("t"), 1);
    assert_eq!(denial.retry_after, Some(1));
}

/// A cost-weighted limit with a unit: `qu` is a String; a request that
/// does not fit (r=1 < cost 2) violates the policy.
async fn quota_unit(backend: Backend) {
    let clock = clock();
    let limiter = limiter(
        backend,
        Algorithm::TokenBucket,
        &[Quota::per_minute(5)],
        &clock,
    );
    let app = app(RateLimitLayer::new(limiter)
        .cost(2u64)
        .quota_unit("content-bytes"));
    let s = exchange(&app, 2).await;
    assert_eq!(s.policy[0].strings["qu"], "content-bytes");
    assert_eq!(s.r_t(), (3, 12));
    exchange(&app, 2).await;
    let denial = exchange(&app, 2).await;
    assert_eq!(denial.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denial.r_t().0, 1);
    assert_eq!(denial.violated.len(), 1);
}

/// The legacy format: `X-RateLimit-*` integers only, and the same problem
/// body on a denial.
async fn legacy_format(backend: Backend) {
    let clock = clock();
    let limiter = limiter(
        backend,
        Algorithm::FixedWindow,
        &[Quota::per_minute(1)],
        &clock,
    );
    let name = limiter.keyspace().policy().to_owned();
    let app = app(RateLimitLayer::new(limiter).header_format(HeaderFormat::Legacy));
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit"), None);
    assert_eq!(r.header("ratelimit-policy"), None);
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("x-ratelimit-reset"), Some("60"));
    let r = send(&app, get("/")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("60"));
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["type"], QUOTA_EXCEEDED);
    assert_eq!(v["violated-policies"], serde_json::json!([name]));
}

macro_rules! conformance {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn token_bucket() {
                bucket(common::$backend().await, Algorithm::TokenBucket).await;
            }

            #[tokio::test]
            async fn gcra() {
                bucket(common::$backend().await, Algorithm::Gcra).await;
            }

            #[tokio::test]
            async fn fixed_window() {
                super::fixed_window(common::$backend().await).await;
            }

            #[tokio::test]
            async fn sliding_window_log() {
                super::sliding_window_log(common::$backend().await).await;
            }

            #[tokio::test]
            async fn sliding_window_counter() {
                super::sliding_window_counter(common::$backend().await).await;
            }

            #[tokio::test]
            async fn several_quotas() {
                super::several_quotas(common::$backend().await).await;
            }

            #[tokio::test]
            async fn quota_unit() {
                super::quota_unit(common::$backend().await).await;
            }

            #[tokio::test]
            async fn legacy_format() {
                super::legacy_format(common::$backend().await).await;
            }
        }
    };
}

conformance!(memory);
conformance!(redis);
