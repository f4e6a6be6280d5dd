//! The one exponential backoff the worker uses for everything that waits after a failure.

use std::time::Duration;

/// `initial × 2ⁿ` after the n-th failure in a row (from 0), capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff from `initial`, doubling, up to `max`.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max }
    }

    /// From a `(initial, max)` pair of `timing`.
    pub const fn from_pair((initial, max): (Duration, Duration)) -> Self {
        Self::new(initial, max)
    }

    /// The pause after `failures` failures in a row (1 is the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// Counts failures in a row and says how long to pause after each.
#[derive(Debug, Clone)]
pub struct Failures {
    backoff: Backoff,
    in_a_row: u32,
}

impl Failures {
    /// No failures yet.
    pub fn new(backoff: Backoff) -> Self {
        Failures {
            backoff,
            in_a_row: 0,
        }
    }

    /// Records a failure; the pause before trying again.
    pub fn failed(&mut self) -> Duration {
        self.in_a_row = self.in_a_row.saturating_add(1);
        self.backoff.delay(self.in_a_row)
    }

    /// Records a success.
    pub fn succeeded(&mut self) {
        self.in_a_row = 0;
    }

    /// Failures in a row so far.
    pub fn in_a_row(&self) -> u32 {
        self.in_a_row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_failure_up_to_the_cap() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<u64> = (1..=6)
            .map(|n| backoff.delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.delay(0), Duration::from_millis(100));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn extreme_settings_saturate_instead_of_overflowing() {
        let backoff = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!(backoff.delay(40), Duration::MAX);
        let mut failures = Failures::new(backoff);
        for _ in 0..100 {
            failures.failed();
        }
        assert_eq!(failures.in_a_row(), 100);
        failures.succeeded();
        assert_eq!(failures.in_a_row(), 0);
    }
}
