//! What the commands print: a table for people, the admin API's JSON for
//! scripts (`--json`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comfy_table::{presets, CellAlignment, Table};
use tollgate::admin::{
    Holder, HolderKind, InFlightKey, LimiterInfo, QuotaInfo, SubjectState, ThrottledSubject,
};

/// `{"limiters":[...]}`, or a table of them.
pub(crate) fn limiters(limiters: &[LimiterInfo], as_json: bool) -> String {
    if as_json {
        return wrapped("limiters", limiters);
    }
    let mut table = table(
        &["NAME", "ALGORITHM", "QUOTAS", "ALLOWED/S", "DENIED/S"],
        &[3, 4],
    );
    for l in limiters {
        let quotas: Vec<String> = l.quotas.iter().map(quota).collect();
        let (allowed, denied) = match &l.traffic {
            Some(t) => (rate(t.allowed_per_second), rate(t.denied_per_second)),
            None => ("-".to_owned(), "-".to_owned()),
        };
        table.add_row(vec![
            l.name.clone(),
            l.algorithm.clone(),
            quotas.join(", "),
            allowed,
            denied,
        ]);
    }
    render(table)
}

/// The admin API's subject object, or a one-row table.
pub(crate) fn subject(state: &SubjectState, now: SystemTime, as_json: bool) -> String {
    if as_json {
        return serde_json::to_string(state).expect("views serialise");
    }
    let mut table = table(
        &[
            "LIMITER",
            "SUBJECT",
            "REMAINING",
            "RETRY AFTER",
            "FULL AFTER",
            "BLOCKED UNTIL",
        ],
        &[2],
    );
    table.add_row(vec![
        state.limiter.clone(),
        state.subject.clone(),
        format!("{}/{}", state.remaining, state.limit),
        match state.retry_after_ms {
            None => "now".to_owned(),
            Some(ms) => span(Duration::from_millis(ms)),
        },
        span(Duration::from_millis(state.reset_after_ms)),
        match state.blocked_until_ms {
            None => "-".to_owned(),
            Some(ms) => {
                let until = UNIX_EPOCH + Duration::from_millis(ms);
                let left = until.duration_since(now).unwrap_or_default();
                format!("{} (in {})", instant(until), span(left))
            }
        },
    ]);
    render(table)
}

/// `{"subjects":[...]}`, or a table of them, most denied first as given.
pub(crate) fn throttled(subjects: &[ThrottledSubject], now: SystemTime, as_json: bool) -> String {
    if as_json {
        return wrapped("subjects", subjects);
    }
    let mut table = table(
        &["LIMITER", "SUBJECT", "LABEL", "DENIED", "LAST DENIED"],
        &[3],
    );
    for s in subjects {
        let at = UNIX_EPOCH + Duration::from_millis(s.last_denied_ms);
        table.add_row(vec![
            s.limiter.clone(),
            s.subject.clone(),
            s.label.clone().unwrap_or_else(|| "-".to_owned()),
            s.denied.to_string(),
            ago(at, now),
        ]);
    }
    render(table)
}

/// `{"holders":[...]}`, or a table of them.
pub(crate) fn holders(holders: &[Holder], as_json: bool) -> String {
    if as_json {
        return wrapped("holders", holders);
    }
    let mut table = table(
        &[
            "KIND",
            "NAME",
            "SUBJECT",
            "FENCE",
            "HOLDER",
            "HELD",
            "LEASE LEFT",
        ],
        &[3],
    );
    for h in holders {
        table.add_row(vec![
            match h.kind {
                HolderKind::Lock => "lock".to_owned(),
                HolderKind::Permit => "permit".to_owned(),
            },
            h.name.clone(),
            h.subject.clone(),
            h.fence.to_string(),
            h.holder.clone(),
            span(Duration::from_millis(h.held_ms)),
            span(Duration::from_millis(h.ttl_ms)),
        ]);
    }
    render(table)
}

/// `{"in_flight":[...]}`, or a table of the idempotency keys in flight.
pub(crate) fn in_flight(keys: &[InFlightKey], as_json: bool) -> String {
    if as_json {
        return wrapped("in_flight", keys);
    }
    let mut table = table(
        &["STORE", "KEY", "FENCE", "RUNNING FOR", "LEASE LEFT"],
        &[2],
    );
    for k in keys {
        table.add_row(vec![
            k.name.clone(),
            k.key.clone(),
            k.fence.to_string(),
            // Unknown for a key claimed by an older version.
            k.held_ms
                .map_or_else(|| "-".to_owned(), |ms| span(Duration::from_millis(ms))),
            span(Duration::from_millis(k.ttl_ms)),
        ]);
    }
    render(table)
}

/// What `reset`, `block` and `unblock` print when they are done.
pub(crate) fn done(message: &str, as_json: bool) -> String {
    if as_json {
        r#"{"ok":true}"#.to_owned()
    } else {
        message.to_owned()
    }
}

/// `{"<name>":[...]}`, the views' fields in their declared order (as the
/// admin API prints them; a `serde_json::Value` would sort them).
fn wrapped<T: serde::Serialize>(name: &str, items: &[T]) -> String {
    let items = serde_json::to_string(items).expect("views serialise");
    format!("{{\"{name}\":{items}}}")
}

/// `3 per 1m`, with the burst when it differs from the limit.
fn quota(q: &QuotaInfo) -> String {
    let period = humantime::format_duration(Duration::from_micros(q.period_micros));
    if q.burst == q.limit {
        format!("{} per {period}", q.limit)
    } else {
        format!("{} per {period} (burst {})", q.limit, q.burst)
    }
}

/// Checks per second: whole numbers from 10 up, one decimal below.
fn rate(per_second: f64) -> String {
    if per_second >= 10.0 {
        format!("{per_second:.0}")
    } else {
        format!("{per_second:.1}")
    }
}

/// A duration as an operator reads it: `250ms` below a second, else whole
/// seconds rounded up (`1m 5s`), so a wait is never shown shorter than it is.
pub(crate) fn span(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// An instant in UTC, to the second.
pub(crate) fn instant(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `12s ago` (`just now` within a second, or for a clock a little ahead).
fn ago(at: SystemTime, now: SystemTime) -> String {
    match now.duration_since(at) {
        Ok(d) if d >= Duration::from_secs(1) => {
            let secs = Duration::from_secs(d.as_secs());
            format!("{} ago", humantime::format_duration(secs))
        }
        _ => "just now".to_owned(),
    }
}

/// A borderless table: a header line, then one line per row, columns
/// apart by two spaces; `numeric` columns aligned right.
fn table(header: &[&str], numeric: &[usize]) -> Table {
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_header(header.to_vec());
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, 2));
        if numeric.contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// The table's lines without the padding after their last column.
fn render(table: Table) -> String {
    table
        .lines()
        .map(|l| l.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::admin::Traffic;

    fn login() -> LimiterInfo {
        LimiterInfo {
            name: "login".into(),
            algorithm: "sliding_window_log".into(),
            quotas: vec![QuotaInfo {
                limit: 3,
                period_seconds: 60,
                period_micros: 60_000_000,
                burst: 3,
            }],
            traffic: Some(Traffic {
                allowed_per_second: 2.0,
                denied_per_second: 41.6,
            }),
        }
    }

    #[test]
    fn limiters_as_a_table_and_as_the_apis_json() {
        let table = limiters(&[login()], false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "{table}");
        assert_eq!(
            lines[0],
            "NAME   ALGORITHM           QUOTAS    ALLOWED/S  DENIED/S"
        );
        assert_eq!(
            lines[1],
            "login  sliding_window_log  3 per 1m        2.0        42"
        );

        let v: serde_json::Value = serde_json::from_str(&limiters(&[login()], true)).unwrap();
        assert_eq!(v["limiters"][0]["name"], "login");
        assert_eq!(v["limiters"][0]["algorithm"], "sliding_window_log");
        assert_eq!(v["limiters"][0]["quotas"][0]["limit"], 3);
        assert_eq!(v["limiters"][0]["quotas"][0]["period_seconds"], 60);
        assert_eq!(v["limiters"][0]["traffic"]["denied_per_second"], 41.6);
        let quiet = LimiterInfo {
            traffic: None,
            ..login()
        };
        assert!(limiters(std::slice::from_ref(&quiet), false).ends_with("-         -"));
        assert!(!limiters(&[quiet], true).contains("traffic"));
    }

    #[test]
    fn an_empty_list_still_has_its_header() {
        assert_eq!(
            limiters(&[], false),
            "NAME  ALGORITHM  QUOTAS  ALLOWED/S  DENIED/S"
        );
        assert_eq!(
            throttled(&[], SystemTime::now(), true),
            r#"{"subjects":[]}"#
        );
        assert_eq!(holders(&[], true), r#"{"holders":[]}"#);
        assert_eq!(in_flight(&[], true), r#"{"in_flight":[]}"#);
        assert_eq!(
            in_flight(&[], false),
            "STORE  KEY  FENCE  RUNNING FOR  LEASE LEFT"
        );
    }

    #[test]
    fn keys_in_flight_as_a_table_and_as_the_apis_json() {
        let key = InFlightKey {
            name: "idem".into(),
            key: "t-1:POST%20/orders:k-9".into(),
            fence: 1_700_000_000_123_456,
            held_ms: Some(2_500),
            ttl_ms: 27_400,
        };
        let older = InFlightKey {
            held_ms: None,
            ..key.clone()
        };
        let out = in_flight(&[key.clone(), older], false);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(
            lines[1].starts_with("idem   t-1:POST%20/orders:k-9"),
            "{out}"
        );
        assert!(lines[1].ends_with("3s           28s"), "{out}");
        assert!(lines[2].contains("1700000000123456  -  "), "{out}");
        assert_eq!(
            in_flight(&[key], true),
            r#"{"in_flight":[{"name":"idem","key":"t-1:POST%20/orders:k-9","fence":1700000000123456,"held_ms":2500,"ttl_ms":27400}]}"#
        );
    }

    #[test]
    fn a_blocked_subject_shows_when_its_block_ends() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let state = SubjectState {
            limiter: "login".into(),
            subject: "alice".into(),
            remaining: 0,
            limit: 3,
            retry_after_ms: Some(59_500),
            reset_after_ms: 59_500,
            blocked_until_ms: Some(1_700_000_600_000),
        };
        let out = subject(&state, now, false);
        let row = out.lines().nth(1).unwrap();
        assert!(row.contains("0/3"), "{out}");
        assert!(row.contains("1m"), "{out}");
        assert!(row.contains("2023-11-14T22:23:20Z (in 10m)"), "{out}");
        let v: serde_json::Value = serde_json::from_str(&subject(&state, now, true)).unwrap();
        assert_eq!(v["blocked_until_ms"], 1_700_000_600_000u64);
        assert_eq!(v["retry_after_ms"], 59_500);
    }

    #[test]
    fn durations_round_up_past_a_second() {
        assert_eq!(span(Duration::from_millis(250)), "250ms");
        assert_eq!(span(Duration::from_millis(1_001)), "2s");
        assert_eq!(span(Duration::from_secs(65)), "1m 5s");
        let now = UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(ago(now - Duration::from_secs(12), now), "12s ago");
        assert_eq!(ago(now + Duration::from_secs(1), now), "just now");
    }

    #[test]
    fn acknowledgements() {
        assert_eq!(done("reset", true), r#"{"ok":true}"#);
        assert_eq!(done("reset alice on login", false), "reset alice on login");
    }
}
