//! Property tests of [`Quota`] arithmetic.
//!
//! - `Quota::new` never panics: any limit and any `Duration` give a quota
//!   or an error, and an error exactly for what the docs refuse (a zero
//!   limit, a period under 1 µs, over ten years or not a whole number of
//!   microseconds, more than one per microsecond, a span past 2^50 µs);
//! - an accepted quota keeps its figures (limit, period, burst = limit
//!   unless set);
//! - the emission interval is the period over the limit rounded **up** to
//!   whole microseconds (never a faster rate), so `interval × limit` is the
//!   period plus less than one microsecond per unit;
//! - `with_burst` never panics, refuses 0 and spans past 2^50 µs, and
//!   changes nothing but the burst;
//! - the literal constructors agree with `Quota::new` over their whole
//!   valid range.
//!
//! Case count: proptest's default (256), or `PROPTEST_CASES`.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_core::Quota;

const TEN_YEARS_US: u128 = 10 * 365 * 24 * 3600 * 1_000_000;
const MAX_SPAN_US: u128 = 1 << 50;

/// Limits: small, near a period's microseconds, or anything.
fn limit() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..1_000, 0u64..3, any::<u64>(), 999_000u64..1_001_000]
}

/// Periods: sub-microsecond to beyond ten years, whole seconds often.
fn period() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..100_000, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..400_000_000).prop_map(Duration::from_secs),
        (0u64..5_000).prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_micros),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// What the docs accept, computed in 128 bits.
fn accepted(limit: u64, period: Duration, burst: Option<u64>) -> bool {
    let (limit, us) = (u128::from(limit), period.as_micros());
    // Whole microseconds only: truncating would change the rate.
    if !period.subsec_nanos().is_multiple_of(1000) {
        return false;
    }
    if limit == 0 || us == 0 || us > TEN_YEARS_US || limit > us {
        return false;
    }
    let interval = us.div_ceil(limit);
    let burst = burst.map_or(limit, u128::from);
    burst > 0 && burst * interval <= MAX_SPAN_US
}

proptest! {
    /// Never a panic; an error exactly for what the docs refuse; the
    /// figures kept; the interval rounded up.
    #[test]
    fn new_is_total_and_keeps_its_figures(limit in limit(), period in period()) {
        let q = Quota::new(limit, period);
        prop_assert_eq!(q.is_ok(), accepted(limit, period, None), "{} per {:?}", limit, period);
        let Ok(q) = q else { return Ok(()) };
        let us = u64::try_from(period.as_micros()).unwrap();
        prop_assert_eq!(q.limit(), limit);
        prop_assert_eq!(q.period_micros(), us);
        prop_assert_eq!(q.period(), Duration::from_micros(us));
        prop_assert_eq!(q.burst(), limit);
        prop_assert!(!q.has_explicit_burst());

        let interval = q.interval_micros();
        prop_assert!(interval >= 1);
        let total = u128::from(interval) * u128::from(limit);
        // Never faster than the quota: limit intervals cover the period...
        prop_assert!(total >= u128::from(us), "{} × {} < {}", interval, limit, us);
        // ...by less than one microsecond per unit (whole-µs rounding).
        prop_assert!(total < u128::from(us) + u128::from(limit), "{} × {} ≫ {}", interval, limit, us);
    }

    /// `with_burst` never panics, refuses 0 and spans past 2^50 µs, and
    /// changes the burst only.
    #[test]
    fn bursts(limit in 1u64..100_000, secs in 1u64..100_000, burst in prop_oneof![0u64..1_000, any::<u64>()]) {
        let period = Duration::from_secs(secs);
        let Ok(base) = Quota::new(limit, period) else {
            prop_assert!(!accepted(limit, period, None));
            return Ok(());
        };
        let q = base.with_burst(burst);
        prop_assert_eq!(q.is_ok(), accepted(limit, period, Some(burst)), "burst {}", burst);
        if let Ok(q) = q {
            prop_assert_eq!(q.burst(), burst);
            prop_assert!(q.has_explicit_burst());
            prop_assert_eq!(q.limit(), base.limit());
            prop_assert_eq!(q.period(), base.period());
            prop_assert_eq!(q.interval_micros(), base.interval_micros());
        }
    }

    /// `per_second(n)` is `n` per second (not one per `n` seconds), and the
    /// other literals agree with `Quota::new` likewise.
    #[test]
    fn literals_agree_with_new(n in 1u64..=1_000_000, m in 1u64..=60_000_000, h in 1u64..=3_600_000_000u64, d in 1u64..=86_400_000_000u64) {
        prop_assert_eq!(Quota::per_second(n), Quota::new(n, Duration::from_secs(1)).unwrap());
        prop_assert_eq!(Quota::per_second(n).limit(), n);
        prop_assert_eq!(Quota::per_minute(m), Quota::new(m, Duration::from_secs(60)).unwrap());
        prop_assert_eq!(Quota::per_hour(h), Quota::new(h, Duration::from_secs(3600)).unwrap());
        prop_assert_eq!(Quota::per_day(d), Quota::new(d, Duration::from_secs(86_400)).unwrap());
    }
}
