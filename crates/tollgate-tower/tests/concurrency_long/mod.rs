//! Requests and streamed bodies that run past the permit's hold cap
//! (`LockOptions::max_hold`): the layer keeps their permit for as long as
//! they live, so "at most N in flight" holds past any cap with a healthy
//! backend. Part of `concurrency.rs` (its app, probes and backends).

use std::time::{Duration, Instant};

use http::StatusCode;
use http_body_util::BodyExt;
use tollgate_core::{LockOptions, Semaphore, Subject};
use tollgate_tower::ConcurrencyLimitLayer;
use tower::ServiceExt;

use super::{
    app, assert_too_many, fence_of, join, key, name_of, policy, req, send, spawn_send, unique, Env,
    ProbeRx, BOUND, HOLD,
};

/// A short TTL and cap, so that a permit the cap let lapse would be free
/// again well within the test — but not so short that a renewal delayed by
/// a loaded machine's scheduler (seen: over 100 ms) lets it lapse.
const TTL: Duration = Duration::from_millis(300);
const CAP: Duration = Duration::from_millis(800);

/// How long each holder is kept in flight: several caps and many TTLs.
const PAST_THE_CAP: Duration = Duration::from_millis(2400);

/// One permit per key under a layer, and the key the test holds.
struct Limited {
    semaphore: Semaphore,
    app: axum::Router,
    p: ProbeRx,
    ns: String,
    r: String,
    name: Subject,
}

impl Limited {
    /// A layer that takes permits with `options`.
    async fn new(env: &Env, options: LockOptions) -> Self {
        let semaphore = env.semaphore(1).await;
        let ns = unique("cap");
        let p = ProbeRx::new();
        let app = app(
            ConcurrencyLimitLayer::new(semaphore.clone(), key())
                .namespace(&ns)
                .options(options),
            p.probe.clone(),
        );
        let r = unique("k");
        let name = name_of(&ns, &r);
        Limited {
            semaphore,
            app,
            p,
            ns,
            r,
            name,
        }
    }

    /// TTL 300 ms, cap 800 ms.
    async fn capped(env: &Env) -> Self {
        Self::new(env, LockOptions::new().ttl(TTL).max_hold(CAP)).await
    }

    async fn in_use(&self) -> u32 {
        self.semaphore.in_use(self.name.clone()).await.unwrap()
    }

    /// Until `until`, another request of the key is refused every time and
    /// exactly one permit is in use: the holder's, still renewed.
    async fn refused_until(&self, until: Instant) {
        let mut probes = 0;
        loop {
            let b = send(
                &self.app,
                req("/work", &[("x-res", &self.r), ("x-id", "b")]),
            )
            .await;
            if b.status == StatusCode::OK {
                panic!("a second request ran beside the holder after {probes} refusals");
            }
            assert_too_many(&b, &policy(&self.ns, 1));
            assert_eq!(self.in_use().await, 1);
            probes += 1;
            if Instant::now() >= until {
                return;
            }
            // Probe a few times per TTL: any lapse longer than that is seen.
            tokio::time::sleep(TTL / 3).await;
        }
    }

    /// The key is free, and the next request of it runs.
    async fn free_again(&self) {
        assert_eq!(self.in_use().await, 0);
        let c = send(
            &self.app,
            req("/work", &[("x-res", &self.r), ("x-id", "c")]),
        )
        .await;
        fence_of(&c);
    }
}

/// A handler held 2.4 s: another request of the key is refused all along,
/// and admitted once the holder ends.
pub(super) async fn a_handler_keeps_its_permit_past_the_cap(env: Env) {
    held_past(Limited::capped(&env).await).await;
}

/// Options that turn renewal off do not let a request's permit lapse at
/// its TTL either: the layer renews it for as long as the request runs.
pub(super) async fn a_handler_keeps_its_permit_with_renewal_off(env: Env) {
    held_past(Limited::new(&env, LockOptions::new().ttl(TTL).renew(false)).await).await;
}

async fn held_past(mut l: Limited) {
    let start = Instant::now();
    let a = spawn_send(
        &l.app,
        req("/work", &[("x-res", &l.r), ("x-id", "a"), HOLD]),
    );
    l.p.wait_entered("a").await;
    l.refused_until(start + PAST_THE_CAP).await;
    assert_eq!(l.p.running(), 1);
    l.p.open(1);
    fence_of(&join(a).await);
    assert_eq!(l.p.max_running(), 1, "{:?}", l.p.events());
    l.free_again().await;
}

/// A body that streams for 2.4 s (an SSE or LLM stream, held until the
/// body ends): the same, and the stream ends whole.
pub(super) async fn a_streamed_body_keeps_its_permit_past_the_cap(env: Env) {
    let l = Limited::capped(&env).await;
    let start = Instant::now();
    let res = app_call(&l, req("/stream", &[("x-res", &l.r)])).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first;");
    l.refused_until(start + PAST_THE_CAP).await;
    l.p.open(1);
    let rest = tokio::time::timeout(BOUND, body.collect())
        .await
        .unwrap()
        .expect("the stream ends whole: its permit was never lost")
        .to_bytes();
    assert_eq!(rest, "last");
    l.free_again().await;
}

/// The response (headers) of `req`, its body unread.
async fn app_call(
    l: &Limited,
    req: http::Request<axum::body::Body>,
) -> http::Response<axum::body::Body> {
    tokio::time::timeout(BOUND, l.app.clone().oneshot(req))
        .await
        .unwrap()
        .unwrap()
}
