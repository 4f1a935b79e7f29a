//! The operator plane: see and change what the stores hold — which
//! limiters, semaphores and idempotency stores exist (a registry each
//! writes once), one subject's state, resets, blocks, who is throttled,
//! who holds what and which idempotency keys are in flight — with every
//! instance told at once.
//!
//! [`Admin`] works from the store alone: a tool built without the
//! application's code (the CLI, the dashboard) finds the limiters in the
//! registry and interprets their keys. Every change is announced on the
//! admin channel, which each instance watches: its deny cache and local
//! fallback forget the subject within a round trip (limiters built on the
//! acting backend or its clones, before the action returns); an instance that
//! missed the message sees the version stamp move within
//! [`VERSION_POLL`] and forgets everything it cached.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! use std::time::Duration;
//! use tollgate::admin::Admin;
//! use tollgate::{MemoryBackend, Quota, RateLimiter, Subject};
//!
//! let backend = MemoryBackend::new();
//! let logins = RateLimiter::builder(backend.clone(), tollgate::Algorithm::SlidingWindowLog)
//!     .quota(Quota::per_minute(3))
//!     .name("login")
//!     .build()?;
//! for _ in 0..4 {
//!     logins.check("alice").await?;
//! }
//! let admin = Admin::new(backend);
//! let alice = Subject::new("alice");
//! assert_eq!(admin.inspect("login", &alice).await?.remaining, 0);
//! admin.reset("login", &alice).await?;
//! assert!(logins.check("alice").await?.allowed);
//! admin.block("login", &alice, Duration::from_secs(60)).await?;
//! assert!(!logins.check("alice").await?.allowed);
//! # Ok(()) }
//! ```

mod holders;
mod in_flight;
mod rebuild;
mod reports;

use std::time::Duration;

pub use crate::plane::views::{
    Holder, HolderKind, InFlightKey, LimiterInfo, QuotaInfo, Registered, SubjectState,
    ThrottledSubject, Traffic,
};
pub use crate::rate::admin::LONGEST_BLOCK;
pub use crate::store::VERSION_POLL;

use crate::backend::Backend;
use crate::error::{within, Error, Result};
use crate::keyspace::{Subject, DEFAULT_PREFIX};
use crate::rate::RateLimiter;
use crate::store::AdminBackend;

/// The operator's handle on one keyspace prefix of a store: inspect, reset,
/// block and unblock subjects of any registered limiter, list who is
/// throttled and who holds what. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Admin {
    backend: Backend,
    prefix: String,
    timeout: Duration,
}

/// How long each of an action's calls (a read of the registry or of a
/// subject's state, a reset, a walk of the holders) waits for the store by
/// default: an operator's request, not a request path's.
pub const DEFAULT_ACTION_TIMEOUT: Duration = crate::store::ACTION_TIMEOUT;

impl Admin {
    /// The operator plane of `backend`, for the default prefix (`tollgate`).
    pub fn new(backend: impl Into<Backend>) -> Self {
        Admin {
            backend: backend.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_ACTION_TIMEOUT,
        }
    }

    /// For the keys under `prefix` (as given to the capabilities' builders).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long each of its reads (the registry, a subject's state, the
    /// throttled lists) and breaks waits for the store
    /// ([`DEFAULT_ACTION_TIMEOUT`] unless set), whatever timeout the
    /// application gives its limiter; past it the action fails with
    /// [`Error::Timeout`]. Resets, blocks and each page of a walk over
    /// the keys (`holders`) wait [`DEFAULT_ACTION_TIMEOUT`] at least.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    pub(crate) fn store(&self) -> &dyn AdminBackend {
        self.backend.admin_store()
    }

    /// `call` (one of an action's calls on the store), bounded by the
    /// action timeout: a store that stopped answering fails the action.
    pub(crate) async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        within(self.timeout, call).await
    }

    /// Everything registered under the prefix, by name.
    pub async fn registered(&self) -> Result<Vec<Registered>> {
        self.bounded(crate::plane::registry::read(self.store(), &self.prefix))
            .await
    }

    /// The registered limiters, by name, each with what it decided lately
    /// ([`LimiterInfo::traffic`]).
    pub async fn limiters(&self) -> Result<Vec<LimiterInfo>> {
        let mut limiters = self.registered_limiters().await?;
        for l in &mut limiters {
            l.traffic = Some(reports::traffic(self, &l.name).await?);
        }
        Ok(limiters)
    }

    pub(super) async fn registered_limiters(&self) -> Result<Vec<LimiterInfo>> {
        Ok(self
            .registered()
            .await?
            .into_iter()
            .filter_map(|r| match r {
                Registered::Limiter(l) => Some(l),
                _ => None,
            })
            .collect())
    }

    /// The limiter registered as `name`, rebuilt from its description
    /// (same keys, same quotas, no deny cache, failing closed); the first
    /// found when a plan change runs two algorithms under the name.
    /// [`Error::NotRegistered`] when there is none.
    pub async fn limiter(&self, name: &str) -> Result<RateLimiter> {
        let mut all = self.limiters_named(name).await?;
        Ok(all.swap_remove(0))
    }

    /// Every limiter registered as `name`, rebuilt: one per algorithm (a
    /// plan change may run a second one under the name, on keys of its
    /// own, while instances move over). Never empty.
    async fn limiters_named(&self, name: &str) -> Result<Vec<RateLimiter>> {
        let all = self
            .registered_limiters()
            .await?
            .into_iter()
            .filter(|l| l.name == name)
            .map(|info| rebuild::rebuild(&self.backend, &self.prefix, &info, self.timeout))
            .collect::<Result<Vec<_>>>()?;
        if all.is_empty() {
            return Err(Error::NotRegistered(format!("limiter {name:?}")));
        }
        Ok(all)
    }

    /// What the limiter `limiter` holds for `subject` now: of several
    /// algorithms under the name, the one with the fewest units left.
    pub async fn inspect(&self, limiter: &str, subject: &Subject) -> Result<SubjectState> {
        let mut least: Option<SubjectState> = None;
        for l in self.limiters_named(limiter).await? {
            let state = l.inspect(subject).await?;
            if least.as_ref().is_none_or(|s| state.remaining < s.remaining) {
                least = Some(state);
            }
        }
        Ok(least.expect("limiters_named is never empty"))
    }

    /// Gives `subject` its whole quota back on `limiter`, fleet-wide (on
    /// every algorithm registered under the name).
    pub async fn reset(&self, limiter: &str, subject: &Subject) -> Result<()> {
        for l in self.limiters_named(limiter).await? {
            l.reset(subject).await?;
        }
        Ok(())
    }

    /// Refuses `subject` on `limiter` for `duration` whatever its quota
    /// says, fleet-wide (a later block replaces it). The block is the
    /// name's, whatever algorithm checks it.
    pub async fn block(&self, limiter: &str, subject: &Subject, duration: Duration) -> Result<()> {
        self.limiter(limiter).await?.block(subject, duration).await
    }

    /// Lifts a block of `subject` on `limiter`, fleet-wide.
    pub async fn unblock(&self, limiter: &str, subject: &Subject) -> Result<()> {
        self.limiter(limiter).await?.unblock(subject).await
    }

    /// The most throttled subjects over every registered limiter, most
    /// denied first (at most `n`).
    pub async fn throttled(&self, n: usize) -> Result<Vec<ThrottledSubject>> {
        reports::throttled(self, n).await
    }
}
