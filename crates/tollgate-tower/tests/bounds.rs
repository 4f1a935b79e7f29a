//! Compile-time and startup guarantees: services are Clone + Send + Sync,
//! futures are Send, the inner error type passes through, and invalid
//! configurations are reported.

use std::convert::Infallible;

use axum::body::Body;
use http::{Request, Response};
use tollgate_core::{Algorithm, Error, Locker, MemoryBackend, Quota, RateLimiter};
use tollgate_tower::key::{ClientIp, PeerIp, RouteKey};
use tollgate_tower::{LockLayer, RateLimitLayer};
use tower::{service_fn, Layer, Service};

fn clone_send_sync<T: Clone + Send + Sync + 'static>(_: &T) {}
fn send<T: Send>(_: &T) {}

#[test]
fn services_are_clone_send_sync_and_futures_send() {
    let inner = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    let layer = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(1))
        .key((PeerIp::new(), RouteKey::new()))
        .cost(|_: &Request<Body>| 2);
    clone_send_sync(&layer);
    let mut svc = layer.layer(inner);
    clone_send_sync(&svc);
    let fut = svc.call(Request::new(Body::empty()));
    send(&fut);
    infallible(&svc);

    let layer = LockLayer::new(
        Locker::new(MemoryBackend::new()),
        ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap(),
    );
    clone_send_sync(&layer);
    let mut svc = layer.layer(inner);
    clone_send_sync(&svc);
    let fut = svc.call(Request::new(Body::empty()));
    send(&fut);
    infallible(&svc);
}

/// The inner service's error type (axum's `Infallible`) passes through.
fn infallible<S>(_: &S)
where
    S: Service<
        Request<Body>,
        Error = Infallible,
        Response = Response<tollgate_tower::ResponseBody<Body>>,
    >,
{
}

#[test]
fn a_burst_on_a_window_algorithm_is_a_configuration_error() {
    let q = Quota::per_second(1).with_burst(5).unwrap();
    let err = RateLimitLayer::fixed_window(MemoryBackend::new(), q)
        .validate()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidQuota(_)), "{err}");
}

#[test]
fn settings_of_a_prepared_limiter_cannot_be_changed_by_the_layer() {
    let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
        .quota(Quota::per_second(1))
        .build()
        .unwrap();
    let err = RateLimitLayer::new(limiter.clone())
        .quota(Quota::per_hour(5))
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("prepared RateLimiter"), "{err}");
    // The prepared limiter itself is what the layer uses.
    let layer = RateLimitLayer::new(limiter.clone()).validate().unwrap();
    assert_eq!(layer.limiter().unwrap().keyspace(), limiter.keyspace());
}

#[test]
#[should_panic(expected = "invalid RateLimitLayer configuration")]
fn an_invalid_layer_panics_when_applied() {
    let inner = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    let _ = RateLimitLayer::gcra(MemoryBackend::new(), Quota::per_second(1))
        .prefix("bad{prefix")
        .layer(inner);
}

#[test]
fn invalid_lock_options_are_a_configuration_error() {
    use std::time::Duration;
    use tollgate_tower::key::GlobalKey;

    let locker = Locker::new(MemoryBackend::new());
    let layer = || LockLayer::new(locker.clone(), GlobalKey);
    assert!(layer().validate().is_ok());
    assert!(layer()
        .ttl(Duration::from_secs(5))
        .max_hold(Duration::from_secs(60))
        .validate()
        .is_ok());
    for bad in [
        layer().ttl(Duration::ZERO),
        layer().ttl(Duration::from_micros(999)),
        layer().max_hold(Duration::ZERO),
        layer()
            .ttl(Duration::from_secs(5))
            .max_hold(Duration::from_micros(1)),
        // Past tollgate-core's upper bound on lock durations.
        layer().ttl(Duration::from_secs(10 * 365 * 24 * 3600)),
    ] {
        let err = bad.validate().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    }
    // The locker's own rules: the default drift allowance (1 % + 2 ms)
    // leaves nothing of a 2 ms TTL, so that locker's layer refuses it…
    let err = layer()
        .ttl(Duration::from_millis(2))
        .validate()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    // …while a locker without a drift allowance takes it.
    let lenient = Locker::builder(MemoryBackend::new())
        .drift(0.0, Duration::ZERO)
        .build()
        .unwrap();
    assert!(LockLayer::new(lenient, GlobalKey)
        .ttl(Duration::from_millis(2))
        .validate()
        .is_ok());
}

#[test]
#[should_panic(expected = "invalid LockLayer configuration")]
fn an_invalid_lock_layer_panics_when_applied() {
    let inner = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    let _ = LockLayer::new(
        Locker::new(MemoryBackend::new()),
        tollgate_tower::key::GlobalKey,
    )
    .ttl(std::time::Duration::ZERO)
    .layer(inner);
}
