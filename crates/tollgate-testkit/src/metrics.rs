//! A `metrics` recorder that counts counters, installed once per test
//! binary (feature `metrics`): the layers' and the extractors' tests read
//! the same counts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Records counters by `name{label=value,...}` (labels sorted).
#[derive(Debug, Default)]
pub struct TestRecorder {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

impl TestRecorder {
    /// The counter `key` (`name{label=value,...}`), 0 when never counted.
    pub fn get(&self, key: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = Arc::clone(self.counters.lock().unwrap().entry(name).or_default());
        Counter::from_arc(counter)
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// `tollgate_decisions_total` of `policy`, `outcome` and `source` in this
/// binary's recorder (installing it if need be).
pub fn decisions(policy: &str, outcome: &str, source: &str) -> u64 {
    recorder().get(&format!(
        "tollgate_decisions_total{{outcome={outcome},policy={policy},source={source}}}"
    ))
}

/// The global recorder of this binary, installed on first use.
pub fn recorder() -> &'static TestRecorder {
    static RECORDER: OnceLock<&'static TestRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let r: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(r).expect("no other recorder in this binary");
        r
    })
}
