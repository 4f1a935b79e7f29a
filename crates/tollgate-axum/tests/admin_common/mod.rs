//! The app the admin tests serve on loopback: a `login` limiter checked
//! through the plain API, an `api` limiter behind a route keyed by a hashed
//! `X-Api-Key` (labelled with its first four characters), and the admin
//! router at `/admin`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use axum::routing;
use axum::Router;
use bytes::Bytes;
use http::request::Parts;
use http::Method;
use tollgate_axum::admin::AdminRouter;
use tollgate_core::admin::Admin;
use tollgate_core::{Algorithm, Backend, MemoryBackend, Quota, RateLimiter, RedisBackend, Subject};
use tollgate_testkit::http::{loopback, Reply};
use tollgate_testkit::{eventually, RedisServer};
use tollgate_tower::key::{HeaderKey, KeyError, KeyExtractor};
use tollgate_tower::RateLimitLayer;

pub(crate) const TOKEN: &str = "test-admin-token-0123456789";
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// The store a test runs on.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Store {
    Memory,
    Redis,
}

fn server() -> &'static RedisServer {
    static S: OnceLock<RedisServer> = OnceLock::new();
    S.get_or_init(|| RedisServer::start().expect("redis-server"))
}

/// A prefix no other test uses, so tests share a server without sharing
/// keys or registries.
fn prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "adm{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) async fn backend(store: Store) -> Backend {
    match store {
        Store::Memory => MemoryBackend::new().into(),
        Store::Redis => RedisBackend::connect(&server().url())
            .await
            .expect("connect to redis-server")
            .into(),
    }
}

/// The `api` route's key: the hashed `X-Api-Key`, labelled with its first
/// four characters (never the whole key).
pub(crate) fn api_key(parts: &Parts) -> Result<Option<Subject>, KeyError> {
    let subject = HeaderKey::new("x-api-key").extract(parts)?;
    let label = parts
        .headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|k| format!("{}…", k.chars().take(4).collect::<String>()));
    Ok(subject.map(|s| match label {
        Some(l) => s.with_label(l),
        None => s,
    }))
}

/// A running app and what the tests check it with.
pub(crate) struct App {
    pub(crate) addr: SocketAddr,
    pub(crate) login: RateLimiter,
    pub(crate) api: RateLimiter,
    pub(crate) admin: Admin,
    pub(crate) backend: Backend,
}

fn limiter(backend: &Backend, prefix: &str, name: &str, quota: Quota) -> RateLimiter {
    RateLimiter::builder(backend.clone(), Algorithm::SlidingWindowLog)
        .quota(quota)
        .prefix(prefix)
        .name(name)
        .build()
        .unwrap()
}

/// Serves the app on a loopback port, once both limiters are registered.
pub(crate) async fn serve(backend: Backend) -> App {
    let prefix = prefix();
    let login = limiter(&backend, &prefix, "login", Quota::per_minute(3));
    let api = limiter(&backend, &prefix, "api", Quota::per_minute(2));
    let admin = Admin::new(backend.clone()).with_prefix(&prefix);
    let admin_router = AdminRouter::new(admin.clone(), TOKEN)
        .unwrap()
        .resolve_header("api", "x-api-key", HeaderKey::new("x-api-key"))
        .mount_at("/admin");
    let app = Router::new()
        .route(
            "/v1/ping",
            routing::get(|| async { "pong" }).layer(RateLimitLayer::new(api.clone()).key(api_key)),
        )
        .merge(admin_router);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    eventually(WAIT, "both limiters register", || async {
        admin.limiters().await.ok().filter(|l| l.len() == 2)
    })
    .await;
    App {
        addr,
        login,
        api,
        admin,
        backend,
    }
}

/// `GET path` with the admin token when `token` says so.
pub(crate) async fn get_with(addr: SocketAddr, path: &str, token: Option<&str>) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    loopback::send(addr, Method::GET, path, &headers).await
}

/// `GET path` with the admin token.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> Reply {
    get_with(addr, path, Some(TOKEN)).await
}

/// `POST path` with `body` (sent as it is) and the admin token.
pub(crate) async fn post_raw(addr: SocketAddr, path: &str, body: &str) -> Reply {
    let auth = format!("Bearer {TOKEN}");
    loopback::send_with(
        addr,
        Method::POST,
        path,
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        None,
        Bytes::from(body.to_owned()),
    )
    .await
}

/// `POST path` with the JSON `body` and the admin token.
pub(crate) async fn post(addr: SocketAddr, path: &str, body: serde_json::Value) -> Reply {
    post_raw(addr, path, &body.to_string()).await
}

/// The reply's JSON body, after checking it is a 200 `application/json`.
pub(crate) fn json(r: &Reply) -> serde_json::Value {
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"))
}

/// The problem document of a refusal with `status`: an `about:blank`
/// problem as every tollgate rejection sends; its `detail`.
pub(crate) fn problem(r: &Reply, status: u16) -> String {
    assert_eq!(r.status, status, "{r:?}");
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["type"], "about:blank", "{v}");
    assert_eq!(v["status"], status, "{v}");
    assert_eq!(v["title"], r.status.canonical_reason().unwrap(), "{v}");
    v["detail"].as_str().expect("a detail").to_owned()
}
