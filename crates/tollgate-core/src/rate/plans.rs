//! Quotas chosen per request: [`Plans`], a table of named plans (free, pro,
//! …), each its own [`RateLimiter`], with a default plan for unknown or
//! missing names, replaceable at runtime.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tollgate::Error> {
//! use tollgate::{Algorithm, ManualClock, MemoryBackend, PlanTable, Plans, Quota, RateLimiter};
//!
//! // A stopped clock keeps the figures exact.
//! let backend = MemoryBackend::with_clock(ManualClock::new(1_800_000_000_000_000));
//! let plan = |name: &str, per_minute| {
//!     RateLimiter::builder(backend.clone(), Algorithm::TokenBucket)
//!         .quota(Quota::per_minute(per_minute))
//!         .name(format!("plan-{name}"))
//!         .build()
//! };
//! let plans = Plans::new(
//!     PlanTable::builder()
//!         .plan("free", plan("free", 10)?)
//!         .plan("pro", plan("pro", 100)?)
//!         .default_plan("free")
//!         .build()?,
//! );
//! assert_eq!(plans.select(Some("pro")).limiter().check("alice").await?.remaining, 99);
//! // Unknown or missing: the default plan, with counters of its own.
//! assert_eq!(plans.select(Some("gold")).name(), "free");
//! assert_eq!(plans.select(None).limiter().check("alice").await?.remaining, 9);
//!
//! // Pro doubles, without a restart: the next decision uses the new table,
//! // and the same limiter name keeps alice's state.
//! plans.replace(
//!     PlanTable::builder()
//!         .plan("free", plan("free", 10)?)
//!         .plan("pro", plan("pro", 200)?)
//!         .default_plan("free")
//!         .build()?,
//! )?;
//! let d = plans.select(Some("pro")).limiter().check("alice").await?;
//! assert_eq!((d.limit, d.remaining), (200, 197));
//! # Ok(()) }
//! ```
//!
//! # Plans never share counters
//!
//! Each plan is its own limiter, and its keys live under its limiter's
//! prefix, name and algorithm (see [`keyspace`](crate::keyspace)).
//! [`PlanTableBuilder::build`] refuses two plans whose limiters would write
//! the same keys, so a subject that moves from free to pro starts pro with
//! pro's own budget, and the `RateLimit-Policy` of each plan names its own
//! policy.
//!
//! # What a replaced table does to existing state
//!
//! [`Plans::replace`] swaps the whole table atomically; checks already
//! running finish on the table they started with, the next one uses the new
//! table. Nothing stored is touched: **a plan whose limiter keeps its prefix,
//! name and algorithm reads the keys the old limiter wrote**, so subjects keep what they
//! used. Name plan limiters explicitly (`.name("plan-pro")`): a derived name
//! hashes the quotas, so a changed quota means a new name, fresh keys and a
//! full budget for everyone. With the same name and the same period, per
//! algorithm (`L` the old limit, `L'` the new one):
//!
//! | algorithm | kept | limit grows or shrinks |
//! |---|---|---|
//! | token bucket | the instant the bucket was last empty | tokens are recomputed from the time since that instant at the new rate, capped at the new capacity: the share of the window refilled carries over (5 of 10 used → 50 of 100 left; 50 of 100 used → 5 of 10 left) |
//! | GCRA | the theoretical arrival time (a debt in time) | the same admissions as the token bucket: the debt is re-read at the new rate |
//! | fixed window | this window's count | the count counts against `L'`: `L' − count` left (never below 0); a count above `L'` is refused until the window ends |
//! | sliding window log | one entry per admitted unit | the entries of the last period count against `L'`; above `L'`, refused until enough entries leave the window (exact) |
//! | sliding window counter | the previous and current windows' counts | the weighted estimate counts against `L'`; above it, refused until the estimate falls below `L'` — up to two windows, as the current count weighs into the next |
//!
//! A changed **period** (the window) is read from the same state. The
//! window algorithms store a window index of the old length, which does not
//! match the new windows: their counts are forgotten and every subject
//! starts a full window. The log counts its entries of the new period (as
//! far as they were kept). The token bucket refills from its last empty
//! instant at the new rate, and GCRA owes the same time as before at the new
//! rate; the two differ only here: after a window grows, GCRA admits more
//! than the token bucket (10 per minute with 8 used, then 10 per hour 30 s
//! later: GCRA owes 18 s, under one unit, and admits 9; the bucket has
//! refilled 42 s, under one token, and admits none). Every key keeps the
//! TTL its last write gave it, long enough for the old quota: a token
//! bucket whose window grew is full again once its key expires, when the
//! old bucket would have been (earlier than a denial just before announced;
//! the limiter's deny cache keeps such a denial until its announced wait).
//!
//! Keys are per quota position: quota `i` of the new limiter reads quota
//! `i`'s state; going from one quota to several (or back) changes every key
//! and starts afresh. So does a changed **algorithm**: keys carry it, so the
//! new limiter reads none of the old one's state (one algorithm's state
//! means nothing to another) and every subject starts with a full budget,
//! under the same name and `RateLimit-Policy`; the old keys expire by their
//! TTLs, and going back to the old algorithm before then finds them again.
//! Each limiter has its own deny cache, so a new limiter never repeats the
//! old one's denials: a grown limit admits at once.
//!
//! A table lives in one process. Instances that share a backend share the
//! stored state, and each applies the table it holds: replace the table in
//! every instance.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::RateLimiter;
use crate::error::{Error, Result};

/// One plan: a name and the limiter its requests are checked against.
/// Cheap to clone (two reference counts).
///
/// ```
/// # fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{MemoryBackend, PlanTable, Quota, RateLimiter};
///
/// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_minute(10))?;
/// let table = PlanTable::builder().plan("free", limiter).default_plan("free").build()?;
/// let free = table.default_plan();
/// assert_eq!(free.name(), "free");
/// assert_eq!(free.limiter().quotas()[0].limit(), 10);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Plan {
    name: Arc<str>,
    limiter: RateLimiter,
    /// The plan's position in the table that built it (see
    /// [`PlanTable::position`]).
    index: usize,
}

impl Plan {
    /// The plan's name, as the table knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limiter requests on this plan are checked against.
    pub fn limiter(&self) -> &RateLimiter {
        &self.limiter
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("name", &self.name)
            .field("limiter", &self.limiter)
            .finish()
    }
}

/// An immutable table of plans, one of them the default; what [`Plans`]
/// holds and swaps.
///
/// ```
/// # fn main() -> Result<(), tollgate::Error> {
/// use tollgate::{Algorithm, MemoryBackend, PlanTable, Quota, RateLimiter};
///
/// let backend = MemoryBackend::new();
/// let limiter = |name: &str, n| {
///     RateLimiter::builder(backend.clone(), Algorithm::FixedWindow)
///         .quota(Quota::per_minute(n))
///         .name(name)
///         .build()
/// };
/// let table = PlanTable::builder()
///     .plan("free", limiter("plan-free", 10)?)
///     .plan("pro", limiter("plan-pro", 100)?)
///     .default_plan("free")
///     .build()?;
/// assert_eq!(table.select(Some("pro")).name(), "pro");
/// assert_eq!(table.select(Some("nope")).name(), "free");
/// assert_eq!(table.select(None).name(), "free");
/// assert!(table.get("nope").is_none());
/// assert_eq!(table.plans().len(), 2);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PlanTable {
    plans: Box<[Plan]>,
    default: usize,
}

impl PlanTable {
    /// A builder; add plans with [`PlanTableBuilder::plan`] and name the
    /// default with [`PlanTableBuilder::default_plan`].
    pub fn builder() -> PlanTableBuilder {
        PlanTableBuilder {
            plans: Vec::new(),
            default: None,
        }
    }

    /// The plan named `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<&Plan> {
        // Plan tables are a handful of tiers: a scan beats hashing the name.
        self.plans.iter().find(|p| &*p.name == name)
    }

    /// The plan named `name`, or the default plan when there is none of
    /// that name or no name at all.
    pub fn select(&self, name: Option<&str>) -> &Plan {
        name.and_then(|n| self.get(n))
            .unwrap_or_else(|| self.default_plan())
    }

    /// The plan for unknown or missing names.
    pub fn default_plan(&self) -> &Plan {
        &self.plans[self.default]
    }

    /// Every plan, in the order they were added.
    pub fn plans(&self) -> &[Plan] {
        &self.plans
    }

    /// Where `plan` is in [`plans`](Self::plans), when it is one of this
    /// table's own (not a clone taken from another table): for data kept
    /// beside a table, one entry per plan, such as the tower layer's
    /// `RateLimit-Policy` of each plan.
    ///
    /// ```
    /// # fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{MemoryBackend, PlanTable, Quota, RateLimiter};
    ///
    /// let l = |n| RateLimiter::gcra(MemoryBackend::new(), Quota::per_minute(n));
    /// let table = PlanTable::builder().plan("a", l(1)?).plan("b", l(2)?).default_plan("a").build()?;
    /// let b = table.select(Some("b"));
    /// assert_eq!(table.position(b), Some(1));
    /// let other = PlanTable::builder().plan("a", l(1)?).plan("b", l(2)?).default_plan("a").build()?;
    /// assert_eq!(other.position(b), None);
    /// # Ok(()) }
    /// ```
    pub fn position(&self, plan: &Plan) -> Option<usize> {
        self.plans
            .get(plan.index)
            .filter(|own| Arc::ptr_eq(&own.name, &plan.name))
            .map(|_| plan.index)
    }
}

/// Builds a [`PlanTable`]; every rule is checked by [`build`](Self::build).
#[derive(Debug)]
#[must_use]
pub struct PlanTableBuilder {
    plans: Vec<(String, RateLimiter)>,
    default: Option<String>,
}

impl PlanTableBuilder {
    /// Adds the plan `name`, checked against `limiter`. Give each plan's
    /// limiter a name of its own ([`RateLimiterBuilder::name`](crate::RateLimiterBuilder::name)),
    /// and keep it when the plan's quotas change, so that a replaced table
    /// keeps the state (see the [module docs](self)).
    pub fn plan(mut self, name: impl Into<String>, limiter: RateLimiter) -> Self {
        self.plans.push((name.into(), limiter));
        self
    }

    /// The plan for unknown or missing names: one of the plans added.
    pub fn default_plan(mut self, name: impl Into<String>) -> Self {
        self.default = Some(name.into());
        self
    }

    /// Checks the table: at least one plan, no name twice, a default that
    /// is one of the plans, and no two plans whose limiters write the same
    /// keys (the same prefix, name and algorithm: their counters would be
    /// shared).
    ///
    /// ```
    /// use tollgate::{Error, MemoryBackend, PlanTable, Quota, RateLimiter};
    ///
    /// let backend = MemoryBackend::new();
    /// let named = |name: &str, n| {
    ///     RateLimiter::builder(backend.clone(), tollgate::Algorithm::Gcra)
    ///         .quota(Quota::per_minute(n))
    ///         .name(name)
    ///         .build()
    ///         .unwrap()
    /// };
    /// let err = PlanTable::builder()
    ///     .plan("free", named("api", 10))
    ///     .plan("pro", named("api", 100))
    ///     .default_plan("free")
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, Error::InvalidConfig(_)));
    /// assert!(err.to_string().contains("\"free\" and \"pro\""), "{err}");
    /// ```
    pub fn build(self) -> Result<PlanTable> {
        if self.plans.is_empty() {
            return Err(Error::InvalidConfig("a plan table needs a plan".into()));
        }
        let mut plans: Vec<Plan> = Vec::with_capacity(self.plans.len());
        for (index, (name, limiter)) in self.plans.into_iter().enumerate() {
            if plans.iter().any(|p| *p.name == *name) {
                return Err(Error::InvalidConfig(format!(
                    "plan {name:?} is in the table twice"
                )));
            }
            let plan = Plan {
                name: name.into(),
                limiter,
                index,
            };
            if let Some(other) = plans
                .iter()
                .find(|p| key_prefix(&p.limiter) == key_prefix(&plan.limiter))
            {
                return Err(Error::InvalidConfig(format!(
                    "plans {:?} and {:?} would share counters: both limiters write keys under \"{}:\"; \
                     give each plan's limiter its own name (RateLimiterBuilder::name)",
                    other.name,
                    plan.name,
                    key_prefix(&plan.limiter)
                )));
            }
            plans.push(plan);
        }
        let default = match self.default {
            None => {
                return Err(Error::InvalidConfig(
                    "a plan table needs a default plan (PlanTableBuilder::default_plan)".into(),
                ))
            }
            Some(name) => plans.iter().position(|p| *p.name == *name).ok_or_else(|| {
                Error::InvalidConfig(format!("the default plan {name:?} is not in the table"))
            })?,
        };
        Ok(PlanTable {
            plans: plans.into_boxed_slice(),
            default,
        })
    }
}

/// What every key of `limiter` starts with, before the subject's hash tag:
/// `<prefix>:<policy>:<algorithm>`. Prefixes and policy names cannot hold
/// braces, so two limiters write the same keys exactly when these are equal
/// (`"a:b"` + `"c"` and `"a"` + `"b:c"` are the same keys; another
/// algorithm never is).
fn key_prefix(limiter: &RateLimiter) -> String {
    let ks = limiter.keyspace();
    format!(
        "{}:{}:{}",
        ks.prefix(),
        ks.policy(),
        limiter.algorithm().short_name()
    )
}

/// The current [`PlanTable`], shared by every clone and replaceable at
/// runtime: an atomic swap, after which the next decision uses the new
/// table (see the [module docs](self) for what happens to stored state).
///
/// Cheap to clone; clones share the table, so the handle an admin endpoint
/// holds and the one a layer holds see the same replacements. Reading the
/// table takes no lock.
#[derive(Clone)]
pub struct Plans {
    // `ArcSwap`: readers on every request take no lock and never wait for
    // a writer; a replacement is one atomic store.
    current: Arc<ArcSwap<PlanTable>>,
}

impl fmt::Debug for Plans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Plans")
            .field(&**self.current.load())
            .finish()
    }
}

impl Plans {
    /// A handle on `table`.
    pub fn new(table: PlanTable) -> Self {
        Plans {
            current: Arc::new(ArcSwap::from_pointee(table)),
        }
    }

    /// The current table.
    pub fn current(&self) -> Arc<PlanTable> {
        self.current.load_full()
    }

    /// Runs `f` on the current table without taking a reference count (for
    /// code on every request; keep `f` short: a replaced table is freed only
    /// once the last reader is done with it).
    ///
    /// ```
    /// # fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{MemoryBackend, PlanTable, Plans, Quota, RateLimiter};
    ///
    /// let limiter = RateLimiter::gcra(MemoryBackend::new(), Quota::per_minute(10))?;
    /// let plans = Plans::new(PlanTable::builder().plan("free", limiter).default_plan("free").build()?);
    /// assert_eq!(plans.with_current(|table| table.plans().len()), 1);
    /// # Ok(()) }
    /// ```
    pub fn with_current<R>(&self, f: impl FnOnce(&Arc<PlanTable>) -> R) -> R {
        f(&self.current.load())
    }

    /// The plan named `name` in the current table, or its default plan.
    pub fn select(&self, name: Option<&str>) -> Plan {
        self.with_current(|table| table.select(name).clone())
    }

    /// Makes `table` the current table and returns the one it replaces.
    /// Checks already running finish on the old table; the next decision
    /// uses the new one.
    ///
    /// A plan may change its algorithm under the same name: keys carry the
    /// algorithm, so the new limiter starts afresh instead of reading the
    /// old one's state (see the [module docs](self)). No table is refused
    /// today; the `Result` leaves room for rules that need the table in use.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tollgate::Error> {
    /// use tollgate::{Algorithm, MemoryBackend, PlanTable, Plans, Quota, RateLimiter};
    ///
    /// let backend = MemoryBackend::new();
    /// let table = |alg| -> Result<PlanTable, tollgate::Error> {
    ///     let limiter = RateLimiter::builder(backend.clone(), alg)
    ///         .quota(Quota::per_minute(10))
    ///         .name("free")
    ///         .build()?;
    ///     PlanTable::builder().plan("free", limiter).default_plan("free").build()
    /// };
    /// let plans = Plans::new(table(Algorithm::TokenBucket)?);
    /// assert_eq!(plans.select(None).limiter().check_n("alice", 10).await?.remaining, 0);
    /// let old = plans.replace(table(Algorithm::FixedWindow)?)?;
    /// assert_eq!(old.default_plan().limiter().algorithm(), Algorithm::TokenBucket);
    /// // The same name, another algorithm: its own keys, a full budget.
    /// assert_eq!(plans.select(None).limiter().check("alice").await?.remaining, 9);
    /// # Ok(()) }
    /// ```
    pub fn replace(&self, table: PlanTable) -> Result<Arc<PlanTable>> {
        Ok(self.current.swap(Arc::new(table)))
    }
}
