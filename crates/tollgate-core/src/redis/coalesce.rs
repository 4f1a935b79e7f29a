//! Coalescing: rate-limit checks that wait on one connection go
//! out together.
//!
//! No timers: a check goes out at once while fewer than
//! [`Coalescing::max_calls_in_flight`] turns are taken (by default: when
//! its lane has no call out, so a lone check costs what it did), and
//! otherwise waits in a queue. When a turn's call comes back, the queue goes
//! out as the turn's next calls — up to [`Coalescing::max_batch`] checks, in
//! arrival order: each limiter's checks (GCRA, token bucket, fixed window;
//! one quota, no wait) as one call of its lean script from two up, any
//! others as one call of the batch script from `MIN_SCRIPT_BATCH` up, else
//! as single calls; all sent together. Batches therefore grow with the load
//! and stay empty without it.
//!
//! On a cluster each hash tag has its own turns and queue (a lane): a
//! script's keys must share a slot, and a slow or frozen node then holds up
//! only its own subjects. Elsewhere one lane serves every check; if the
//! server refuses a call of several tags (`CROSSSLOT`: a sharded proxy, a
//! cluster connection in a wrapper), the call is decided again one call per
//! tag, and so is every batch after it.
//!
//! A batch is sent by a task of its own, so a caller that gives up (its
//! timeout, a dropped future) takes nothing down with it; the task stops
//! waiting for Redis once every check in the batch has given up, so a hung
//! connection holds no turn for ever. A check that goes out alone is sent
//! by its caller's future, which gives the turn back when it is polled
//! after the reply (see [`Coalescing`]).

use std::collections::{HashMap, VecDeque};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;

use futures_util::future::{join_all, poll_fn, select, BoxFuture, Either};
use futures_util::FutureExt;
use tokio::sync::oneshot;

use super::lean::LeanGroup;
use super::unclaimed::{finish_detached, spawn_at_home, Awaited, OwnedCall, QueuedReply};
use crate::error::{redis_error, Result};
use crate::keyspace::hash_tag;
use crate::store::{RateReply, RateRequest, Unclaimed};

/// What a coalescer sends checks with: one check alone, or many in one
/// call of the batch script. The connection implements it; a test can
/// bring its own.
pub(crate) trait Sender: Clone + Send + Sync + 'static {
    /// One check, one call of its algorithm's script.
    fn one<'a>(&'a self, request: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>>;

    /// Many checks in one call, in order, each with its own answer; the
    /// outer error is the call's own, shared by all. `group`: the lean
    /// batch every one of them joins ([`lean_group`](Self::lean_group)),
    /// or `None`.
    fn batch<'a>(
        &'a self,
        requests: &'a [RateRequest],
        group: Option<LeanGroup>,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Result<RateReply>>>>;

    /// The lean batch a check can join (checks of one group go in one lean
    /// call), or `None`: the batch script or a single call.
    fn lean_group(&self, request: &RateRequest) -> Option<LeanGroup> {
        let _ = request;
        None
    }
}

/// How a [`RedisBackend`](crate::RedisBackend) coalesces rate-limit checks: on by default
/// ([`Coalescing::default`]); [`Coalescing::off`] sends each check alone.
///
/// A check that finds its lane idle goes out at once from its own future
/// (no task, no extra hop), and holds the lane's turn until that future is
/// polled after the reply. Poll check futures to their end (`.await`,
/// `join`, `select`): one left unpolled while its reply waits (one of many
/// in a `buffer_unordered` whose consumer is busy) holds back the checks
/// queued behind it until it is polled or dropped, or their own timeouts
/// answer them by the failure policy.
///
/// ```
/// use tollgate::Coalescing;
///
/// let c = Coalescing::default().max_batch(32).max_calls_in_flight(4);
/// assert_eq!((c.batch_limit(), c.calls_limit()), (32, 4));
/// assert_eq!(Coalescing::off().batch_limit(), 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    max_batch: usize,
    max_calls: usize,
}

impl Default for Coalescing {
    /// Batches of up to 64 checks, 1 turn per backend (per hash tag on a
    /// cluster): a check that finds no call out goes alone at once, and
    /// checks that find one go together in the next call. A lean call of two
    /// checks already costs Redis less than two single calls
    /// (BENCHMARKS.md, item 7 and item 2c).
    fn default() -> Self {
        Coalescing {
            max_batch: 64,
            max_calls: DEFAULT_CALLS,
        }
    }
}

impl Coalescing {
    /// One script call per check, as many in flight as there are checks.
    pub fn off() -> Self {
        Coalescing::default().max_batch(1)
    }

    /// At most `n` checks per batch (at least 1; 1 turns coalescing off).
    /// Larger batches cost Redis less per decision but hold its single
    /// thread longer per call. A limiter's checks go as one call of its lean
    /// script from two up; checks with no lean script (several quotas, the
    /// sliding windows, a wait for a slot) go as one call of the batch
    /// script from 8 up (below that it costs Redis more than it saves),
    /// unless `n` itself is smaller, else as single calls, together.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// At most `n` turns at once (at least 1): a check that finds `n` turns
    /// taken waits for the next batch. A turn has one batch's calls out.
    /// Fewer turns make larger batches (less Redis CPU per decision); more
    /// overlap the round trips.
    pub fn max_calls_in_flight(mut self, n: usize) -> Self {
        self.max_calls = n.max(1);
        self
    }

    /// The largest batch (1: coalescing is off).
    pub fn batch_limit(&self) -> usize {
        self.max_batch
    }

    /// The most turns at once.
    pub fn calls_limit(&self) -> usize {
        self.max_calls
    }

    /// The fewest checks sent as one call of the batch script.
    fn script_threshold(&self) -> usize {
        MIN_SCRIPT_BATCH.min(self.max_batch)
    }
}

/// The fewest checks worth a call of the batch script: fewer go as single
/// calls, sent together. The batch script's own work (reading its
/// arguments, a table per check, an MGET, a nested reply) costs Redis more
/// than pipelined single calls save until a batch carries about this many
/// (BENCHMARKS.md, item 2c).
const MIN_SCRIPT_BATCH: usize = 8;

/// Turns per lane by default.
const DEFAULT_CALLS: usize = 1;

/// The fewest checks of one limiter sent as one call of its lean script:
/// a lean call of two costs Redis less than two single calls
/// (BENCHMARKS.md, lean batches).
const LEAN_BATCH: usize = 2;

/// A check waiting for a batch.
struct Waiting {
    request: RateRequest,
    reply: oneshot::Sender<Result<RateReply>>,
}

/// A turn's checks, in arrival order: the requests (what the call takes)
/// apart from their reply channels, so neither is moved again to be sent.
#[derive(Default)]
struct Batch {
    requests: Vec<RateRequest>,
    replies: Vec<oneshot::Sender<Result<RateReply>>>,
}

/// Turns taken and checks waiting, for one hash tag or for all.
#[derive(Default)]
struct Lane {
    in_flight: usize,
    queue: VecDeque<Waiting>,
    /// Key lists of checks already answered, reused for the copies of
    /// those that queue: a copy then allocates nothing.
    spare_keys: Vec<Vec<String>>,
}

impl Lane {
    /// A copy of `request` to queue, in a spare key list if there is one.
    fn copy(&mut self, request: &RateRequest) -> RateRequest {
        let Some(mut keys) = self.spare_keys.pop() else {
            return request.clone();
        };
        keys.clone_from(&request.keys);
        RateRequest {
            algorithm: request.algorithm,
            keys,
            quotas: request.quotas.clone(),
            cost: request.cost,
            now_micros: request.now_micros,
            store_clock: request.store_clock,
            nonce: request.nonce,
            max_wait_micros: request.max_wait_micros,
            deadline: request.deadline,
            unclaimed: request.unclaimed.clone(),
        }
    }
}

/// One check sent alone with `sender`, owning a copy of its request (so a
/// caller that leaves does not take the reply with it).
pub(crate) fn owned_call<S: Sender>(sender: &S, request: &RateRequest) -> OwnedCall {
    let (sender, request) = (sender.clone(), request.clone());
    async move {
        let reply = sender.one(&request).await;
        (request, reply)
    }
    .boxed()
}

/// Which lane: `None` for the one lane of a non-cluster backend, else the
/// hash tag.
type LaneKey = Option<Box<str>>;

#[derive(Default)]
struct Lanes {
    main: Lane,
    by_tag: HashMap<Box<str>, Lane>,
}

impl Lanes {
    fn get(&mut self, key: &LaneKey) -> &mut Lane {
        match key {
            None => &mut self.main,
            Some(tag) => {
                // Look up first: the tag is copied only for a new lane.
                if !self.by_tag.contains_key(tag) {
                    self.by_tag.insert(tag.clone(), Lane::default());
                }
                self.by_tag.get_mut(tag).expect("present")
            }
        }
    }

    /// Forgets an idle tag's lane (a cluster sees many subjects).
    fn tidy(&mut self, key: &LaneKey) {
        if let Some(tag) = key {
            if self
                .by_tag
                .get(tag)
                .is_some_and(|l| l.in_flight == 0 && l.queue.is_empty())
            {
                self.by_tag.remove(tag);
            }
        }
    }
}

/// One connection's coalescing: its lanes, shared by the backend's clones
/// (they share the connection), and the sender the batches go out with.
pub(crate) struct Coalescer<S> {
    shared: Arc<Shared>,
    sender: S,
}

impl<S: Clone> Clone for Coalescer<S> {
    fn clone(&self) -> Self {
        Coalescer {
            shared: Arc::clone(&self.shared),
            sender: self.sender.clone(),
        }
    }
}

struct Shared {
    config: Coalescing,
    /// One lane per hash tag (a cluster connection).
    per_tag: bool,
    /// A call of several tags was refused (`CROSSSLOT`): batches are split
    /// by tag from now on.
    split: AtomicBool,
    lanes: Mutex<Lanes>,
    /// The runtime the backend was made on, where the connection's own task
    /// runs: the tasks that send batches run there too, so they live as
    /// long as the connection, whichever runtime a check came from.
    home: Option<tokio::runtime::Handle>,
}

impl<S> std::fmt::Debug for Coalescer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("config", &self.shared.config)
            .field("per_tag", &self.shared.per_tag)
            .field("split", &self.shared.split.load(Ordering::Relaxed))
            .finish()
    }
}

/// What a check does: go out now (holding a turn), or wait for its reply.
enum Entry<'a, S: Sender> {
    Now(Turn<'a, S>),
    Queued(oneshot::Receiver<Result<RateReply>>),
}

/// A turn taken by a check that goes out itself. Dropping it passes the
/// turn on: to a task that sends the queue, or back to the lane.
struct Turn<'a, S: Sender> {
    coalescer: &'a Coalescer<S>,
    lane: LaneKey,
}

impl<S: Sender> Drop for Turn<'_, S> {
    fn drop(&mut self) {
        self.coalescer.pass_on(self.lane.take());
    }
}

/// A request's hash tag (a request has one key per quota, all of one tag).
fn tag_of(request: &RateRequest) -> &str {
    request.keys.first().map_or("", |k| hash_tag(k))
}

impl<S: Sender> Coalescer<S> {
    /// The runtime its batches are sent from.
    pub(crate) fn home(&self) -> Option<tokio::runtime::Handle> {
        self.shared.home.clone()
    }

    /// A coalescer sending with `sender`; one lane per hash tag when
    /// `per_tag`. `home`: the runtime the backend was made on, if known
    /// (else the current one, if any).
    pub(crate) fn new(
        sender: S,
        config: Coalescing,
        per_tag: bool,
        home: Option<tokio::runtime::Handle>,
    ) -> Self {
        Coalescer {
            shared: Arc::new(Shared {
                config,
                per_tag,
                split: AtomicBool::new(false),
                lanes: Mutex::new(Lanes::default()),
                home: home.or_else(|| tokio::runtime::Handle::try_current().ok()),
            }),
            sender,
        }
    }

    /// Decides one check: at once with a free turn, else in the next batch
    /// of its lane.
    pub(crate) async fn check(&self, request: &RateRequest) -> Result<RateReply> {
        match self.enter(request) {
            Entry::Now(turn) => {
                let reply = Awaited::new(owned_call(&self.sender, request), self.home()).await;
                drop(turn);
                reply
            }
            Entry::Queued(reply) => QueuedReply::new(reply, request, self.home())
                .await
                .unwrap_or_else(|_| {
                    Err(redis_error(redis::RedisError::from(std::io::Error::other(
                        "the task sending this check's batch stopped (its runtime shut down)",
                    ))))
                }),
        }
    }

    /// How many checks wait for a turn, over every lane.
    pub(crate) fn waiting(&self) -> usize {
        let lanes = self.lock();
        lanes.main.queue.len() + lanes.by_tag.values().map(|l| l.queue.len()).sum::<usize>()
    }

    fn lock(&self) -> MutexGuard<'_, Lanes> {
        // Nothing panics while the lock is held; a poisoned lock still
        // holds consistent lanes.
        self.shared
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters a check: a turn when its lane has one free, else a place in
    /// the lane's queue.
    fn enter(&self, request: &RateRequest) -> Entry<'_, S> {
        let key: LaneKey = self.shared.per_tag.then(|| tag_of(request).into());
        let mut lanes = self.lock();
        let lane = lanes.get(&key);
        if lane.in_flight < self.shared.config.max_calls {
            lane.in_flight += 1;
            if lane.queue.is_empty() {
                return Entry::Now(Turn {
                    coalescer: self,
                    lane: key,
                });
            }
            // Checks wait with a turn free: a turn was given back where no
            // task could be started for them. This check's turn sends them,
            // and it, in order.
            let (reply, rx) = oneshot::channel();
            let request = lane.copy(request);
            lane.queue.push_back(Waiting { request, reply });
            drop(lanes);
            self.pass_on(key);
            return Entry::Queued(rx);
        }
        let (reply, rx) = oneshot::channel();
        let request = lane.copy(request);
        lane.queue.push_back(Waiting { request, reply });
        Entry::Queued(rx)
    }

    /// The next batch for a turn whose call ended, keeping the turn; or
    /// `None`, giving the turn back, when nothing waits. `answered`: the
    /// checks the call decided, whose key lists are kept for reuse.
    fn next_batch(&self, key: &LaneKey, answered: Vec<RateRequest>) -> Option<Batch> {
        let mut lanes = self.lock();
        let lane = lanes.get(key);
        let room = self
            .shared
            .config
            .max_batch
            .saturating_sub(lane.spare_keys.len());
        lane.spare_keys
            .extend(answered.into_iter().take(room).map(|r| r.keys));
        if lane.queue.is_empty() {
            lane.in_flight -= 1;
            lanes.tidy(key);
            return None;
        }
        let take = lane.queue.len().min(self.shared.config.max_batch);
        let mut batch = Batch {
            requests: Vec::with_capacity(take),
            replies: Vec::with_capacity(take),
        };
        for w in lane.queue.drain(..take) {
            batch.requests.push(w.request);
            batch.replies.push(w.reply);
        }
        Some(batch)
    }

    /// Gives a turn back, with the checks it had taken first in the queue
    /// again (no task could be started to send them); the next check to
    /// take a turn sends them.
    fn give_back(&self, key: &LaneKey, batch: Batch) {
        let mut lanes = self.lock();
        let lane = lanes.get(key);
        lane.in_flight -= 1;
        let checks = batch.requests.into_iter().zip(batch.replies);
        for (request, reply) in checks.rev() {
            lane.queue.push_front(Waiting { request, reply });
        }
        lanes.tidy(key);
    }

    /// Passes a turn that ended on: the queue goes out from a task of its
    /// own (on the backend's runtime, else the current one), or, without a
    /// runtime to start one on, the turn goes back to the lane.
    fn pass_on(&self, lane: LaneKey) {
        let Some(batch) = self.next_batch(&lane, Vec::new()) else {
            return;
        };
        let runtime = self
            .shared
            .home
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        let Some(runtime) = runtime else {
            self.give_back(&lane, batch);
            return;
        };
        // The turn moves into the task; if the task is dropped before it runs
        // (a runtime shutting down), dropping the turn gives it back.
        let turn = Driving {
            coalescer: self.clone(),
            lane,
            done: false,
        };
        runtime.spawn(drive(turn, batch));
    }
}

/// A turn owned by the task that sends the queue. Dropped before its work
/// is done (its runtime shut down), it gives the turn back.
struct Driving<S: Sender> {
    coalescer: Coalescer<S>,
    lane: LaneKey,
    done: bool,
}

impl<S: Sender> Drop for Driving<S> {
    fn drop(&mut self) {
        if !self.done {
            // The batch being sent is lost with the task: its checks are
            // answered as an outage (their replies are dropped).
            self.coalescer.give_back(&self.lane, Batch::default());
        }
    }
}

/// Sends batches while checks wait, then gives the turn back.
async fn drive<S: Sender>(mut turn: Driving<S>, mut batch: Batch) {
    loop {
        let answered = send(&turn.coalescer, batch).await;
        // The callers this batch answered often check again at once: they
        // run first, and queue for the next batch, rather than one of them
        // going alone and the rest after it.
        tokio::task::yield_now().await;
        match turn.coalescer.next_batch(&turn.lane, answered) {
            Some(next) => batch = next,
            None => break,
        }
    }
    turn.done = true;
}

/// One call for `batch` (or its single calls); each check gets its own
/// answer. The call is abandoned once every check in it has given up.
/// Returns the checks answered (their key lists are reused).
async fn send<S: Sender>(coalescer: &Coalescer<S>, batch: Batch) -> Vec<RateRequest> {
    let Batch {
        mut requests,
        mut replies,
    } = batch;
    // A check whose caller gave up while it waited (its timeout, a dropped
    // future) was answered without it: it is never sent, so takes nothing.
    // Both lists are compacted together in place, keeping arrival order.
    let mut kept = 0;
    for i in 0..replies.len() {
        if !replies[i].is_closed() {
            requests.swap(kept, i);
            replies.swap(kept, i);
            kept += 1;
        }
    }
    requests.truncate(kept);
    replies.truncate(kept);
    if requests.is_empty() {
        return requests;
    }
    // The call owns its checks: if every caller gives up before it ends, it
    // is finished elsewhere, and what it admitted is given back.
    let mut call = {
        let coalescer = coalescer.clone();
        async move {
            let answers = decide(&coalescer, &requests).await;
            (requests, answers)
        }
        .boxed()
    };
    let (requests, answers) = {
        // Ready once every caller has given up; polled in place (no future
        // per check).
        let gone = pin!(poll_fn(|cx| {
            let mut open = 0;
            for r in replies.iter_mut() {
                open += usize::from(r.poll_closed(cx).is_pending());
            }
            if open == 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        match select(&mut call, gone).await {
            Either::Left((done, _)) => done,
            Either::Right(_) => {
                finish_detached(call, coalescer.home());
                return Vec::new();
            }
        }
    };
    let mut unclaimed = Vec::new();
    for ((reply, answer), request) in replies.into_iter().zip(answers).zip(&requests) {
        // A caller that gave up meanwhile was answered without it.
        if let Err(Ok(answer)) = reply.send(answer) {
            unclaimed.extend(Unclaimed::give_back(request, &answer));
        }
    }
    if !unclaimed.is_empty() {
        // On their own: the turn goes on meanwhile.
        spawn_at_home(coalescer.home(), async move {
            join_all(unclaimed).await;
        });
    }
    requests
}

#[path = "coalesce_calls.rs"]
mod calls;
use calls::decide;
#[cfg(test)]
use calls::one_tag;

#[cfg(test)]
#[path = "coalesce_tests.rs"]
mod tests;
