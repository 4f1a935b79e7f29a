//! [`Holding`]: a claim while its request runs, settled once — stored,
//! or abandoned so that a retry runs again.

use tollgate_core::idempotency::{Claimed, StoredResponse};

use super::count;
use super::shared::Shared;

const T: &str = "tollgate_tower::idempotency";

/// A claim while its request runs. Dropped before it was settled (the
/// request future dropped before the handler returned: the client went
/// away), it is counted as abandoned, and [`Claimed`]'s own drop abandons
/// it in the background. After the handler returned, the relay's task
/// settles it (see `relay`).
pub(super) struct Holding {
    pub(super) claim: Option<Claimed>,
    pub(super) digest: String,
}

impl Holding {
    /// What resolves when the claim's lease is lost (`None` once settled).
    pub(super) fn lost(&self) -> Option<tollgate_core::LeaseLost> {
        self.claim.as_ref().map(Claimed::lost)
    }

    /// Gives the claim up and waits for it, so that a retry right after
    /// this response runs again.
    pub(super) async fn abandon(&mut self, outcome: &'static str, why: &'static str) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        count(outcome);
        tracing::debug!(target: T, record = %self.digest, why, "Idempotency-Key claim abandoned");
        if let Err(e) = claim.abandon().await {
            tracing::debug!(target: T, record = %self.digest, error = %e, "abandoning the claim failed; it expires by its lease");
        }
    }

    /// Stores `response` (fenced: nothing when the claim was lost). The
    /// store sends a failed completion again until its lease's safe
    /// deadline, and never releases the claim unstored; the response waits
    /// for that at most two round-trip bounds (the first try and the next),
    /// then goes out while the completion goes on in the background — a
    /// retry meanwhile is told the key is in flight.
    pub(super) async fn complete(&mut self, response: StoredResponse, shared: &Shared) {
        let Some(claim) = self.claim.take() else {
            return;
        };
        let digest = self.digest.clone();
        let mut completing = tokio::spawn(async move {
            match claim.complete(&response).await {
                Ok(true) => {
                    count("stored");
                    tracing::debug!(target: T, record = %digest, status = response.status, replayable = response.body.is_some(), "response stored");
                }
                Ok(false) => {
                    count("lost");
                    tracing::warn!(target: T, record = %digest, "the claim was lost or superseded; the response was not stored");
                }
                Err(e) => {
                    count("unavailable");
                    tracing::warn!(target: T, record = %digest, error = %e, "storing the response failed; the key stays in flight until its lease expires");
                }
            }
        });
        let wait = shared.store.timeout().saturating_mul(2);
        match tokio::time::timeout(wait, &mut completing).await {
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(_) => {}
            Err(_) => {
                tracing::debug!(target: T, record = %self.digest, "the response is still being stored; it goes out meanwhile");
            }
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if self.claim.is_some() {
            count("abandoned");
            tracing::debug!(target: T, record = %self.digest, "request dropped; Idempotency-Key claim abandoned");
        }
    }
}
