//! [`Quota`]: how much per how long, with an optional burst.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// Largest period a quota may have (ten years); keeps every figure exact in
/// Lua's doubles.
pub(crate) const MAX_PERIOD_MICROS: u64 = 10 * 365 * 24 * 3600 * 1_000_000;
/// Largest product of capacity and interval, in microseconds (2^50): scripts
/// add costs to microsecond timestamps (~2^51 today) and must stay below 2^53.
const MAX_SPAN_MICROS: u64 = 1 << 50;
/// Largest span of a bucket (token bucket, GCRA) in its own units, the
/// `1/per_micro` µs of [`Quota::interval_fraction`]: the scripts' schedule
/// arithmetic stays exact in Lua's doubles (2^53) with a cost's worth of
/// headroom, and their divisions stay exact below 2^52.
const MAX_SPAN_TICKS: u64 = 1 << 50;

/// Greatest common divisor (Euclid), `const` for the literal constructors.
const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

/// How much per how long: `Quota::per_second(10)` is **ten per second**.
///
/// The burst (used by the token bucket and GCRA) is how many can be taken at
/// once from a full bucket; it defaults to the limit.
///
/// # Precision
///
/// Rates are exact: every algorithm admits `limit` per `period` over any
/// long span, however the two divide. The windows count whole units per
/// whole period. The token bucket and GCRA keep the emission interval
/// `period / limit` as an exact fraction (reduced: 3 per 7 µs is one per
/// 7/3 µs) and their state as a whole microsecond plus a fraction of one, so
/// `Quota::per_second(999_999)` admits 999 999 per second, not the 500 000 a
/// rounded 2 µs interval would. Their figures (`reset_after`, `retry_after`,
/// `next_after`) are rounded **up** to whole microseconds: a client that
/// waits that long is admitted.
///
/// What cannot be kept exact is refused, never rounded:
/// - a period that is not a whole number of microseconds
///   ([`Quota::new`] errs; the literal constructors always are);
/// - for the token bucket and GCRA only, a burst whose span in the
///   fraction's units (`burst × period / gcd(limit, period)`, the period in
///   µs) passes 2^50, where Lua's doubles would stop being exact: building
///   the limiter errs ([`Error::InvalidQuota`]) and names the largest burst
///   that fits. Limits that share factors with the period's microseconds
///   (10, 1000, 3600 …) are never near it; 1 000 003 (a prime) per day is,
///   with its default burst.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let q = Quota::per_second(10);
/// assert_eq!(q.limit(), 10);
/// assert_eq!(q.period(), Duration::from_secs(1));
/// assert_eq!(q.burst(), 10);
///
/// // A bucket of 5 that refills one every 2 seconds.
/// let q = Quota::new(1, Duration::from_secs(2)).unwrap().with_burst(5).unwrap();
/// assert_eq!(q.burst(), 5);
///
/// // Runtime values go through the fallible constructor.
/// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period_us: u64,
    burst: Option<u64>,
}

impl Quota {
    /// `limit` per `period`.
    pub fn new(limit: u64, period: Duration) -> Result<Self> {
        if limit == 0 {
            return Err(Error::InvalidQuota(
                "a limit of zero admits nothing; use at least 1".into(),
            ));
        }
        let period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        // Truncating the nanoseconds would quietly change the rate.
        if !period.subsec_nanos().is_multiple_of(1000) {
            return Err(Error::InvalidQuota(format!(
                "the period {period:?} is not a whole number of microseconds"
            )));
        }
        if period_us == 0 {
            return Err(Error::InvalidQuota(
                "the period must be at least one microsecond".into(),
            ));
        }
        if period_us > MAX_PERIOD_MICROS {
            return Err(Error::InvalidQuota(format!(
                "the period {period:?} is longer than ten years"
            )));
        }
        if limit > period_us {
            return Err(Error::InvalidQuota(format!(
                "{limit} per {period:?} is finer than one per microsecond"
            )));
        }
        let q = Quota {
            limit,
            period_us,
            burst: None,
        };
        q.check_span()?;
        Ok(q)
    }

    /// `n` per `period_us` microseconds, for the literal constructors: the
    /// same rules as [`Quota::new`], but a panic instead of an error, so a
    /// bad literal in a `const` is a compile error. `too_fine` is the message
    /// for `n > period_us` (a `const` panic cannot format numbers).
    const fn literal(n: u64, period_us: u64, too_fine: &'static str) -> Quota {
        if n == 0 {
            panic!("a quota of zero admits nothing; use at least 1 (Quota::new(0, ..) is the fallible form)");
        }
        if n > period_us {
            panic!("{}", too_fine);
        }
        // Cannot fail for these periods (at most a day), but the rule is the
        // same as `check_span`'s, so keep it checked here too.
        match n.checked_mul(period_us.div_ceil(n)) {
            Some(span) if span <= MAX_SPAN_MICROS => {}
            _ => panic!("the quota spans more than 2^50 µs"),
        }
        Quota {
            limit: n,
            period_us,
            burst: None,
        }
    }

    /// `n` per second. Infallible for a valid `n`, and usable in `const`:
    ///
    /// ```
    /// use tollgate::Quota;
    ///
    /// const API: Quota = Quota::per_second(10);
    /// assert_eq!(API.limit(), 10);
    /// ```
    ///
    /// # Panics
    ///
    /// When `n` is 0 or above 1 000 000 (finer than one per microsecond); in
    /// a `const` that is a compile error. Use [`Quota::new`] for values known
    /// only at run time:
    ///
    /// ```compile_fail
    /// const NONE: tollgate::Quota = tollgate::Quota::per_second(0);
    /// ```
    pub const fn per_second(n: u64) -> Quota {
        Self::literal(
            n,
            1_000_000,
            "more than 1 000 000 per second is finer than one per microsecond",
        )
    }

    /// `n` per minute; see [`Quota::per_second`] (`const`, panics on 0 or on
    /// more than 60 000 000).
    pub const fn per_minute(n: u64) -> Quota {
        Self::literal(
            n,
            60 * 1_000_000,
            "more than 60 000 000 per minute is finer than one per microsecond",
        )
    }

    /// `n` per hour; see [`Quota::per_second`] (`const`, panics on 0 or on
    /// more than 3 600 000 000).
    pub const fn per_hour(n: u64) -> Quota {
        Self::literal(
            n,
            3600 * 1_000_000,
            "more than 3 600 000 000 per hour is finer than one per microsecond",
        )
    }

    /// `n` per day; see [`Quota::per_second`] (`const`, panics on 0 or on
    /// more than 86 400 000 000).
    pub const fn per_day(n: u64) -> Quota {
        Self::literal(
            n,
            86_400 * 1_000_000,
            "more than 86 400 000 000 per day is finer than one per microsecond",
        )
    }

    /// Allow up to `burst` at once (token bucket capacity; GCRA burst). Only
    /// the token bucket and GCRA use it; window limiters refuse it.
    pub fn with_burst(self, burst: u64) -> Result<Self> {
        if burst == 0 {
            return Err(Error::InvalidQuota(
                "a burst of zero admits nothing; use at least 1".into(),
            ));
        }
        let q = Quota {
            burst: Some(burst),
            ..self
        };
        q.check_span()?;
        Ok(q)
    }

    fn check_span(&self) -> Result<()> {
        match self.burst().checked_mul(self.interval_micros()) {
            Some(span) if span <= MAX_SPAN_MICROS => Ok(()),
            _ => Err(Error::InvalidQuota(format!(
                "a burst of {} at one per {}µs spans more than 2^50µs",
                self.burst(),
                self.interval_micros()
            ))),
        }
    }

    /// How many per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds.
    pub fn period_micros(&self) -> u64 {
        self.period_us
    }

    /// The burst: the explicit one, else the limit.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// Whether a burst was set explicitly.
    pub fn has_explicit_burst(&self) -> bool {
        self.burst.is_some()
    }

    /// Time between two admissions at the sustained rate, in whole
    /// microseconds, rounded **up**. A figure for display and sizing: the
    /// limiters use the exact fraction `period / limit` (see
    /// [Precision](Quota#precision)).
    pub fn interval_micros(&self) -> u64 {
        self.period_us.div_ceil(self.limit)
    }

    /// The exact emission interval as `(ticks, per_micro)`: `ticks` units of
    /// `1/per_micro` µs, the fraction `period_us / limit` reduced. The buckets'
    /// scripts count time in those units (one when `per_micro` is 1).
    pub(crate) fn interval_fraction(&self) -> (u64, u64) {
        let g = gcd(self.period_us, self.limit);
        (self.period_us / g, self.limit / g)
    }

    /// Whether the token bucket and GCRA can run this quota exactly: its
    /// burst's span in the fraction's units must stay within 2^50.
    pub(crate) fn check_bucket_exact(&self) -> Result<()> {
        let (ticks, per) = self.interval_fraction();
        if self
            .burst()
            .checked_mul(ticks)
            .is_some_and(|s| s <= MAX_SPAN_TICKS)
        {
            return Ok(());
        }
        Err(Error::InvalidQuota(format!(
            "{self:?}: a bucket keeps the interval {} / {per} µs exact only for a burst up to {} \
             (burst × {ticks} must stay within 2^50); lower the burst, or choose a limit that \
             shares more factors with the period's {} µs",
            ticks,
            MAX_SPAN_TICKS / ticks,
            self.period_us
        )))
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quota({} per {:?}", self.limit, self.period())?;
        if let Some(b) = self.burst {
            write!(f, ", burst {b}")?;
        }
        f.write_str(")")
    }
}

/// A quota's time argument, exactly: `ticks` units of `1/per_micro` µs. A
/// window's period is whole microseconds (`per_micro` 1); a bucket's emission
/// interval is the reduced fraction `period / limit`
/// ([`Quota::interval_fraction`]), so no rate is rounded.
///
/// It goes to a script as one argument, `"<ticks>"` or `"<ticks>/<per_micro>"`
/// (the same count as a plain number, so the backends send it unchanged);
/// the scripts' `interval_of` reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interval {
    pub(crate) ticks: u64,
    pub(crate) per_micro: u64,
}

impl Interval {
    pub(crate) fn micros(us: u64) -> Interval {
        Interval {
            ticks: us,
            per_micro: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_means_n_per_second() {
        let q = Quota::per_second(10);
        assert_eq!(q.limit(), 10);
        assert_eq!(q.period(), Duration::from_secs(1));
        assert_eq!(q.interval_micros(), 100_000);
        assert_eq!(Quota::per_minute(60).interval_micros(), 1_000_000);
        assert_eq!(Quota::per_hour(1).period(), Duration::from_secs(3600));
    }

    #[test]
    fn invalid_quotas_are_errors() {
        assert!(Quota::new(0, Duration::from_secs(1)).is_err());
        assert!(Quota::new(1, Duration::ZERO).is_err());
        assert!(Quota::new(1, Duration::from_nanos(10)).is_err());
        assert!(Quota::new(2_000_000, Duration::from_secs(1)).is_err());
        assert!(Quota::new(1, Duration::from_secs(u64::MAX)).is_err());
        assert!(Quota::per_second(1).with_burst(0).is_err());
        assert!(Quota::per_day(1).with_burst(u64::MAX / 2).is_err());
    }

    #[test]
    #[should_panic(expected = "a quota of zero admits nothing")]
    fn per_second_of_zero_panics() {
        let _ = Quota::per_second(std::hint::black_box(0));
    }

    #[test]
    #[should_panic(expected = "finer than one per microsecond")]
    fn per_second_finer_than_a_microsecond_panics() {
        let _ = Quota::per_second(std::hint::black_box(2_000_000));
    }

    #[test]
    fn literals_match_the_fallible_constructor() {
        const MINUTE: Quota = Quota::per_minute(60);
        assert_eq!(MINUTE, Quota::new(60, Duration::from_secs(60)).unwrap());
        assert_eq!(
            Quota::per_day(2),
            Quota::new(2, Duration::from_secs(86_400)).unwrap()
        );
        assert_eq!(Quota::per_second(1_000_000).interval_micros(), 1);
    }

    #[test]
    fn interval_rounds_up() {
        assert_eq!(Quota::per_second(3).interval_micros(), 333_334);
    }

    #[test]
    fn interval_fraction_is_exact_and_reduced() {
        assert_eq!(Quota::per_second(3).interval_fraction(), (1_000_000, 3));
        assert_eq!(Quota::per_second(10).interval_fraction(), (100_000, 1));
        assert_eq!(
            Quota::per_second(999_999).interval_fraction(),
            (1_000_000, 999_999)
        );
        let q = Quota::new(6, Duration::from_micros(14)).unwrap();
        assert_eq!(q.interval_fraction(), (7, 3));
        assert_eq!(Quota::per_day(1_000_000).interval_fraction(), (86_400, 1));
    }

    #[test]
    fn buckets_refuse_what_cannot_be_exact() {
        assert!(Quota::per_second(999_999).check_bucket_exact().is_ok());
        assert!(Quota::per_day(20_000).check_bucket_exact().is_ok());
        let q = Quota::per_day(1_000_003);
        let e = q.check_bucket_exact().unwrap_err().to_string();
        // 2^50 / 86 400 000 000 = 13 031.
        assert!(e.contains("burst up to 13031"), "{e}");
        assert!(q.with_burst(13_031).unwrap().check_bucket_exact().is_ok());
        assert!(q.with_burst(13_032).unwrap().check_bucket_exact().is_err());
    }

    #[test]
    fn periods_of_part_microseconds_are_refused() {
        assert!(Quota::new(1, Duration::from_nanos(1_500)).is_err());
        assert!(Quota::new(1, Duration::new(1, 1)).is_err());
        assert!(Quota::new(1, Duration::new(1, 1_000)).is_ok());
    }

    #[test]
    fn limit_of_one_is_valid() {
        let q = Quota::per_second(1);
        assert_eq!(q.burst(), 1);
    }
}
