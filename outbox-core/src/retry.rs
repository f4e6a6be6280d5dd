//! [`RetryPolicy`]: when a failed message is tried again, and when it is dead-lettered.

use std::time::Duration;

/// When to try a failed message again, and when to give up on it.
///
/// Attempt `n` (counting from 1) that fails is retried after
/// `initial_backoff * multiplier^(n-1)`, capped at `max_backoff`, with ±25% jitter so that
/// messages that failed together do not all return together; after `max_attempts` attempts the
/// message moves to the dead-letter table. The defaults (10 attempts, 2 s × 4ⁿ, capped at 6 h)
/// spread retries over about 15 hours: long enough to ride out an outage of the receiver, and
/// the horizon a receiver must keep message ids for to drop duplicates.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    multiplier: f64,
    max_backoff: Duration,
    max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_secs(2),
            multiplier: 4.0,
            max_backoff: Duration::from_secs(6 * 3600),
            max_retry_after: Duration::from_secs(6 * 3600),
        }
    }
}

impl RetryPolicy {
    /// The default policy; see the type's documentation.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attempts in all, the first included, before a message is dead-lettered (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The delay after the first failed attempt.
    pub fn initial_backoff(mut self, delay: Duration) -> Self {
        self.initial_backoff = delay;
        self
    }

    /// How much each further delay grows (at least 1).
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = if multiplier.is_finite() {
            multiplier.max(1.0)
        } else {
            1.0
        };
        self
    }

    /// The longest delay between two attempts.
    pub fn max_backoff(mut self, delay: Duration) -> Self {
        self.max_backoff = delay;
        self
    }

    /// The longest delay a receiver's `Retry-After` (or a handler's
    /// [`ProcessError::with_retry_after`](crate::ProcessError::with_retry_after)) may impose.
    pub fn max_retry_after(mut self, delay: Duration) -> Self {
        self.max_retry_after = delay;
        self
    }

    /// Attempts in all before a message is dead-lettered.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether a message whose attempt number `attempt` (from 1) failed may be tried again.
    pub fn allows_retry_after(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }

    /// The delay after failed attempt `attempt` (from 1), without jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        let secs = self.initial_backoff.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = secs.min(self.max_backoff.as_secs_f64());
        Duration::try_from_secs_f64(capped).unwrap_or(self.max_backoff)
    }

    /// How long the retries take in all, without jitter: the sum of the backoffs after each
    /// failed attempt but the last (about 15 hours by default). A receiver must keep message
    /// ids at least this long to drop duplicates; by default, a message may wait this long for
    /// a destination that is paused or holding (see
    /// [`WorkerBuilder::max_deferral`](crate::WorkerBuilder::max_deferral)).
    pub fn horizon(&self) -> Duration {
        let mut total = Duration::ZERO;
        for attempt in 1..self.max_attempts {
            let delay = self.backoff(attempt);
            // From here on every delay is the same: the rest in one multiplication.
            if delay >= self.max_backoff || attempt > 64 {
                let rest = self.max_attempts - attempt;
                return total.saturating_add(delay.saturating_mul(rest));
            }
            total = total.saturating_add(delay);
        }
        total
    }

    /// The delay actually used after failed attempt `attempt`: the backoff with jitter, or the
    /// receiver's requested delay (bounded) if that is longer.
    pub fn delay(&self, attempt: u32, requested: Option<Duration>) -> Duration {
        let base = self.backoff(attempt);
        let factor = 0.75 + fastrand::f64() * 0.5;
        let jittered = Duration::try_from_secs_f64(base.as_secs_f64() * factor).unwrap_or(base);
        match requested {
            Some(requested) => jittered.max(requested.min(self.max_retry_after)),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let policy = RetryPolicy::new()
            .initial_backoff(Duration::from_secs(1))
            .multiplier(2.0)
            .max_backoff(Duration::from_secs(10));
        let delays: Vec<u64> = (1..=6).map(|n| policy.backoff(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn jitter_stays_within_a_quarter_and_retry_after_wins_when_longer() {
        let policy = RetryPolicy::new().max_retry_after(Duration::from_secs(60));
        for _ in 0..1000 {
            let delay = policy.delay(2, None).as_secs_f64();
            assert!((6.0..=10.0).contains(&delay), "{delay}");
        }
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(30))),
            Duration::from_secs(30)
        );
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(3600))),
            Duration::from_secs(60),
            "a receiver cannot push a retry past max_retry_after"
        );
    }

    #[test]
    fn extreme_settings_give_long_delays_not_panics() {
        let policy = RetryPolicy::new()
            .initial_backoff(Duration::MAX)
            .max_backoff(Duration::MAX)
            .max_retry_after(Duration::MAX)
            .multiplier(f64::MAX);
        for attempt in [0, 1, 2, 64, u32::MAX] {
            assert!(policy.delay(attempt, None) >= Duration::from_secs(3600));
            assert!(policy.delay(attempt, Some(Duration::MAX)) >= Duration::from_secs(3600));
        }
        let tiny = RetryPolicy::new()
            .initial_backoff(Duration::ZERO)
            .multiplier(f64::NAN);
        assert_eq!(tiny.delay(u32::MAX, None), Duration::ZERO);
    }

    #[test]
    fn the_default_horizon_is_about_fifteen_hours() {
        let hours = RetryPolicy::new().horizon().as_secs_f64() / 3600.0;
        assert!((14.9..15.1).contains(&hours), "{hours}");
        assert_eq!(RetryPolicy::new().max_attempts(1).horizon(), Duration::ZERO);
        let endless = RetryPolicy::new()
            .max_attempts(u32::MAX)
            .initial_backoff(Duration::MAX)
            .max_backoff(Duration::MAX);
        assert!(
            endless.horizon() >= Duration::from_secs(3600),
            "saturates, no panic"
        );
    }

    #[test]
    fn attempts_run_out_at_the_maximum() {
        let policy = RetryPolicy::new().max_attempts(3);
        assert!(policy.allows_retry_after(1));
        assert!(policy.allows_retry_after(2));
        assert!(!policy.allows_retry_after(3));
        assert!(!RetryPolicy::new().max_attempts(0).allows_retry_after(1));
    }
}
