//! Free loopback port selection, safe across threads and processes.
//!
//! Every process starts at a random base in `20000..50000` and walks a
//! process-wide atomic counter from there, so parallel threads never get the
//! same candidate and parallel processes (cargo-nextest) are very unlikely to.
//! A candidate is only used if both the port and its cluster bus port
//! (`port + 10000`) can be bound on 127.0.0.1 right now; the remaining race
//! (someone binds it before redis-server does) is handled by the caller, which
//! retries on another port.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lowest port handed out.
const LOW: u32 = 20_000;
/// One past the highest port handed out: keeps `port + 10000` (cluster bus) a
/// valid port.
const HIGH: u32 = 55_535;
/// Random base offsets are drawn from `LOW..LOW + BASE_SPAN` (i.e. 20000..50000).
const BASE_SPAN: u32 = 30_000;
/// Candidates tried before giving up.
const MAX_CANDIDATES: u32 = 500;

static COUNTER: AtomicU32 = AtomicU32::new(0);
static BASE: OnceLock<u32> = OnceLock::new();

/// Offset (from `LOW`) of this process's first candidate.
fn base() -> u32 {
    *BASE.get_or_init(|| {
        // RandomState is seeded from the OS; mix in time and pid as well.
        let mut hasher = RandomState::new().build_hasher();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        (hasher.finish() % u64::from(BASE_SPAN)) as u32
    })
}

/// The `n`-th candidate port of this process.
fn candidate(n: u32) -> u16 {
    let span = HIGH - LOW;
    let port = LOW + (base().wrapping_add(n)) % span;
    u16::try_from(port).expect("port range fits in u16")
}

/// Whether `port` can be bound on 127.0.0.1 right now.
pub(crate) fn can_bind(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Whether `port` and its cluster bus port `port + 10000` are both free.
pub(crate) fn is_free(port: u16) -> bool {
    port.checked_add(10_000).is_some_and(can_bind) && can_bind(port)
}

/// Returns a port that is currently free together with its bus port.
pub(crate) fn next_free_port() -> Option<u16> {
    (0..MAX_CANDIDATES)
        .map(|_| candidate(COUNTER.fetch_add(1, Ordering::Relaxed)))
        .find(|&port| is_free(port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_stay_in_range() {
        for n in [0, 1, 29_999, 35_534, 35_535, u32::MAX - 1, u32::MAX] {
            let port = u32::from(candidate(n));
            assert!((LOW..HIGH).contains(&port), "{port}");
            assert!(port + 10_000 <= 65_535, "{port}");
        }
    }

    #[test]
    fn free_port_is_bindable_and_taken_port_is_not() {
        // Another process (or an outgoing connection's ephemeral port) may
        // take a free port at any moment, as callers know: a few tries.
        let (port, _hold) = (0..20)
            .find_map(|_| {
                let port = next_free_port()?;
                let hold = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()?;
                Some((port, hold))
            })
            .expect("a port that was free could be bound");
        assert!(!is_free(port));
        assert!(!can_bind(port));
    }
}
