//! The IETF draft-10 `RateLimit-Policy` / `RateLimit` headers, the legacy
//! `X-RateLimit-*` headers and `Retry-After`, formatted once for the tower
//! layers and the axum extractors alike.
//!
//! Which fields a response carries is a [`HeaderFormat`]; each format is one
//! row of a table of field writers:
//!
//! | format | fields | merged with a stacked limiter's |
//! |---|---|---|
//! | [`Draft10`](HeaderFormat::Draft10) (default) | `RateLimit-Policy` (made once per limiter; `qu` with a [quota unit](RateLimitHeaders::quota_unit)), `RateLimit` (`r`, `t`) | appended: each limiter reports its policy |
//! | [`Legacy`](HeaderFormat::Legacy) | `X-RateLimit-Limit`, `-Remaining`, `-Reset` (seconds, rounded up) of the strictest quota | set if absent: the innermost figures win |
//!
//! A decision that failed open (the backend was unreachable) gets the
//! fields made once per limiter only, never made-up figures. A fallback
//! decision (the store down, this instance's share of the limit deciding)
//! reports that share as its `RateLimit-Policy`.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_core::{Algorithm, Decision, DecisionSource, Quota, RateLimiter};

mod format;

pub(crate) use self::format::DecisionHeaders;
pub use self::format::HeaderFormat;
use self::format::{Name, Write, FORMATS};

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
    // Saturating: the longest wait rounds to u64::MAX, never wraps to 0.
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `Retry-After` seconds for a wait of `d`: rounded up, and never 0 (a zero
/// invites an immediate retry that is refused again).
///
/// ```
/// use std::time::Duration;
/// use tollgate::tower::headers::retry_after_secs;
///
/// assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
/// assert_eq!(retry_after_secs(Duration::ZERO), 1);
/// // The longest wait saturates instead of wrapping round to "retry now".
/// assert_eq!(retry_after_secs(Duration::new(u64::MAX, 1)), u64::MAX);
/// ```
pub fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// The draft-10 `RateLimit-Policy` of a concurrency limit: `permits`
/// requests in flight, in the quota unit `concurrent-requests`, and no
/// window.
///
/// ```
/// use tollgate::tower::headers::concurrency_policy;
///
/// assert_eq!(concurrency_policy("generate", 2), r#""generate";q=2;qu="concurrent-requests""#);
/// ```
pub fn concurrency_policy(name: &str, permits: u32) -> HeaderValue {
    let value = format!("{};q={permits};qu=\"concurrent-requests\"", sf_string(name));
    HeaderValue::from_str(&value).expect("an sf-string and integers are a valid header value")
}

/// The rate-limit headers of one limiter, in one [`HeaderFormat`]
/// (default draft-10): one list member per quota, named after the
/// limiter's policy (`-q0`, `-q1`, … with several quotas).
/// `RateLimit-Policy` is fixed per limiter and made once; `RateLimit` is
/// made per decision.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{MemoryBackend, Quota, RateLimiter};
/// use tollgate::tower::headers::{HeaderFormat, RateLimitHeaders};
///
/// let limiter = RateLimiter::builder(MemoryBackend::new(), tollgate::Algorithm::FixedWindow)
///     .quota(Quota::per_minute(100))
///     .name("api")
///     .build()?;
/// let headers = RateLimitHeaders::new(&limiter).for_decision(&limiter.check("k").await?);
/// assert_eq!(headers["ratelimit-policy"], r#""api";q=100;w=60"#);
/// assert!(headers["ratelimit"].to_str().unwrap().starts_with(r#""api";r=99;t="#));
///
/// // Cost-weighted: the quota counts bytes, not requests.
/// let bytes = RateLimitHeaders::new(&limiter).quota_unit("content-bytes");
/// assert_eq!(bytes.policy().unwrap(), r#""api";q=100;qu="content-bytes";w=60"#);
///
/// let legacy = RateLimitHeaders::new(&limiter).format(HeaderFormat::Legacy);
/// let headers = legacy.for_decision(&limiter.check("k").await?);
/// assert_eq!(headers["x-ratelimit-remaining"], "98");
/// assert!(!headers.contains_key("ratelimit"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitHeaders {
    /// One structured-field String per quota (`"api"`, or `"api-q0"`, …).
    items: Vec<String>,
    /// Each quota's policy: its name as an sf-parser reads the item, `q`, `w`.
    policies: Vec<Policy>,
    /// The quota unit (`qu`), when not requests.
    unit: Option<String>,
    /// The limiter's algorithm: a fallback share's windows are its.
    algorithm: Algorithm,
    format: HeaderFormat,
    /// The [`Write::Fixed`] fields of every format, made once:
    /// `fixed[row][field]`, rows as in [`FORMATS`].
    fixed: Vec<Box<[Option<HeaderValue>]>>,
}

/// One quota's policy, as the fields report it.
#[derive(Debug, Clone)]
struct Policy {
    /// The name an sf-parser reads from the item (and `violated-policies`
    /// lists).
    name: String,
    q: u64,
    w: Option<u64>,
}

impl RateLimitHeaders {
    /// The formatter for `limiter`'s quotas, in [`HeaderFormat::Draft10`],
    /// counted in requests.
    pub fn new(limiter: &RateLimiter) -> Self {
        let policy = limiter.keyspace().policy();
        let quotas = limiter.quotas();
        let names: Vec<String> = if quotas.len() == 1 {
            vec![printable(policy)]
        } else {
            (0..quotas.len())
                .map(|i| printable(&format!("{policy}-q{i}")))
                .collect()
        };
        let algorithm = limiter.algorithm();
        let policies = quotas
            .iter()
            .zip(names)
            .map(|(q, name)| Policy {
                name,
                q: algorithm.capacity(q),
                w: window_secs(algorithm, q),
            })
            .collect::<Vec<_>>();
        RateLimitHeaders {
            items: policies.iter().map(|p| sf_string(&p.name)).collect(),
            policies,
            unit: None,
            algorithm,
            format: HeaderFormat::default(),
            fixed: Vec::new(),
        }
        .prepared()
    }

    /// The same formatter writing `format` (default
    /// [`HeaderFormat::Draft10`]).
    pub fn format(mut self, format: HeaderFormat) -> Self {
        self.format = format;
        self
    }

    /// The quotas count `unit`s rather than requests (a cost-weighted
    /// limit): `RateLimit-Policy` says `qu="<unit>"`. The draft registers
    /// `requests` (the default, never written), `content-bytes` and
    /// `concurrent-requests`; another name is an extension a client may
    /// not know. Characters outside printable ASCII become `_`.
    ///
    /// ```
    /// # fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{MemoryBackend, Quota, RateLimiter};
    /// use tollgate::tower::headers::RateLimitHeaders;
    ///
    /// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_second(1000))?;
    /// let h = RateLimitHeaders::new(&limiter).quota_unit("tokens");
    /// assert!(h.policy().unwrap().to_str().unwrap().ends_with(r#";q=1000;qu="tokens";w=1"#));
    /// assert_eq!(h.unit(), Some("tokens"));
    /// # Ok(()) }
    /// ```
    pub fn quota_unit(mut self, unit: &str) -> Self {
        self.unit = (unit != "requests").then(|| printable(unit));
        self.prepared()
    }

    /// The same format and quota unit for another limiter's quotas.
    ///
    /// ```
    /// # fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{MemoryBackend, Quota, RateLimiter};
    /// use tollgate::tower::headers::{HeaderFormat, RateLimitHeaders};
    ///
    /// let free = RateLimiter::gcra(MemoryBackend::new(), Quota::per_minute(10))?;
    /// let pro = RateLimiter::gcra(MemoryBackend::new(), Quota::per_minute(100))?;
    /// let h = RateLimitHeaders::new(&free).format(HeaderFormat::Legacy).for_limiter(&pro);
    /// assert_eq!(h.header_format(), HeaderFormat::Legacy);
    /// # Ok(()) }
    /// ```
    pub fn for_limiter(&self, limiter: &RateLimiter) -> Self {
        let fresh = RateLimitHeaders::new(limiter).format(self.format);
        match &self.unit {
            Some(unit) => fresh.quota_unit(unit),
            None => fresh,
        }
    }

    /// The format written.
    pub fn header_format(&self) -> HeaderFormat {
        self.format
    }

    /// The quota unit, when not requests.
    pub fn unit(&self) -> Option<&str> {
        self.unit.as_deref()
    }

    /// The policy names, one per quota, as the `RateLimit-Policy` items
    /// read and the problem body's `violated-policies` lists them.
    ///
    /// ```
    /// # fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{Algorithm, MemoryBackend, Quota, RateLimiter};
    /// use tollgate::tower::headers::RateLimitHeaders;
    ///
    /// let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
    ///     .quota(Quota::per_second(2))
    ///     .quota(Quota::per_hour(100))
    ///     .name("api")
    ///     .build()?;
    /// assert_eq!(RateLimitHeaders::new(&limiter).policy_names().collect::<Vec<_>>(), ["api-q0", "api-q1"]);
    /// # Ok(()) }
    /// ```
    pub fn policy_names(&self) -> impl Iterator<Item = &str> {
        self.policies.iter().map(|p| p.name.as_str())
    }

    /// The names of the policies whose quotas denied `decision` (every
    /// policy when no quota says it denied: the decision was not made
    /// quota by quota).
    pub(crate) fn violated_policies(&self, decision: &Decision) -> Vec<String> {
        let denied: Vec<String> = decision
            .quotas
            .iter()
            .zip(self.policy_names())
            .filter(|(q, _)| !q.allowed)
            .map(|(_, name)| name.to_owned())
            .collect();
        if denied.is_empty() {
            self.policy_names().map(str::to_owned).collect()
        } else {
            denied
        }
    }

    /// Makes the [`Write::Fixed`] fields of every format.
    fn prepared(mut self) -> Self {
        self.fixed = FORMATS
            .iter()
            .map(|(_, fields)| {
                fields
                    .iter()
                    .map(|f| match f.write {
                        Write::Fixed(make) => make(&self),
                        Write::PerDecision(_) => None,
                    })
                    .collect()
            })
            .collect();
        self
    }

    /// The `RateLimit-Policy` value, when the format writes one.
    pub fn policy(&self) -> Option<&HeaderValue> {
        let row = self.format.row();
        self.format
            .fields()
            .iter()
            .position(|f| f.name == Name::RateLimitPolicy)
            .and_then(|i| self.fixed[row][i].as_ref())
    }

    /// The format's headers for `decision`: a fail-open decision (the
    /// backend was unreachable) gets the fixed ones only (the policy),
    /// never made-up remaining counts; a fallback decision's policy is
    /// the local share it was counted on.
    pub fn for_decision(&self, decision: &Decision) -> HeaderMap {
        DecisionHeaders::new(self, decision, true, false).into_map()
    }

    /// The same formatter with the quotas a fallback decision was taken
    /// on (this instance's share, while the store is down): its
    /// `RateLimit-Policy` then names the limit `RateLimit` counts against.
    pub(crate) fn for_share(&self, decision: &Decision) -> RateLimitHeaders {
        let mut share = self.clone();
        for (p, q) in share.policies.iter_mut().zip(decision.quotas.iter()) {
            p.q = q.limit;
            p.w = window_secs(self.algorithm, &q.quota);
        }
        share
    }

    /// Adds the format's fixed fields (`RateLimit-Policy`) to `target`:
    /// what a response without a decision (a cost beyond capacity) reports.
    pub(crate) fn apply_fixed(&self, target: &mut HeaderMap) {
        let row = self.format.row();
        for (field, value) in self.format.fields().iter().zip(&self.fixed[row][..]) {
            if let Some(value) = value {
                target.insert(field.name.header(), value.clone());
            }
        }
    }

    /// The `RateLimit` value, or `None` for a fail-open decision. Written
    /// into one buffer of exactly its length, which becomes the header's
    /// bytes without a copy: one allocation per request (this runs on
    /// every request; a buffer with room to spare costs a second one).
    pub(crate) fn ratelimit_value(&self, decision: &Decision) -> Option<HeaderValue> {
        if decision.source == DecisionSource::FailOpen {
            return None;
        }
        let members = || {
            decision.quotas.iter().zip(&self.items).map(|(q, item)| {
                let r = sf_integer(q.remaining);
                let t = sf_integer(ceil_secs(q.next_after));
                (item, r, t)
            })
        };
        let (mut r_digits, mut t_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
        let len: usize = members()
            .enumerate()
            .map(|(i, (item, r, t))| {
                let separator = if i > 0 { 2 } else { 0 };
                separator + item.len() + 6 + r_digits.format(r).len() + t_digits.format(t).len()
            })
            .sum();
        let mut value = Vec::with_capacity(len);
        for (i, (item, r, t)) in members().enumerate() {
            if i > 0 {
                value.extend_from_slice(b", ");
            }
            value.extend_from_slice(item.as_bytes());
            value.extend_from_slice(b";r=");
            value.extend_from_slice(r_digits.format(r).as_bytes());
            value.extend_from_slice(b";t=");
            value.extend_from_slice(t_digits.format(t).as_bytes());
        }
        debug_assert_eq!(value.len(), len);
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

/// `s` with every character outside printable ASCII replaced by `_`: what
/// [`sf_string`] writes, unquoted and unescaped — the name an sf-parser
/// reads back.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
        .collect()
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
    use tollgate_core::MemoryBackend;

    async fn checked(name: &str) -> (RateLimiter, Decision) {
        let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
            .quota(Quota::per_minute(3))
            .name(name)
            .build()
            .unwrap();
        let d = limiter.check("k").await.unwrap();
        (limiter, d)
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        h.keys().map(|k| k.as_str()).collect()
    }

    /// Each format's row is its own in the table of formats.
    #[test]
    fn each_format_reads_its_own_row() {
        for (i, (format, _)) in FORMATS.iter().enumerate() {
            assert_eq!(format.row(), i, "{format:?}");
        }
    }

    /// Each format writes its own fields; the legacy switch adds the
    /// legacy fields once; a fail-open decision gets the fixed fields only.
    #[tokio::test]
    async fn formats_write_their_rows() {
        let (limiter, mut d) = checked("fmt").await;
        let draft = RateLimitHeaders::new(&limiter);
        let legacy = draft.clone().format(HeaderFormat::Legacy);
        let map = |f: &RateLimitHeaders, d: &Decision, primary, extra| {
            DecisionHeaders::new(f, d, primary, extra).into_map()
        };
        assert_eq!(
            names(&map(&draft, &d, true, false)),
            ["ratelimit-policy", "ratelimit"]
        );
        assert_eq!(
            names(&map(&legacy, &d, true, false)),
            [
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset"
            ]
        );
        assert_eq!(map(&draft, &d, true, true).len(), 5);
        assert_eq!(map(&legacy, &d, true, true).len(), 3);
        assert_eq!(map(&draft, &d, false, true).len(), 3);
        assert!(map(&draft, &d, false, false).is_empty());
        assert_eq!(legacy.policy(), None);
        assert_eq!(legacy.for_decision(&d)["x-ratelimit-remaining"], "2");

        d.source = DecisionSource::FailOpen;
        assert_eq!(names(&map(&draft, &d, true, true)), ["ratelimit-policy"]);
        assert!(map(&legacy, &d, true, true).is_empty());

        // A fallback decision's policy is the local share it counts on.
        assert_eq!(
            map(&draft, &d, true, false)["ratelimit-policy"],
            r#""fmt";q=3;w=60"#
        );
        d.source = DecisionSource::Fallback;
        d.quotas[0].limit = 1;
        let share = map(&draft, &d, true, false);
        assert_eq!(share["ratelimit-policy"], r#""fmt";q=1;w=60"#);
        assert_eq!(map(&draft, &d, true, false).len(), 2);
    }

    /// Each field's name reads as its header's.
    #[test]
    fn names_read_as_their_headers() {
        for f in [HeaderFormat::Draft10, HeaderFormat::Legacy] {
            for (field, name) in f.fields().iter().zip(f.field_names()) {
                assert_eq!(field.name.header().as_str(), name);
            }
        }
    }

    /// Every format has exactly one row, and the rows' names are distinct.
    #[test]
    fn one_row_per_format() {
        for f in [HeaderFormat::Draft10, HeaderFormat::Legacy] {
            assert_eq!(FORMATS.iter().filter(|(g, _)| *g == f).count(), 1);
            let mut seen: Vec<_> = f.field_names().collect();
            seen.dedup();
            assert_eq!(seen.len(), f.fields().len());
        }
    }

    /// `qu` between `q` and `w`, never for requests; a format or a unit
    /// carries over to another limiter.
    #[tokio::test]
    async fn quota_units() {
        let (limiter, _) = checked("u").await;
        let h = RateLimitHeaders::new(&limiter);
        assert_eq!(
            h.clone().quota_unit("requests").policy().unwrap(),
            r#""u";q=3;w=60"#
        );
        let bytes = h.quota_unit("content-bytes");
        assert_eq!(
            bytes.policy().unwrap(),
            r#""u";q=3;qu="content-bytes";w=60"#
        );
        let (other, _) = checked("v").await;
        let moved = bytes.format(HeaderFormat::Legacy).for_limiter(&other);
        assert_eq!(moved.unit(), Some("content-bytes"));
        assert_eq!(moved.header_format(), HeaderFormat::Legacy);
        let back = moved.format(HeaderFormat::Draft10);
        assert_eq!(back.policy().unwrap(), r#""v";q=3;qu="content-bytes";w=60"#);
    }

    /// The violated policies are the denying quotas' names, as an
    /// sf-parser reads the items (non-ASCII as `_`); every policy when no
    /// quota says it denied.
    #[tokio::test]
    async fn violated_policy_names() {
        let (limiter, mut d) = checked("é").await;
        let h = RateLimitHeaders::new(&limiter);
        assert_eq!(h.policy_names().collect::<Vec<_>>(), ["_"]);
        d.allowed = false;
        assert_eq!(DecisionHeaders::new(&h, &d, false, false).violated, ["_"]);
        d.quotas[0].allowed = false;
        assert_eq!(h.violated_policies(&d), ["_"]);
        d.allowed = true;
        assert!(DecisionHeaders::new(&h, &d, true, false)
            .violated
            .is_empty());
    }

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
