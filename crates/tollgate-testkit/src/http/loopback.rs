//! A real HTTP/1 client over loopback TCP.
//!
//! ```no_run
//! # async fn example(addr: std::net::SocketAddr) {
//! use tollgate_testkit::http::loopback;
//! let r = loopback::get(addr, "/").await;
//! assert_eq!(r.status, http::StatusCode::OK);
//! let r = loopback::send(addr, http::Method::GET, "/me", &[("x-user", "ann")]).await;
//! # }
//! ```

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{reply, Reply};

/// How long a request may go unanswered before the test panics (a hang).
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends one request to `addr` on a new connection and reads the answer
/// whole.
///
/// * `headers`: added to the request in order.
/// * `from`: the local address to connect from (a loopback address such as
///   127.0.0.2, so that the server sees another client IP), or the default.
/// * `body`: the request body (empty: `Bytes::new()`).
///
/// Panics if the request fails or is not answered within 30 s.
pub async fn send_with(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    from: Option<IpAddr>,
    body: Bytes,
) -> Reply {
    let mut connector = HttpConnector::new();
    connector.set_local_address(from);
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body)).unwrap();
    let start = Instant::now();
    let res = tokio::time::timeout(TIMEOUT, client.request(req))
        .await
        .unwrap_or_else(|_| panic!("no answer to {path} within {TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("request to {addr}{path} failed: {e}"));
    reply(res, start).await
}

/// `method path` with `headers` and an empty body, from the default address.
pub async fn send(addr: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)]) -> Reply {
    send_with(addr, method, path, headers, None, Bytes::new()).await
}

/// `method path` with no headers and an empty body, from `from` (see
/// [`send_with`]) or the default address.
pub async fn send_from(
    from: Option<IpAddr>,
    addr: SocketAddr,
    method: Method,
    path: &str,
) -> Reply {
    send_with(addr, method, path, &[], from, Bytes::new()).await
}

/// `GET path`, no headers, empty body.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::GET, path, &[]).await
}

/// `POST path`, no headers, empty body.
pub async fn post(addr: SocketAddr, path: &str) -> Reply {
    send(addr, Method::POST, path, &[]).await
}
