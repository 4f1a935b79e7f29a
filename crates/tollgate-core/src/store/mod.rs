//! The store traits: what a capability asks of the place its state lives,
//! and the requests and replies the two sides exchange.
//!
//! [`RedisBackend`](crate::RedisBackend) answers each with one Lua script on
//! Redis (standalone, Sentinel, Cluster); [`MemoryBackend`](crate::MemoryBackend)
//! with the scripts' Rust twins in this process; [`Backend`](crate::Backend)
//! is either, chosen at run time. The same behaviour suite runs against every
//! store.

mod admin;
mod fence;
mod holders;
mod idempotency;
mod lock;
mod quotas;
mod rate;

pub use self::admin::{AdminBackend, AdminListener, DenialCount, ALIVE, EVERYTHING, VERSION_POLL};
pub(crate) use self::admin::{Listeners, ACTION_TIMEOUT};
pub use self::holders::LockHolder;
pub(crate) use self::holders::{parse_description, parse_lock_key};
pub(crate) use self::idempotency::parse_record_key;
pub use self::idempotency::{
    ClaimReply, ClaimRequest, Fingerprint, IdempotencyBackend, InFlightRecord, RecordKeys,
    StoredResponse,
};
pub(crate) use self::lock::{millis_ceil, shape};
pub use self::lock::{
    AcquireReply, AcquireRequest, FencingToken, Holders, LockBackend, LockKeys, ReleaseEvent,
    ReleaseEvents,
};
pub use self::quotas::Quotas;
pub use self::rate::{
    Algorithm, LeaseReply, LeaseSize, Outcome, Outcomes, RateBackend, RateReply, RateRequest,
    SettleReply, SettleRequest, Unclaimed,
};
