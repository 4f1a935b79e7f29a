//! `tollgate_decisions_total`: one count per decision, labelled alike by
//! the layers and the axum extractors.

use std::sync::Arc;

use tollgate_core::{Decision, DecisionSource, Error, RateLimiter};

/// The `outcome` and `source` labels of `result` (a shadow layer's denial
/// is `shadow_denied`: it was admitted).
pub(crate) fn labels(
    result: &Result<Decision, Error>,
    shadow: bool,
) -> (&'static str, &'static str) {
    match result {
        Ok(d) if d.allowed => ("allowed", source_label(d.source)),
        Ok(d) if shadow => ("shadow_denied", source_label(d.source)),
        Ok(d) => ("denied", source_label(d.source)),
        Err(Error::CostExceedsCapacity { .. }) => ("too_costly", "none"),
        Err(_) => ("unavailable", "none"),
    }
}

/// Counts `result`, a decision of `limiter` a request was given, in
/// `tollgate_decisions_total{policy, outcome, source}` as
/// [`RateLimitLayer`](super::RateLimitLayer) does (a no-op without the
/// `metrics` feature). For code that checks a limiter for a request
/// itself, as the axum extractors do.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{MemoryBackend, Quota, RateLimiter};
/// use tollgate::tower::rate_limit::count_decision;
///
/// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_second(5))?;
/// let result = limiter.check("alice").await;
/// count_decision(&limiter, &result);
/// # Ok(()) }
/// ```
pub fn count_decision(limiter: &RateLimiter, result: &Result<Decision, Error>) {
    if cfg!(feature = "metrics") {
        let (outcome, source) = labels(result, false);
        count(&Arc::from(limiter.keyspace().policy()), outcome, source);
    }
}

/// Counts a request that could not be keyed for `limiter`
/// (`outcome="key_error"`), as [`count_decision`] counts a decision.
pub fn count_key_error(limiter: &RateLimiter) {
    if cfg!(feature = "metrics") {
        count(&Arc::from(limiter.keyspace().policy()), "key_error", "none");
    }
}

#[cfg(feature = "metrics")]
pub(crate) fn count(policy: &Arc<str>, outcome: &'static str, source: &'static str) {
    metrics::counter!(
        "tollgate_decisions_total",
        "policy" => Arc::clone(policy),
        "outcome" => outcome,
        "source" => source,
    )
    .increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn count(_policy: &Arc<str>, _outcome: &'static str, _source: &'static str) {}

fn source_label(source: DecisionSource) -> &'static str {
    match source {
        DecisionSource::Backend => "backend",
        DecisionSource::DenyCache => "deny_cache",
        DecisionSource::FailOpen => "fail_open",
        DecisionSource::Fallback => "fallback",
        DecisionSource::Lease => "lease",
        // A source a later tollgate-core adds, until it is named here.
        _ => "other",
    }
}
