//! RFC 9457 problem documents, the HTTP body of every rejection: the rate
//! limit's draft-10 `quota-exceeded` and `about:blank` for all other reasons.

use http::StatusCode;

use super::QUOTA_EXCEEDED;

/// The content type of every rejection body.
pub(super) const CONTENT_TYPE: &str = "application/problem+json";

/// The draft's title for [`QUOTA_EXCEEDED`] (its example, spelled as in
/// draft-10).
const QUOTA_EXCEEDED_TITLE: &str =
    "Request cannot be satisfied as assigned quota has been exceeded";

/// The problem document for a rejection with `status` and `detail`.
///
/// With `violated` (a rate limit's 429), draft-10's `quota-exceeded`
/// problem whose extension member `violated-policies` names the
/// `RateLimit-Policy` items whose quota denied; without, an `about:blank`
/// problem titled with the status' reason phrase.
pub(super) fn document(status: StatusCode, detail: &str, violated: Option<&[String]>) -> String {
    let (kind, title) = match violated {
        Some(_) => (QUOTA_EXCEEDED, QUOTA_EXCEEDED_TITLE),
        None => ("about:blank", status.canonical_reason().unwrap_or("Error")),
    };
    let names: usize = violated.map_or(0, |v| v.iter().map(|n| n.len() + 3).sum());
    let mut out = String::with_capacity(160 + detail.len() + names);
    out.push_str(r#"{"type":"#);
    push_json_string(&mut out, kind);
    out.push_str(r#","title":"#);
    push_json_string(&mut out, title);
    out.push_str(&format!(r#","status":{},"detail":"#, status.as_u16()));
    push_json_string(&mut out, detail);
    if let Some(violated) = violated {
        out.push_str(r#","violated-policies":["#);
        for (i, name) in violated.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_string(&mut out, name);
        }
        out.push(']');
    }
    out.push('}');
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
