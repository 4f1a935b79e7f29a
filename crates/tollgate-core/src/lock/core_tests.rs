//! Unit tests of `core.rs`.

use super::*;
use crate::lock::settings::DEFAULT_FENCE_TTL;
use crate::MemoryBackend;

fn core(redlock: bool, n: usize) -> Core {
    let backends = (0..n)
        .map(|_| Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>)
        .collect();
    Core::new(backends, redlock, Settings::default()).unwrap()
}

#[test]
fn durations_are_bounded() {
    let c = core(false, 1);
    assert!(c.instances.check_ttl(MAX_LOCK_DURATION).is_ok());
    for ttl in [MAX_LOCK_DURATION + Duration::from_millis(1), Duration::MAX] {
        assert!(matches!(
            c.instances.check_ttl(ttl),
            Err(Error::InvalidConfig(_))
        ));
        assert!(c.first_ttl(&LockOptions::new().ttl(ttl)).is_err());
        assert!(c
            .first_ttl(&LockOptions::new().max_hold(ttl).ttl(Duration::from_secs(1)))
            .is_err());
    }
    assert!(c
        .first_ttl(&LockOptions::new().max_hold(Duration::ZERO))
        .is_err());
    let now = Instant::now();
    assert_eq!(
        instant_after(now, Duration::from_secs(1)),
        now + Duration::from_secs(1)
    );
    // Never a panic, and never earlier than a year on.
    assert!(instant_after(now, Duration::MAX) >= now + MAX_LOCK_DURATION);
}

/// A fair name's waiters try again at least every FAIR_REFRESH, whatever
/// the poll interval, so a waiter that died at the head of the queue holds
/// the others back for seconds: its ticket's TTL follows.
#[test]
fn a_fair_waiters_ticket_lives_seconds_whatever_the_poll() {
    for poll in [
        Duration::from_secs(1),
        Duration::from_secs(3600),
        Duration::MAX,
    ] {
        let settings = Settings {
            fair: true,
            poll_interval: poll,
            ..Settings::default()
        };
        let one = vec![Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>];
        let c = Core::new(one, false, settings).unwrap();
        let most = (poll.min(FAIR_REFRESH) + c.instances.timeout) * 2;
        assert_eq!(c.ticket_ttl(), most, "{poll:?}");
        for _ in 0..20 {
            assert!(c.pause(None) <= FAIR_REFRESH, "{poll:?}");
            // Nor does a run of errors put it to sleep past its ticket.
            assert!(c.error_backoff(u32::MAX) <= FAIR_REFRESH, "{poll:?}");
        }
    }
}

#[test]
fn fence_keys_live_an_hour_and_at_least_ten_ttls() {
    let c = core(false, 1);
    assert_eq!(DEFAULT_FENCE_TTL, Duration::from_secs(3600));
    assert_eq!(c.fence_ttl_for(Duration::from_secs(30)), DEFAULT_FENCE_TTL);
    assert_eq!(
        c.fence_ttl_for(Duration::from_secs(600)),
        Duration::from_secs(6000)
    );
    assert_eq!(
        c.fence_ttl_for(MAX_LOCK_DURATION),
        MAX_LOCK_DURATION * FENCE_TTL_TTLS
    );
    assert_eq!(c.fence_ttl_for(Duration::MAX), Duration::MAX);
}

#[test]
fn settings_are_checked() {
    let one = || vec![Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>];
    let bad = [
        Settings {
            drift_ratio: f64::NAN,
            ..Settings::default()
        },
        Settings {
            timeout: Duration::ZERO,
            ..Settings::default()
        },
        Settings {
            fence_ttl: Duration::from_millis(10),
            ..Settings::default()
        },
        Settings {
            fence_ttl: Duration::MAX,
            ..Settings::default()
        },
        Settings {
            defaults: LockOptions::new().ttl(Duration::MAX),
            ..Settings::default()
        },
        Settings {
            defaults: LockOptions::new().ttl(Duration::from_millis(1)),
            ..Settings::default()
        },
        Settings {
            prefix: "a b".into(),
            ..Settings::default()
        },
    ];
    for s in bad {
        assert!(Core::new(one(), false, s.clone()).is_err(), "{s:?}");
    }
    assert!(Core::new(Vec::new(), true, Settings::default()).is_err());
}

#[test]
fn error_backoff_grows_to_the_poll_interval() {
    let c = core(false, 1);
    for _ in 0..100 {
        let first = c.error_backoff(1);
        assert!(first >= Duration::from_millis(5) && first <= ERROR_BACKOFF_START);
        let p = c.error_backoff(3);
        assert!(p >= Duration::from_millis(20) && p <= Duration::from_millis(40));
        for n in [30, u32::MAX] {
            let p = c.error_backoff(n);
            assert!(p >= c.poll_interval / 2 && p <= c.poll_interval, "{p:?}");
        }
    }
    assert!(is_outage(&Error::Timeout(Duration::from_millis(1))));
    assert!(is_outage(&Error::CircuitOpen));
    assert!(is_outage(&Error::Backend(crate::BackendError::outage(
        "down"
    ))));
    assert!(!is_outage(&Error::Backend(crate::BackendError::new(
        "WRONGTYPE"
    ))));
    assert!(!is_outage(&Error::InvalidConfig(String::new())));
}

#[test]
fn pauses_are_bounded() {
    for _ in 0..100 {
        let p = split_pause(Duration::from_millis(10));
        assert!(p >= Duration::from_millis(1) && p <= Duration::from_millis(41));
    }
    let c = core(false, 1);
    for _ in 0..100 {
        // No subscription yet: short polls, bounded by the holder's PTTL.
        let p = c.pause(None);
        assert!(p <= POLL_WITHOUT_PUBSUB && p >= POLL_WITHOUT_PUBSUB / 2);
        let p = c.pause(Some(Duration::from_millis(3)));
        assert!(p <= Duration::from_millis(6), "{p:?}");
    }
}
