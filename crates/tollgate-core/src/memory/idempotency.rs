//! The Rust twin of `lua/idem_*.lua` for the memory backend: the same
//! records and leases, timed by the backend's clock (µs), and the records
//! in flight listed as `lua/idem_in_flight.lua` reads each one.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::state::{micros, Holder, MemoryLocks, Record};
use super::MemoryBackend;
use crate::error::Result;
use crate::store::{
    parse_record_key, AcquireRequest, ClaimReply, ClaimRequest, FencingToken, IdempotencyBackend,
    InFlightRecord, RecordKeys, StoredResponse,
};

impl MemoryLocks {
    fn claim(&self, req: &ClaimRequest, now: u64) -> ClaimReply {
        let mut guard = self.lock();
        let state = &mut *guard;
        MemoryLocks::sweep(state, now);
        let fingerprint = req.fingerprint.to_hex();
        let record = state
            .records
            .get(&req.keys.record)
            .filter(|r| r.expires_at > now);
        let same_payload = record.is_none_or(|r| r.fingerprint == fingerprint);
        if let Some(response) = record.and_then(|r| r.done.clone()) {
            return ClaimReply::Completed {
                same_payload,
                response,
            };
        }
        let own_fence = record.map(|r| r.fence);
        match MemoryLocks::live(state, &req.keys.lease.lock, now) {
            Some(h) if h.token != req.token => {
                return ClaimReply::InFlight {
                    same_payload,
                    pttl: Some(Duration::from_micros(h.expires_at - now)),
                }
            }
            // A retried claim finds its own lease.
            Some(_) => {
                if let Some(fence) = own_fence {
                    return ClaimReply::Claimed {
                        fence: FencingToken(fence),
                    };
                }
            }
            None => {
                state.held.insert(
                    req.keys.lease.lock.clone(),
                    Holder {
                        token: req.token.clone(),
                        expires_at: now.saturating_add(micros(req.ttl)),
                        // As idem_claim.lua: the lease's value is the bare token.
                        who: None,
                    },
                );
            }
        }
        let lease = AcquireRequest::new(
            req.keys.lease.clone(),
            req.token.clone(),
            req.ttl,
            req.fence_ttl,
        );
        let fence = MemoryLocks::next_fence(state, &lease, now);
        state.records.insert(
            req.keys.record.clone(),
            Record {
                fingerprint,
                fence: fence.get(),
                claimed_at: now,
                done: None,
                expires_at: now.saturating_add(micros(req.record_ttl)),
            },
        );
        ClaimReply::Claimed { fence }
    }

    /// Every record under `prefix` in flight at `now`: not completed, its
    /// lease live.
    fn in_flight(&self, prefix: &str, now: u64) -> Vec<InFlightRecord> {
        let state = self.lock();
        let mut out = Vec::new();
        for (key, r) in &state.records {
            let Some((name, subject)) = parse_record_key(prefix, key) else {
                continue;
            };
            if r.done.is_some() || r.expires_at <= now {
                continue;
            }
            let lease = key.strip_suffix(":record").unwrap_or(key);
            let Some(h) = state.held.get(lease).filter(|h| h.expires_at > now) else {
                continue;
            };
            let ttl = Duration::from_micros(h.expires_at - now);
            let mut record = InFlightRecord::new(name, subject, r.fence, ttl);
            record.held = Some(Duration::from_micros(now.saturating_sub(r.claimed_at)));
            out.push(record);
        }
        out
    }
}

impl IdempotencyBackend for MemoryBackend {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<ClaimReply>> {
        let reply = self.locks().claim(request, self.clock().now_micros());
        futures_util::future::ready(Ok(reply)).boxed()
    }

    fn complete<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
        response: &'a StoredResponse,
        record_ttl: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        let now = self.clock().now_micros();
        let locks = self.locks();
        // As idem_complete.lua: the record's fence alone decides (a claim
        // sets it with the lease); the lease goes only if still this token's.
        let stored = {
            let mut guard = locks.lock();
            let state = &mut *guard;
            let Some(r) = state
                .records
                .get_mut(&keys.record)
                .filter(|r| r.expires_at > now && r.fence == fence.get())
            else {
                return futures_util::future::ready(Ok(false)).boxed();
            };
            if r.done.is_some() {
                // A replay of a complete that stored.
                return futures_util::future::ready(Ok(true)).boxed();
            }
            r.done = Some(response.clone());
            r.expires_at = now.saturating_add(micros(record_ttl));
            if MemoryLocks::live(state, &keys.lease.lock, now).is_some_and(|h| h.token == token) {
                state.held.remove(&keys.lease.lock);
            }
            true
        };
        if stored {
            locks.notify(&keys.lease.channel);
        }
        futures_util::future::ready(Ok(stored)).boxed()
    }

    fn abandon<'a>(
        &'a self,
        keys: &'a RecordKeys,
        token: &'a str,
        fence: FencingToken,
    ) -> BoxFuture<'a, Result<bool>> {
        let now = self.clock().now_micros();
        let mut held = false;
        let locks = self.locks();
        {
            let mut guard = locks.lock();
            let state = &mut *guard;
            if MemoryLocks::live(state, &keys.lease.lock, now).is_some_and(|h| h.token == token) {
                held = true;
                if state
                    .records
                    .get(&keys.record)
                    .is_some_and(|r| r.fence == fence.get())
                {
                    state.records.remove(&keys.record);
                }
                state.held.remove(&keys.lease.lock);
            }
        }
        if held {
            locks.notify(&keys.lease.channel);
        }
        futures_util::future::ready(Ok(held)).boxed()
    }

    fn records_in_flight<'a>(
        &'a self,
        prefix: &'a str,
    ) -> BoxFuture<'a, Result<Vec<InFlightRecord>>> {
        let records = self.locks().in_flight(prefix, self.clock().now_micros());
        futures_util::future::ready(Ok(records)).boxed()
    }
}
