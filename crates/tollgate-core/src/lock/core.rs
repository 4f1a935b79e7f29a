//! What a `Locker` and a `Redlock` share: settings, the acquire attempt over
//! one or several instances, the wait loop, release and extend.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::backend::{AcquireReply, AcquireRequest, LockBackend, LockKeys};
use super::lease::Lease;
use super::waiters::Waiters;
use super::{FencingToken, LockOptions, MAX_LOCK_DURATION};
use crate::error::{BackendError, Error, Result};
use crate::keyspace::{hex, Keyspace, Subject, DEFAULT_PREFIX};

/// Default bound on one lock round trip.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(500);
/// Default upper bound of the fallback poll of a waiter (it is also bounded
/// by the lock's remaining TTL).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Default TTL of fence keys: 1 hour after the last acquire of a lock, and
/// never less than [`FENCE_TTL_TTLS`] × the lock's TTL. The server-time
/// floor of the fencing token keeps tokens increasing after the key is gone;
/// the key only covers bursts within one microsecond and clock steps back
/// while it lives (see the [module docs](crate::lock)).
pub const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(3600);
/// At every acquire, the fence key lives at least this many lock TTLs.
pub const FENCE_TTL_TTLS: u32 = 10;
/// Poll bound when no release subscription is established.
const POLL_WITHOUT_PUBSUB: Duration = Duration::from_millis(50);
/// Default drift allowance: 1 % of the TTL plus 2 ms.
const DEFAULT_DRIFT_RATIO: f64 = 0.01;
const DEFAULT_DRIFT_FIXED: Duration = Duration::from_millis(2);

/// A uniform random number in [0, 1) from the OS CSPRNG (for jitter).
pub(crate) fn unit_random() -> f64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

/// The pause after a split vote: uniform in [1 ms, max(5 ms, 4 × the
/// attempt's duration)].
fn split_pause(attempt: Duration) -> Duration {
    let span = (attempt * 4).max(Duration::from_millis(5));
    Duration::from_millis(1) + span.mul_f64(unit_random())
}

/// `at + d`, never panicking: a duration too long for the clock is cut to
/// [`MAX_LOCK_DURATION`] (user durations are checked against that bound
/// before they get here; only the poll interval is not), and if even that
/// overflows, `at` itself (the deadline is then already due).
pub(crate) fn instant_after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(MAX_LOCK_DURATION))
        .unwrap_or(at)
}

/// The error of a lock task that the runtime dropped (it is shutting down).
fn runtime_gone() -> Error {
    Error::Backend(BackendError::outage(
        "the tokio runtime shut down during a lock operation",
    ))
}

/// Awaits a lock task: its result, its panic, or [`runtime_gone`].
async fn join<T>(task: tokio::task::JoinHandle<Result<T>>) -> Result<T> {
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(runtime_gone()),
    }
}

/// A fresh 128-bit owner token from the OS CSPRNG, hex.
fn new_token() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| {
        // An outage, as before the error was opaque: it was an I/O error.
        Error::Backend(BackendError::outage(format!(
            "the OS random source failed: {e}"
        )))
    })?;
    Ok(hex(&b))
}

/// The settings common to [`LockerBuilder`](super::LockerBuilder) and
/// [`RedlockBuilder`](super::RedlockBuilder).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) defaults: LockOptions,
    pub(crate) drift_ratio: f64,
    pub(crate) drift_fixed: Duration,
    pub(crate) timeout: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) fence_ttl: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            prefix: DEFAULT_PREFIX.to_owned(),
            defaults: LockOptions::default(),
            drift_ratio: DEFAULT_DRIFT_RATIO,
            drift_fixed: DEFAULT_DRIFT_FIXED,
            timeout: DEFAULT_LOCK_TIMEOUT,
            poll_interval: DEFAULT_POLL_INTERVAL,
            fence_ttl: DEFAULT_FENCE_TTL,
        }
    }
}

pub(crate) struct Core {
    backends: Vec<Arc<dyn LockBackend>>,
    quorum: usize,
    redlock: bool,
    keyspace: Keyspace,
    pub(crate) defaults: LockOptions,
    drift_ratio: f64,
    drift_fixed: Duration,
    pub(crate) timeout: Duration,
    poll_interval: Duration,
    fence_ttl: Duration,
    pub(crate) waiters: Waiters,
    /// Per instance: skip it for a moment after a failure (Redlock only).
    health: Vec<Health>,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct(if self.redlock { "Redlock" } else { "Locker" });
        if self.redlock {
            d.field("instances", &self.backends.len())
                .field("quorum", &self.quorum);
        } else {
            d.field("backend", &self.kind());
        }
        d.field("keyspace", &self.keyspace)
            .field("defaults", &self.defaults)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The outcome of one acquire attempt: a [`Granted`] lock inside the attempt,
/// a [`Lease`] once the attempt's task built it.
enum Attempt<T = Granted> {
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

/// How long a Redlock instance that failed is skipped by acquire attempts
/// (then one attempt probes it).
const INSTANCE_COOLDOWN: Duration = Duration::from_secs(1);

/// Microseconds on this process's monotonic clock, from 1.
fn monotonic_micros() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

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

/// Answers of the instances to one call.
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

/// A call that [`Core::vote`] makes on every instance: release or extend
/// (the `Duration` is the TTL of an extend).
type VoteOp =
    for<'a> fn(&'a dyn LockBackend, &'a LockKeys, &'a str, Duration) -> BoxFuture<'a, Result<bool>>;

/// What every attempt of one `acquire` call shares (moved into its tasks).
struct AcquireCtx {
    keys: LockKeys,
    name: String,
    options: LockOptions,
    first_ttl: Duration,
    fence_ttl: Duration,
    handle: Handle,
}

/// A lock that is ours.
pub(crate) struct Granted {
    pub(crate) token: String,
    pub(crate) fence: FencingToken,
    /// Before the acquire was sent.
    pub(crate) start: Instant,
}

impl Core {
    pub(crate) fn new(
        backends: Vec<Arc<dyn LockBackend>>,
        redlock: bool,
        s: Settings,
    ) -> Result<Self> {
        if backends.is_empty() {
            return Err(Error::InvalidConfig(
                "a lock needs at least one backend instance".into(),
            ));
        }
        if !(s.drift_ratio.is_finite() && (0.0..1.0).contains(&s.drift_ratio)) {
            return Err(Error::InvalidConfig(format!(
                "the drift ratio must be in [0, 1), got {}",
                s.drift_ratio
            )));
        }
        if s.timeout.is_zero() || s.poll_interval.is_zero() {
            return Err(Error::InvalidConfig(
                "the lock timeout and poll interval must be positive".into(),
            ));
        }
        if s.fence_ttl < Duration::from_secs(1) || s.fence_ttl > MAX_LOCK_DURATION {
            return Err(Error::InvalidConfig(format!(
                "the fence TTL must be between 1 s and {MAX_LOCK_DURATION:?} (the default is 1 hour), got {:?}",
                s.fence_ttl
            )));
        }
        let keyspace = Keyspace::new(s.prefix, "lock")?;
        let n = backends.len();
        let channel_prefix = format!("{}:{}:", keyspace.prefix(), keyspace.policy());
        let core = Core {
            quorum: backends.len() / 2 + 1,
            backends,
            redlock,
            keyspace,
            defaults: s.defaults,
            drift_ratio: s.drift_ratio,
            drift_fixed: s.drift_fixed,
            timeout: s.timeout,
            poll_interval: s.poll_interval,
            fence_ttl: s.fence_ttl,
            waiters: Waiters::new(channel_prefix),
            health: (0..n).map(|_| Health::default()).collect(),
        };
        core.first_ttl(&core.defaults)?;
        Ok(core)
    }

    pub(crate) fn kind(&self) -> &'static str {
        if self.redlock {
            "redlock"
        } else {
            self.backends[0].lock_kind()
        }
    }

    pub(crate) fn keyspace(&self) -> &Keyspace {
        &self.keyspace
    }

    pub(crate) fn instances(&self) -> usize {
        self.backends.len()
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

    /// The TTL of the first acquire (cut to `max_hold`), checked.
    pub(crate) fn first_ttl(&self, options: &LockOptions) -> Result<Duration> {
        let ttl = options.ttl_duration();
        let first = match options.max_hold_duration() {
            Some(cap) if cap.is_zero() || cap > MAX_LOCK_DURATION => {
                return Err(Error::InvalidConfig(format!(
                    "max_hold must be positive and at most {MAX_LOCK_DURATION:?} \
                     (unbounded_hold() renews without a cap), got {cap:?}"
                )))
            }
            Some(cap) => ttl.min(cap),
            None => ttl,
        };
        self.check_ttl(ttl)?;
        self.check_ttl(first)?;
        Ok(first)
    }

    /// The fence key's TTL for a lock of `ttl`: the configured one, but at
    /// least [`FENCE_TTL_TTLS`] × `ttl`.
    fn fence_ttl_for(&self, ttl: Duration) -> Duration {
        self.fence_ttl.max(ttl.saturating_mul(FENCE_TTL_TTLS))
    }

    /// One acquire attempt on every instance, in parallel, until a quorum
    /// (N/2 + 1; 1 of 1 for a single backend) is ours or cannot be.
    async fn attempt(
        &self,
        keys: &LockKeys,
        ttl: Duration,
        fence_ttl: Duration,
    ) -> Result<Attempt> {
        let request = AcquireRequest::new(keys.clone(), new_token()?, ttl, fence_ttl);
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
    /// then finish in the background (a paused instance never delays the
    /// decision, and still gets the call). A single instance is called in
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
        let (core, keys, token) = (self.clone(), keys.clone(), token.to_owned());
        join(handle.spawn(async move { core.release_here(&keys, &token).await })).await
    }

    /// Compare-and-delete on every instance. `true` when a quorum still held
    /// it; an error only when no instance answered.
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
            self.waiters.wake_one(&keys.channel);
        }
        match t.error {
            Some(e) if t.yes + t.no == 0 => Err(e),
            _ => Ok(t.yes >= self.quorum),
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

    /// How long a waiter sleeps when no notification comes: jittered, at most
    /// the poll interval (short when no subscription is up), and bounded by
    /// the lock's remaining TTL (an expiring lock publishes nothing).
    fn pause(&self, pttl: Option<Duration>) -> Duration {
        let cap = if self.waiters.live() {
            self.poll_interval
        } else {
            self.poll_interval.min(POLL_WITHOUT_PUBSUB)
        };
        let jittered = cap.mul_f64(0.5 + 0.5 * unit_random());
        let bounded = match pttl {
            Some(p) => jittered.min(
                p + Duration::from_millis(1)
                    + Duration::from_micros((2000.0 * unit_random()) as u64),
            ),
            None => jittered,
        };
        bounded.max(Duration::from_millis(1))
    }

    /// One acquire attempt and, when it succeeds, the lease — in a task of
    /// its own. If the caller is dropped mid-flight (a `timeout` around
    /// `acquire`, a client that disconnects while middleware waits), the task
    /// still completes: a lock it created becomes a lease that is dropped
    /// with the task's output, which releases it at once instead of leaving
    /// an ownerless lock until its TTL.
    async fn attempt_detached(self: &Arc<Self>, a: &Arc<AcquireCtx>) -> Result<Attempt<Lease>> {
        let (core, a) = (self.clone(), a.clone());
        let task = a.handle.clone().spawn(async move {
            Ok(
                match core.attempt(&a.keys, a.first_ttl, a.fence_ttl).await? {
                    Attempt::Acquired(g) => Attempt::Acquired(Lease::start(
                        core.clone(),
                        a.name.clone(),
                        a.keys.clone(),
                        g,
                        &a.options,
                        a.first_ttl,
                        a.handle.clone(),
                    )),
                    Attempt::Held(pttl) => Attempt::Held(pttl),
                    Attempt::Split(elapsed) => Attempt::Split(elapsed),
                    Attempt::Refused(elapsed) => Attempt::Refused(elapsed),
                },
            )
        });
        join(task).await
    }

    /// Acquires `subject`, waiting up to `options`' bound when `wait`.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        subject: Subject,
        options: &LockOptions,
        wait: bool,
    ) -> Result<Lease> {
        let first_ttl = self.first_ttl(options)?;
        let handle = Handle::try_current().map_err(|_| {
            Error::InvalidConfig("locks need a tokio runtime (timers, the watchdog)".into())
        })?;
        let ctx = Arc::new(AcquireCtx {
            keys: LockKeys::new(&self.keyspace, &subject),
            name: subject.as_encoded().to_owned(),
            fence_ttl: self.fence_ttl_for(options.ttl_duration()),
            options: options.clone(),
            first_ttl,
            handle,
        });
        let busy = |pttl| Error::Busy {
            name: ctx.name.clone(),
            retry_after: pttl,
        };
        let bound = if wait { options.wait_bound() } else { None };
        let Some(bound) = bound else {
            return match self.attempt_detached(&ctx).await? {
                Attempt::Acquired(lease) => Ok(lease),
                Attempt::Held(pttl) => Err(busy(pttl)),
                Attempt::Split(_) => Err(busy(None)),
                Attempt::Refused(elapsed) => Err(Error::Timeout(elapsed)),
            };
        };
        // `None`: waits forever (the bound does not fit in an Instant).
        let until = Instant::now().checked_add(bound);
        self.waiters.start(&self.backends, self.timeout);
        let waiter = self.waiters.register(&ctx.keys.channel);
        loop {
            let notified = waiter.notified();
            tokio::pin!(notified);
            // Registered before the attempt: a release during it is not missed.
            notified.as_mut().enable();
            // A split vote or a refusal retries after a random pause that
            // notifications do not cut short: contenders that woke together
            // must not retry together, or they split the votes forever.
            let (pause, interruptible, last) = match self.attempt_detached(&ctx).await? {
                Attempt::Acquired(lease) => return Ok(lease),
                Attempt::Held(pttl) => (self.pause(pttl), true, busy(pttl)),
                Attempt::Split(elapsed) => (split_pause(elapsed), false, busy(None)),
                Attempt::Refused(elapsed) => {
                    (split_pause(Duration::ZERO), false, Error::Timeout(elapsed))
                }
            };
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) {
                return Err(last);
            }
            let wake = instant_after(now, pause);
            let wake = until.map_or(wake, |u| wake.min(u));
            if interruptible {
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(wake.into()) => {}
                }
            } else {
                tokio::time::sleep_until(wake.into()).await;
            }
        }
    }

    /// See [`Locker::fill_once`](super::Locker::fill_once).
    pub(crate) async fn fill_once<T, E, R, RF, C, CF, S, SF>(
        self: &Arc<Self>,
        subject: Subject,
        options: &LockOptions,
        read: R,
        compute: C,
        store: S,
    ) -> Result<T, E>
    where
        T: Clone,
        E: From<Error>,
        R: Fn() -> RF,
        RF: Future<Output = Result<Option<T>, E>>,
        C: FnOnce() -> CF,
        CF: Future<Output = Result<T, E>>,
        S: FnOnce(T) -> SF,
        SF: Future<Output = Result<(), E>>,
    {
        if let Some(v) = read().await? {
            return Ok(v);
        }
        let mut options = options.clone();
        if options.wait_bound().is_none() {
            let ttl = options.ttl_duration();
            options = options.wait(ttl);
        }
        let lease = match self.acquire(subject, &options, true).await {
            Ok(lease) => lease,
            Err(busy @ Error::Busy { .. }) => {
                // The holder may have filled it just now.
                return match read().await? {
                    Some(v) => Ok(v),
                    None => Err(busy.into()),
                };
            }
            Err(e) => return Err(e.into()),
        };
        // Double check: whoever held the lock before us may have filled it.
        if let Some(v) = read().await? {
            release_quietly(lease).await;
            return Ok(v);
        }
        let value = compute().await?;
        store(value.clone()).await?;
        release_quietly(lease).await;
        Ok(value)
    }
}

async fn release_quietly(lease: Lease) {
    if let Err(e) = lease.release().await {
        tracing::debug!(error = %e, "release after a cache fill failed; the lock expires by its TTL");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;

    fn core(redlock: bool, n: usize) -> Core {
        let backends = (0..n)
            .map(|_| Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>)
            .collect();
        Core::new(backends, redlock, Settings::default()).unwrap()
    }

    #[test]
    fn validity_saturates_on_short_ttls() {
        let c = core(false, 1);
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
    fn durations_are_bounded() {
        let c = core(false, 1);
        assert!(c.check_ttl(MAX_LOCK_DURATION).is_ok());
        for ttl in [MAX_LOCK_DURATION + Duration::from_millis(1), Duration::MAX] {
            assert!(matches!(c.check_ttl(ttl), Err(Error::InvalidConfig(_))));
            assert!(c.first_ttl(&LockOptions::new().ttl(ttl)).is_err());
            assert!(c
                .first_ttl(&LockOptions::new().max_hold(ttl).ttl(Duration::from_secs(1)))
                .is_err());
        }
        assert!(c
            .first_ttl(&LockOptions::new().max_hold(Duration::ZERO))
            .is_err());
        let now = Instant::now();
        assert_eq!(
            instant_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        // Never a panic, and never earlier than a year on.
        assert!(instant_after(now, Duration::MAX) >= now + MAX_LOCK_DURATION);
    }

    #[test]
    fn fence_keys_live_an_hour_and_at_least_ten_ttls() {
        let c = core(false, 1);
        assert_eq!(DEFAULT_FENCE_TTL, Duration::from_secs(3600));
        assert_eq!(c.fence_ttl_for(Duration::from_secs(30)), DEFAULT_FENCE_TTL);
        assert_eq!(
            c.fence_ttl_for(Duration::from_secs(600)),
            Duration::from_secs(6000)
        );
        assert_eq!(
            c.fence_ttl_for(MAX_LOCK_DURATION),
            MAX_LOCK_DURATION * FENCE_TTL_TTLS
        );
        assert_eq!(c.fence_ttl_for(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn quorum_is_a_majority() {
        for (n, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)] {
            assert_eq!(core(true, n).quorum(), q, "{n}");
        }
    }

    #[test]
    fn settings_are_checked() {
        let one = || vec![Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>];
        let bad = [
            Settings {
                drift_ratio: f64::NAN,
                ..Settings::default()
            },
            Settings {
                timeout: Duration::ZERO,
                ..Settings::default()
            },
            Settings {
                fence_ttl: Duration::from_millis(10),
                ..Settings::default()
            },
            Settings {
                fence_ttl: Duration::MAX,
                ..Settings::default()
            },
            Settings {
                defaults: LockOptions::new().ttl(Duration::MAX),
                ..Settings::default()
            },
            Settings {
                defaults: LockOptions::new().ttl(Duration::from_millis(1)),
                ..Settings::default()
            },
            Settings {
                prefix: "a b".into(),
                ..Settings::default()
            },
        ];
        for s in bad {
            assert!(Core::new(one(), false, s.clone()).is_err(), "{s:?}");
        }
        assert!(Core::new(Vec::new(), true, Settings::default()).is_err());
    }

    #[test]
    fn pauses_are_bounded() {
        for _ in 0..100 {
            let p = split_pause(Duration::from_millis(10));
            assert!(p >= Duration::from_millis(1) && p <= Duration::from_millis(41));
        }
        let c = core(false, 1);
        for _ in 0..100 {
            // No subscription yet: short polls, bounded by the holder's PTTL.
            let p = c.pause(None);
            assert!(p <= POLL_WITHOUT_PUBSUB && p >= POLL_WITHOUT_PUBSUB / 2);
            let p = c.pause(Some(Duration::from_millis(3)));
            assert!(p <= Duration::from_millis(6), "{p:?}");
        }
    }

    #[test]
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
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
