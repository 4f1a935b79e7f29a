//! [`IdempotencyStore`], [`Claim`] and [`Claimed`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{within, Error, Result};
use crate::failure::breaker::Breaker;
use crate::failure::{is_outage, DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_THRESHOLD};
use crate::keyspace::Subject;
use crate::lock::core::Core;
use crate::lock::settings::{Settings, IDEMPOTENCY_POLICY};
use crate::lock::util::{instant_after, join, new_token};
use crate::lock::{FencingToken, Lease, LeaseLost, LockOptions};
use crate::lock::{LockBackend, LockKeys, DEFAULT_FENCE_TTL, FENCE_TTL_TTLS};
use crate::plane::views::Registered;
use crate::store::{
    ClaimReply, ClaimRequest, Fingerprint, IdempotencyBackend, RecordKeys, StoredResponse,
};

/// Default TTL of a completed record: 24 hours.
pub const DEFAULT_RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

/// The first pause before a round trip is sent again after an outage; it
/// doubles per failure, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Idempotency records over one backend; see the [module docs](super).
/// Cheap to clone.
#[derive(Clone)]
pub struct IdempotencyStore {
    core: Arc<Core>,
    backend: Arc<dyn IdempotencyBackend>,
    /// Skips a backend that failed repeatedly, so a dead Redis costs a
    /// claim no round-trip timeout (nor a task left waiting on it).
    breaker: Arc<Breaker>,
    lease: LockOptions,
    record_ttl: Duration,
}

impl fmt::Debug for IdempotencyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyStore")
            .field("engine", &self.core)
            .field("lease", &self.lease)
            .field("record_ttl", &self.record_ttl)
            .finish()
    }
}

/// What a claim found.
#[derive(Debug)]
#[non_exhaustive]
pub enum Claim {
    /// The key is this request's: run it, then [`complete`](Claimed::complete)
    /// (or [`abandon`](Claimed::abandon)) the claim.
    Claimed(Claimed),
    /// The same request is in flight elsewhere; retry after this long
    /// (its lease's remaining TTL, when known).
    InFlight {
        /// When to retry.
        retry_after: Option<Duration>,
    },
    /// The same request completed: replay this.
    Completed(StoredResponse),
    /// The key was used with another payload (in flight or completed).
    Mismatch,
}

/// A claimed key: the lease (renewed while held) and the fence that the
/// completion is checked against. Dropping it without completing abandons
/// the claim in the background, so a retry may run.
#[must_use = "dropping a claim abandons it"]
pub struct Claimed {
    lease: Option<Lease>,
    keys: RecordKeys,
    fence: FencingToken,
    store: IdempotencyStore,
}

impl fmt::Debug for Claimed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claimed")
            .field("record", &self.keys.record)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl IdempotencyStore {
    /// A store over `backend` with the defaults: prefix `tollgate`, keys
    /// `tollgate:idem:{<key>}…`, a 30 s lease renewed while the request
    /// runs, records kept 24 hours, a 500 ms round-trip bound.
    pub fn new(backend: impl IdempotencyBackend) -> IdempotencyStore {
        Self::builder(backend)
            .build()
            .expect("the default idempotency settings are valid")
    }

    /// A builder over `backend`.
    pub fn builder(backend: impl IdempotencyBackend) -> IdempotencyStoreBuilder {
        IdempotencyStoreBuilder {
            backend: Arc::new(backend),
            settings: Settings {
                policy: IDEMPOTENCY_POLICY,
                ..Settings::default()
            },
            lease: LockOptions::new(),
            record_ttl: DEFAULT_RECORD_TTL,
            breaker: (DEFAULT_BREAKER_THRESHOLD, DEFAULT_BREAKER_COOLDOWN),
        }
    }

    /// How long a completed record lives.
    pub fn record_ttl(&self) -> Duration {
        self.record_ttl
    }

    /// The bound on each round trip.
    pub fn timeout(&self) -> Duration {
        self.core.timeout()
    }

    /// The backend's kind (`"memory"`, `"redis"`, `"cluster"`, …).
    pub fn backend_kind(&self) -> &'static str {
        self.core.kind()
    }

    /// The keys of `key`'s record.
    pub fn keys_for(&self, key: &Subject) -> RecordKeys {
        RecordKeys::new(self.core.keys(key, 1))
    }

    /// Claims `key` for a request whose payload is `fingerprint`: one
    /// round trip, bounded by the timeout. Cancel-safe: a claim that the
    /// backend grants after the timeout, or after this future was dropped,
    /// is abandoned in the background (and a claim whose reply never came,
    /// its lease released), so that a retry is not refused until the lease
    /// expires.
    ///
    /// After repeated outages (see
    /// [`circuit_breaker`](IdempotencyStoreBuilder::circuit_breaker)) a
    /// claim fails at once with [`Error::CircuitOpen`] until one probe finds
    /// the backend again. Completions and abandons never skip the backend.
    pub async fn claim(&self, key: Subject, fingerprint: Fingerprint) -> Result<Claim> {
        self.breaker
            .call(self.claim_on_backend(key, fingerprint))
            .await
    }

    /// [`claim`](Self::claim)'s round trip.
    async fn claim_on_backend(&self, key: Subject, fingerprint: Fingerprint) -> Result<Claim> {
        let keys = self.keys_for(&key);
        // The lease's first TTL, as the lock engine takes it: the TTL, or
        // the hold cap when that is shorter (the lease ends there).
        let ttl = self.core.first_ttl(&self.lease)?;
        let fence_ttl = self.lease.ttl_duration().saturating_mul(FENCE_TTL_TTLS);
        let request = ClaimRequest {
            keys: keys.clone(),
            token: new_token()?,
            ttl,
            fence_ttl: DEFAULT_FENCE_TTL.max(fence_ttl),
            // The in-flight record must last as long as the lease can be
            // renewed (its hold cap), or a request that outlives the record
            // TTL loses its record: its completion stores nothing and a
            // retry runs it again. Completion sets the record TTL. Without
            // a cap, the longest TTL a lock accepts: a crashed holder's
            // record is replaced by the next claim, it is not waited for.
            record_ttl: self.record_ttl.max(
                self.lease
                    .max_hold_duration()
                    .map_or(crate::lock::MAX_LOCK_DURATION, |cap| {
                        cap.saturating_add(ttl)
                    })
                    .min(crate::lock::MAX_LOCK_DURATION),
            ),
            fingerprint,
        };
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::InvalidConfig("idempotency claims need a tokio runtime".into()))?;
        // The round trip runs in a task of its own, as the lock engine's
        // attempts do, which makes the claim cancel-safe: when this call
        // times out or is dropped after the script ran, the task's reply is
        // dropped unread, and a `Claimed` abandons itself on drop
        // (compare-and-delete on its token), so the key is not left in
        // flight, ownerless, until the lease expires.
        let store = self.clone();
        let task = handle.spawn(async move {
            let start = Instant::now();
            // A reply later than the lease's first TTL finds the lease gone:
            // nothing is left to settle, the task stops waiting.
            let bound = store.core.timeout().max(ttl);
            let reply = within(bound, store.backend.claim(&request)).await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    // The script may have run all the same (its reply late,
                    // lost, or past this bound): the
                    // lease goes if it is this claim's, so that a retry can
                    // take the key (and replace the record left in flight).
                    store.release_in_background(request.keys.lease, request.token, bound);
                    return Err(e);
                }
            };
            store.resolve(key, keys, request.token, reply, start)
        });
        self.bounded(join(task)).await
    }

    /// What a claim's `reply` means to its caller.
    fn resolve(
        &self,
        key: Subject,
        keys: RecordKeys,
        token: String,
        reply: ClaimReply,
        start: Instant,
    ) -> Result<Claim> {
        Ok(match reply {
            ClaimReply::Claimed { fence } => {
                let lease = self
                    .core
                    .lease_for(&key, token, fence, start, &self.lease)?;
                Claim::Claimed(Claimed {
                    lease: Some(lease),
                    keys,
                    fence,
                    store: self.clone(),
                })
            }
            ClaimReply::InFlight {
                same_payload: true,
                pttl,
            } => Claim::InFlight { retry_after: pttl },
            ClaimReply::Completed {
                same_payload: true,
                response,
            } => Claim::Completed(response),
            _ => Claim::Mismatch,
        })
    }

    /// Deletes the lease under `keys` if it is `token`'s, in the background,
    /// retried while the backend is unavailable, for up to `bound` (the
    /// lease's TTL: the lease is gone after that anyway). On Redis each try
    /// follows the claim on its connection, so the first one answered runs
    /// after the claim did; a frozen server's unanswered tries (past the
    /// store's timeout, a `NOSCRIPT` never followed by the script) do not
    /// count.
    fn release_in_background(&self, keys: LockKeys, token: String, bound: Duration) {
        let store = self.clone();
        tokio::spawn(async move {
            let deadline = instant_after(Instant::now(), bound);
            let mut pause = RETRY_FIRST;
            loop {
                match store
                    .bounded(store.backend.release_lock(&keys, &token))
                    .await
                {
                    Err(e) if is_outage(&e) && instant_after(Instant::now(), pause) < deadline => {
                        tokio::time::sleep(pause).await;
                        pause = pause.saturating_mul(2).min(RETRY_MAX);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "releasing a failed claim's lease failed; it expires by its TTL");
                        return;
                    }
                    Ok(_) => return,
                }
            }
        });
    }

    async fn bounded<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        within(self.core.timeout(), call).await
    }
}

impl Claimed {
    /// The claim's fencing token (pass it to writes the handler makes).
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// Resolves when the claim's lease is lost (or settled).
    pub fn lost(&self) -> LeaseLost {
        self.lease.as_ref().expect("held until settled").lost()
    }

    /// Whether the lease can still be trusted.
    pub fn is_held(&self) -> bool {
        self.lease.as_ref().is_some_and(Lease::is_held)
    }

    /// Stores `response` as the key's outcome. `Ok(false)` when the claim was
    /// lost or superseded meanwhile: nothing is stored (a newer record is
    /// never overwritten), and a warning is logged.
    ///
    /// A try that fails as an outage (a timeout, a reset connection,
    /// `READONLY` during a failover) is sent again, with a backoff from
    /// 50 ms to 1 s, for at most the time the lease's safe deadline left
    /// when this call began, even once the lease is lost — safe, because
    /// the store is fenced: a completion sent again after it was stored
    /// answers `true`, one a newer claim superseded `false`. When it still fails,
    /// the error is returned and the claim is **not** released: the handler
    /// has run, so a retry is told the key is in flight until the lease
    /// expires, rather than running it a second time. The same holds if
    /// this future is dropped midway, or before it was first polled.
    pub fn complete<'a>(
        mut self,
        response: &'a StoredResponse,
    ) -> impl Future<Output = Result<bool>> + Send + 'a {
        // Taken before the first poll: an `async fn` would move the claim
        // into its future as it is, and dropping that unpolled abandons it.
        let lease = Unstored(self.lease.take());
        async move { self.store_response(lease, response).await }
    }

    async fn store_response(&self, lease: Unstored, response: &StoredResponse) -> Result<bool> {
        let store = &self.store;
        // Renewals while retrying keep the lease safe but do not stretch
        // the window: a completion that keeps failing gives up within a TTL.
        let deadline = instant_after(Instant::now(), lease.get().remaining());
        let mut pause = RETRY_FIRST;
        loop {
            let call = store.backend.complete(
                &self.keys,
                lease.get().token(),
                self.fence,
                response,
                store.record_ttl,
            );
            match store.bounded(call).await {
                Ok(true) => {
                    lease.stored();
                    return Ok(true);
                }
                Ok(false) => {
                    tracing::warn!(record = %self.keys.record, fence = self.fence.get(), "idempotency claim lost or superseded; the response was not stored");
                    return Ok(false);
                }
                // Sent again even once the lease is lost: the store is fenced,
                // and the lease goes when a try stores, which a lost reply
                // hides.
                Err(e) if is_outage(&e) && instant_after(Instant::now(), pause) < deadline => {
                    tracing::debug!(record = %self.keys.record, error = %e, ?pause, "storing the response failed; sending it again");
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2).min(RETRY_MAX);
                }
                Err(e) => {
                    tracing::warn!(record = %self.keys.record, fence = self.fence.get(), error = %e, "the response could not be stored; the key stays in flight until its lease expires");
                    return Err(e);
                }
            }
        }
    }

    /// Gives the claim up (the handler failed): the in-flight record and the
    /// lease go, so a retry may run. `Ok(false)` when it was no longer ours.
    pub async fn abandon(mut self) -> Result<bool> {
        let lease = self.lease.take().expect("held until settled");
        abandon(&self.store, &self.keys, lease, self.fence).await
    }
}

/// The lease of a handler that has run, until its response is stored:
/// dropped before that, it is left to expire, never released.
struct Unstored(Option<Lease>);

impl Unstored {
    fn get(&self) -> &Lease {
        self.0.as_ref().expect("held until settled")
    }

    /// The completion deleted the lease.
    fn stored(mut self) {
        if let Some(lease) = self.0.take() {
            lease.settle();
        }
    }
}

impl Drop for Unstored {
    fn drop(&mut self) {
        if let Some(lease) = self.0.take() {
            lease.let_expire();
        }
    }
}

async fn abandon(
    store: &IdempotencyStore,
    keys: &RecordKeys,
    lease: Lease,
    fence: FencingToken,
) -> Result<bool> {
    let done = store
        .bounded(store.backend.abandon(keys, lease.token(), fence))
        .await;
    if let Ok(true) = done {
        lease.settle();
    }
    done
}

impl Drop for Claimed {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let (store, keys, fence) = (self.store.clone(), self.keys.clone(), self.fence);
        // Never block: abandon in the background (the lease's own drop
        // releases the lock if this fails; the record then waits for a
        // retry to replace it).
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = abandon(&store, &keys, lease, fence).await {
                    tracing::debug!(error = %e, "abandoning an idempotency claim failed");
                }
            });
        }
    }
}

/// Builds an [`IdempotencyStore`].
#[must_use]
pub struct IdempotencyStoreBuilder {
    backend: Arc<dyn IdempotencyBackendArc>,
    settings: Settings,
    lease: LockOptions,
    record_ttl: Duration,
    breaker: (u32, Duration),
}

/// Both views of one backend: as a lock backend (leases) and as an
/// idempotency backend (records).
trait IdempotencyBackendArc: Send + Sync {
    fn locks(self: Arc<Self>) -> Arc<dyn LockBackend>;
    fn records(self: Arc<Self>) -> Arc<dyn IdempotencyBackend>;
}

impl<B: IdempotencyBackend> IdempotencyBackendArc for B {
    fn locks(self: Arc<Self>) -> Arc<dyn LockBackend> {
        self
    }
    fn records(self: Arc<Self>) -> Arc<dyn IdempotencyBackend> {
        self
    }
}

impl fmt::Debug for IdempotencyStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyStoreBuilder")
            .field("settings", &self.settings)
            .field("lease", &self.lease)
            .field("record_ttl", &self.record_ttl)
            .finish()
    }
}

impl IdempotencyStoreBuilder {
    /// The key prefix (default `tollgate`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// Bounds every round trip (default 500 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// How the in-flight lease is taken: its TTL (renewed every third of it
    /// while the request runs) and hold cap. Default: [`LockOptions::new`].
    /// The in-flight record lives as long as the cap plus a TTL; with
    /// [`LockOptions::unbounded_hold`], as long as
    /// [`MAX_LOCK_DURATION`](crate::lock::MAX_LOCK_DURATION) — a holder that
    /// crashes leaves it until the key's next claim replaces it.
    pub fn lease(mut self, options: LockOptions) -> Self {
        self.lease = options;
        self
    }

    /// After `threshold` consecutive outages of claims, skip the backend
    /// for `cooldown`, then let one claim probe it (default: 5 failures,
    /// 1 s, as a limiter's). A skipped claim fails with
    /// [`Error::CircuitOpen`], an outage: the middleware answers 503 (or
    /// passes the request through, as configured) without waiting.
    pub fn circuit_breaker(mut self, threshold: u32, cooldown: Duration) -> Self {
        self.breaker = (threshold.max(1), cooldown);
        self
    }

    /// How long a completed record is kept (default 24 hours; 1 s to one
    /// year).
    pub fn record_ttl(mut self, ttl: Duration) -> Self {
        self.record_ttl = ttl;
        self
    }

    /// Checks the settings and builds the store.
    pub fn build(self) -> Result<IdempotencyStore> {
        if self.record_ttl < Duration::from_secs(1)
            || self.record_ttl > crate::lock::MAX_LOCK_DURATION
        {
            return Err(Error::InvalidConfig(format!(
                "the record TTL must be between 1 s and one year, got {:?}",
                self.record_ttl
            )));
        }
        let backend = self.backend;
        let core = Core::new(vec![backend.clone().locks()], false, self.settings)?;
        core.first_ttl(&self.lease)?;
        let core = Arc::new(core);
        core.keep_registered(Registered::Idempotency {
            name: core.keyspace().policy().to_owned(),
        });
        Ok(IdempotencyStore {
            core,
            backend: backend.records(),
            lease: self.lease,
            record_ttl: self.record_ttl,
            breaker: Arc::new(Breaker::new(self.breaker.0, self.breaker.1)),
        })
    }
}
