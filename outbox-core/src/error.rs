//! How a handler's attempt fails: [`ProcessError`] and its [`FailureKind`], which decide
//! whether the message is retried, deferred or dead-lettered.

use std::fmt;
use std::time::Duration;

/// Whether a failed attempt is worth repeating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// A later attempt may succeed (a timeout, a 503, a lock); the message is retried with backoff
    /// until its attempts run out, then dead-lettered.
    Retryable,
    /// No attempt will ever succeed (a 400, a payload the receiver rejects); the message goes to
    /// the dead-letter table at once.
    Permanent,
    /// Not attempted: the destination is known to be down (a paused webhook endpoint). The
    /// message waits for [`retry_after`](ProcessError::retry_after) without the attempt being
    /// counted, so an outage, however long, does not use up its attempts.
    Deferred,
    /// Not attempted: an operator paused the destination (or the message's type). The message
    /// waits, without the attempt being counted, until the pause ends.
    Paused,
}

/// Why [`Handler::process`](crate::Handler::process) did not complete.
///
/// Any error type converts into a *retryable* `ProcessError` with `?`, so handlers can use the
/// errors of the libraries they call directly; use [`ProcessError::permanent`] when retrying is
/// pointless. The message of the error is stored with the outbox row as its last error, so it
/// should say what went wrong, and must not contain secrets.
pub struct ProcessError {
    kind: FailureKind,
    reason: String,
    retry_after: Option<Duration>,
    /// A deferral to a turn of its destination's pace, which it keeps for as long as it is
    /// taken at that pace: not bounded by `max_deferral`.
    paced: bool,
}

impl ProcessError {
    /// A failure a later attempt may not meet (a timeout, a 503): the message is retried.
    pub fn retryable(reason: impl fmt::Display) -> Self {
        ProcessError {
            kind: FailureKind::Retryable,
            reason: reason.to_string(),
            retry_after: None,
            paced: false,
        }
    }

    /// A failure that no attempt will fix: the message is dead-lettered at once.
    pub fn permanent(reason: impl fmt::Display) -> Self {
        ProcessError {
            kind: FailureKind::Permanent,
            reason: reason.to_string(),
            retry_after: None,
            paced: false,
        }
    }

    /// The message was not attempted because its destination is known to be down: it waits
    /// `delay` (a quarter of a second at least; a second for a zero delay) and the attempt is
    /// not counted (see [`FailureKind::Deferred`]).
    pub fn defer(reason: impl fmt::Display, delay: Duration) -> Self {
        ProcessError {
            kind: FailureKind::Deferred,
            reason: reason.to_string(),
            retry_after: Some(delay),
            paced: false,
        }
    }

    /// The message was not attempted because its destination's pace (a rate limit, or a rate
    /// learned from push-back) gives it a turn `delay` from now: a deferral that makes progress
    /// at the destination's own rate, so it never counts toward `max_deferral` however long
    /// the line is.
    pub(crate) fn paced(reason: impl fmt::Display, delay: Duration) -> Self {
        ProcessError {
            paced: true,
            ..ProcessError::defer(reason, delay)
        }
    }

    /// The message was not attempted because an operator paused its destination: it waits,
    /// its attempt not counted, until the destination is resumed.
    pub(crate) fn paused(reason: impl fmt::Display) -> Self {
        ProcessError {
            kind: FailureKind::Paused,
            reason: reason.to_string(),
            retry_after: None,
            paced: false,
        }
    }

    /// Asks for the next attempt not to start before `delay` has passed (e.g. a `Retry-After`
    /// header). The worker still applies its own bounds.
    pub fn with_retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// Whether the failure is worth retrying.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// What went wrong, as it will be stored with the message.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The delay the handler asked for before the next attempt, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether this is a deferral to a turn of the destination's pace.
    pub(crate) fn is_paced(&self) -> bool {
        self.paced
    }
}

impl fmt::Debug for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessError")
            .field("kind", &self.kind)
            .field("reason", &self.reason)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// `?` on any error inside `process` makes a retryable failure carrying the error and its
/// sources. `ProcessError` itself deliberately does not implement `std::error::Error`, which is
/// what makes this blanket conversion possible (the same trade-off as `anyhow::Error`).
impl<E> From<E> for ProcessError
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn from(error: E) -> Self {
        let mut reason = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            reason.push_str(": ");
            reason.push_str(&cause.to_string());
            source = cause.source();
        }
        ProcessError::retryable(reason)
    }
}

/// A panic's message, for logs and stored errors.
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Refused;

    #[derive(Debug, thiserror::Error)]
    #[error("sending the mail failed")]
    struct SendFailed(#[source] Refused);

    #[test]
    fn question_mark_makes_a_retryable_failure_with_the_whole_chain() {
        fn process() -> Result<(), ProcessError> {
            Err(SendFailed(Refused))?
        }
        let err = process().unwrap_err();
        assert_eq!(err.kind(), FailureKind::Retryable);
        assert_eq!(err.reason(), "sending the mail failed: connection refused");
    }

    #[test]
    fn permanent_failures_keep_their_reason_and_retry_after() {
        let err = ProcessError::permanent("410 Gone").with_retry_after(Duration::from_secs(3));
        assert_eq!(err.kind(), FailureKind::Permanent);
        assert_eq!(err.to_string(), "410 Gone");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn a_deferral_carries_its_wait() {
        let err = ProcessError::defer("endpoint paused", Duration::from_secs(30));
        assert_eq!(err.kind(), FailureKind::Deferred);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(30)));
    }
}
