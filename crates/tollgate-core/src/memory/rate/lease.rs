//! Quota leases in memory: the twin of `lua/rate_lease.lua`, by the same
//! composition — the algorithm's own check with cost 0 to learn what is
//! available, then with the cost taken.

use super::MemoryBackend;
use crate::store::{LeaseReply, LeaseSize, RateRequest};

impl MemoryBackend {
    /// Takes up to `size.want` units of the request's quotas, or checks the
    /// request's cost as usual when fewer than `size.least` are available
    /// (see [`RateBackend::lease_rate`](crate::store::RateBackend::lease_rate)).
    pub(super) fn lease_now(&self, req: &RateRequest, size: LeaseSize) -> LeaseReply {
        let mut at = req.clone();
        at.max_wait_micros = 0;
        at.deadline = None;
        at.unclaimed = None;
        let least = size.least.max(req.cost);
        // The shard is locked per step, not across both: a check between
        // them may take what the peek saw; then look again (a few times,
        // then check as usual).
        for _ in 0..LOOKS {
            at.cost = 0;
            let peek = self.check_now(&at);
            let available = peek.outcomes.iter().map(|o| o.remaining).min();
            let k = available.unwrap_or(0).min(size.want);
            if !peek.allowed || k < least {
                break;
            }
            at.cost = k;
            let reply = self.check_now(&at);
            if reply.allowed {
                return LeaseReply::new(k, reply);
            }
        }
        at.cost = req.cost;
        LeaseReply::new(0, self.check_now(&at))
    }
}

/// How many times a lease looks for the units it saw.
const LOOKS: usize = 3;
