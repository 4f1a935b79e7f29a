//! [`Gate`]: what a held request waits at — a lock, or the permits of a
//! concurrency limit — and how each one's outcomes are counted and traced.

use futures_util::future::BoxFuture;
use http::HeaderValue;
use tollgate_core::{Error, Lease, LockOptions, Locker, Semaphore, Subject};

use crate::key::KeyError;
use crate::rejection::{Middleware, Rejection};

/// What a request waits at before its handler runs.
#[derive(Debug, Clone)]
pub(crate) enum Gate {
    /// One holder per resource.
    Lock(Locker),
    /// At most N in flight per key; `policy` is the `RateLimit-Policy` a
    /// refusal carries.
    Permits {
        semaphore: Semaphore,
        policy: HeaderValue,
    },
}

/// How an acquire ended.
pub(crate) enum Acquired {
    /// Held: the handler runs under this lease.
    Held(Lease),
    /// The backend is unavailable and the failure policy lets the request
    /// through without a permit.
    Pass,
    /// Refused with this rejection.
    Refused(Box<Rejection>),
}

const LOCKS: &str = "tollgate_lock_requests_total";
const PERMITS: &str = "tollgate_concurrency_requests_total";

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
            // Checked as they are used: renewed, with no hold cap.
            Gate::Permits { semaphore, .. } => {
                semaphore.check_options(&crate::concurrency::for_a_request(options))
            }
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
            Gate::Permits { semaphore, policy } => {
                let (semaphore, policy) = (semaphore.clone(), policy.clone());
                let options = crate::concurrency::for_a_request(&options);
                Box::pin(async move {
                    let result = semaphore.acquire(subject.clone(), &options).await;
                    permit_outcome(&semaphore, &policy, &subject, result)
                })
            }
        }
    }

    /// A request whose key extractor refused it.
    pub(crate) fn key_error(&self, e: &KeyError) {
        match self {
            Gate::Lock(_) => {
                count(LOCKS, "key_error");
                tracing::debug!(target: "tollgate_tower::lock", status = e.status().as_u16(), error = %e, "request could not be keyed");
            }
            Gate::Permits { .. } => {
                count(PERMITS, "key_error");
                tracing::debug!(target: "tollgate_tower::concurrency", status = e.status().as_u16(), error = %e, "request could not be keyed");
            }
        }
    }

    /// The answer to a request cancelled because its lease or permit was lost.
    pub(crate) fn lost_rejection(&self) -> Rejection {
        match self {
            Gate::Lock(_) => Rejection::lease_lost(),
            Gate::Permits { .. } => Rejection::permit_lost(),
        }
    }

    /// A lease lost while its request was handled; `cancel` says whether
    /// the handler is cancelled.
    pub(crate) fn lost(&self, cancel: bool) {
        match self {
            Gate::Lock(_) => {
                count(LOCKS, "lost");
                tracing::warn!(target: "tollgate_tower::lock", cancel, "lock lease lost mid-request");
            }
            Gate::Permits { .. } => {
                count(PERMITS, "lost");
                tracing::warn!(target: "tollgate_tower::concurrency", cancel, "concurrency permit lost mid-request");
            }
        }
    }
}

fn lock_outcome(resource: &Subject, result: Result<Lease, Error>) -> Acquired {
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

pub(crate) fn permit_outcome(
    semaphore: &Semaphore,
    policy: &HeaderValue,
    key: &Subject,
    result: Result<Lease, Error>,
) -> Acquired {
    const T: &str = "tollgate_tower::concurrency";
    let e = match result {
        Ok(permit) => {
            count(PERMITS, "acquired");
            tracing::debug!(target: T, key = %key.digest(), fence = permit.fence().get(), "permit acquired");
            return Acquired::Held(permit);
        }
        Err(e) => e,
    };
    match &e {
        Error::Busy { retry_after, .. } => {
            count(PERMITS, "busy");
            tracing::info!(target: T, key = %key.digest(), retry_after = ?retry_after, "too many in flight");
            return Acquired::Refused(Box::new(Rejection::too_many_in_flight(
                *retry_after,
                Some(policy.clone()),
            )));
        }
        e if semaphore.fails_open(e) => {
            count(PERMITS, "fail_open");
            tracing::warn!(target: T, key = %key.digest(), error = %e, "concurrency backend unavailable; request let through without a permit");
            return Acquired::Pass;
        }
        e if e.is_unavailable() => {
            count(PERMITS, "unavailable");
            tracing::warn!(target: T, key = %key.digest(), error = %e, "concurrency backend unavailable");
        }
        e => {
            count(PERMITS, "error");
            tracing::warn!(target: T, key = %key.digest(), error = %e, "permit acquire failed");
        }
    }
    Acquired::Refused(Box::new(Rejection::from_error(
        Middleware::ConcurrencyLimit,
        e,
    )))
}
