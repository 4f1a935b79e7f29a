//! One tracing event per decision, with the subject digested — never the
//! raw key — and denials at INFO.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use tollgate_core::{Algorithm, MemoryBackend, Quota, RateLimiter, Subject};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::RateLimitLayer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Records every event as `LEVEL target: field=value ...`.
#[derive(Clone, Default)]
struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicU64>,
}

struct Line<'a>(&'a mut String);

impl Visit for Line<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut line = format!("SPAN {}", span.metadata().name());
        span.record(&mut Line(&mut line));
        self.lines.lock().unwrap().push(line);
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, values: &Record<'_>) {
        let mut line = "RECORD".to_owned();
        values.record(&mut Line(&mut line));
        self.lines.lock().unwrap().push(line);
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let m = event.metadata();
        let mut line = format!("{} {}:", m.level(), m.target());
        event.record(&mut Line(&mut line));
        self.lines.lock().unwrap().push(line);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn one_event_per_decision_with_the_subject_digested() {
    let capture = Capture::default();
    let secret = "SECRET-API-KEY-0123456789";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(capture.clone(), || {
        rt.block_on(async {
            let app = Router::new().route("/", get(|| async { "ok" })).layer(
                RateLimitLayer::new(
                    RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                        .quota(Quota::per_hour(1))
                        .name("obs")
                        .build()
                        .unwrap(),
                )
                .key(HeaderKey::new("x-api-key").plain()),
            );
            for _ in 0..2 {
                let req = Request::get("/")
                    .header("x-api-key", secret)
                    .body(Body::empty())
                    .unwrap();
                common::send(&app, req).await;
            }
        })
    });
    let lines = capture.lines.lock().unwrap().clone();
    assert!(
        lines.iter().all(|l| !l.contains(secret)),
        "raw subject in traces: {lines:#?}"
    );
    let digest = Subject::new(secret).digest();
    let ours: Vec<_> = lines
        .iter()
        .filter(|l| l.contains(" tollgate_tower::rate_limit:"))
        .collect();
    assert_eq!(ours.len(), 2, "{lines:#?}");
    assert!(
        ours[0].starts_with(&Level::DEBUG.to_string()),
        "{}",
        ours[0]
    );
    assert!(ours[0].contains("request admitted"), "{}", ours[0]);
    assert!(ours[1].starts_with(&Level::INFO.to_string()), "{}", ours[1]);
    assert!(ours[1].contains("request rate limited"), "{}", ours[1]);
    assert!(
        ours.iter()
            .all(|l| l.contains(&format!("subject={digest}"))),
        "{ours:#?}"
    );
    assert!(
        ours.iter().all(|l| l.contains("policy=\"obs\"")),
        "{ours:#?}"
    );
}
