//! Rate limits in memory: [`RateBackend`] for [`MemoryBackend`], each check
//! and settle decided by the algorithms' twins ([`twin`]) on one shard.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use smallvec::smallvec;

use super::{lock, Entry, MemoryBackend, Shard};
use crate::error::Result;
use crate::quota::Quota;
use crate::store::{
    LeaseReply, LeaseSize, Outcome, Outcomes, RateBackend, RateReply, RateRequest, SettleReply,
    SettleRequest,
};

pub(crate) mod fixed_window;
pub(crate) mod gcra;
mod lease;
mod settle;
pub(crate) mod sliding_window_counter;
pub(crate) mod sliding_window_log;
#[cfg(test)]
mod step_tests;
pub(crate) mod token_bucket;
mod twin;

pub(crate) use self::twin::*;

impl MemoryBackend {
    fn check_now(&self, req: &RateRequest) -> RateReply {
        let (now, at) = self.times(req.now_micros, req.store_clock);
        let Some(first) = req.keys.first() else {
            return RateReply::new(true, smallvec![]);
        };
        let quota_keys = &req.keys[..req.quotas.len().min(req.keys.len())];
        // A block runs on the store's own clock (as its TTL does on
        // Redis), whatever clock the check carries.
        if let Some(left) = req
            .keys
            .get(req.quotas.len())
            .filter(|block| !block.is_empty())
            .and_then(|block| self.block_left(block))
        {
            return RateReply::blocked(req.quotas.len(), left).at(now);
        }
        let mut shard = lock(self.shard_for(first));
        shard.tick(at);
        if let ([key], [q]) = (quota_keys, &req.quotas[..]) {
            let (allowed, outcome) = Self::check_one(&mut shard, key, q, req, (now, at));
            return RateReply::new(allowed, smallvec![outcome]).at(now);
        }
        // Each key's live entry is taken out whole, keeping its owned key so
        // that putting it back allocates nothing.
        let mut held: Vec<(Option<String>, u64)> = Vec::with_capacity(quota_keys.len());
        let mut slots: Vec<Option<Slot>> = Vec::with_capacity(quota_keys.len());
        for k in quota_keys {
            match shard.map.remove_entry(k) {
                Some((owned, e)) if e.expires_at > at => {
                    held.push((Some(owned), e.expires_at));
                    slots.push(Some(e.slot));
                }
                Some((owned, _expired)) => {
                    held.push((Some(owned), 0));
                    slots.push(None);
                }
                None => {
                    held.push((None, 0));
                    slots.push(None);
                }
            }
        }
        let alg = req.algorithm;
        let mut outcomes: Outcomes = slots
            .iter_mut()
            .zip(req.quotas.iter())
            .map(|(slot, q)| alg.step(slot, now, req.cost, q, false))
            .collect();
        let mut allowed = outcomes.iter().all(|o| o.retry_after_micros == 0);
        // A bucket's reservation: every quota's own wait fits, and each takes
        // the cost as it will stand at the longest one (the slot).
        let wait = outcomes.iter().map(|o| o.retry_after_micros).max();
        let wait = match wait {
            Some(w) if !allowed && alg.uses_burst() && w <= req.max_wait_micros => w,
            _ => 0,
        };
        allowed |= wait > 0;
        if allowed {
            outcomes = slots
                .iter_mut()
                .zip(req.quotas.iter())
                .map(|(slot, q)| alg.step(slot, now + wait, req.cost, q, true))
                .map(|o| if wait > 0 { reserved(o, wait) } else { o })
                .collect();
        }
        for (((key, slot), outcome), (owned, old_expiry)) in
            quota_keys.iter().zip(slots).zip(&outcomes).zip(held)
        {
            let Some(slot) = slot else { continue };
            if matches!(&slot, Slot::Log(l) if l.is_empty()) {
                continue;
            }
            // An admitted write sets a fresh TTL; a denied check keeps the old
            // one, exactly as the scripts leave the key untouched.
            let expires_at = if allowed {
                at + outcome.ttl_micros.max(1)
            } else {
                old_expiry
            };
            if expires_at > at {
                let key = owned.unwrap_or_else(|| key.clone());
                shard.map.insert(key, Entry { slot, expires_at });
            }
        }
        RateReply::new(allowed, outcomes).at(now)
    }

    /// The check's time and the store's: a check may carry its own clock,
    /// while every entry lives on the store's (as a key's TTL runs on the
    /// server's), so that no clock ahead of it sweeps others' entries.
    pub(super) fn times(&self, now_micros: Option<u64>, store_clock: bool) -> (u64, u64) {
        match now_micros {
            Some(now) if store_clock => (now, now),
            _ => {
                let store = self.inner.clock.now_micros();
                (now_micros.unwrap_or(store), store)
            }
        }
    }

    /// [`check_now`](Self::check_now) for one quota (the common case): the
    /// same steps on the entry in place (one lookup, no vectors). `now` is
    /// the check's time, `at` the store's.
    fn check_one(
        shard: &mut Shard,
        key: &str,
        q: &Quota,
        req: &RateRequest,
        (now, at): (u64, u64),
    ) -> (bool, Outcome) {
        let alg = req.algorithm;
        let params = alg.params(q);
        let peek = Step {
            now,
            cost: req.cost,
            commit: false,
            // Only the buckets reserve; the windows ignore the wait.
            wait: if alg.uses_burst() {
                req.max_wait_micros
            } else {
                0
            },
        };
        let commit = Step {
            commit: true,
            ..peek
        };
        // A peek, then the commit when it admits (as check_now steps every
        // quota); one committing step where that is the same.
        let step = |slot: &mut Option<Slot>| {
            if alg.commit_decides() {
                let outcome = alg.step_with(slot, commit, params);
                // A bucket's committing step reserves exactly the waits that
                // fit: a longer one is a denial.
                return (outcome.retry_after_micros <= commit.wait, outcome);
            }
            let outcome = alg.step_with(slot, peek, params);
            if outcome.retry_after_micros == 0 {
                (true, alg.step_with(slot, commit, params))
            } else {
                (false, outcome)
            }
        };
        if let Some(entry) = shard.map.get_mut(key) {
            let expired = entry.expires_at <= at;
            let mut slot = (!expired).then(|| std::mem::replace(&mut entry.slot, Slot::Marker));
            let (allowed, outcome) = step(&mut slot);
            // As in check_now: an admitted write sets a fresh TTL, a denial
            // keeps the old one; an empty log or a lapsed entry is dropped.
            let expires_at = if allowed {
                at + outcome.ttl_micros.max(1)
            } else {
                entry.expires_at
            };
            match slot {
                Some(slot) if expires_at > at && !matches!(&slot, Slot::Log(l) if l.is_empty()) => {
                    entry.slot = slot;
                    entry.expires_at = expires_at;
                }
                _ => {
                    shard.map.remove(key);
                }
            }
            return (allowed, outcome);
        }
        let mut slot = None;
        let (allowed, outcome) = step(&mut slot);
        if allowed {
            if let Some(slot) = slot {
                if !matches!(&slot, Slot::Log(l) if l.is_empty()) {
                    let expires_at = at + outcome.ttl_micros.max(1);
                    shard.map.insert(key.to_owned(), Entry { slot, expires_at });
                }
            }
        }
        (allowed, outcome)
    }
}

impl RateBackend for MemoryBackend {
    fn check_rate<'a>(&'a self, req: &'a RateRequest) -> BoxFuture<'a, Result<RateReply>> {
        let reply = self.check_now(req);
        async move { Ok(reply) }.boxed()
    }

    fn check_rate_now(&self, req: &RateRequest) -> Option<Result<RateReply>> {
        Some(Ok(self.check_now(req)))
    }

    fn settle_rate<'a>(&'a self, req: &'a SettleRequest) -> BoxFuture<'a, Result<SettleReply>> {
        let done = self.settle_now(req);
        async move { Ok(done) }.boxed()
    }

    fn settle_rate_now(&self, req: &SettleRequest) -> Option<Result<SettleReply>> {
        Some(Ok(self.settle_now(req)))
    }

    fn supports_leases(&self) -> bool {
        true
    }

    fn lease_rate<'a>(
        &'a self,
        req: &'a RateRequest,
        size: LeaseSize,
    ) -> BoxFuture<'a, Result<LeaseReply>> {
        let done = self.lease_now(req, size);
        async move { Ok(done) }.boxed()
    }

    fn lease_rate_now(&self, req: &RateRequest, size: LeaseSize) -> Option<Result<LeaseReply>> {
        Some(Ok(self.lease_now(req, size)))
    }

    fn local_rate(&self) -> std::sync::Arc<dyn RateBackend> {
        std::sync::Arc::new(MemoryBackend::new())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn decision_clock(&self) -> Option<std::sync::Arc<dyn crate::clock::Clock>> {
        Some(std::sync::Arc::clone(&self.inner.clock))
    }

    fn admin(&self) -> Option<std::sync::Arc<dyn crate::store::AdminBackend>> {
        Some(std::sync::Arc::new(self.clone()))
    }
}
