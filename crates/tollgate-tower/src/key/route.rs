//! Keys by route: [`RouteKey`].

use http::request::Parts;
use tollgate_core::Subject;

use super::{KeyError, KeyExtractor};

/// Keys requests by their route: axum's `MatchedPath` (`/users/{id}`, with
/// feature `axum`), else the URI path. Optionally prefixed by the method.
///
/// Combine it with a client key for per-client, per-route limits:
/// `(PeerIp::new(), RouteKey::new())`. Note that without a `MatchedPath`
/// (outside an axum router, or in a fallback) the raw path is used, whose
/// values the client chooses.
///
/// ```
/// use http::Request;
/// use tollgate::Subject;
/// use tollgate::tower::key::{KeyExtractor, RouteKey};
///
/// let req = Request::post("/orders?x=1").body(()).unwrap().into_parts().0;
/// assert_eq!(RouteKey::new().extract(&req).unwrap(), Some(Subject::new("/orders")));
/// assert_eq!(
///     RouteKey::new().with_method().extract(&req).unwrap(),
///     Some(Subject::compound(["POST", "/orders"])),
/// );
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteKey {
    method: bool,
}

impl RouteKey {
    /// Keys by the route (or path).
    pub fn new() -> Self {
        Self::default()
    }

    /// Keys by method and route, so `GET /x` and `POST /x` are apart.
    pub fn with_method(mut self) -> Self {
        self.method = true;
        self
    }
}

/// The route of `req`: axum's `MatchedPath` (with feature `axum`), else the
/// URI path.
pub(crate) fn route_of(req: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(m) = req.extensions.get::<axum::extract::MatchedPath>() {
        return m.as_str();
    }
    req.uri.path()
}

impl KeyExtractor for RouteKey {
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        let path = route_of(req);
        Ok(Some(if self.method {
            Subject::compound([req.method.as_str(), path])
        } else {
            Subject::new(path)
        }))
    }
}

/// The route template axum matched (`/jobs/{id}`), or a 500 explaining
/// what is missing.
#[cfg(feature = "axum")]
fn matched(req: &Parts) -> Result<&str, KeyError> {
    req.extensions
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str())
        .ok_or_else(|| {
            KeyError::internal(
                "path parameters need axum's MatchedPath: use the key inside an axum Router",
            )
        })
}

/// The captures of the request's path under `template`, in order: `(name,
/// decoded value)`. Inside a router mounted with `Router::nest`, the
/// template is the whole route (`/api/jobs/{id}`) while the request's URI
/// has lost the prefix (`/jobs/7`): the path axum first saw
/// (`OriginalUri`) is tried before it, and the one the template matches is
/// taken. A 500 when neither does.
#[cfg(feature = "axum")]
fn request_captures<'t>(
    template: &'t str,
    req: &Parts,
) -> Result<Vec<(&'t str, Vec<u8>)>, KeyError> {
    let original = req
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map(|u| u.0.path());
    original
        .into_iter()
        .chain([req.uri.path()])
        .find_map(|path| captures(template, path))
        .ok_or_else(|| {
            KeyError::internal(format!(
                "the request's path {} does not match its route {template}",
                req.uri.path()
            ))
        })
}

/// The captures of `path` under `template`, in order, or `None` when the
/// template does not match it (another fixed segment, another number of
/// segments). `{name}` takes one segment, `{*name}` the rest of the path.
/// Values are percent-decoded, as axum's `Path` extractor decodes them, so
/// `/jobs/a%7B` and `/jobs/a{` name the same resource.
#[cfg(feature = "axum")]
fn captures<'t>(template: &'t str, path: &str) -> Option<Vec<(&'t str, Vec<u8>)>> {
    let decode = |s: &str| percent_encoding::percent_decode_str(s).collect::<Vec<u8>>();
    let mut out = Vec::new();
    let mut segments = path.split('/');
    for part in template.split('/') {
        // `{name}` with fixed text around it, or none: `/user_{id}.json`.
        let Some((before, name, after)) = parameter(part) else {
            if decode(segments.next()?) != part.as_bytes() {
                return None;
            }
            continue;
        };
        if let Some(rest) = name.strip_prefix('*') {
            let tail: Vec<&str> = segments.by_ref().collect();
            out.push((rest, decode(&tail.join("/"))));
            break;
        }
        let segment = decode(segments.next()?);
        let value = segment
            .strip_prefix(before.as_bytes())?
            .strip_suffix(after.as_bytes())?;
        out.push((name, value.to_vec()));
    }
    segments.next().is_none().then_some(out)
}

/// A template segment's parameter: the fixed text before it, its name and
/// the fixed text after it; `None` for a fixed segment.
#[cfg(feature = "axum")]
fn parameter(part: &str) -> Option<(&str, &str, &str)> {
    let open = part.find('{')?;
    let close = open + part[open..].find('}')?;
    Some((&part[..open], &part[open + 1..close], &part[close + 1..]))
}

/// Keys requests by one path parameter of the matched axum route: the
/// decoded value of `{id}` in `/jobs/{id}` (feature `axum`).
///
/// A route without that parameter is answered 500 (a misconfiguration). Put
/// the kind of resource in the key (a [`LockLayer`](crate::LockLayer)
/// namespace, or a compound with a constant) so that two kinds of resource
/// with the same id never share a lock or a budget.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use axum::{body::Body, routing::get, Router};
/// use http::{request::Parts, Request};
/// use tollgate::Subject;
/// use tollgate::tower::key::{KeyExtractor, PathParam};
/// use tower::ServiceExt;
///
/// let app = Router::new().route(
///     "/tenants/{tenant}/jobs/{id}",
///     get(|parts: Parts| async move {
///         let key = PathParam::new("id").extract(&parts).unwrap();
///         assert_eq!(key, Some(Subject::new("a b")));
///     }),
/// );
/// let req = Request::get("/tenants/acme/jobs/a%20b").body(Body::empty()).unwrap();
/// assert_eq!(app.oneshot(req).await.unwrap().status(), 200);
/// # }
/// ```
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathParam {
    name: std::sync::Arc<str>,
}

#[cfg(feature = "axum")]
impl PathParam {
    /// The parameter `name` (`"id"` for `{id}`, `"rest"` for `{*rest}`).
    pub fn new(name: &str) -> Self {
        PathParam {
            name: std::sync::Arc::from(name),
        }
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl KeyExtractor for PathParam {
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        let template = matched(req)?;
        request_captures(template, req)?
            .into_iter()
            .find(|(name, _)| *name == &*self.name)
            .map(|(_, value)| Some(Subject::new(value)))
            .ok_or_else(|| {
                KeyError::internal(format!(
                    "the route {template} has no {{{}}} path parameter",
                    self.name
                ))
            })
    }
}

/// Keys requests by the matched axum route and the decoded values of all
/// its path parameters: `/jobs/{id}` requested as `/jobs/7` keys as
/// (`/jobs/{id}`, `7`). The ready-made resource for "one lock (or budget)
/// per thing the URL names" (feature `axum`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use axum::{body::Body, routing::post, Router};
/// use http::{request::Parts, Request};
/// use tollgate::Subject;
/// use tollgate::tower::key::{KeyExtractor, RouteParams};
/// use tower::ServiceExt;
///
/// let app = Router::new().route(
///     "/jobs/{id}",
///     post(|parts: Parts| async move {
///         let key = RouteParams.extract(&parts).unwrap();
///         assert_eq!(key, Some(Subject::compound(["/jobs/{id}", "7"])));
///     }),
/// );
/// let req = Request::post("/jobs/7").body(Body::empty()).unwrap();
/// assert_eq!(app.oneshot(req).await.unwrap().status(), 200);
/// # }
/// ```
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteParams;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl KeyExtractor for RouteParams {
    fn extract(&self, req: &Parts) -> Result<Option<Subject>, KeyError> {
        let template = matched(req)?;
        let values = request_captures(template, req)?;
        let parts =
            std::iter::once(template.as_bytes()).chain(values.iter().map(|(_, v)| v.as_slice()));
        Ok(Some(Subject::compound(parts)))
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests {
    use super::*;

    #[test]
    fn captures_follow_the_template() {
        let c = |t, p| {
            captures(t, p)
                .unwrap()
                .into_iter()
                .map(|(n, v)| (n, String::from_utf8(v).unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(c("/jobs/{id}", "/jobs/7"), [("id", "7".to_owned())]);
        assert_eq!(
            c("/t/{tenant}/jobs/{id}", "/t/acme/jobs/a%7Bb%7D%3Ac"),
            [("tenant", "acme".to_owned()), ("id", "a{b}:c".to_owned())]
        );
        assert_eq!(
            c("/files/{*rest}", "/files/a/b%20c"),
            [("rest", "a/b c".to_owned())]
        );
        assert!(c("/health", "/health").is_empty());
        assert!(c("/files/{*rest}", "/files/").len() == 1);
    }

    /// A template matches a path only with the same fixed segments and the
    /// same number of segments: a nested router's stripped path does not
    /// match the whole route's template.
    #[test]
    fn a_template_matches_only_its_own_paths() {
        assert!(captures("/api/jobs/{id}", "/jobs/7").is_none());
        assert!(captures("/api/jobs/{id}", "/api/jobs/7").is_some());
        assert!(captures("/jobs/{id}", "/jobs/7/extra").is_none());
        assert!(captures("/jobs/{id}", "/jobs").is_none());
        assert!(captures("/{tenant}/jobs/{id}", "/jobs/7").is_none());
        // A parameter with fixed text around it in its segment.
        let c = captures("/users/user_{id}.json", "/users/user_7.json").unwrap();
        assert_eq!(c, [("id", b"7".to_vec())]);
        assert!(captures("/users/user_{id}.json", "/users/admin_7.json").is_none());
    }
}
