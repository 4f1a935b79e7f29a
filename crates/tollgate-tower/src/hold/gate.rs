//! [`Gate`]: what a held request waits at — a lock, or (later) the permits
//! of a concurrency limit — and how each one's outcomes are counted and
//! traced.

use futures_util::future::BoxFuture;
use tollgate_core::{Error, Lease, LockOptions, Locker, Subject};

use crate::key::KeyError;
use crate::rejection::{Middleware, Rejection};

/// What a request waits at before its handler runs.
#[derive(Debug, Clone)]
pub(crate) enum Gate {
    /// One holder per resource.
    Lock(Locker),
}

/// How an acquire ended.
pub(crate) enum Acquired {
    /// Held: the handler runs under this lease.
    Held(Lease),
    /// Refused with this rejection.
    Refused(Box<Rejection>),
}

#[cfg(feature = "metrics")]
fn count(name: &'static str, outcome: &'static str) {
    metrics::counter!(name, "outcome" => outcome).increment(1);
}

#[cfg(not(feature = "metrics"))]
fn count(_name: &'static str, _outcome: &'static str) {}

impl Gate {
    /// Whether the gate accepts `options`.
    pub(crate) fn check_options(&self, options: &LockOptions) -> Result<(), Error> {
        match self {
            Gate::Lock(locker) => locker.check_options(options),
        }
    }

    /// Acquires `subject` with `options`; counts and traces the outcome.
    pub(crate) fn acquire(
        &self,
        subject: Subject,
        options: LockOptions,
    ) -> BoxFuture<'static, Acquired> {
        match self {
            Gate::Lock(locker) => {
                let locker = locker.clone();
                Box::pin(async move {
                    let result = locker.acquire(subject.clone(), &options).await;
                    lock_outcome(&subject, result)
                })
            }
        }
    }

    /// A request whose key extractor refused it.
    pub(crate) fn key_error(&self, e: &KeyError) {
        match self {
            Gate::Lock(_) => {
                count("tollgate_lock_requests_total", "key_error");
                tracing::debug!(target: "tollgate_tower::lock", status = e.status().as_u16(), error = %e, "request could not be keyed");
            }
        }
    }

    /// A lease lost while its request was handled; `cancel` says whether
    /// the handler is cancelled.
    pub(crate) fn lost(&self, cancel: bool) {
        match self {
            Gate::Lock(_) => {
                count("tollgate_lock_requests_total", "lost");
                tracing::warn!(target: "tollgate_tower::lock", cancel, "lock lease lost mid-request");
            }
        }
    }
}

fn lock_outcome(resource: &Subject, result: Result<Lease, Error>) -> Acquired {
    const LOCKS: &str = "tollgate_lock_requests_total";
    let e = match result {
        Ok(lease) => {
            count(LOCKS, "acquired");
            tracing::debug!(target: "tollgate_tower::lock", resource = %resource.digest(), fence = lease.fence().get(), "lock acquired");
            return Acquired::Held(lease);
        }
        Err(e) => e,
    };
    match &e {
        Error::Busy { retry_after, .. } => {
            count(LOCKS, "busy");
            tracing::info!(target: "tollgate_tower::lock", resource = %resource.digest(), retry_after = ?retry_after, "lock busy");
        }
        e if e.is_unavailable() => {
            count(LOCKS, "unavailable");
            tracing::warn!(target: "tollgate_tower::lock", resource = %resource.digest(), error = %e, "lock backend unavailable");
        }
        e => {
            count(LOCKS, "error");
            tracing::warn!(target: "tollgate_tower::lock", resource = %resource.digest(), error = %e, "lock acquire failed");
        }
    }
    Acquired::Refused(Box::new(Rejection::from_error(Middleware::Lock, e)))
}
