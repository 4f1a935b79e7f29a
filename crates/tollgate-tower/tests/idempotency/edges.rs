//! The promises at the edges, on every backend: a completion that fails is
//! sent again, so the handler never runs twice; a claim lost while its
//! handler runs cancels the handler, so two never run at once and the lost
//! holder stores nothing.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use http::StatusCode;
use tollgate_core::{LeaseLost, LockOptions};
use tollgate_testkit::eventually;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::lock::OnLeaseLost;
use tollgate_tower::IdempotencyLayer;

use super::common::idempotency::{builder, failing_completes, Kind, BOUND};
use super::common::unique;
use super::{app, held, req, send, Handler};

/// The lease of the claims that outlive their cap: renewed every 100 ms,
/// never past 2 s.
fn capped() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(300))
        .max_hold(Duration::from_secs(2))
}

/// A completion that fails once without being applied (a reset
/// connection) is sent again: the retry gets the stored response (or 409
/// while it is being stored), and the handler ran exactly once.
pub(crate) async fn a_failed_completion_runs_the_handler_once(kind: Kind) {
    let (store, attempts) = failing_completes(kind, 1).await;
    let h = Handler::default();
    let app = app(
        IdempotencyLayer::new(store, HeaderKey::new("x-api-key")),
        &h,
    );
    let key = unique("k");
    let order = || req("/orders", "t1", Some(key.as_bytes()), "1");
    let first = send(&app, order()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = eventually(BOUND, "anything but 409 in flight", || async {
        let r = send(&app, order()).await;
        (r.status != StatusCode::CONFLICT).then_some(r)
    })
    .await;
    assert_eq!(h.runs(), 1, "{kind:?}: the handler ran again");
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(replay.body, first.body);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

/// A claim lost while its handler runs — here at a short hold cap, as the
/// default 10-minute cap does to a longer handler — cancels the handler:
/// its client gets 503, it never finishes, nothing is stored, and a retry
/// runs it again only after it was dropped: never two at once.
pub(crate) async fn a_lost_claim_cancels_the_handler_and_stores_nothing(kind: Kind) {
    let store = builder(kind).await.lease(capped()).build().unwrap();
    let h = Handler::default();
    let app = app(
        IdempotencyLayer::new(store, HeaderKey::new("x-api-key")),
        &h,
    );
    let key = unique("k");
    let order = || req("/orders", "t1", Some(key.as_bytes()), "1");
    let first = held(&app, &h, &key).await;
    // Before the cap: in flight.
    send(&app, order()).await.assert_problem(409);
    // The send is bounded: a handler left running never answers.
    let first = first
        .await
        .expect("the handler ran on after its claim was lost");
    first.assert_problem(503);
    assert_eq!(h.active(), 0, "the handler was not dropped");
    // Nothing was stored: the retry runs, and its response is the one kept.
    let retried = send(&app, order()).await;
    assert_eq!(retried.status, StatusCode::CREATED, "{:?}", retried.body);
    assert!(!retried.headers.contains_key("idempotent-replayed"));
    let replay = send(&app, order()).await;
    assert_eq!(replay.body, retried.body);
    assert_eq!(h.runs(), 2);
    assert_eq!(h.most_active(), 1, "{kind:?}: two executions at once");
    // Opening the gate cannot make the dropped handler finish.
    h.release.notify_one();
    assert_eq!(h.runs(), 2);
}

/// Runs until its claim's lease is lost, watching the `LeaseLost` the
/// layer put in the request.
async fn watch(State(h): State<Handler>, Extension(lost): Extension<LeaseLost>) -> Response {
    let _running = h.start();
    h.runs.fetch_add(1, Ordering::SeqCst);
    lost.await;
    (StatusCode::CREATED, "finished after the loss").into_response()
}

/// With `OnLeaseLost::Continue` the handler runs on past the loss and its
/// client gets its response.
pub(crate) async fn a_lost_claim_continues_when_told(kind: Kind) {
    let store = builder(kind).await.lease(capped()).build().unwrap();
    let layer = IdempotencyLayer::new(store, HeaderKey::new("x-api-key"))
        .on_lease_lost(OnLeaseLost::Continue);
    let h = Handler::default();
    let app = Router::new()
        .route("/watch", post(watch))
        .layer(layer)
        .with_state(h.clone());
    let key = unique("k");
    let r = send(&app, req("/watch", "t1", Some(key.as_bytes()), "1")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.body, "finished after the loss");
    assert_eq!((h.runs(), h.active()), (1, 0));
}
