//! The idempotency workload: `POST`s with an `Idempotency-Key` through
//! `IdempotencyLayer` (the tower service, called with `oneshot`; no HTTP
//! server), each sent again by its client until it is answered, sometimes
//! twice at once, sometimes given up midway, and once more after success
//! (which must be a replay). As a handler returns, the layer's own
//! connection is often killed (`CLIENT KILL ID`, from another connection),
//! so that the completion meets a reset connection; the schedule's pauses
//! stall completions too. Handlers count their runs per key: a key whose
//! handler ran to its end twice, with no data-losing fault since its first
//! request, is a violation.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::{LockOptions, RedisBackend};
use tollgate_tower::key::HeaderKey;
use tollgate_tower::IdempotencyLayer;
use tower::{Layer, ServiceExt};

use super::{Overlap, Tally, Tasks, TIMEOUT};
use crate::common::BenchResult;
use crate::soak::faults::Endpoint;
use crate::soak::{Rng, Shared};

/// The claim's lease: longer than any pause of the schedule, so that a
/// completion stalled by one is stored within the lease. (A completion
/// that cannot be stored for a whole lease lets a retry run the handler
/// again: that takes Redis gone longer, a restart or failover here.)
const LEASE_TTL: Duration = Duration::from_secs(3);
/// Handlers whose return kills the layer's connection.
const KILL_PERCENT: u64 = 30;
/// How long a client keeps sending one operation.
const GIVE_UP: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_millis(50);
const WORKERS: u64 = 4;

/// The handler runs of one key.
#[derive(Debug, Clone)]
pub(crate) struct KeyRuns {
    /// When its first request was sent.
    first: Instant,
    started: u32,
    /// When each run that reached its end returned.
    completed: Vec<Instant>,
}

/// What the handlers and clients saw, shared by every request.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    keys: HashMap<u64, KeyRuns>,
    pub(crate) ops: u64,
    pub(crate) requests: u64,
    pub(crate) started: u64,
    pub(crate) completed: u64,
    pub(crate) kills: u64,
    /// Operations whose client gave up after [`GIVE_UP`].
    pub(crate) given_up: u64,
}

impl Runs {
    /// Keys whose handler ran to its end more than once: (when the first
    /// request was sent, when the second run ended, detail).
    pub(crate) fn twice(&self) -> Vec<Overlap> {
        let mut out: Vec<Overlap> = self
            .keys
            .iter()
            .filter(|(_, k)| k.completed.len() > 1)
            .map(|(id, k)| Overlap {
                since: k.first,
                at: k.completed[1],
                detail: format!(
                    "op-{id}: the handler ran to its end {} times ({} runs started)",
                    k.completed.len(),
                    k.started
                ),
            })
            .collect();
        out.sort_by_key(|o| o.at);
        out
    }
}

/// Kills the connection the layer's store talks on, from another one.
#[derive(Clone)]
enum Killer {
    Standalone {
        mine: ConnectionManager,
        admin: ConnectionManager,
    },
    Cluster {
        mine: ClusterConnection,
        admin: ClusterConnection,
    },
}

impl Killer {
    /// The ids of the store's connections: one, or one per master.
    async fn ids(&self) -> redis::RedisResult<Vec<(Option<String>, i64)>> {
        let id = redis::cmd("CLIENT").arg("ID").to_owned();
        match self {
            Killer::Standalone { mine, .. } => {
                Ok(vec![(None, id.query_async(&mut mine.clone()).await?)])
            }
            Killer::Cluster { mine, .. } => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let Value::Map(per_node) = mine.clone().route_command(id, all).await? else {
                    return Ok(Vec::new());
                };
                Ok(per_node
                    .into_iter()
                    .filter_map(|(addr, id)| {
                        let addr: String = redis::from_redis_value(addr).ok()?;
                        Some((Some(addr), redis::from_redis_value(id).ok()?))
                    })
                    .collect())
            }
        }
    }

    /// Kills those connections; how many were found.
    async fn kill(&self, ids: Vec<(Option<String>, i64)>) -> u64 {
        let mut killed = 0;
        for (addr, id) in ids {
            let kill = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .to_owned();
            let n: Option<i64> = match (self, addr) {
                (Killer::Standalone { admin, .. }, _) => {
                    kill.query_async(&mut admin.clone()).await.ok()
                }
                (Killer::Cluster { admin, .. }, Some(addr)) => {
                    let Some((host, port)) = addr.rsplit_once(':') else {
                        continue;
                    };
                    let Ok(port) = port.parse() else { continue };
                    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.to_owned(),
                        port,
                    });
                    let v = admin.clone().route_command(kill, node).await.ok();
                    v.and_then(|v| redis::from_redis_value(v).ok())
                }
                (Killer::Cluster { .. }, None) => continue,
            };
            // A connection already gone (reconnected since) is not found.
            killed += n.unwrap_or(0).max(0) as u64;
        }
        killed
    }
}

/// The store's backend, and a killer of its connection.
async fn connect(endpoint: &Endpoint) -> BenchResult<(RedisBackend, Killer)> {
    Ok(match endpoint {
        Endpoint::Url(url) => {
            let mine = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
            let admin = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
            let backend = RedisBackend::from_connection(mine.clone());
            (backend, Killer::Standalone { mine, admin })
        }
        Endpoint::Seeds(seeds) => {
            let client = || redis::cluster::ClusterClient::new(seeds.clone());
            let mine = client()?.get_async_connection().await?;
            let admin = client()?.get_async_connection().await?;
            let backend = RedisBackend::from_connection(mine.clone());
            (backend, Killer::Cluster { mine, admin })
        }
    })
}

/// Starts [`WORKERS`] clients through one layer.
pub(super) async fn start(
    endpoint: &Endpoint,
    shared: &Arc<Shared>,
    seed: u64,
    runs: &Arc<Mutex<Runs>>,
    tasks: &mut Tasks,
) -> BenchResult<()> {
    let (backend, killer) = connect(endpoint).await?;
    let store = IdempotencyStore::builder(backend)
        .prefix("soak")
        .timeout(TIMEOUT)
        .lease(LockOptions::new().ttl(LEASE_TTL))
        .build()?;
    let layer = IdempotencyLayer::new(store, HeaderKey::new("x-tenant"));
    let handler = {
        let runs = runs.clone();
        let draws = Arc::new(AtomicU64::new(seed));
        tower::service_fn(move |req: Request<Body>| {
            let (runs, killer) = (runs.clone(), killer.clone());
            let mut rng = Rng::new(draws.fetch_add(1, Ordering::Relaxed));
            async move {
                let id = op_of(&req);
                {
                    let mut r = runs.lock().expect("runs");
                    r.started += 1;
                    if let Some(k) = r.keys.get_mut(&id) {
                        k.started += 1;
                    }
                }
                // Before the work, while the connection is known to be up.
                let ids = if rng.percent(KILL_PERCENT) {
                    tokio::time::timeout(TIMEOUT, killer.ids())
                        .await
                        .ok()
                        .and_then(Result::ok)
                } else {
                    None
                };
                let ms = if rng.percent(90) {
                    rng.range(1, 20)
                } else {
                    rng.range(200, 800)
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                {
                    let mut r = runs.lock().expect("runs");
                    r.completed += 1;
                    if let Some(k) = r.keys.get_mut(&id) {
                        k.completed.push(Instant::now());
                    }
                }
                // The completion goes out as this returns: kill beside it.
                if let Some(ids) = ids {
                    tokio::spawn(async move {
                        let n = killer.kill(ids).await;
                        runs.lock().expect("runs").kills += n;
                    });
                }
                let res = Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Body::from(format!("op-{id}")))
                    .expect("a valid response");
                Ok::<_, Infallible>(res)
            }
        })
    };
    let svc = layer.layer(handler);
    let ops = Arc::new(AtomicU64::new(0));
    for w in 0..WORKERS {
        let (svc, shared, runs, ops) = (svc.clone(), shared.clone(), runs.clone(), ops.clone());
        let mut rng = Rng::new(seed.wrapping_mul(53).wrapping_add(w));
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while !shared.stopped() {
                let id = ops.fetch_add(1, Ordering::Relaxed);
                operation(&svc, &shared, &runs, &mut rng, &mut tally, id).await;
                tokio::time::sleep(Duration::from_millis(rng.range(5, 20))).await;
            }
            tally
        }));
    }
    Ok(())
}

/// The operation a request carries, from its `Idempotency-Key`.
fn op_of<B>(req: &Request<B>) -> u64 {
    req.headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok()?.strip_prefix("op-")?.parse().ok())
        .expect("set by the client")
}

/// One operation: sent until it is answered (or [`GIVE_UP`]), then, for
/// some, once more, which must be answered from the record.
async fn operation<S, B>(
    svc: &S,
    shared: &Shared,
    runs: &Mutex<Runs>,
    rng: &mut Rng,
    tally: &mut Tally,
    id: u64,
) where
    S: tower::Service<Request<Body>, Response = Response<B>> + Clone,
{
    let begun = Instant::now();
    {
        let mut r = runs.lock().expect("runs");
        r.ops += 1;
        let k = KeyRuns {
            first: begun,
            started: 0,
            completed: Vec::new(),
        };
        r.keys.insert(id, k);
    }
    let mut again = rng.percent(30);
    loop {
        let copies = if rng.percent(10) { 2 } else { 1 };
        // Some clients give up on a request midway (and send it again).
        let patience = rng
            .percent(5)
            .then(|| Duration::from_millis(rng.range(5, 300)));
        let send = |_| {
            let req = Request::post("/orders")
                .header("x-tenant", "soak")
                .header("idempotency-key", format!("op-{id}"))
                .body(Body::from(format!("order {id}")))
                .expect("a valid request");
            let call = svc.clone().oneshot(req);
            async move {
                match patience {
                    Some(p) => tokio::time::timeout(p, call).await.ok(),
                    None => Some(call.await),
                }
            }
        };
        let answers = futures::future::join_all((0..copies).map(send)).await;
        runs.lock().expect("runs").requests += copies;
        let mut done = false;
        for answer in answers {
            let outcome = match answer {
                None => "the client gave up midway",
                Some(Err(_)) => "a service error",
                Some(Ok(res)) => match res.status() {
                    StatusCode::CREATED if res.headers().contains_key("idempotent-replayed") => {
                        done = true;
                        tally.success("idempotency", shared.start);
                        "201 replayed"
                    }
                    StatusCode::CREATED => {
                        done = true;
                        tally.success("idempotency", shared.start);
                        "201 (the handler ran)"
                    }
                    StatusCode::CONFLICT => "409 (in flight)",
                    StatusCode::SERVICE_UNAVAILABLE => "503 (store unavailable or claim lost)",
                    StatusCode::UNPROCESSABLE_ENTITY => "422 (payload mismatch)",
                    _ => "another status",
                },
            };
            tally.decision(format!("idempotency: {outcome}"));
        }
        if done && again {
            // As a client that never saw the answer would.
            again = false;
            continue;
        }
        if done {
            return;
        }
        if begun.elapsed() >= GIVE_UP {
            runs.lock().expect("runs").given_up += 1;
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}
