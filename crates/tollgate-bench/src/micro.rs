//! In-process costs, without any network: tollgate's memory backend against
//! the `governor` crate (what tower_governor runs), and the pieces of a
//! tollgate check that cost a system call or an allocation.

use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{Quota as GQuota, RateLimiter as GLimiter};
use tollgate_core::{Algorithm, MemoryBackend, Quota, RateLimiter, Subject};

use crate::common::interleaved;
use crate::common::{progress, BenchResult, Opts, Section};
use crate::stats::median;

const RATE: u64 = 1_000_000;

/// Runs the micro-benchmarks.
pub(crate) async fn run(opts: &Opts) -> BenchResult<Section> {
    let n = opts.scale(200_000);
    let quota = Quota::per_second(RATE).with_burst(RATE)?;
    let tg = |cache: usize| {
        RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
            .quota(quota)
            .deny_cache(cache)
            .build()
    };
    let tg_default = tg(10_000)?;
    let tg_nocache = tg(0)?;
    let gov = GLimiter::keyed(
        GQuota::per_second(NonZeroU32::new(RATE as u32).expect("non-zero"))
            .allow_burst(NonZeroU32::new(RATE as u32).expect("non-zero")),
    );
    // governor on the OS's monotonic clock: its default reads the TSC
    // through quanta, which is not monotonic across cores whose counters
    // are not in step; tollgate reads the TSC only
    // where the kernel times itself by it (and has checked the cores).
    let gov_std = GLimiter::dashmap_with_clock(
        GQuota::per_second(NonZeroU32::new(RATE as u32).expect("non-zero"))
            .allow_burst(NonZeroU32::new(RATE as u32).expect("non-zero")),
        governor::clock::MonotonicClock,
    );
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let subject = Subject::from(ip);
    let bound_os =
        crate::micro_sketch::sketch::<IpAddr, _>(RATE as u32, governor::clock::MonotonicClock);
    let bound_tsc = crate::micro_sketch::sketch::<IpAddr, _>(
        RATE as u32,
        governor::clock::DefaultClock::default(),
    );
    let names = [
        "tollgate `check`, memory backend, GCRA (deny cache on, default)",
        "tollgate `check`, memory backend, GCRA (deny cache off)",
        "governor keyed `check_key` (GCRA; what tower_governor runs)",
        "`getrandom::fill` of 8 bytes (the sliding log draws a nonce per check)",
        "`tokio::time::timeout` around a ready future (tollgate bounds every round trip)",
        "`Subject::from(IpAddr)` + key string (per check)",
        "tollgate `try_check_now`, memory backend, GCRA (deny cache on; what the middleware \
         calls: the subject borrowed, no future)",
        "`SystemTime::now` + `Instant::now` (the OS's clocks; a memory check reads its store's \
         clock once, the TSC where the kernel's clock source is `tsc`, else these)",
        "(bound) governor's keyed GCRA on the OS's monotonic clock (what tollgate's stores \
         read where the kernel does not time itself by the TSC), answering what tollgate's \
         `check` answers: an async call, the subject taken by value, a `Decision` with its \
         figures and charge (a mirror of the type), and nothing else — no keyspace, block, deny \
         cache or breaker",
        "(bound) the same on governor's default TSC clock (what tollgate's stores read where \
         the kernel times itself by it)",
        "(reference) governor keyed `check_key` on `std::time::Instant` (its `MonotonicClock`) \
         instead of its default TSC clock",
    ];
    let k = names.len();
    let mut ns = vec![Vec::new(); k];
    interleaved(
        opts.rounds,
        k,
        |round| {
            progress!(
                "micro: round {}/{} ({n} calls each)",
                round + 1,
                opts.rounds
            )
        },
        async |_, c| {
            let t0 = Instant::now();
            match c {
                0 => {
                    for _ in 0..n {
                        tg_default.check(&subject).await?;
                    }
                }
                1 => {
                    for _ in 0..n {
                        tg_nocache.check(&subject).await?;
                    }
                }
                2 => {
                    for _ in 0..n {
                        let _ = std::hint::black_box(gov.check_key(&ip));
                    }
                }
                3 => {
                    let mut b = [0u8; 8];
                    for _ in 0..n {
                        getrandom::fill(&mut b)?;
                        std::hint::black_box(&b);
                    }
                }
                4 => {
                    for _ in 0..n {
                        let r =
                            tokio::time::timeout(Duration::from_millis(100), async { 1u8 }).await;
                        std::hint::black_box(r.ok());
                    }
                }
                5 => {
                    for _ in 0..n {
                        let s = Subject::from(std::hint::black_box(ip));
                        std::hint::black_box(tg_nocache.keys_for(&s));
                    }
                }
                6 => {
                    for _ in 0..n {
                        match tg_default.try_check_now(&subject, 1) {
                            Ok(decided) => {
                                std::hint::black_box(decided?);
                            }
                            Err(_) => return Err("the memory backend answers in process".into()),
                        }
                    }
                }
                7 => {
                    for _ in 0..n {
                        std::hint::black_box(std::time::SystemTime::now());
                        std::hint::black_box(Instant::now());
                    }
                }
                8 => {
                    for _ in 0..n {
                        // Held in memory, as a `Decision` returned to a caller is.
                        let d = std::hint::black_box(
                            crate::micro_sketch::check(&bound_os, RATE, &ip).await,
                        );
                        std::hint::black_box(d.ok_or("the bound never denies")?.touch());
                    }
                }
                9 => {
                    for _ in 0..n {
                        // Held in memory, as a `Decision` returned to a caller is.
                        let d = std::hint::black_box(
                            crate::micro_sketch::check(&bound_tsc, RATE, &ip).await,
                        );
                        std::hint::black_box(d.ok_or("the bound never denies")?.touch());
                    }
                }
                _ => {
                    for _ in 0..n {
                        let _ = std::hint::black_box(gov_std.check_key(&ip));
                    }
                }
            }
            ns[c].push(t0.elapsed().as_nanos() as f64 / n as f64);
            Ok(())
        },
    )
    .await?;
    let stack = stack(opts).await?;
    let mut section = Section::default();
    section.heading("Micro: in-process costs (one thread, no network)");
    section.line(format!(
        "{n} calls per row per round, one subject (an IPv4 address), quota {RATE}/s with a \
         burst of {RATE} (never denied), {} rounds interleaved; ns per call, median of \
         rounds (min–max). Run on the bench's current-thread runtime. The ratio to governor \
         is taken per round (both measured in that round), median and range of rounds.\n",
        opts.rounds
    ));
    let mut rows = Vec::new();
    for c in 0..k {
        let (lo, hi) = crate::stats::range(&ns[c]);
        rows.push(vec![
            names[c].to_owned(),
            format!("**{:.0}** ({lo:.0}–{hi:.0})", median(&ns[c])),
            crate::stats::ratio_cell(&crate::stats::ratios(&ns[c], &ns[2])),
            crate::stats::ratio_cell(&crate::stats::ratios(&ns[c], &ns[k - 1])),
        ]);
    }
    section.table(
        &[
            "operation",
            "ns per call",
            "÷ governor check",
            "÷ governor check on the OS clock",
        ],
        &rows,
    );
    section.line(format!(
        "\nThe HTTP item's router in process: `Router::call` on a `GET /` carrying \
         `ConnectInfo`, the response's body dropped unread; {} requests per row per round, \
         same interleaving. The difference to \"no limiter\" is what each layer costs a request.\n",
        opts.scale(100_000)
    ));
    section.table(
        &[
            "router",
            "ns per request",
            "over no limiter",
            "requests/s ÷ tower_governor",
            "added ns ÷ tower_governor's (per round)",
            "added ns ÷ tower_governor's with its headers on",
        ],
        &stack,
    );
    crate::idempotency::in_process(opts, &mut section).await?;
    Ok(section)
}

/// The HTTP item's routers driven in process, request by request.
async fn stack(opts: &Opts) -> BenchResult<Vec<Vec<String>>> {
    use crate::http::Variant;

    let n = opts.scale(100_000);
    let variants = [
        Variant::None,
        Variant::TollgateMemory,
        Variant::TollgateMemoryNoHeaders,
        Variant::Governor,
        Variant::GovernorHeaders,
        Variant::RouterSketch,
    ];
    let mut routers = Vec::new();
    for v in variants {
        routers.push(in_process_router(v).await?);
    }
    let (gov, gov_headers) = (3, 4);
    let ns = time_routers(
        opts.rounds,
        |round| progress!("micro: router round {}/{}", round + 1, opts.rounds),
        &mut routers,
        n,
        false,
        |_, _| get_request(),
    )
    .await?;
    let base = median(&ns[0]);
    let gov_m = median(&ns[gov]);
    // What each layer adds to a request, per round: its time less the
    // same round's "no limiter".
    let added = |c: usize| -> Vec<f64> { ns[c].iter().zip(&ns[0]).map(|(x, b)| x - b).collect() };
    let over = |c: usize, g: usize| {
        if c == 0 {
            "—".to_owned()
        } else {
            crate::stats::ratio_cell(&crate::stats::ratios(&added(c), &added(g)))
        }
    };
    Ok((0..variants.len())
        .map(|c| {
            let (lo, hi) = crate::stats::range(&ns[c]);
            let m = median(&ns[c]);
            vec![
                variants[c].label().to_owned(),
                format!("**{m:.0}** ({lo:.0}–{hi:.0})"),
                format!("{:+.0} ns", m - base),
                format!("{:.2}×", gov_m / m),
                over(c, gov),
                over(c, gov_headers),
            ]
        })
        .collect())
}

/// Drives `routers` in process: `n` requests per router per round, routers
/// interleaved over `rounds` rounds ([`interleaved`]; `start(round)` as a
/// round begins). `request(router, i)` builds that router's `i`-th request
/// (numbered across rounds, from 0); a response must be a success, and its
/// body is read to its end when `read_body` (else dropped unread). Returns
/// ns per request, one entry per round, per router.
pub(crate) async fn time_routers(
    rounds: usize,
    start: impl FnMut(usize),
    routers: &mut [axum::Router],
    n: usize,
    read_body: bool,
    mut request: impl FnMut(usize, u64) -> BenchResult<http::Request<axum::body::Body>>,
) -> BenchResult<Vec<Vec<f64>>> {
    let k = routers.len();
    let mut ns = vec![Vec::new(); k];
    let mut sent = vec![0u64; k];
    interleaved(rounds, k, start, async |_, c| {
        let router = &mut routers[c];
        let t0 = Instant::now();
        for _ in 0..n {
            let res = send(router, request(c, sent[c])?)
                .await
                .map_err(|e| format!("router {c}, request {}: {e}", sent[c]))?;
            sent[c] += 1;
            if read_body {
                std::hint::black_box(axum::body::to_bytes(res.into_body(), usize::MAX).await?);
            } else {
                std::hint::black_box(res);
            }
        }
        ns[c].push(t0.elapsed().as_nanos() as f64 / n as f64);
        Ok(())
    })
    .await?;
    Ok(ns)
}

/// The `stack` command: `requests` requests through one variant's router.
pub(crate) async fn drive_stack(variant: crate::http::Variant, requests: u64) -> BenchResult<()> {
    if variant.on_redis() {
        return Err("`stack` runs in process only; use `http` for the Redis variants".into());
    }
    let mut router = in_process_router(variant).await?;
    let t0 = Instant::now();
    for _ in 0..requests {
        std::hint::black_box(send(&mut router, get_request()?).await?);
    }
    println!(
        "{}: {requests} requests, {:.0} ns per request",
        variant.label(),
        t0.elapsed().as_nanos() as f64 / requests as f64
    );
    Ok(())
}

/// The HTTP item's app for `variant` (not a Redis one), ready for
/// `Router::call`.
async fn in_process_router(variant: crate::http::Variant) -> BenchResult<axum::Router> {
    let serve = crate::http::ServeOpts {
        variant,
        redis_url: String::new(),
        port: 0,
        workers: None,
    };
    // As `axum::serve` does: endpoints become routes once, not per request.
    Ok(crate::http::app(&serve).await?.with_state(()))
}

/// `GET /` from a fixed peer, carrying `ConnectInfo` (the HTTP item's request).
fn get_request() -> BenchResult<http::Request<axum::body::Body>> {
    const PEER: std::net::SocketAddr = std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::LOCALHOST,
        40_000,
    ));
    let mut req = http::Request::get("/").body(axum::body::Body::empty())?;
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(PEER));
    Ok(req)
}

/// `req` through `router` (`Router::call`: an axum router is always ready);
/// an error unless the response is a success.
pub(crate) async fn send(
    router: &mut axum::Router,
    req: http::Request<axum::body::Body>,
) -> BenchResult<http::Response<axum::body::Body>> {
    use tower::Service;

    let res = router.call(req).await?;
    if !res.status().is_success() {
        return Err(format!("status {}", res.status()).into());
    }
    Ok(res)
}
