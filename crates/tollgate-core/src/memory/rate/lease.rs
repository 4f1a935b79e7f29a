//! Quota leases in memory: the twin of `lua/rate_lease.lua`, by the same
//! composition — the algorithm's own check with cost 0 to learn what is
//! available, then with the cost taken.

use super::MemoryBackend;
use crate::store::{LeaseReply, LeaseSize, RateRequest};

impl MemoryBackend {
    /// Takes up to `size.want` units of the request's quotas, or refuses as
    /// a check of `size.least` units (see
    /// [`RateBackend::lease_rate`](crate::store::RateBackend::lease_rate)).
    pub(super) fn lease_now(&self, req: &RateRequest, size: LeaseSize) -> LeaseReply {
        let mut at = req.clone();
        at.max_wait_micros = 0;
        at.deadline = None;
        at.unclaimed = None;
        let least = size.least.max(req.cost);
        loop {
            at.cost = 0;
            let peek = self.check_now(&at);
            let available = peek.outcomes.iter().map(|o| o.remaining).min();
            let k = available.unwrap_or(0).min(size.want).max(least);
            at.cost = k;
            let reply = self.check_now(&at);
            if reply.allowed {
                return LeaseReply::new(k, reply);
            }
            // The shard is locked per step, not across both: a check between
            // them may have taken what the peek saw. Only a refusal of the
            // least is the lease's own answer; otherwise look again.
            if k == least {
                return LeaseReply::new(0, reply);
            }
        }
    }
}
