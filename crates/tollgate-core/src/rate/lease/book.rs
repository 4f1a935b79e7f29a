//! The slices an instance holds and the rates it tracks ([`Leases`]),
//! serving a check from a slice ([`Leases::serve`]), settling served
//! charges in it, and giving back what was not used. Taking a slice is in
//! `take`, what revocations leave in `revoke`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::revoke::{lock, Epoch, Retired, Revocation, Revocations};
use super::sending::Sending;
use super::QuotaLeases;
use crate::keyspace::Subject;
use crate::quota::Quota;
use crate::rate::charge::{next_id, Charge};
use crate::rate::{Decision, DecisionSource, RateLimiter, Settlement};
use crate::store::{Algorithm, Outcome, Outcomes};

/// The window a subject's local rate is counted over (µs).
pub(super) const WINDOW_MICROS: u64 = 100_000;

/// A limiter's quota leases: cheap to share with the takes in flight.
pub(in crate::rate) struct Leases {
    pub(super) book: Arc<Book>,
}

pub(super) struct Book {
    pub(super) settings: QuotaLeases,
    pub(super) algorithm: Algorithm,
    pub(super) quotas: Arc<[Quota]>,
    /// The most units one slice takes.
    pub(super) most: u64,
    pub(super) subjects: Mutex<HashMap<String, Tracker>>,
    /// The window of the last sweep (one per window: bounded work).
    pub(super) swept: AtomicU64,
    /// The revocations heard: a take sent before one of its subject
    /// installs nothing, a give-back sent after one is skipped.
    pub(super) revocations: Arc<Revocations>,
    /// The same policy without leases, registration or deny cache: gives
    /// back what the slices hold when nobody checks (they aged out, the
    /// limiter was dropped, they were revoked).
    pub(super) returner: RateLimiter,
    /// The served charges settled in slices that have ended.
    pub(super) retired: Retired,
    /// The give-backs of ended slices sent from tasks of their own.
    pub(super) sending: Arc<Sending>,
}

/// One subject on this instance: its recent checks and its slice.
#[derive(Default)]
pub(super) struct Tracker {
    pub(super) window: u64,
    pub(super) count: u32,
    pub(super) previous: u32,
    pub(super) slice: Option<Slice>,
    /// A take is on its way: no second one.
    pub(super) taking: bool,
}

/// Units taken on the store, served here.
pub(super) struct Slice {
    pub(super) subject: Subject,
    /// Names it in the charges it serves.
    pub(super) id: u64,
    pub(super) left: u64,
    /// Units settled over their charges beyond what the slice held: owed
    /// to the store when the slice is given back.
    pub(super) extra: u64,
    /// The served charges settled or refunded (each at most once).
    pub(super) settled: HashSet<u64>,
    /// Its subject's revocations when it was taken (see [`Book::revocations`]).
    pub(super) epoch: Epoch,
    pub(super) revocations: Arc<Revocations>,
    /// Local time (the clock that times decisions, else the monotonic one)
    /// before the take was sent.
    pub(super) taken_at: u64,
    pub(super) expires_at: u64,
    /// The store's figures as of the take.
    pub(super) outcomes: Outcomes,
    /// The take, as a charge: settled to what was used when it ends.
    pub(super) charge: Charge,
}

impl Slice {
    /// What the store's charge is settled to when the slice ends.
    pub(super) fn used(&self) -> u64 {
        (self.charge.cost - self.left).saturating_add(self.extra)
    }

    /// A charge of `cost` units served from the slice.
    fn served(&self, cost: u64) -> Charge {
        Charge {
            cost,
            id: next_id(),
            slice: self.id,
            ..self.charge
        }
    }
}

/// What [`Leases::serve`] did with a check.
// Moved, not boxed: a box would cost an allocation per served check.
#[allow(clippy::large_enum_variant)]
pub(in crate::rate) enum Served {
    /// Answered from the subject's slice.
    Yes(Decision),
    /// Not served; `hot`: the subject may lease (see [`Leases::begin`]).
    No { hot: bool },
}

impl Tracker {
    fn count(&mut self, now: u64) {
        let w = now / WINDOW_MICROS;
        if w != self.window {
            self.previous = if w == self.window + 1 { self.count } else { 0 };
            self.count = 0;
            self.window = w;
        }
        self.count = self.count.saturating_add(1);
    }

    pub(super) fn seen(&self) -> u64 {
        u64::from(self.count.max(self.previous))
    }
}

impl Leases {
    pub(in crate::rate) fn new(
        settings: QuotaLeases,
        algorithm: Algorithm,
        quotas: Arc<[Quota]>,
        returner: RateLimiter,
    ) -> Self {
        let capacity = quotas.iter().map(|q| algorithm.capacity(q)).min();
        let most = capacity.unwrap_or(0) / u64::from(settings.max_share);
        Leases {
            book: Arc::new(Book {
                settings,
                algorithm,
                quotas,
                most,
                subjects: Mutex::new(HashMap::new()),
                swept: AtomicU64::new(u64::MAX),
                revocations: Arc::default(),
                returner,
                retired: Retired::default(),
                sending: Arc::default(),
            }),
        }
    }

    /// Counts a check of `subject` at `now` (the limiter's decision time) and
    /// answers it from the subject's live slice when that holds `cost`. A
    /// slice that aged out or holds too little ends here (its unused units
    /// go back in the background).
    pub(in crate::rate) fn serve(
        &self,
        limiter: &RateLimiter,
        subject: &Subject,
        cost: u64,
        max_wait_micros: u64,
        now: u64,
    ) -> Served {
        let book = &self.book;
        let mut ended = Vec::new();
        let served = {
            let mut map = lock(&book.subjects);
            let w = now / WINDOW_MICROS;
            if book.swept.swap(w, Ordering::Relaxed) != w {
                ended = sweep(&mut map, now, book.settings.subjects);
            }
            // A subject beyond the tracked ones is checked as a cold one
            // (the slices the sweep ended still go back).
            let served = match tracker(&mut map, subject, book) {
                None => Served::No { hot: false },
                Some(t) => {
                    t.count(now);
                    serve_from(book, t, cost, max_wait_micros, now, &mut ended)
                }
            };
            for s in &mut ended {
                book.retire(s, now);
            }
            served
        };
        for s in ended {
            give_back_later(book, limiter, s);
        }
        served
    }

    /// Ends `subject`'s slice (every subject's, for `None`) and voids the
    /// takes on their way; what the slices took and owe becomes what
    /// `why` says.
    pub(in crate::rate) fn revoke(&self, subject: Option<&Subject>, why: Revocation) {
        let book = &self.book;
        book.revocations.revoke(subject, why);
        let now = book.returner.cache_now();
        let ended: Vec<Slice> = {
            let mut map = lock(&book.subjects);
            let mut ended: Vec<Slice> = match subject {
                Some(s) => map
                    .get_mut(s.as_encoded())
                    .and_then(|t| t.slice.take())
                    .into_iter()
                    .collect(),
                None => map.values_mut().filter_map(|t| t.slice.take()).collect(),
            };
            ended.iter_mut().for_each(|s| book.retire(s, now));
            ended
        };
        let settles: Vec<(Slice, u64)> = ended
            .into_iter()
            .filter_map(|s| {
                let to = match why {
                    Revocation::Reset => return None,
                    Revocation::Block => s.used(),
                    Revocation::Unknown => s.used().max(s.charge.cost),
                };
                (to != s.charge.cost).then_some((s, to))
            })
            .collect();
        if settles.is_empty() {
            return;
        }
        let returner = self.book.returner.clone();
        self.book.sending.spawn(async move {
            for (s, to) in settles {
                settle_slice(&returner, s, to).await;
            }
        });
    }

    /// Settles a charge served from `subject`'s slice to `actual` while the
    /// slice lives (`None` once it ended): a give-back returns units to the
    /// slice (first paying what it owes); more than the charge takes from
    /// it, and what it does not hold is owed to the store when it ends.
    /// At most once per charge.
    pub(in crate::rate) fn settle_in_slice(
        &self,
        subject: &Subject,
        charge: &Charge,
        actual: u64,
        now: u64,
    ) -> InSlice {
        let mut map = lock(&self.book.subjects);
        let live = map
            .get_mut(subject.as_encoded())
            .and_then(|t| t.slice.as_mut())
            .filter(|s| s.id == charge.slice);
        let Some(s) = live else {
            return if self.book.retired.settled(charge.slice, charge.id, now) {
                InSlice::SettledBefore
            } else {
                InSlice::Ended
            };
        };
        let applied = actual != charge.cost && s.settled.insert(charge.id);
        if applied && actual < charge.cost {
            let back = charge.cost - actual;
            let paid = back.min(s.extra);
            s.extra -= paid;
            s.left += back - paid;
        } else if applied {
            let more = actual - charge.cost;
            let held = more.min(s.left);
            s.left -= held;
            s.extra = s.extra.saturating_add(more - held);
        }
        let mut decision = self.book.decision(s, now);
        decision.allowed = s.extra == 0;
        InSlice::Settled(Settlement { applied, decision })
    }

    /// Gives back every slice's unused units, and waits for it.
    pub(in crate::rate) async fn return_all(&self, limiter: &RateLimiter) {
        let now = limiter.cache_now();
        let slices: Vec<Slice> = {
            let mut map = lock(&self.book.subjects);
            let mut slices: Vec<Slice> = map.values_mut().filter_map(|t| t.slice.take()).collect();
            slices.iter_mut().for_each(|s| self.book.retire(s, now));
            slices
        };
        let backs = slices.into_iter().map(|s| give_back(limiter.clone(), s));
        futures_util::future::join_all(backs).await;
        // And those already on their way (a revocation's, an aged slice's).
        self.book.sending.drained().await;
    }
}

impl Drop for Leases {
    /// Best effort: the slices' unused units go back in the background when
    /// a runtime is at hand (else they return as the quota refills).
    fn drop(&mut self) {
        let slices: Vec<Slice> = {
            let mut map = lock(&self.book.subjects);
            map.values_mut()
                .filter_map(|t| t.slice.take())
                .filter(|s| s.used() != s.charge.cost)
                .collect()
        };
        if slices.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let returner = self.book.returner.clone();
            runtime.spawn(async move {
                for s in slices {
                    give_back(returner.clone(), s).await;
                }
            });
        }
    }
}

/// Serves a check of `cost` from `t`'s slice when it is live and holds the
/// cost; else ends a slice that aged out or holds too little (into
/// `ended`) and tells whether the subject is hot enough to lease.
fn serve_from(
    book: &Book,
    t: &mut Tracker,
    cost: u64,
    max_wait_micros: u64,
    now: u64,
    ended: &mut Vec<Slice>,
) -> Served {
    match &mut t.slice {
        // A reservation is the store's to order: never served from
        // a slice, never leased.
        _ if max_wait_micros > 0 => Served::No { hot: false },
        Some(s) if now < s.expires_at && s.left >= cost => {
            s.left -= cost;
            let mut d = book.decision(s, now);
            // A charge of 0 units too: a settle charges what the work cost.
            d.charge = Some(s.served(cost));
            Served::Yes(d)
        }
        Some(_) => {
            ended.extend(t.slice.take());
            Served::No { hot: true }
        }
        None => Served::No {
            hot: !t.taking && t.seen() >= u64::from(book.settings.hot_checks),
        },
    }
}

/// `subject`'s tracker, made if there is room (see [`sweep`]).
fn tracker<'m>(
    map: &'m mut HashMap<String, Tracker>,
    subject: &Subject,
    book: &Book,
) -> Option<&'m mut Tracker> {
    let key = subject.as_encoded();
    if !map.contains_key(key) {
        if map.len() >= book.settings.subjects {
            return None;
        }
        map.insert(key.to_owned(), Tracker::default());
    }
    map.get_mut(key)
}

/// Once per window: takes out the slices that aged out (to be given back
/// without waiting for their subject's next check) and, when the map is
/// full, drops the trackers with no slice, no take and no check in the
/// last window.
fn sweep(map: &mut HashMap<String, Tracker>, now: u64, most: usize) -> Vec<Slice> {
    let aged = map
        .values_mut()
        .filter(|t| t.slice.as_ref().is_some_and(|s| now >= s.expires_at))
        .filter_map(|t| t.slice.take())
        .collect();
    if map.len() >= most {
        let w = now / WINDOW_MICROS;
        map.retain(|_, t| t.slice.is_some() || t.taking || t.window + 1 >= w);
    }
    aged
}

/// Where a settle of a served charge belongs (see
/// [`Leases::settle_in_slice`]).
// Moved, not boxed, as `Served`: settles of served charges are frequent.
#[allow(clippy::large_enum_variant)]
pub(in crate::rate) enum InSlice {
    /// Settled in its live slice.
    Settled(Settlement),
    /// Its slice ended after settling it: a replay, refused.
    SettledBefore,
    /// Its slice ended without settling it: the store's.
    Ended,
}

impl Book {
    /// Keeps what the slice `s`, ending at `now` (local time), settled, as
    /// long as a settle over its charges could apply on the store: the
    /// charge's refund span or the longest quota period, whichever is
    /// longer.
    pub(super) fn retire(&self, s: &mut Slice, now: u64) {
        let longest = self.quotas.iter().map(|q| q.period_micros()).max();
        let keep = s.charge.span_micros.max(longest.unwrap_or(0));
        self.retired.keep(
            s.id,
            std::mem::take(&mut s.settled),
            now,
            now.saturating_add(keep),
        );
    }

    /// A check served from `s` at `now`: what this instance knows — the
    /// units left in the slice, the store's times as of the take less the
    /// time since.
    fn decision(&self, s: &Slice, now: u64) -> Decision {
        let since = now.saturating_sub(s.taken_at);
        let outcomes: Outcomes = s
            .outcomes
            .iter()
            .map(|o| {
                Outcome::from_reply(
                    s.left,
                    o.reset_after_micros.saturating_sub(since),
                    0,
                    o.next_after_micros.saturating_sub(since),
                )
            })
            .collect();
        Decision::from_outcomes(
            self.algorithm,
            &self.quotas,
            &outcomes,
            true,
            DecisionSource::Lease,
        )
    }
}

/// Gives back `s`'s unused units in the background (nothing without a
/// runtime: they return as the quota refills).
pub(super) fn give_back_later(book: &Book, limiter: &RateLimiter, s: Slice) {
    if s.used() == s.charge.cost {
        return;
    }
    book.sending.spawn(give_back(limiter.clone(), s));
}

/// Settles the slice's charge to the units it served, less the refunds,
/// plus what settles over their charges took beyond it (a debt, bounded by
/// the limiter's `max_debt`): one round trip, at most once (the bucket's
/// give-back rules apply). Skipped after a reset of its subject (or a
/// possibly missed message, which may have been one): the units were not
/// counted there any more. A block leaves them counted: they go back.
pub(super) async fn give_back(limiter: RateLimiter, s: Slice) {
    let used = s.used();
    if used == s.charge.cost || s.epoch.voids_give_back(s.revocations.epoch(&s.subject)) {
        return;
    }
    settle_slice(&limiter, s, used).await;
}

/// Settles the slice's charge on the store to `to` units (at most once:
/// the charge's marker).
async fn settle_slice(limiter: &RateLimiter, s: Slice, to: u64) {
    let digest = s.subject.digest();
    match limiter.settle(s.subject, &s.charge, to).await {
        Ok(done) => {
            tracing::debug!(policy = limiter.keyspace().policy(), subject = %digest, left = s.left, applied = done.applied, "gave back a quota lease");
        }
        Err(e) => {
            tracing::debug!(policy = limiter.keyspace().policy(), subject = %digest, error = %e, "could not give back a quota lease");
        }
    }
}
