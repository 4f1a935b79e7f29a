//! The concurrency-limit workload: requests through `ConcurrencyLimitLayer`
//! (the tower service over a `Semaphore`, called with `oneshot`; no HTTP
//! server) whose handlers run several hold caps (`LockOptions::max_hold`)
//! long. The layer must keep a request's permit for as long as it runs, cap
//! or not; a permit lost to a fault must end the request
//! (`OnLeaseLost::Cancel`). Each handler counts itself in and out of its
//! key, so more than N running at once is seen when it happens.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate_core::{FailurePolicy, LockOptions, Semaphore};
use tollgate_tower::concurrency::OnLeaseLost;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::ConcurrencyLimitLayer;
use tower::{Layer, ServiceExt};

use super::{backend, Overlap, Tally, Tasks, TIMEOUT};
use crate::common::BenchResult;
use crate::soak::faults::Endpoint;
use crate::soak::{Rng, Shared};

/// Requests of one key allowed to run at once.
pub(crate) const CONC_PERMITS: u32 = 2;
const KEYS: [&str; 2] = ["conc-0", "conc-1"];
/// Short, so that a permit left to lapse under a running request (at the
/// cap, or a missed renewal) is free again within the run, and taken.
pub(crate) const CONC_TTL: Duration = Duration::from_millis(400);
/// The hold cap the layer's options set: it must not apply to a request
/// in flight.
pub(crate) const CAP: Duration = Duration::from_millis(800);
/// How long a handler runs (ms): 2.5 to 4.4 caps.
const RUN_MS: (u64, u64) = (2_000, 3_500);
/// Callers per key: more than its permits, so that a lapsed permit is
/// taken (and the excess seen) at once.
const CALLERS_PER_KEY: u64 = 4;
/// A refused caller's pause before it tries again.
const RETRY: Duration = Duration::from_millis(25);

/// What the handlers saw, shared by every request.
#[derive(Default)]
pub(crate) struct Running {
    /// Per key, the requests whose handler runs: (id, when it was sent).
    inside: HashMap<&'static str, Vec<(u64, Instant)>>,
    pub(crate) started: u64,
    pub(crate) completed: u64,
    /// Completed after running longer than [`CAP`].
    pub(crate) past_cap: u64,
    /// Requests ended by the layer before their handler finished (their
    /// permit lost), as (when sent, when ended, detail): a fault must
    /// explain each, or the layer cut a healthy request off.
    pub(crate) cancelled: Vec<(Instant, Instant, String)>,
    pub(crate) longest: Duration,
    /// The most handlers of one key running at once.
    pub(crate) most: usize,
    /// More than [`CONC_PERMITS`] running at once (`since`: the earliest
    /// of their requests was sent).
    pub(crate) overlaps: Vec<Overlap>,
}

/// One request, as its handler sees it (a request extension).
#[derive(Clone)]
struct Call {
    key: &'static str,
    id: u64,
    sent: Instant,
    run: Duration,
    /// When the handler started, if it did (micros since the run's start).
    entered: Arc<AtomicU64>,
}

/// A running handler; leaving (finishing, or being dropped by the layer)
/// counts it out.
struct Inside {
    running: Arc<Mutex<Running>>,
    key: &'static str,
    id: u64,
    sent: Instant,
    entered: Instant,
    done: bool,
}

impl Drop for Inside {
    fn drop(&mut self) {
        let mut r = self.running.lock().expect("running");
        if let Some(v) = r.inside.get_mut(self.key) {
            v.retain(|(id, _)| *id != self.id);
        }
        let held = self.entered.elapsed();
        if self.done {
            r.completed += 1;
            r.past_cap += u64::from(held > CAP);
            r.longest = r.longest.max(held);
        } else {
            let detail = format!(
                "{}: request {} ended by the layer after {:.1} s (permit lost)",
                self.key,
                self.id,
                held.as_secs_f64()
            );
            r.cancelled.push((self.sent, Instant::now(), detail));
        }
    }
}

fn enter(running: &Arc<Mutex<Running>>, call: &Call, start: Instant) -> Inside {
    let now = Instant::now();
    let mut r = running.lock().expect("running");
    r.started += 1;
    let inside = r.inside.entry(call.key).or_default();
    if inside.len() >= CONC_PERMITS as usize {
        let since = inside
            .iter()
            .map(|(_, sent)| *sent)
            .fold(call.sent, Instant::min);
        let detail = format!(
            "{}: request {} started while {} ran (limit {CONC_PERMITS})",
            call.key,
            call.id,
            inside.len()
        );
        r.overlaps.push(Overlap {
            since,
            at: now,
            detail,
        });
    }
    let inside = r.inside.entry(call.key).or_default();
    inside.push((call.id, call.sent));
    let n = inside.len();
    r.most = r.most.max(n);
    let micros = now.saturating_duration_since(start).as_micros() as u64;
    call.entered.store(micros + 1, Ordering::Relaxed);
    Inside {
        running: running.clone(),
        key: call.key,
        id: call.id,
        sent: call.sent,
        entered: now,
        done: false,
    }
}

/// Starts [`CALLERS_PER_KEY`] callers for each key, all through one layer
/// over one semaphore (its own connection).
pub(super) async fn start(
    endpoint: &Endpoint,
    shared: &Arc<Shared>,
    seed: u64,
    running: &Arc<Mutex<Running>>,
    tasks: &mut Tasks,
) -> BenchResult<()> {
    let semaphore = Semaphore::builder(backend(endpoint).await?, CONC_PERMITS)
        .prefix("soak")
        .timeout(TIMEOUT)
        // Without a permit a request must not run: fail closed.
        .on_failure(FailurePolicy::Deny)
        .build()?;
    let layer = ConcurrencyLimitLayer::new(semaphore, HeaderKey::new("x-key"))
        .namespace("soak-conc")
        .options(LockOptions::new().ttl(CONC_TTL).max_hold(CAP))
        .on_permit_lost(OnLeaseLost::Cancel);
    let handler = {
        let running = running.clone();
        let start = shared.start;
        tower::service_fn(move |req: Request<()>| {
            let running = running.clone();
            async move {
                let call = req.extensions().get::<Call>().expect("set by the caller");
                let mut inside = enter(&running, call, start);
                tokio::time::sleep(call.run).await;
                inside.done = true;
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }
        })
    };
    let svc = layer.layer(handler);
    let ids = Arc::new(AtomicU64::new(0));
    for (k, key) in KEYS.into_iter().enumerate() {
        for c in 0..CALLERS_PER_KEY {
            let svc = svc.clone();
            let shared = shared.clone();
            let ids = ids.clone();
            let mut rng = Rng::new(seed.wrapping_mul(43).wrapping_add(k as u64 * 8 + c));
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::default();
                while !shared.stopped() {
                    let call = Call {
                        key,
                        id: ids.fetch_add(1, Ordering::Relaxed),
                        sent: Instant::now(),
                        run: Duration::from_millis(rng.range(RUN_MS.0, RUN_MS.1)),
                        entered: Arc::default(),
                    };
                    let entered = call.entered.clone();
                    let req = Request::builder()
                        .header("x-key", key)
                        .extension(call)
                        .body(())
                        .expect("a valid request");
                    let Ok(res) = svc.clone().oneshot(req).await;
                    let status = res.status();
                    // The permit is held until the body ends: drop it now.
                    drop(res);
                    let entered = entered.load(Ordering::Relaxed);
                    if entered > 0 {
                        let at = shared.start + Duration::from_micros(entered - 1);
                        tally.success_at("concurrency", shared.start, at);
                    }
                    let outcome = match (status, entered > 0) {
                        (StatusCode::OK, _) => "completed",
                        (StatusCode::TOO_MANY_REQUESTS, _) => "refused (429: all permits taken)",
                        (StatusCode::SERVICE_UNAVAILABLE, true) => {
                            "ended by the layer (503: permit lost)"
                        }
                        (StatusCode::SERVICE_UNAVAILABLE, false) => {
                            "refused (503: Redis unavailable, fail closed)"
                        }
                        _ => "other status",
                    };
                    tally.decision(format!("concurrency: {outcome}"));
                    if status != StatusCode::OK {
                        tokio::time::sleep(RETRY).await;
                    }
                }
                tally
            }));
        }
    }
    Ok(())
}
