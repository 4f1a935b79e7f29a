//! The gateway's contract as checks over HTTP, run by `gateway.rs` against
//! any pair of instances (the router in process, or the example binary):
//! validation, permits in flight, orders, quota and the login throttle, with
//! the requests and the assertions on their replies they are made of.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;
use tollgate::{LockBackend, Semaphore};
use tollgate_testkit::http::loopback::send_with;
use tollgate_testkit::unique;

use crate::common::{self, send, RateLimitReply, Reply};

/// `POST /v1/generate?ms=<ms>` with `key` (no header when `None`).
pub(crate) async fn generate(addr: SocketAddr, key: Option<&str>, ms: &str) -> Reply {
    let path = format!("/v1/generate{ms}");
    match key {
        Some(key) => send(addr, Method::POST, &path, &[("x-api-key", key)]).await,
        None => send(addr, Method::POST, &path, &[]).await,
    }
}

/// The fence of a 200 generate reply.
fn permit_fence(r: &Reply) -> u64 {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    v["permit_fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer permit_fence in {v}"))
}

fn assert_problem(r: &Reply, status: StatusCode) {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(r.expect_header("content-type"), "application/problem+json");
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["status"], status.as_u16(), "{v}");
    assert!(v["title"].is_string() && v["detail"].is_string(), "{v}");
}

/// 401 for missing and invalid keys, 400 for a bad `ms`; both as problems.
pub(crate) async fn check_validation(addr: SocketAddr) {
    assert_problem(
        &generate(addr, None, "?ms=0").await,
        StatusCode::UNAUTHORIZED,
    );
    let long = "k".repeat(65);
    for bad in ["", "a b", "a:b", "é", long.as_str()] {
        let r = send(
            addr,
            Method::POST,
            "/v1/generate?ms=0",
            &[("x-api-key", bad)],
        )
        .await;
        assert_problem(&r, StatusCode::UNAUTHORIZED);
    }
    let key = unique("ok");
    for bad in [
        "?ms=10001",
        "?ms=-1",
        "?ms=+5",
        "?ms=abc",
        "?ms=",
        "?ms=1.5",
    ] {
        assert_problem(
            &generate(addr, Some(&key), bad).await,
            StatusCode::BAD_REQUEST,
        );
    }
    permit_fence(&generate(addr, Some(&"k".repeat(64)), "?ms=0").await);
    // Another method is a plain 405, even with a bad ms.
    let r = send(
        addr,
        Method::GET,
        "/v1/generate?ms=x",
        &[("x-api-key", &key)],
    )
    .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");
    // No `ms`: 500 ms of work.
    let r = generate(addr, Some(&key), "").await;
    permit_fence(&r);
    assert!(r.elapsed >= Duration::from_millis(500), "{r:?}");
    permit_fence(&generate(addr, Some("pro-A_z-09"), "?x=1&ms=0").await);
}

/// The gateway's generate permits on the backend the instances share, read
/// from outside (a probe request would take a permit itself).
pub(crate) struct Permits(Semaphore);

impl Permits {
    pub(crate) fn new(backend: impl LockBackend) -> Permits {
        Permits(
            Semaphore::builder(backend, 2)
                .prefix("gateway")
                .name("generate")
                .build()
                .unwrap(),
        )
    }

    /// Waits until `key` has `n` permits in use.
    pub(crate) async fn wait_for(&self, key: &str, n: u32) {
        let subject = crate::app::subject_of(key).expect("a valid API key");
        common::eventually(Duration::from_secs(10), "permits in use", || async {
            (self.0.in_use(subject.clone()).await.unwrap() == n).then_some(())
        })
        .await;
    }
}

/// At most 2 in flight per key across `a` and `b`: two long requests (one
/// per instance) hold both permits; a third gets 429 with `Retry-After` ≥ 1
/// from either instance; another key is not affected; once the two finish
/// the key is free again; fences differ.
pub(crate) async fn check_in_flight(permits: &Permits, a: SocketAddr, b: SocketAddr) {
    let key = unique("busy");
    let (k1, k2) = (key.clone(), key.clone());
    let first = tokio::spawn(async move { generate(a, Some(&k1), "?ms=4000").await });
    let second = tokio::spawn(async move { generate(b, Some(&k2), "?ms=4000").await });
    permits.wait_for(&key, 2).await;
    let refused = generate(a, Some(&key), "?ms=0").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert!(refused.retry_after() >= 1, "{refused:?}");
    let r = generate(b, Some(&key), "?ms=0").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert!(r.retry_after() >= 1);
    permit_fence(&generate(b, Some(&unique("other")), "?ms=0").await);
    let f1 = permit_fence(&first.await.unwrap());
    let f2 = permit_fence(&second.await.unwrap());
    assert_ne!(f1, f2);
    permits.wait_for(&key, 0).await;
    let f3 = permit_fence(&generate(a, Some(&key), "?ms=0").await);
    assert!(f3 > f1.max(f2), "fences increase: {f1}, {f2}, then {f3}");
}

/// `POST /v1/orders` as `api_key` with `Idempotency-Key: idem` (none when
/// `None`) and a JSON `body`.
async fn order(addr: SocketAddr, api_key: &str, idem: Option<&str>, body: &str) -> Reply {
    let mut headers = vec![("x-api-key", api_key), ("content-type", "application/json")];
    if let Some(idem) = idem {
        headers.push(("idempotency-key", idem));
    }
    let body = Bytes::from(body.to_owned());
    send_with(addr, Method::POST, "/v1/orders", &headers, None, body).await
}

/// The order id of a 201 reply, checking its echo.
fn order_id(r: &Reply, echo: &str) -> String {
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let v: Value = serde_json::from_str(&r.body).unwrap();
    let expected: Value = serde_json::from_str(echo).unwrap();
    assert_eq!(v["echo"], expected, "{v}");
    v["order"].as_str().expect("an order id").to_owned()
}

/// The orders contract across `a` and `b`: one order per (API key,
/// Idempotency-Key); replays are byte-identical with
/// `Idempotent-Replayed: true`; another body → 422; in flight → 409 with
/// `Retry-After`; a missing or invalid key → 400.
pub(crate) async fn check_orders(a: SocketAddr, b: SocketAddr) {
    let (alice, bob) = (unique("alice"), unique("bob"));
    let idem = unique("order");
    let body = r#"{"sku":"tea","qty":2}"#;
    let first = order(a, &alice, Some(&idem), body).await;
    let id = order_id(&first, body);
    assert_eq!(first.header("idempotent-replayed"), None);
    for instance in [a, b] {
        let replay = order(instance, &alice, Some(&idem), body).await;
        assert_eq!(replay.status, StatusCode::CREATED);
        assert_eq!(replay.body, first.body, "byte-identical replay");
        assert_eq!(replay.expect_header("idempotent-replayed"), "true");
        assert_eq!(order_id(&replay, body), id);
    }
    let other_body = order(b, &alice, Some(&idem), r#"{"sku":"tea","qty":3}"#).await;
    assert_eq!(
        other_body.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{other_body:?}"
    );
    let other_caller = order(b, &bob, Some(&idem), body).await;
    assert_ne!(
        order_id(&other_caller, body),
        id,
        "another API key, another order"
    );
    assert_eq!(
        order(a, &alice, None, body).await.status,
        StatusCode::BAD_REQUEST
    );
    let long = "k".repeat(256);
    assert_eq!(
        order(a, &alice, Some(&long), body).await.status,
        StatusCode::BAD_REQUEST
    );
    // In flight: a second request while the first works its 300 ms.
    let conflict = common::eventually(Duration::from_secs(20), "a 409 while in flight", || async {
        let idem = unique("race");
        let (alice2, idem2) = (alice.clone(), idem.clone());
        let first = tokio::spawn(async move { order(a, &alice2, Some(&idem2), body).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = order(b, &alice, Some(&idem), body).await;
        order_id(&first.await.unwrap(), body);
        (second.status == StatusCode::CONFLICT).then_some(second)
    })
    .await;
    assert!(conflict.retry_after() >= 1, "{conflict:?}");
}

/// `GET /v1/quota` as `key`.
pub(crate) async fn quota(addr: SocketAddr, key: &str) -> Reply {
    send(addr, Method::GET, "/v1/quota", &[("x-api-key", key)]).await
}

/// The caller's plan policy: `"quota-<plan>";q=<limit>;w=60`.
fn quota_policy(plan: &str, limit: u64) -> String {
    format!(r#""quota-{plan}";q={limit};w=60"#)
}

/// The `remaining` of a 200 quota reply, after checking that the JSON is
/// exactly `{"plan":<plan>,"remaining":<integer>}` and the policy is the
/// plan's.
fn quota_left(r: &Reply, plan: &str, limit: u64) -> u64 {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(
        r.expect_header("ratelimit-policy"),
        quota_policy(plan, limit)
    );
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    assert_eq!(v["plan"], plan, "{v}");
    v["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer remaining in {v}"))
}

/// A 429 of `plan`: its policy, and a `Retry-After` no longer than one
/// token's refill (60 s / limit, rounded up).
fn assert_quota_refused(r: &Reply, plan: &str, limit: u64) {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(
        r.expect_header("ratelimit-policy"),
        quota_policy(plan, limit)
    );
    let most = 60_u64.div_ceil(limit);
    assert!((1..=most).contains(&r.retry_after()), "{r:?}");
}

/// `limit + extra` rapid requests of one new key on `plan`, spread over
/// `instances` in `streams` concurrent streams: exactly `limit` are
/// admitted, with the remaining counts `limit - 1` down to 0 each once (in
/// that order when there is one stream), and the rest get 429.
///
/// The bucket refills one token every 60 s / limit, so a burst slower than
/// that is admitted one more: such a burst (a loaded machine) is not judged,
/// and is run again with another key.
async fn check_plan_admissions(
    instances: &[SocketAddr],
    plan: &'static str,
    limit: u64,
    extra: u64,
    streams: u64,
) {
    let refill = Duration::from_secs(60) / u32::try_from(limit).unwrap();
    for attempt in 0..5 {
        let key = match plan {
            "pro" => unique("pro-q"),
            _ => unique("q"),
        };
        let start = Instant::now();
        let mut tasks = Vec::new();
        for stream in 0..streams {
            let (key, instances) = (key.clone(), instances.to_vec());
            tasks.push(tokio::spawn(async move {
                let mut replies = Vec::new();
                let mut i = stream;
                while i < limit + extra {
                    let addr = instances[(i % instances.len() as u64) as usize];
                    replies.push(quota(addr, &key).await);
                    i += streams;
                }
                replies
            }));
        }
        let mut replies = Vec::new();
        for t in tasks {
            replies.extend(t.await.unwrap());
        }
        let elapsed = start.elapsed();
        if elapsed >= refill {
            eprintln!("{plan}: attempt {attempt} took {elapsed:?}, over one refill ({refill:?})");
            continue;
        }
        if streams == 1 {
            // In order: limit - 1 down to 0 left, then refused.
            for (i, r) in replies.iter().enumerate() {
                match limit.checked_sub(i as u64 + 1) {
                    Some(left) => assert_eq!(quota_left(r, plan, limit), left, "{plan} #{i}"),
                    None => assert_quota_refused(r, plan, limit),
                }
            }
        }
        let (admitted, refused): (Vec<Reply>, Vec<Reply>) = replies
            .into_iter()
            .partition(|r| r.status == StatusCode::OK);
        let mut left: Vec<u64> = admitted
            .iter()
            .map(|r| quota_left(r, plan, limit))
            .collect();
        left.sort_unstable();
        assert_eq!(left, (0..limit).collect::<Vec<_>>(), "{plan}");
        assert_eq!(refused.len() as u64, extra, "{plan}");
        for r in &refused {
            assert_quota_refused(r, plan, limit);
        }
        return;
    }
    panic!(
        "{plan}: no burst of {} requests within {refill:?}",
        limit + extra
    );
}

/// `GET /v1/quota`: per API key by plan across `a` and `b` — free admits
/// exactly 10 of 12 rapid requests (in order: 9 down to 0 left, then 429),
/// pro exactly 100 of 105; a key's plan comes from its `pro-` prefix; a
/// missing key is 401, another method a plain 405.
pub(crate) async fn check_quota(a: SocketAddr, b: SocketAddr) {
    assert_problem(
        &send(a, Method::GET, "/v1/quota", &[]).await,
        StatusCode::UNAUTHORIZED,
    );
    let r = send(b, Method::POST, "/v1/quota", &[("x-api-key", "pro-x")]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");
    // One after the other (the exact sequence), then concurrently.
    check_plan_admissions(&[a, b], "free", 10, 2, 1).await;
    check_plan_admissions(&[a, b], "free", 10, 2, 3).await;
    check_plan_admissions(&[a, b], "pro", 100, 5, 5).await;
    // Pro and free keys are apart: a new pro key starts full.
    assert_eq!(
        quota_left(&quota(b, &unique("pro-k")).await, "pro", 100),
        99
    );
}

/// `POST /v1/login` as `key` with `body`.
pub(crate) async fn login(addr: SocketAddr, key: &str, body: &str) -> Reply {
    let headers = [("x-api-key", key), ("content-type", "application/json")];
    let body = Bytes::from(body.to_owned());
    send_with(addr, Method::POST, "/v1/login", &headers, None, body).await
}

const RIGHT: &str = r#"{"password":"open-sesame"}"#;

fn assert_logged_in(r: &Reply) {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v, serde_json::json!({ "login": "ok" }), "{r:?}");
}

/// A 429 of the login throttle: `Retry-After` within the 60 s window.
fn assert_login_refused(r: &Reply) {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert!((1..=60).contains(&r.retry_after()), "{r:?}");
}

/// `POST /v1/login` across `a` and `b`: successes consume nothing; 32
/// concurrent failed attempts with one key get exactly 3 answers (401) and
/// 29 refusals (429); then the right password is refused too; other keys
/// are not affected; anything but the right password is a failure. Returns
/// the throttled key and its `Retry-After`.
pub(crate) async fn check_login(a: SocketAddr, b: SocketAddr) -> (String, u64) {
    let r = send(a, Method::POST, "/v1/login", &[]).await;
    assert_problem(&r, StatusCode::UNAUTHORIZED);
    let r = send(b, Method::GET, "/v1/login", &[("x-api-key", "k")]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");

    let key = unique("login");
    for i in 0..6 {
        assert_logged_in(&login([a, b][i % 2], &key, RIGHT).await);
    }
    let tries: Vec<_> = (0..32)
        .map(|i| {
            let key = key.clone();
            let addr = [a, b][i % 2];
            tokio::spawn(async move {
                let body = format!(r#"{{"password":"guess-{i}"}}"#);
                login(addr, &key, &body).await
            })
        })
        .collect();
    let (mut failed, mut refused) = (0, 0);
    for t in tries {
        let r = t.await.unwrap();
        if r.status == StatusCode::UNAUTHORIZED {
            assert_problem(&r, StatusCode::UNAUTHORIZED);
            failed += 1;
        } else {
            assert_login_refused(&r);
            refused += 1;
        }
    }
    assert_eq!((failed, refused), (3, 29));
    let r = login(b, &key, RIGHT).await;
    assert_login_refused(&r);

    // Each key has its own count; any body but the right password fails.
    let other = unique("login");
    assert_logged_in(&login(a, &other, RIGHT).await);
    for body in [r#"{"password":"Open-Sesame"}"#, "{}", "open-sesame"] {
        assert_problem(&login(a, &other, body).await, StatusCode::UNAUTHORIZED);
    }
    assert_login_refused(&login(b, &other, RIGHT).await);
    (key, r.retry_after())
}

/// Once the throttled `key`'s window lets one more (after its
/// `Retry-After`), the right password is answered again.
pub(crate) async fn check_login_recovers(addr: SocketAddr, key: &str, retry_after: u64) {
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let r = common::eventually(
        Duration::from_secs(5),
        "a login after Retry-After",
        || async {
            let r = login(addr, key, RIGHT).await;
            (r.status == StatusCode::OK).then_some(r)
        },
    )
    .await;
    assert_logged_in(&r);
}

/// `POST /v1/chat` as `key` with `body`.
pub(crate) async fn chat(addr: SocketAddr, key: &str, body: &str) -> Reply {
    let headers = [("x-api-key", key), ("content-type", "application/json")];
    let body = Bytes::from(body.to_owned());
    send_with(addr, Method::POST, "/v1/chat", &headers, None, body).await
}

/// `POST /v1/chat` as `key` asking for `max_tokens`.
async fn chat_for(addr: SocketAddr, key: &str, max_tokens: u64) -> Reply {
    chat(addr, key, &format!(r#"{{"max_tokens":{max_tokens}}}"#)).await
}

/// The chat budget per API key and minute.
const CHAT_BUDGET: u64 = 1000;
const CHAT_POLICY: &str = r#""chat";q=1000;qu="tokens";w=60"#;

/// The tokens of a 200 chat reply to `max_tokens`, after checking that the
/// JSON is exactly `{"tokens":<integer ≤ max_tokens>}` and the policy is the
/// chat budget's.
fn tokens_used(r: &Reply, max_tokens: u64) -> u64 {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.expect_header("ratelimit-policy"), CHAT_POLICY);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    let n = v["tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer tokens in {v}"));
    assert!(n <= max_tokens, "{n} tokens of {max_tokens}: {r:?}");
    n
}

/// The bucket's refill over `elapsed` at most: one token per 60 ms,
/// rounded up.
fn chat_refill(elapsed: Duration) -> u64 {
    let per_token = 60_000_000 / u128::from(CHAT_BUDGET);
    u64::try_from(elapsed.as_micros().div_ceil(per_token)).unwrap()
}

/// The `r=` of a chat reply, after checking it is what settling leaves: the
/// budget less the `used` tokens answered since the key's bucket was full
/// (`full`), plus at most the refill since then — never the reserved
/// estimates.
fn settled_left(r: &Reply, used: u64, full: Instant) -> u64 {
    let left = r.remaining();
    let least = CHAT_BUDGET - used;
    let most = (least + chat_refill(full.elapsed())).min(CHAT_BUDGET);
    assert!(
        (least..=most).contains(&left),
        "r={left}, expected {least}..={most} after {used} tokens: {r:?}"
    );
    left
}

/// `POST /v1/chat` across `a` and `b`: a body without a positive integer
/// `max_tokens` is 400 and more than the budget 413, taking nothing; each
/// answer's `RateLimit` shows the budget less the tokens answered so far
/// (the settled figure, not the reserved estimates), on either instance; a
/// request for more than is left is 429 with an honest `Retry-After` and
/// takes nothing; each key has its own budget.
pub(crate) async fn check_chat(a: SocketAddr, b: SocketAddr) {
    assert_problem(
        &send(a, Method::POST, "/v1/chat", &[]).await,
        StatusCode::UNAUTHORIZED,
    );
    let r = send(b, Method::GET, "/v1/chat", &[("x-api-key", "k")]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{r:?}");

    let key = unique("chat");
    let bad = [
        "",
        "300",
        "{}",
        r#"{"max_tokens":0}"#,
        r#"{"max_tokens":-1}"#,
        r#"{"max_tokens":1.5}"#,
        r#"{"max_tokens":"300"}"#,
        r#"{"max_tokens":1e30}"#,
        r#"{"max_tokens":300"#,
    ];
    for body in bad {
        let r = chat(a, &key, body).await;
        assert_problem(&r, StatusCode::BAD_REQUEST);
        assert_eq!(r.header("ratelimit-policy"), None, "{body}: {r:?}");
    }
    // More than the whole budget can never fit: 413, no Retry-After.
    for max in [CHAT_BUDGET + 1, u64::MAX] {
        let r = chat_for(b, &key, max).await;
        assert_problem(&r, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(r.expect_header("ratelimit-policy"), CHAT_POLICY);
        assert_eq!(r.header("retry-after"), None, "{r:?}");
    }
    let huge = format!(r#"{{"max_tokens":1,"pad":"{}"}}"#, "x".repeat(2 << 20));
    assert_eq!(
        chat(a, &key, &huge).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );

    // Nothing was taken: the bucket is full as these start.
    let full = Instant::now();
    let mut used = 0;
    let mut left = CHAT_BUDGET;
    // At most 850 reserved in all: each is admitted whatever was used.
    for (i, max) in [300, 200, 100, 250].into_iter().enumerate() {
        let r = chat_for([a, b][i % 2], &key, max).await;
        used += tokens_used(&r, max);
        left = settled_left(&r, used, full);
    }
    // Use up to 300 short of the budget, asking each time for all that is
    // left (it fits: the bucket only refills meanwhile).
    for _ in 0..50 {
        if left <= CHAT_BUDGET - 300 {
            break;
        }
        let r = chat_for(a, &key, left).await;
        used += tokens_used(&r, left);
        left = settled_left(&r, used, full);
    }
    assert!(left <= CHAT_BUDGET - 300, "50 chats left {left}");
    // 300 more than is left: refused, the wait that of (at most) 300
    // tokens at 60 ms each.
    let r = chat_for(b, &key, left + 300).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.expect_header("ratelimit-policy"), CHAT_POLICY);
    assert!((1..=18).contains(&r.retry_after()), "{r:?}");
    // It took nothing.
    let r = chat_for(a, &key, 1).await;
    used += tokens_used(&r, 1);
    settled_left(&r, used, full);

    // Another key has its own budget.
    let other = unique("chat");
    let fresh = Instant::now();
    let r = chat_for(b, &other, 300).await;
    let n = tokens_used(&r, 300);
    settled_left(&r, n, fresh);
}
