//! [`AdminBackend`]: what the operator plane asks of a store — the
//! registry, one subject's keys, blocks, the admin channel, the throttled
//! lists and the holders' descriptions.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::error::Result;

/// Called with every message of the admin channel a store watches; returns
/// whether it still wants them (a listener whose limiter is gone is
/// dropped). Called with [`ALIVE`], it only says so: a store asks before
/// it adds a listener, so that limiters built and dropped by the thousand
/// leave none behind.
pub type AdminListener = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The message that only asks an [`AdminListener`] whether it is alive.
pub const ALIVE: &str = "";

/// One admin channel's listeners, as a store keeps them.
#[derive(Default)]
pub(crate) struct Listeners {
    list: Vec<AdminListener>,
    /// How many were alive when they were last asked.
    alive: usize,
}

impl Listeners {
    /// Adds `listener`, first dropping those gone once the list has
    /// doubled since they were last asked: an add costs a constant on
    /// average, however many limiters live (asking all on every add would
    /// cost their number each).
    pub(crate) fn add(&mut self, listener: AdminListener) {
        if self.list.len() >= 2 * self.alive.max(8) {
            self.list.retain(|l| l(ALIVE));
            self.alive = self.list.len();
        }
        self.list.push(listener);
    }

    /// A copy of the list, to tell them outside the store's lock.
    pub(crate) fn snapshot(&self) -> Vec<AdminListener> {
        self.list.clone()
    }

    /// Drops the listeners in `gone` (those that said so when told).
    pub(crate) fn drop_gone(&mut self, gone: &[AdminListener]) {
        self.list
            .retain(|l| !gone.iter().any(|g| Arc::ptr_eq(g, l)));
    }

    /// How many are kept (the gone ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}

/// The longest an instance that missed an admin message keeps serving
/// what it cached: a store's watcher polls the version stamp this often.
pub const VERSION_POLL: Duration = Duration::from_millis(500);

/// The least each call of an operator's action waits for the store (a
/// reset, a block, a registry read, one page of a walk over the keys),
/// whatever the timeout of the limiter it acts on: an operator's request,
/// not a request path's.
pub(crate) const ACTION_TIMEOUT: Duration = Duration::from_secs(5);

/// What a watcher hears when it may have missed messages: forget
/// everything cached.
pub const EVERYTHING: &str = "*";

/// Denials of one subject, counted by one instance since its last flush.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenialCount {
    /// The subject's id.
    pub subject: String,
    /// Denials counted.
    pub denied: u64,
    /// The last one (ms since the epoch).
    pub last_denied_ms: u64,
    /// The application's label for the subject, if any.
    pub label: Option<String>,
}

/// The operator plane's operations on a store. Every key named here is
/// built by the caller (the keyspace's rules); the store only reads and
/// writes it.
pub trait AdminBackend: Send + Sync + 'static {
    /// Whether every operation completes at once (a store in this
    /// process), so that it may be done in place of a task.
    fn in_process(&self) -> bool {
        false
    }

    /// Whether a block may exist now: `false` lets a check leave its block
    /// key out (an in-process store that knows it holds none). The default
    /// is `true`: the check script reads it.
    fn may_block(&self) -> bool {
        true
    }

    /// Writes `value` under `field` of the registry `key` (a hash), which
    /// then lives `ttl` (writers refresh it well before).
    fn register<'a>(
        &'a self,
        key: &'a str,
        field: &'a str,
        value: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>>;

    /// Every `(field, value)` of the registry `key`.
    fn registered<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Vec<(String, String)>>>;

    /// One owner of `field` in the registry `key` is gone. An in-process
    /// store (which is never refreshed) counts the owners that wrote a
    /// field and takes it out with the last. The default keeps it: a shared
    /// store's entries age out unless refreshed, and other processes may
    /// write the same field.
    fn unregister<'a>(&'a self, key: &'a str, field: &'a str) -> BoxFuture<'a, Result<()>> {
        let _ = (key, field);
        Box::pin(futures_util::future::ready(Ok(())))
    }

    /// Resets a subject: deletes its quota `keys` (one hash tag) and
    /// stamps the reset on `stamp` (beside them) at `now_micros`, or the
    /// store's time when `None`, for at least `ttl`: a settle of a charge
    /// taken at or before the stamp changes nothing. A stamp never moves
    /// back, nor its TTL.
    fn reset<'a>(
        &'a self,
        keys: &'a [String],
        stamp: &'a str,
        now_micros: Option<u64>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>>;

    /// Sets the block `key` for `ttl`: replacing an earlier one, or, with
    /// `at_least`, only where it would end later than the one in place.
    /// Returns how long the block in force lasts.
    fn set_block<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        at_least: bool,
    ) -> BoxFuture<'a, Result<Duration>>;

    /// Lifts the block `key`.
    fn unblock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<()>>;

    /// What is left of the block `key` (`None`: not blocked).
    fn block_left<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Duration>>>;

    /// Publishes `message` on `channel` for every instance, and bumps the
    /// version stamp `version_key` that instances poll in case a message is
    /// lost (the stamp expires an hour after its last change).
    fn announce<'a>(
        &'a self,
        channel: &'a str,
        version_key: &'a str,
        message: &'a str,
    ) -> BoxFuture<'a, Result<()>>;

    /// The version stamp under `key` (0 when absent).
    fn version<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<u64>>;

    /// Calls `listener` with each message published on `channel` from now
    /// on, for as long as the store lives (reconnecting as needed); and
    /// with [`EVERYTHING`] when the version stamp `version_key` moved
    /// without a message (one was lost). One subscription per channel,
    /// however many listeners; the listeners that say they are gone when
    /// asked with [`ALIVE`] are dropped first.
    fn watch(&self, channel: &str, version_key: &str, listener: AdminListener);

    /// Adds `counts` to the throttled list under `key` (kept `ttl` after
    /// the last addition, at most `keep` subjects: the most denied).
    fn add_denials<'a>(
        &'a self,
        key: &'a str,
        counts: &'a [DenialCount],
        ttl: Duration,
        keep: usize,
    ) -> BoxFuture<'a, Result<()>>;

    /// Adds one instance's counts of `second` (since the epoch) to the
    /// traffic counts under `key` (kept `ttl` after the last addition).
    fn add_traffic<'a>(
        &'a self,
        key: &'a str,
        second: u64,
        admitted: u64,
        refused: u64,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<()>>;

    /// The traffic counts under `key` for each second from `from` to `to`
    /// (inclusive) that has any: `(second, admitted, refused)`.
    fn traffic<'a>(
        &'a self,
        key: &'a str,
        from: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<Vec<(u64, u64, u64)>>>;

    /// The `n` most denied subjects of the throttled list under `key`.
    fn top_denials<'a>(&'a self, key: &'a str, n: usize)
        -> BoxFuture<'a, Result<Vec<DenialCount>>>;
}
