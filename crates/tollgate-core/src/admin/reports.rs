//! What the operator plane reads back from the limiters' tallies: the
//! most throttled subjects and each limiter's traffic, fleet-wide.

use super::Admin;
use crate::error::Result;
use crate::plane::tally::{list_key, now_ms, traffic_key, LIST_WINDOW_MS, TRAFFIC_WINDOW};
use crate::plane::views::{ThrottledSubject, Traffic};

/// The `n` most denied subjects over every registered limiter.
pub(super) async fn throttled(admin: &Admin, n: usize) -> Result<Vec<ThrottledSubject>> {
    let now = now_ms();
    let mut all: Vec<ThrottledSubject> = Vec::new();
    // One list per name: a name run under two algorithms (a plan change)
    // is registered twice but denies into one list, read once.
    let mut names: Vec<String> = admin
        .registered_limiters()
        .await?
        .into_iter()
        .map(|l| l.name)
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        // This window and the one before, merged by subject.
        let mut merged: Vec<ThrottledSubject> = Vec::new();
        for at in [now, now.saturating_sub(LIST_WINDOW_MS)] {
            let key = list_key(admin.prefix(), &name, at);
            for c in admin.bounded(admin.store().top_denials(&key, n)).await? {
                match merged.iter_mut().find(|t| t.subject == c.subject) {
                    Some(t) => {
                        t.denied += c.denied;
                        t.last_denied_ms = t.last_denied_ms.max(c.last_denied_ms);
                        if t.label.is_none() {
                            t.label = c.label;
                        }
                    }
                    None => merged.push(ThrottledSubject {
                        limiter: name.clone(),
                        subject: c.subject,
                        label: c.label,
                        denied: c.denied,
                        last_denied_ms: c.last_denied_ms,
                    }),
                }
            }
        }
        all.extend(merged);
    }
    all.sort_by(|a, b| {
        b.denied
            .cmp(&a.denied)
            .then(b.last_denied_ms.cmp(&a.last_denied_ms))
    });
    all.truncate(n);
    Ok(all)
}

/// What `limiter` admitted and refused per second, fleet-wide, averaged
/// over the last whole seconds.
pub(super) async fn traffic(admin: &Admin, limiter: &str) -> Result<Traffic> {
    let now = now_ms() / 1000;
    let from = now.saturating_sub(TRAFFIC_WINDOW);
    let key = traffic_key(admin.prefix(), limiter);
    let counts = admin
        .bounded(admin.store().traffic(&key, from, now.saturating_sub(1)))
        .await?;
    let (a, r) = counts
        .iter()
        .fold((0, 0), |(a, r), (_, x, y)| (a + x, r + y));
    let per_second = |n: u64| n as f64 / TRAFFIC_WINDOW as f64;
    Ok(Traffic {
        allowed_per_second: per_second(a),
        denied_per_second: per_second(r),
    })
}
