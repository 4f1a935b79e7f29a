//! A registered limiter rebuilt from its description, for the operator
//! plane's actions on its subjects.

use std::time::Duration;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::failure::FailurePolicy;
use crate::plane::views::LimiterInfo;
use crate::quota::Quota;
use crate::rate::RateLimiter;

/// A limiter with the keys and quotas `info` describes, for the operator
/// plane: no deny cache, failing closed, not registered again, its reads
/// bounded by `timeout`.
pub(super) fn rebuild(
    backend: &Backend,
    prefix: &str,
    info: &LimiterInfo,
    timeout: Duration,
) -> Result<RateLimiter> {
    let algorithm = info.algorithm().ok_or_else(|| {
        Error::InvalidConfig(format!(
            "limiter {:?} runs {:?}, an algorithm this version does not know",
            info.name, info.algorithm
        ))
    })?;
    let mut b = RateLimiter::builder(backend.clone(), algorithm)
        .prefix(prefix)
        .name(info.name.clone())
        .deny_cache(0)
        .failure_policy(FailurePolicy::Deny)
        .timeout(timeout)
        .unregistered();
    for q in &info.quotas {
        let quota = Quota::new(q.limit, Duration::from_micros(q.period_micros))?;
        let quota = if q.burst != q.limit {
            quota.with_burst(q.burst)?
        } else {
            quota
        };
        b = b.quota(quota);
    }
    b.build()
}
