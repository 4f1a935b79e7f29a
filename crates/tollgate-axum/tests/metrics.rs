//! The `RateLimited` extractor counts its decisions in
//! `tollgate_decisions_total` as the layers do (feature `metrics`).

mod common;

use http::{Method, StatusCode};
use tollgate_core::{MemoryBackend, Quota, RateLimiter};
use tollgate_testkit::http::loopback::send;
use tollgate_testkit::metrics::{decisions, recorder};

use common::{memory_locker, serve};

#[tokio::test]
async fn the_extractor_counts_each_decision_and_key_error() {
    recorder();
    let policy = tollgate_testkit::unique("extracted");
    let limiter = RateLimiter::builder(MemoryBackend::new(), tollgate_core::Algorithm::Gcra)
        .quota(Quota::per_hour(2))
        .name(&policy)
        .deny_cache(0)
        .build()
        .unwrap();
    let srv = serve(memory_locker(), limiter).await;
    let ann = [("x-user", "ann")];
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(
            send(srv.addr, Method::GET, "/limited", &ann).await.status,
            expected
        );
    }
    let unkeyed = send(srv.addr, Method::GET, "/limited", &[]).await;
    assert_eq!(unkeyed.status, StatusCode::BAD_REQUEST);
    assert_eq!(decisions(&policy, "allowed", "backend"), 2);
    assert_eq!(decisions(&policy, "denied", "backend"), 1);
    assert_eq!(decisions(&policy, "key_error", "none"), 1);
}
