//! Relaying to NATS JetStream.

use std::fmt;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use async_nats::header::{HeaderMap, HeaderName, NATS_MESSAGE_ID};
use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishError, PublishErrorKind};
use async_nats::jetstream::{self, ErrorCode};
use futures_util::future::join_all;
use outbox_core::destination::{Answer, DeliveryError, Destination, Envelope};

use crate::error::RelayError;
use crate::runtime::OwnedRuntime;
use crate::shown_url;

const KIND: &str = "JetStream";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Publishes in flight from one handler thread's batch, each awaiting its acknowledgement.
const BATCH_LIMIT: usize = 64;

/// A NATS server with JetStream, publishing messages to streams and awaiting each publish
/// acknowledgement.
///
/// Each message is published with its outbox id as `Nats-Msg-Id`, so the stream drops a
/// redelivery (a retry after a lost acknowledgement, a worker killed after publishing)
/// that arrives within the stream's **duplicate window** (`duplicate_window`, two minutes by
/// default): inside that window each message enters the stream once. Set the window longer
/// than a message can take from its first publish to its last retry.
///
/// A message goes to its envelope's subject (a handler's
/// [`deliver_to`](outbox_core::destination::DestinationRef::deliver_to)), else the
/// destination's [`subject`](JetStreamDestinationBuilder::subject), else its message type (a
/// type such as `order.shipped` is a valid subject). Its id, type, ordering key and headers go
/// as NATS headers (see [`MESSAGE_ID_HEADER`](crate::MESSAGE_ID_HEADER)), its id also as
/// `Nats-Msg-Id`; a duplicate the stream dropped counts as published. No stream for the
/// subject, an invalid subject and a message over the server's or the stream's size limit are
/// permanent failures; a stream that is full under its `discard: new` policy, or a server out
/// of storage, pushes back ([`RelayError::Refused`]: the destination waits, no attempt is
/// counted); a server that cannot be reached or does not acknowledge in time is retried, and
/// pauses the destination after enough in a row.
///
/// Build it once at start-up and give it to the worker under a name; clones share one
/// connection, which reconnects by itself. Publishing blocks the handler thread until the
/// stream acknowledges (or [`timeout`](JetStreamDestinationBuilder::timeout) passes). A
/// handler thread with several messages for it waiting publishes up to 64 at once and then
/// awaits their acknowledgements together, rather than one round trip each.
///
/// ```no_run
/// use outbox_relay::JetStreamDestination;
///
/// # fn main() -> Result<(), outbox_relay::RelayError> {
/// let orders = JetStreamDestination::builder("nats://127.0.0.1:4222")
///     .subject("orders.events")
///     .build()?;
/// // Worker::builder(store).destination("orders", orders), and on the message's struct:
/// // #[outbox_handler("order.shipped", deliver_to = "orders")]
/// # drop(orders);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct JetStreamDestination {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    subject: Option<String>,
    timeout: Duration,
    context: jetstream::Context,
    client: async_nats::Client,
    // Dropped last: the client's tasks run on it.
    runtime: OwnedRuntime,
}

/// Configuration of a [`JetStreamDestination`], from [`JetStreamDestination::builder`].
#[derive(Clone)]
pub struct JetStreamDestinationBuilder {
    url: String,
    subject: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
}

impl JetStreamDestination {
    /// Starts configuring a destination on the NATS server at `url` (e.g.
    /// `nats://127.0.0.1:4222`; a comma-separated list names a cluster).
    pub fn builder(url: impl Into<String>) -> JetStreamDestinationBuilder {
        JetStreamDestinationBuilder {
            url: url.into(),
            subject: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Publishes `envelope`; the answer is the stream and sequence JetStream stored it at.
    fn send(&self, envelope: &Envelope) -> Result<Answer, RelayError> {
        self.inner.runtime.block_on(self.inner.publish(envelope))
    }
}

impl Inner {
    /// Publishes `envelope` and waits for the stream's acknowledgement, all within the
    /// timeout. Many of these run at once in a batch, each with its own acknowledgement.
    async fn publish(&self, envelope: &Envelope) -> Result<Answer, RelayError> {
        let subject = envelope.subject_or(self.subject.as_deref());
        if !is_valid_publish_subject(subject) {
            return Err(self.invalid(format!(
                "`{}` is not a subject to publish to: use dot-separated tokens without spaces or \
                 wildcards",
                subject.escape_debug()
            )));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in envelope.transport_headers(is_set_by_nats) {
            let name = HeaderName::from_str(name)
                .map_err(|_| self.invalid(format!("`{name}` is not a NATS header name")))?;
            if value.contains(['\r', '\n']) {
                return Err(self.invalid(format!(
                    "the value of header `{name}` holds a line break, which NATS headers cannot \
                     carry"
                )));
            }
            headers.insert(name, value.as_str());
        }
        let outgoing_id = envelope.message_id.to_string();
        headers.insert(NATS_MESSAGE_ID, outgoing_id.as_str());
        headers.insert("Content-Type", envelope.content_type.as_str());
        let body = bytes::Bytes::from(envelope.body.clone());
        let publish = async {
            let ack = self
                .context
                .publish_with_headers(subject.to_owned(), headers, body)
                .await?;
            ack.await
        };
        match tokio::time::timeout(self.timeout, publish).await {
            Ok(Ok(ack)) => {
                if ack.duplicate {
                    log::debug!(
                        "outbox: {} dropped message {} as a duplicate (stream {})",
                        self.name,
                        outgoing_id,
                        ack.stream
                    );
                }
                let duplicate = if ack.duplicate {
                    " (a duplicate: kept once)"
                } else {
                    ""
                };
                Ok(Answer::new(
                    None,
                    format!("stream {} sequence {}{duplicate}", ack.stream, ack.sequence),
                ))
            }
            Ok(Err(error)) => Err(self.classify(subject, error).await),
            Err(_) => Err(RelayError::Timeout {
                destination: self.name.clone(),
                timeout: self.timeout,
            }),
        }
    }
}

impl Destination for JetStreamDestination {
    fn kind(&self) -> &'static str {
        "jetstream"
    }

    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        self.deliver_answered(envelope).map(drop)
    }

    /// Publishes as [`deliver`](Destination::deliver) does; the answer is the stream and the
    /// sequence the message was stored at.
    fn deliver_answered(&self, envelope: &Envelope) -> Result<Answer, DeliveryError> {
        self.send(envelope).map_err(RelayError::into_delivery_error)
    }

    /// Up to 64 publishes in flight at once: each is written without waiting for
    /// the acknowledgements of those before it.
    fn batch_limit(&self) -> usize {
        BATCH_LIMIT
    }

    /// Publishes every envelope at once, then waits for their acknowledgements (each within
    /// the timeout); each one's outcome is its own.
    fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
        let inner = &self.inner;
        let published = inner.runtime.block_on(join_all(
            envelopes.iter().map(|envelope| inner.publish(envelope)),
        ));
        published
            .into_iter()
            .map(|result| result.map_err(RelayError::into_delivery_error))
            .collect()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

/// Headers NATS gives a meaning of its own, which a message's headers must not forge.
fn is_set_by_nats(name: &str) -> bool {
    name.to_ascii_lowercase().starts_with("nats-")
}

impl Inner {
    fn invalid(&self, reason: String) -> RelayError {
        RelayError::Invalid {
            destination: self.name.clone(),
            reason,
        }
    }

    async fn classify(&self, subject: &str, error: PublishError) -> RelayError {
        let destination = self.name.clone();
        let reason = error.to_string();
        match error.kind() {
            PublishErrorKind::MaxPayloadExceeded => RelayError::TooLarge {
                destination,
                reason,
            },
            PublishErrorKind::StreamNotFound => self.no_responders(subject, reason).await,
            PublishErrorKind::TimedOut => RelayError::Timeout {
                destination,
                timeout: self.timeout,
            },
            PublishErrorKind::MaxAckPending => RelayError::Refused {
                destination,
                reason,
            },
            PublishErrorKind::BrokenPipe => RelayError::Unavailable {
                destination,
                reason,
            },
            _ => match api_error(&error) {
                Some(api) if is_permanent(api.error_code()) => RelayError::Unroutable {
                    destination,
                    reason,
                },
                Some(api) if api.error_code() == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM => {
                    RelayError::TooLarge {
                        destination,
                        reason,
                    }
                }
                Some(api) if pushes_back(api) => RelayError::Refused {
                    destination,
                    reason,
                },
                Some(_) | None => RelayError::Unavailable {
                    destination,
                    reason,
                },
            },
        }
    }

    /// Nobody answered the publish. That is what a subject no stream listens on gets, but
    /// also what a server still recovering its streams after a restart answers, so the
    /// message is dead-lettered only when JetStream itself says no stream has the subject.
    async fn no_responders(&self, subject: &str, reason: String) -> RelayError {
        let destination = self.name.clone();
        match self.context.stream_by_subject(subject).await {
            Err(lookup) if lookup.kind() == GetStreamByNameErrorKind::NotFound => {
                RelayError::Unroutable {
                    destination,
                    reason: format!("no stream has the subject `{subject}`"),
                }
            }
            _ => RelayError::Unavailable {
                destination,
                reason: format!("{reason} (JetStream may still be starting)"),
            },
        }
    }
}

fn api_error(error: &PublishError) -> Option<&jetstream::Error> {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(api) = cause.downcast_ref::<jetstream::Error>() {
            return Some(api);
        }
        source = cause.source();
    }
    None
}

/// JetStream API errors that say "not now": the stream is full under its `discard: new` policy
/// (`maximum messages exceeded`, `maximum bytes exceeded`: a store failure with status 503),
/// or the server or account is out of storage or memory. Consumers draining the stream, or an
/// operator raising a limit, end them; no retry of the message alone would.
fn pushes_back(api: &jetstream::Error) -> bool {
    api.code() == 503
        || [
            ErrorCode::STREAM_STORE_FAILED,
            ErrorCode::INSUFFICIENT_RESOURCES,
            ErrorCode::STORAGE_RESOURCES_EXCEEDED,
            ErrorCode::MEMORY_RESOURCES_EXCEEDED,
            ErrorCode::ACCOUNT_RESOURCES_EXCEEDED,
        ]
        .contains(&api.error_code())
}

/// JetStream API errors no retry fixes: the stream does not take the subject or is sealed.
fn is_permanent(code: ErrorCode) -> bool {
    [ErrorCode::STREAM_NOT_FOUND, ErrorCode::STREAM_SEALED].contains(&code)
}

/// A subject NATS lets one publish to: dot-separated non-empty tokens, no whitespace, no
/// wildcards (a publish to `orders.*` would reach no stream as meant).
fn is_valid_publish_subject(subject: &str) -> bool {
    !subject.is_empty()
        && subject.split('.').all(|token| {
            !token.is_empty()
                && token != "*"
                && token != ">"
                && !token
                    .bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        })
}

impl JetStreamDestinationBuilder {
    /// The subject messages go to when their envelope names none (default: their message
    /// type).
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// How long a publish may wait for the stream's acknowledgement (10 s by default); past
    /// it the attempt is a retryable [`RelayError::Timeout`]. Keep it below the worker's
    /// handler timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long one attempt to connect may take (5 s by default).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Starts the destination's runtime and its connection. An unreachable server is not an
    /// error here: the connection keeps trying in the background, and publishes fail as
    /// retryable until it succeeds, so a worker can start before its broker.
    pub fn build(self) -> Result<JetStreamDestination, RelayError> {
        if self.timeout.is_zero() {
            return Err(RelayError::Config {
                destination: KIND,
                reason: "the timeout must be longer than zero".into(),
            });
        }
        if let Some(subject) = self
            .subject
            .as_deref()
            .filter(|s| !is_valid_publish_subject(s))
        {
            return Err(RelayError::Config {
                destination: KIND,
                reason: format!(
                    "`{}` is not a subject to publish to: use dot-separated tokens without \
                     spaces or wildcards",
                    subject.escape_debug()
                ),
            });
        }
        let name = format!("{KIND} {}", shown_url(&self.url));
        let options = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connection_timeout(self.connect_timeout)
            .max_reconnects(None);
        let url = self.url.clone();
        let timeout = self.timeout;
        let (runtime, (client, context)) = OwnedRuntime::start("jetstream", move || async move {
            let client =
                options
                    .connect(url.as_str())
                    .await
                    .map_err(|error| RelayError::Config {
                        destination: KIND,
                        reason: format!("cannot use `{}`: {error}", shown_url(&url)),
                    })?;
            // The context spawns its acknowledgement task on the runtime it is built on.
            let context = jetstream::ContextBuilder::new()
                .timeout(timeout)
                .build(client.clone());
            Ok((client, context))
        })?;
        Ok(JetStreamDestination {
            inner: Arc::new(Inner {
                name,
                subject: self.subject,
                timeout: self.timeout,
                context,
                client,
                runtime,
            }),
        })
    }
}

impl fmt::Debug for JetStreamDestinationBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamDestinationBuilder")
            .field("url", &shown_url(&self.url))
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl fmt::Debug for JetStreamDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamDestination")
            .field("name", &self.inner.name)
            .field("timeout", &self.inner.timeout)
            .field("state", &self.inner.client.connection_state())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_subjects_are_plain_dot_separated_tokens() {
        for good in ["orders", "orders.shipped", "a.b-c_d.E9", "orders.é"] {
            assert!(is_valid_publish_subject(good), "{good}");
        }
        for bad in [
            "",
            ".",
            "orders.",
            ".orders",
            "a..b",
            "orders.*",
            "orders.>",
            "a b",
            "a\tb",
            "a\r\nPUB x",
        ] {
            assert!(!is_valid_publish_subject(bad), "{bad:?}");
        }
    }
}
