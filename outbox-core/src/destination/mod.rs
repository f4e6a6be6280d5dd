//! Where messages go: webhook endpoints, brokers, any outside system a message is delivered to.
//!
//! A [`Destination`] delivers one [`Envelope`] (a message's id, type, ordering key, headers and
//! body, the same for every kind of destination) and says what happened: `Ok(())` when the
//! other side has the message, or a [`DeliveryError`] classified as retryable, permanent or
//! deferred (wait without spending an attempt), and as being about this message alone or about
//! the destination as a whole ([`Scope`]).
//!
//! A worker holds any number of destinations, each under a name
//! ([`WorkerBuilder::destination`](crate::WorkerBuilder::destination)); the name is how a
//! message type is routed to one (`#[outbox_handler("order.shipped", deliver_to = "crm")]`)
//! and how a handler reaches one ([`Context::destination`](crate::Context::destination)).
//! Every destination is wrapped the same way, whatever its kind:
//!
//! - **health**: after consecutive failures about the destination it is paused and its
//!   messages wait without spending attempts; a probe resumes it; a destination that says it
//!   is gone for good is disabled; the state is shared with other workers and operators
//!   through the store ([`health`]);
//! - **pace**: a rate limit the application sets, and by default a rate learned from the
//!   destination's push-back, so that a receiver that says "slower" gets as much as it takes
//!   ([`pace`]);
//! - **metrics**: attempts by outcome, their duration, and the state, by destination name
//!   ([`crate::metrics`]).
//!
//! A new kind of destination is one type implementing [`Destination`]: `outbox-webhook` has
//! the HTTP one, `outbox-relay` the brokers'.
//!
//! ```
//! use std::sync::Mutex;
//!
//! use outbox_core::destination::{DeliveryError, Destination, Envelope};
//!
//! /// Keeps what it is given; fails when told to.
//! #[derive(Debug, Default)]
//! struct Recorder {
//!     bodies: Mutex<Vec<Vec<u8>>>,
//! }
//!
//! impl Destination for Recorder {
//!     fn kind(&self) -> &'static str {
//!         "recorder"
//!     }
//!
//!     fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
//!         if envelope.body.is_empty() {
//!             return Err(DeliveryError::permanent("an empty body is never accepted"));
//!         }
//!         self.bodies.lock().unwrap().push(envelope.body.clone());
//!         Ok(())
//!     }
//! }
//! ```

pub mod health;
mod named;
pub mod pace;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{FailureKind, ProcessError};
use crate::headers::Headers;
use crate::message_id::MessageId;
use crate::priority::Priority;
use crate::subscription::Subscription;

pub use health::{DestinationState, HealthPolicy};
pub(crate) use named::{sync_health, Destinations, Exchanges, Registered, Sent};
pub use named::{DestinationOptions, DestinationRef, NameError, MAX_DESTINATION_NAME};
pub use pace::RateLimit;

pub use crate::answer::{Answer, MAX_ANSWER_BYTES};
pub use crate::store::DESTINATION_TARGET_PREFIX;

/// The header carrying a message's id on transports that carry headers, the same on every
/// attempt: consumers drop duplicates by it.
pub const MESSAGE_ID_HEADER: &str = "outbox-message-id";
/// The header carrying a message's type string.
pub const MESSAGE_TYPE_HEADER: &str = "outbox-message-type";
/// The header carrying a message's ordering key, if it has one.
pub const ORDERING_KEY_HEADER: &str = "outbox-ordering-key";

/// The content type of a JSON body, an envelope's default.
pub const JSON: &str = "application/json";

/// Something messages are delivered to: an HTTP receiver, a broker, a mail API.
///
/// Implementations deliver one envelope at a time, from many handler threads at once, and block
/// until the other side has the message (an HTTP answer, a broker's acknowledgement) or their
/// own timeout passes. They classify every failure; the worker wraps each destination with the
/// same health gate and metrics, so an implementation does not keep health of its own.
pub trait Destination: Send + Sync + 'static {
    /// What kind of destination this is (`webhook`, `jetstream`, ...): shown to operators
    /// beside its name.
    fn kind(&self) -> &'static str;

    /// Delivers `envelope`. Return `Ok(())` only once the other side has it.
    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError>;

    /// Delivers `envelope` as [`deliver`](Destination::deliver) does, and says what the other
    /// side answered (a status code, the start of its answer): the worker keeps it in the
    /// delivery log. Failures carry theirs with [`DeliveryError::with_answer`]. The default
    /// calls `deliver` and answers nothing; a destination whose other side answers something
    /// worth showing an operator implements this one and has `deliver` call it.
    fn deliver_answered(&self, envelope: &Envelope) -> Result<Answer, DeliveryError> {
        self.deliver(envelope).map(|()| Answer::default())
    }

    /// The most envelopes one call of [`deliver_batch`](Destination::deliver_batch) takes
    /// (default 1: the worker delivers one envelope a call). A destination whose other side
    /// takes several messages in flight at once (publishes pipelined ahead of their
    /// acknowledgements, confirms in flight) says how many, and implements `deliver_batch`.
    fn batch_limit(&self) -> usize {
        1
    }

    /// Delivers several envelopes at once and says what became of each: one outcome per
    /// envelope, in their order, each as [`deliver_answered`](Destination::deliver_answered)
    /// would have said it.
    ///
    /// The worker hands it at most [`batch_limit`](Destination::batch_limit) envelopes, never
    /// two with the same ordering key, and gives the whole call the same
    /// [`timeout`](Destination::timeout) as one delivery. The default delivers them one after
    /// another.
    fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
        envelopes
            .iter()
            .map(|envelope| self.deliver_answered(envelope))
            .collect()
    }

    /// The longest one [`deliver`](Destination::deliver) takes before it gives up by itself.
    /// The worker's handler timeout is raised to cover it (plus a margin), so that the
    /// worker's watchdog never abandons a delivery the destination would still finish.
    fn timeout(&self) -> Duration {
        Duration::ZERO
    }
}

/// A boxed destination is a destination: destinations chosen at run time (from configuration,
/// say) can be given to the worker as `Box<dyn Destination>`.
impl<D: Destination + ?Sized> Destination for Box<D> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }

    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        (**self).deliver(envelope)
    }

    fn deliver_answered(&self, envelope: &Envelope) -> Result<Answer, DeliveryError> {
        (**self).deliver_answered(envelope)
    }

    fn batch_limit(&self) -> usize {
        (**self).batch_limit()
    }

    fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
        (**self).deliver_batch(envelopes)
    }

    fn timeout(&self) -> Duration {
        (**self).timeout()
    }
}

/// How a worker delivers to subscriptions: the destination it builds for each one, anew
/// whenever the subscription changes. `outbox-webhook`'s `SubscriptionWebhooks` builds signed
/// webhooks; any [`Destination`] will do.
pub trait SubscriptionTransport: Send + Sync + 'static {
    /// The destination for `subscription`, or why there can be none (a URL the address guard
    /// refuses, a secret that cannot be decrypted): its deliveries then wait, without spending
    /// attempts, until it changes.
    fn destination(&self, subscription: &Subscription) -> Result<Arc<dyn Destination>, String>;

    /// The longest one delivery through a destination it builds takes before it gives up by
    /// itself (see [`Destination::timeout`]): the worker's handler timeout is raised to cover
    /// it.
    fn timeout(&self) -> Duration {
        Duration::ZERO
    }
}

/// Facts about the message being processed: what a handler reads in its [`Context`](crate::Context),
/// and what a destination's [`Envelope`] is made from.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message's stable id: send it along so receivers can drop duplicates.
    pub message_id: MessageId,
    /// The message's type string.
    pub message_type: String,
    /// Which attempt this is, starting at 1.
    pub attempt: u32,
    /// The headers set when the message was enqueued (trace context among them).
    pub headers: Headers,
    /// The ordering key it was enqueued with: messages of one key are processed one at a
    /// time, in enqueue order. Relays to brokers carry it as the record key.
    pub ordering_key: Option<String>,
    /// Its priority (see [`Envelope::priority`]).
    pub priority: Priority,
}

impl Delivery {
    /// An envelope for this message carrying `body` as JSON.
    pub fn envelope(&self, body: Vec<u8>) -> Envelope {
        let mut envelope = Envelope::new(self.message_id, self.message_type.clone(), body);
        envelope.ordering_key = self.ordering_key.clone();
        envelope.attempt = self.attempt;
        envelope.headers = self.headers.clone();
        envelope.priority = self.priority;
        envelope
    }
}

/// One message on its way to a destination: the same fields whatever the destination.
///
/// The worker makes these from the stored message, or a handler from its
/// [`Context::envelope`](crate::Context::envelope); [`subject`](Envelope::subject) says where
/// within the destination it goes when a handler picks that itself.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Envelope {
    /// The message's stable id, the same on every attempt: receivers drop duplicates by it.
    pub message_id: MessageId,
    /// The message's type string.
    pub message_type: String,
    /// The message's ordering key: brokers with record keys use it as the key.
    pub ordering_key: Option<String>,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    /// The headers the message was enqueued with (`traceparent` among them).
    pub headers: Headers,
    /// Where within the destination it goes: the NATS subject, the RabbitMQ routing key, the
    /// Kafka topic. `None`: the destination's own choice (its configured default, else the
    /// message type). Webhooks ignore it.
    pub subject: Option<String>,
    /// The body: the message's data, as JSON unless [`content_type`](Envelope::content_type)
    /// says otherwise.
    pub body: Vec<u8>,
    /// The body's media type.
    pub content_type: String,
    /// The message's priority: a destination paced by a rate limit gives a raised one the next
    /// free turn instead of a turn after the backlog's.
    pub priority: Priority,
}

impl Envelope {
    /// An envelope with `body` as JSON, no ordering key, headers or subject, as attempt 1.
    pub fn new(message_id: MessageId, message_type: impl Into<String>, body: Vec<u8>) -> Self {
        Envelope {
            message_id,
            message_type: message_type.into(),
            ordering_key: None,
            attempt: 1,
            headers: Headers::new(),
            subject: None,
            body,
            content_type: JSON.to_owned(),
            priority: Priority::Normal,
        }
    }

    /// The same envelope going to `subject` within its destination.
    pub fn with_subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// The same envelope with a body of another media type.
    pub fn with_body(mut self, body: Vec<u8>, content_type: impl Into<String>) -> Self {
        self.body = body;
        self.content_type = content_type.into();
        self
    }

    /// Whether the body is JSON.
    pub fn is_json(&self) -> bool {
        let essence = self.content_type.split(';').next().unwrap_or("").trim();
        essence.eq_ignore_ascii_case(JSON)
    }

    /// The subject it goes to: the one set on it, else `default`, else its message type.
    pub fn subject_or<'a>(&'a self, default: Option<&'a str>) -> &'a str {
        self.subject
            .as_deref()
            .or(default)
            .unwrap_or(&self.message_type)
    }

    /// Its metadata as transport headers, the same on every transport that carries headers:
    /// [`MESSAGE_ID_HEADER`], [`MESSAGE_TYPE_HEADER`], [`ORDERING_KEY_HEADER`] (when it has
    /// one), then the message's own headers, except any whose name `reserved` says the
    /// transport sets itself (or any `outbox-*` one), so a message cannot forge them.
    pub fn transport_headers(
        &self,
        reserved: impl Fn(&str) -> bool,
    ) -> impl Iterator<Item = (&str, String)> + '_ {
        let metadata = [
            Some((MESSAGE_ID_HEADER, self.message_id.to_string())),
            Some((MESSAGE_TYPE_HEADER, self.message_type.clone())),
            self.ordering_key
                .as_ref()
                .map(|key| (ORDERING_KEY_HEADER, key.clone())),
        ];
        let own: Vec<(&str, String)> = self
            .headers
            .iter()
            .filter(|(name, _)| {
                !name.to_ascii_lowercase().starts_with("outbox-") && !reserved(name)
            })
            .map(|(name, value)| (name, value.to_owned()))
            .collect();
        metadata.into_iter().flatten().chain(own)
    }
}

/// Whom a failed delivery is about: what the destination's health makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scope {
    /// This message alone: the destination answered (a `400`, a message too large, an
    /// unroutable subject), so it is up.
    Message,
    /// The message never left (it could not be encoded, a header was invalid): nothing is
    /// known of the destination.
    Unsent,
    /// The destination as a whole: it is down or failing (a timeout, a refused connection, a
    /// `5xx`), says "slower" (a `429`, a blocked connection), or is gone for good (`410`).
    /// Retryable failures of this scope pause it after enough in a row; permanent ones disable
    /// it; deferrals hold all its deliveries for the time given.
    Destination,
}

/// Why a destination did not take a message, classified: what becomes of the message
/// ([`kind`](DeliveryError::kind)) and what it says of the destination
/// ([`scope`](DeliveryError::scope)). The reason is stored with the message, so it must not
/// contain secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct DeliveryError {
    kind: FailureKind,
    scope: Scope,
    reason: String,
    not_before: Option<Duration>,
    answer: Option<Answer>,
}

impl DeliveryError {
    /// This message failed and a later attempt may succeed (a negative acknowledgement of this
    /// one message): retried with backoff.
    pub fn retryable(reason: impl fmt::Display) -> Self {
        Self::new(FailureKind::Retryable, Scope::Message, reason)
    }

    /// This message will never be accepted (a `400`, too large, nowhere to route it):
    /// dead-lettered at once.
    pub fn permanent(reason: impl fmt::Display) -> Self {
        Self::new(FailureKind::Permanent, Scope::Message, reason)
    }

    /// The destination is down or failing (a timeout, a refused connection, a `5xx`): the
    /// message is retried with backoff, and enough of these in a row pause the destination.
    pub fn unavailable(reason: impl fmt::Display) -> Self {
        Self::new(FailureKind::Retryable, Scope::Destination, reason)
    }

    /// The destination says it will never take a delivery again (`410 Gone`): the message is
    /// dead-lettered and the destination disabled until an operator enables it.
    pub fn gone(reason: impl fmt::Display) -> Self {
        Self::new(FailureKind::Permanent, Scope::Destination, reason)
    }

    /// The destination asks for no deliveries for `wait` (a `429` or `503` with
    /// `Retry-After`, a blocked connection): every delivery to it waits that long, and this
    /// message's attempt is not counted.
    pub fn push_back(reason: impl fmt::Display, wait: Duration) -> Self {
        Self::new(FailureKind::Deferred, Scope::Destination, reason).not_before(wait)
    }

    /// A failure of `kind` and `scope`.
    pub fn new(kind: FailureKind, scope: Scope, reason: impl fmt::Display) -> Self {
        DeliveryError {
            kind,
            scope,
            reason: reason.to_string(),
            not_before: None,
            answer: None,
        }
    }

    /// The message was never sent (it could not be encoded, a header was invalid): the same
    /// failure, saying nothing of the destination.
    pub fn unsent(mut self) -> Self {
        self.scope = Scope::Unsent;
        self
    }

    /// Asks that the next attempt (or, for a push-back, the next delivery to the destination)
    /// not start before `delay` has passed, e.g. a `Retry-After`.
    pub fn not_before(mut self, delay: Duration) -> Self {
        self.not_before = Some(delay);
        self
    }

    /// The same failure with what the other side answered (an HTTP status and body), for
    /// the delivery log.
    pub fn with_answer(mut self, answer: Answer) -> Self {
        self.answer = Some(answer);
        self
    }

    /// What the other side answered, if it answered and the destination said.
    pub fn answer(&self) -> Option<&Answer> {
        self.answer.as_ref()
    }

    /// What becomes of the message.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// Whom the failure is about.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// What went wrong, as it is stored with the message.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The delay asked for, if any.
    pub fn delay(&self) -> Option<Duration> {
        self.not_before
    }

    /// What a handler returns for this failure.
    pub fn into_process_error(self) -> ProcessError {
        let error = match self.kind {
            FailureKind::Permanent => ProcessError::permanent(self.reason),
            FailureKind::Deferred => {
                let wait = self.not_before.unwrap_or(Duration::from_secs(1));
                return ProcessError::defer(self.reason, wait);
            }
            _ => ProcessError::retryable(self.reason),
        };
        match self.not_before {
            Some(delay) => error.with_retry_after(delay),
            None => error,
        }
    }
}

impl fmt::Debug for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliveryError")
            .field("kind", &self.kind)
            .field("scope", &self.scope)
            .field("reason", &self.reason)
            .field("not_before", &self.not_before)
            .field("answer", &self.answer)
            .finish()
    }
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for DeliveryError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_keep_their_kind_scope_and_delay_into_the_handlers_error() {
        let gone = DeliveryError::gone("410 Gone");
        assert_eq!(
            (gone.kind(), gone.scope()),
            (FailureKind::Permanent, Scope::Destination)
        );
        assert_eq!(gone.into_process_error().kind(), FailureKind::Permanent);
        let slower = DeliveryError::push_back("429", Duration::from_secs(3));
        let slower = slower.into_process_error();
        assert_eq!(slower.kind(), FailureKind::Deferred);
        assert_eq!(slower.retry_after(), Some(Duration::from_secs(3)));
        let later = DeliveryError::unavailable("503")
            .not_before(Duration::from_secs(9))
            .into_process_error();
        assert_eq!(later.kind(), FailureKind::Retryable);
        assert_eq!(later.retry_after(), Some(Duration::from_secs(9)));
        let unsent = DeliveryError::permanent("bad header").unsent();
        assert_eq!(unsent.scope(), Scope::Unsent);
    }

    #[test]
    fn a_failure_carries_what_the_other_side_answered() {
        let failed = DeliveryError::unavailable("503").with_answer(Answer::http(503, b"busy"));
        assert_eq!(failed.answer().map(Answer::text), Some("busy"));
    }

    #[test]
    fn transport_headers_carry_the_metadata_first_and_cannot_be_forged() {
        let mut headers = Headers::new();
        headers
            .insert(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .unwrap();
        headers.insert("nats-msg-id", "forged").unwrap();
        let mut envelope = Envelope::new(MessageId::new(), "order.shipped", b"{}".to_vec());
        envelope.ordering_key = Some("order-7".into());
        envelope.headers = headers;
        let sent: Vec<(&str, String)> = envelope
            .transport_headers(|name| name.starts_with("nats-"))
            .collect();
        let names: Vec<&str> = sent.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                MESSAGE_ID_HEADER,
                MESSAGE_TYPE_HEADER,
                ORDERING_KEY_HEADER,
                "traceparent"
            ]
        );
        assert_eq!(sent[0].1, envelope.message_id.to_string());
        assert_eq!(envelope.subject_or(None), "order.shipped");
        assert_eq!(envelope.subject_or(Some("orders")), "orders");
        assert!(envelope.with_subject("x").subject_or(Some("orders")) == "x");
    }

    #[test]
    fn json_is_recognised_with_parameters_and_in_any_case() {
        let envelope = Envelope::new(MessageId::new(), "t", Vec::new());
        assert!(envelope.is_json());
        let text = envelope.clone().with_body(b"hi".to_vec(), "text/plain");
        assert!(!text.is_json());
        let charset = envelope.with_body(b"{}".to_vec(), "Application/JSON; charset=utf-8");
        assert!(charset.is_json());
    }
}
