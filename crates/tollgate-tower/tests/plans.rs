//! `RateLimitLayer::plans`: the limiter chosen per request from its head —
//! an unknown or missing plan gets the default plan, each plan counts on its
//! own keys and sends its own `RateLimit-Policy`, and a replaced table
//! applies from the next decision on. Every scenario runs on memory, a
//! standalone Redis and a 3-master cluster; time comes from a `ManualClock`.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get as route_get;
use axum::{Extension, Router};
use http::request::Parts;
use http::{Request, StatusCode};
use tollgate_core::{Algorithm, Decision, ManualClock, Plan, PlanTable, Plans, Quota, RateLimiter};
use tollgate_tower::key::{HeaderKey, KeyError};
use tollgate_tower::rate_limit::{PlanExtension, PlanHeader};
use tollgate_tower::RateLimitLayer;

use common::suite::{clock, Backend};
use common::{send, unique, Reply};

/// The plan and the decision the handler saw.
async fn echo(plan: Option<Extension<Plan>>, decision: Option<Extension<Decision>>) -> String {
    match (plan, decision) {
        (Some(Extension(p)), Some(Extension(d))) => format!("{} {}", p.name(), d.remaining),
        (None, None) => "unlimited".to_owned(),
        _ => "a plan without a decision, or the reverse".to_owned(),
    }
}

/// Fixed windows (a minute) named `<base>-<plan>`: free `free_n`, pro
/// `pro_n`, the default free.
fn table(backend: &Backend, base: &str, free_n: u64, pro_n: u64, clock: &ManualClock) -> PlanTable {
    let limiter = |plan: &str, n| {
        RateLimiter::builder(backend.clone(), Algorithm::FixedWindow)
            .quota(Quota::per_minute(n))
            .name(format!("{base}-{plan}"))
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    PlanTable::builder()
        .plan("free", limiter("free", free_n))
        .plan("pro", limiter("pro", pro_n))
        .default_plan("free")
        .build()
        .unwrap()
}

/// An app whose plan is the `X-Plan` header, keyed by `X-Api-Key`.
fn app(plans: &Plans) -> Router {
    Router::new().route("/", route_get(echo)).layer(
        RateLimitLayer::plans(plans.clone(), PlanHeader::new("x-plan"))
            .key(HeaderKey::new("x-api-key").plain()),
    )
}

/// `GET /` as API key `key` on plan `plan` (no `X-Plan` when `None`).
fn req(key: &str, plan: Option<&str>) -> Request<Body> {
    let mut b = Request::get("/").header("x-api-key", key);
    if let Some(plan) = plan {
        b = b.header("x-plan", plan);
    }
    b.body(Body::empty()).unwrap()
}

/// 200 on `plan` with `remaining` left, with the plan's policy and figures.
fn assert_admitted(r: &Reply, base: &str, plan: &str, limit: u64, remaining: u64) {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body, format!("{plan} {remaining}"), "{r:?}");
    let policy = format!(r#""{base}-{plan}";q={limit};w=60"#);
    assert_eq!(r.header("ratelimit-policy"), Some(policy.as_str()), "{r:?}");
    let figures = format!(r#""{base}-{plan}";r={remaining};"#);
    assert!(
        r.expect_header("ratelimit").starts_with(&figures),
        "{figures} in {r:?}"
    );
}

/// 429 on `plan`, with the plan's own policy and a Retry-After.
fn assert_refused(r: &Reply, base: &str, plan: &str, limit: u64) {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    let policy = format!(r#""{base}-{plan}";q={limit};w=60"#);
    assert_eq!(r.header("ratelimit-policy"), Some(policy.as_str()), "{r:?}");
    assert!(r.retry_after() >= 1, "{r:?}");
}

/// Unknown, empty and missing plan names get the default plan, with its
/// policy and its counters; a known name gets its own.
pub async fn unknown_or_missing_plan_is_the_default(backend: Backend) {
    let clock = clock();
    let base = unique("dflt");
    let plans = Plans::new(table(&backend, &base, 3, 10, &clock));
    let app = app(&plans);
    let r = send(&app, req("k", None)).await;
    assert_admitted(&r, &base, "free", 3, 2);
    assert_admitted(
        &send(&app, req("k", Some("gold"))).await,
        &base,
        "free",
        3,
        1,
    );
    assert_admitted(&send(&app, req("k", Some(""))).await, &base, "free", 3, 0);
    assert_refused(&send(&app, req("k", Some("Pro"))).await, &base, "free", 3);
    assert_admitted(
        &send(&app, req("k", Some("pro"))).await,
        &base,
        "pro",
        10,
        9,
    );
}

/// One API key has a budget per plan: free running out leaves pro alone and
/// the reverse; other keys are apart within a plan.
pub async fn plans_count_apart(backend: Backend) {
    let clock = clock();
    let base = unique("apart");
    let plans = Plans::new(table(&backend, &base, 2, 4, &clock));
    let app = app(&plans);
    for left in [1, 0] {
        assert_admitted(
            &send(&app, req("k", Some("free"))).await,
            &base,
            "free",
            2,
            left,
        );
    }
    assert_refused(&send(&app, req("k", Some("free"))).await, &base, "free", 2);
    for left in [3, 2, 1, 0] {
        assert_admitted(
            &send(&app, req("k", Some("pro"))).await,
            &base,
            "pro",
            4,
            left,
        );
    }
    assert_refused(&send(&app, req("k", Some("pro"))).await, &base, "pro", 4);
    assert_refused(&send(&app, req("k", None)).await, &base, "free", 2);
    assert_admitted(&send(&app, req("other", None)).await, &base, "free", 2, 1);
    // The next window: both plans full again.
    clock.advance(Duration::from_secs(60));
    assert_admitted(
        &send(&app, req("k", Some("free"))).await,
        &base,
        "free",
        2,
        1,
    );
    assert_admitted(&send(&app, req("k", Some("pro"))).await, &base, "pro", 4, 3);
}

/// A replaced table applies from the next request: new quotas, new
/// policies, the same keys when the limiter's name stays (the count carries
/// over), fresh keys under a new name; a plan added at runtime is selected.
pub async fn a_replaced_table_applies_to_the_next_request(backend: Backend) {
    let clock = clock();
    let base = unique("swap");
    let plans = Plans::new(table(&backend, &base, 2, 4, &clock));
    let app = app(&plans);
    assert_admitted(&send(&app, req("k", None)).await, &base, "free", 2, 1);
    assert_admitted(&send(&app, req("k", None)).await, &base, "free", 2, 0);
    assert_refused(&send(&app, req("k", None)).await, &base, "free", 2);

    // Free grows to 5 under the same names: 2 of them used this window.
    plans.replace(table(&backend, &base, 5, 4, &clock)).unwrap();
    assert_admitted(&send(&app, req("k", None)).await, &base, "free", 5, 2);
    // Pro shrinks below what was used: refused until the window ends.
    for left in [3, 2, 1] {
        assert_admitted(
            &send(&app, req("k", Some("pro"))).await,
            &base,
            "pro",
            4,
            left,
        );
    }
    plans.replace(table(&backend, &base, 5, 2, &clock)).unwrap();
    assert_refused(&send(&app, req("k", Some("pro"))).await, &base, "pro", 2);

    // New names: fresh keys, and a plan added at runtime.
    let renamed = unique("swap2");
    let limiter = RateLimiter::builder(backend.clone(), Algorithm::FixedWindow)
        .quota(Quota::per_minute(7))
        .name(format!("{renamed}-team"))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut with_team = PlanTable::builder();
    for plan in table(&backend, &renamed, 5, 2, &clock).plans() {
        with_team = with_team.plan(plan.name(), plan.limiter().clone());
    }
    let with_team = with_team
        .plan("team", limiter)
        .default_plan("free")
        .build()
        .unwrap();
    plans.replace(with_team).unwrap();
    assert_admitted(&send(&app, req("k", None)).await, &renamed, "free", 5, 4);
    assert_admitted(
        &send(&app, req("k", Some("pro"))).await,
        &renamed,
        "pro",
        2,
        1,
    );
    assert_admitted(
        &send(&app, req("k", Some("team"))).await,
        &renamed,
        "team",
        7,
        6,
    );
}

/// The plan comes from an extension an earlier layer set (or a closure);
/// the layer's header settings apply to every plan; an unkeyed request
/// passes unlimited with no plan; a key error is answered before any plan
/// is checked.
pub async fn selectors_and_settings(backend: Backend) {
    #[derive(Clone)]
    struct Tier(&'static str);

    let clock = clock();
    let base = unique("sel");
    let plans = Plans::new(table(&backend, &base, 1, 2, &clock));
    let by_tier = PlanExtension::with(|t: &Tier| Some(t.0));
    let key = |req: &Parts| -> Result<Option<tollgate_core::Subject>, KeyError> {
        match req.headers.get("x-api-key") {
            Some(k) if k == "bad" => Err(KeyError::bad_request("bad key")),
            Some(k) => Ok(Some(tollgate_core::Subject::new(k.as_bytes()))),
            None => Ok(None),
        }
    };
    let app = Router::new().route("/", route_get(echo)).layer(
        RateLimitLayer::plans(plans.clone(), by_tier)
            .key(key)
            .legacy_headers(true),
    );
    let with_tier = |key: &str, tier: Option<&'static str>| {
        let mut r = req(key, None);
        if let Some(t) = tier {
            r.extensions_mut().insert(Tier(t));
        }
        r
    };
    let r = send(&app, with_tier("k", Some("pro"))).await;
    assert_admitted(&r, &base, "pro", 2, 1);
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    let r = send(&app, with_tier("k", None)).await;
    assert_admitted(&r, &base, "free", 1, 0);
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert_refused(
        &send(&app, with_tier("k", Some("x"))).await,
        &base,
        "free",
        1,
    );
    // Unkeyed: through, unlimited, no plan and no headers.
    let r = send(&app, Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unlimited"));
    assert_eq!(r.header("ratelimit-policy"), None);
    let r = send(&app, with_tier("bad", Some("pro"))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");

    // A closure; the layer answers the plan's limiter when asked.
    let layer = RateLimitLayer::plans(plans.clone(), |_: &Parts| Some("pro"));
    assert_eq!(layer.limiter().keyspace().policy(), format!("{base}-free"));
    assert!(layer.plan_table().is_some());
    let app = Router::new()
        .route("/", route_get(echo))
        .layer(layer.key(key));
    assert_admitted(&send(&app, req("k", None)).await, &base, "pro", 2, 0);
}

/// Concurrent requests on two plans: each plan admits exactly its limit,
/// whatever the interleaving.
pub async fn concurrent_requests_get_each_plan_exactly(backend: Backend) {
    let clock = clock();
    let base = unique("conc");
    let plans = Plans::new(table(&backend, &base, 5, 12, &clock));
    let app = app(&plans);
    let mut tasks = Vec::new();
    for i in 0..40 {
        let app = app.clone();
        let plan = if i % 2 == 0 { "free" } else { "pro" };
        tasks.push(tokio::spawn(async move {
            (plan, send(&app, req("k", Some(plan))).await.status)
        }));
    }
    let (mut free, mut pro) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            ("free", StatusCode::OK) => free += 1,
            (_, StatusCode::OK) => pro += 1,
            (_, status) => assert_eq!(status, StatusCode::TOO_MANY_REQUESTS),
        }
    }
    assert_eq!((free, pro), (5, 12));
}

on_every_backend!(memory, redis, cluster; [
    unknown_or_missing_plan_is_the_default,
    plans_count_apart,
    a_replaced_table_applies_to_the_next_request,
    selectors_and_settings,
    concurrent_requests_get_each_plan_exactly,
]);

/// Many plans in one table: every one selected by name, each with its own
/// headers, built once per table.
#[tokio::test]
async fn many_plans() {
    let backend: Backend = Arc::new(tollgate_core::MemoryBackend::new());
    let clock = clock();
    let mut b = PlanTable::builder();
    for i in 0..20 {
        let limiter = RateLimiter::builder(backend.clone(), Algorithm::Gcra)
            .quota(Quota::per_minute(i + 1))
            .name(format!("many-{i}"))
            .clock(clock.clone())
            .build()
            .unwrap();
        b = b.plan(format!("p{i}"), limiter);
    }
    let plans = Plans::new(b.default_plan("p0").build().unwrap());
    let app = app(&plans);
    for i in 0..20u64 {
        let r = send(&app, req("k", Some(&format!("p{i}")))).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, format!("p{i} {i}"));
        let policy = format!(r#""many-{i}";q={};w=60"#, i + 1);
        assert_eq!(r.header("ratelimit-policy"), Some(policy.as_str()));
    }
}
