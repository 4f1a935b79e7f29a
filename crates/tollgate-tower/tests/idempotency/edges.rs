//! The promises at the edges, on every backend: a completion that fails is
//! sent again, so the handler never runs twice.

use std::sync::atomic::Ordering;

use http::StatusCode;
use tollgate_testkit::eventually;
use tollgate_tower::key::HeaderKey;
use tollgate_tower::IdempotencyLayer;

use super::common::idempotency::{failing_completes, Kind, BOUND};
use super::common::unique;
use super::{app, req, send, Handler};

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
