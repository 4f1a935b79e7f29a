//! The registry: one hash per prefix (`<prefix>:registry`), a field per
//! limiter (`limiter:<name>:<algorithm>`), semaphore or idempotency store
//! (`<kind>:<name>`) holding its description as JSON, written once when it
//! is built.

use std::sync::Arc;
use std::time::Duration;

use super::views::Registered;
use crate::error::{within, Error, Result};
use crate::store::AdminBackend;

/// The registry's key under `prefix`.
pub(crate) fn registry_key(prefix: &str) -> String {
    format!("{prefix}:registry")
}

impl Registered {
    fn field(&self) -> String {
        match self {
            // A plan change may run a second algorithm under one name (on
            // keys of its own) for a while: each is listed, and reset.
            Registered::Limiter(l) => format!("limiter:{}:{}", l.name, l.algorithm),
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
/// How often a live limiter writes its entry again: a registry lost with
/// the store's data (a restart without persistence) is whole again within
/// this, at one small write per limiter.
pub(crate) const REGISTER_EVERY: Duration = Duration::from_secs(60);
/// The first pause after a write that failed (the store down at startup),
/// doubling up to [`REGISTER_EVERY`]: listed soon after the store is back.
const RETRY_FIRST: Duration = Duration::from_secs(1);

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

/// How often a registration task looks whether its owner still lives.
const ALIVE_CHECK: Duration = Duration::from_secs(2);

/// Keeps `entry` in the registry of `prefix` while `alive` says so: at
/// once in an in-process store, else from a task that writes it again
/// every [`REGISTER_EVERY`] (the registry expires unless someone keeps it),
/// and sooner after a write that failed.
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
        let mut retry = RETRY_FIRST;
        'writes: while alive() {
            // Bounded: a store that stopped answering holds no task (nor
            // the store) once its owner is gone.
            let pause = match within(ALIVE_CHECK, register(&*store, &prefix, &entry)).await {
                Ok(()) => {
                    retry = RETRY_FIRST;
                    REGISTER_EVERY
                }
                Err(e) => {
                    tracing::warn!(error = %e, ?retry, "could not register: the operator plane will not list it until a write lands");
                    let pause = retry;
                    retry = (retry * 2).min(REGISTER_EVERY);
                    pause
                }
            };
            // Looked at often, so that the store (its connection) is let go
            // soon after the last user.
            let next = tokio::time::Instant::now() + pause;
            while tokio::time::Instant::now() < next {
                tokio::time::sleep(
                    ALIVE_CHECK.min(next.saturating_duration_since(tokio::time::Instant::now())),
                )
                .await;
                if !alive() {
                    break 'writes;
                }
            }
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(registering)),
        Err(_) => tracing::warn!("no runtime to register on: the operator plane will not list it"),
    }
}

/// Everything registered under `prefix`, by name; an entry this version
/// cannot read (a newer kind) is skipped with a warning.
pub(crate) async fn read(store: &dyn AdminBackend, prefix: &str) -> Result<Vec<Registered>> {
    let read: Vec<(String, Registered)> = store
        .registered(&registry_key(prefix))
        .await?
        .into_iter()
        .filter_map(|(field, value)| match serde_json::from_str(&value) {
            Ok(r) => Some((field, r)),
            Err(e) => {
                tracing::warn!(field, error = %e, "a registry entry this version cannot read");
                None
            }
        })
        .collect();
    // A limiter's entry as versions before `limiter:<name>:<algorithm>`
    // wrote it: kept by the registry's refreshes after an upgrade, with
    // its quotas frozen. Read only while no entry of the name is current.
    let limiter = |r: &Registered| matches!(r, Registered::Limiter(_));
    let current: std::collections::HashSet<(bool, String)> = read
        .iter()
        .filter(|(field, r)| *field == r.field())
        .map(|(_, r)| (limiter(r), r.name().to_owned()))
        .collect();
    let mut all: Vec<Registered> = read
        .into_iter()
        .filter(|(field, r)| {
            *field == r.field() || !current.contains(&(limiter(r), r.name().to_owned()))
        })
        .map(|(_, r)| r)
        .collect();
    all.sort_by(|a, b| a.name().cmp(b.name()).then(a.field().cmp(&b.field())));
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plane::views::{LimiterInfo, QuotaInfo};
    use crate::MemoryBackend;

    fn limiter(per_minute: u64) -> Registered {
        Registered::Limiter(LimiterInfo {
            name: "api".into(),
            algorithm: "gcra".into(),
            quotas: vec![QuotaInfo {
                limit: per_minute,
                period_seconds: 60,
                period_micros: 60_000_000,
                burst: per_minute,
            }],
            traffic: None,
        })
    }

    /// A limiter's entry under the field earlier versions wrote
    /// (`limiter:<name>`) is read only while no current entry of the name
    /// is there: after an upgrade its frozen quotas are not shown.
    #[tokio::test]
    async fn an_entry_of_an_earlier_version_gives_way() {
        let store = MemoryBackend::new();
        let key = registry_key("p");
        let json = |r: &Registered| serde_json::to_string(r).unwrap();
        let ttl = REGISTRY_TTL;
        let old = limiter(10);
        store
            .register(&key, "limiter:api", &json(&old), ttl)
            .await
            .unwrap();
        assert_eq!(read(&store, "p").await.unwrap(), [old]);
        let new = limiter(20);
        register(&store, "p", &new).await.unwrap();
        assert_eq!(read(&store, "p").await.unwrap(), [new]);
    }
}
