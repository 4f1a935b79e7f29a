//! One request through a tower `Service` (an axum `Router`) in process, with
//! `oneshot`: no socket, no server task.
//!
//! ```no_run
//! # async fn example(app: axum::Router) {
//! use tollgate_testkit::http::in_process::{get, get_from, send};
//! let r = send(&app, get("/")).await;
//! let r = send(&app, get_from("/", "10.0.0.1:5000")).await;
//! # }
//! ```

use std::net::SocketAddr;
use std::time::Instant;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use tower::{Service, ServiceExt};

use super::{reply, Reply};

/// Sends `req` through a clone of `svc` (`oneshot`) and reads the answer
/// whole. Panics if the service fails.
pub async fn send<S, B, RB>(svc: &S, req: Request<B>) -> Reply
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: std::fmt::Debug,
    RB: http_body::Body,
    RB::Error: std::fmt::Debug,
{
    let start = Instant::now();
    let res = svc.clone().oneshot(req).await.unwrap();
    reply(res, start).await
}

/// `GET uri` with an empty body.
pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

/// `GET uri` from `peer` (`"ip:port"`), as axum's `ConnectInfo` would
/// record it for a connection from there.
pub fn get_from(uri: &str, peer: &str) -> Request<Body> {
    let mut req = get(uri);
    req.extensions_mut()
        .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
    req
}
