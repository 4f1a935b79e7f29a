//! The one error type of tollgate-core.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::task::coop::{unconstrained, Unconstrained};
use tokio::time::{sleep, Sleep};

/// Everything that can go wrong in a check, an acquire or a construction.
///
/// Configuration mistakes ([`Error::InvalidQuota`], [`Error::InvalidConfig`],
/// [`Error::CostExceedsCapacity`]) are reported before any round trip; backend
/// trouble ([`Error::Backend`], [`Error::Timeout`], [`Error::CircuitOpen`]) is
/// what the failure policy of a limiter acts on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The quota can never admit anything, or its numbers overflow.
    #[error("invalid quota: {0}")]
    InvalidQuota(String),
    /// A builder was given a value that cannot work (prefix with braces, …).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The request costs more than the quota can ever hold; it can never be
    /// admitted, so it is refused without touching the backend.
    #[error("cost {cost} exceeds the capacity {capacity} of the quota; it can never be admitted")]
    CostExceedsCapacity {
        /// The cost that was asked for.
        cost: u64,
        /// The most the quota can ever admit at once.
        capacity: u64,
    },
    /// The backend answered with an error or the connection failed. The
    /// cause is opaque (no Redis client type in the API); it is reachable
    /// through [`std::error::Error::source`].
    #[error("backend error: {0}")]
    Backend(#[from] BackendError),
    /// The backend answered something the script cannot have returned.
    #[error("unexpected reply from the backend: {0}")]
    Protocol(String),
    /// The backend did not answer within the configured bound.
    #[error("backend did not answer within {0:?}")]
    Timeout(Duration),
    /// Recent checks failed repeatedly, so this one did not wait for the
    /// backend at all; the circuit closes again on its own after a short pause.
    #[error("backend circuit is open after repeated failures")]
    CircuitOpen,
    /// A holder asked for more permits than the semaphore has: it can never
    /// be granted, so it is refused without touching the backend.
    #[error("{requested} permits requested of a semaphore of {limit}; it can never be granted")]
    PermitsExceedLimit {
        /// The permits asked for.
        requested: u32,
        /// The semaphore's permit count.
        limit: u32,
    },
    /// The operator plane found no such name in the registry.
    #[error("not registered: {0}")]
    NotRegistered(String),
    /// A lock (or a semaphore's permits) could not be acquired within the
    /// wait bound.
    #[error("lock {name:?} is held by someone else")]
    Busy {
        /// The lock's name.
        name: String,
        /// A realistic wait before trying again, when known: the name's
        /// typical hold as this process saw holds end (a moving average),
        /// never beyond what the holder's lease still runs; that remaining
        /// lease until a hold has been seen.
        retry_after: Option<Duration>,
    },
}

impl Error {
    /// True for errors that come from the backend being unavailable or slow
    /// (not from configuration or from a limit being reached).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Error::Backend(_) | Error::Timeout(_) | Error::CircuitOpen | Error::Protocol(_)
        )
    }
}

/// What a backend reported: a message, whether it means the backend is down
/// or overloaded, and the underlying error as [`source`](std::error::Error::source).
///
/// Custom [`RateBackend`](crate::RateBackend) and
/// [`LockBackend`](crate::LockBackend) implementations build one from their
/// own errors:
///
/// ```
/// use tollgate::{BackendError, Error};
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let e = Error::from(BackendError::outage(io));
/// assert!(e.is_unavailable());
/// assert!(std::error::Error::source(&e).is_some());
/// ```
#[derive(Debug)]
pub struct BackendError {
    outage: bool,
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl BackendError {
    /// An error about one request (a wrong key type, a script error): the
    /// backend itself works, so a circuit breaker does not count it, and a
    /// rate limiter returns it under every failure policy (admitting it
    /// would lift that subject's limit for as long as the cause stays).
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        BackendError {
            outage: false,
            source: source.into(),
        }
    }

    /// An error that means the backend is unreachable, overloaded or
    /// refusing every request (a connection refused or dropped, a timeout,
    /// a loading or failing-over server, one out of memory): what a
    /// limiter's circuit breaker counts and its failure policy acts on.
    pub fn outage(source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        BackendError {
            outage: true,
            source: source.into(),
        }
    }

    /// Whether the backend is unreachable or overloaded, rather than
    /// refusing one request.
    pub fn is_outage(&self) -> bool {
        self.outage
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The cause's own text: callers match on it (`WRONGTYPE`, …) and it
        // is the only detail there is.
        fmt::Display::fmt(&self.source, f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

impl BackendError {
    /// The one place a redis-rs error becomes a tollgate error. The outage
    /// classification is made here, from redis-rs's kinds, so nothing outside
    /// the Redis backend looks at them. Deliberately not a `From` impl: a
    /// public `From<redis::RedisError>` would put redis-rs's type (and its
    /// version) in tollgate's API.
    pub(crate) fn from_redis(e: redis::RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind as S};
        let outage = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || matches!(
                e.kind(),
                ErrorKind::ClusterConnectionNotFound
                    // Mid-failover, no sentinel names a reachable master
                    // yet: the service is down for now, not wrong.
                    | ErrorKind::MasterNameNotFoundBySentinel
                    | ErrorKind::NoValidReplicasFoundBySentinel
                    | ErrorKind::AuthenticationFailed
                    | ErrorKind::Server(
                        S::BusyLoading
                            // A redirection still met after the retries
                            // (`Conn`): the cluster is moving its slots.
                            | S::Moved
                            | S::Ask
                            | S::TryAgain
                            | S::ClusterDown
                            | S::MasterDown
                            | S::ReadOnly
                            | S::NoPerm
                    )
            )
            // A server that refuses every request alike (out of memory, a
            // script busy, writes stopped after a failed save, too few
            // replicas, authentication) is down for the limiter, not wrong
            // about one key: the failure policy applies, not an error.
            || matches!(
                e.code(),
                Some("OOM" | "BUSY" | "MISCONF" | "NOREPLICAS" | "NOAUTH" | "WRONGPASS")
            )
            // Before Redis 7, a command refused inside a script comes back
            // as "ERR Error running script …: -OOM command not allowed …".
            || (e.code() == Some("ERR")
                && e.detail().is_some_and(|d| {
                    ["-OOM ", "-READONLY ", "-MISCONF ", "-NOREPLICAS "]
                        .iter()
                        .any(|code| d.contains(code))
                }));
        BackendError {
            outage,
            source: Box::new(e),
        }
    }
}

/// `Error::Backend` from a redis-rs error, for `map_err` in the Redis code.
pub(crate) fn redis_error(e: redis::RedisError) -> Error {
    Error::Backend(BackendError::from_redis(e))
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `call`'s result, or [`Error::Timeout`] once `bound` has passed since it
/// was first found pending: how every call to a store is bounded by its
/// caller's own timeout. A call answered on its first poll (an in-process
/// store) starts no timer, so it needs none of the runtime.
pub(crate) fn within<F: Future>(bound: Duration, call: F) -> Within<F> {
    Within {
        call,
        timer: None,
        bound,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`within`]: its timer is made when the call is first
    /// found pending, so the call is polled once per wake-up, not once more
    /// to start the timer. The timer is polled outside the task's budget
    /// (as tokio's `Timeout` does), so a call that spends it on every poll
    /// cannot hold its own timeout off.
    pub(crate) struct Within<F> {
        #[pin]
        call: F,
        #[pin]
        timer: Option<Unconstrained<Sleep>>,
        bound: Duration,
    }
}

impl<F: Future<Output = Result<T>>, T> Future for Within<F> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut this = self.project();
        if let Poll::Ready(reply) = this.call.poll(cx) {
            return Poll::Ready(reply);
        }
        if this.timer.is_none() {
            this.timer.set(Some(unconstrained(sleep(*this.bound))));
        }
        match this.timer.as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(Error::Timeout(*this.bound))),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that spends the task's whole budget on every poll, and never
    /// ends, is still cut off at its bound.
    #[tokio::test]
    async fn a_call_that_spends_the_budget_still_times_out() {
        let spinning = async {
            loop {
                tokio::task::coop::consume_budget().await;
            }
        };
        let bound = Duration::from_millis(20);
        let outcome = tokio::time::timeout(Duration::from_secs(10), within(bound, spinning))
            .await
            .expect("within's own timer fired");
        assert!(matches!(outcome, Err::<(), _>(Error::Timeout(b)) if b == bound));
    }

    #[test]
    fn redis_errors_are_classified_before_they_become_opaque() {
        let failover = redis::RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "Master with given name not found in sentinel",
        ));
        assert!(matches!(&redis_error(failover), Error::Backend(b) if b.is_outage()));
        let io = redis::RedisError::from(std::io::Error::other("connection reset"));
        let e = redis_error(io);
        assert!(e.is_unavailable());
        assert!(matches!(&e, Error::Backend(b) if b.is_outage()));
        let script = redis::RedisError::from((redis::ErrorKind::Client, "WRONGTYPE of key"));
        let e = redis_error(script);
        assert!(matches!(&e, Error::Backend(b) if !b.is_outage()));
        // Still unavailable (a 503 over HTTP), though no policy admits it.
        assert!(e.is_unavailable());
        assert!(e.to_string().contains("WRONGTYPE"), "{e}");
        // A server refusing every request alike is an outage.
        for (code, detail) in [
            ("OOM", "command not allowed when used memory > 'maxmemory'."),
            ("BUSY", "Redis is busy running a script."),
            ("MISCONF", "Redis is configured to save RDB snapshots"),
            ("NOREPLICAS", "Not enough good replicas to write."),
            ("NOAUTH", "Authentication required."),
        ] {
            let e = redis_error(redis::make_extension_error(
                code.to_owned(),
                Some(detail.to_owned()),
            ));
            assert!(matches!(&e, Error::Backend(b) if b.is_outage()), "{code}");
        }
        // So is one refused inside a script before Redis 7.
        let wrapped = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "Error running script (call to f_0): @user_script:1: @user_script: 1: \
             -OOM command not allowed when used memory > 'maxmemory'."
                .to_owned(),
        ));
        assert!(matches!(&redis_error(wrapped), Error::Backend(b) if b.is_outage()));
        // A script's runtime error is about its data, not an outage.
        let lua = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "user_script:1: attempt to perform arithmetic on a nil value",
        ));
        assert!(matches!(&redis_error(lua), Error::Backend(b) if !b.is_outage()));
        let source = std::error::Error::source(&e).and_then(std::error::Error::source);
        assert!(source.is_some_and(|s| s.is::<redis::RedisError>()));
    }
}
