//! The IETF draft-10 `RateLimit-Policy` / `RateLimit` headers, the legacy
//! `X-RateLimit-*` headers and `Retry-After`, formatted once for the tower
//! layers and the axum extractors alike.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_core::{Algorithm, Decision, DecisionSource, Quota, RateLimiter};

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset` (seconds from now, rounded up).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Largest Integer a structured field may carry (RFC 9651: 15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Whole seconds in `d`, rounded **up**.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `Retry-After` seconds for a wait of `d`: rounded up, and never 0 (a zero
/// invites an immediate retry that is refused again).
///
/// ```
/// use std::time::Duration;
/// use tollgate_tower::headers::retry_after_secs;
///
/// assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
/// assert_eq!(retry_after_secs(Duration::ZERO), 1);
/// ```
pub fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// The draft-10 `RateLimit-Policy` of a concurrency limit: `permits`
/// requests in flight, in the quota unit `concurrent-requests`, and no
/// window.
///
/// ```
/// use tollgate_tower::headers::concurrency_policy;
///
/// assert_eq!(concurrency_policy("generate", 2), r#""generate";q=2;qu="concurrent-requests""#);
/// ```
pub fn concurrency_policy(name: &str, permits: u32) -> HeaderValue {
    let value = format!("{};q={permits};qu=\"concurrent-requests\"", sf_string(name));
    HeaderValue::from_str(&value).expect("an sf-string and integers are a valid header value")
}

/// The draft-10 `RateLimit-Policy` / `RateLimit` headers of one limiter:
/// one list member per quota, named after the limiter's policy (`-q0`, `-q1`,
/// … with several quotas). `RateLimit-Policy` is fixed per limiter and made
/// once; `RateLimit` is made per decision.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate_core::Error> {
/// use tollgate_core::{MemoryBackend, Quota, RateLimiter};
/// use tollgate_tower::headers::RateLimitHeaders;
///
/// let limiter = RateLimiter::builder(MemoryBackend::new(), tollgate_core::Algorithm::FixedWindow)
///     .quota(Quota::per_minute(100))
///     .name("api")
///     .build()?;
/// let headers = RateLimitHeaders::new(&limiter).for_decision(&limiter.check("k").await?);
/// assert_eq!(headers["ratelimit-policy"], r#""api";q=100;w=60"#);
/// assert!(headers["ratelimit"].to_str().unwrap().starts_with(r#""api";r=99;t="#));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitHeaders {
    items: Vec<String>,
    policy: Option<HeaderValue>,
}

impl RateLimitHeaders {
    /// The formatter for `limiter`'s quotas.
    pub fn new(limiter: &RateLimiter) -> Self {
        let policy = limiter.keyspace().policy();
        let quotas = limiter.quotas();
        let items: Vec<String> = if quotas.len() == 1 {
            vec![sf_string(policy)]
        } else {
            (0..quotas.len())
                .map(|i| sf_string(&format!("{policy}-q{i}")))
                .collect()
        };
        let algorithm = limiter.algorithm();
        let header = quotas
            .iter()
            .zip(&items)
            .map(|(q, item)| {
                let mut s = format!("{item};q={}", sf_integer(algorithm.capacity(q)));
                if let Some(w) = window_secs(algorithm, q) {
                    s.push_str(&format!(";w={}", sf_integer(w)));
                }
                s
            })
            .collect::<Vec<_>>()
            .join(", ");
        RateLimitHeaders {
            policy: HeaderValue::from_str(&header).ok(),
            items,
        }
    }

    /// The `RateLimit-Policy` value.
    pub fn policy(&self) -> Option<&HeaderValue> {
        self.policy.as_ref()
    }

    /// `RateLimit-Policy`, and `RateLimit` when the decision has real
    /// figures: a fail-open decision (the backend was unreachable) reports
    /// the policy only, never made-up remaining counts.
    pub fn for_decision(&self, decision: &Decision) -> HeaderMap {
        DecisionHeaders::new(self, decision, true, false).into_map()
    }

    /// The `RateLimit` value, or `None` for a fail-open decision. Written
    /// into one buffer that becomes the header's bytes without a copy (this
    /// runs on every request).
    pub(crate) fn ratelimit_value(&self, decision: &Decision) -> Option<HeaderValue> {
        if decision.source == DecisionSource::FailOpen {
            return None;
        }
        let mut value = Vec::with_capacity(self.items.iter().map(|i| i.len() + 40).sum());
        let mut digits = itoa::Buffer::new();
        for (i, (q, item)) in decision.quotas.iter().zip(&self.items).enumerate() {
            if i > 0 {
                value.extend_from_slice(b", ");
            }
            value.extend_from_slice(item.as_bytes());
            value.extend_from_slice(b";r=");
            value.extend_from_slice(digits.format(sf_integer(q.remaining)).as_bytes());
            value.extend_from_slice(b";t=");
            value.extend_from_slice(
                digits
                    .format(sf_integer(ceil_secs(q.reset_after)))
                    .as_bytes(),
            );
        }
        HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
    }
}

/// The draft-10 headers for one `decision` of `limiter` (see
/// [`RateLimitHeaders`]; keep one of those to format many decisions).
pub fn rate_limit_headers(limiter: &RateLimiter, decision: &Decision) -> HeaderMap {
    RateLimitHeaders::new(limiter).for_decision(decision)
}

/// The `w` parameter: the quota's window in whole seconds, or `None` when
/// it is not a whole number of seconds (`w` has no sub-second precision, so
/// it is left out rather than misstated). For buckets, the time a full
/// burst takes to refill.
pub(crate) fn window_secs(algorithm: Algorithm, q: &Quota) -> Option<u64> {
    let micros = if algorithm.uses_burst() {
        let num = u128::from(q.period_micros()) * u128::from(q.burst());
        let den = u128::from(q.limit());
        if num % den != 0 {
            return None;
        }
        u64::try_from(num / den).ok()?
    } else {
        q.period_micros()
    };
    (micros > 0 && micros % 1_000_000 == 0).then_some(micros / 1_000_000)
}

/// The rate-limit headers one response gets, made from a decision before it
/// moves into the request's extensions and applied to the response without
/// building a map.
#[derive(Debug, Default)]
pub(crate) struct DecisionHeaders {
    pub(crate) policy: Option<HeaderValue>,
    pub(crate) ratelimit: Option<HeaderValue>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (boxed: rarely on).
    pub(crate) legacy: Option<Box<[HeaderValue; 3]>>,
}

impl DecisionHeaders {
    /// The headers for `decision`: draft-10 when `draft` is on (the policy
    /// only for a fail-open decision, which has no real figures), legacy
    /// when `legacy` is on (never for a fail-open decision).
    pub(crate) fn new(
        formatter: &RateLimitHeaders,
        decision: &Decision,
        draft: bool,
        legacy: bool,
    ) -> Self {
        let (policy, ratelimit) = if draft {
            (
                formatter.policy().cloned(),
                formatter.ratelimit_value(decision),
            )
        } else {
            (None, None)
        };
        let legacy = (legacy && decision.source != DecisionSource::FailOpen).then(|| {
            Box::new([
                HeaderValue::from(decision.limit),
                HeaderValue::from(decision.remaining),
                HeaderValue::from(ceil_secs(decision.reset_after)),
            ])
        });
        DecisionHeaders {
            policy,
            ratelimit,
            legacy,
        }
    }

    /// Adds the headers to `target`: the structured-field lists
    /// (`RateLimit`, `RateLimit-Policy`) are appended, so stacked limiters
    /// each report their own policy; the legacy ones are set only if absent
    /// (the innermost limiter's figures win).
    pub(crate) fn apply(self, target: &mut HeaderMap) {
        if let Some(v) = self.policy {
            target.append(RATELIMIT_POLICY, v);
        }
        if let Some(v) = self.ratelimit {
            target.append(RATELIMIT, v);
        }
        if let Some(legacy) = self.legacy {
            let [limit, remaining, reset] = *legacy;
            for (name, value) in [
                (X_RATELIMIT_LIMIT, limit),
                (X_RATELIMIT_REMAINING, remaining),
                (X_RATELIMIT_RESET, reset),
            ] {
                if !target.contains_key(&name) {
                    target.insert(name, value);
                }
            }
        }
    }

    /// The headers as a map (for a rejection).
    pub(crate) fn into_map(self) -> HeaderMap {
        let mut h = HeaderMap::new();
        self.apply(&mut h);
        h
    }
}

/// A structured-field String: printable ASCII, `"` and `\` escaped; other
/// characters become `_`.
pub(crate) fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// A structured-field Integer, clamped to the 15 digits RFC 9651 allows.
pub(crate) fn sf_integer(n: u64) -> u64 {
    n.min(SF_INTEGER_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_in_whole_seconds_only() {
        let q = Quota::per_minute(100);
        assert_eq!(window_secs(Algorithm::FixedWindow, &q), Some(60));
        assert_eq!(window_secs(Algorithm::TokenBucket, &q), Some(60));
        let q = Quota::per_second(3);
        assert_eq!(window_secs(Algorithm::Gcra, &q), Some(1));
        let q = Quota::per_second(10).with_burst(20).unwrap();
        assert_eq!(window_secs(Algorithm::TokenBucket, &q), Some(2));
        let q = Quota::new(5, Duration::from_millis(500)).unwrap();
        assert_eq!(window_secs(Algorithm::SlidingWindowLog, &q), None);
        let q = Quota::per_second(3).with_burst(2).unwrap();
        assert_eq!(window_secs(Algorithm::Gcra, &q), None);
    }

    #[test]
    fn sf_strings() {
        assert_eq!(sf_string("api"), "\"api\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("é"), "\"_\"");
    }

    #[test]
    fn rounding() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_secs(Duration::from_micros(2_000_001)), 3);
    }
}
