//! Relaying to RabbitMQ (AMQP 0.9.1).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError, BasicProperties};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use outbox_core::destination::{Answer, DeliveryError, Destination, Envelope};
use tokio::sync::Mutex;

use crate::error::RelayError;
use crate::runtime::OwnedRuntime;
use crate::shown_url;

const KIND: &str = "RabbitMQ";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Publishes in flight from one handler thread's batch, on one channel, awaiting their
/// confirms.
const BATCH_LIMIT: usize = 32;
/// AMQP's delivery mode for messages the broker writes to disk.
const PERSISTENT: u8 = 2;

/// A RabbitMQ exchange, publishing messages with publisher confirms.
///
/// Each message is published **persistent**, **mandatory** (a message no queue is bound to
/// receive comes back, and is dead-lettered as [`RelayError::Unroutable`] instead of being
/// dropped by the broker), with its outbox id as the AMQP `message_id`, its type as `type`, its
/// envelope's content type as `content_type`, and its ordering key and headers in the headers
/// table (see [`MESSAGE_ID_HEADER`](crate::MESSAGE_ID_HEADER)). It goes with the routing key its
/// envelope names (a handler's
/// [`deliver_to`](outbox_core::destination::DestinationRef::deliver_to)), else the
/// destination's [`routing_key`](RabbitMqDestinationBuilder::routing_key), else its message
/// type. A publish succeeds when the broker confirms it, which for a durable queue means it is
/// on disk.
///
/// A handler thread with several messages for it waiting publishes up to 32 at once on one
/// channel and awaits their confirms together (channels are reused, one batch at a time). A
/// message the broker refuses by closing the channel (one over `max_message_size`, say) still
/// fails alone: what the closing left unconfirmed is published again, each message on a
/// channel of its own. A message that comes back unroutable is told by its message id.
///
/// A broker that pushes back (a queue at its `x-max-length` with overflow `reject-publish`
/// answers `basic.nack`; a memory or disk alarm blocks the connection) holds the destination
/// without spending attempts ([`RelayError::Refused`]), as a webhook's `429` does.
///
/// RabbitMQ does not drop duplicates: a message whose confirm was lost (a broker restart, a
/// worker killed after publishing) is published again, so consumers drop duplicates by
/// `message_id`.
///
/// Build it once at start-up and give it to the worker under a name; clones share one
/// connection, which is re-opened by the next publish after it breaks.
///
/// ```no_run
/// use outbox_relay::RabbitMqDestination;
///
/// # fn main() -> Result<(), outbox_relay::RelayError> {
/// let orders = RabbitMqDestination::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .exchange("orders")
///     .build()?;
/// // Worker::builder(store).destination("orders", orders), and on the message's struct:
/// // #[outbox_handler("order.shipped", deliver_to = "orders")] (routed by its type)
/// # drop(orders);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RabbitMqDestination {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    url: String,
    exchange: ShortString,
    routing_key: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    link: Mutex<Option<Link>>,
    generations: AtomicU64,
    // Dropped last: the connection's tasks run on it.
    runtime: OwnedRuntime,
}

/// An open connection and its idle channels in confirm mode.
struct Link {
    /// Which connection this is, counting from 1: a publish that failed on one forgets that
    /// one only, never a newer one another thread opened since.
    generation: u64,
    /// Shared with the publishes opening channels on it, which do so without the lock: on a
    /// connection the broker blocked, opening a channel waits until the alarm clears.
    connection: Arc<Connection>,
    /// Channels no publish is using, each with nothing awaiting a confirm.
    idle: Vec<Channel>,
}

/// Configuration of a [`RabbitMqDestination`], from [`RabbitMqDestination::builder`].
#[derive(Clone)]
pub struct RabbitMqDestinationBuilder {
    url: String,
    exchange: String,
    routing_key: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
}

impl RabbitMqDestination {
    /// Starts configuring a destination on the broker at `url`, an AMQP URI such as
    /// `amqp://user:password@127.0.0.1:5672/%2f` (the last part is the virtual host).
    pub fn builder(url: impl Into<String>) -> RabbitMqDestinationBuilder {
        RabbitMqDestinationBuilder {
            url: url.into(),
            exchange: String::new(),
            routing_key: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

impl Destination for RabbitMqDestination {
    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        let inner = &self.inner;
        inner
            .runtime
            .block_on(inner.send(envelope))
            .map_err(RelayError::into_delivery_error)
    }

    /// Up to 32 publishes awaiting their confirms at once.
    fn batch_limit(&self) -> usize {
        BATCH_LIMIT
    }

    /// Publishes the envelopes on one channel and waits for their confirms together; each
    /// one's outcome is its own. What the broker's closing of the channel left unconfirmed (a
    /// message it refuses that way) is published again, each on a channel of its own, so the
    /// refused message fails alone.
    fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
        let inner = &self.inner;
        inner
            .runtime
            .block_on(inner.send_batch(envelopes))
            .into_iter()
            .map(|result| {
                result
                    .map(|()| Answer::default())
                    .map_err(RelayError::into_delivery_error)
            })
            .collect()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

impl Inner {
    /// Publishes `envelope` on a channel of its own and waits for the broker's confirm, all
    /// within the timeout.
    async fn send(&self, envelope: &Envelope) -> Result<(), RelayError> {
        self.send_until(envelope, tokio::time::Instant::now() + self.timeout)
            .await
    }

    /// [`send`](Self::send), ending by `deadline`.
    async fn send_until(
        &self,
        envelope: &Envelope,
        deadline: tokio::time::Instant,
    ) -> Result<(), RelayError> {
        let (routing_key, properties) = self.addressed(envelope)?;
        let used = AtomicU64::new(0);
        let publish = async {
            if self.blocked(None).await {
                return Err(self.blocked_error());
            }
            self.publish(routing_key, &envelope.body, properties, &used)
                .await
        };
        match tokio::time::timeout_at(deadline, publish).await {
            Ok(result) => result,
            Err(_) => {
                let generation = used.load(Ordering::Relaxed);
                // A blocked connection is healthy: the broker reads from it again once its
                // alarm clears, and the publish stuck on it completes then.
                if self.blocked((generation != 0).then_some(generation)).await {
                    return Err(self.blocked_error());
                }
                // The channel may be stuck on a connection the broker no longer serves.
                self.forget_link(generation).await;
                Err(RelayError::Timeout {
                    destination: self.name.clone(),
                    timeout: self.timeout,
                })
            }
        }
    }

    /// The routing key and properties `envelope` is published with, or why it cannot be.
    fn addressed(&self, envelope: &Envelope) -> Result<(ShortString, BasicProperties), RelayError> {
        let routing_key = envelope.subject_or(self.routing_key.as_deref());
        let routing_key = ShortString::try_new(routing_key).map_err(|_| RelayError::Invalid {
            destination: self.name.clone(),
            reason: format!(
                "a routing key holds at most 255 bytes, this one {}",
                routing_key.len()
            ),
        })?;
        Ok((routing_key, self.properties(envelope)?))
    }

    /// Publishes `envelopes` on one channel and waits for their confirms together, all within
    /// the timeout; then those the broker's closing of the channel left without an outcome,
    /// each on a channel of its own, within what is left of it.
    async fn send_batch(&self, envelopes: &[Envelope]) -> Vec<Result<(), RelayError>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut outcomes: Vec<Option<Result<(), RelayError>>> = Vec::new();
        let mut ready = Vec::with_capacity(envelopes.len());
        for (at, envelope) in envelopes.iter().enumerate() {
            match self.addressed(envelope) {
                Ok((routing_key, properties)) => {
                    outcomes.push(None);
                    ready.push(Publish {
                        at,
                        message_id: envelope.message_id.to_string(),
                        routing_key,
                        properties,
                        body: &envelope.body,
                    });
                }
                Err(invalid) => outcomes.push(Some(Err(invalid))),
            }
        }
        if ready.len() > 1 {
            let used = AtomicU64::new(0);
            let together = async {
                if self.blocked(None).await {
                    return Err(self.blocked_error());
                }
                self.publish_together(&ready, &used).await
            };
            match tokio::time::timeout_at(deadline, together).await {
                Ok(Ok(confirmed)) => {
                    for (publish, outcome) in ready.iter().zip(confirmed) {
                        outcomes[publish.at] = outcome;
                    }
                }
                Ok(Err(failed)) => {
                    // Nothing was published (no channel, a blocked connection): the same
                    // outcome for each.
                    for publish in &ready {
                        outcomes[publish.at] = Some(Err(failed.clone()));
                    }
                }
                Err(_) => {
                    let generation = used.load(Ordering::Relaxed);
                    let blocked = self.blocked((generation != 0).then_some(generation)).await;
                    if !blocked {
                        self.forget_link(generation).await;
                    }
                    for publish in &ready {
                        outcomes[publish.at] = Some(Err(if blocked {
                            self.blocked_error()
                        } else {
                            RelayError::Timeout {
                                destination: self.name.clone(),
                                timeout: self.timeout,
                            }
                        }));
                    }
                }
            }
        }
        // One alone, or what the closed channel left: each on a channel of its own, by the
        // same deadline (each says for itself why it did not make it).
        let alone: Vec<usize> = (0..envelopes.len())
            .filter(|at| outcomes[*at].is_none())
            .collect();
        let sent = join_all(
            alone
                .iter()
                .map(|at| self.send_until(&envelopes[*at], deadline)),
        )
        .await;
        for (at, result) in alone.into_iter().zip(sent) {
            outcomes[at] = Some(result);
        }
        outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| {
                    Err(RelayError::Unavailable {
                        destination: self.name.clone(),
                        reason: "no outcome".into(),
                    })
                })
            })
            .collect()
    }

    /// Publishes `ready` on one channel, then waits for each confirm: the outcome of each, or
    /// none for those the channel closed on before their confirm (the broker refused one of
    /// them by closing it, or the connection broke). A message that comes back unroutable is
    /// found by its message id: lapin hands a return to whichever confirm of the channel
    /// completes next, which need not be its own message's.
    async fn publish_together(
        &self,
        ready: &[Publish<'_>],
        used: &AtomicU64,
    ) -> Result<Vec<Option<Result<(), RelayError>>>, RelayError> {
        let (channel, generation) = self.checkout().await?;
        used.store(generation, Ordering::Relaxed);
        let mut confirms = Vec::with_capacity(ready.len());
        for publish in ready {
            let confirm = channel
                .basic_publish(
                    self.exchange.clone(),
                    publish.routing_key.clone(),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    publish.body,
                    publish.properties.clone(),
                )
                .await;
            let Ok(confirm) = confirm else {
                // The channel closed: the rest are not published on it.
                break;
            };
            confirms.push(confirm);
        }
        let mut outcomes: Vec<Option<Result<(), RelayError>>> = Vec::with_capacity(ready.len());
        let mut returned = Vec::new();
        let mut closed = confirms.len() < ready.len();
        for confirm in confirms {
            outcomes.push(match confirm.await {
                Ok(Confirmation::Ack(came_back)) => {
                    returned.extend(came_back);
                    Some(Ok(()))
                }
                Ok(Confirmation::Nack(came_back)) => {
                    returned.extend(came_back);
                    Some(Err(RelayError::Refused {
                        destination: self.name.clone(),
                        reason: NACKED.into(),
                    }))
                }
                Ok(Confirmation::NotRequested) => Some(Err(RelayError::Unavailable {
                    destination: self.name.clone(),
                    reason: "the channel is not in confirm mode".into(),
                })),
                Err(_) => {
                    closed = true;
                    None
                }
            });
        }
        outcomes.resize_with(ready.len(), || None);
        let ids: Vec<&str> = ready
            .iter()
            .map(|publish| publish.message_id.as_str())
            .collect();
        let came_back: Vec<Option<String>> = returned
            .iter()
            .map(|message| {
                let id = message.delivery.properties.message_id();
                id.as_ref().map(|id| id.as_str().to_owned())
            })
            .collect();
        match whose(&ids, &came_back) {
            Some(owners) => {
                for (message, at) in returned.iter().zip(owners) {
                    outcomes[at] =
                        Some(Err(unroutable(&self.name, &ready[at].routing_key, message)));
                }
            }
            None => {
                // Which message came back is unknown: each is published again alone, which
                // finds it (a duplicate of the others rather than a loss).
                log::error!(
                    "outbox destination {}: a message came back that its batch cannot tell \
                     apart ({came_back:?}); publishing the batch again one message at a time",
                    self.name
                );
                outcomes.iter_mut().for_each(|outcome| *outcome = None);
            }
        }
        if closed {
            if !self.connection_alive(generation).await {
                self.forget_link(generation).await;
            }
        } else {
            self.check_in(channel, generation).await;
        }
        Ok(outcomes)
    }

    fn properties(&self, envelope: &Envelope) -> Result<BasicProperties, RelayError> {
        let short = |what: &str, value: &str| {
            ShortString::try_new(value).map_err(|_| RelayError::Invalid {
                destination: self.name.clone(),
                reason: format!("the {what} holds at most 255 bytes in AMQP"),
            })
        };
        let mut table = FieldTable::default();
        for (name, value) in envelope.transport_headers(|_| false) {
            table.insert(
                short("header name", name)?,
                AMQPValue::LongString(LongString::from(value.into_bytes())),
            );
        }
        Ok(BasicProperties::default()
            .with_message_id(short("message id", &envelope.message_id.to_string())?)
            .with_type(short("message type", &envelope.message_type)?)
            .with_content_type(short("content type", &envelope.content_type)?)
            .with_delivery_mode(PERSISTENT)
            .with_headers(table))
    }

    async fn publish(
        &self,
        routing_key: ShortString,
        body: &[u8],
        properties: BasicProperties,
        used: &AtomicU64,
    ) -> Result<(), RelayError> {
        let (channel, generation) = self.checkout().await?;
        used.store(generation, Ordering::Relaxed);
        let confirm = channel
            .basic_publish(
                self.exchange.clone(),
                routing_key.clone(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                properties,
            )
            .await;
        let confirmation = match confirm {
            Ok(confirm) => confirm.await,
            Err(error) => Err(error),
        };
        let result = match confirmation {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => {
                Err(unroutable(&self.name, &routing_key, &returned))
            }
            Ok(Confirmation::Nack(_)) => Err(RelayError::Refused {
                destination: self.name.clone(),
                reason: NACKED.into(),
            }),
            Ok(Confirmation::NotRequested) => Err(RelayError::Unavailable {
                destination: self.name.clone(),
                reason: "the channel is not in confirm mode".into(),
            }),
            Err(error) => {
                if !self.connection_alive(generation).await {
                    self.forget_link(generation).await;
                }
                // The channel is closed; only this publish was on it.
                return Err(self.classify(error));
            }
        };
        self.check_in(channel, generation).await;
        result
    }

    /// A channel in confirm mode with nothing else on it, opening a connection first if there
    /// is none or the last one broke.
    async fn checkout(&self) -> Result<(Channel, u64), RelayError> {
        let mut link = self.link.lock().await;
        if let Some(open) = link
            .as_mut()
            .filter(|open| open.connection.status().connected())
        {
            while let Some(channel) = open.idle.pop() {
                if channel.status().connected() {
                    return Ok((channel, open.generation));
                }
            }
            if open.connection.status().blocked() {
                return Err(self.blocked_error());
            }
            let (connection, generation) = (Arc::clone(&open.connection), open.generation);
            drop(link);
            let channel = self.confirming_channel(&connection).await?;
            return Ok((channel, generation));
        }
        *link = None;
        let unavailable = |reason: String| RelayError::Unavailable {
            destination: self.name.clone(),
            reason,
        };
        let connection = tokio::time::timeout(
            self.connect_timeout,
            Connection::connect(&self.url, ConnectionProperties::default()),
        )
        .await
        .map_err(|_| unavailable(format!("connecting took over {:?}", self.connect_timeout)))?
        .map_err(|error| unavailable(format!("cannot connect: {error}")))?;
        let channel = self.confirming_channel(&connection).await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *link = Some(Link {
            generation,
            connection: Arc::new(connection),
            idle: Vec::new(),
        });
        Ok((channel, generation))
    }

    async fn confirming_channel(&self, connection: &Connection) -> Result<Channel, RelayError> {
        let unavailable = |reason: String| RelayError::Unavailable {
            destination: self.name.clone(),
            reason,
        };
        let channel = connection
            .create_channel()
            .await
            .map_err(|error| unavailable(format!("cannot open a channel: {error}")))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|error| unavailable(format!("cannot enable publisher confirms: {error}")))?;
        Ok(channel)
    }

    /// Gives a channel whose publish was confirmed back for the next publish, if its
    /// connection is still the current one.
    async fn check_in(&self, channel: Channel, generation: u64) {
        let mut link = self.link.lock().await;
        if let Some(open) = link.as_mut().filter(|open| open.generation == generation) {
            if channel.status().connected() {
                open.idle.push(channel);
            }
        }
    }

    /// Whether connection `generation` is the current one and still open.
    async fn connection_alive(&self, generation: u64) -> bool {
        let link = self.link.lock().await;
        link.as_ref().is_some_and(|open| {
            open.generation == generation && open.connection.status().connected()
        })
    }

    /// Whether the broker blocked the current connection (or connection `generation`, if it is
    /// still the current one) for a resource alarm: it then reads nothing from it, so a publish
    /// would only wait for its timeout.
    async fn blocked(&self, generation: Option<u64>) -> bool {
        let link = self.link.lock().await;
        link.as_ref().is_some_and(|open| {
            generation.is_none_or(|generation| open.generation == generation)
                && open.connection.status().connected()
                && open.connection.status().blocked()
        })
    }

    fn blocked_error(&self) -> RelayError {
        RelayError::Refused {
            destination: self.name.clone(),
            reason: "the broker blocked the connection (a memory or disk alarm): it takes no \
                     publishes until the alarm clears"
                .into(),
        }
    }

    /// Forgets connection `generation` (0: none was taken) if it is still the current one.
    async fn forget_link(&self, generation: u64) {
        let mut link = self.link.lock().await;
        if link
            .as_ref()
            .is_some_and(|open| open.generation == generation)
        {
            *link = None;
        }
    }

    fn classify(&self, error: lapin::Error) -> RelayError {
        let destination = self.name.clone();
        let reason = error.to_string();
        if let ErrorKind::ProtocolError(amqp) = error.kind() {
            if let AMQPErrorKind::Soft(soft) = amqp.kind() {
                match soft {
                    AMQPSoftError::NOTFOUND | AMQPSoftError::NOROUTE => {
                        return RelayError::Unroutable {
                            destination,
                            reason,
                        }
                    }
                    AMQPSoftError::CONTENTTOOLARGE => {
                        return RelayError::TooLarge {
                            destination,
                            reason,
                        }
                    }
                    // RabbitMQ answers a message over `max_message_size` this way.
                    AMQPSoftError::PRECONDITIONFAILED if reason.contains("message size") => {
                        return RelayError::TooLarge {
                            destination,
                            reason,
                        }
                    }
                    AMQPSoftError::ACCESSREFUSED | AMQPSoftError::PRECONDITIONFAILED => {
                        return RelayError::Invalid {
                            destination,
                            reason,
                        }
                    }
                    _ => {}
                }
            }
        }
        RelayError::Unavailable {
            destination,
            reason,
        }
    }
}

/// One envelope of a batch, ready to publish.
struct Publish<'a> {
    /// Its place in the batch.
    at: usize,
    message_id: String,
    routing_key: ShortString,
    properties: BasicProperties,
    body: &'a [u8],
}

/// The place in a batch published with message ids `ids` of each message that came back with
/// `came_back`'s ids, each place taken once (a replay can share its original's id); `None` if one
/// cannot be told: no id, or none left in the batch.
fn whose(ids: &[&str], came_back: &[Option<String>]) -> Option<Vec<usize>> {
    let mut taken = vec![false; ids.len()];
    came_back
        .iter()
        .map(|id| {
            let id = id.as_deref()?;
            let at = (0..ids.len()).find(|at| !taken[*at] && ids[*at] == id)?;
            taken[at] = true;
            Some(at)
        })
        .collect()
}

/// Why a `basic.nack` refused a message.
const NACKED: &str = "the broker did not take the message (basic.nack: a queue at its \
                      x-max-length with overflow reject-publish, or an error in a queue)";

/// A mandatory message that came back: no queue is bound to its routing key.
fn unroutable(
    destination: &str,
    routing_key: &ShortString,
    returned: &BasicReturnMessage,
) -> RelayError {
    RelayError::Unroutable {
        destination: destination.to_owned(),
        reason: format!(
            "no queue is bound to receive routing key `{}` ({} {})",
            routing_key.as_str().escape_debug(),
            returned.reply_code,
            returned.reply_text
        ),
    }
}

impl RabbitMqDestinationBuilder {
    /// The routing key of messages whose envelope names none (default: their message type).
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = Some(routing_key.into());
        self
    }

    /// The exchange messages are published to: the default exchange (`""`, routing straight
    /// to the queue the routing key names) unless set. The exchange must exist.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// How long a publish may take, connecting included, until the broker confirms (10 s by
    /// default); past it the attempt is a retryable [`RelayError::Timeout`]. Keep it below
    /// the worker's handler timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long opening a connection may take (5 s by default).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Starts the destination's runtime. It connects on the first publish, so a worker can
    /// start before its broker.
    pub fn build(self) -> Result<RabbitMqDestination, RelayError> {
        let config = |reason: String| RelayError::Config {
            destination: KIND,
            reason,
        };
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(config("the timeouts must be longer than zero".into()));
        }
        self.url.parse::<lapin::uri::AMQPUri>().map_err(|error| {
            config(format!(
                "`{}` is not an AMQP URI: {error}",
                shown_url(&self.url)
            ))
        })?;
        let exchange = ShortString::try_new(self.exchange.as_str())
            .map_err(|_| config("an exchange name holds at most 255 bytes".into()))?;
        let name = if self.exchange.is_empty() {
            format!("{KIND} {} (default exchange)", shown_url(&self.url))
        } else {
            format!(
                "{KIND} {} exchange `{}`",
                shown_url(&self.url),
                self.exchange
            )
        };
        let (runtime, ()) = OwnedRuntime::start("rabbitmq", || async { Ok(()) })?;
        Ok(RabbitMqDestination {
            inner: Arc::new(Inner {
                name,
                url: self.url,
                exchange,
                routing_key: self.routing_key,
                timeout: self.timeout,
                connect_timeout: self.connect_timeout,
                link: Mutex::new(None),
                generations: AtomicU64::new(0),
                runtime,
            }),
        })
    }
}

impl fmt::Debug for RabbitMqDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqDestination")
            .field("name", &self.inner.name)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl fmt::Debug for RabbitMqDestinationBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqDestinationBuilder")
            .field("url", &shown_url(&self.url))
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::whose;

    fn ids(ids: &[&str]) -> Vec<Option<String>> {
        ids.iter().map(|id| Some((*id).to_owned())).collect()
    }

    #[test]
    fn a_return_is_told_by_its_message_id_whichever_confirm_carried_it() {
        let batch = ["a", "b", "c", "d"];
        assert_eq!(whose(&batch, &ids(&["c", "a"])), Some(vec![2, 0]));
        assert_eq!(whose(&batch, &[]), Some(vec![]));
    }

    #[test]
    fn two_returns_of_one_id_are_two_messages() {
        let batch = ["a", "b", "a"];
        assert_eq!(whose(&batch, &ids(&["a", "a"])), Some(vec![0, 2]));
        assert_eq!(
            whose(&batch, &ids(&["a", "a", "a"])),
            None,
            "only two were sent"
        );
    }

    #[test]
    fn a_return_the_batch_cannot_place_is_no_one_s() {
        assert_eq!(whose(&["a", "b"], &ids(&["z"])), None);
        assert_eq!(whose(&["a", "b"], &[None]), None);
    }
}
