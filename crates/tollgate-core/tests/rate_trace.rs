//! A check that makes a round trip shows in a trace as a
//! `tollgate.rate.check` span, with its policy, store and cost, when a
//! subscriber takes debug spans; one that takes only info spans gets none.

use std::sync::{Arc, Mutex};

use tollgate_core::{Algorithm, Coalescing, Quota, RateLimiter, RedisBackend};
use tollgate_testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Records each span it is offered: its name and fields.
struct Spans {
    level: LevelFilter,
    seen: Arc<Mutex<Vec<String>>>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Subscriber for Spans {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.level
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.level)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(span.metadata().name().to_owned());
        span.record(&mut fields);
        let mut seen = self.seen.lock().unwrap();
        seen.push(fields.0);
        Id::from_u64(seen.len() as u64)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

async fn spans_of_a_check(server: &RedisServer, level: LevelFilter) -> Vec<String> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let subscriber = Spans {
        level,
        seen: Arc::clone(&seen),
    };
    let backend = RedisBackend::connect(&server.url())
        .await
        .unwrap()
        .with_coalescing(Coalescing::off());
    let limiter = RateLimiter::builder(backend, Algorithm::Gcra)
        .quota(Quota::per_second(10))
        .name("traced")
        .build()
        .unwrap();
    let _default = tracing::subscriber::set_default(subscriber);
    limiter.check("alice").await.unwrap();
    let spans = seen.lock().unwrap().clone();
    spans
        .into_iter()
        .filter(|s| s.starts_with("tollgate.rate.check"))
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_round_trip_is_a_span_when_debug_spans_are_taken() {
    let server = RedisServer::start().unwrap();
    let spans = spans_of_a_check(&server, LevelFilter::DEBUG).await;
    assert_eq!(
        spans,
        ["tollgate.rate.check policy=\"traced\" store=\"redis\" cost=1"],
    );
    let spans = spans_of_a_check(&server, LevelFilter::INFO).await;
    assert!(spans.is_empty(), "{spans:?}");
}
