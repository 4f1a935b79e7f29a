//! The backend instances of a lock and the calls that go to all of them:
//! one acquire attempt (until a quorum of N/2 + 1 is ours or cannot be; 1 of
//! 1 for a single backend), release and extend by vote, and the per-instance
//! health that lets a Redlock skip a dead master for a moment.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::hold_times::HoldTimes;
use super::options::MAX_LOCK_DURATION;
use super::settings::Settings;
use super::util::{join, new_token};
use super::waiters::Waiters;
use crate::clock::monotonic_micros;
use crate::error::{Error, Result};
use crate::failure::is_outage;
use crate::store::{AcquireReply, AcquireRequest, FencingToken, LockBackend, LockKeys};

/// The instances of one `Locker` (one backend, or the masters of a
/// Redlock), with the settings their calls need.
pub(crate) struct Instances {
    backends: Vec<Arc<dyn LockBackend>>,
    quorum: usize,
    redlock: bool,
    drift_ratio: f64,
    drift_fixed: Duration,
    pub(crate) timeout: Duration,
    /// Release calls wake this process's waiters directly (no round trip
    /// through pub/sub for a release made here).
    pub(crate) waiters: Waiters,
    /// Per instance: skip it for a moment after a failure (Redlock only).
    health: Vec<Health>,
    /// How long names are held, from this process's releases: the wait a
    /// refusal suggests.
    pub(crate) hold_times: HoldTimes,
}

impl fmt::Debug for Instances {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instances")
            .field("instances", &self.backends.len())
            .field("quorum", &self.quorum)
            .finish_non_exhaustive()
    }
}

/// The outcome of one acquire attempt: a [`Granted`] lock inside the attempt,
/// a [`Lease`] once the attempt's task built it.
pub(crate) enum Attempt<T = Granted> {
    Acquired(T),
    /// Someone else holds it (remaining TTL when known).
    Held(Option<Duration>),
    /// Redlock: some instances granted it but not a quorum (contenders split
    /// the votes); released again. Retry after a random pause.
    Split(Duration),
    /// Acquired too slowly (or the quorum's fence could not be recorded):
    /// refused and released.
    Refused(Duration),
}

/// A lock that is ours.
pub(crate) struct Granted {
    pub(crate) token: String,
    pub(crate) fence: FencingToken,
    /// Before the acquire was sent.
    pub(crate) start: Instant,
}

/// How long a Redlock instance that failed is skipped by acquire attempts
/// (then one attempt probes it).
const INSTANCE_COOLDOWN: Duration = Duration::from_secs(1);

/// A per-instance circuit breaker: after a failure, skip the instance until
/// the cooldown has passed, then let exactly one attempt probe it.
#[derive(Default)]
struct Health {
    /// 0 = up; else skipped until this monotonic time (µs).
    down_until: AtomicU64,
}

impl Health {
    fn admits(&self) -> bool {
        let until = self.down_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        let now = monotonic_micros();
        now >= until
            && self
                .down_until
                .compare_exchange(
                    until,
                    now + INSTANCE_COOLDOWN.as_micros() as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    fn success(&self) {
        self.down_until.store(0, Ordering::Release);
    }

    fn failure(&self) {
        let until = monotonic_micros() + INSTANCE_COOLDOWN.as_micros() as u64;
        self.down_until.store(until.max(1), Ordering::Release);
    }
}

#[derive(Default)]
struct Tally {
    yes: usize,
    no: usize,
    error: Option<Error>,
}

impl Tally {
    fn count(
        &mut self,
        r: std::result::Result<Result<bool>, tokio::time::error::Elapsed>,
        bound: Duration,
    ) {
        match r {
            Ok(Ok(true)) => self.yes += 1,
            Ok(Ok(false)) => self.no += 1,
            Ok(Err(e)) => {
                self.error.get_or_insert(e);
            }
            Err(_) => {
                self.error.get_or_insert(Error::Timeout(bound));
            }
        }
    }
}

/// A call that [`Instances::vote`] makes on every instance: release or extend
/// (the `Duration` is the TTL of an extend).
type VoteOp =
    for<'a> fn(&'a dyn LockBackend, &'a LockKeys, &'a str, Duration) -> BoxFuture<'a, Result<bool>>;

impl Instances {
    /// `backends` (at least one, checked by the caller) with the timing
    /// settings of `s`.
    pub(crate) fn new(
        backends: Vec<Arc<dyn LockBackend>>,
        redlock: bool,
        s: &Settings,
        waiters: Waiters,
    ) -> Self {
        // The first read of the clock calibrates it: now, not in a failure.
        crate::clock::start();
        let n = backends.len();
        Instances {
            quorum: n / 2 + 1,
            backends,
            redlock,
            drift_ratio: s.drift_ratio,
            drift_fixed: s.drift_fixed,
            timeout: s.timeout,
            waiters,
            health: (0..n).map(|_| Health::default()).collect(),
            hold_times: HoldTimes::default(),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        if self.redlock {
            "redlock"
        } else {
            self.backends[0].lock_kind()
        }
    }

    /// The number of instances.
    pub(crate) fn len(&self) -> usize {
        self.backends.len()
    }

    pub(crate) fn backends(&self) -> &[Arc<dyn LockBackend>] {
        &self.backends
    }

    pub(crate) fn is_redlock(&self) -> bool {
        self.redlock
    }

    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// The drift allowance for a TTL: ratio × TTL + fixed.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_ratio)
            .saturating_add(self.drift_fixed)
    }

    /// How long a lock of `ttl` can be trusted after its request was sent:
    /// TTL − drift, saturating at zero (never an underflow on short TTLs).
    pub(crate) fn validity(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.drift(ttl))
    }

    /// Checks a TTL for an acquire or an extend.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        if ttl < Duration::from_millis(1) || ttl > MAX_LOCK_DURATION {
            return Err(Error::InvalidConfig(format!(
                "a lock TTL must be between 1 ms and {MAX_LOCK_DURATION:?}, got {ttl:?}"
            )));
        }
        if self.validity(ttl).is_zero() {
            return Err(Error::InvalidConfig(format!(
                "a lock TTL of {ttl:?} leaves no validity after the drift allowance of {:?}",
                self.drift(ttl)
            )));
        }
        Ok(())
    }

    /// One acquire attempt on every instance, in parallel, until a quorum
    /// (N/2 + 1; 1 of 1 for a single backend) is ours or cannot be.
    pub(crate) async fn attempt(
        &self,
        keys: &LockKeys,
        ttl: Duration,
        fence_ttl: Duration,
        ticket: Option<&(String, Duration)>,
    ) -> Result<Attempt> {
        let mut request = AcquireRequest::new(keys.clone(), new_token()?, ttl, fence_ttl);
        if let Some((ticket, ttl)) = ticket {
            request = request.with_ticket(ticket.clone(), *ttl);
        }
        let start = Instant::now();
        let n = self.backends.len();
        let mut pending: FuturesUnordered<_> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let request = &request;
                // Redlock: an instance that just failed is skipped for a
                // moment (one probe per cooldown), so a dead or paused master
                // does not cost every attempt a timeout.
                let skip = self.redlock && !self.health[i].admits();
                async move {
                    if skip {
                        return (i, Ok(Err(Error::CircuitOpen)));
                    }
                    (
                        i,
                        tokio::time::timeout(self.timeout, b.acquire_lock(request)).await,
                    )
                }
            })
            .collect();
        let mut acquired: Vec<(usize, FencingToken)> = Vec::new();
        // Instances whose state is unknown (no answer, an error) or ours: the
        // ones a failed attempt must clean up.
        let mut settled = vec![false; n];
        let (mut held, mut answered) = (0usize, 0usize);
        let mut pttl: Option<Duration> = None;
        let mut error: Option<Error> = None;
        while let Some((i, reply)) = pending.next().await {
            answered += 1;
            match &reply {
                // Skipped: nothing was sent, nothing to clean up.
                Ok(Err(Error::CircuitOpen)) => settled[i] = true,
                Ok(Ok(_)) => self.health[i].success(),
                // An error about this request's own keys (a key of another
                // type) is an answer: the instance is up for every other name.
                Ok(Err(e)) if !is_outage(e) => self.health[i].success(),
                Ok(Err(_)) | Err(_) => self.health[i].failure(),
            }
            match reply {
                Ok(Ok(AcquireReply::Acquired { fence })) => acquired.push((i, fence)),
                Ok(Ok(AcquireReply::Held { pttl: p })) => {
                    held += 1;
                    settled[i] = true;
                    if let Some(p) = p {
                        pttl = Some(pttl.map_or(p, |q| q.min(p)));
                    }
                }
                Ok(Err(e)) => error = Some(e),
                Err(_) => error = Some(Error::Timeout(self.timeout)),
            }
            if acquired.len() >= self.quorum || acquired.len() + (n - answered) < self.quorum {
                break;
            }
        }
        // Instances that have not answered may still apply the request: the
        // clean-up below (on failure) and the release (on success) cover them.
        drop(pending);
        if acquired.len() < self.quorum {
            let unsettled: Vec<usize> = (0..n).filter(|i| !settled[*i]).collect();
            if !unsettled.is_empty() {
                self.clean_up_on(unsettled, keys, &request.token);
            }
            return match error {
                Some(e) if held == 0 => Err(e),
                _ if !acquired.is_empty() => Ok(Attempt::Split(start.elapsed())),
                _ => Ok(Attempt::Held(pttl)),
            };
        }
        let fence = acquired.iter().map(|(_, f)| *f).max().expect("quorum >= 1");
        if acquired.iter().any(|(_, f)| *f < fence) {
            // Redlock: record the agreed fence on the whole quorum, so the next
            // quorum (which shares an instance with this one) starts above it
            // whatever the instances' clocks say.
            let raised = acquired
                .iter()
                .filter(|(_, f)| *f < fence)
                .map(|(i, _)| {
                    let b = &self.backends[*i];
                    let token = request.token.as_str();
                    async move {
                        matches!(
                            tokio::time::timeout(
                                self.timeout,
                                b.raise_fence(keys, token, fence, fence_ttl)
                            )
                            .await,
                            Ok(Ok(true))
                        )
                    }
                })
                .collect::<FuturesUnordered<_>>()
                .filter(|ok| futures_util::future::ready(*ok))
                .count()
                .await;
            let recorded = raised + acquired.iter().filter(|(_, f)| *f == fence).count();
            if recorded < self.quorum {
                self.clean_up(keys, &request.token);
                return Ok(Attempt::Refused(start.elapsed()));
            }
        }
        if start.elapsed() >= self.validity(ttl) {
            // Too slow: the lock may already have expired somewhere.
            tracing::warn!(lock = %keys.lock, elapsed = ?start.elapsed(), ?ttl, "acquired too slowly to be trusted; released");
            self.clean_up(keys, &request.token);
            return Ok(Attempt::Refused(start.elapsed()));
        }
        Ok(Attempt::Acquired(Granted {
            token: request.token,
            fence,
            start,
        }))
    }

    /// Releases `token`'s lock on every instance in the background.
    fn clean_up(&self, keys: &LockKeys, token: &str) {
        self.clean_up_on((0..self.backends.len()).collect(), keys, token);
    }

    /// Releases `token`'s lock on the instances `which`, in parallel, in the
    /// background (a fresh token per attempt: this can never release a later
    /// attempt's lock).
    fn clean_up_on(&self, which: Vec<usize>, keys: &LockKeys, token: &str) {
        let backends: Vec<_> = which
            .into_iter()
            .map(|i| self.backends[i].clone())
            .collect();
        let (keys, token, timeout) = (keys.clone(), token.to_owned(), self.timeout);
        tokio::spawn(async move {
            let (keys, token) = (&keys, token.as_str());
            backends
                .iter()
                .map(|b| tokio::time::timeout(timeout, b.release_lock(keys, token)))
                .collect::<FuturesUnordered<_>>()
                .for_each(|_| futures_util::future::ready(()))
                .await;
        });
    }

    /// Runs `op` on every instance in parallel, each bounded by `bound`, and
    /// counts the answers until the outcome is decided: a quorum of `true`,
    /// too many `false` for a quorum, or every answer in. Calls still running
    /// then finish in the background, within the bound (a paused instance
    /// never delays the decision; one that stays silent past the bound keeps
    /// what it holds until its TTL). A single instance is called in
    /// place, without copying `keys` and `token`.
    async fn vote(
        &self,
        bound: Duration,
        keys: &LockKeys,
        token: &str,
        ttl: Duration,
        op: VoteOp,
    ) -> Tally {
        let n = self.backends.len();
        let mut tally = Tally::default();
        if n == 1 {
            tally.count(
                tokio::time::timeout(bound, op(&*self.backends[0], keys, token, ttl)).await,
                bound,
            );
            return tally;
        }
        let shared = Arc::new((keys.clone(), token.to_owned()));
        let (tx, mut rx) = mpsc::unbounded_channel();
        for b in &self.backends {
            let (b, shared, tx) = (b.clone(), shared.clone(), tx.clone());
            tokio::spawn(async move {
                let (keys, token) = &*shared;
                let _ = tx.send(tokio::time::timeout(bound, op(&*b, keys, token, ttl)).await);
            });
        }
        drop(tx);
        while let Some(r) = rx.recv().await {
            tally.count(r, bound);
            if tally.yes >= self.quorum || tally.no > n - self.quorum {
                break;
            }
        }
        tally
    }

    /// [`release_here`](Self::release_here) in a task of its own on
    /// `handle`: dropping the caller mid-flight (a `timeout`, a cancelled
    /// request) does not stop the release, so the lock is not left held (and
    /// no longer renewed) until its TTL.
    pub(crate) async fn release(
        self: &Arc<Self>,
        keys: &LockKeys,
        token: &str,
        handle: &Handle,
    ) -> Result<bool> {
        let (instances, keys, token) = (self.clone(), keys.clone(), token.to_owned());
        join(handle.spawn(async move { instances.release_here(&keys, &token).await })).await
    }

    /// Compare-and-delete on every instance. `true` when a quorum still held
    /// it, `false` when too many instances said it was no longer ours for a
    /// quorum to have held it; an error when the answers decide neither (a
    /// lock still held on instances that did not answer is not reported as
    /// lost: it expires at its TTL).
    pub(crate) async fn release_here(&self, keys: &LockKeys, token: &str) -> Result<bool> {
        let t = self
            .vote(
                self.timeout,
                keys,
                token,
                Duration::ZERO,
                |b, keys, token, _| b.release_lock(keys, token),
            )
            .await;
        if t.yes > 0 {
            self.waiters.wake(&keys.channel);
        }
        if t.yes >= self.quorum {
            Ok(true)
        } else if t.no > self.backends.len() - self.quorum {
            Ok(false)
        } else {
            Err(t.error.unwrap_or(Error::Timeout(self.timeout)))
        }
    }

    /// Compare-and-pexpire on every instance, bounded by `bound`. `Ok(true)`
    /// when a quorum extended it, `Ok(false)` when too many instances said it
    /// is no longer ours for a quorum to remain, an error otherwise.
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        token: &str,
        ttl: Duration,
        bound: Duration,
    ) -> Result<bool> {
        let t = self
            .vote(bound, keys, token, ttl, |b, keys, token, ttl| {
                b.extend_lock(keys, token, ttl)
            })
            .await;
        if t.yes >= self.quorum {
            Ok(true)
        } else if t.no > self.backends.len() - self.quorum {
            Ok(false)
        } else {
            Err(t.error.unwrap_or(Error::Timeout(bound)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    fn instances(redlock: bool, n: usize) -> Instances {
        let backends = (0..n)
            .map(|_| Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>)
            .collect();
        let waiters = Waiters::new("tollgate:lock:".into(), false);
        Instances::new(backends, redlock, &Settings::default(), waiters)
    }

    #[test]
    fn validity_saturates_on_short_ttls() {
        let c = instances(false, 1);
        assert_eq!(c.drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(
            c.validity(Duration::from_secs(10)),
            Duration::from_millis(9898)
        );
        // rslock's `validity - 500 ms` underflowed here; ours saturates.
        assert_eq!(c.validity(Duration::from_millis(1)), Duration::ZERO);
        assert!(c.check_ttl(Duration::from_millis(2)).is_err());
        assert!(c.check_ttl(Duration::from_millis(3)).is_ok());
        assert!(c.check_ttl(Duration::ZERO).is_err());
    }

    #[test]
    fn quorum_is_a_majority() {
        for (n, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)] {
            assert_eq!(instances(true, n).quorum(), q, "{n}");
        }
    }

    #[test]
    fn health_skips_a_failed_instance_then_probes_once() {
        let h = Health::default();
        assert!(h.admits());
        h.failure();
        assert!(!h.admits());
        h.down_until.store(1, Ordering::Release); // cooldown over
        assert!(h.admits());
        assert!(!h.admits(), "only one probe per cooldown");
        h.success();
        assert!(h.admits());
    }
}
