//! Property tests of the headers tollgate reads and writes.
//!
//! - `RateLimit-Policy` and `RateLimit` for arbitrary limiters (any
//!   algorithm, one to three quotas, any valid policy name — quotes,
//!   backslashes, non-ASCII — any quota unit) and arbitrary decisions
//!   (remaining, next, source): both parse with `sfv` (RFC 9651) as lists of
//!   Strings with the expected parameters, and round-trip the figures
//!   (`q` the capacity, `w` the window when it is whole seconds, `r`, `t`
//!   rounded up, all clamped to 15 digits); a fail-open decision has no
//!   `RateLimit`; the legacy fields carry the top-level figures.
//! - `Idempotency-Key`, through an `IdempotencyLayer` on the memory
//!   backend: any header bytes are 400 exactly when a reference parser
//!   (`sfv` for the quoted form, visible ASCII for the bare one, 1 to 255
//!   characters) refuses them, and otherwise run the handler; the same key
//!   re-sent as a canonical sf-string is a replay (the key read is exactly
//!   the one sent); another key is not; two header lines are 400.
//!
//! Case count: proptest's default (256), or `PROPTEST_CASES`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::{HeaderValue, Request, StatusCode};
use proptest::prelude::*;
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::{Algorithm, Decision, DecisionSource, MemoryBackend, Quota, RateLimiter};
use tollgate_tower::headers::{HeaderFormat, RateLimitHeaders};
use tollgate_tower::key::GlobalKey;
use tollgate_tower::IdempotencyLayer;
use tower::ServiceExt;

const SF_MAX: u64 = 999_999_999_999_999;
const TEN_YEARS_US: u64 = 10 * 365 * 24 * 3600 * 1_000_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

// ------------------------------------------------------ RateLimit fields --

/// One quota as generated: valid by construction (limit ≤ period in µs,
/// period ≤ ten years; a burst within 2^50 µs of emission).
#[derive(Debug, Clone, Copy)]
struct QuotaSpec {
    period_us: u64,
    limit_frac: u64,
    burst: Option<u64>,
}

fn quota_spec() -> impl Strategy<Value = QuotaSpec> {
    let period = prop_oneof![
        (1u64..=100_000).prop_map(|s| s * 1_000_000),
        1u64..=TEN_YEARS_US,
        1u64..2_000_000,
    ];
    (period, any::<u64>(), prop::option::of(any::<u64>())).prop_map(
        |(period_us, limit_frac, burst)| QuotaSpec {
            period_us,
            limit_frac,
            burst,
        },
    )
}

fn quota(spec: QuotaSpec, algorithm: Algorithm) -> Quota {
    // What the builder accepts per algorithm: a log keeps an entry per
    // unit (10 000 at most); a counter keeps limit × period below 2^53.
    let most = match algorithm {
        Algorithm::SlidingWindowLog => spec.period_us.min(10_000),
        Algorithm::SlidingWindowCounter => spec
            .period_us
            .min(((1 << 53) - spec.period_us) / spec.period_us),
        _ => spec.period_us,
    };
    let limit = match spec.limit_frac % 3 {
        0 => 1 + spec.limit_frac % most.min(1000),
        _ => 1 + spec.limit_frac % most,
    };
    let q = Quota::new(limit, Duration::from_micros(spec.period_us)).unwrap();
    match spec.burst {
        Some(b) if algorithm.uses_burst() => {
            let most = (1u64 << 50) / q.interval_micros();
            let burst = 1 + if b % 2 == 0 {
                b % most.min(100)
            } else {
                b % most
            };
            q.with_burst(burst).unwrap()
        }
        _ => q,
    }
}

/// A limiter of `specs`' quotas; a quota the builder refuses (its rules
/// are its own: a log's size, a counter's or a bucket's exactness) gives
/// way to a smaller burst, then none, then a simpler quota of the same
/// seed, so that every case builds.
fn limiter(algorithm: Algorithm, name: &str, specs: &[QuotaSpec]) -> RateLimiter {
    let builds = |q: Quota| {
        RateLimiter::builder(MemoryBackend::new(), algorithm)
            .quota(q)
            .build()
            .is_ok()
    };
    let mut b = RateLimiter::builder(MemoryBackend::new(), algorithm).name(name);
    for s in specs {
        let small = s.burst.map(|b| b % 100);
        let candidates = [
            quota(*s, algorithm),
            quota(QuotaSpec { burst: small, ..*s }, algorithm),
            quota(QuotaSpec { burst: None, ..*s }, algorithm),
            Quota::per_second(1 + s.limit_frac % 100),
        ];
        let q = candidates
            .into_iter()
            .find(|q| builds(*q))
            .expect("per_second builds");
        b = b.quota(q);
    }
    b.build().unwrap()
}

/// A valid policy name, rich in what structured fields escape.
fn policy_name() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec!['"', '\\', 'é', ';', ',', '=', ':', '%', '日']),
            (0x21u8..0x7f).prop_map(|b| if b == b'{' || b == b'}' {
                'x'
            } else {
                char::from(b)
            }),
        ],
        1..10,
    )
    .prop_map(|v| v.into_iter().collect())
}

fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
        .collect()
}

/// `q` as the policy reports it: the burst of a bucket, the limit of a window.
fn capacity(algorithm: Algorithm, q: &Quota) -> u64 {
    match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => q.burst(),
        _ => q.limit(),
    }
}

/// `w`: the window (a bucket: the time a full burst takes to refill) in
/// whole seconds, or none.
fn window(algorithm: Algorithm, q: &Quota) -> Option<u64> {
    let us = match algorithm {
        Algorithm::TokenBucket | Algorithm::Gcra => {
            let num = u128::from(q.period_micros()) * u128::from(q.burst());
            if num % u128::from(q.limit()) != 0 {
                return None;
            }
            num / u128::from(q.limit())
        }
        _ => u128::from(q.period_micros()),
    };
    (us > 0 && us % 1_000_000 == 0).then(|| u64::try_from(us / 1_000_000).unwrap())
}

/// One parsed list member: its String, Integer and String parameters.
#[derive(Debug)]
struct Member {
    name: String,
    ints: Vec<(String, i64)>,
    strings: Vec<(String, String)>,
}

impl Member {
    fn int(&self, k: &str) -> Option<u64> {
        let v = self.ints.iter().find(|(n, _)| n == k).map(|(_, v)| *v)?;
        Some(u64::try_from(v).expect("non-negative"))
    }
}

fn parse_list(value: &HeaderValue) -> Result<Vec<Member>, TestCaseError> {
    let list: sfv::List = sfv::Parser::new(value.as_bytes())
        .parse()
        .map_err(|e| TestCaseError::fail(format!("{value:?} is not an sf-list: {e}")))?;
    let mut out = Vec::new();
    for entry in list {
        let sfv::ListEntry::Item(item) = entry else {
            return Err(TestCaseError::fail(format!("an inner list in {value:?}")));
        };
        let name = item.bare_item.as_string().map(|s| s.as_str().to_owned());
        let name = name.ok_or_else(|| TestCaseError::fail(format!("{value:?}: not a String")))?;
        let mut m = Member {
            name,
            ints: Vec::new(),
            strings: Vec::new(),
        };
        for (k, v) in &item.params {
            let k = k.as_str().to_owned();
            match (v.as_integer(), v.as_string()) {
                (Some(i), _) => m.ints.push((k, i64::from(i))),
                (_, Some(s)) => m.strings.push((k, s.as_str().to_owned())),
                _ => return Err(TestCaseError::fail(format!("{value:?}: {k} is odd"))),
            }
        }
        out.push(m);
    }
    Ok(out)
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ])
}

/// Figures of one quota's decision: remaining, µs to the next unit and to
/// full, whether it admits.
fn figures() -> impl Strategy<Value = (u64, u64, u64, bool)> {
    (
        prop_oneof![0u64..100, any::<u64>()],
        prop_oneof![0u64..5_000_000, any::<u64>()],
        any::<u64>(),
        any::<bool>(),
    )
}

// ------------------------------------------------------- Idempotency-Key --

/// The key a request carries, by the draft: an sf-string (parsed by `sfv`,
/// no parameters) or a bare run of visible ASCII; 1 to 255 characters.
fn reference_key(raw: &[u8]) -> Option<String> {
    let start = raw.iter().position(|&b| b != b' ').unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(start, |i| i + 1);
    let v = &raw[start..end];
    let key = if v.first() == Some(&b'"') {
        let item: sfv::Item = sfv::Parser::new(v).parse().ok()?;
        if !item.params.is_empty() {
            return None;
        }
        item.bare_item.as_string()?.as_str().to_owned()
    } else if v.iter().all(|b| (0x21..=0x7e).contains(b)) {
        String::from_utf8(v.to_vec()).unwrap()
    } else {
        return None;
    };
    (1..=255).contains(&key.len()).then_some(key)
}

fn sf_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Header-value bytes (never `\r`, `\n`, NUL: those cannot be a value),
/// often quoted, sometimes long.
fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => prop::sample::select(b"ab-_9\"\\ ;=".to_vec()),
        1 => any::<u8>().prop_map(|b| match b {
            b'\t' => b,
            0..=0x1f => b + 0x20,
            0x7f => b'~',
            _ => b,
        }),
    ];
    let body = prop_oneof![
        4 => prop::collection::vec(byte.clone(), 0..12),
        1 => prop::collection::vec(byte, 250..260),
    ];
    (body, 0u8..4).prop_map(|(mut v, wrap)| {
        match wrap {
            0 => {
                v.insert(0, b'"');
                v.push(b'"');
            }
            1 => v.insert(0, b'"'),
            _ => {}
        }
        v
    })
}

fn app(runs: Arc<AtomicUsize>) -> Router {
    let store = IdempotencyStore::new(MemoryBackend::new());
    Router::new()
        .route(
            "/",
            post(move || {
                let runs = Arc::clone(&runs);
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("run {n}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new(store, GlobalKey))
}

async fn send(app: &Router, keys: &[&[u8]]) -> (StatusCode, Option<HeaderValue>) {
    let mut req = Request::post("/").body(Body::from("payload")).unwrap();
    for k in keys {
        let v = HeaderValue::from_bytes(k).expect("a valid header value");
        req.headers_mut().append("idempotency-key", v);
    }
    let res = app.clone().oneshot(req).await.unwrap();
    (
        res.status(),
        res.headers().get("idempotent-replayed").cloned(),
    )
}

// ----------------------------------------------------------- properties --

proptest! {
    /// Arbitrary limiters and decisions: the emitted fields parse with
    /// `sfv` and carry the figures.
    #[test]
    fn ratelimit_fields_parse_and_round_trip(
        algorithm in algorithm(),
        name in policy_name(),
        specs in prop::collection::vec(quota_spec(), 1..4),
        figures in prop::collection::vec(figures(), 3),
        unit in prop::option::of(prop_oneof![Just("requests".to_owned()), "\\PC{0,8}", ".{0,8}"]),
        source in 0u8..4,
    ) {
        let limiter = limiter(algorithm, &name, &specs);
        let mut d: Decision = runtime().block_on(limiter.check("k")).unwrap();
        prop_assert_eq!(d.quotas.len(), specs.len());
        for (q, &(remaining, next_us, reset_us, allowed)) in d.quotas.iter_mut().zip(&figures) {
            q.remaining = remaining;
            q.next_after = Duration::from_micros(next_us);
            q.reset_after = Duration::from_micros(reset_us);
            q.allowed = allowed;
        }
        (d.remaining, d.limit) = (figures[0].0, figures[1].0);
        d.reset_after = Duration::from_micros(figures[2].2);
        d.source = [
            DecisionSource::Backend,
            DecisionSource::DenyCache,
            DecisionSource::Fallback,
            DecisionSource::FailOpen,
        ][usize::from(source)];

        let mut h = RateLimitHeaders::new(&limiter);
        if let Some(u) = &unit {
            h = h.quota_unit(u);
        }
        let map = h.for_decision(&d);
        let policy = map.get("ratelimit-policy").expect("RateLimit-Policy");
        prop_assert_eq!(Some(policy), h.policy());
        let policies = parse_list(policy)?;
        let limits = match map.get("ratelimit") {
            Some(v) => Some(parse_list(v)?),
            None => None,
        };
        prop_assert_eq!(limits.is_none(), d.source == DecisionSource::FailOpen);
        prop_assert_eq!(policies.len(), specs.len());
        let qu = unit.as_deref().filter(|u| *u != "requests").map(printable);
        for (i, (p, qd)) in policies.iter().zip(&d.quotas).enumerate() {
            let expected = if specs.len() == 1 { printable(&name) } else { printable(&format!("{name}-q{i}")) };
            prop_assert_eq!(&p.name, &expected);
            prop_assert_eq!(p.int("q"), Some(capacity(algorithm, &qd.quota).min(SF_MAX)));
            prop_assert_eq!(p.int("w"), window(algorithm, &qd.quota).map(|w| w.min(SF_MAX)));
            let got_qu = p.strings.iter().find(|(k, _)| k == "qu").map(|(_, v)| v.clone());
            prop_assert_eq!(got_qu, qu.clone());
            if let Some(limits) = &limits {
                let m = &limits[i];
                prop_assert_eq!(&m.name, &expected);
                prop_assert_eq!(m.int("r"), Some(qd.remaining.min(SF_MAX)));
                let t = qd.next_after.as_secs() + u64::from(qd.next_after.subsec_nanos() > 0);
                prop_assert_eq!(m.int("t"), Some(t.min(SF_MAX)));
            }
        }
        if let Some(limits) = &limits {
            prop_assert_eq!(limits.len(), specs.len());
        }

        // The legacy fields: the top-level figures, seconds rounded up.
        let legacy = h.clone().format(HeaderFormat::Legacy).for_decision(&d);
        let figure = |n: &str| legacy.get(n).map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
        if d.source == DecisionSource::FailOpen {
            prop_assert!(legacy.is_empty());
        } else {
            prop_assert_eq!(figure("x-ratelimit-limit"), Some(d.limit));
            prop_assert_eq!(figure("x-ratelimit-remaining"), Some(d.remaining));
            let reset = d.reset_after.as_secs() + u64::from(d.reset_after.subsec_nanos() > 0);
            prop_assert_eq!(figure("x-ratelimit-reset"), Some(reset));
        }
    }

    /// Any `Idempotency-Key` bytes: 400 exactly when the reference parser
    /// refuses them; otherwise the handler runs, the same key re-sent in
    /// canonical sf-string form is replayed, another key runs again.
    #[test]
    fn idempotency_keys_parse_as_the_draft_says(raw in key_bytes(), other in "[a-z0-9]{1,8}") {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = app(Arc::clone(&runs));
        runtime().block_on(async {
            let expected = reference_key(&raw);
            let (status, replayed) = send(&app, &[&raw]).await;
            let Some(key) = expected else {
                prop_assert_eq!(status, StatusCode::BAD_REQUEST, "{:?}", String::from_utf8_lossy(&raw));
                prop_assert_eq!(runs.load(Ordering::SeqCst), 0);
                return Ok(());
            };
            prop_assert_eq!(status, StatusCode::CREATED, "{:?} → {:?}", String::from_utf8_lossy(&raw), key);
            prop_assert_eq!(replayed, None);
            let canonical = sf_quote(&key);
            let (status, replayed) = send(&app, &[canonical.as_bytes()]).await;
            prop_assert_eq!(status, StatusCode::CREATED);
            prop_assert_eq!(replayed.as_ref().map(|v| v.as_bytes()), Some(&b"true"[..]), "{}", canonical);
            prop_assert_eq!(runs.load(Ordering::SeqCst), 1);
            // Another key (this one with a suffix that makes it differ).
            let differs = format!("{key}{other}");
            if differs.len() <= 255 {
                let (status, replayed) = send(&app, &[sf_quote(&differs).as_bytes()]).await;
                prop_assert_eq!(status, StatusCode::CREATED);
                prop_assert_eq!(replayed, None);
                prop_assert_eq!(runs.load(Ordering::SeqCst), 2);
            }
            // Sent twice, even the same valid key: 400.
            let (status, _) = send(&app, &[&raw, &raw]).await;
            prop_assert_eq!(status, StatusCode::BAD_REQUEST);
            Ok(())
        })?;
    }
}
