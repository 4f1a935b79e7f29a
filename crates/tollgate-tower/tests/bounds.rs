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
        .cost(|_: &http::request::Parts| 2);
    clone_send_sync(&layer);
    let mut svc = layer.layer(inner);
    clone_send_sync(&svc);
    let fut = svc.call(Request::new(Body::empty()));
    send(&fut);
    infallible::<_, Body>(&svc);

    let layer = LockLayer::new(
        Locker::new(MemoryBackend::new()),
        ClientIp::trusted_proxies(["10.0.0.0/8"]).unwrap(),
    );
    clone_send_sync(&layer);
    let mut svc = layer.layer(inner);
    clone_send_sync(&svc);
    let fut = svc.call(Request::new(Body::empty()));
    send(&fut);
    infallible::<_, tollgate_tower::ResponseBody<Body>>(&svc);
}

/// The inner service's error type (axum's `Infallible`) passes through,
/// and the response body is `B`: the rate limit's is the inner service's
/// own (axum does not box it again), a lock's wraps it.
fn infallible<S, B>(_: &S)
where
    S: Service<Request<Body>, Error = Infallible, Response = Response<B>>,
{
}

/// A burst on a window algorithm is the limiter builder's error; the
/// algorithm sugar, which has no `Result` to return, panics with it at
/// construction (never later, in `Layer::layer`).
#[test]
fn a_burst_on_a_window_algorithm_is_a_configuration_error() {
    let q = Quota::per_second(1).with_burst(5).unwrap();
    let err = RateLimiter::builder(MemoryBackend::new(), Algorithm::FixedWindow)
        .quota(q)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidQuota(_)), "{err}");
    let panic = std::panic::catch_unwind(|| RateLimitLayer::fixed_window(MemoryBackend::new(), q))
        .unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains("invalid RateLimitLayer"), "{message}");
}

/// The layer wraps the limiter it is given: the same keyspace, the same
/// state.
#[test]
fn the_layer_checks_the_limiter_it_wraps() {
    let limiter = RateLimiter::builder(MemoryBackend::new(), Algorithm::Gcra)
        .quota(Quota::per_second(1))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter.clone());
    assert_eq!(layer.limiter().keyspace(), limiter.keyspace());
    let inner = service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    assert_eq!(layer.layer(inner).limiter().keyspace(), limiter.keyspace());
}

#[test]
fn invalid_lock_options_are_a_configuration_error() {
    use std::time::Duration;
    use tollgate_core::LockOptions;
    use tollgate_tower::key::GlobalKey;

    let locker = Locker::new(MemoryBackend::new());
    let layer = |o: LockOptions| LockLayer::new(locker.clone(), GlobalKey).try_options(o);
    let o = LockOptions::new;
    assert!(layer(o()).is_ok());
    assert!(layer(
        o().ttl(Duration::from_secs(5))
            .max_hold(Duration::from_secs(60))
    )
    .is_ok());
    for bad in [
        o().ttl(Duration::ZERO),
        o().ttl(Duration::from_micros(999)),
        o().max_hold(Duration::ZERO),
        o().ttl(Duration::from_secs(5))
            .max_hold(Duration::from_micros(1)),
        // Past tollgate-core's upper bound on lock durations.
        o().ttl(Duration::from_secs(10 * 365 * 24 * 3600)),
    ] {
        let err = layer(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    }
    // The locker's own rules: the default drift allowance (1 % + 2 ms)
    // leaves nothing of a 2 ms TTL, so that locker's layer refuses it…
    let err = layer(o().ttl(Duration::from_millis(2))).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    // …while a locker without a drift allowance takes it.
    let lenient = Locker::builder(MemoryBackend::new())
        .drift(0.0, Duration::ZERO)
        .build()
        .unwrap();
    assert!(LockLayer::new(lenient, GlobalKey)
        .try_options(o().ttl(Duration::from_millis(2)))
        .is_ok());
}

/// A concurrency limit's permit is renewed with no hold cap, whatever its
/// options say: a hold cap it ignores is not checked either (a cap of 0
/// or one shorter than the TTL is refused by a lock layer, not by this).
#[test]
fn a_concurrency_limit_ignores_the_hold_cap_it_does_not_use() {
    use std::time::Duration;
    use tollgate_core::{LockOptions, Semaphore};
    use tollgate_tower::key::GlobalKey;
    use tollgate_tower::ConcurrencyLimitLayer;

    let permits = Semaphore::new(MemoryBackend::new(), 2).unwrap();
    let layer =
        |o: LockOptions| ConcurrencyLimitLayer::new(permits.clone(), GlobalKey).try_options(o);
    for ignored in [
        LockOptions::new().max_hold(Duration::ZERO),
        LockOptions::new()
            .ttl(Duration::from_secs(5))
            .max_hold(Duration::from_micros(1)),
    ] {
        assert!(layer(ignored).is_ok());
    }
    // What it does use is checked.
    let err = layer(LockOptions::new().ttl(Duration::ZERO)).unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
}

/// Invalid options given without a `Result` panic when given — at
/// startup — and never when the layer is applied.
#[test]
#[should_panic(expected = "invalid LockLayer options")]
fn invalid_lock_options_panic_when_given() {
    let _ = LockLayer::new(
        Locker::new(MemoryBackend::new()),
        tollgate_tower::key::GlobalKey,
    )
    .options(tollgate_core::LockOptions::new().ttl(std::time::Duration::ZERO));
}
