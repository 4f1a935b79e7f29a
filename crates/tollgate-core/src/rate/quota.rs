//! [`Quota`]: how much per how long, with an optional burst.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// Largest period a quota may have (ten years); keeps every figure exact in
/// Lua's doubles.
const MAX_PERIOD_MICROS: u64 = 10 * 365 * 24 * 3600 * 1_000_000;
/// Largest product of capacity and interval, in microseconds (2^50): scripts
/// add costs to microsecond timestamps (~2^51 today) and must stay below 2^53.
const MAX_SPAN_MICROS: u64 = 1 << 50;

/// How much per how long: `Quota::per_second(10)` is **ten per second**.
///
/// The burst (used by the token bucket and GCRA) is how many can be taken at
/// once from a full bucket; it defaults to the limit.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::Quota;
///
/// let q = Quota::per_second(10).unwrap();
/// assert_eq!(q.limit(), 10);
/// assert_eq!(q.period(), Duration::from_secs(1));
/// assert_eq!(q.burst(), 10);
///
/// // A bucket of 5 that refills one every 2 seconds.
/// let q = Quota::new(1, Duration::from_secs(2)).unwrap().with_burst(5).unwrap();
/// assert_eq!(q.burst(), 5);
///
/// assert!(Quota::per_second(0).is_err());
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

    /// `n` per second.
    pub fn per_second(n: u64) -> Result<Self> {
        Self::new(n, Duration::from_secs(1))
    }

    /// `n` per minute.
    pub fn per_minute(n: u64) -> Result<Self> {
        Self::new(n, Duration::from_secs(60))
    }

    /// `n` per hour.
    pub fn per_hour(n: u64) -> Result<Self> {
        Self::new(n, Duration::from_secs(3600))
    }

    /// `n` per day.
    pub fn per_day(n: u64) -> Result<Self> {
        Self::new(n, Duration::from_secs(86_400))
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
    /// microseconds, rounded **up** so the rate is never exceeded.
    pub fn interval_micros(&self) -> u64 {
        self.period_us.div_ceil(self.limit)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_second_means_n_per_second() {
        let q = Quota::per_second(10).unwrap();
        assert_eq!(q.limit(), 10);
        assert_eq!(q.period(), Duration::from_secs(1));
        assert_eq!(q.interval_micros(), 100_000);
        assert_eq!(Quota::per_minute(60).unwrap().interval_micros(), 1_000_000);
        assert_eq!(
            Quota::per_hour(1).unwrap().period(),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn invalid_quotas_are_errors() {
        assert!(Quota::per_second(0).is_err());
        assert!(Quota::new(1, Duration::ZERO).is_err());
        assert!(Quota::new(1, Duration::from_nanos(10)).is_err());
        assert!(Quota::per_second(2_000_000).is_err());
        assert!(Quota::new(1, Duration::from_secs(u64::MAX)).is_err());
        assert!(Quota::per_second(1).unwrap().with_burst(0).is_err());
        assert!(Quota::per_day(1).unwrap().with_burst(u64::MAX / 2).is_err());
    }

    #[test]
    fn interval_rounds_up() {
        assert_eq!(Quota::per_second(3).unwrap().interval_micros(), 333_334);
    }

    #[test]
    fn limit_of_one_is_valid() {
        let q = Quota::per_second(1).unwrap();
        assert_eq!(q.burst(), 1);
    }
}
