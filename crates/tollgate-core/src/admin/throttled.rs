//! Who is throttled: each limiter counts its denials per subject in a small
//! top list in memory (no Redis write per denial) and adds it to a
//! fleet-wide list in the store once a second; the operator plane merges
//! the lists of every registered limiter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::views::ThrottledSubject;
use super::Admin;
use crate::error::Result;
use crate::keyspace::Subject;
use crate::store::{AdminBackend, DenialCount};

/// Subjects one instance tracks between flushes (the most denied ones,
/// approximately, as a Space-Saving sketch keeps them).
const TRACKED: usize = 64;
/// How often an instance adds its counts to the store's list.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long a list lives after its last addition.
const LIST_TTL: Duration = Duration::from_secs(3600);
/// Subjects a fleet-wide list keeps (the most denied).
const LIST_KEEP: usize = 200;

/// The store key of a limiter's throttled list (its own slot).
pub(crate) fn list_key(prefix: &str, limiter: &str) -> String {
    format!("{prefix}:throttled:{{{limiter}}}")
}

/// One limiter's denials since the last flush.
#[derive(Default)]
pub(crate) struct Throttled {
    counts: Mutex<HashMap<String, DenialCount>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Throttled {
    /// Counts one denial of `subject`. When the sketch is full, a new
    /// subject takes the place of the least denied one and inherits its
    /// count (Space-Saving): a subject denied often is never lost.
    pub(crate) fn denied(&self, subject: &Subject) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let at = now_ms();
        if let Some(c) = counts.get_mut(subject.as_encoded()) {
            c.denied += 1;
            c.last_denied_ms = at;
            return;
        }
        let mut inherited = 0;
        if counts.len() >= TRACKED {
            if let Some(least) = counts
                .values()
                .min_by_key(|c| c.denied)
                .map(|c| c.subject.clone())
            {
                inherited = counts.remove(&least).map_or(0, |c| c.denied);
            }
        }
        counts.insert(
            subject.as_encoded().to_owned(),
            DenialCount {
                subject: subject.as_encoded().to_owned(),
                denied: inherited + 1,
                last_denied_ms: at,
                label: subject.label().map(str::to_owned),
            },
        );
    }

    fn take(&self) -> Vec<DenialCount> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.drain().map(|(_, c)| c).collect()
    }

    /// Flushes every [`FLUSH_EVERY`] into `key` of `store` while the
    /// limiter lives (on the current runtime; without one, never).
    pub(crate) fn start(self: &Arc<Self>, store: Arc<dyn AdminBackend>, key: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me: Weak<Throttled> = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(FLUSH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                let counts = me.take();
                drop(me);
                if counts.is_empty() {
                    continue;
                }
                if let Err(e) = store.add_denials(&key, &counts, LIST_TTL, LIST_KEEP).await {
                    // Lost with the outage: the list shows what came before.
                    tracing::debug!(error = %e, "could not add to the throttled list");
                }
            }
        });
    }
}

/// The `n` most denied subjects over every registered limiter.
pub(super) async fn top(admin: &Admin, n: usize) -> Result<Vec<ThrottledSubject>> {
    let mut all = Vec::new();
    for limiter in admin.limiters().await? {
        let key = list_key(admin.prefix(), &limiter.name);
        for c in admin.store().top_denials(&key, n).await? {
            all.push(ThrottledSubject {
                limiter: limiter.name.clone(),
                subject: c.subject,
                label: c.label,
                denied: c.denied,
                last_denied_ms: c.last_denied_ms,
            });
        }
    }
    all.sort_by(|a, b| {
        b.denied
            .cmp(&a.denied)
            .then(b.last_denied_ms.cmp(&a.last_denied_ms))
    });
    all.truncate(n);
    Ok(all)
}
