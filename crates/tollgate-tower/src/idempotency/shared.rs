//! [`Shared`]: what every service made by one `IdempotencyLayer` shares.

use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use http::StatusCode;
use tollgate_core::idempotency::IdempotencyStore;

use super::OnUnavailable;
use crate::lock::OnLeaseLost;
use crate::middleware::Answer;

/// Decides which statuses are stored.
pub(crate) type StoreWhen = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// What every service made by one layer shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) store: IdempotencyStore,
    pub(crate) required: bool,
    pub(crate) max_request_body: usize,
    pub(crate) max_stored_body: usize,
    pub(crate) store_when: StoreWhen,
    pub(crate) replay_headers: Arc<[HeaderName]>,
    pub(crate) on_unavailable: OnUnavailable,
    pub(crate) on_lost: OnLeaseLost,
    pub(crate) answer: Answer,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.store)
            .field("required", &self.required)
            .field("max_request_body", &self.max_request_body)
            .field("max_stored_body", &self.max_stored_body)
            .field("replay_headers", &self.replay_headers)
            .field("on_unavailable", &self.on_unavailable)
            .field("on_lost", &self.on_lost)
            .field("answer", &self.answer)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Whether `name` is stored and replayed.
    pub(crate) fn replays(&self, name: &HeaderName) -> bool {
        self.replay_headers.contains(name)
    }
}
