//! The bearer token every `/api/*` request must carry.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

use super::api::problem;
use super::AdminRouter;

/// The expected token, kept as its SHA-256: comparing digests takes the
/// same time whatever the presented token's length or content.
#[derive(Clone)]
pub(super) struct Token([u8; 32]);

impl Token {
    pub(super) fn new(token: &str) -> Self {
        Token(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `presented` is the token, in constant time: every byte of
    /// both digests is compared, with no early exit.
    fn matches(&self, presented: &str) -> bool {
        let other: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.0
            .iter()
            .zip(other.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// The credentials of `Authorization: Bearer <token>` (the scheme is
/// case-insensitive, as every HTTP auth scheme).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim())
        .filter(|c| !c.is_empty())
}

/// Lets the request through only with the admin token; otherwise 401 with
/// `WWW-Authenticate: Bearer`.
pub(super) async fn require_token(
    State(admin): State<Arc<AdminRouter>>,
    req: Request,
    next: Next,
) -> Response {
    match bearer(req.headers()) {
        Some(presented) if admin.token.matches(presented) => next.run(req).await,
        presented => {
            let detail = match presented {
                None => "missing bearer token: send Authorization: Bearer <admin token>",
                Some(_) => "wrong admin token",
            };
            tracing::warn!(
                target: "tollgate::admin",
                path = %req.uri().path(),
                token_given = presented.is_some(),
                "admin request refused: no valid bearer token",
            );
            let mut res = problem(StatusCode::UNAUTHORIZED, detail).into_response();
            res.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="tollgate-admin""#),
            );
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_matches() {
        let t = Token::new("s3cret");
        assert!(t.matches("s3cret"));
        assert!(!t.matches("s3cre"));
        assert!(!t.matches("s3cret "));
        assert!(!t.matches(""));
    }

    #[test]
    fn bearer_credentials_are_read_case_insensitively() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("bearer abc"));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&h), None);
    }
}
