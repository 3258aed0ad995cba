//! Rate limits: `N/s`, `N/min`, `N/h` (or `N/day`), enforced with GCRA (`governor`).
//!
//! A limit of `N` per period allows a burst of `N` calls and replenishes one every `period / N`.
//! A refused call is told how long to wait; nothing waits inside the policy.
//!
//! These limiters live in the policy's memory, for one process. Replicas that share a
//! PostgreSQL journal take from buckets in the database instead (the same GCRA, one statement a
//! take: `ring0_journal::SharedState::rate_take`), so the limit holds across them.

use governor::clock::{Clock, DefaultClock};
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;
use std::time::Duration;

/// Longest period a limit may name.
pub const RATE_PERIOD_MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// A limit that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rate limit {text:?}: {why} (write it as N/s, N/min, N/h or N/day with N ≥ 1)")]
pub struct RateLimitError {
    pub text: String,
    pub why: &'static str,
}

/// `count` calls per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub count: NonZeroU32,
    pub period: Duration,
}

impl RateLimit {
    pub fn parse(text: &str) -> Result<Self, RateLimitError> {
        let err = |why| RateLimitError {
            text: text.to_string(),
            why,
        };
        let (count, unit) = text.trim().split_once('/').ok_or(err("no '/'"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| err("count is not a number"))?;
        let count = NonZeroU32::new(count).ok_or(err("count is zero"))?;
        let period = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "day" => RATE_PERIOD_MAX,
            _ => return Err(err("unknown unit")),
        };
        Ok(Self { count, period })
    }

    fn quota(&self) -> Quota {
        // count ≥ 1 and period ≥ 1 s, so the replenish interval is at least period / 2^32 > 0.
        let per_cell = self.period / self.count.get();
        Quota::with_period(per_cell.max(Duration::from_nanos(1)))
            .expect("a non-zero period")
            .allow_burst(self.count)
    }

    pub(crate) fn limiter(&self) -> Limiter {
        Limiter {
            inner: RateLimiter::direct(self.quota()),
        }
    }
}

impl std::fmt::Display for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.period.as_secs() {
            1 => "s",
            60 => "min",
            3600 => "h",
            _ => "day",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// One limiter's state.
pub(crate) struct Limiter {
    inner: RateLimiter<NotKeyed, InMemoryState, DefaultClock>,
}

impl Limiter {
    /// Takes one cell, or says how long until one is free.
    pub(crate) fn check(&self) -> Result<(), Duration> {
        self.inner
            .check()
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_refuses_nonsense() {
        assert_eq!(
            RateLimit::parse("30/min").unwrap(),
            RateLimit {
                count: NonZeroU32::new(30).unwrap(),
                period: Duration::from_secs(60)
            }
        );
        assert_eq!(RateLimit::parse("2/h").unwrap().to_string(), "2/h");
        for bad in ["", "0/s", "x/s", "5/fortnight", "5"] {
            assert!(RateLimit::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn burst_is_the_count_then_refusal_names_a_wait() {
        let limiter = RateLimit::parse("2/h").unwrap().limiter();
        assert!(limiter.check().is_ok());
        assert!(limiter.check().is_ok());
        let wait = limiter.check().unwrap_err();
        assert!(wait > Duration::from_secs(60), "{wait:?}");
    }
}
