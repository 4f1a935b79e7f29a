//! [`PaceLayer`]: the shared budget and how calls are charged against it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::RateLimiter;
use tower_layer::Layer;

use super::service::{Pace, Shared};
use crate::key::GlobalKey;
use crate::rate_limit::ResponseCost;

/// How long a call waits for a slot by default.
const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);
/// The longest block an upstream's headers can set by default: a broken
/// header must not stop a fleet for a day.
const DEFAULT_MAX_BLOCK: Duration = Duration::from_secs(600);

/// Paces outbound calls against a budget shared by every instance; see the
/// [module docs](super).
///
/// Clones share the limiter, and so the budget: every service this layer
/// makes, and every instance whose limiter has the same name on the same
/// store, draws on one budget.
#[derive(Clone)]
pub struct PaceLayer<K = GlobalKey, C = u64> {
    shared: Shared,
    key: K,
    cost: C,
}

impl<K: fmt::Debug, C: fmt::Debug> fmt::Debug for PaceLayer<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PaceLayer")
            .field("shared", &self.shared)
            .field("key", &self.key)
            .field("cost", &self.cost)
            .finish()
    }
}

impl PaceLayer {
    /// Paces calls against `limiter`: one budget for every call (the
    /// subject `global`), 1 unit a call, waiting up to 30 s for a slot, and
    /// blocking the budget for up to 10 min when the upstream asks.
    pub fn new(limiter: RateLimiter) -> Self {
        PaceLayer {
            shared: Shared {
                limiter,
                max_wait: DEFAULT_MAX_WAIT,
                learn: true,
                max_block: DEFAULT_MAX_BLOCK,
                settle_from: None,
            },
            key: GlobalKey,
            cost: 1,
        }
    }
}

impl<K, C> PaceLayer<K, C> {
    /// Charges each call to the budget of the subject `key` gives
    /// ([`KeyExtractor`](crate::key::KeyExtractor), e.g. one per upstream
    /// host or per account; default [`GlobalKey`]: one budget). A call
    /// keyed "not paced" goes straight through; a key error ends the call
    /// with the [`KeyError`](crate::key::KeyError), unmade.
    pub fn key<K2>(self, key: K2) -> PaceLayer<K2, C> {
        PaceLayer {
            shared: self.shared,
            key,
            cost: self.cost,
        }
    }

    /// Charges each call `cost` units: a constant or a closure on the
    /// request's head (see [`RequestCost`](crate::rate_limit::RequestCost);
    /// e.g. an LLM call's `max_tokens`). Default 1.
    pub fn cost<C2>(self, cost: C2) -> PaceLayer<K, C2> {
        PaceLayer {
            shared: self.shared,
            key: self.key,
            cost,
        }
    }

    /// How long a call may wait for its slot (default 30 s); a call that
    /// would wait longer ends at once with [`Throttled`](super::Throttled),
    /// unmade. Zero never waits.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.shared.max_wait = max_wait;
        self
    }

    /// Whether a response asking callers to wait blocks the budget
    /// fleet-wide (default: yes); see the [module docs](super#learning-from-the-upstream).
    pub fn learn(mut self, on: bool) -> Self {
        self.shared.learn = on;
        self
    }

    /// The longest block a response can set (default 10 min): a longer wait
    /// asked for is cut to it. Kept between 1 ms and
    /// [`LONGEST_BLOCK`](tollgate_core::admin::LONGEST_BLOCK), the blocks a
    /// limiter accepts (turn learning off with [`learn`](Self::learn)).
    pub fn max_block(mut self, max_block: Duration) -> Self {
        self.shared.max_block = max_block.clamp(
            Duration::from_millis(1),
            tollgate_core::admin::LONGEST_BLOCK,
        );
        self
    }

    /// Settles each call's charge to the cost its response reports (a
    /// [`ResponseCost`]: [`CostHeader`](crate::rate_limit::CostHeader),
    /// [`CostExtension`](crate::rate_limit::CostExtension) or a closure),
    /// with [`RateLimiter::settle`](tollgate_core::RateLimiter::settle),
    /// before the response is handed back. A response that says nothing
    /// leaves the charge as taken; a settle that fails is logged and never
    /// fails the call.
    pub fn settle_from(mut self, actual: impl ResponseCost) -> Self {
        self.shared.settle_from = Some(Arc::new(move |res| actual.actual_cost(res)));
        self
    }

    /// The limiter holding the budget.
    pub fn limiter(&self) -> &RateLimiter {
        &self.shared.limiter
    }
}

impl<S, K: Clone, C: Clone> Layer<S> for PaceLayer<K, C> {
    type Service = Pace<S, K, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Pace::new(
            inner,
            Arc::new(self.shared.clone()),
            self.key.clone(),
            self.cost.clone(),
        )
    }
}
