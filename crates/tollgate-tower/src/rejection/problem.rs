//! RFC 9457 problem documents: the idempotency layer's `about:blank`
//! problems and the rate limit's draft-10 `quota-exceeded`.

use http::StatusCode;

use super::QUOTA_EXCEEDED;

/// The draft's title for [`QUOTA_EXCEEDED`] (its example, spelled as in
/// draft-10).
const QUOTA_EXCEEDED_TITLE: &str =
    "Request cannot be satisfied as assigned quota has been exceeded";

/// An `about:blank` problem: `type`, `title` (the status' reason phrase),
/// `status`, `detail`.
pub(super) fn about_blank(status: StatusCode, detail: &str) -> String {
    let title = status.canonical_reason().unwrap_or("Error");
    let mut out = String::with_capacity(80 + detail.len());
    out.push_str(r#"{"type":"about:blank","title":"#);
    push_json_string(&mut out, title);
    out.push_str(&format!(r#","status":{},"detail":"#, status.as_u16()));
    push_json_string(&mut out, detail);
    out.push('}');
    out
}

/// A draft-10 `quota-exceeded` problem (429): `type`, `title`, `status`,
/// `detail` and the extension member `violated-policies`, the names of the
/// `RateLimit-Policy` items whose quota denied.
pub(super) fn quota_exceeded(detail: &str, violated: &[String]) -> String {
    let status = StatusCode::TOO_MANY_REQUESTS;
    let mut out = String::with_capacity(200 + detail.len());
    out.push_str(r#"{"type":"#);
    push_json_string(&mut out, QUOTA_EXCEEDED);
    out.push_str(r#","title":"#);
    push_json_string(&mut out, QUOTA_EXCEEDED_TITLE);
    out.push_str(&format!(r#","status":{},"detail":"#, status.as_u16()));
    push_json_string(&mut out, detail);
    out.push_str(r#","violated-policies":["#);
    for (i, name) in violated.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_string(&mut out, name);
    }
    out.push_str("]}");
    out
}

/// Appends `s` as a JSON string: quoted, `"` and `\` escaped, control
/// characters as `\u00XX` (hand-written: the crate has no JSON dependency
/// and these bodies are a few fixed members).
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}
