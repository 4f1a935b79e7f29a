//! Which idempotency keys are in flight: [`Admin::idempotency_in_flight`],
//! from the store alone.

use super::Admin;
use crate::error::Result;
use crate::plane::views::InFlightKey;
use crate::store::{IdempotencyBackend, InFlightRecord};

fn view(r: InFlightRecord) -> InFlightKey {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    InFlightKey {
        name: r.name,
        key: r.subject,
        fence: r.fence.get(),
        held_ms: r.held.map(ms),
        ttl_ms: ms(r.ttl),
    }
}

impl Admin {
    /// Every idempotency key under the prefix in flight now — claimed, its
    /// handler running, not completed — by store name and key: with the
    /// claim's fence, since how long and for how much longer its lease
    /// runs. Read from the store alone, so it lists the claims of every
    /// process and every application on the prefix; a completed key is
    /// not listed, nor one abandoned, nor one whose lease expired (its
    /// handler's process died: a retry runs it again). It walks the
    /// keyspace (`SCAN`, on every master of a cluster): nothing on the
    /// claim path, proportional to all keys for the operator.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::admin::Admin;
    /// use tollgate::idempotency::{Claim, Fingerprint, IdempotencyStore, StoredResponse};
    /// use tollgate::{MemoryBackend, Subject};
    ///
    /// let backend = MemoryBackend::new();
    /// let store = IdempotencyStore::new(backend.clone());
    /// let Claim::Claimed(claim) = store.claim(Subject::new("order-9"), Fingerprint::of(b"qty=1")).await? else {
    ///     unreachable!()
    /// };
    ///
    /// let admin = Admin::new(backend);
    /// let in_flight = admin.idempotency_in_flight().await?;
    /// assert_eq!((in_flight[0].name.as_str(), in_flight[0].key.as_str()), ("idem", "order-9"));
    /// assert_eq!(in_flight[0].fence, claim.fence().get());
    ///
    /// claim.complete(&StoredResponse::new(201, vec![], b"{}".to_vec())).await?;
    /// assert!(admin.idempotency_in_flight().await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn idempotency_in_flight(&self) -> Result<Vec<InFlightKey>> {
        // Each call of the walk (a page of keys) is bounded by the store.
        let walk = IdempotencyBackend::records_in_flight(self.backend(), self.prefix());
        let mut all: Vec<InFlightKey> = walk.await?.into_iter().map(view).collect();
        all.sort_by(|a, b| (&a.name, &a.key, a.fence).cmp(&(&b.name, &b.key, b.fence)));
        Ok(all)
    }
}
