//! Coalescing (issue #15): rate-limit checks that wait on one connection go
//! out together, as one call of the batch script.
//!
//! No timers: a check goes out at once while fewer than
//! [`Coalescing::max_calls_in_flight`] calls are out (so a lone check costs
//! what it did), and otherwise waits in a queue. When a call comes back, the
//! queue goes out as the next call — up to [`Coalescing::max_batch`] checks,
//! in arrival order (on a cluster, one call per hash tag among them, sent
//! together); fewer than `MIN_SCRIPT_BATCH` go as single calls sent
//! together. Batches therefore grow with the load and stay empty without it.
//!
//! A batch is sent by a task of its own, so a caller that gives up (its
//! timeout, a dropped future) takes nothing down with it; the task stops
//! waiting for Redis once every check in the batch has given up, so a hung
//! connection holds no turn for ever.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures_util::future::{join_all, select, Either};
use tokio::sync::oneshot;

use super::{RateReply, RateRequest, RedisBackend};
use crate::error::{redis_error, Result};

/// How a [`RedisBackend`] coalesces rate-limit checks: on by default
/// ([`Coalescing::default`]); [`Coalescing::off`] sends each check alone.
///
/// ```
/// use tollgate_core::Coalescing;
///
/// let c = Coalescing::default().max_batch(32).max_calls_in_flight(1);
/// assert_eq!((c.batch_limit(), c.calls_limit()), (32, 1));
/// assert_eq!(Coalescing::off().batch_limit(), 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    max_batch: usize,
    max_calls: usize,
}

impl Default for Coalescing {
    /// Batches of up to 64 checks, at most 16 calls in flight per backend:
    /// up to 16 checks in flight cost what they did (measured: 16 single
    /// calls pipelined on one connection cost Redis less per check than
    /// batches of a few), and beyond that checks share calls.
    fn default() -> Self {
        Coalescing {
            max_batch: 64,
            max_calls: 16,
        }
    }
}

impl Coalescing {
    /// One script call per check, as many in flight as there are checks.
    pub fn off() -> Self {
        Coalescing {
            max_batch: 1,
            max_calls: usize::MAX,
        }
    }

    /// At most `n` checks per call (at least 1; 1 turns coalescing off).
    /// Larger batches cost Redis less per decision but hold its single
    /// thread longer per call.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        if self.max_batch == 1 {
            self.max_calls = usize::MAX;
        }
        self
    }

    /// At most `n` calls in flight at once (at least 1): a check arriving
    /// while `n` calls are out waits for the next batch. Fewer calls make
    /// larger batches (less Redis CPU per decision); more calls overlap the
    /// round trips (less waiting when Redis has CPU to spare).
    pub fn max_calls_in_flight(mut self, n: usize) -> Self {
        if self.max_batch > 1 {
            self.max_calls = n.max(1);
        }
        self
    }

    /// The largest batch.
    pub fn batch_limit(&self) -> usize {
        self.max_batch
    }

    /// The most calls in flight.
    pub fn calls_limit(&self) -> usize {
        self.max_calls
    }
}

/// The fewest checks worth a call of the batch script: fewer go as single
/// calls, sent together. The batch script's own work (reading its
/// arguments, a table per check, an MGET, a nested reply) costs Redis more
/// than pipelined single calls save until a batch carries about this many
/// (BENCHMARKS.md, item 2c).
const MIN_SCRIPT_BATCH: usize = 8;

/// A check waiting for a batch.
struct Waiting {
    request: RateRequest,
    reply: oneshot::Sender<Result<RateReply>>,
}

#[derive(Default)]
struct State {
    in_flight: usize,
    queue: VecDeque<Waiting>,
}

/// One backend's queue of checks and count of calls in flight (shared by
/// its clones: they share the connection).
pub(crate) struct Coalescer {
    config: Coalescing,
    /// Whether a batch is split by hash tag (a cluster: a script's keys must
    /// share a slot).
    by_tag: bool,
    state: Mutex<State>,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("config", &self.config)
            .field("by_tag", &self.by_tag)
            .finish()
    }
}

/// What a check does: go out now (holding a turn), or wait for its reply.
pub(crate) enum Entry<'a> {
    Now(Turn<'a>),
    Queued(oneshot::Receiver<Result<RateReply>>),
}

/// The right to one call in flight. Dropping it passes it on: to a task
/// that sends the queue, or back to the count.
pub(crate) struct Turn<'a> {
    backend: &'a RedisBackend,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        pass_on(self.backend);
    }
}

/// The hash tag of a key (between the first `{` and the next `}`), or the
/// whole key, as Redis Cluster hashes it.
fn tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

impl Coalescer {
    pub(crate) fn new(config: Coalescing, by_tag: bool) -> Self {
        Coalescer {
            config,
            by_tag,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; a poisoned lock still
        // holds a consistent queue.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enters a check: a turn when fewer than the limit are in flight, else
    /// a place in the queue.
    pub(crate) fn enter<'a>(&self, backend: &'a RedisBackend, request: &RateRequest) -> Entry<'a> {
        let mut state = self.lock();
        if state.in_flight < self.config.max_calls {
            state.in_flight += 1;
            return Entry::Now(Turn { backend });
        }
        let (reply, rx) = oneshot::channel();
        state.queue.push_back(Waiting {
            request: request.clone(),
            reply,
        });
        Entry::Queued(rx)
    }

    /// The next batch for a call that ended, keeping its turn; or `None`,
    /// giving the turn back, when nothing waits.
    fn next_batch(&self) -> Option<Vec<Waiting>> {
        let mut state = self.lock();
        if state.queue.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        let take = state.queue.len().min(self.config.max_batch);
        Some(state.queue.drain(..take).collect())
    }

    /// Gives a turn back and fails whatever waits (the runtime that would
    /// have sent it is gone).
    fn abandon(&self) {
        let mut state = self.lock();
        state.in_flight -= 1;
        // Dropping the senders answers each waiter with an outage.
        state.queue.clear();
    }
}

/// Passes a turn that ended on: the queue goes out from a task of its own.
fn pass_on(backend: &RedisBackend) {
    let Some(coalescer) = backend.coalescer() else {
        return;
    };
    let Some(batch) = coalescer.next_batch() else {
        return;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(drive(backend.clone(), batch));
        }
        Err(_) => {
            drop(batch);
            coalescer.abandon();
        }
    }
}

/// Gives the turn back if a driving task is dropped mid-batch (its runtime
/// shut down).
struct Driving<'a>(&'a RedisBackend, bool);

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        if !self.1 {
            if let Some(c) = self.0.coalescer() {
                c.abandon();
            }
        }
    }
}

/// Sends batches while checks wait, then gives the turn back.
async fn drive(backend: RedisBackend, mut batch: Vec<Waiting>) {
    let mut guard = Driving(&backend, false);
    loop {
        send(&backend, batch).await;
        match backend.coalescer().and_then(Coalescer::next_batch) {
            Some(next) => batch = next,
            None => break,
        }
    }
    guard.1 = true;
}

/// Sends `batch`: on a cluster one group per hash tag (a script's keys must
/// share a slot), elsewhere one group; the groups go out together.
async fn send(backend: &RedisBackend, batch: Vec<Waiting>) {
    let by_tag = backend.coalescer().is_some_and(|c| c.by_tag);
    if !by_tag {
        return send_group(backend, batch).await;
    }
    // Groups in order of first arrival, each in arrival order.
    let mut groups: Vec<(String, Vec<Waiting>)> = Vec::new();
    for w in batch {
        let t = tag(&w.request.keys[0]);
        match groups.iter_mut().find(|(g, _)| g == t) {
            Some((_, group)) => group.push(w),
            None => groups.push((t.to_owned(), vec![w])),
        }
    }
    join_all(groups.into_iter().map(|(_, g)| send_group(backend, g))).await;
}

/// One call of the batch script for `group` (of one hash tag on a cluster),
/// or single calls sent together for a small one; each check gets its own
/// answer. The calls are abandoned once every check in them has given up.
async fn send_group(backend: &RedisBackend, group: Vec<Waiting>) {
    let (requests, mut replies): (Vec<_>, Vec<_>) =
        group.into_iter().map(|w| (w.request, w.reply)).unzip();
    let answers = {
        let call = pin!(async {
            if requests.len() < MIN_SCRIPT_BATCH {
                // Few checks: single calls, sent together (pipelined by the
                // connection); the batch script costs Redis more per check
                // than that until it carries enough checks.
                join_all(requests.iter().map(|r| backend.check_one(r))).await
            } else {
                match backend.check_batch(&requests).await {
                    Ok(answers) => answers,
                    Err(e) => requests
                        .iter()
                        .map(|_| Err(redis_error(e.clone())))
                        .collect(),
                }
            }
        });
        let gone = pin!(join_all(replies.iter_mut().map(|r| r.closed())));
        match select(call, gone).await {
            Either::Left((answers, _)) => answers,
            Either::Right(_) => return,
        }
    };
    for (reply, answer) in replies.into_iter().zip(answers) {
        // A waiter that gave up meanwhile no longer wants it.
        let _ = reply.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_is_what_redis_cluster_hashes() {
        assert_eq!(tag("tg:api:gcra:{alice}"), "alice");
        assert_eq!(tag("tg:api:gcra:{alice}:x{y}"), "alice");
        assert_eq!(tag("a{}b"), "a{}b");
        assert_eq!(tag("plain"), "plain");
        assert_eq!(tag("{open"), "{open");
    }

    #[test]
    fn limits_stay_sane() {
        let c = Coalescing::default().max_batch(0);
        assert_eq!((c.batch_limit(), c.calls_limit()), (1, usize::MAX));
        let c = Coalescing::off().max_calls_in_flight(3);
        assert_eq!(c.calls_limit(), usize::MAX);
        let c = Coalescing::default().max_calls_in_flight(0);
        assert_eq!(c.calls_limit(), 1);
    }
}
