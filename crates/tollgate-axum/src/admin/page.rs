//! The dashboard page, its script and its styles, compiled into the binary:
//! no CDN, no files to deploy, works offline.
//!
//! The page holds no data (it reads the API with the operator's token), so
//! it needs none itself. Everything it shows comes from client input
//! (subject ids, labels, holders), so it renders text only and is served
//! with a Content-Security-Policy that allows nothing but its own script,
//! styles and API.

use axum::extract::OriginalUri;
use axum::response::{IntoResponse, Redirect, Response};
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use http::HeaderValue;

/// The page's policy: its own script, styles and API only; no inline code,
/// no other origin, no framing, no `<base>`.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
connect-src 'self'; img-src 'self'; base-uri 'none'; frame-ancestors 'none'";

const HTML: &str = include_str!("assets/dashboard.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLES: &str = include_str!("assets/dashboard.css");

/// `body` as `content_type`, with the page's security headers.
fn asset(content_type: &'static str, body: impl IntoResponse) -> Response {
    let mut res = body.into_response();
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // A new release's page and script must not mix with a cached one.
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

/// `GET /`: the dashboard. Its script and styles are linked relative to
/// the page, so it works wherever it is mounted: nested at `/admin`, a
/// request for `/admin` (no trailing slash) links `admin/dashboard.js`.
pub(super) async fn index(OriginalUri(uri): OriginalUri) -> Response {
    let base = match uri.path().rsplit_once('/') {
        Some((_, last)) if !last.is_empty() => format!("{}/", escape_attribute(last)),
        _ => String::new(),
    };
    asset("text/html; charset=utf-8", HTML.replace("{{base}}", &base))
}

/// The mount point without its trailing slash sends the browser to the
/// page (relative, so a proxy's prefix is kept).
pub(super) async fn to_page(OriginalUri(uri): OriginalUri) -> Redirect {
    let last = uri.path().rsplit('/').next().unwrap_or_default();
    Redirect::permanent(&format!("{last}/"))
}

/// `s` safe inside a double-quoted HTML attribute.
fn escape_attribute(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `GET /dashboard.js`.
pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /dashboard.css`.
pub(super) async fn styles() -> Response {
    asset("text/css; charset=utf-8", STYLES)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn page_at(path: &str) -> String {
        let res = index(OriginalUri(path.parse().unwrap())).await;
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn assets_are_linked_relative_to_the_mount_point() {
        assert!(page_at("/admin/")
            .await
            .contains(r#"<script src="dashboard.js" defer>"#));
        assert!(page_at("/")
            .await
            .contains(r#"<script src="dashboard.js" defer>"#));
        assert!(page_at("/ops/admin")
            .await
            .contains(r#"<script src="admin/dashboard.js" defer>"#));
        assert!(page_at("/a%22b")
            .await
            .contains(r#"href="a%22b/dashboard.css""#));
    }
}
