//! A take ([`Taking`]): the lease call of one hot subject's check, which
//! installs what it got beyond the check's cost as the subject's slice,
//! and the timer that gives a slice back once it has aged out.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::book::{give_back, give_back_later, Book, Leases, Slice, WINDOW_MICROS};
use super::revoke::{lock, Epoch};
use crate::error::Result;
use crate::keyspace::Subject;
use crate::rate::charge::{key_digest, next_id, Charge};
use crate::rate::{Decision, DecisionSource};
use crate::store::{Algorithm, LeaseReply, LeaseSize, RateBackend, RateReply, RateRequest};

impl Leases {
    /// Starts a take for a hot `subject` that needs `cost` now, or `None`
    /// when a slice would not be worth it (its rate is too low for more
    /// than the cost) or one is already on its way.
    pub(in crate::rate) fn begin(&self, subject: &Subject, cost: u64, now: u64) -> Option<Taking> {
        let book = &self.book;
        let mut map = lock(&book.subjects);
        let t = map.get_mut(subject.as_encoded())?;
        if t.taking || t.slice.is_some() {
            return None;
        }
        let target = u64::try_from(book.settings.target.as_micros()).unwrap_or(u64::MAX);
        let rate = u128::from(t.seen()) * u128::from(target) / u128::from(WINDOW_MICROS);
        let want = u64::try_from(rate).unwrap_or(u64::MAX).min(book.most);
        if want <= cost || want < 2 {
            return None;
        }
        t.taking = true;
        let size = LeaseSize {
            want,
            least: (want / 4).max(cost).max(1),
        };
        Some(Taking::new(book, subject, size, now))
    }
}

/// A take on its way: the lease call of one check. Dropped, it lets the
/// subject lease again.
pub(in crate::rate) struct Taking {
    book: Arc<Book>,
    subject: Subject,
    size: LeaseSize,
    epoch: Epoch,
    started: u64,
    /// The id of the slice it installed (0: none).
    installed: AtomicU64,
}

impl Taking {
    /// A take of `size` for `subject`, started at `now` (local time).
    pub(super) fn new(book: &Arc<Book>, subject: &Subject, size: LeaseSize, now: u64) -> Self {
        Taking {
            book: Arc::clone(book),
            subject: subject.clone(),
            size,
            epoch: book.revocations.epoch(subject),
            started: now,
            installed: AtomicU64::new(0),
        }
    }

    /// The take at once, on a store in process (`None`: it needs I/O).
    pub(in crate::rate) fn call_now(
        &self,
        backend: &dyn RateBackend,
        request: &RateRequest,
    ) -> Option<Result<RateReply>> {
        let done = backend.lease_rate_now(request, self.size)?;
        Some(done.map(|lease| self.install(lease, request, false)))
    }

    /// The take's round trip.
    pub(in crate::rate) fn call<'a>(
        &'a self,
        backend: &'a dyn RateBackend,
        request: &'a RateRequest,
    ) -> BoxFuture<'a, Result<RateReply>> {
        Box::pin(async move {
            let lease = backend.lease_rate(request, self.size).await?;
            Ok(self.install(lease, request, true))
        })
    }

    /// Keeps what the take granted beyond the check's own cost as the
    /// subject's slice, and returns the check's reply as a served check
    /// reports it (the units left in the slice).
    fn install(&self, lease: LeaseReply, request: &RateRequest, timed: bool) -> RateReply {
        let book = &self.book;
        let mut reply = lease.reply;
        // Nothing leased beyond the check: the reply is the check's own, as
        // the store says (no slice to keep or give back).
        if !reply.allowed || lease.granted <= request.cost {
            return reply;
        }
        let left = lease.granted - request.cost;
        let mut age = u64::try_from(book.settings.max_age.as_micros()).unwrap_or(u64::MAX);
        if book.algorithm == Algorithm::FixedWindow {
            // Units counted in one window are never served in the next.
            let end = reply.outcomes.iter().map(|o| o.reset_after_micros).min();
            age = age.min(end.unwrap_or(0));
        }
        let taken = Decision::from_outcomes(
            book.algorithm,
            &book.quotas,
            &reply.outcomes,
            true,
            DecisionSource::Backend,
        );
        let charge = Charge {
            cost: lease.granted,
            at_micros: reply.now_micros,
            taken_micros: reply.now_micros,
            id: request.nonce,
            span_micros: book.algorithm.refund_span(&taken),
            local: false,
            key: key_digest(&request.keys[0]),
            slice: 0,
        };
        let slice = Slice {
            subject: self.subject.clone(),
            id: next_id(),
            left,
            extra: 0,
            settled: HashSet::new(),
            epoch: self.epoch,
            revocations: Arc::clone(&book.revocations),
            taken_at: self.started,
            expires_at: self.started.saturating_add(age),
            outcomes: reply.outcomes.clone(),
            charge,
        };
        let mut map = lock(&book.subjects);
        let current = book.revocations.epoch(&self.subject) == self.epoch;
        match map.get_mut(self.subject.as_encoded()).filter(|_| current) {
            Some(t) => {
                let id = slice.id;
                self.installed.store(id, Ordering::Relaxed);
                t.slice = Some(slice);
                for o in &mut reply.outcomes {
                    o.remaining = left;
                }
                // A round trip ran under the limiter's timeout: the runtime
                // has timers. A take in process may run on one without.
                if timed {
                    end_when_aged(book, &self.subject, id, age);
                }
            }
            // Revoked since the take was sent (or no longer tracked): no
            // slice, the reply stays the store's, and the units beyond the
            // check go back as a revoked slice's do (not after a reset).
            // Under an id of their own: the check's charge keeps the take's.
            None => {
                drop(map);
                let mut slice = slice;
                slice.charge.id = next_id();
                give_back_later(book, &book.returner, slice);
            }
        }
        reply
    }

    /// The check's decision: its charge names the slice it installed (a
    /// settle or refund then corrects the slice); with none installed, the
    /// charge is the check's own on the store.
    pub(in crate::rate) fn charge(lease: &Option<Taking>, decided: &mut Result<Decision>) {
        let installed = lease
            .as_ref()
            .map_or(0, |t| t.installed.load(Ordering::Relaxed));
        if let (true, Ok(d)) = (installed != 0, decided) {
            // An id of its own, as every served charge has: the take's id
            // is the slice's charge on the store, whose marker its
            // give-back settles under.
            if let Some(c) = &mut d.charge {
                c.slice = installed;
                c.id = next_id();
            }
        }
    }
}

impl Drop for Taking {
    fn drop(&mut self) {
        let mut map = lock(&self.book.subjects);
        if let Some(t) = map.get_mut(self.subject.as_encoded()) {
            t.taking = false;
        }
    }
}

/// Gives back slice `id` of `subject` once it has aged out (`age` µs),
/// if it is still held then: an instance whose checks went elsewhere
/// holds no units past a slice's age. A slice that is not yet aged on
/// the decision clock then (a clock of its own) is left to the checks'
/// sweep. Nothing without a runtime: the sweep alone.
fn end_when_aged(book: &Arc<Book>, subject: &Subject, id: u64, age: u64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    // Weak: a timer keeps no limiter alive (its drop gives back the rest).
    let (book, subject) = (Arc::downgrade(book), subject.clone());
    runtime.spawn(async move {
        tokio::time::sleep(std::time::Duration::from_micros(age)).await;
        let Some(book) = book.upgrade() else {
            return;
        };
        let now = book.returner.cache_now();
        let aged = {
            let mut map = lock(&book.subjects);
            let mut aged = map.get_mut(subject.as_encoded()).and_then(|t| {
                t.slice
                    .as_ref()
                    .is_some_and(|s| s.id == id && now >= s.expires_at)
                    .then(|| t.slice.take())
                    .flatten()
            });
            if let Some(s) = &mut aged {
                book.retire(s, now);
            }
            aged
        };
        if let Some(s) = aged {
            if s.used() != s.charge.cost {
                give_back(book.returner.clone(), s).await;
            }
        }
    });
}
