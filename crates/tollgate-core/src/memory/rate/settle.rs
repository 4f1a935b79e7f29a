//! The settle scripts' twin on the memory store: the marker (one settle or
//! refund per charge), each quota's settle, then the figures a check of
//! cost 0 reports — all under one shard lock, as the script is one call.

use super::super::{lock, Entry, MemoryBackend, Shard};
use super::{Settle, Slot, Twin};
use crate::quota::Quota;
use crate::store::{Algorithm, Outcomes, RateReply, SettleReply, SettleRequest};

impl MemoryBackend {
    /// `lua/settle_prelude.lua`, `lua/<alg>_settle.lua` and
    /// `lua/settle_reply.lua`, in Rust.
    pub(super) fn settle_now(&self, req: &SettleRequest) -> SettleReply {
        // The settle's time, and the store's, which entries live on.
        let (now, at) = self.times(req.now_micros, false);
        let first = req.keys.first().unwrap_or(&req.marker);
        let mut shard = lock(self.shard_for(first));
        shard.tick(at);
        let until = req.at_micros.saturating_add(req.span_micros);
        // A charge taken at or before a reset went with it (`lua/settle_prelude.lua`).
        let reset = match shard.map.get(&req.reset_stamp) {
            Some(Entry {
                slot: Slot::Reset(stamped),
                expires_at,
            }) if *expires_at > at => Some(*stamped),
            _ => None,
        };
        // A give-back refused behind later reservations writes no marker:
        // the charge stays open (`lua/gcra_settle.lua`).
        let applied = req.actual != req.cost
            && until > now
            && reset.is_none_or(|at| req.taken_micros > at)
            && shard
                .map
                .get(&req.marker)
                .is_none_or(|e| e.expires_at <= at)
            && !behind_later_ones(&shard, req, (now, at));
        if applied {
            shard.map.insert(
                req.marker.clone(),
                Entry {
                    slot: Slot::Marker,
                    // Its end on the settle's clock, as a lifetime on the store's.
                    expires_at: req
                        .at_micros
                        .saturating_add(req.marker_span_micros.max(req.span_micros))
                        .saturating_sub(now)
                        .saturating_add(at),
                },
            );
        }
        if applied {
            adjust(&mut shard, req, (now, at));
        }
        let keys = &req.keys[..req.quotas.len().min(req.keys.len())];
        let reply = peek(&mut shard, keys, &req.quotas, req.algorithm, (now, at));
        SettleReply::new(applied, reply)
    }
}

/// Whether `req` gives back on a bucket while reservations stand behind
/// its charge on some quota (only the last reservation may give itself
/// back): then it gives nothing (as `lua/gcra_settle.lua` and
/// `lua/token_bucket_settle.lua` say why).
fn behind_later_ones(shard: &Shard, req: &SettleRequest, (now, at): (u64, u64)) -> bool {
    if req.actual >= req.cost {
        return false;
    }
    req.keys.iter().zip(req.quotas.iter()).any(|(key, q)| {
        let Some(Entry {
            slot: Slot::At(t),
            expires_at,
        }) = shard.map.get(key)
        else {
            return false;
        };
        if *expires_at <= at {
            return false;
        }
        let (size, iv) = req.algorithm.params(q);
        let per = iv.per_micro;
        let ahead = i128::from(req.at_micros.saturating_sub(now)) * i128::from(per);
        let end = t.rel(now, per);
        match req.algorithm {
            Algorithm::Gcra => end > ahead + i128::from(size) * i128::from(iv.ticks),
            Algorithm::TokenBucket => end > ahead,
            _ => false,
        }
    })
}

/// Each quota's settle on its live entry (a debt on no entry starts one).
fn adjust(shard: &mut Shard, req: &SettleRequest, (now, at): (u64, u64)) {
    for (i, (key, q)) in req.keys.iter().zip(req.quotas.iter()).enumerate() {
        let s = Settle {
            now,
            at: req.at_micros,
            cost: req.cost,
            actual: req.actual,
            debt: req.max_debt.unwrap_or_else(|| req.algorithm.capacity(q)),
            span: req
                .quota_spans_micros
                .get(i)
                .copied()
                .unwrap_or(req.span_micros),
        };
        let live = shard.map.get(key).is_some_and(|e| e.expires_at > at);
        let mut slot = if live {
            shard
                .map
                .get_mut(key)
                .map(|e| std::mem::replace(&mut e.slot, Slot::Marker))
        } else {
            None
        };
        let ttl = req.algorithm.settle(&mut slot, s, q);
        match slot {
            Some(slot) if !matches!(&slot, Slot::Log(l) if l.is_empty()) => {
                let expires_at = match (ttl, shard.map.get(key)) {
                    (Some(ttl), _) => at + ttl.max(1),
                    (None, Some(e)) if live => e.expires_at,
                    // A rewrite that keeps its TTL needs a live entry.
                    _ => continue,
                };
                shard.map.insert(key.clone(), Entry { slot, expires_at });
            }
            _ => {
                shard.map.remove(key);
            }
        }
    }
}

/// A check of cost 0 on `keys`, as `check_now` makes it: every quota
/// peeked, then, when all admit, each committed (a cost of 0 takes nothing
/// but may refresh a TTL, as the script's write does).
fn peek(
    shard: &mut Shard,
    keys: &[String],
    quotas: &[Quota],
    alg: Algorithm,
    (now, at): (u64, u64),
) -> RateReply {
    let mut slots: Vec<(Option<Slot>, u64)> = keys
        .iter()
        .map(|k| match shard.map.get_mut(k) {
            Some(e) if e.expires_at > at => (
                Some(std::mem::replace(&mut e.slot, Slot::Marker)),
                e.expires_at,
            ),
            _ => (None, 0),
        })
        .collect();
    let mut outcomes: Outcomes = slots
        .iter_mut()
        .zip(quotas)
        .map(|((slot, _), q)| alg.step(slot, now, 0, q, false))
        .collect();
    let allowed = outcomes.iter().all(|o| o.retry_after_micros == 0);
    if allowed {
        outcomes = slots
            .iter_mut()
            .zip(quotas)
            .map(|((slot, _), q)| alg.step(slot, now, 0, q, true))
            .collect();
    }
    for ((key, (slot, old_expiry)), outcome) in keys.iter().zip(slots).zip(&outcomes) {
        let expires_at = if allowed {
            at + outcome.ttl_micros.max(1)
        } else {
            old_expiry
        };
        match slot {
            Some(slot) if expires_at > at && !matches!(&slot, Slot::Log(l) if l.is_empty()) => {
                shard.map.insert(key.clone(), Entry { slot, expires_at });
            }
            _ => {
                shard.map.remove(key);
            }
        }
    }
    RateReply::new(allowed, outcomes).at(now)
}
