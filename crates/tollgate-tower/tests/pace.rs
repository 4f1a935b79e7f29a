//! The client pacing layer against a real upstream over loopback, with two
//! instances sharing one budget, on memory, a standalone Redis and a
//! three-master cluster.

#[path = "pace/upstream.rs"]
mod upstream;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_core::{
    Algorithm, Backend, FailurePolicy, MemoryBackend, Quota, RateLimiter, RedisBackend, Subject,
};
use tollgate_testkit::{unique, RedisCluster, RedisServer};
use tollgate_tower::key::KeyError;
use tollgate_tower::pace::{Pace, Throttled, Unavailable};
use tollgate_tower::rate_limit::CostHeader;
use tollgate_tower::{BoxError, PaceLayer};
use tower::{Layer, ServiceExt};
use upstream::{First, Upstream};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Two instances' stores: clones of one `MemoryBackend`, or two
/// connections of their own to one Redis.
struct Fleet {
    a: Backend,
    b: Backend,
}

fn shared_redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start().expect("start redis-server"))
}

fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start().expect("start redis cluster"))
}

async fn memory() -> Fleet {
    let one = MemoryBackend::new();
    Fleet {
        a: one.clone().into(),
        b: one.into(),
    }
}

async fn redis() -> Fleet {
    let url = shared_redis().url();
    Fleet {
        a: RedisBackend::connect(&url).await.unwrap().into(),
        b: RedisBackend::connect(&url).await.unwrap().into(),
    }
}

async fn cluster() -> Fleet {
    let seeds = shared_cluster().seeds();
    Fleet {
        a: RedisBackend::connect_cluster(seeds.clone())
            .await
            .unwrap()
            .into(),
        b: RedisBackend::connect_cluster(seeds).await.unwrap().into(),
    }
}

/// One instance's view of the provider's budget: the same prefix and name
/// on every instance make one budget.
fn budget(backend: &Backend, prefix: &str, quota: Quota) -> RateLimiter {
    RateLimiter::builder(backend.clone(), Algorithm::Gcra)
        .quota(quota)
        .prefix(prefix)
        .name("provider")
        .build()
        .unwrap()
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(uri: &str, instance: &str) -> Request<Full<Bytes>> {
    Request::get(uri)
        .header("x-instance", instance)
        .body(Full::default())
        .unwrap()
}

/// Sends one call and reads the whole body.
async fn call(svc: &Pace<HttpClient>, uri: &str, instance: &str) -> Result<StatusCode, BoxError> {
    let res = svc.clone().oneshot(get(uri, instance)).await?;
    let status = res.status();
    res.into_body().collect().await?;
    Ok(status)
}

fn throttled(result: Result<StatusCode, BoxError>) -> Throttled {
    let e = result.expect_err("the budget refuses the call");
    *e.downcast_ref::<Throttled>()
        .unwrap_or_else(|| panic!("not Throttled: {e}"))
}

/// The issue's scenario: an upstream that answers its first request 429
/// with `Retry-After: 2`, called in loops by two instances. No request of
/// either instance reaches it within the 2 s after the 429 was answered,
/// and both reach it again after.
///
/// The budget paces the fleet to one call every 50 ms (20/s, burst 1), so
/// that when the 429 is answered (a loopback round trip, well under 50 ms)
/// no other call has been admitted yet: the block reaches every call that
/// has not taken its slot, and none has taken one in between. A burst of
/// several would let calls already on the wire arrive after the 429 — the
/// upstream's stop can only hold back what has not been sent.
async fn the_fleet_waits_out_retry_after(fleet: Fleet) {
    let upstream = Upstream::start(First::new(429, &[("retry-after", "2")]), &[]).await;
    let prefix = unique("pace");
    let quota = Quota::per_second(20).with_burst(1).unwrap();
    let uri = upstream.uri("/v1/chat");
    let instances = [("a", &fleet.a), ("b", &fleet.b)].map(|(name, backend)| {
        let svc = PaceLayer::new(budget(backend, &prefix, quota)).layer(client());
        let (upstream_log, uri) = (&upstream, uri.clone());
        async move {
            // Until the upstream has answered the 429 and then seen two
            // calls of this instance.
            loop {
                let arrivals = upstream_log.arrivals();
                let after_429 = arrivals
                    .iter()
                    .skip_while(|a| a.status != 429)
                    .filter(|a| a.instance == name && a.status == 200)
                    .count();
                if after_429 >= 2 {
                    return;
                }
                let status = call(&svc, &uri, name).await.expect("the call is made");
                assert!(status == 200 || status == 429, "{status}");
            }
        }
    });
    let [a, b] = instances;
    tokio::time::timeout(Duration::from_secs(30), futures::future::join(a, b))
        .await
        .expect("both instances call again after the block");

    let arrivals = upstream.arrivals();
    let refused = &arrivals[0];
    assert_eq!(refused.status, 429, "{arrivals:?}");
    assert_eq!(
        arrivals.iter().filter(|a| a.status == 429).count(),
        1,
        "{arrivals:?}"
    );
    let until = refused.answered + Duration::from_secs(2);
    for later in &arrivals[1..] {
        assert!(
            later.at >= until,
            "a call of {} arrived {:?} after the 429 was answered",
            later.instance,
            later.at.duration_since(refused.answered)
        );
    }
    for name in ["a", "b"] {
        assert!(
            arrivals[1..].iter().any(|a| a.instance == name),
            "{name} called again: {arrivals:?}"
        );
    }
}

/// A 200 whose `RateLimit` says nothing is left blocks the budget for its
/// `t`, on the other instance too: a call that may not wait that long is
/// refused and never made.
async fn an_exhausted_ratelimit_header_blocks(fleet: Fleet) {
    let header = r#""requests";r=0;t=30"#;
    let upstream = Upstream::start(First::new(200, &[("ratelimit", header)]), &[]).await;
    let prefix = unique("pace");
    let quota = Quota::per_second(100);
    let uri = upstream.uri("/");
    let a = PaceLayer::new(budget(&fleet.a, &prefix, quota)).layer(client());
    let b = PaceLayer::new(budget(&fleet.b, &prefix, quota))
        .max_wait(Duration::from_secs(1))
        .layer(client());

    assert_eq!(call(&a, &uri, "a").await.unwrap(), 200);
    let refused = throttled(call(&b, &uri, "b").await);
    let wait = refused.retry_after().unwrap();
    assert!(
        wait > Duration::from_secs(28) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
    assert_eq!(
        upstream.arrivals().len(),
        1,
        "the refused call was not made"
    );
}

/// `Retry-After` as an HTTP-date blocks until that instant.
async fn retry_after_as_an_http_date_blocks(fleet: Fleet) {
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
    let upstream = Upstream::start(First::new(503, &[("retry-after", &date)]), &[]).await;
    let prefix = unique("pace");
    let quota = Quota::per_second(100);
    let uri = upstream.uri("/");
    let a = PaceLayer::new(budget(&fleet.a, &prefix, quota)).layer(client());
    let b = PaceLayer::new(budget(&fleet.b, &prefix, quota))
        .max_wait(Duration::ZERO)
        .layer(client());

    assert_eq!(call(&a, &uri, "a").await.unwrap(), 503);
    let wait = throttled(call(&b, &uri, "b").await).retry_after().unwrap();
    // The date has whole seconds: 29 to 30 s from when it was written.
    assert!(
        wait > Duration::from_secs(27) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
    assert_eq!(upstream.arrivals().len(), 1);
}

/// A day's `Retry-After` blocks for the layer's cap only.
async fn a_block_is_capped(fleet: Fleet) {
    let upstream = Upstream::start(First::new(429, &[("retry-after", "86400")]), &[]).await;
    let prefix = unique("pace");
    let quota = Quota::per_second(100);
    let uri = upstream.uri("/");
    let layer = |backend: &Backend| {
        PaceLayer::new(budget(backend, &prefix, quota))
            .max_block(Duration::from_secs(5))
            .max_wait(Duration::ZERO)
    };
    let a = layer(&fleet.a).layer(client());
    let b = layer(&fleet.b).layer(client());

    assert_eq!(call(&a, &uri, "a").await.unwrap(), 429);
    let wait = throttled(call(&b, &uri, "b").await).retry_after().unwrap();
    assert!(
        wait > Duration::from_secs(3) && wait <= Duration::from_secs(5),
        "{wait:?}"
    );
}

/// A `Retry-After` beyond any number of seconds, under a cap beyond the
/// year a limiter blocks at most: the block is the longest one the
/// limiter takes, never none.
async fn the_longest_block_is_kept_within_a_year(fleet: Fleet) {
    let huge = "99999999999999999999999";
    let upstream = Upstream::start(First::new(429, &[("retry-after", huge)]), &[]).await;
    let prefix = unique("pace");
    let quota = Quota::per_second(100);
    let uri = upstream.uri("/");
    let layer = |backend: &Backend| {
        PaceLayer::new(budget(backend, &prefix, quota))
            .max_block(Duration::from_secs(400 * 86_400))
            .max_wait(Duration::ZERO)
    };
    let a = layer(&fleet.a).layer(client());
    let b = layer(&fleet.b).layer(client());

    assert_eq!(call(&a, &uri, "a").await.unwrap(), 429);
    let wait = throttled(call(&b, &uri, "b").await).retry_after().unwrap();
    let year = tollgate_core::admin::LONGEST_BLOCK;
    assert!(
        wait > year - Duration::from_secs(60) && wait <= year,
        "{wait:?}"
    );
}

/// A call whose slot is further off than `max_wait` is refused at once
/// with the honest wait, and never made; one within it waits for its slot.
async fn a_slot_beyond_max_wait_is_throttled(fleet: Fleet) {
    let upstream = Upstream::start(First::new(200, &[]), &[]).await;
    let prefix = unique("pace");
    let uri = upstream.uri("/");
    let a = PaceLayer::new(budget(&fleet.a, &prefix, Quota::per_minute(1)))
        .max_wait(Duration::from_millis(200))
        .layer(client());
    let b = PaceLayer::new(budget(&fleet.b, &prefix, Quota::per_minute(1)))
        .max_wait(Duration::from_millis(200))
        .layer(client());

    assert_eq!(call(&a, &uri, "a").await.unwrap(), 200);
    let started = Instant::now();
    let wait = throttled(call(&b, &uri, "b").await).retry_after().unwrap();
    assert!(wait > Duration::from_secs(58), "{wait:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused without waiting the minute out"
    );
    assert_eq!(
        upstream.arrivals().len(),
        1,
        "the refused call was not made"
    );
}

/// The client's own error comes back boxed and unchanged; its call's
/// charge stays (it may have reached the upstream).
async fn the_clients_errors_pass_through(fleet: Fleet) {
    #[derive(Debug, PartialEq)]
    struct Refused(u32);
    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "connection refused #{}", self.0)
        }
    }
    impl std::error::Error for Refused {}

    let prefix = unique("pace");
    let limiter = budget(&fleet.a, &prefix, Quota::per_minute(10));
    let failing = tower::service_fn(|_: Request<()>| async { Err::<Response<()>, _>(Refused(7)) });
    let svc = PaceLayer::new(limiter.clone()).layer(failing);
    let e = svc.oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(e.downcast_ref::<Refused>(), Some(&Refused(7)));

    // A real client against a closed port: hyper-util's error, as it is.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}/", closed.local_addr().unwrap());
    drop(closed);
    let svc = PaceLayer::new(limiter.clone()).layer(client());
    let e = call(&svc, &uri, "a").await.unwrap_err();
    assert!(
        e.is::<hyper_util::client::legacy::Error>(),
        "not the client's error: {e}"
    );

    let other = budget(&fleet.b, &prefix, Quota::per_minute(10));
    let left = other.check_n("global", 0).await.unwrap().remaining;
    assert_eq!(left, 8, "both failed calls keep their charge");
}

/// `settle_from`: a call charged its estimate is settled to the cost its
/// response reports, before the response is handed back; the other
/// instance sees the budget as really used.
async fn settle_from_settles_to_the_reported_cost(fleet: Fleet) {
    let upstream = Upstream::start(First::new(200, &[("x-tokens-used", "30")]), &[]).await;
    let prefix = unique("pace");
    // 1000 tokens an hour: nothing refills in the time the test takes.
    let quota = Quota::per_hour(1000);
    let uri = upstream.uri("/v1/chat");
    let a = PaceLayer::new(budget(&fleet.a, &prefix, quota))
        .cost(100)
        .settle_from(CostHeader::new("x-tokens-used"))
        .layer(client());
    let other = budget(&fleet.b, &prefix, quota);
    let global = Subject::new("global");

    assert_eq!(call(&a, &uri, "a").await.unwrap(), 200);
    assert_eq!(other.inspect(&global).await.unwrap().remaining, 970);
    // A response that says nothing (the second answer has no header)
    // leaves the estimate.
    assert_eq!(call(&a, &uri, "a").await.unwrap(), 200);
    assert_eq!(other.inspect(&global).await.unwrap().remaining, 870);
}

/// Keyed per upstream host, a block holds back that host's budget only.
async fn a_block_holds_only_its_own_budget(fleet: Fleet) {
    let stopped = Upstream::start(First::new(429, &[("retry-after", "30")]), &[]).await;
    let open = Upstream::start(First::new(200, &[]), &[]).await;
    let prefix = unique("pace");
    let by_host = |req: &http::request::Parts| -> Result<Option<Subject>, KeyError> {
        Ok(req.uri.authority().map(|a| Subject::new(a.as_str())))
    };
    let layer = |backend: &Backend| {
        PaceLayer::new(budget(backend, &prefix, Quota::per_second(100)))
            .key(by_host)
            .max_wait(Duration::ZERO)
    };
    let a = layer(&fleet.a).layer(client());
    let b = layer(&fleet.b).layer(client());
    let send = |svc: Pace<HttpClient, _>, uri: String| async move {
        let res = svc.oneshot(get(&uri, "x")).await?;
        Ok::<_, BoxError>(res.status())
    };

    assert_eq!(send(a.clone(), stopped.uri("/")).await.unwrap(), 429);
    throttled(send(b.clone(), stopped.uri("/")).await);
    assert_eq!(send(b.clone(), open.uri("/")).await.unwrap(), 200);
    assert_eq!(stopped.arrivals().len(), 1);
}

/// Services and their futures can be shared across tasks, as a client is.
#[test]
fn services_and_futures_are_send_and_sync() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    fn sendable<T: Send + 'static>() {}
    shareable::<Pace<HttpClient>>();
    shareable::<PaceLayer>();
    sendable::<<Pace<HttpClient> as tower::Service<Request<Full<Bytes>>>>::Future>();
}

/// A store that fails: under `FailurePolicy::Deny` the call ends with
/// `Unavailable` and is never made; under `Allow` it goes, and a 429 it
/// gets back is handed back though the budget cannot be blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_follows_the_failure_policy() {
    let mut server = RedisServer::start().expect("start redis-server");
    let backend: Backend = RedisBackend::connect(&server.url()).await.unwrap().into();
    let upstream = Upstream::start(First::new(429, &[("retry-after", "2")]), &[]).await;
    let uri = upstream.uri("/");
    let layer = |policy| {
        let limiter = RateLimiter::builder(backend.clone(), Algorithm::Gcra)
            .quota(Quota::per_second(10))
            .name("provider")
            .failure_policy(policy)
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        PaceLayer::new(limiter).layer(client())
    };
    let deny = layer(FailurePolicy::Deny);
    let allow = layer(FailurePolicy::Allow);
    server.stop();

    let e = call(&deny, &uri, "a").await.unwrap_err();
    assert!(e.is::<Unavailable>(), "not Unavailable: {e}");
    assert!(upstream.arrivals().is_empty(), "the call was not made");

    assert_eq!(call(&allow, &uri, "a").await.unwrap(), 429);
    assert_eq!(upstream.arrivals().len(), 1);
}

macro_rules! on_every_backend {
    ($($backend:ident),+; $scenarios:tt) => {
        $(on_every_backend!(@one $backend $scenarios);)+
    };
    (@one $backend:ident [$($scenario:ident),+ $(,)?]) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    crate::$scenario(crate::$backend().await).await;
                }
            )+
        }
    };
}

on_every_backend!(memory, redis, cluster; [
    the_fleet_waits_out_retry_after,
    an_exhausted_ratelimit_header_blocks,
    retry_after_as_an_http_date_blocks,
    a_block_is_capped,
    the_longest_block_is_kept_within_a_year,
    a_slot_beyond_max_wait_is_throttled,
    the_clients_errors_pass_through,
    settle_from_settles_to_the_reported_cost,
    a_block_holds_only_its_own_budget,
]);
