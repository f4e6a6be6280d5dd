//! Relaying to Kafka.

use std::fmt;
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use outbox_core::destination::{Answer, DeliveryError, Destination, Envelope};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::error::RelayError;

const KIND: &str = "Kafka";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest topic name Kafka accepts.
const MAX_TOPIC_LEN: usize = 249;

/// A Kafka cluster, producing records with an idempotent producer and `acks=all`, and waiting
/// for each record's delivery report.
///
/// The message's **ordering key is the record key**, so all messages of a key go to one
/// partition, and since the worker publishes a key's next message only after the previous one
/// was acknowledged, per-key order carries into the partition. The message id, type and
/// headers go as record headers (see [`MESSAGE_ID_HEADER`](crate::MESSAGE_ID_HEADER)), the
/// data as the record's value (JSON).
///
/// The idempotent producer drops the duplicates of its own internal retries; a record whose
/// delivery report was lost (a worker killed after producing it) is produced again by the
/// next attempt, so consumers drop duplicates by the message id header.
///
/// A message goes to the topic its envelope names (a handler's
/// [`deliver_to`](outbox_core::destination::DestinationRef::deliver_to)), else the
/// destination's [`topic`](KafkaDestinationBuilder::topic), else its message type (a type
/// such as `order.shipped` is a valid topic name).
///
/// Build it once at start-up and give it to the worker under a name; clones share one
/// producer, which keeps its connections and reconnects by itself (librdkafka, built from
/// source). Publishing needs no async runtime.
///
/// ```no_run
/// use outbox_relay::KafkaDestination;
///
/// # fn main() -> Result<(), outbox_relay::RelayError> {
/// let orders = KafkaDestination::builder("127.0.0.1:9092").topic("orders").build()?;
/// // Worker::builder(store).destination("orders", orders), and on the message's struct:
/// // #[outbox_handler("order.shipped", deliver_to = "orders")]
/// # drop(orders);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaDestination {
    inner: Arc<Inner>,
}

type Producer = ThreadedProducer<Reports>;

struct Inner {
    name: String,
    topic: Option<String>,
    timeout: Duration,
    config: ClientConfig,
    current: Mutex<Current>,
}

/// The producer in use, replaced when it is unusable: after a fatal error, or when it has
/// delivered nothing for a while although records time out (an idempotent producer whose id
/// the cluster no longer knows, e.g. a broker that lost its state, retries forever with it).
struct Current {
    producer: Arc<Producer>,
    last_delivered: Instant,
    created: Instant,
}

/// Configuration of a [`KafkaDestination`], from [`KafkaDestination::builder`].
#[derive(Clone)]
pub struct KafkaDestinationBuilder {
    servers: String,
    topic: Option<String>,
    timeout: Duration,
    settings: Vec<(String, String)>,
}

/// Hands each record's delivery report to the handler thread waiting for it.
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<SyncSender<Result<(i32, i64), KafkaError>>>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiting: Self::DeliveryOpaque) {
        let report = match result {
            Ok(message) => Ok((
                rdkafka::Message::partition(message),
                rdkafka::Message::offset(message),
            )),
            Err((error, _)) => Err(error.clone()),
        };
        // The handler thread may have stopped waiting (a timeout): nothing to tell then.
        let _ = waiting.try_send(report);
    }
}

impl KafkaDestination {
    /// Starts configuring a destination on the cluster reached through `servers`
    /// (`host:port[,host:port…]`, librdkafka's `bootstrap.servers`).
    pub fn builder(servers: impl Into<String>) -> KafkaDestinationBuilder {
        KafkaDestinationBuilder {
            servers: servers.into(),
            topic: None,
            timeout: DEFAULT_TIMEOUT,
            settings: Vec::new(),
        }
    }
}

impl Destination for KafkaDestination {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    /// Produces the envelope's body keyed by its ordering key (no key if it has none), and
    /// waits for the delivery report. An invalid topic name, a record over
    /// `message.max.bytes` and a topic the cluster says does not exist are permanent failures;
    /// a full producer queue pushes back ([`RelayError::Refused`]: the destination waits, no
    /// attempt is counted); a cluster that cannot be reached and a report not received within
    /// the timeout are retried.
    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        self.deliver_answered(envelope).map(drop)
    }

    /// Produces as [`deliver`](Destination::deliver) does; the answer is the partition and the
    /// offset the record was written at.
    fn deliver_answered(&self, envelope: &Envelope) -> Result<Answer, DeliveryError> {
        self.inner
            .send(envelope)
            .map(|(partition, offset)| {
                Answer::new(None, format!("partition {partition} offset {offset}"))
            })
            .map_err(RelayError::into_delivery_error)
    }

    fn timeout(&self) -> Duration {
        // librdkafka reports a record it gave up on; the margin lets that report arrive.
        self.inner.timeout + REPORT_MARGIN
    }
}

/// How long past its timeout a record's delivery report is waited for.
const REPORT_MARGIN: Duration = Duration::from_secs(1);

impl Inner {
    /// Produces `envelope`; the partition and offset it was written at.
    fn send(&self, envelope: &Envelope) -> Result<(i32, i64), RelayError> {
        let topic = envelope.subject_or(self.topic.as_deref());
        if !is_valid_topic(topic) {
            return Err(RelayError::Invalid {
                destination: self.name.clone(),
                reason: format!(
                    "`{}` is not a topic name: use 1 to 249 letters, digits, `.`, `_` and `-`",
                    topic.escape_debug()
                ),
            });
        }
        let headers = envelope.transport_headers(|_| false).fold(
            OwnedHeaders::new_with_capacity(envelope.headers.len() + 3),
            |headers, (name, value)| {
                headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                })
            },
        );
        let (report, delivered) = sync_channel(1);
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(report))
            .payload(envelope.body.as_slice())
            .headers(headers);
        if let Some(key) = &envelope.ordering_key {
            record = record.key(key.as_str());
        }
        let producer = Arc::clone(&self.current().producer);
        if let Err((error, _)) = producer.send(record) {
            return Err(self.failed(&producer, error));
        }
        // librdkafka fails the record itself once `message.timeout.ms` (the timeout) passes;
        // the margin lets that report, which says why, arrive first.
        let result = match delivered.recv_timeout(self.timeout + REPORT_MARGIN) {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(error)) => Err(self.failed(&producer, error)),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                Err(RelayError::Timeout {
                    destination: self.name.clone(),
                    timeout: self.timeout,
                })
            }
        };
        match &result {
            Ok(_) => self.current().last_delivered = Instant::now(),
            Err(RelayError::Timeout { .. }) => self.replace_if_stuck(),
            Err(_) => {}
        }
        result
    }

    /// Classifies `error` of `producer`; a fatal one makes it replaced, unless another thread
    /// has replaced it already.
    fn failed(&self, producer: &Arc<Producer>, error: KafkaError) -> RelayError {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            let mut current = self.current();
            if Arc::ptr_eq(&current.producer, producer) {
                self.replace(&mut current, "it failed fatally");
            }
        }
        self.classify(error)
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A producer that delivered nothing for two timeouts, while its records time out, is
    /// replaced (at most once per two timeouts, so an outage costs a new producer now and
    /// then, not one per record).
    fn replace_if_stuck(&self) {
        let stuck_for = 2 * self.timeout;
        let mut current = self.current();
        // Checked and replaced under one lock: threads timing out together replace it once.
        if current.last_delivered.elapsed() > stuck_for && current.created.elapsed() > stuck_for {
            self.replace(
                &mut current,
                "it delivered nothing while its records timed out",
            );
        }
    }

    fn classify(&self, error: KafkaError) -> RelayError {
        let destination = self.name.clone();
        let reason = error.to_string();
        let Some(code) = error.rdkafka_error_code() else {
            return RelayError::Unavailable {
                destination,
                reason,
            };
        };
        match code {
            RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge => {
                RelayError::TooLarge {
                    destination,
                    reason,
                }
            }
            // librdkafka's own verdict after waiting for the topic to appear.
            RDKafkaErrorCode::UnknownTopic => RelayError::Unroutable {
                destination,
                reason,
            },
            RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidArgument => RelayError::Invalid {
                destination,
                reason,
            },
            RDKafkaErrorCode::QueueFull => RelayError::Refused {
                destination,
                reason,
            },
            RDKafkaErrorCode::MessageTimedOut => RelayError::Timeout {
                destination,
                timeout: self.timeout,
            },
            RDKafkaErrorCode::Fatal => RelayError::Unavailable {
                destination,
                reason: format!("{reason} (the producer is replaced)"),
            },
            _ => RelayError::Unavailable {
                destination,
                reason,
            },
        }
    }

    /// The next attempt gets a new producer (with a new producer id); records the old one
    /// still holds fail and are retried.
    fn replace(&self, current: &mut Current, why: &str) {
        match self.config.create_with_context::<_, Producer>(Reports) {
            Ok(producer) => {
                log::warn!("outbox: {}: replacing the producer: {why}", self.name);
                let old = std::mem::replace(current, Current::new(producer));
                // Dropping a producer flushes for up to half a second: not on this thread.
                let _ = std::thread::Builder::new()
                    .name("outbox-kafka-producer-drop".into())
                    .spawn(move || drop(old));
            }
            Err(error) => log::warn!(
                "outbox: {}: cannot replace the producer: {error}",
                self.name
            ),
        }
    }
}

impl Current {
    fn new(producer: Producer) -> Current {
        Current {
            producer: Arc::new(producer),
            last_delivered: Instant::now(),
            created: Instant::now(),
        }
    }
}

/// A topic name Kafka accepts.
fn is_valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= MAX_TOPIC_LEN
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl KafkaDestinationBuilder {
    /// The topic of messages whose envelope names none (default: their message type).
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// How long a record may take until its delivery report (10 s by default; librdkafka's
    /// `message.timeout.ms`), its own retries included; past it the attempt is a retryable
    /// [`RelayError::Timeout`]. Keep it below the worker's handler timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets a librdkafka producer property (`security.protocol`, `sasl.*`, `linger.ms`,
    /// `message.max.bytes`, ...). `enable.idempotence` and `acks` cannot be changed: they are
    /// what makes a delivery report mean the record is stored.
    pub fn set(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Creates the producer. It connects in the background, so a worker can start before its
    /// cluster.
    pub fn build(self) -> Result<KafkaDestination, RelayError> {
        let invalid = |reason: String| RelayError::Config {
            destination: KIND,
            reason,
        };
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        if timeout_ms == 0 || timeout_ms > i32::MAX as u64 {
            return Err(invalid(format!(
                "the timeout must be between 1 ms and {} ms",
                i32::MAX
            )));
        }
        if let Some(topic) = self.topic.as_deref().filter(|t| !is_valid_topic(t)) {
            return Err(invalid(format!(
                "`{}` is not a topic name: use 1 to 249 letters, digits, `.`, `_` and `-`",
                topic.escape_debug()
            )));
        }
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.servers)
            // Records are awaited one by one per handler thread: batching waits cost latency.
            .set("linger.ms", "1");
        for (name, value) in &self.settings {
            if matches!(
                name.as_str(),
                "enable.idempotence" | "acks" | "request.required.acks"
            ) {
                return Err(invalid(format!(
                    "`{name}` is set by the destination (idempotent, acks=all)"
                )));
            }
            config.set(name, value);
        }
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", timeout_ms.to_string());
        let producer: Producer = config
            .create_with_context(Reports)
            .map_err(|error| invalid(error.to_string()))?;
        Ok(KafkaDestination {
            inner: Arc::new(Inner {
                name: format!("{KIND} {}", self.servers),
                topic: self.topic,
                timeout: self.timeout,
                config,
                current: Mutex::new(Current::new(producer)),
            }),
        })
    }
}

impl fmt::Debug for KafkaDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaDestination")
            .field("name", &self.inner.name)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl fmt::Debug for KafkaDestinationBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Settings may hold SASL passwords: only their names are shown.
        let names: Vec<&str> = self.settings.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("KafkaDestinationBuilder")
            .field("servers", &self.servers)
            .field("topic", &self.topic)
            .field("timeout", &self.timeout)
            .field("settings", &names)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_are_what_kafka_accepts() {
        for good in ["orders", "orders.shipped", "a_b-c.D9", &"t".repeat(249)] {
            assert!(is_valid_topic(good), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "with space",
            "orders/shipped",
            "é",
            &"t".repeat(250),
        ] {
            assert!(!is_valid_topic(bad), "{bad:?}");
        }
    }

    #[test]
    fn idempotence_and_acks_cannot_be_weakened() {
        for name in ["enable.idempotence", "acks", "request.required.acks"] {
            let error = KafkaDestination::builder("127.0.0.1:9092")
                .set(name, "0")
                .build()
                .unwrap_err();
            assert!(
                error.to_string().contains("set by the destination"),
                "{error}"
            );
        }
    }
}
