//! Item 4: an axum hello-world under `wrk` over loopback — no limiter,
//! tollgate in memory, tollgate on Redis (coalesced, the default, and one
//! call per check as a diagnostic), and tower_governor — each served by
//! a child process of this binary (`serve --variant …`), rounds interleaved.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use tollgate_core::{
    Algorithm, Coalescing, FailurePolicy, MemoryBackend, Quota, QuotaLeases, RateLimiter,
    RedisBackend,
};
use tollgate_tower::key::PeerIp;
use tollgate_tower::RateLimitLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

use crate::common::{progress, BenchResult, Opts, Section, Target, Verdict};
use crate::stats::{median, per_sec, ratio_cell, ratios, rotation};

/// What the served app runs in front of its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Variant {
    /// No limiter.
    None,
    /// tollgate's `RateLimitLayer` (GCRA, peer IP) on the memory backend.
    TollgateMemory,
    /// tollgate's `RateLimitLayer` (GCRA, peer IP) on Redis, as
    /// `RedisBackend` comes: checks coalesced (issue #15).
    TollgateRedis,
    /// As `tollgate-redis` with `Coalescing::off()`: one script call per
    /// check (diagnostic).
    TollgateRedisSingle,
    /// As `tollgate-memory` with the `RateLimit` headers off (diagnostic).
    TollgateMemoryNoHeaders,
    /// tower_governor's `GovernorLayer` (GCRA, peer IP).
    Governor,
    /// As `governor` with `.use_headers()`: `x-ratelimit-limit` and
    /// `x-ratelimit-remaining` on every response (its headers on).
    GovernorHeaders,
    /// As `tollgate-redis` with quota leases on (`QuotaLeases::default()`):
    /// the one hot key is served from slices taken in one call.
    TollgateRedisLeased,
    /// The bound: the least work a Redis-backed limiter can add
    /// ([`crate::http_sketch`]).
    Sketch,
    /// The in-process bound: the least a layer of tollgate's shape adds
    /// ([`crate::router_sketch`]).
    RouterSketch,
}

impl Variant {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Variant::None => "no limiter",
            Variant::TollgateMemory => "tollgate `RateLimitLayer`, memory backend",
            Variant::TollgateRedis => {
                "tollgate `RateLimitLayer`, Redis backend (coalesced, the default)"
            }
            Variant::TollgateRedisSingle => {
                "(diagnostic) tollgate `RateLimitLayer`, Redis backend, `Coalescing::off()`"
            }
            Variant::TollgateMemoryNoHeaders => {
                "(diagnostic) tollgate `RateLimitLayer`, memory backend, `.headers(false)`"
            }
            Variant::Governor => "tower_governor `GovernorLayer`",
            Variant::GovernorHeaders => "tower_governor `GovernorLayer`, `.use_headers()`",
            Variant::TollgateRedisLeased => {
                "tollgate `RateLimitLayer`, Redis backend, quota leases on"
            }
            Variant::Sketch => {
                "(bound) the least-work Redis limiter: one fixed key, a batch per call"
            }
            Variant::RouterSketch => {
                "(bound) the least-work layer of tollgate's shape: checked in its future, \
                 the decision in the extensions, draft-10 headers"
            }
        }
    }

    /// Whether the variant needs Redis (`stack` does not offer those).
    pub(crate) fn on_redis(self) -> bool {
        matches!(
            self,
            Variant::TollgateRedis
                | Variant::TollgateRedisSingle
                | Variant::TollgateRedisLeased
                | Variant::Sketch
        )
    }

    fn arg(self) -> &'static str {
        match self {
            Variant::None => "none",
            Variant::TollgateMemory => "tollgate-memory",
            Variant::TollgateRedis => "tollgate-redis",
            Variant::TollgateRedisSingle => "tollgate-redis-single",
            Variant::TollgateMemoryNoHeaders => "tollgate-memory-no-headers",
            Variant::Governor => "governor",
            Variant::GovernorHeaders => "governor-headers",
            Variant::TollgateRedisLeased => "tollgate-redis-leased",
            Variant::Sketch => "sketch",
            Variant::RouterSketch => "router-sketch",
        }
    }
}

/// Options of `serve`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServeOpts {
    /// What runs in front of the handler.
    #[arg(long, value_enum)]
    pub(crate) variant: Variant,
    /// The Redis of the `tollgate-redis*` variants.
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    pub(crate) redis_url: String,
    /// The loopback port to listen on (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 0)]
    pub(crate) port: u16,
    /// tokio worker threads (default: one per core).
    #[arg(long)]
    pub(crate) workers: Option<usize>,
}

/// One million per second with a burst of one million, for every variant:
/// large enough that nobody is denied, so every request pays for a full check.
const RATE: u64 = 1_000_000;

async fn hello() -> &'static str {
    "Hello, World!"
}

fn tollgate_layer(limiter: RateLimiter) -> RateLimitLayer<PeerIp> {
    RateLimitLayer::new(limiter).key(PeerIp::new())
}

pub(crate) async fn app(opts: &ServeOpts) -> BenchResult<Router> {
    let router = Router::new().route("/", get(hello));
    let quota = Quota::per_second(RATE).with_burst(RATE)?;
    Ok(match opts.variant {
        Variant::None => router,
        Variant::TollgateMemory | Variant::TollgateMemoryNoHeaders => {
            let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
                .quota(quota)
                .name("http")
                .build()?;
            router.layer(tollgate_layer(limiter).headers(opts.variant == Variant::TollgateMemory))
        }
        Variant::TollgateRedis | Variant::TollgateRedisSingle | Variant::TollgateRedisLeased => {
            let conn = redis::Client::open(opts.redis_url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let mut backend = RedisBackend::from_connection(conn);
            if opts.variant == Variant::TollgateRedisSingle {
                backend = backend.with_coalescing(Coalescing::off());
            }
            // Deny on failure (503s are counted), so a slow Redis can never
            // look fast by failing open; a 5 s bound instead of the default
            // 100 ms, so that CPU starvation on a shared machine is measured
            // as slowness, not as failures.
            let mut builder = RateLimiter::builder(backend, Algorithm::Gcra)
                .quota(quota)
                .prefix("tgbench")
                .name("http")
                .failure_policy(FailurePolicy::Deny)
                .timeout(std::time::Duration::from_secs(5));
            if opts.variant == Variant::TollgateRedisLeased {
                builder = builder.quota_leases(QuotaLeases::default());
            }
            let limiter = builder.build()?;
            router.layer(tollgate_layer(limiter))
        }
        Variant::Sketch => {
            let conn = redis::Client::open(opts.redis_url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            let queue = crate::http_sketch::start(conn, "tgbench:sketch:http".into(), RATE).await?;
            router.layer(axum::middleware::from_fn_with_state(
                queue,
                crate::http_sketch::limit,
            ))
        }
        Variant::RouterSketch => router.layer(crate::router_sketch::SketchLayer::new(RATE as u32)),
        Variant::Governor => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1_000_000_000 / RATE)
                .burst_size(RATE as u32)
                .finish()
                .ok_or("invalid governor configuration")?;
            router.layer(GovernorLayer::new(Arc::new(config)))
        }
        Variant::GovernorHeaders => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1_000_000_000 / RATE)
                .burst_size(RATE as u32)
                .use_headers()
                .finish()
                .ok_or("invalid governor configuration")?;
            router.layer(GovernorLayer::new(Arc::new(config)))
        }
    })
}

/// `serve`: runs one variant until killed, printing `listening <addr>` first.
pub(crate) fn serve(opts: &ServeOpts) -> BenchResult<()> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(w) = opts.workers {
        rt.worker_threads(w);
    }
    rt.enable_all().build()?.block_on(async {
        let app = app(opts).await?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port)).await?;
        println!("listening {}", listener.local_addr()?);
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await?;
        Ok(())
    })
}

/// Options of the HTTP benchmark.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct HttpOpts {
    /// The wrk binary.
    #[arg(long, default_value = "wrk")]
    pub(crate) wrk: String,
    /// Seconds per wrk run.
    #[arg(long, default_value_t = 5)]
    pub(crate) duration: u64,
    /// wrk connections.
    #[arg(long, default_value_t = 32)]
    pub(crate) connections: u32,
    /// tokio worker threads of the served app (default: one per core).
    #[arg(long)]
    pub(crate) workers: Option<usize>,
}

struct Server {
    variant: Variant,
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(variant: Variant, redis_url: &str, workers: Option<usize>) -> BenchResult<Server> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([
        "serve",
        "--variant",
        variant.arg(),
        "--redis-url",
        redis_url,
    ]);
    if let Some(w) = workers {
        cmd.args(["--workers", &w.to_string()]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .stdin(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix("listening ") else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("serve --variant {}: said {line:?}", variant.arg()).into());
    };
    Ok(Server {
        variant,
        addr: addr.to_owned(),
        child,
    })
}

/// One wrk run: requests/s and non-2xx responses.
fn wrk(opts: &HttpOpts, addr: &str, seconds: u64) -> BenchResult<(f64, u64)> {
    let out = Command::new(&opts.wrk)
        .args([
            "-t1",
            &format!("-c{}", opts.connections),
            &format!("-d{seconds}s"),
            &format!("http://{addr}/"),
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", opts.wrk))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    let rps: f64 = field("Requests/sec:")
        .ok_or_else(|| format!("no Requests/sec in wrk's output: {text}"))?
        .parse()?;
    let errors = field("Non-2xx or 3xx responses:")
        .map(|v| v.parse::<u64>())
        .transpose()?
        .unwrap_or(0);
    Ok((rps, errors))
}

/// Runs item 4.
pub(crate) fn run(opts: &Opts, http: &HttpOpts) -> BenchResult<Section> {
    let variants = [
        Variant::None,
        Variant::TollgateMemory,
        Variant::TollgateRedis,
        Variant::Governor,
        Variant::TollgateMemoryNoHeaders,
        Variant::TollgateRedisSingle,
        Variant::TollgateRedisLeased,
        Variant::Sketch,
    ];
    let servers: Vec<Server> = variants
        .iter()
        .map(|&v| start(v, &opts.redis_url, http.workers))
        .collect::<BenchResult<_>>()?;
    let seconds = if opts.quick { 1 } else { http.duration };
    for s in &servers {
        progress!("http: warming up {}", s.variant.arg());
        wrk(http, &s.addr, 1)?;
    }
    let k = servers.len();
    let mut rps = vec![Vec::new(); k];
    let mut errors = vec![0u64; k];
    for round in 0..opts.rounds {
        progress!(
            "http: round {}/{} (wrk -t1 -c{} -d{seconds}s per variant)",
            round + 1,
            opts.rounds,
            http.connections
        );
        for i in rotation(round, k) {
            let (r, e) = wrk(http, &servers[i].addr, seconds)?;
            rps[i].push(r);
            errors[i] += e;
        }
    }
    drop(servers);
    let mut section = Section::default();
    section.heading("4. HTTP: axum hello-world under wrk");
    section.line(format!(
        "`wrk -t1 -c{} -d{seconds}s` over loopback against each variant in turn (rotating \
         order), {} rounds after a 1 s warm-up each. Each variant is its own process \
         (`tollgate-bench serve --variant …`, tokio multi-thread runtime, {} workers) on \
         the same machine as wrk and Redis. Every limiter: GCRA, keyed by peer IP, \
         {RATE}/s with a burst of {RATE} (nobody is denied; non-2xx responses are \
         counted). tollgate with its defaults (draft-10 `RateLimit` headers on, deny \
         cache on), except on Redis: failing closed, with a 5 s timeout per check; the Redis \
         backend as it comes coalesces checks (issue #15), the diagnostic row turns that off \
         (`Coalescing::off()`: one script call per check). Ratios are per round.\n",
        http.connections,
        opts.rounds,
        http.workers
            .map_or("one per core".to_owned(), |w| w.to_string()),
    ));
    let at = |v: Variant| {
        variants
            .iter()
            .position(|&x| x == v)
            .expect("every variant is run")
    };
    let (none, memory, redis, governor, leased) = (
        at(Variant::None),
        at(Variant::TollgateMemory),
        at(Variant::TollgateRedis),
        at(Variant::Governor),
        at(Variant::TollgateRedisLeased),
    );
    let ratio = |a: usize, b: usize| ratios(&rps[a], &rps[b]);
    let mut rows = Vec::new();
    for i in 0..k {
        rows.push(vec![
            variants[i].label().to_owned(),
            per_sec(median(&rps[i])),
            ratio_cell(&ratio(i, none)),
            ratio_cell(&ratio(i, governor)),
            errors[i].to_string(),
        ]);
    }
    section.table(
        &[
            "variant",
            "requests/s",
            "÷ no limiter",
            "÷ tower_governor",
            "non-2xx",
        ],
        &rows,
    );
    let r = median(&ratio(redis, none));
    section.targets.push(Target::check(
        "4",
        "HTTP requests/s, tollgate Redis ÷ no limiter",
        "≥ 0.75×",
        format!("{r:.2}×"),
        r >= 0.75,
    ));
    let r = median(&ratio(redis, none));
    section.targets.push(Target::check(
        "4",
        "HTTP requests/s, tollgate Redis (coalesced) ÷ no limiter (issue #15)",
        "≥ 0.6×",
        format!("{r:.2}×"),
        r >= 0.6,
    ));
    let r = median(&ratio(at(Variant::Sketch), none));
    section.line(format!(
        "\n**Bound**: the least-work Redis limiter (one fixed key, every queued request in one \
         call of a minimal GCRA script, one call in flight, no headers) serves **{r:.2}×** the \
         requests of no limiter here: a bound, in this run, on a limiter that sends every \
         decision to this Redis (leases do not).\n"
    ));
    let r = median(&ratio(leased, none));
    section.targets.push(Target::check(
        "4",
        "HTTP requests/s, tollgate Redis with quota leases, one hot key ÷ no limiter (issue #25)",
        "≥ 0.8×",
        format!("{r:.2}×"),
        r >= 0.8,
    ));
    let r = median(&ratio(memory, governor));
    section.targets.push(Target::check(
        "4",
        "HTTP requests/s, tollgate memory ÷ tower_governor",
        "≥ 1.0×",
        format!("{r:.2}×"),
        r >= 1.0,
    ));
    let e: u64 = errors.iter().sum();
    if e > 0 {
        section.targets.push(Target::new(
            "4",
            "non-2xx responses during the HTTP runs",
            "0",
            e.to_string(),
            Verdict::Missed,
        ));
    }
    Ok(section)
}
