//! Keys from a header ([`HeaderKey`]) or a request extension ([`ExtensionKey`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use http::request::Parts;
use http::HeaderName;
use sha2::{Digest, Sha256};
use tollgate_core::Subject;

use super::{KeyError, KeyExtractor, Or};

/// Keys requests by a header's value: an API key, a tenant id.
///
/// Values are hashed (SHA-256) before they become part of a Redis key, since
/// header values are often secrets; [`HeaderKey::plain`] keeps them readable.
/// A request without the header (or with an empty one) is answered 401,
/// unless the key is [`optional`](HeaderKey::optional) (then it is not
/// limited by this key — combine with [`HeaderKey::or`] to fall back to
/// another key).
///
/// ```
/// use http::Request;
/// use tollgate::Subject;
/// use tollgate::tower::key::{HeaderKey, KeyExtractor};
///
/// let key = HeaderKey::new("x-tenant").plain();
/// let req = Request::get("/").header("x-tenant", "acme").body(()).unwrap().into_parts().0;
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("acme")));
///
/// let req = http::Request::get("/").body(()).unwrap().into_parts().0;
/// assert_eq!(key.extract(&req).unwrap_err().status(), 401);
/// assert_eq!(key.clone().optional().extract(&req).unwrap(), None);
///
/// // Hashed by default: the raw API key never reaches Redis.
/// let req = Request::get("/").header("x-api-key", "s3cr3t").body(()).unwrap().into_parts().0;
/// let subject = HeaderKey::new("x-api-key").extract(&req).unwrap().unwrap();
/// assert!(!subject.as_encoded().contains("s3cr3t"));
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    optional: bool,
    hashed: bool,
}

impl HeaderKey {
    /// Keys by the first value of header `name` (case-insensitive). Panics
    /// if `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("tollgate: {name:?} is not a valid header name"));
        HeaderKey {
            name,
            optional: false,
            hashed: true,
        }
    }

    /// Requests without the header are not limited by this key (instead of
    /// being answered 401).
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Uses the value as it is (escaped), without hashing it.
    pub fn plain(mut self) -> Self {
        self.hashed = false;
        self
    }

    /// Falls back to `other` when this header is absent; implies
    /// [`optional`](HeaderKey::optional).
    pub fn or<O>(self, other: O) -> Or<Self, O> {
        Or::new(self.optional(), other)
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        let value = req
            .headers
            .get(&self.name)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty());
        match value {
            Some(v) if self.hashed => Ok(Some(hashed_subject(v))),
            Some(v) => Ok(Some(Subject::new(v))),
            None if self.optional => Ok(None),
            None => Err(KeyError::unauthorized(format!(
                "missing {} header",
                self.name.as_str()
            ))),
        }
    }
}

/// The subject a hashed [`HeaderKey`] keys `value` by: `h:` and the first
/// 16 bytes of its SHA-256 in hex. For keying a secret (an API key) the
/// same way where it is read otherwise — from an extension, or a raw value
/// an operator looks up.
///
/// ```
/// use tollgate::tower::key::hashed_subject;
///
/// assert_eq!(hashed_subject(b"abc").as_encoded(), "h%3Aba7816bf8f01cfea414140de5dae2223");
/// ```
pub fn hashed_subject(value: &[u8]) -> Subject {
    Subject::new(hash_hex(value))
}

/// `h:` and the first 16 bytes of the value's SHA-256, in lower-case hex,
/// written into one pre-sized String (this runs on every request of a
/// hashed `HeaderKey`; `Subject::new` then escapes it into its own).
fn hash_hex(value: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(value);
    let mut s = String::with_capacity(34);
    s.push_str("h:");
    for &b in &digest[..16] {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

/// Keys requests by a value an earlier layer put in the request extensions,
/// typically the authenticated user's id.
///
/// [`ExtensionKey::new`] formats the value with `Display`;
/// [`ExtensionKey::with`] maps it with a function. A request without the
/// extension is answered 500 (the layer that inserts it did not run first —
/// check the layer order), unless the key is
/// [`optional`](ExtensionKey::optional): then it is not limited by this key
/// (combine with [`ExtensionKey::or`] to fall back, e.g. to the client IP
/// for anonymous requests).
///
/// ```
/// use http::Request;
/// use tollgate::Subject;
/// use tollgate::tower::key::{ExtensionKey, KeyExtractor, PeerIp};
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// let key = ExtensionKey::<UserId>::with(|u| Subject::from(u.0));
/// let mut req = Request::get("/").body(()).unwrap().into_parts().0;
/// req.extensions.insert(UserId(42));
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("42")));
///
/// // Anonymous requests fall back to the peer address.
/// let key = ExtensionKey::<UserId>::with(|u| Subject::from(u.0)).or(PeerIp::new());
/// let mut req = Request::get("/").body(()).unwrap().into_parts().0;
/// req.extensions.insert("192.0.2.1:80".parse::<std::net::SocketAddr>().unwrap());
/// assert_eq!(key.extract(&req).unwrap(), Some(Subject::new("192.0.2.1")));
/// ```
pub struct ExtensionKey<T> {
    map: Arc<dyn Fn(&T) -> Subject + Send + Sync>,
    optional: bool,
    _marker: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T>
where
    T: fmt::Display + Clone + Send + Sync + 'static,
{
    /// Keys by the extension's `Display` form.
    pub fn new() -> Self {
        Self::with(|t: &T| Subject::new(t.to_string()))
    }
}

impl<T> Default for ExtensionKey<T>
where
    T: fmt::Display + Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
{
    /// Keys by `map(extension)`.
    pub fn with(map: impl Fn(&T) -> Subject + Send + Sync + 'static) -> Self {
        ExtensionKey {
            map: Arc::new(map),
            optional: false,
            _marker: PhantomData,
        }
    }

    /// Requests without the extension are not limited by this key (instead
    /// of being answered 500).
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    /// Falls back to `other` when the extension is absent; implies
    /// [`optional`](ExtensionKey::optional).
    pub fn or<O>(self, other: O) -> Or<Self, O> {
        Or::new(self.optional(), other)
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        ExtensionKey {
            map: Arc::clone(&self.map),
            optional: self.optional,
            _marker: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtensionKey")
            .field("type", &std::any::type_name::<T>())
            .field("optional", &self.optional)
            .finish()
    }
}

impl<T> KeyExtractor for ExtensionKey<T>
where
    T: Clone + Send + Sync + 'static,
{
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        match req.extensions.get::<T>() {
            Some(t) => Ok(Some((self.map)(t))),
            None if self.optional => Ok(None),
            None => Err(KeyError::internal(format!(
                "request extension {} is missing; the layer that inserts it must run before this one",
                std::any::type_name::<T>()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::*;

    /// Hashed header keys are stable across releases: they name counters
    /// on a shared backend.
    #[test]
    fn hashed_header_values_are_a_sha256_prefix() {
        assert_eq!(hash_hex(b"abc"), "h:ba7816bf8f01cfea414140de5dae2223");
        let req = req_from("192.0.2.1:1", &[("x-api-key", "abc")]);
        assert_eq!(
            key(&HeaderKey::new("x-api-key"), &req),
            Subject::new("h:ba7816bf8f01cfea414140de5dae2223")
        );
    }

    #[test]
    fn extension_key_missing_is_a_server_error_unless_optional() {
        let req = http::Request::get("/").body(()).unwrap().into_parts().0;
        let k = ExtensionKey::<String>::new();
        assert_eq!(k.extract(&req).unwrap_err().status(), 500);
        assert_eq!(k.optional().extract(&req).unwrap(), None);
    }
}
