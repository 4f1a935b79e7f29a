//! What an upstream's response says about waiting: `Retry-After` on a 429
//! or 503, a `RateLimit` list with nothing left, or the common
//! `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, HeaderName, RETRY_AFTER};
use http::response::Parts;
use http::StatusCode;

use crate::rate_limit::decimal;

/// A reset this large is a Unix time (GitHub's `X-RateLimit-Reset`), not a
/// number of seconds from now.
const EPOCH_RESET_FROM: u64 = 1_000_000_000;

/// A reset this large is a Unix time in milliseconds (no time in seconds
/// reaches it before the year 33 000).
const EPOCH_MILLIS_FROM: u64 = 1_000_000_000_000;

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// How long the upstream asks its callers to wait, as of `now`: the longest
/// of what its headers say, or `None` when they ask for no wait.
pub(crate) fn upstream_wait(res: &Parts, now: SystemTime) -> Option<Duration> {
    let told_to_retry = matches!(
        res.status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    );
    // On other statuses `Retry-After` is a redirect's pause, not a limit.
    let retry_after = told_to_retry
        .then(|| retry_after(&res.headers, now))
        .flatten();
    [
        retry_after,
        exhausted_ratelimit(&res.headers),
        exhausted_legacy(&res.headers, now),
    ]
    .into_iter()
    .flatten()
    .filter(|wait| !wait.is_zero())
    .max()
}

/// `Retry-After` (RFC 9110 §10.2.3): delta-seconds or an HTTP-date.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Some(secs) = decimal(value) {
        return Some(Duration::from_secs(secs));
    }
    // Digits beyond any u64: as long as can be (the block is cut anyway).
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::MAX);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    // A date already past asks for no wait.
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The longest `t` of the `RateLimit` items whose `r` is 0
/// (draft-ietf-httpapi-ratelimit-headers: `"name";r=0;t=30`), over every
/// field line; a line that is not a structured-field list says nothing.
fn exhausted_ratelimit(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all(RATELIMIT)
        .iter()
        .filter_map(|v| sfv::Parser::new(v.as_bytes()).parse::<sfv::List>().ok())
        .flatten()
        .filter_map(|entry| match entry {
            sfv::ListEntry::Item(item) => Some(item),
            sfv::ListEntry::InnerList(_) => None,
        })
        .filter_map(|item| {
            let int = |key: &str| {
                let i = item.params.get(key)?.as_integer()?;
                u64::try_from(i64::from(i)).ok()
            };
            (int("r") == Some(0)).then(|| int("t")).flatten()
        })
        .max()
        .map(Duration::from_secs)
}

/// `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` in seconds from now
/// (or, when as large as a Unix time, the instant of the reset, in seconds
/// or milliseconds).
fn exhausted_legacy(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let remaining = decimal(headers.get(X_REMAINING)?.to_str().ok()?.trim())?;
    if remaining != 0 {
        return None;
    }
    let reset = headers.get(X_RESET)?.to_str().ok()?.trim();
    let Some(reset) = decimal(reset) else {
        // Digits beyond any u64: as far off as can be (the block is cut).
        let digits = !reset.is_empty() && reset.bytes().all(|b| b.is_ascii_digit());
        return digits.then_some(Duration::MAX);
    };
    if reset < EPOCH_RESET_FROM {
        return Some(Duration::from_secs(reset));
    }
    let since_epoch = if reset >= EPOCH_MILLIS_FROM {
        Duration::from_millis(reset)
    } else {
        Duration::from_secs(reset)
    };
    let at = UNIX_EPOCH.checked_add(since_epoch)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, headers: &[(&str, &str)]) -> Parts {
        let mut res = http::Response::builder().status(status);
        for (k, v) in headers {
            res = res.header(*k, *v);
        }
        res.body(()).unwrap().into_parts().0
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    const NOW: u64 = 1_750_000_000;

    fn wait(status: u16, headers: &[(&str, &str)]) -> Option<u64> {
        upstream_wait(&head(status, headers), at(NOW)).map(|d| d.as_secs())
    }

    #[test]
    fn retry_after_counts_on_429_and_503_only() {
        assert_eq!(wait(429, &[("retry-after", "2")]), Some(2));
        assert_eq!(wait(503, &[("retry-after", "120")]), Some(120));
        assert_eq!(wait(200, &[("retry-after", "2")]), None);
        // More seconds than a u64 holds: the longest wait, not none.
        let huge = "99999999999999999999999";
        assert_eq!(wait(429, &[("retry-after", huge)]), Some(u64::MAX));
        assert_eq!(wait(301, &[("retry-after", "2")]), None);
        assert_eq!(wait(429, &[]), None);
        for bad in ["", "0", "-1", "+2", "1.5", "soon", "2 s"] {
            assert_eq!(wait(429, &[("retry-after", bad)]), None, "{bad:?}");
        }
    }

    #[test]
    fn retry_after_as_an_http_date() {
        let date = httpdate::fmt_http_date(at(NOW + 90));
        assert_eq!(wait(429, &[("retry-after", &date)]), Some(90));
        // The obsolete forms RFC 9110 still asks recipients to accept.
        let rfc850 = "Sunday, 15-Jun-25 15:08:20 GMT";
        let asctime = "Sun Jun 15 15:08:20 2025";
        let expected = httpdate::parse_http_date("Sun, 15 Jun 2025 15:08:20 GMT").unwrap();
        let secs = expected.duration_since(at(NOW)).unwrap().as_secs();
        assert_eq!(wait(429, &[("retry-after", rfc850)]), Some(secs));
        assert_eq!(wait(429, &[("retry-after", asctime)]), Some(secs));
        let past = httpdate::fmt_http_date(at(NOW - 5));
        assert_eq!(wait(429, &[("retry-after", &past)]), None);
    }

    #[test]
    fn an_exhausted_ratelimit_item_asks_for_its_reset() {
        assert_eq!(wait(200, &[("ratelimit", r#""rpm";r=0;t=30"#)]), Some(30));
        assert_eq!(wait(200, &[("ratelimit", r#""rpm";r=1;t=30"#)]), None);
        // Of several items, the exhausted ones; the longest of them.
        let list = r#""a;b,c";r=5;t=90, "tpm";r=0;t=12, "day";r=0;t=40"#;
        assert_eq!(wait(200, &[("ratelimit", list)]), Some(40));
        // Several field lines, and a 429 whose Retry-After is shorter.
        let res = [
            ("ratelimit", r#""x";r=3;t=1"#),
            ("ratelimit", r#""y";r=0;t=7"#),
            ("retry-after", "2"),
        ];
        assert_eq!(wait(429, &res), Some(7));
        for bad in [
            r#""x";r=0"#,
            r#""x";r=0;t=-1"#,
            r#""x";r=0;t=0"#,
            "garbage",
            "",
        ] {
            assert_eq!(wait(200, &[("ratelimit", bad)]), None, "{bad:?}");
        }
    }

    #[test]
    fn legacy_remaining_zero_asks_for_the_reset() {
        let h = |remaining, reset| {
            [
                ("x-ratelimit-remaining", remaining),
                ("x-ratelimit-reset", reset),
            ]
        };
        assert_eq!(wait(200, &h("0", "15")), Some(15));
        assert_eq!(wait(200, &h("3", "15")), None);
        // A Unix time (GitHub's form).
        let epoch = (NOW + 60).to_string();
        assert_eq!(wait(403, &h("0", &epoch)), Some(60));
        // Beyond a u64: the longest wait.
        assert_eq!(
            wait(200, &h("0", "99999999999999999999999")),
            Some(u64::MAX)
        );
        // A Unix time in milliseconds.
        let millis = ((NOW + 60) * 1000).to_string();
        assert_eq!(wait(200, &h("0", &millis)), Some(60));
        assert_eq!(wait(200, &h("0", "1.5")), None);
        assert_eq!(wait(200, &[("x-ratelimit-remaining", "0")]), None);
    }
}
