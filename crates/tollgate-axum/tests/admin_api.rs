//! The admin router over real HTTP on loopback, on memory and on a real
//! redis-server: the token, each route's JSON, the 204s and their effect on
//! the limiters, and the refusals (401, 400, 404, 503) as problem documents.

mod admin_common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use admin_common::{
    backend, get, get_with, json, post, post_raw, problem, serve, App, Store, TOKEN, WAIT,
};
use http::Method;
use serde_json::json;
use tollgate_axum::admin::AdminRouter;
use tollgate_core::admin::Admin;
use tollgate_core::idempotency::{Claim, Fingerprint, IdempotencyStore, StoredResponse};
use tollgate_core::{LockOptions, MemoryBackend, Semaphore, Subject};
use tollgate_testkit::eventually;
use tollgate_testkit::http::{in_process, loopback};
use tollgate_tower::key::{HeaderKey, KeyExtractor};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The subject the `api` route keys a request with `X-Api-Key: key` under.
fn api_subject(key: &str) -> Subject {
    let req = http::Request::get("/")
        .header("x-api-key", key)
        .body(())
        .unwrap();
    HeaderKey::new("x-api-key")
        .extract(&req.into_parts().0)
        .unwrap()
        .unwrap()
}

/// A key the routes would refuse is a 400 naming it, on lookups and
/// actions alike.
#[tokio::test]
async fn a_key_the_routes_refuse_is_a_400() {
    let backend = MemoryBackend::new();
    let limiter =
        tollgate_core::RateLimiter::builder(backend.clone(), tollgate_core::Algorithm::Gcra)
            .quota(tollgate_core::Quota::per_second(1))
            .name("keys")
            .build()
            .unwrap();
    let admin = Admin::new(backend);
    eventually(WAIT, "the limiter registers", || async {
        admin.limiters().await.ok().filter(|l| l.len() == 1)
    })
    .await;
    let app = AdminRouter::new(admin, TOKEN)
        .unwrap()
        .try_resolve_key("keys", |raw| raw.strip_prefix("tg_").map(Subject::new))
        .into_router::<()>();
    let auth = format!("Bearer {TOKEN}");
    let ask = |uri: &str| {
        http::Request::get(uri)
            .header("authorization", &auth)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let r = in_process::send(&app, ask("/api/subjects?limiter=keys&key=nope")).await;
    let detail = problem(&r, 400);
    assert!(detail.contains("no such key"), "{detail}");
    let r = in_process::send(&app, ask("/api/subjects?limiter=keys&key=tg_ann")).await;
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        (r.status.as_u16(), &v["subject"]),
        (200, &json!("ann")),
        "{r:?}"
    );
    limiter.check("ann").await.unwrap();
}

#[test]
fn an_empty_token_is_refused() {
    for token in ["", "   "] {
        assert!(AdminRouter::new(Admin::new(MemoryBackend::new()), token).is_err());
    }
}

/// A token no `Authorization` header could carry is refused at once, not
/// answered 401 forever: whitespace around it, a control character, a
/// character beyond ASCII.
#[test]
fn a_token_no_request_could_present_is_refused() {
    for token in ["s3cret\n", " s3cret", "s3cret ", "s3\tcret", "sécret"] {
        let built = AdminRouter::new(Admin::new(MemoryBackend::new()), token);
        assert!(built.is_err(), "{token:?}");
    }
    assert!(AdminRouter::new(Admin::new(MemoryBackend::new()), "s3cret with spaces").is_ok());
}

/// Every `/api/*` route asks for the token; the page and its assets do not,
/// and carry the strict policy.
async fn the_token_guards_the_api(store: Store) {
    let app = serve(backend(store).await).await;
    let paths = [
        "/admin/api/limiters",
        "/admin/api/subjects?limiter=login&key=alice",
        "/admin/api/throttled",
        "/admin/api/holders",
        "/admin/api/idempotency",
        "/admin/api/no-such-route",
    ];
    for path in paths {
        for token in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
            let r = get_with(app.addr, path, token).await;
            let detail = problem(&r, 401);
            assert!(detail.contains("token"), "{detail}");
            assert_eq!(
                r.header("www-authenticate"),
                Some(r#"Bearer realm="tollgate-admin""#)
            );
        }
    }
    // Another scheme is no token; a POST without one changes nothing.
    let basic = format!("Basic {TOKEN}");
    let r = loopback::send(
        app.addr,
        Method::GET,
        "/admin/api/limiters",
        &[("authorization", &basic)],
    )
    .await;
    problem(&r, 401);
    for _ in 0..4 {
        app.login.check("alice").await.unwrap();
    }
    let r = loopback::post(app.addr, "/admin/api/reset").await;
    problem(&r, 401);
    assert!(!app.login.check("alice").await.unwrap().allowed);

    // The page and its assets: no token, their content types, the policy.
    for (path, ty) in [
        ("/admin/", "text/html; charset=utf-8"),
        ("/admin/dashboard.js", "text/javascript; charset=utf-8"),
        ("/admin/dashboard.css", "text/css; charset=utf-8"),
    ] {
        let r = get_with(app.addr, path, None).await;
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.header("content-type"), Some(ty), "{path}");
        assert_eq!(
            r.header("content-security-policy"),
            Some(
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                 img-src 'self'; base-uri 'none'; frame-ancestors 'none'"
            ),
            "{path}"
        );
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }
    let page = get_with(app.addr, "/admin/", None).await.body;
    assert!(page.contains(r#"<script src="dashboard.js" defer></script>"#));
    // Nothing from elsewhere, nothing inline.
    assert!(!page.contains("http://") && !page.contains("https://"));
    assert!(!page.contains("<script>") && !page.contains("style="));
    let script = get_with(app.addr, "/admin/dashboard.js", None).await.body;
    assert!(!script.contains("innerHTML") && !script.contains("http"));
    // The mount point without its slash leads to the page.
    let r = get_with(app.addr, "/admin", None).await;
    assert_eq!(r.status, 308);
    assert_eq!(r.header("location"), Some("admin/"));
}

#[tokio::test]
async fn the_token_guards_the_api_on_memory() {
    the_token_guards_the_api(Store::Memory).await;
}

#[tokio::test]
async fn the_token_guards_the_api_on_redis() {
    the_token_guards_the_api(Store::Redis).await;
}

/// Each route's answer, and what the actions do to the limiters.
async fn the_routes_answer_as_the_contract_says(store: Store) {
    let App {
        addr,
        login,
        api,
        admin,
        backend,
    } = serve(backend(store).await).await;

    // Limiters, by name, as registered.
    let v = json(&get(addr, "/admin/api/limiters").await);
    let limiters = v["limiters"].as_array().unwrap();
    assert_eq!(limiters.len(), 2, "{v}");
    assert_eq!(limiters[0]["name"], "api");
    assert_eq!(limiters[1]["name"], "login");
    assert_eq!(limiters[1]["algorithm"], "sliding_window_log");
    assert_eq!(limiters[1]["quotas"][0]["limit"], 3);
    assert_eq!(limiters[1]["quotas"][0]["period_seconds"], 60);
    for l in limiters {
        assert!(l["traffic"]["allowed_per_second"].is_number(), "{l}");
        assert!(l["traffic"]["denied_per_second"].is_number(), "{l}");
    }

    // A subject by raw key, resolved as the route keys it: the same id the
    // throttled list shows after the route refused it.
    let key = "sk_live_abcdef123456";
    let id = api_subject(key).as_encoded().to_owned();
    assert!(!id.contains("abcdef"), "the key is hashed: {id}");
    let fresh = json(&get(addr, &format!("/admin/api/subjects?limiter=api&key={key}")).await);
    assert_eq!(fresh["limiter"], "api");
    assert_eq!(fresh["subject"], id.as_str());
    assert_eq!(
        (fresh["remaining"].as_u64(), fresh["limit"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(fresh["retry_after_ms"].is_null(), "{fresh}");
    assert!(fresh["blocked_until_ms"].is_null(), "{fresh}");
    for status in [200, 200, 429, 429] {
        let r = loopback::send(addr, Method::GET, "/v1/ping", &[("x-api-key", key)]).await;
        assert_eq!(r.status, status, "{r:?}");
    }
    let spent = json(&get(addr, &format!("/admin/api/subjects?limiter=api&key={key}")).await);
    assert_eq!(spent["remaining"], 0, "{spent}");
    let retry = spent["retry_after_ms"].as_u64().expect("a retry");
    assert!(retry > 0 && retry <= 60_000, "{spent}");
    // The same by id (ids hold `%` escapes: the query string escapes them).
    let query = format!("limiter=api&subject={}", id.replace('%', "%25"));
    let by_id = json(&get(addr, &format!("/admin/api/subjects?{query}")).await);
    assert_eq!(by_id["subject"], id.as_str());
    assert_eq!(by_id["remaining"], 0);

    let listed = eventually(WAIT, "the refused key is listed as throttled", || async {
        let v = json(&get(addr, "/admin/api/throttled").await);
        let subjects = v["subjects"].as_array().unwrap().clone();
        subjects
            .iter()
            .find(|s| s["subject"] == id.as_str())
            .cloned()
    })
    .await;
    assert_eq!(listed["limiter"], "api");
    assert_eq!(
        listed["label"], "sk_l…",
        "the label, never the key: {listed}"
    );
    assert!(listed["denied"].as_u64().unwrap() >= 2, "{listed}");
    let last = listed["last_denied_ms"].as_u64().unwrap();
    assert!(last <= now_ms() && last + 60_000 > now_ms(), "{listed}");

    // Reset by key: 204, and the route admits the key again.
    let r = post(
        addr,
        "/admin/api/reset",
        json!({"limiter": "api", "key": key}),
    )
    .await;
    assert_eq!((r.status.as_u16(), r.body.as_str()), (204, ""), "{r:?}");
    let r = loopback::send(addr, Method::GET, "/v1/ping", &[("x-api-key", key)]).await;
    assert_eq!(r.status, 200, "admitted after the reset: {r:?}");
    assert_eq!(api.inspect(&api_subject(key)).await.unwrap().remaining, 1);

    // Block by id: the limiter refuses with the block's wait; unblock lifts.
    let r = post(
        addr,
        "/admin/api/block",
        json!({"limiter": "login", "subject": "alice", "seconds": 120}),
    )
    .await;
    assert_eq!(r.status, 204, "{r:?}");
    let d = login.check("alice").await.unwrap();
    assert!(!d.allowed, "{d:?}");
    assert!(d.retry_after.unwrap() > Duration::from_secs(100), "{d:?}");
    let blocked = json(&get(addr, "/admin/api/subjects?limiter=login&key=alice").await);
    let until = blocked["blocked_until_ms"].as_u64().expect("blocked");
    assert!(
        until > now_ms() + 100_000 && until <= now_ms() + 121_000,
        "{blocked}"
    );
    let r = post(
        addr,
        "/admin/api/unblock",
        json!({"limiter": "login", "key": "alice"}),
    )
    .await;
    assert_eq!(r.status, 204, "{r:?}");
    assert!(login.check("alice").await.unwrap().allowed);
    let lifted = json(&get(addr, "/admin/api/subjects?limiter=login&subject=alice").await);
    assert!(lifted["blocked_until_ms"].is_null(), "{lifted}");

    // Holders: a permit held here is listed with this process as holder;
    // released, it is gone.
    let semaphore = Semaphore::builder(backend.clone(), 2)
        .prefix(admin.prefix())
        .name("jobs")
        .build()
        .unwrap();
    let permit = semaphore
        .acquire("nightly", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let v = json(&get(addr, "/admin/api/holders").await);
    let holders = v["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{v}");
    let h = &holders[0];
    assert_eq!(
        (h["kind"].as_str(), h["name"].as_str()),
        (Some("permit"), Some("jobs")),
        "{h}"
    );
    assert_eq!(h["subject"], "nightly", "{h}");
    assert_eq!(h["fence"].as_u64(), Some(permit.fence().get()), "{h}");
    let me = format!(":{}", std::process::id());
    assert!(h["holder"].as_str().unwrap().ends_with(&me), "{h}");
    assert!(h["ttl_ms"].as_u64().unwrap() <= 30_000, "{h}");
    assert!(h["held_ms"].is_u64(), "{h}");
    permit.release().await.unwrap();
    let v = json(&get(addr, "/admin/api/holders").await);
    assert_eq!(v["holders"].as_array().unwrap().len(), 0, "{v}");

    // Idempotency keys in flight: a claim whose handler runs is listed
    // (its key id, never the payload); completed, it is gone.
    let v = json(&get(addr, "/admin/api/idempotency").await);
    assert_eq!(v, json!({"in_flight": []}));
    let records = IdempotencyStore::builder(backend.clone())
        .prefix(admin.prefix())
        .lease(LockOptions::new().ttl(Duration::from_secs(30)))
        .build()
        .unwrap();
    let key = Subject::compound(["tenant-1", "POST /orders", "key-123"]);
    let payload = Fingerprint::of(b"{\"qty\":1}");
    let Claim::Claimed(claim) = records.claim(key.clone(), payload).await.unwrap() else {
        panic!("claimed");
    };
    let r = get(addr, "/admin/api/idempotency").await;
    assert!(!r.body.contains(&payload.to_hex()[..16]), "{r:?}");
    let v = json(&r);
    let in_flight = v["in_flight"].as_array().unwrap();
    assert_eq!(in_flight.len(), 1, "{v}");
    let k = &in_flight[0];
    assert_eq!(k["name"], "idem", "{k}");
    assert_eq!(k["key"], key.as_encoded(), "{k}");
    assert_eq!(k["fence"].as_u64(), Some(claim.fence().get()), "{k}");
    assert!(k["held_ms"].is_u64(), "{k}");
    let ttl = k["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "{k}");
    let done = StoredResponse::new(201, vec![], b"{}".to_vec());
    assert!(claim.complete(&done).await.unwrap());
    let v = json(&get(addr, "/admin/api/idempotency").await);
    assert_eq!(v, json!({"in_flight": []}));
}

#[tokio::test]
async fn the_routes_answer_as_the_contract_says_on_memory() {
    the_routes_answer_as_the_contract_says(Store::Memory).await;
}

#[tokio::test]
async fn the_routes_answer_as_the_contract_says_on_redis() {
    the_routes_answer_as_the_contract_says(Store::Redis).await;
}

/// Bad input is a 400 naming what is wrong, an unknown limiter a 404; both
/// change nothing.
async fn bad_input_is_refused(store: Store) {
    let App { addr, login, .. } = serve(backend(store).await).await;
    for _ in 0..4 {
        login.check("alice").await.unwrap();
    }
    let queries = [
        ("key=alice", "limiter"),
        ("limiter=&key=alice", "limiter"),
        ("limiter=login", "key or subject"),
        ("limiter=login&key=alice&subject=alice", "not both"),
        ("limiter=login&key=", "empty"),
        ("limiter=login&subject=a%7Bb%7D", "subject id"),
        ("limiter=login&subject=%25zz", "subject id"),
    ];
    for (q, says) in queries {
        let detail = problem(&get(addr, &format!("/admin/api/subjects?{q}")).await, 400);
        assert!(detail.contains(says), "{q}: {detail}");
    }
    let detail = problem(
        &get(addr, "/admin/api/subjects?limiter=nope&key=alice").await,
        404,
    );
    assert!(detail.contains("nope"), "{detail}");
    // A key the route could never carry in its header.
    let detail = problem(
        &get(addr, "/admin/api/subjects?limiter=api&key=a%0Ab").await,
        400,
    );
    assert!(detail.contains("x-api-key"), "{detail}");

    let bodies = [
        ("/admin/api/reset", "{", "JSON"),
        ("/admin/api/reset", "[1]", "JSON"),
        ("/admin/api/reset", r#"{"key":"alice"}"#, "limiter"),
        (
            "/admin/api/unblock",
            r#"{"limiter":"login"}"#,
            "key or subject",
        ),
        (
            "/admin/api/block",
            r#"{"limiter":"login","key":"alice"}"#,
            "seconds",
        ),
        (
            "/admin/api/block",
            r#"{"limiter":"login","key":"alice","seconds":0}"#,
            "between",
        ),
        (
            "/admin/api/block",
            r#"{"limiter":"login","key":"alice","seconds":-5}"#,
            "whole",
        ),
        (
            "/admin/api/block",
            r#"{"limiter":"login","key":"alice","seconds":1.5}"#,
            "whole",
        ),
        (
            "/admin/api/block",
            r#"{"limiter":"login","key":"alice","seconds":"60"}"#,
            "whole",
        ),
        (
            "/admin/api/block",
            r#"{"limiter":"login","key":"alice","seconds":99999999999}"#,
            "between",
        ),
        (
            "/admin/api/reset",
            r#"{"limiter":"login","subject":"{x}"}"#,
            "subject id",
        ),
    ];
    for (path, body, says) in bodies {
        let detail = problem(&post_raw(addr, path, body).await, 400);
        assert!(detail.contains(says), "{path} {body}: {detail}");
    }
    let r = post(
        addr,
        "/admin/api/reset",
        json!({"limiter": "nope", "key": "alice"}),
    )
    .await;
    problem(&r, 404);
    let r = post(
        addr,
        "/admin/api/block",
        json!({"limiter": "nope", "key": "alice", "seconds": 60}),
    )
    .await;
    problem(&r, 404);
    // Nothing was reset or blocked on the way.
    let d = login.check("alice").await.unwrap();
    assert!(
        !d.allowed && d.retry_after.unwrap() <= Duration::from_secs(60),
        "{d:?}"
    );
    // Only GET reads and POST acts.
    let r = loopback::send(
        addr,
        Method::GET,
        "/admin/api/reset",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(r.status, 405, "{r:?}");
}

#[tokio::test]
async fn bad_input_is_refused_on_memory() {
    bad_input_is_refused(Store::Memory).await;
}

#[tokio::test]
async fn bad_input_is_refused_on_redis() {
    bad_input_is_refused(Store::Redis).await;
}

/// A store that does not answer is a 503 with `Retry-After`, never a hang
/// or a panic.
#[tokio::test]
async fn a_store_that_fails_is_a_503() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let backend: tollgate_core::Backend = tollgate_core::RedisBackend::connect(&server.url())
        .await
        .unwrap()
        .into();
    let App { addr, .. } = serve(backend).await;
    drop(server);
    let paths = [
        "/admin/api/limiters",
        "/admin/api/throttled",
        "/admin/api/subjects?limiter=login&key=alice",
        "/admin/api/idempotency",
    ];
    let replies = futures::future::join_all(paths.map(|p| get(addr, p))).await;
    for (path, r) in paths.iter().zip(replies) {
        let detail = problem(&r, 503);
        assert!(detail.contains("unavailable"), "{path}: {detail}");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(r.elapsed < Duration::from_secs(7), "{path}: {r:?}");
    }
    let r = post(
        addr,
        "/admin/api/reset",
        json!({"limiter": "login", "key": "alice"}),
    )
    .await;
    let detail = problem(&r, 503);
    assert!(detail.contains("retry it"), "{detail}");
}

/// An action through the API is bounded per round trip, not as a whole:
/// on a store whose every reply comes 2 s late (each within the 5 s
/// bound, not all of them together) a reset completes, and the subject
/// has its quota back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reset_is_not_cut_short() {
    let server = tollgate_testkit::RedisServer::start().unwrap();
    let prefix = tollgate_testkit::unique("slow");
    let app: tollgate_core::Backend = tollgate_core::RedisBackend::connect(&server.url())
        .await
        .unwrap()
        .into();
    let login =
        tollgate_core::RateLimiter::builder(app, tollgate_core::Algorithm::SlidingWindowLog)
            .quota(tollgate_core::Quota::per_minute(3))
            .prefix(&prefix)
            .name("login")
            .deny_cache(0)
            .build()
            .unwrap();
    // The operator's side alone goes through the slow link.
    let slow = tollgate_testkit::ReplyDelay::start(&server.addr())
        .await
        .unwrap();
    let operator: tollgate_core::Backend = tollgate_core::RedisBackend::connect(&slow.url())
        .await
        .unwrap()
        .into();
    let admin = Admin::new(operator).with_prefix(&prefix);
    eventually(WAIT, "login registers", || async {
        admin.limiters().await.ok().filter(|l| l.len() == 1)
    })
    .await;
    let router =
        axum::Router::new().merge(AdminRouter::new(admin, TOKEN).unwrap().mount_at("/admin"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let alice = Subject::new("alice");
    for _ in 0..3 {
        assert!(login.check(&alice).await.unwrap().allowed);
    }
    assert!(!login.check(&alice).await.unwrap().allowed);
    slow.set(Duration::from_secs(2));
    let r = post(
        addr,
        "/admin/api/reset",
        json!({"limiter": "login", "key": "alice"}),
    )
    .await;
    assert_eq!(r.status, 204, "{r:?}");
    assert!(login.check(&alice).await.unwrap().allowed);
}
