//! Key extractors: who or what a request is limited (or locked) under.
//!
//! A [`KeyExtractor`] looks at a request and answers one of three things:
//!
//! - `Ok(Some(subject))`: limit this request under `subject`;
//! - `Ok(None)`: this request is not limited (it passes straight through);
//! - `Err(KeyError)`: the request cannot be keyed; it is answered with the
//!   error's status (400, 401, 500, …) and message, and never reaches the
//!   inner service.
//!
//! Built-ins: [`GlobalKey`] (one shared budget), [`PeerIp`] (the socket
//! peer), [`ClientIp`] (the client behind trusted proxies), [`HeaderKey`] (an
//! API key), [`ExtensionKey`] (an authenticated user id put in the request
//! extensions by an earlier layer), [`RouteKey`] (the matched route), tuples
//! `(A, B)`, `(A, B, C)`, `(A, B, C, D)` (a compound key, e.g. user + route)
//! and [`Or`] (the first extractor that yields a key). Any closure
//! `Fn(&Parts) -> Result<Option<Subject>, KeyError>` that is `Clone +
//! Send + Sync + 'static` is an extractor too.
//!
//! Subjects end up in Redis keys, escaped by [`Subject`]; traces only ever
//! show [`Subject::digest`].

mod cidr;
mod compound;
mod forwarded;
mod header;
mod ip;
mod route;

use std::borrow::Cow;
use std::fmt;

use http::request::Parts;
use http::StatusCode;
use tollgate_core::Subject;

pub use self::cidr::{Cidr, InvalidCidr};
pub use self::compound::Or;
pub use self::forwarded::{ClientIp, ForwardedHeader};
pub use self::header::{hashed_subject, ExtensionKey, HeaderKey};
pub use self::ip::{peer_addr, PeerIp};
pub(crate) use self::route::route_of;
pub use self::route::RouteKey;
#[cfg(feature = "axum")]
pub use self::route::{PathParam, RouteParams};

/// Yields the key a request is limited or locked under.
///
/// Implemented by every built-in extractor of this module, by tuples of
/// extractors (compound keys) and by closures:
///
/// ```
/// use http::{request::Parts, Request};
/// use tollgate::Subject;
/// use tollgate::tower::key::{KeyError, KeyExtractor};
///
/// // Limit by tenant, taken from the path; `/health` is not limited.
/// let by_tenant = |req: &Parts| -> Result<Option<Subject>, KeyError> {
///     if req.uri.path() == "/health" {
///         return Ok(None);
///     }
///     match req.uri.path().split('/').nth(1) {
///         Some(tenant) if !tenant.is_empty() => Ok(Some(Subject::new(tenant))),
///         _ => Err(KeyError::bad_request("no tenant in the path")),
///     }
/// };
///
/// let req = Request::get("/acme/orders").body(()).unwrap().into_parts().0;
/// assert_eq!(by_tenant.extract(&req).unwrap(), Some(Subject::new("acme")));
/// let req = Request::get("/health").body(()).unwrap().into_parts().0;
/// assert_eq!(by_tenant.extract(&req).unwrap(), None);
/// let req = Request::get("/").body(()).unwrap().into_parts().0;
/// assert_eq!(by_tenant.extract(&req).unwrap_err().status(), 400);
/// ```
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key for `req`: `Some` to limit it under that key, `None` to let it
    /// through unlimited, `Err` to refuse it.
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError>;
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Result<Option<Subject>, KeyError> + Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        self(req)
    }
}

/// Why a request could not be keyed; the request is answered with
/// [`KeyError::status`] (mapped to a gRPC status for gRPC requests) and a
/// problem document whose `detail` is [`KeyError::message`].
///
/// ```
/// use http::StatusCode;
/// use tollgate::tower::key::KeyError;
///
/// let e = KeyError::unauthorized("missing API key");
/// assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(e.message(), "missing API key");
/// assert_eq!(e.to_string(), "missing API key");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    status: StatusCode,
    message: Cow<'static, str>,
}

impl KeyError {
    /// An error answered with `status`.
    pub fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        KeyError {
            status,
            message: message.into(),
        }
    }

    /// 400: the request itself is malformed (an unparsable header, …).
    pub fn bad_request(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: the request lacks the credential the key is made of.
    pub fn unauthorized(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 500: the server is misconfigured (a layer that should have run first
    /// did not, the peer address was not recorded, …).
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The HTTP status the request is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message sent as the problem body's `detail` (HTTP) or as
    /// `grpc-message` (gRPC).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KeyError {}

/// One key for every request: a single budget shared by all clients (or one
/// mutex, for a lock).
///
/// ```
/// use http::Request;
/// use tollgate::Subject;
/// use tollgate::tower::key::{GlobalKey, KeyExtractor};
///
/// let req = Request::get("/").body(()).unwrap().into_parts().0;
/// assert_eq!(GlobalKey.extract(&req).unwrap(), Some(Subject::new("global")));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract(&self, _req: &Parts) -> Result<Option<Subject>, KeyError> {
        Ok(Some(Subject::new("global")))
    }
}

/// A subject is a constant key: every request under it (a namespace in a
/// compound, `(Subject::new("job"), PathParam::new("id"))`).
///
/// ```
/// use http::Request;
/// use tollgate::Subject;
/// use tollgate::tower::key::KeyExtractor;
///
/// let (req, ()) = Request::get("/").body(()).unwrap().into_parts();
/// assert_eq!(Subject::new("job").extract(&req).unwrap(), Some(Subject::new("job")));
/// ```
impl KeyExtractor for Subject {
    fn extract(&self, _req: &Parts) -> Result<Option<Subject>, KeyError> {
        Ok(Some(self.clone()))
    }
}

/// A request head from `peer` with `headers`, for the unit tests.
#[cfg(test)]
fn req_from(peer: &str, headers: &[(&str, &str)]) -> Parts {
    let mut b = http::Request::get("/");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let mut req = b.body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<std::net::SocketAddr>().unwrap());
    req.into_parts().0
}

#[cfg(test)]
fn key(k: &impl KeyExtractor, req: &Parts) -> Subject {
    k.extract(req).unwrap().unwrap()
}
