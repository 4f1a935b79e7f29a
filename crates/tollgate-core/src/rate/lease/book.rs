//! The slices an instance holds and the rates it tracks ([`Leases`]),
//! serving a check from a slice ([`Leases::serve`]), taking one
//! ([`Taking`]) and giving back what was not used.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::future::BoxFuture;

use super::QuotaLeases;
use crate::error::Result;
use crate::keyspace::Subject;
use crate::quota::Quota;
use crate::rate::charge::{key_digest, next_id, Charge};
use crate::rate::{Decision, DecisionSource, RateLimiter, Settlement};
use crate::store::{
    Algorithm, LeaseReply, LeaseSize, Outcome, Outcomes, RateBackend, RateReply, RateRequest,
};

/// The window a subject's local rate is counted over (µs).
const WINDOW_MICROS: u64 = 100_000;

/// A limiter's quota leases: cheap to share with the takes in flight.
pub(in crate::rate) struct Leases {
    book: Arc<Book>,
}

struct Book {
    settings: QuotaLeases,
    algorithm: Algorithm,
    quotas: Arc<[Quota]>,
    /// The most units one slice takes.
    most: u64,
    subjects: Mutex<HashMap<String, Tracker>>,
    /// The window of the last sweep (one per window: bounded work).
    swept: AtomicU64,
    /// The revocations heard: a take sent before one of its subject
    /// installs nothing, a give-back sent after one is skipped.
    revocations: Arc<Revocations>,
    /// The same policy without leases, registration or deny cache: gives
    /// back what the slices hold when nobody checks (they aged out, the
    /// limiter was dropped, they were revoked).
    returner: RateLimiter,
    /// The served charges settled in slices that have ended.
    retired: Retired,
}

/// The most ended slices whose settled charges are remembered; past it, a
/// settle replayed after its slice ended may be applied again on the store.
const RETIRED_SLICES: usize = 4096;

/// The served charges settled in slices that have ended, by slice, kept as
/// long as a settle of them could still apply on the store: a settle
/// replayed after its slice ended is refused, as the slice refused it.
#[derive(Default)]
struct Retired {
    slices: Mutex<HashMap<u64, (HashSet<u64>, u64)>>,
}

impl Retired {
    /// Keeps what `s`, ending at `now`, settled until `until`.
    fn keep(&self, s: &mut Slice, now: u64, until: u64) {
        if s.settled.is_empty() {
            return;
        }
        let mut map = lock(&self.slices);
        if map.len() >= RETIRED_SLICES {
            map.retain(|_, (_, kept)| *kept > now);
        }
        if map.len() < RETIRED_SLICES {
            map.insert(s.id, (std::mem::take(&mut s.settled), until));
        }
    }

    /// Whether `charge`, served from `slice`, was settled before its slice
    /// ended.
    fn settled(&self, slice: u64, charge: u64, now: u64) -> bool {
        lock(&self.slices)
            .get(&slice)
            .is_some_and(|(ids, kept)| *kept > now && ids.contains(&charge))
    }
}

/// The most subjects whose revocations are told apart; past it, the next
/// one counts as a revocation of every subject (admin actions are rare).
const REVOKED_SUBJECTS: usize = 4096;

/// Revocations heard, per subject and of every subject: a reset or block
/// of one subject leaves the others' takes and give-backs alone.
#[derive(Default)]
struct Revocations {
    all: AtomicU64,
    subjects: Mutex<HashMap<String, u64>>,
}

/// Where a take or a slice stands in the revocations of its subject: a
/// revocation since changes it.
type Epoch = (u64, u64);

impl Revocations {
    fn epoch(&self, subject: &Subject) -> Epoch {
        let one = lock(&self.subjects)
            .get(subject.as_encoded())
            .copied()
            .unwrap_or(0);
        (self.all.load(Ordering::Acquire), one)
    }

    fn revoke(&self, subject: Option<&Subject>) {
        let Some(subject) = subject else {
            self.all.fetch_add(1, Ordering::AcqRel);
            return;
        };
        let mut map = lock(&self.subjects);
        if map.len() >= REVOKED_SUBJECTS && !map.contains_key(subject.as_encoded()) {
            map.clear();
            self.all.fetch_add(1, Ordering::AcqRel);
        }
        *map.entry(subject.as_encoded().to_owned()).or_insert(0) += 1;
    }
}

/// One subject on this instance: its recent checks and its slice.
#[derive(Default)]
struct Tracker {
    window: u64,
    count: u32,
    previous: u32,
    slice: Option<Slice>,
    /// A take is on its way: no second one.
    taking: bool,
}

/// Units taken on the store, served here.
struct Slice {
    subject: Subject,
    /// Names it in the charges it serves.
    id: u64,
    left: u64,
    /// Units settled over their charges beyond what the slice held: owed
    /// to the store when the slice is given back.
    extra: u64,
    /// The served charges settled or refunded (each at most once).
    settled: HashSet<u64>,
    /// Its subject's revocations when it was taken (see [`Book::revocations`]).
    epoch: Epoch,
    revocations: Arc<Revocations>,
    /// Local time (the clock that times decisions, else the monotonic one)
    /// before the take was sent.
    taken_at: u64,
    expires_at: u64,
    /// The store's figures as of the take.
    outcomes: Outcomes,
    /// The take, as a charge: settled to what was used when it ends.
    charge: Charge,
}

impl Slice {
    /// What the store's charge is settled to when the slice ends.
    fn used(&self) -> u64 {
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

    fn seen(&self) -> u64 {
        u64::from(self.count.max(self.previous))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
            give_back_later(limiter, s);
        }
        served
    }

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
        Some(Taking {
            book: Arc::clone(book),
            subject: subject.clone(),
            size: LeaseSize {
                want,
                least: (want / 4).max(cost).max(1),
            },
            epoch: book.revocations.epoch(subject),
            started: now,
            installed: AtomicU64::new(0),
        })
    }

    /// Ends `subject`'s slice (every subject's, for `None`) and voids the
    /// takes on their way; what the slices took and owe becomes what
    /// `why` says.
    pub(in crate::rate) fn revoke(&self, subject: Option<&Subject>, why: Revocation) {
        let book = &self.book;
        book.revocations.revoke(subject);
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
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let returner = self.book.returner.clone();
            runtime.spawn(async move {
                for (s, to) in settles {
                    settle_slice(&returner, s, to).await;
                }
            });
        }
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
            d.charge = (cost > 0).then(|| s.served(cost));
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
    fn retire(&self, s: &mut Slice, now: u64) {
        let longest = self.quotas.iter().map(|q| q.period_micros()).max();
        let keep = s.charge.span_micros.max(longest.unwrap_or(0));
        self.retired.keep(s, now, now.saturating_add(keep));
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

/// Why slices are revoked, which says what becomes of the units they took
/// and of the debts settled over their charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::rate) enum Revocation {
    /// Their subject was reset: the store forgot what they took and owe.
    Reset,
    /// Their subject was blocked: the store still counts their units, so
    /// the unused ones go back and the debts are charged.
    Block,
    /// A message may have been missed (it may have been a reset): their
    /// debts are charged, their unused units are not given back.
    Unknown,
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
    /// The take at once, on a store in process (`None`: it needs I/O).
    pub(in crate::rate) fn call_now(
        &self,
        backend: &dyn RateBackend,
        request: &RateRequest,
    ) -> Option<Result<RateReply>> {
        let done = backend.lease_rate_now(request, self.size)?;
        Some(done.map(|lease| self.install(lease, request)))
    }

    /// The take's round trip.
    pub(in crate::rate) fn call<'a>(
        &'a self,
        backend: &'a dyn RateBackend,
        request: &'a RateRequest,
    ) -> BoxFuture<'a, Result<RateReply>> {
        Box::pin(async move {
            let lease = backend.lease_rate(request, self.size).await?;
            Ok(self.install(lease, request))
        })
    }

    /// Keeps what the take granted beyond the check's own cost as the
    /// subject's slice, and returns the check's reply as a served check
    /// reports it (the units left in the slice).
    fn install(&self, lease: LeaseReply, request: &RateRequest) -> RateReply {
        let book = &self.book;
        let mut reply = lease.reply;
        // Nothing leased: the reply is the check's own, as the store says.
        if !reply.allowed || lease.granted == 0 || lease.granted < request.cost {
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
        // A revocation since the take was sent: its units are dropped, and
        // the reply stays the store's.
        if left > 0 && book.revocations.epoch(&self.subject) == self.epoch {
            if let Some(t) = map.get_mut(self.subject.as_encoded()) {
                let id = slice.id;
                self.installed.store(id, Ordering::Relaxed);
                t.slice = Some(slice);
                for o in &mut reply.outcomes {
                    o.remaining = left;
                }
                end_when_aged(book, &self.subject, id, age);
            }
        }
        reply
    }

    /// The check's decision: its charge names the slice it installed (a
    /// settle or refund then corrects the slice); with none installed, the
    /// charge is the check's own on the store.
    pub(in crate::rate) fn charged(lease: &Option<Taking>, mut d: Decision) -> Decision {
        let installed = lease
            .as_ref()
            .map_or(0, |t| t.installed.load(Ordering::Relaxed));
        if installed != 0 {
            // An id of its own, as every served charge has: the take's id
            // is the slice's charge on the store, whose marker its
            // give-back settles under.
            d.charge = d.charge.map(|c| Charge {
                slice: installed,
                id: next_id(),
                ..c
            });
        }
        d
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

/// Gives back `s`'s unused units in the background (nothing without a
/// runtime: they return as the quota refills).
fn give_back_later(limiter: &RateLimiter, s: Slice) {
    if s.used() == s.charge.cost {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(give_back(limiter.clone(), s));
    }
}

/// Settles the slice's charge to the units it served, less the refunds,
/// plus what settles over their charges took beyond it (a debt, bounded by
/// the limiter's `max_debt`): one round trip, at most once (the bucket's
/// give-back rules apply). Skipped after a revocation: the store was reset
/// since the take (the units were not counted there any more).
async fn give_back(limiter: RateLimiter, s: Slice) {
    let used = s.used();
    if used == s.charge.cost || s.revocations.epoch(&s.subject) != s.epoch {
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
