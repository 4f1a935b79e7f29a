//! Sending HTTP requests in tests and reading the answers whole (feature
//! `http`).
//!
//! * [`Reply`]: a response read whole (status, headers, body as text, and
//!   how long it took).
//! * [`loopback`]: a real HTTP/1 client over loopback TCP, to a server
//!   started with `axum::serve` (or any other server, or an example binary).
//! * [`in_process`]: one request through a tower `Service` (an axum
//!   `Router`) with `oneshot`, no socket.
//!
//! These helpers know nothing of tollgate: they are plain HTTP.

pub mod in_process;
pub mod loopback;

use std::time::Duration;

use http::{HeaderMap, StatusCode};

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body as text (bytes that are not UTF-8 become U+FFFD).
    pub body: String,
    /// From sending the request to the end of the body.
    pub elapsed: Duration,
}

impl Reply {
    /// A header as a string, `None` if absent; panics if it is not visible
    /// ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// A header as a string; panics if it is absent or not visible ASCII.
    pub fn expect_header(&self, name: &str) -> &str {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} header on {self:?}"))
    }

    /// `Retry-After` as whole seconds; panics if it is missing or not a
    /// whole number of seconds. The same as [`retry_after`].
    pub fn retry_after(&self) -> u64 {
        let v = self
            .headers
            .get("retry-after")
            .unwrap_or_else(|| panic!("no Retry-After on {self:?}"));
        v.to_str()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("Retry-After {v:?} is not whole seconds"))
    }
}

/// `Retry-After` of `r` as whole seconds; panics if it is missing or not a
/// whole number of seconds. The same as [`Reply::retry_after`].
pub fn retry_after(r: &Reply) -> u64 {
    r.retry_after()
}

/// The reply of `res`, whose request was sent at `start`: its body read
/// whole as text (bytes that are not UTF-8 become U+FFFD).
async fn reply<B>(res: http::Response<B>, start: std::time::Instant) -> Reply
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    use http_body_util::BodyExt;
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        elapsed: start.elapsed(),
    }
}
