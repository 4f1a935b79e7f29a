//! The gateway's operator plane (`/admin`), end to end over HTTP: two
//! gateway processes on one Redis (and on a cluster) with
//! `TOLLGATE_ADMIN_TOKEN`, the admin API asked of one and its effect seen
//! on both; without the token `/admin` is 404. Real `redis-server`
//! processes, the example binary itself, no mocks.

#[allow(dead_code)]
#[path = "../examples/gateway/app.rs"]
mod app;
mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use tollgate_testkit::http::loopback::send_with;
use tollgate_testkit::{unique, RedisCluster, RedisServer};

use common::{cli_bin, eventually, launch, send, Reply};

const TOKEN: &str = "s3cret-admin-token";
/// The contract's "within 1 s" (and "within 2 s" for the throttled list),
/// with room for a loaded machine: the figures are printed, not asserted.
const WITHIN: Duration = Duration::from_secs(10);

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn admin_get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::GET, path, &[("authorization", &bearer())]).await
}

async fn admin_post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    let auth = bearer();
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let body = Bytes::from(body.to_string());
    send_with(addr, Method::POST, path, &headers, None, body).await
}

fn json_of(r: &Reply) -> Value {
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

async fn quota(addr: SocketAddr, key: &str) -> Reply {
    send(addr, Method::GET, "/v1/quota", &[("x-api-key", key)]).await
}

/// Waits until both instances answer `/v1/quota` for `key` with `status`;
/// returns how long it took.
async fn both_answer(a: SocketAddr, b: SocketAddr, key: &str, status: StatusCode) -> Duration {
    let start = std::time::Instant::now();
    eventually(WITHIN, "both instances agree", || async {
        let (ra, rb) = (quota(a, key).await, quota(b, key).await);
        (ra.status == status && rb.status == status).then_some(())
    })
    .await;
    start.elapsed()
}

/// Runs the `tollgate` CLI on the gateway's prefix with `store` (its
/// `--redis URL` or `--cluster SEEDS`), expecting success.
async fn cli(store: &[&str], args: &[&str]) -> String {
    let out = tokio::process::Command::new(cli_bin())
        .args(store)
        .args(["--prefix", "gateway"])
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("REDIS_CLUSTER")
        .output()
        .await
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tollgate {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

async fn login(addr: SocketAddr, key: &str, password: &str) -> Reply {
    let headers = [("x-api-key", key), ("content-type", "application/json")];
    let body = Bytes::from(json!({ "password": password }).to_string());
    send_with(addr, Method::POST, "/v1/login", &headers, None, body).await
}

/// The CLI on the same store: `throttled --json` shows what the API shows,
/// and `reset login <id>` frees a throttled login on both instances.
async fn cli_contract(a: SocketAddr, b: SocketAddr, store: &[&str]) {
    let key = unique("guess");
    for _ in 0..3 {
        assert_eq!(
            login(a, &key, "guess").await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    for addr in [a, b] {
        let r = login(addr, &key, "open-sesame").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    }
    let id = app::subject_of(&key).unwrap().as_encoded().to_owned();
    let listed = eventually(WITHIN, "the CLI lists the login as throttled", || async {
        let cli_view: Value =
            serde_json::from_str(&cli(store, &["throttled", "--json"]).await).ok()?;
        let api_view = json_of(&admin_get(a, "/admin/api/throttled").await);
        let ours = |v: &Value| {
            v["subjects"].as_array().and_then(|s| {
                s.iter()
                    .find(|s| s["limiter"] == "login" && s["subject"] == id.as_str())
                    .cloned()
            })
        };
        let (c, p) = (ours(&cli_view)?, ours(&api_view)?);
        (c["denied"] == p["denied"]).then_some(c)
    })
    .await;
    assert_eq!(listed["label"], format!("{}…", &key[..4]));
    let said = cli(store, &["reset", "login", &id]).await;
    assert!(said.contains("every instance"), "{said}");
    for addr in [a, b] {
        eventually(WITHIN, "the login is admitted again", || async {
            let r = login(addr, &key, "open-sesame").await;
            (r.status == StatusCode::OK).then_some(())
        })
        .await;
    }
}

/// The whole contract of `/admin` across instances `a` and `b` (processes
/// `pid_b` of `b`).
async fn admin_contract(a: SocketAddr, b: SocketAddr, pid_b: u32) {
    // Auth: a missing or wrong token is 401 problem+json.
    for auth in [None, Some("Bearer nope"), Some("Basic czNjcmV0")] {
        let headers: Vec<(&str, &str)> = auth.map(|v| ("authorization", v)).into_iter().collect();
        let r = send(a, Method::GET, "/admin/api/limiters", &headers).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{r:?}");
        assert_eq!(r.expect_header("content-type"), "application/problem+json");
    }
    let limiters = json_of(&admin_get(a, "/admin/api/limiters").await);
    let names: Vec<&str> = limiters["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    for name in ["chat", "login", "quota-free", "quota-pro"] {
        assert!(names.contains(&name), "{limiters}");
    }
    let limiter = |name: &str| {
        limiters["limiters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap()
    };
    let login = limiter("login");
    assert_eq!(login["algorithm"], "sliding_window_log");
    assert_eq!(login["quotas"][0]["limit"], 3);
    assert_eq!(login["quotas"][0]["period_seconds"], 60);
    let chat = limiter("chat");
    assert_eq!(chat["algorithm"], "token_bucket");
    assert_eq!(chat["quotas"][0]["limit"], 1000);
    assert_eq!(chat["quotas"][0]["period_seconds"], 60);

    // The page.
    let page = send(a, Method::GET, "/admin/", &[]).await;
    assert_eq!(page.status, StatusCode::OK, "{page:?}");
    assert!(page.expect_header("content-type").starts_with("text/html"));

    // A throttled key, on both instances (each caches the denial).
    let key = unique("cust");
    for _ in 0..10 {
        assert_eq!(quota(a, &key).await.status, StatusCode::OK);
    }
    assert_eq!(quota(a, &key).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(quota(b, &key).await.status, StatusCode::TOO_MANY_REQUESTS);
    let subject = json_of(
        &admin_get(
            b,
            &format!("/admin/api/subjects?limiter=quota-free&key={key}"),
        )
        .await,
    );
    let id = subject["subject"].as_str().unwrap().to_owned();
    assert_eq!(subject["limiter"], "quota-free");
    assert_eq!(subject["remaining"], 0);
    assert_eq!(subject["limit"], 10);
    assert!(subject["retry_after_ms"].as_u64().unwrap() > 0, "{subject}");
    assert_eq!(subject["blocked_until_ms"], Value::Null);
    assert!(!id.contains(&key), "the id is not the API key: {id}");
    let r = admin_get(a, &format!("/admin/api/subjects?limiter=nope&key={key}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");

    // Throttled, fleet-wide, with the same id and a label that is not the key.
    let start = std::time::Instant::now();
    eventually(WITHIN, "the key is listed as throttled", || async {
        let top = json_of(&admin_get(a, "/admin/api/throttled").await);
        top["subjects"]
            .as_array()?
            .iter()
            .find(|s| s["subject"] == id.as_str())
            .cloned()
    })
    .await;
    eprintln!("throttled list showed the key after {:?}", start.elapsed());
    // Both instances' denials add up (each flushes its own).
    let entry = eventually(WITHIN, "both instances' denials are counted", || async {
        let top = json_of(&admin_get(b, "/admin/api/throttled").await);
        top["subjects"]
            .as_array()?
            .iter()
            .find(|s| s["subject"] == id.as_str() && s["denied"].as_u64() >= Some(2))
            .cloned()
    })
    .await;
    assert_eq!(entry["limiter"], "quota-free");
    assert_eq!(entry["label"], format!("{}…", &key[..4]));
    assert!(entry["last_denied_ms"].as_u64().unwrap() > 0, "{entry}");

    // Reset by key on one instance: both admit again.
    let r = admin_post(
        a,
        "/admin/api/reset",
        json!({"limiter": "quota-free", "key": key}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    let took = both_answer(a, b, &key, StatusCode::OK).await;
    eprintln!("reset reached both instances in {took:?}");

    // Block by subject id: both refuse with an honest Retry-After.
    let r = admin_post(
        b,
        "/admin/api/block",
        json!({"limiter": "quota-free", "subject": id, "seconds": 30}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    let took = both_answer(a, b, &key, StatusCode::TOO_MANY_REQUESTS).await;
    eprintln!("block reached both instances in {took:?}");
    for addr in [a, b] {
        let r = quota(addr, &key).await;
        let retry: u64 = r.expect_header("retry-after").parse().unwrap();
        assert!(retry > 0 && retry <= 30, "{r:?}");
    }
    let blocked = json_of(
        &admin_get(
            a,
            // A subject id holds `%` escapes: escaped again in a query.
            &format!(
                "/admin/api/subjects?limiter=quota-free&subject={}",
                id.replace('%', "%25")
            ),
        )
        .await,
    );
    assert!(blocked["blocked_until_ms"].as_u64().is_some(), "{blocked}");
    let r = admin_post(
        a,
        "/admin/api/unblock",
        json!({"limiter": "quota-free", "key": key}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    let took = both_answer(a, b, &key, StatusCode::OK).await;
    eprintln!("unblock reached both instances in {took:?}");

    // Holders: a running generate on `b` is a permit named `generate`.
    let gen_key = unique("gen");
    let k = gen_key.clone();
    let running = tokio::spawn(async move {
        send(
            b,
            Method::POST,
            "/v1/generate?ms=3000",
            &[("x-api-key", &k)],
        )
        .await
    });
    let gen_id = app::subject_of(&gen_key).unwrap().as_encoded().to_owned();
    let holder = eventually(WITHIN, "the permit is listed", || async {
        let h = json_of(&admin_get(a, "/admin/api/holders").await);
        h["holders"]
            .as_array()?
            .iter()
            .find(|h| h["subject"] == gen_id.as_str())
            .cloned()
    })
    .await;
    assert_eq!(holder["kind"], "permit", "{holder}");
    assert_eq!(holder["name"], "generate", "{holder}");
    assert!(
        holder["holder"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{pid_b}")),
        "{holder}"
    );
    assert!(holder["fence"].as_u64().unwrap() > 0, "{holder}");
    assert!(holder["ttl_ms"].as_u64().unwrap() <= 5_000, "{holder}");
    assert_eq!(running.await.unwrap().status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_admin_plane_on_redis() {
    let server = RedisServer::start().unwrap();
    let env = [
        ("REDIS_URL", server.url()),
        ("TOLLGATE_ADMIN_TOKEN", TOKEN.to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = launch("gateway", &env).await;
    let b = launch("gateway", &env).await;
    let pid_b = b.child.id().unwrap();
    admin_contract(a.addr, b.addr, pid_b).await;
    cli_contract(a.addr, b.addr, &["--redis", &server.url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_admin_plane_on_a_cluster() {
    let cluster = RedisCluster::start().unwrap();
    let seeds = cluster
        .nodes()
        .iter()
        .map(|n| n.addr())
        .collect::<Vec<_>>()
        .join(",");
    let env = [
        ("REDIS_CLUSTER", seeds.as_str()),
        ("TOLLGATE_ADMIN_TOKEN", TOKEN),
    ];
    let a = launch("gateway", &env).await;
    let b = launch("gateway", &env).await;
    let pid_b = b.child.id().unwrap();
    admin_contract(a.addr, b.addr, pid_b).await;
    cli_contract(a.addr, b.addr, &["--cluster", &seeds]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_there_is_no_admin() {
    let server = RedisServer::start().unwrap();
    let a = launch("gateway", &[("REDIS_URL", &server.url())]).await;
    for path in ["/admin", "/admin/", "/admin/api/limiters"] {
        let r = send(a.addr, Method::GET, path, &[("authorization", &bearer())]).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {r:?}");
    }
}
