//! Who holds what, and breaking a stuck holder: [`Admin::holders`],
//! [`Admin::break_lock`] and [`Admin::break_permits`], from the store alone.

use tracing::Instrument;

use super::Admin;
use crate::error::Result;
use crate::keyspace::{Keyspace, Subject};
use crate::plane::views::{Holder, HolderKind};
use crate::store::{LockBackend, LockHolder, LockKeys};

fn view(h: LockHolder) -> Holder {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    Holder {
        kind: if h.permits {
            HolderKind::Permit
        } else {
            HolderKind::Lock
        },
        name: h.name,
        subject: h.subject,
        fence: h.fence.get(),
        holder: h.holder,
        held_ms: ms(h.held),
        ttl_ms: ms(h.ttl),
    }
}

impl Admin {
    /// Every holder of a lock or of a semaphore's permits under the prefix,
    /// by name, subject and fence: who (`host:pid`), since how long, with
    /// which fence, for how much longer. Read from the store alone (each
    /// holder left its description there), so it lists the holders of every
    /// process and every application on the prefix. A fair lock is stored
    /// as permits and listed as one; an idempotency key's lease is not
    /// listed. It walks the keyspace (`SCAN`, on every master of a
    /// cluster): cheap for the acquires, proportional to all keys for the
    /// operator.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::admin::{Admin, HolderKind};
    /// use tollgate::{LockOptions, Locker, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let locker = Locker::new(backend.clone());
    /// let lease = locker.try_acquire("nightly", &LockOptions::new()).await?;
    ///
    /// let holders = Admin::new(backend).holders().await?;
    /// assert_eq!(holders.len(), 1);
    /// assert_eq!(holders[0].kind, HolderKind::Lock);
    /// assert_eq!((holders[0].name.as_str(), holders[0].subject.as_str()), ("lock", "nightly"));
    /// assert_eq!(holders[0].fence, lease.fence().get());
    /// assert!(holders[0].holder.ends_with(&format!(":{}", std::process::id())));
    /// # Ok(()) }
    /// ```
    pub async fn holders(&self) -> Result<Vec<Holder>> {
        // Each call of the walk (a page of keys) is bounded by the store.
        let walk = LockBackend::lock_holders(self.backend(), self.prefix());
        let mut all: Vec<Holder> = walk.await?.into_iter().map(view).collect();
        all.sort_by(|a, b| (&a.name, &a.subject, a.fence).cmp(&(&b.name, &b.subject, b.fence)));
        Ok(all)
    }

    /// Breaks the lock `subject` of the locker named `name` (its keyspace
    /// policy, `lock` for a [`Locker`](crate::Locker)), whoever holds it.
    /// The fence key stays, so the next holder's fence is higher than the
    /// broken one's and the resource goes on refusing the old holder's
    /// writes; waiters take the lock at once; the broken holder's lease is
    /// lost at its next renewal. `true` when there was a holder.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::admin::Admin;
    /// use tollgate::{LockOptions, Locker, MemoryBackend, Subject};
    ///
    /// let backend = MemoryBackend::new();
    /// let locker = Locker::new(backend.clone());
    /// let stuck = locker.try_acquire("nightly", &LockOptions::new()).await?;
    ///
    /// let admin = Admin::new(backend);
    /// assert!(admin.break_lock("lock", &Subject::new("nightly")).await?);
    /// let next = locker.try_acquire("nightly", &LockOptions::new()).await?;
    /// assert!(next.fence() > stuck.fence());
    /// # Ok(()) }
    /// ```
    pub async fn break_lock(&self, name: &str, subject: &Subject) -> Result<bool> {
        Ok(self.break_holders("break_lock", name, subject).await? > 0)
    }

    /// Takes every permit of `subject` of the semaphore named `name` (its
    /// keyspace policy, `sem` for a [`Semaphore`](crate::Semaphore)) from
    /// whoever holds them, as [`break_lock`](Self::break_lock) does for a
    /// lock: fences never go back, waiters are served at once (a fair
    /// queue keeps its order), broken permits are lost at their next
    /// renewal. Returns how many holders lost their permits.
    pub async fn break_permits(&self, name: &str, subject: &Subject) -> Result<u32> {
        self.break_holders("break_permits", name, subject).await
    }

    async fn break_holders(
        &self,
        action: &'static str,
        name: &str,
        subject: &Subject,
    ) -> Result<u32> {
        let keys = LockKeys::new(&Keyspace::new(self.prefix(), name)?, subject);
        let span = tracing::info_span!(
            "tollgate.admin",
            action,
            policy = name,
            subject = subject.as_encoded(),
        );
        let removed = self
            .bounded(LockBackend::break_holders(self.backend(), &keys))
            .instrument(span)
            .await?;
        tracing::info!(
            policy = name,
            subject = subject.as_encoded(),
            action,
            removed,
            "admin action"
        );
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tollgate_admin_actions_total",
            "policy" => name.to_owned(),
            "action" => action,
        )
        .increment(1);
        Ok(removed)
    }
}
