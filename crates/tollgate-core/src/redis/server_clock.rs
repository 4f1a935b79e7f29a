//! [`ServerClock`]: where the Redis server's clock stands against this
//! process's monotonic clock, learned from the `now` every rate-limit reply
//! carries, so a check can tell the server until when it may still be
//! decided.
//!
//! Anchored to the monotonic clock, a step of this host's wall clock changes
//! nothing. Every sample is the offset less the reply's travel (the server
//! read its clock before the reply came back), so the largest sample is the
//! closest; the estimate can only err late (a later deadline, a weaker
//! guard), never early (a healthy check refused as late). On a cluster the
//! fastest node sets it. A server whose clock steps back is followed within
//! two windows: the estimate is the largest sample of the current and the
//! previous window.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// No reply seen yet.
const UNKNOWN: i64 = i64::MIN;
/// How long a window of samples lasts.
const WINDOW: Duration = Duration::from_secs(60);

/// The server's clock minus this process's monotonic clock (µs), from replies.
#[derive(Debug)]
pub(crate) struct ServerClock {
    origin: Instant,
    /// How long a window of samples lasts (µs).
    window_micros: u64,
    /// The largest sample of the previous window.
    previous: AtomicI64,
    /// The largest sample of the current window.
    current: AtomicI64,
    /// When the current window started (µs since `origin`).
    window: AtomicU64,
}

impl Default for ServerClock {
    fn default() -> Self {
        ServerClock {
            origin: Instant::now(),
            window_micros: WINDOW.as_micros() as u64,
            previous: AtomicI64::new(UNKNOWN),
            current: AtomicI64::new(UNKNOWN),
            window: AtomicU64::new(0),
        }
    }
}

impl ServerClock {
    fn local_micros(&self, at: Instant) -> i64 {
        let since = at.saturating_duration_since(self.origin);
        i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
    }

    /// A reply decided at `server_micros` arrived now.
    pub(crate) fn observe(&self, server_micros: u64) {
        let Ok(server) = i64::try_from(server_micros) else {
            return;
        };
        let now = self.local_micros(Instant::now());
        let sample = server - now;
        let started = self.window.load(Ordering::Relaxed);
        let age = u64::try_from(now).unwrap_or(0).saturating_sub(started);
        if age >= self.window_micros
            && self
                .window
                .compare_exchange(started, now as u64, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let ended = self.current.swap(sample, Ordering::Relaxed);
            self.previous.store(ended, Ordering::Relaxed);
            return;
        }
        self.current.fetch_max(sample, Ordering::Relaxed);
    }

    /// `at` on the server's clock (µs), once a reply has been seen.
    pub(crate) fn server_micros(&self, at: Instant) -> Option<u64> {
        let offset = self
            .current
            .load(Ordering::Relaxed)
            .max(self.previous.load(Ordering::Relaxed));
        if offset == UNKNOWN {
            return None;
        }
        u64::try_from(self.local_micros(at).saturating_add(offset)).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_now(c: &ServerClock, ahead: i64) -> u64 {
        (c.local_micros(Instant::now()) + ahead) as u64
    }

    #[test]
    fn an_instant_maps_onto_the_servers_clock() {
        let c = ServerClock::default();
        let soon = Instant::now() + Duration::from_millis(100);
        assert_eq!(c.server_micros(soon), None, "nothing learned yet");
        // A server 10 s ahead; a reply that took 5 ms says less and changes
        // nothing, nor does one that took a second (a stalled process).
        let ahead = 10_000_000;
        c.observe(server_now(&c, ahead));
        c.observe(server_now(&c, ahead - 5_000));
        c.observe(server_now(&c, ahead - 1_000_000));
        let at = c.server_micros(soon).unwrap() as i64;
        let expected = c.local_micros(soon) + ahead;
        assert!(
            expected - at >= 0 && expected - at < 50_000,
            "{at} vs {expected}"
        );
    }

    #[test]
    fn a_server_clock_stepping_back_is_followed_within_two_windows() {
        let c = ServerClock {
            window_micros: 1_000,
            ..ServerClock::default()
        };
        c.observe(server_now(&c, 60_000_000));
        // The server's clock steps back a minute: two windows of the lower
        // samples later, they stand.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(2));
            c.observe(server_now(&c, 0));
        }
        let at = c.server_micros(Instant::now()).unwrap() as i64;
        assert!(at < c.local_micros(Instant::now()) + 1_000_000, "{at}");
    }
}
