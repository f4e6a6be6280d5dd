//! [`RelayError`]: why a message was not relayed to a broker, classified for the worker.

use std::time::Duration;

use outbox_core::destination::{DeliveryError, Scope};
use outbox_core::FailureKind;

/// How long a broker that pushes back ([`RelayError::Refused`]) is left alone before the next
/// delivery to it: as long as a webhook answering `429` without `Retry-After`. Brokers name no
/// time; pushing back again lowers the destination's rate instead.
pub const PUSH_BACK_WAIT: Duration = Duration::from_secs(1);

/// Why a message was not relayed, or a destination could not be configured.
///
/// Each variant says whether another attempt can succeed ([`RelayError::kind`]): a broker that
/// is down or slow is worth retrying with backoff (and pauses the destination after enough in
/// a row); a broker that asks for no more for now ([`RelayError::Refused`]: a full stream or
/// queue, a blocked connection) holds the destination a moment without spending an attempt; a
/// message the broker will never take (nowhere to route it, too large, an invalid subject or
/// topic) goes to the dead-letter table at once, with this error as its reason (see
/// [`RelayError::into_delivery_error`]).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The destination's settings are wrong; fix them where the destination is built.
    #[error("invalid {destination} configuration: {reason}")]
    Config {
        /// Which kind of destination.
        destination: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The broker cannot be reached or the connection broke: retried with backoff, and the
    /// destination reconnects by itself.
    #[error("{destination} is unavailable: {reason}")]
    Unavailable {
        /// The destination.
        destination: String,
        /// What failed.
        reason: String,
    },
    /// The broker did not acknowledge the message in time. It may still have stored it: the
    /// retry carries the same message id, which JetStream drops as a duplicate inside its
    /// window and consumers of the other brokers can drop themselves.
    #[error("{destination} did not acknowledge the message within {timeout:?}")]
    Timeout {
        /// The destination.
        destination: String,
        /// How long the destination waited.
        timeout: Duration,
    },
    /// The broker pushes back: it takes no more for now (a JetStream stream full under its
    /// `discard: new` policy or out of storage, a RabbitMQ queue at its `x-max-length` with
    /// `reject-publish`, a connection RabbitMQ blocked for a resource alarm, Kafka's local queue
    /// full, too many publishes awaiting acknowledgement). Like a webhook's `429`, every delivery
    /// to the destination waits [`PUSH_BACK_WAIT`], no attempt is counted and the destination is
    /// not paused as if it were down; push-back again and again lowers its rate (see
    /// [`outbox_core::destination::pace`]).
    #[error("{destination} refused the message for now: {reason}")]
    Refused {
        /// The destination.
        destination: String,
        /// The broker's reason.
        reason: String,
    },
    /// Nothing at the broker takes the message (no stream for the subject, an unroutable
    /// routing key, a missing exchange or topic): dead-lettered at once.
    #[error("{destination} has nowhere to put the message: {reason}")]
    Unroutable {
        /// The destination.
        destination: String,
        /// What the broker said.
        reason: String,
    },
    /// The message is larger than the broker accepts: dead-lettered at once.
    #[error("the message is too large for {destination}: {reason}")]
    TooLarge {
        /// The destination.
        destination: String,
        /// The sizes involved.
        reason: String,
    },
    /// The message cannot be published as it is (an invalid subject, routing key, topic or
    /// header): dead-lettered at once.
    #[error("{destination} cannot take the message: {reason}")]
    Invalid {
        /// The destination.
        destination: String,
        /// What is invalid.
        reason: String,
    },
}

impl RelayError {
    /// Whether another attempt may succeed.
    pub fn kind(&self) -> FailureKind {
        match self {
            RelayError::Unavailable { .. } | RelayError::Timeout { .. } => FailureKind::Retryable,
            RelayError::Refused { .. } => FailureKind::Deferred,
            RelayError::Config { .. }
            | RelayError::Unroutable { .. }
            | RelayError::TooLarge { .. }
            | RelayError::Invalid { .. } => FailureKind::Permanent,
        }
    }

    /// The failure classified for the worker: a broker that is down or slow is a retryable
    /// failure of the destination (enough in a row pause it); one that refuses for now pushes
    /// the destination back for [`PUSH_BACK_WAIT`]; what the broker will never take is a
    /// permanent failure of the message; a configuration or encoding error never reached the
    /// broker.
    pub fn into_delivery_error(self) -> DeliveryError {
        let reason = self.to_string();
        match &self {
            RelayError::Unavailable { .. } | RelayError::Timeout { .. } => {
                DeliveryError::unavailable(reason)
            }
            RelayError::Refused { .. } => DeliveryError::push_back(reason, PUSH_BACK_WAIT),
            RelayError::Unroutable { .. }
            | RelayError::TooLarge { .. }
            | RelayError::Invalid { .. } => DeliveryError::permanent(reason),
            RelayError::Config { .. } => {
                DeliveryError::new(FailureKind::Permanent, Scope::Unsent, reason)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(make: fn(String, String) -> RelayError) -> RelayError {
        make("JetStream nats://127.0.0.1:4222".into(), "why".into())
    }

    #[test]
    fn brokers_down_or_slow_are_retried() {
        let retried = [
            named(|destination, reason| RelayError::Unavailable {
                destination,
                reason,
            }),
            RelayError::Timeout {
                destination: "d".into(),
                timeout: Duration::from_secs(1),
            },
        ];
        for error in retried {
            let reason = error.to_string();
            let failure = error.into_delivery_error();
            assert_eq!(failure.kind(), FailureKind::Retryable, "{reason}");
            assert_eq!(failure.scope(), Scope::Destination, "{reason}");
            assert_eq!(failure.reason(), reason);
        }
    }

    #[test]
    fn brokers_pushing_back_hold_the_destination_without_an_attempt() {
        let error = named(|destination, reason| RelayError::Refused {
            destination,
            reason,
        });
        assert_eq!(error.kind(), FailureKind::Deferred);
        let reason = error.to_string();
        let failure = error.into_delivery_error();
        assert_eq!(
            failure.kind(),
            FailureKind::Deferred,
            "no attempt is counted"
        );
        assert_eq!(
            failure.scope(),
            Scope::Destination,
            "the whole destination waits"
        );
        assert_eq!(failure.delay(), Some(PUSH_BACK_WAIT));
        assert_eq!(failure.reason(), reason);
    }

    #[test]
    fn messages_the_broker_will_never_take_are_dead_lettered() {
        let dead = [
            named(|destination, reason| RelayError::Unroutable {
                destination,
                reason,
            }),
            named(|destination, reason| RelayError::TooLarge {
                destination,
                reason,
            }),
            named(|destination, reason| RelayError::Invalid {
                destination,
                reason,
            }),
        ];
        for error in dead {
            let reason = error.to_string();
            assert!(reason.contains("nats://127.0.0.1:4222") && reason.contains("why"));
            let failure = error.into_delivery_error();
            assert_eq!(failure.kind(), FailureKind::Permanent);
            assert_eq!(failure.scope(), Scope::Message, "the broker is up");
        }
    }
}
