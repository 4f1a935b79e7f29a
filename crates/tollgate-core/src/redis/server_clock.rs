//! [`ServerClock`]: where this process's wall clock stands against the Redis
//! server's, learned from the `now` every rate-limit reply carries, so a
//! check can tell the server until when it may still be decided.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// No reply seen yet.
const UNKNOWN: i64 = i64::MIN;
/// A sample this far below the estimate is a clock step, not a slow reply.
const STEP_MICROS: i64 = 1_000_000;

/// The server's clock minus this process's wall clock (µs), from replies.
#[derive(Debug)]
pub(crate) struct ServerClock {
    offset: AtomicI64,
}

impl Default for ServerClock {
    fn default() -> Self {
        ServerClock {
            offset: AtomicI64::new(UNKNOWN),
        }
    }
}

fn wall_micros() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

impl ServerClock {
    /// A reply decided at `server_micros` arrived now. The server decided
    /// before its reply came, so each sample is the offset less the reply's
    /// travel: the largest is the closest. One far lower is a clock step.
    pub(crate) fn observe(&self, server_micros: u64) {
        let Ok(server) = i64::try_from(server_micros) else {
            return;
        };
        let sample = server - wall_micros();
        let current = self.offset.load(Ordering::Relaxed);
        if current == UNKNOWN || sample > current || sample < current - STEP_MICROS {
            self.offset.store(sample, Ordering::Relaxed);
        }
    }

    /// `at` on the server's clock (µs), once a reply has been seen. Never
    /// later than the server's own reading of that instant: the offset is
    /// underestimated by a reply's travel, if anything.
    pub(crate) fn server_micros(&self, at: Instant) -> Option<u64> {
        let offset = self.offset.load(Ordering::Relaxed);
        if offset == UNKNOWN {
            return None;
        }
        let ahead = at.saturating_duration_since(Instant::now());
        let ahead = i64::try_from(ahead.as_micros()).unwrap_or(i64::MAX);
        let micros = wall_micros().saturating_add(ahead).saturating_add(offset);
        u64::try_from(micros).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_instant_maps_onto_the_servers_clock() {
        let c = ServerClock::default();
        let soon = Instant::now() + Duration::from_millis(100);
        assert_eq!(c.server_micros(soon), None, "nothing learned yet");
        // A server 10 s ahead; a slower reply says less and changes nothing.
        let ahead = 10_000_000;
        c.observe((wall_micros() + ahead) as u64);
        c.observe((wall_micros() + ahead - 5_000) as u64);
        let at = c.server_micros(soon).unwrap() as i64;
        let expected = wall_micros() + ahead + 100_000;
        assert!((expected - at).abs() < 50_000, "{at} vs {expected}");
        // The server's clock stepped back a minute: believed at once.
        c.observe((wall_micros() - 60_000_000) as u64);
        let at = c.server_micros(soon).unwrap() as i64;
        assert!(at < wall_micros(), "{at}");
    }
}
