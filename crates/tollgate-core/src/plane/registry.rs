//! The registry: one hash per prefix (`<prefix>:registry`), a field per
//! configuration of a limiter (`limiter:<name>:<algorithm>#<digest>`),
//! semaphore or idempotency store (`<kind>:<name>#<digest>`) holding its
//! description as JSON with when it was built and when its registration
//! was last written. Two configurations of one thing live at once while a
//! plan table or a fleet changes over: the newest built is the one shown,
//! and an entry nobody has written for a while (its last owner gone) is
//! not shown at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::tally::now_ms;
use super::views::Registered;
use crate::error::{within, Error, Result};
use crate::keyspace::quick_hash;
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

/// How long an entry is shown after its last write: three of its owner's
/// refreshes missed (the owner gone, or its store unreachable from it).
const SHOWN_FOR: Duration = Duration::from_secs(3 * 60);

/// Writes `entry`, built at `built_ms`, into the registry of `prefix`. An
/// entry in a shared store says when it was written (it is shown for
/// [`SHOWN_FOR`] after); an in-process store's is never refreshed, and is
/// taken out with its last owner instead.
pub(crate) async fn register(
    store: &dyn AdminBackend,
    prefix: &str,
    entry: &Registered,
    built_ms: u64,
) -> Result<()> {
    let (field, value) = described(entry, built_ms, !store.in_process())?;
    store
        .register(&registry_key(prefix), &field, &value, REGISTRY_TTL)
        .await
}

/// The registry field of `entry` and its value.
fn described(entry: &Registered, built_ms: u64, refreshed: bool) -> Result<(String, String)> {
    let bad = |e: serde_json::Error| Error::Protocol(format!("a registry entry: {e}"));
    let described = serde_json::to_string(entry).map_err(bad)?;
    // One field per configuration: an older one still running (a plan
    // table being replaced) never overwrites the newer one's.
    let field = format!(
        "{}#{:016x}",
        entry.field(),
        quick_hash(0, described.as_bytes())
    );
    let mut value: Value = serde_json::from_str(&described).map_err(bad)?;
    if let Value::Object(fields) = &mut value {
        fields.insert("built_ms".into(), built_ms.into());
        if refreshed {
            fields.insert("seen_ms".into(), now_ms().into());
        }
    }
    Ok((field, value.to_string()))
}

/// How often a registration task looks whether its owner still lives.
const ALIVE_CHECK: Duration = Duration::from_secs(2);

/// Keeps `entry` in the registry of `prefix` while `alive` says so: at
/// once in an in-process store, else from a task that writes it again
/// every [`REGISTER_EVERY`] (the registry expires unless someone keeps it),
/// and sooner after a write that failed. Once the owner is gone, the task
/// unregisters it (an in-process store takes it out with its last owner).
pub(crate) fn keep_registered(
    store: Arc<dyn AdminBackend>,
    prefix: String,
    entry: Registered,
    alive: impl Fn() -> bool + Send + 'static,
) {
    let built_ms = now_ms();
    // Nothing else writes an in-process store: it is written once, before
    // the first use, with or without a runtime.
    let once = store.in_process();
    if once {
        let _ = futures_util::FutureExt::now_or_never(register(&*store, &prefix, &entry, built_ms));
    }
    let registering = async move {
        let mut retry = RETRY_FIRST;
        'writes: while alive() {
            // Bounded: a store that stopped answering holds no task (nor
            // the store) once its owner is gone.
            let written = async {
                if once {
                    return Ok(());
                }
                register(&*store, &prefix, &entry, built_ms).await
            };
            let pause = match within(ALIVE_CHECK, written).await {
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
        if let Ok((field, _)) = described(&entry, built_ms, false) {
            let _ = within(
                ALIVE_CHECK,
                store.unregister(&registry_key(&prefix), &field),
            )
            .await;
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(registering)),
        // Written already: it stays as long as the store.
        Err(_) if once => {}
        Err(_) => tracing::warn!("no runtime to register on: the operator plane will not list it"),
    }
}

/// One entry read back: its field, its description, and when it was built
/// and last written (absent in entries of earlier versions).
struct Read {
    field: String,
    entry: Registered,
    built_ms: u64,
    seen_ms: Option<u64>,
}

impl Read {
    /// The field without its configuration's digest; `None` for the field
    /// of an earlier version (which has none).
    fn base(&self) -> Option<&str> {
        self.field.split_once('#').map(|(base, _)| base)
    }
}

/// Everything registered under `prefix`, by name: of the entries written
/// lately, the newest built configuration of each; an entry this version
/// cannot read (a newer kind) is skipped with a warning.
pub(crate) async fn read(store: &dyn AdminBackend, prefix: &str) -> Result<Vec<Registered>> {
    let now = now_ms();
    let shown_for = u64::try_from(SHOWN_FOR.as_millis()).unwrap_or(u64::MAX);
    let read: Vec<Read> = store
        .registered(&registry_key(prefix))
        .await?
        .into_iter()
        .filter_map(|(field, value)| {
            let parsed = serde_json::from_str::<Value>(&value)
                .and_then(|v| Ok((serde_json::from_value::<Registered>(v.clone())?, v)));
            match parsed {
                Ok((entry, v)) => Some(Read {
                    field,
                    entry,
                    built_ms: v.get("built_ms").and_then(Value::as_u64).unwrap_or(0),
                    seen_ms: v.get("seen_ms").and_then(Value::as_u64),
                }),
                Err(e) => {
                    tracing::warn!(field, error = %e, "a registry entry this version cannot read");
                    None
                }
            }
        })
        .collect();
    // An entry as earlier versions wrote it (`limiter:<name>`, or one field
    // per name and algorithm): kept by the registry's refreshes after an
    // upgrade, with its quotas frozen. Read only while no entry of the name
    // in this version's form is there, shown or not.
    let limiter = |r: &Registered| matches!(r, Registered::Limiter(_));
    let current: std::collections::HashSet<(bool, &str)> = read
        .iter()
        .filter(|r| r.base().is_some())
        .map(|r| (limiter(&r.entry), r.entry.name()))
        .collect();
    let shown = |r: &&Read| {
        r.seen_ms
            .is_none_or(|seen| now.saturating_sub(seen) <= shown_for)
    };
    // Of one thing's configurations, the newest built.
    let mut newest: HashMap<&str, &Read> = HashMap::new();
    for r in read.iter().filter(shown) {
        if r.base() != Some(r.entry.field().as_str()) {
            continue;
        }
        let base = r.base().unwrap_or_default();
        let keep = newest
            .get(base)
            .is_none_or(|n| (r.built_ms, r.seen_ms) > (n.built_ms, n.seen_ms));
        if keep {
            newest.insert(base, r);
        }
    }
    let mut all: Vec<Registered> = newest.values().map(|r| r.entry.clone()).collect();
    all.extend(
        read.iter()
            .filter(|r| {
                r.base().is_none() && !current.contains(&(limiter(&r.entry), r.entry.name()))
            })
            .map(|r| r.entry.clone()),
    );
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

    /// An in-process store counts a field's owners and takes the field out
    /// with the last.
    #[tokio::test]
    async fn an_in_process_field_goes_with_its_last_owner() {
        let store = MemoryBackend::new();
        let key = registry_key("p");
        for _ in 0..2 {
            store.register(&key, "f", "{}", REGISTRY_TTL).await.unwrap();
        }
        store.unregister(&key, "f").await.unwrap();
        assert_eq!(store.registered(&key).await.unwrap().len(), 1);
        store.unregister(&key, "f").await.unwrap();
        assert!(store.registered(&key).await.unwrap().is_empty());
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
        register(&store, "p", &new, 1).await.unwrap();
        assert_eq!(read(&store, "p").await.unwrap(), [new]);
    }
}
