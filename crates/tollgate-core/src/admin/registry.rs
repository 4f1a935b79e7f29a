//! The registry: one hash per prefix (`<prefix>:registry`), a field per
//! limiter, semaphore or idempotency store (`<kind>:<name>`) holding its
//! description as JSON, written once when it is built.

use std::sync::Arc;
use std::time::Duration;

use super::views::{LimiterInfo, QuotaInfo, Registered};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::failure::FailurePolicy;
use crate::quota::Quota;
use crate::rate::RateLimiter;
use crate::store::AdminBackend;

/// The registry's key under `prefix`.
pub(crate) fn registry_key(prefix: &str) -> String {
    format!("{prefix}:registry")
}

impl Registered {
    fn field(&self) -> String {
        match self {
            Registered::Limiter(l) => format!("limiter:{}", l.name),
            Registered::Semaphore { name, .. } => format!("semaphore:{name}"),
            Registered::Idempotency { name } => format!("idempotency:{name}"),
        }
    }

    fn name(&self) -> &str {
        match self {
            Registered::Limiter(l) => &l.name,
            Registered::Semaphore { name, .. } | Registered::Idempotency { name } => name,
        }
    }
}

/// How long the registry lives after its last write: every live limiter
/// writes it again each [`REGISTER_EVERY`].
const REGISTRY_TTL: Duration = Duration::from_secs(3600);
/// How often a live limiter writes its entry again.
pub(crate) const REGISTER_EVERY: Duration = Duration::from_secs(15 * 60);

/// Writes `entry` into the registry of `prefix`.
pub(crate) async fn register(
    store: &dyn AdminBackend,
    prefix: &str,
    entry: &Registered,
) -> Result<()> {
    let value = serde_json::to_string(entry)
        .map_err(|e| Error::Protocol(format!("a registry entry: {e}")))?;
    store
        .register(&registry_key(prefix), &entry.field(), &value, REGISTRY_TTL)
        .await
}

/// Keeps `entry` in the registry of `prefix` while `alive` says so: at
/// once in an in-process store, else from a task that writes it again
/// every [`REGISTER_EVERY`] (the registry expires unless someone keeps it).
pub(crate) fn keep_registered(
    store: Arc<dyn AdminBackend>,
    prefix: String,
    entry: Registered,
    alive: impl Fn() -> bool + Send + 'static,
) {
    if store.in_process() {
        // Listed before the first use, with or without a runtime.
        let _ = futures_util::FutureExt::now_or_never(register(&*store, &prefix, &entry));
        return;
    }
    let registering = async move {
        while alive() {
            if let Err(e) = register(&*store, &prefix, &entry).await {
                tracing::warn!(error = %e, "could not register: the operator plane will not list it");
            }
            tokio::time::sleep(REGISTER_EVERY).await;
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(registering)),
        Err(_) => tracing::warn!("no runtime to register on: the operator plane will not list it"),
    }
}

/// Everything registered under `prefix`, by name; an entry this version
/// cannot read (a newer kind) is skipped with a warning.
pub(super) async fn read(store: &dyn AdminBackend, prefix: &str) -> Result<Vec<Registered>> {
    let mut all: Vec<Registered> = store
        .registered(&registry_key(prefix))
        .await?
        .into_iter()
        .filter_map(|(field, value)| match serde_json::from_str(&value) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(field, error = %e, "a registry entry this version cannot read");
                None
            }
        })
        .collect();
    all.sort_by(|a, b| a.name().cmp(b.name()).then(a.field().cmp(&b.field())));
    Ok(all)
}

impl LimiterInfo {
    /// The description of `limiter`.
    pub(crate) fn of(limiter: &RateLimiter) -> LimiterInfo {
        LimiterInfo {
            name: limiter.keyspace().policy().to_owned(),
            algorithm: limiter.algorithm().long_name().to_owned(),
            quotas: limiter
                .quotas()
                .iter()
                .map(|q| QuotaInfo {
                    limit: q.limit(),
                    period_seconds: q.period_micros().div_ceil(1_000_000),
                    period_micros: q.period_micros(),
                    burst: q.burst(),
                })
                .collect(),
            traffic: None,
        }
    }
}

/// A limiter with the keys and quotas `info` describes, for the operator
/// plane: no deny cache, failing closed, not registered again.
pub(super) fn rebuild(backend: &Backend, prefix: &str, info: &LimiterInfo) -> Result<RateLimiter> {
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
