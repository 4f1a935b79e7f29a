//! Quotas chosen per request: [`PlanSelector`] names a request's plan in a
//! [`Plans`] table (see [`RateLimitLayer::plans`](super::RateLimitLayer::plans)),
//! and the layer keeps each plan's headers beside the table.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::request::Parts;
use http::HeaderName;
use tollgate_core::{Plan, PlanTable, Plans};

use super::service::Entry;
use crate::headers::RateLimitHeaders;

/// Chooses a request's plan from its head: an extension set by an earlier
/// authentication layer, a header, a claim.
///
/// Implemented by [`PlanHeader`], [`PlanExtension`] and closures
/// `Fn(&Parts) -> Option<N>` where `N: AsRef<str>` names the plan (`None`,
/// or a name the table does not have, selects the default plan):
///
/// ```
/// use http::{request::Parts, Request};
/// use tollgate::{MemoryBackend, PlanTable, Quota, RateLimiter};
/// use tollgate::tower::rate_limit::PlanSelector;
///
/// let limiter = |name: &str| {
///     RateLimiter::builder(MemoryBackend::new(), tollgate::Algorithm::TokenBucket)
///         .quota(Quota::per_minute(10))
///         .name(name)
///         .build()
///         .unwrap()
/// };
/// let table = PlanTable::builder()
///     .plan("free", limiter("free"))
///     .plan("pro", limiter("pro"))
///     .default_plan("free")
///     .build()
///     .unwrap();
///
/// // API keys that start with `pro-` are on the pro plan.
/// let by_key = |req: &Parts| {
///     let key = req.headers.get("x-api-key")?.as_bytes();
///     Some(if key.starts_with(b"pro-") { "pro" } else { "free" })
/// };
/// let head = |key: &str| Request::get("/").header("x-api-key", key).body(()).unwrap().into_parts().0;
/// assert_eq!(by_key.select(&head("pro-42"), &table).name(), "pro");
/// assert_eq!(by_key.select(&head("k-7"), &table).name(), "free");
/// let anonymous = Request::get("/").body(()).unwrap().into_parts().0;
/// assert_eq!(by_key.select(&anonymous, &table).name(), "free");
/// ```
pub trait PlanSelector: Send + Sync + 'static {
    /// The plan of `plans` that applies to `req`; usually
    /// [`plans.select(name)`](PlanTable::select), which falls back to the
    /// default plan.
    fn select<'t>(&self, req: &Parts, plans: &'t PlanTable) -> &'t Plan;
}

impl<F, N> PlanSelector for F
where
    F: Fn(&Parts) -> Option<N> + Send + Sync + 'static,
    N: AsRef<str>,
{
    fn select<'t>(&self, req: &Parts, plans: &'t PlanTable) -> &'t Plan {
        plans.select(self(req).as_ref().map(AsRef::as_ref))
    }
}

/// The plan named by a request header (a gateway in front that resolved the
/// caller's plan, say); missing, sent more than once, not visible ASCII, or
/// not in the table: the default plan. Only trust a header that clients
/// cannot set themselves (a proxy that appends its value to the client's
/// leaves two: the default plan, never the client's choice).
///
/// ```
/// use http::Request;
/// use tollgate::{MemoryBackend, PlanTable, Quota, RateLimiter};
/// use tollgate::tower::rate_limit::{PlanHeader, PlanSelector};
///
/// let limiter = |name: &str| RateLimiter::builder(MemoryBackend::new(), tollgate::Algorithm::Gcra)
///     .quota(Quota::per_minute(10)).name(name).build().unwrap();
/// let table = PlanTable::builder()
///     .plan("free", limiter("free"))
///     .plan("pro", limiter("pro"))
///     .default_plan("free")
///     .build()
///     .unwrap();
/// let plan = PlanHeader::new("x-plan");
/// let head = |v: &str| Request::get("/").header("x-plan", v).body(()).unwrap().into_parts().0;
/// assert_eq!(plan.select(&head("pro"), &table).name(), "pro");
/// assert_eq!(plan.select(&head("gold"), &table).name(), "free");
/// // A client's "pro" with the proxy's "free" appended: the default.
/// let twice = Request::get("/").header("x-plan", "pro").header("x-plan", "free");
/// let twice = twice.body(()).unwrap().into_parts().0;
/// assert_eq!(plan.select(&twice, &table).name(), "free");
/// ```
#[derive(Debug, Clone)]
pub struct PlanHeader {
    name: HeaderName,
}

impl PlanHeader {
    /// Reads header `name` (case-insensitive). A request that carries it
    /// more than once gets the default plan: a proxy that appends its own
    /// value to a client's must not let the client's choose. Panics if
    /// `name` is not a valid header name.
    pub fn new(name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("tollgate: {name:?} is not a valid header name"));
        PlanHeader { name }
    }
}

impl PlanSelector for PlanHeader {
    fn select<'t>(&self, req: &Parts, plans: &'t PlanTable) -> &'t Plan {
        let mut values = req.headers.get_all(&self.name).iter();
        let name = match (values.next(), values.next()) {
            (Some(one), None) => one.to_str().ok(),
            _ => None,
        };
        plans.select(name)
    }
}

/// The plan named by a request extension that an earlier layer (the
/// authentication) put there; without it, or with a name the table does not
/// have: the default plan.
///
/// ```
/// use http::Request;
/// use tollgate::{MemoryBackend, PlanTable, Quota, RateLimiter};
/// use tollgate::tower::rate_limit::{PlanExtension, PlanSelector};
///
/// /// What the authentication layer knows about the caller.
/// #[derive(Clone)]
/// struct Account { tier: String }
///
/// let limiter = |name: &str| RateLimiter::builder(MemoryBackend::new(), tollgate::Algorithm::Gcra)
///     .quota(Quota::per_minute(10)).name(name).build().unwrap();
/// let table = PlanTable::builder()
///     .plan("free", limiter("free"))
///     .plan("pro", limiter("pro"))
///     .default_plan("free")
///     .build()
///     .unwrap();
/// let plan = PlanExtension::with(|a: &Account| Some(a.tier.as_str()));
/// let mut req = Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(Account { tier: "pro".into() });
/// assert_eq!(plan.select(&req.into_parts().0, &table).name(), "pro");
/// let anonymous = Request::get("/").body(()).unwrap().into_parts().0;
/// assert_eq!(plan.select(&anonymous, &table).name(), "free");
/// ```
pub struct PlanExtension<T> {
    name: Arc<NameOf<T>>,
    _marker: PhantomData<fn() -> T>,
}

/// What names the plan from the extension.
type NameOf<T> = dyn for<'a> Fn(&'a T) -> Option<&'a str> + Send + Sync;

impl<T> PlanExtension<T>
where
    T: AsRef<str> + Send + Sync + 'static,
{
    /// The extension's own text is the plan's name.
    ///
    /// ```
    /// use tollgate::tower::rate_limit::PlanExtension;
    ///
    /// /// Set by the authentication layer.
    /// #[derive(Clone)]
    /// struct PlanName(String);
    /// impl AsRef<str> for PlanName {
    ///     fn as_ref(&self) -> &str { &self.0 }
    /// }
    /// let plan = PlanExtension::<PlanName>::new();
    /// # let _ = plan;
    /// ```
    pub fn new() -> Self {
        Self::with(|t: &T| Some(t.as_ref()))
    }
}

impl<T> Default for PlanExtension<T>
where
    T: AsRef<str> + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> PlanExtension<T> {
    /// The plan `name(extension)` names (`None`: the default plan).
    pub fn with(name: impl Fn(&T) -> Option<&str> + Send + Sync + 'static) -> Self {
        PlanExtension {
            name: Arc::new(name),
            _marker: PhantomData,
        }
    }
}

impl<T> Clone for PlanExtension<T> {
    fn clone(&self) -> Self {
        PlanExtension {
            name: Arc::clone(&self.name),
            _marker: PhantomData,
        }
    }
}

impl<T> fmt::Debug for PlanExtension<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanExtension")
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: Send + Sync + 'static> PlanSelector for PlanExtension<T> {
    fn select<'t>(&self, req: &Parts, plans: &'t PlanTable) -> &'t Plan {
        let name = req.extensions.get::<T>().and_then(|t| (self.name)(t));
        plans.select(name)
    }
}

/// The plans of one layer: the shared table, the selector, and each plan's
/// entry (limiter, policy name, headers), built once per table.
pub(crate) struct PlanEntries {
    plans: Plans,
    selector: Arc<dyn PlanSelector>,
    /// The layer's header settings, applied to each plan's limiter.
    template: Arc<RateLimitHeaders>,
    // `ArcSwap`: read on every request without a lock; replaced (rarely)
    // when the first request after a swap finds another table.
    built: ArcSwap<Built>,
}

/// One entry per plan of `table`, in its order.
struct Built {
    table: Arc<PlanTable>,
    entries: Box<[Arc<Entry>]>,
}

impl Built {
    fn new(table: &Arc<PlanTable>, template: &RateLimitHeaders) -> Self {
        let entries = table
            .plans()
            .iter()
            .map(|plan| {
                let formatter = Arc::new(template.for_limiter(plan.limiter()));
                Arc::new(Entry::new(
                    plan.limiter().clone(),
                    formatter,
                    Some(plan.clone()),
                ))
            })
            .collect();
        Built {
            table: Arc::clone(table),
            entries,
        }
    }
}

impl PlanEntries {
    pub(crate) fn new(
        plans: Plans,
        selector: Arc<dyn PlanSelector>,
        template: Arc<RateLimitHeaders>,
    ) -> Self {
        let built = plans.with_current(|table| Built::new(table, &template));
        PlanEntries {
            plans,
            selector,
            template,
            built: ArcSwap::from_pointee(built),
        }
    }

    /// The entry of `req`'s plan in the current table.
    pub(crate) fn select(&self, req: &Parts) -> Arc<Entry> {
        self.plans.with_current(|table| {
            let plan = self.selector.select(req, table);
            let built = self.built.load();
            if Arc::ptr_eq(&built.table, table) {
                if let Some(i) = table.position(plan) {
                    return Arc::clone(&built.entries[i]);
                }
            }
            // The table was replaced since the entries were built (or the
            // selector answered with a plan of another table): build them
            // for this table, and keep them unless another request already
            // replaced what was read (racing rebuilds make equal entries).
            let fresh = Built::new(table, &self.template);
            let entry = match table.position(plan) {
                Some(i) => Arc::clone(&fresh.entries[i]),
                None => Arc::new(Entry::new(
                    plan.limiter().clone(),
                    Arc::new(self.template.for_limiter(plan.limiter())),
                    Some(plan.clone()),
                )),
            };
            self.built.compare_and_swap(&built, Arc::new(fresh));
            entry
        })
    }

    pub(crate) fn plans(&self) -> &Plans {
        &self.plans
    }
}

impl fmt::Debug for PlanEntries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanEntries")
            .field("plans", &self.plans)
            .finish_non_exhaustive()
    }
}
