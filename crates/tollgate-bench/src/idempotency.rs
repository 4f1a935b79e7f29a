//! Issue #13: what `IdempotencyLayer` costs a request.
//!
//! - In process (a table of the micro item): an axum `POST /orders` route
//!   with and without the layer over the memory backend — a first request
//!   (a fresh `Idempotency-Key` each time: claim, handler, complete) and a
//!   replay (one key: a claim that returns the stored response).
//! - On Redis (the `idempotency` item): round trips per request, counted by
//!   Redis itself — `MONITOR` (the commands the layer's connection sends)
//!   and `INFO commandstats` deltas (every command, those the scripts call
//!   included) — with the time per request and Redis's CPU.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use http::header::{HeaderName, CONTENT_TYPE};
use http::{Request, StatusCode};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tollgate_core::idempotency::IdempotencyStore;
use tollgate_core::{MemoryBackend, RedisBackend};
use tollgate_tower::idempotency::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use tollgate_tower::key::ExtensionKey;
use tollgate_tower::IdempotencyLayer;

use crate::common::{connect, interleaved, progress, BenchResult, Opts, Section, Target, Verdict};
use crate::micro::{send, time_routers};
use crate::redisinfo::{Accounting, Admin, CommandStats};
use crate::stats::{median, range, ratio_cell, ratios, us};

/// The request body (JSON) and the handler's response body.
const BODY: &str = r#"{"sku":"apple","qty":2}"#;
const ORDER: &str = r#"{"order":"ord_1","sku":"apple","qty":2}"#;

/// The caller's scope, as an authentication layer puts it in the request
/// (the gateway example's API key).
#[derive(Debug, Clone)]
struct ApiKey;

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bench-tenant")
    }
}

/// Reads the body, answers 201 with a small JSON body.
async fn create_order(body: Bytes) -> (StatusCode, [(HeaderName, &'static str); 1], &'static str) {
    std::hint::black_box(body);
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        ORDER,
    )
}

/// What a row sends through what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The route without the layer (same requests).
    NoLayer,
    /// A fresh `Idempotency-Key` per request.
    First,
    /// One `Idempotency-Key`, completed before timing.
    Replay,
    /// No layer; the handler first sends one raw no-op `EVALSHA` (Redis only).
    RoundTrip,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::NoLayer => "no layer (same route and requests)",
            Mode::First => {
                "`IdempotencyLayer`, first request (fresh key: claim + handler + complete)"
            }
            Mode::Replay => {
                "`IdempotencyLayer`, replay (same key: one claim returns the stored response)"
            }
            Mode::RoundTrip => {
                "reference: no layer, the handler sends one raw no-op `EVALSHA` first"
            }
        }
    }
}

/// `POST /orders`, under `IdempotencyLayer` scoped by [`ApiKey`] when a
/// store is given (as `examples/gateway` does).
fn router(store: Option<IdempotencyStore>) -> Router {
    let route = post(create_order);
    let route = match store {
        Some(s) => route.layer(IdempotencyLayer::new(s, ExtensionKey::<ApiKey>::new())),
        None => route,
    };
    Router::new().route("/orders", route)
}

/// The `i`-th request of `mode`; `run` keeps keys apart between runs. Every
/// mode formats its key alike: `i` for a first request, a fixed one else.
fn order(mode: Mode, run: u64, i: u64) -> BenchResult<Request<Body>> {
    let key = match mode {
        Mode::First => format!("order-{run:x}-{i}"),
        _ => format!("order-{run:x}-replay"),
    };
    let mut req = Request::post("/orders")
        .header(CONTENT_TYPE, "application/json")
        .header(IDEMPOTENCY_KEY, key)
        .body(Body::from(BODY))?;
    req.extensions_mut().insert(ApiKey);
    Ok(req)
}

/// A number unlikely to repeat between runs (keys on a shared Redis).
fn run_id() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 48)
}

/// Sends one request of `mode` (untimed) and checks the answer: 201, the
/// handler's body byte for byte, `Idempotent-Replayed: true` exactly when
/// `replay`. The first request of a replay's key completes it.
async fn verify(
    router: &mut Router,
    mode: Mode,
    run: u64,
    i: u64,
    replay: bool,
) -> BenchResult<()> {
    let res = send(router, order(mode, run, i)?).await?;
    let replayed = res.headers().get(IDEMPOTENT_REPLAYED).is_some();
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), usize::MAX).await?;
    if status != StatusCode::CREATED || body != ORDER || replayed != replay {
        return Err(format!(
            "{}: got {status}, replayed: {replayed}, body {body:?}",
            mode.label()
        )
        .into());
    }
    Ok(())
}

/// The micro item's rows: the route without the layer, a first request and
/// a replay, each over its own memory store; ns per request and ratios to
/// no layer, per round.
pub(crate) async fn in_process(opts: &Opts, section: &mut Section) -> BenchResult<()> {
    let n = opts.scale(20_000);
    let modes = [Mode::NoLayer, Mode::First, Mode::Replay];
    let store = || IdempotencyStore::new(MemoryBackend::new());
    let mut routers: Vec<Router> = modes
        .iter()
        .map(|&m| router((m != Mode::NoLayer).then(store)))
        .collect();
    let run = run_id();
    // Timed first requests use keys from 0: verification uses another.
    for (c, &m) in modes.iter().enumerate() {
        verify(&mut routers[c], m, run, u64::MAX, false).await?;
        if m == Mode::Replay {
            verify(&mut routers[c], m, run, 0, true).await?;
        }
    }
    let ns = time_routers(
        opts.rounds,
        |round| progress!("micro: idempotency round {}/{}", round + 1, opts.rounds),
        &mut routers,
        n,
        true,
        |c, i| order(modes[c], run, i),
    )
    .await?;
    section.line(format!(
        "\n`IdempotencyLayer` (issue #13) in process: `POST /orders` with a 23-byte JSON body, an \
         `Idempotency-Key` and the caller's scope in the extensions (`ExtensionKey`, as in \
         `examples/gateway`), through `Router::call`; the handler reads the body and answers 201 \
         with a 39-byte JSON body, read to its end. Memory backend, default settings (a 30 s \
         lease, records kept 24 h; one store per row, so first requests add {} records over the \
         run). {n} requests per row per round, {} rounds interleaved; ratios per round.\n",
        n * opts.rounds,
        opts.rounds,
    ));
    let mut rows = Vec::new();
    for (c, &m) in modes.iter().enumerate() {
        let (lo, hi) = range(&ns[c]);
        let med = median(&ns[c]);
        rows.push(vec![
            m.label().to_owned(),
            format!("**{med:.0}** ({lo:.0}–{hi:.0})"),
            format!("{:+.0} ns", med - median(&ns[0])),
            ratio_cell(&ratios(&ns[c], &ns[0])),
        ]);
    }
    section.table(
        &["route", "ns per request", "over no layer", "÷ no layer"],
        &rows,
    );
    for (c, what) in [(1, "first request"), (2, "replay")] {
        section.targets.push(Target::new(
            "micro",
            format!("`IdempotencyLayer` {what}, memory, in process: ns over no layer (÷ no layer)"),
            "(reported)",
            format!(
                "{:+.0} ns ({:.2}×)",
                median(&ns[c]) - median(&ns[0]),
                median(&ratios(&ns[c], &ns[0]))
            ),
            Verdict::Info,
        ));
    }
    Ok(())
}

/// The SHA1 → file name of the store's scripts (sent as they are).
fn script_name(sha: &str) -> Option<&'static str> {
    [
        (
            "idem_claim",
            include_str!("../../tollgate-core/lua/idem_claim.lua"),
        ),
        (
            "idem_complete",
            include_str!("../../tollgate-core/lua/idem_complete.lua"),
        ),
        (
            "idem_abandon",
            include_str!("../../tollgate-core/lua/idem_abandon.lua"),
        ),
        ("no-op", include_str!("../lua/noop.lua")),
    ]
    .into_iter()
    .find(|(_, body)| redis::Script::new(body).get_hash() == sha)
    .map(|(name, _)| name)
}

/// What `MONITOR` saw of one block of requests.
#[derive(Debug, Default)]
struct Monitored {
    /// Commands the bench's connection sent: round trips.
    top_level: u64,
    /// Commands the scripts called.
    in_scripts: u64,
    /// Those of the first request, in order (`EVALSHA idem_claim`, …).
    first: Vec<String>,
}

/// `MONITOR` on its own connection while `requests` runs; counts the
/// commands sent from `client` (an `ip:port`) and those called from scripts,
/// up to a marker `ECHO` sent afterwards on another connection.
async fn monitored(
    url: &str,
    client: &str,
    per_request: u64,
    requests: impl std::future::Future<Output = BenchResult<()>>,
) -> BenchResult<Monitored> {
    let info = redis::Client::open(url)?.get_connection_info().clone();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
        return Err("MONITOR: a tcp:// Redis URL is needed".into());
    };
    let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
    let mut lines = BufReader::new(stream);
    lines.get_mut().write_all(b"MONITOR\r\n").await?;
    let mut line = String::new();
    lines.read_line(&mut line).await?;
    if line.trim_end() != "+OK" {
        return Err(format!("MONITOR answered {line:?}").into());
    }
    requests.await?;
    let marker = format!("tgbench-monitor-end-{:x}", run_id());
    let mut other = connect(url).await?;
    redis::cmd("ECHO")
        .arg(&marker)
        .query_async::<String>(&mut other)
        .await?;
    let (me, lua) = (format!(" {client}] "), " lua] ");
    let mut m = Monitored::default();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Err("MONITOR: the connection closed".into());
        }
        if line.contains(&marker) {
            return Ok(m);
        }
        if line.contains(lua) {
            m.in_scripts += 1;
        } else if let Some(at) = line.find(&me) {
            m.top_level += 1;
            if m.top_level <= per_request {
                // `"evalsha" "<sha>" …` → `EVALSHA idem_claim`.
                let mut words = line[at + me.len()..]
                    .split(' ')
                    .map(|w| w.trim_matches('"'));
                let cmd = words.next().unwrap_or("").to_ascii_uppercase();
                let arg = words.next().and_then(script_name).unwrap_or("");
                m.first.push(format!("{cmd} {arg}").trim_end().to_owned());
            }
        }
    }
}

/// The `idempotency` item: round trips and Redis commands per request,
/// first requests and replays, on the Redis of `opts`.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let n = opts.scale(2_000);
    let admin = Admin::connect(&opts.redis_url).await?;
    let conn = connect(&opts.redis_url).await?;
    let mut c = conn.clone();
    let client_info: String = redis::cmd("CLIENT").arg("INFO").query_async(&mut c).await?;
    let addr = client_info
        .split(' ')
        .find_map(|f| f.strip_prefix("addr="))
        .ok_or("CLIENT INFO gave no addr")?
        .to_owned();
    // A 5 s bound (not 500 ms): on a loaded machine slowness is measured,
    // never turned into 503s.
    let store = IdempotencyStore::builder(RedisBackend::from_connection(conn.clone()))
        .prefix("tgbench")
        .timeout(Duration::from_secs(5))
        .record_ttl(Duration::from_secs(600))
        .build()?;
    let noop = crate::common::noop();
    noop.load(&conn).await?;
    let modes = [Mode::RoundTrip, Mode::First, Mode::Replay];
    let (sha, raw) = (noop.sha.clone(), conn.clone());
    let round_trip = post(move |body: Bytes| {
        let (sha, mut raw) = (sha.clone(), raw.clone());
        async move {
            let one: redis::RedisResult<i64> = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(0)
                .query_async(&mut raw)
                .await;
            match one {
                Ok(_) => create_order(body).await.into_response(),
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        }
    });
    let mut routers = [
        Router::new().route("/orders", round_trip),
        router(Some(store.clone())),
        router(Some(store)),
    ];
    let run = run_id();
    // Loads the scripts (a NOSCRIPT retry is not measured) and completes the replay's key.
    verify(&mut routers[0], Mode::RoundTrip, run, 0, false).await?;
    verify(&mut routers[1], Mode::First, run, u64::MAX, false).await?;
    verify(&mut routers[2], Mode::Replay, run, 0, false).await?;
    verify(&mut routers[2], Mode::Replay, run, 0, true).await?;

    // MONITOR, once per mode: the round trips.
    let m_n = opts.scale(500);
    let mut seen = Vec::new();
    for (c, &mode) in modes.iter().enumerate() {
        progress!("idempotency: {mode:?} under MONITOR ({m_n} requests)");
        let skip = u64::MAX / 2; // first requests' keys apart from the timed ones
        let block = time_routers(
            1,
            |_| {},
            &mut routers[c..=c],
            m_n,
            true,
            |_, i| order(mode, run, skip + i),
        );
        let per = if mode == Mode::First { 2 } else { 1 };
        seen.push(monitored(&opts.redis_url, &addr, per, async { block.await.map(drop) }).await?);
    }

    // INFO commandstats, timed rounds: commands, time and Redis CPU per request.
    let mut ns = vec![Vec::new(); modes.len()];
    let mut cpu = vec![Vec::new(); modes.len()];
    let mut stats = vec![CommandStats::default(); modes.len()];
    interleaved(
        opts.rounds,
        modes.len(),
        |round| {
            progress!(
                "idempotency: round {}/{} ({n} requests each)",
                round + 1,
                opts.rounds
            )
        },
        async |round, c| {
            let acct = Accounting::start(&admin).await?;
            // Keys numbered across rounds: a first request never repeats one.
            let from = (round * n) as u64;
            let t = time_routers(
                1,
                |_| {},
                &mut routers[c..=c],
                n,
                true,
                |_, i| order(modes[c], run, from + i),
            )
            .await?;
            let spent = acct.finish(&admin).await?;
            ns[c].push(t[0][0]);
            cpu[c].push(spent.cpu_micros / n as f64);
            for (name, s) in spent.stats.workload() {
                let e = stats[c].0.entry(name.clone()).or_default();
                e.calls += s.calls;
                e.usec += s.usec;
            }
            Ok(())
        },
    )
    .await?;
    let deleted = admin.delete_matching("tgbench:idem*").await?;

    let mut section = Section::default();
    section.heading("Idempotency keys (issue #13): round trips per request on Redis");
    section.line(format!(
        "The micro item's `POST /orders` under `IdempotencyLayer` on `RedisBackend` (one \
         multiplexed connection, prefix `tgbench`, 5 s bound, records kept 10 min), requests \
         sent one at a time; the reference row is one raw round trip more than no layer. \
         *Round trips*: commands the bench's connection sent (the layer's, or the handler's), seen by \
         `MONITOR` over {m_n} requests per row (a separate pass). *Commands per request*: \
         `INFO commandstats` call deltas ÷ requests over {n} requests per row per round, {} rounds \
         interleaved (those the scripts call included; the harness's own `INFO`/`CONFIG` left \
         out); *time inside scripts*: their `usec` ÷ requests, over all rounds; µs per request (and \
         ÷ the reference, per round) and Redis process CPU per request: medians of rounds (min–max). \
         {deleted} keys deleted afterwards.\n",
        opts.rounds
    ));
    let mut rows = Vec::new();
    for (c, &mode) in modes.iter().enumerate() {
        let total = n as u64 * opts.rounds as u64;
        let (lo, hi) = range(&ns[c]);
        let m = &seen[c];
        rows.push(vec![
            mode.label().to_owned(),
            format!("**{:.2}**", m.top_level as f64 / m_n as f64),
            m.first.join(" + "),
            format!("{:.2}", m.in_scripts as f64 / m_n as f64),
            format!("`{}`", stats[c].per_decision(total)),
            format!("{:.1} µs", stats[c].scripts().usec as f64 / total as f64),
            format!("{} ({}–{})", us(median(&ns[c])), us(lo), us(hi)),
            ratio_cell(&ratios(&ns[c], &ns[0])),
            format!("{:.1} µs", median(&cpu[c])),
        ]);
        let (what, expected) = match mode {
            Mode::First => ("first request (claim + complete)", 2.0),
            Mode::Replay => ("replay (one claim)", 1.0),
            _ => continue,
        };
        let rt = m.top_level as f64 / m_n as f64;
        let evalsha = stats[c].scripts().calls as f64 / total as f64;
        section.targets.push(Target::check(
            "13",
            format!("Redis round trips per idempotent {what} (MONITOR; commandstats EVALSHA)"),
            format!("{expected:.0}"),
            format!("{rt:.2}; {evalsha:.2}"),
            rt == expected && evalsha == expected,
        ));
    }
    section.table(
        &[
            "request",
            "round trips per request",
            "commands sent (one request)",
            "commands called by scripts per request",
            "commands per request (commandstats)",
            "time inside scripts per request",
            "µs per request",
            "÷ reference",
            "Redis CPU per request",
        ],
        &rows,
    );
    Ok(section)
}
