//! The format table: which fields each [`HeaderFormat`] writes, how each
//! value is made and merged, and the headers one decision adds to its
//! response.

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_core::{Decision, DecisionSource};

use super::{
    ceil_secs, sf_integer, sf_string, RateLimitHeaders, RATELIMIT, RATELIMIT_POLICY,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

/// Which rate-limit header fields responses carry.
///
/// Each format is a row of field writers (see the [module docs](super)),
/// so a later revision of the draft is one more variant and one more row.
///
/// ```
/// use tollgate::tower::headers::HeaderFormat;
///
/// assert_eq!(HeaderFormat::default(), HeaderFormat::Draft10);
/// assert_eq!(HeaderFormat::Draft10.field_names().collect::<Vec<_>>(), ["ratelimit-policy", "ratelimit"]);
/// assert_eq!(
///     HeaderFormat::Legacy.field_names().collect::<Vec<_>>(),
///     ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"],
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HeaderFormat {
    /// `RateLimit-Policy` and `RateLimit` as in
    /// draft-ietf-httpapi-ratelimit-headers-10: one list member per quota,
    /// `q`, `qu` (a unit other than requests), `w` (whole seconds only),
    /// `r` and `t`.
    #[default]
    Draft10,
    /// The de-facto `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds from now, rounded up) of the strictest
    /// quota.
    Legacy,
}

impl HeaderFormat {
    /// The names of the fields this format writes, in the order written.
    pub fn field_names(self) -> impl Iterator<Item = &'static str> {
        self.fields().iter().map(|f| f.name.as_str())
    }

    pub(super) fn fields(self) -> &'static [Field] {
        FORMATS[self.row()].1
    }

    /// The format's row in [`FORMATS`] (read per response: a match, not
    /// a search; a unit test checks it against the table).
    pub(super) fn row(self) -> usize {
        match self {
            HeaderFormat::Draft10 => 0,
            HeaderFormat::Legacy => 1,
        }
    }
}

/// How a field merges with the same field already on the response (written
/// by a limiter stacked inside this one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Merge {
    /// Structured-field lists: appended, so each limiter reports its own
    /// policy.
    Append,
    /// Single values: set only if absent, so the innermost limiter's
    /// figures win.
    IfAbsent,
}

/// How a field's value is made.
#[derive(Clone, Copy)]
pub(super) enum Write {
    /// The same on every response of a limiter: made once per formatter
    /// and cloned (a reference count) per response. Sent on fail-open
    /// decisions and with a cost beyond capacity too.
    Fixed(fn(&RateLimitHeaders) -> Option<HeaderValue>),
    /// Made per decision; `None` leaves the field out.
    PerDecision(fn(&RateLimitHeaders, &Decision) -> Option<HeaderValue>),
}

/// One header field a format writes.
pub(crate) struct Field {
    pub(super) name: Name,
    merge: Merge,
    pub(super) write: Write,
}

/// A field's name. Each response gets a fresh `HeaderName` made from the
/// name's constant: cloning a stored one calls through its bytes' vtable,
/// a cost every request measurably paid per field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Name {
    RateLimitPolicy,
    RateLimit,
    XLimit,
    XRemaining,
    XReset,
}

impl Name {
    pub(super) fn header(self) -> HeaderName {
        match self {
            Name::RateLimitPolicy => RATELIMIT_POLICY,
            Name::RateLimit => RATELIMIT,
            Name::XLimit => X_RATELIMIT_LIMIT,
            Name::XRemaining => X_RATELIMIT_REMAINING,
            Name::XReset => X_RATELIMIT_RESET,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Name::RateLimitPolicy => "ratelimit-policy",
            Name::RateLimit => "ratelimit",
            Name::XLimit => "x-ratelimit-limit",
            Name::XRemaining => "x-ratelimit-remaining",
            Name::XReset => "x-ratelimit-reset",
        }
    }
}

impl fmt::Debug for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Field")
            .field("name", &self.name.as_str())
            .field("merge", &self.merge)
            .finish_non_exhaustive()
    }
}

/// Every format and its fields.
pub(super) static FORMATS: [(HeaderFormat, &[Field]); 2] = [
    (HeaderFormat::Draft10, &DRAFT_10),
    (HeaderFormat::Legacy, &LEGACY),
];

/// draft-ietf-httpapi-ratelimit-headers-10's fields.
static DRAFT_10: [Field; 2] = [
    Field {
        name: Name::RateLimitPolicy,
        merge: Merge::Append,
        write: Write::Fixed(draft10_policy),
    },
    Field {
        name: Name::RateLimit,
        merge: Merge::Append,
        write: Write::PerDecision(RateLimitHeaders::ratelimit_value),
    },
];

/// The legacy `X-RateLimit-*` fields.
static LEGACY: [Field; 3] = [
    Field {
        name: Name::XLimit,
        merge: Merge::IfAbsent,
        write: Write::PerDecision(|_, d| legacy(d, |d| d.limit)),
    },
    Field {
        name: Name::XRemaining,
        merge: Merge::IfAbsent,
        write: Write::PerDecision(|_, d| legacy(d, |d| d.remaining)),
    },
    Field {
        name: Name::XReset,
        merge: Merge::IfAbsent,
        write: Write::PerDecision(|_, d| legacy(d, |d| ceil_secs(d.reset_after))),
    },
];

/// A legacy figure of `decision`; none for a fail-open decision, which has
/// no real figures.
fn legacy(decision: &Decision, figure: fn(&Decision) -> u64) -> Option<HeaderValue> {
    (decision.source != DecisionSource::FailOpen).then(|| HeaderValue::from(figure(decision)))
}

/// The draft-10 `RateLimit-Policy` value of `h`'s quotas: `q`, `qu` (a
/// unit other than requests), `w` (whole seconds only).
fn draft10_policy(h: &RateLimitHeaders) -> Option<HeaderValue> {
    let qu = h.unit.as_deref().map(|u| format!(";qu={}", sf_string(u)));
    let value = h
        .policies
        .iter()
        .zip(&h.items)
        .map(|(p, item)| {
            let mut s = format!("{item};q={}", sf_integer(p.q));
            if let Some(qu) = &qu {
                s.push_str(qu);
            }
            if let Some(w) = p.w {
                s.push_str(&format!(";w={}", sf_integer(w)));
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ");
    HeaderValue::from_str(&value).ok()
}

/// What a decision adds to its response, made before the decision moves
/// into the request's extensions and applied to the response without
/// building a map: the header fields, and on a denial the policies that
/// denied (for the problem body).
#[derive(Debug, Default)]
pub(crate) struct DecisionHeaders {
    fields: Fields,
    /// On a denial, the names of the violated policies (even with headers
    /// off: the 429 body lists them).
    pub(crate) violated: Vec<String>,
}

impl DecisionHeaders {
    /// The headers for `decision`: the formatter's format when `primary`
    /// is on, and the legacy ones too when `legacy` is on (once, if the
    /// format is legacy already).
    pub(crate) fn new(
        formatter: &RateLimitHeaders,
        decision: &Decision,
        primary: bool,
        legacy: bool,
    ) -> Self {
        let mut headers = DecisionHeaders::default();
        headers.write(formatter, decision, primary, legacy);
        headers
    }

    /// Writes the headers [`new`](Self::new) makes into these empty ones,
    /// in place (a response future keeps them where they are).
    pub(crate) fn write(
        &mut self,
        formatter: &RateLimitHeaders,
        decision: &Decision,
        primary: bool,
        legacy: bool,
    ) {
        let fields = &mut self.fields;
        // A fallback decision counts against this instance's share: its
        // policy is the share's, made for this response (only while the
        // store is down).
        let share =
            (decision.source == DecisionSource::Fallback).then(|| formatter.for_share(decision));
        let mut write = |format: HeaderFormat| {
            let fixed = &formatter.fixed[format.row()];
            for (field, fixed) in format.fields().iter().zip(&fixed[..]) {
                let value = match (field.write, &share) {
                    (Write::Fixed(make), Some(share)) => make(share),
                    (Write::Fixed(_), None) => fixed.clone(),
                    (Write::PerDecision(make), _) => make(formatter, decision),
                };
                if let Some(value) = value {
                    fields.push((field, value));
                }
            }
        };
        if primary {
            write(formatter.format);
        }
        if legacy && !(primary && formatter.format == HeaderFormat::Legacy) {
            write(HeaderFormat::Legacy);
        }
        if !decision.allowed {
            self.violated = formatter.violated_policies(decision);
        }
    }

    /// Adds the headers to `target`, each merged as its [`Merge`] says:
    /// the structured-field lists (`RateLimit`, `RateLimit-Policy`) are
    /// appended, so stacked limiters each report their own policy; the
    /// legacy ones are set only if absent (the innermost limiter's figures
    /// win). The fields are taken out (where they are kept: no move of
    /// the whole).
    pub(crate) fn apply(&mut self, target: &mut HeaderMap) {
        for (field, value) in self.fields.drain() {
            match field.merge {
                Merge::Append => {
                    target.append(field.name.header(), value);
                }
                Merge::IfAbsent => {
                    let name = field.name.header();
                    if !target.contains_key(&name) {
                        target.insert(name, value);
                    }
                }
            }
        }
    }

    /// The headers as a map (for a rejection).
    pub(crate) fn into_map(mut self) -> HeaderMap {
        let mut h = HeaderMap::new();
        self.apply(&mut h);
        h
    }
}

/// The fields of one decision: the default format's two inline (a request
/// allocates no list for them), more in a vector.
#[derive(Debug, Default)]
struct Fields {
    first: [Option<(&'static Field, HeaderValue)>; 2],
    more: Vec<(&'static Field, HeaderValue)>,
}

impl Fields {
    fn push(&mut self, field: (&'static Field, HeaderValue)) {
        match self.first.iter_mut().find(|f| f.is_none()) {
            Some(free) => *free = Some(field),
            None => self.more.push(field),
        }
    }

    fn drain(&mut self) -> impl Iterator<Item = (&'static Field, HeaderValue)> + '_ {
        self.first
            .iter_mut()
            .filter_map(Option::take)
            .chain(self.more.drain(..))
    }
}
