//! Relaying to real brokers (NATS JetStream, RabbitMQ and Kafka on 127.0.0.1): every committed
//! message arrives with its id, type, ordering key and headers, in per-key order; what the
//! broker will never take is dead-lettered with the reason and the rest retried; a broker
//! restart mid-drain pauses the destination (its messages wait without spending attempts, a
//! probe resumes them) and loses nothing, a worker killed mid-drain loses nothing, and on
//! JetStream each message enters the stream once. A broker that pushes back (a full stream,
//! queue or producer queue, a connection blocked by a memory alarm) holds the destination without spending
//! attempts, and everything arrives once it takes messages again.
//!
//! The tests of one broker take turns (one restarts it while another would be reading).

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use outbox_diesel::delivery_log::AttemptFilter;
use outbox_diesel::destination::{
    Answer, DeliveryError, Destination, DestinationOptions, Envelope, HealthPolicy,
};
use outbox_diesel::{
    Batch, DieselStore, EnqueueOptions, FailureKind, MessageId, RetryPolicy, Worker,
};
use outbox_relay::{JetStreamDestination, KafkaDestination, RabbitMqDestination};
use outbox_testkit::outbox::{attempts, dead, pending};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb, TestPool};
use outbox_tests::brokers::{
    arrivals, Broker, RabbitMqAlarm, RabbitMqMessageLimit, Received, TestQueue, TestStream,
    TestTopic,
};
use outbox_tests::checker::{check, Ledger, Report};
use outbox_tests::handlers::{Relayed, RELAY};

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

static JETSTREAM: Mutex<()> = Mutex::new(());
static RABBITMQ: Mutex<()> = Mutex::new(());
static KAFKA: Mutex<()> = Mutex::new(());

/// The broker to itself for the test, if it is up.
fn take(broker: Broker) -> Option<MutexGuard<'static, ()>> {
    let lock = match broker {
        Broker::JetStream => &JETSTREAM,
        Broker::RabbitMq => &RABBITMQ,
        Broker::Kafka => &KAFKA,
    };
    let guard = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    broker.available().then_some(guard)
}

fn jetstream(timeout: Duration) -> JetStreamDestination {
    JetStreamDestination::builder(Broker::JetStream.url())
        .timeout(timeout)
        .build()
        .unwrap()
}

fn rabbitmq(timeout: Duration) -> RabbitMqDestination {
    RabbitMqDestination::builder(Broker::RabbitMq.url())
        .timeout(timeout)
        .build()
        .unwrap()
}

fn jetstream_to(subject: &str, timeout: Duration) -> JetStreamDestination {
    JetStreamDestination::builder(Broker::JetStream.url())
        .subject(subject)
        .timeout(timeout)
        .build()
        .unwrap()
}

fn rabbitmq_to(routing_key: &str, timeout: Duration) -> RabbitMqDestination {
    RabbitMqDestination::builder(Broker::RabbitMq.url())
        .routing_key(routing_key)
        .timeout(timeout)
        .build()
        .unwrap()
}

fn kafka_to(topic: &str, timeout: Duration) -> KafkaDestination {
    KafkaDestination::builder(Broker::Kafka.url())
        .topic(topic)
        .timeout(timeout)
        .build()
        .unwrap()
}

/// The records of a topic in the checker's order (partition by partition), after checking
/// that each key lives in one partition: per-key order holds within a partition, so the
/// concatenation keeps every key's order.
fn by_partition(records: Vec<(i32, Received)>) -> Vec<Received> {
    let mut partition_of = std::collections::HashMap::new();
    for (partition, record) in &records {
        if let Some(key) = &record.ordering_key {
            let first = *partition_of.entry(key.clone()).or_insert(*partition);
            assert_eq!(first, *partition, "key {key} is in two partitions");
        }
    }
    records.into_iter().map(|(_, record)| record).collect()
}

outbox_tests::declare_routed!();

/// Enqueues `count` messages over `keys` keys (and every fifth without a key), the first
/// carrying a `traceparent`, into the ledger: the first half as [`Routed`] (so that a backlog
/// holds runs of them, which go in batches where the destination takes them), the rest as
/// [`Relayed`].
fn enqueue<C: TestConnection>(pool: &TestPool<C>, count: u32, keys: u32, ledger: &mut Ledger) {
    let mut batch = Batch::new();
    let mut sent = Vec::new();
    for n in 0..count {
        let key = (n % 5 != 0).then(|| format!("key-{}", n % keys));
        let mut options = EnqueueOptions::new();
        if let Some(key) = &key {
            options = options.ordering_key(key.clone());
        }
        if n == 0 {
            options = options.header("traceparent", TRACEPARENT);
        }
        let id = if n < count / 2 {
            let message = Routed {
                n,
                key: key.clone(),
            };
            batch.push_with(&message, &options).unwrap()
        } else {
            batch
                .push_with(&Relayed::new(n, key.as_deref()), &options)
                .unwrap()
        };
        sent.push((id, key));
    }
    let mut conn = pool.get().unwrap();
    let ids = batch.enqueue(&mut *conn).unwrap();
    assert_eq!(ids.len(), sent.len());
    for (id, key) in sent {
        ledger.committed(id, key);
    }
}

/// A worker relaying to `target`, which it pauses after 3 failures in a row for half a
/// second, and which gives a message 100 attempts (or `attempts`).
fn worker<C: TestConnection>(
    pool: &TestPool<C>,
    target: impl Destination,
) -> outbox_diesel::WorkerHandle {
    worker_with_attempts(pool, target, 100)
}

fn worker_with_attempts<C: TestConnection>(
    pool: &TestPool<C>,
    target: impl Destination,
    attempts: u32,
) -> outbox_diesel::WorkerHandle {
    let health = HealthPolicy::new()
        .failures_to_pause(3)
        .first_pause(Duration::from_millis(500))
        .longest_pause(Duration::from_secs(1));
    Worker::builder(DieselStore::new(pool.clone()))
        .destination_with(
            RELAY,
            target,
            DestinationOptions::new().health_policy(health),
        )
        .handler_threads(8)
        .poll_interval(Duration::from_millis(50))
        .retry_policy(
            RetryPolicy::new()
                .max_attempts(attempts)
                .initial_backoff(Duration::from_millis(50))
                .max_backoff(Duration::from_millis(500)),
        )
        .spawn()
        .unwrap()
}

fn dead_ids<C: TestConnection>(pool: &TestPool<C>) -> HashSet<MessageId> {
    dead(pool).into_iter().map(|d| d.message_id).collect()
}

/// Drains the outbox through the worker, then checks what arrived against the ledger.
fn drain<C: TestConnection>(
    pool: &TestPool<C>,
    target: impl Destination,
    ledger: &Ledger,
    read: impl FnOnce() -> Vec<Received>,
) -> (Report, Vec<Received>) {
    let worker = worker(pool, target);
    assert!(
        eventually(Duration::from_secs(60), || pending(pool).is_empty()),
        "the outbox did not drain: {} left",
        pending(pool).len()
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();
    let received = read();
    (
        check(ledger, &arrivals(&received), &dead_ids(pool)),
        received,
    )
}

/// Enqueues 300 messages over 7 keys (and without), drains them through `target`, and checks
/// that each arrived once, in key order, as it was enqueued; and that the delivery log has one
/// delivered attempt of each, with the broker's answer as `answered` expects it (`None`: the
/// broker says nothing worth keeping).
fn relay_all_once<C: TestConnection>(
    db: &TestDb,
    target: impl Destination,
    read: impl FnOnce() -> Vec<Received>,
    answered: Option<&str>,
) {
    let pool = db.pool::<C>(13);
    let mut ledger = Ledger::new();
    enqueue(&pool, 300, 7, &mut ledger);
    let batches = target.batch_limit() > 1;
    let largest = Arc::new(AtomicUsize::new(0));
    let watched = Watched {
        inner: target,
        largest: Arc::clone(&largest),
    };
    let (report, received) = drain(&pool, watched, &ledger, read);
    if batches {
        assert!(
            largest.load(Ordering::SeqCst) > 1,
            "a backlog of routed messages went out one at a time"
        );
    }
    assert!(report.holds(0), "{report:#?}");
    assert_eq!(report.delivered, 300);
    assert_faithful(&received, 300);
    let logged = attempts(&pool, &AttemptFilter::default());
    assert_eq!(logged.len(), 300);
    assert!(logged.iter().all(|a| a.outcome == "delivered"));
    let answers: HashSet<Option<&str>> = logged.iter().map(|a| a.answer.as_deref()).collect();
    match answered {
        // Each message's own place in the broker: as many answers as messages.
        Some(starts) => {
            assert_eq!(answers.len(), 300, "{answers:?}");
            assert!(
                answers
                    .iter()
                    .all(|answer| answer.is_some_and(|a| a.starts_with(starts))),
                "{answers:?}"
            );
        }
        None => assert_eq!(answers, HashSet::from([None])),
    }
}

/// Passes everything to the destination it wraps, keeping the largest batch it was given.
struct Watched<D> {
    inner: D,
    largest: Arc<AtomicUsize>,
}

impl<D: Destination> Destination for Watched<D> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        self.inner.deliver(envelope)
    }

    fn deliver_answered(&self, envelope: &Envelope) -> Result<Answer, DeliveryError> {
        self.inner.deliver_answered(envelope)
    }

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
        self.largest.fetch_max(envelopes.len(), Ordering::SeqCst);
        self.inner.deliver_batch(envelopes)
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
}

/// What arrived is what was enqueued: data as the body, id, type, key and headers along.
fn assert_faithful(received: &[Received], count: u32) {
    for message in received {
        let n = message.body["n"].as_u64().expect("the data's n") as u32;
        let routed = n < count / 2;
        assert_eq!(
            message.message_type,
            if routed { "test.routed" } else { "test.relay" }
        );
        assert_eq!(
            message.body,
            serde_json::to_value(Relayed::new(n, message.ordering_key.as_deref())).unwrap(),
            "the body is the data as JSON"
        );
        assert_eq!(
            message.header("traceparent"),
            (n == 0).then_some(TRACEPARENT),
            "message {n}'s own headers go along"
        );
    }
}

fn every_message_arrives_once_in_key_order_on_jetstream<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::JetStream) else {
        return;
    };
    let stream = TestStream::create("drain", -1, Duration::from_secs(120));
    relay_all_once::<C>(
        db,
        jetstream_to(&stream.subject("events"), Duration::from_secs(5)),
        || stream.messages(),
        Some("stream "),
    );
}

fn every_message_arrives_in_key_order_on_rabbitmq<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::declare("drain");
    relay_all_once::<C>(
        db,
        rabbitmq_to(&queue.name, Duration::from_secs(5)),
        || queue.take_all(),
        None,
    );
}

fn every_message_arrives_in_key_order_in_kafka_partitions<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::Kafka) else {
        return;
    };
    let topic = TestTopic::create("drain");
    relay_all_once::<C>(
        db,
        kafka_to(&topic.name, Duration::from_secs(5)),
        || by_partition(topic.records()),
        Some("partition "),
    );
}

/// How many messages the push-back tests relay, and how many the broker holds at once.
const BEHIND: u32 = 40;
const ROOM: usize = 10;

/// Relays [`BEHIND`] messages to a broker that holds [`ROOM`] and refuses more until a consumer
/// takes some out (`take` takes up to so many), then checks that each arrived once, in key
/// order, and that the refusals were push-back: a message has two attempts, so counted ones
/// would dead-letter, and none was retried (the destination was not taken for down either).
fn behind_consumer<C: TestConnection>(
    db: &TestDb,
    target: impl Destination,
    take: impl Fn(usize) -> Vec<Received>,
) {
    let pool = db.pool::<C>(23);
    let mut ledger = Ledger::new();
    enqueue(&pool, BEHIND, 7, &mut ledger);
    let worker = worker_with_attempts(&pool, target, 2);
    let mut received = Vec::new();
    let start = std::time::Instant::now();
    while !pending(&pool).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "{} still pending, {} received",
            pending(&pool).len(),
            received.len()
        );
        std::thread::sleep(Duration::from_millis(100));
        received.extend(take(ROOM / 2));
    }
    let stats = worker.shutdown(Duration::from_secs(10)).unwrap();
    received.extend(take(usize::MAX));
    let report = check(&ledger, &arrivals(&received), &dead_ids(&pool));
    assert!(report.holds(0), "{report:#?}");
    assert_eq!(report.delivered, BEHIND as usize);
    assert_eq!(
        (stats.retried, stats.dead_lettered),
        (0, 0),
        "push-back never spends an attempt: {stats:?}"
    );
    assert!(
        stats.deferred > 0,
        "the broker never pushed back: {stats:?}"
    );
    assert_faithful(&received, BEHIND);
}

fn a_full_stream_holds_the_destination_without_spending_attempts<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::JetStream) else {
        return;
    };
    let stream = TestStream::bounded("full", ROOM as i64);
    behind_consumer::<C>(
        db,
        jetstream_to(&stream.subject("events"), Duration::from_secs(5)),
        |count| stream.take_oldest(count),
    );
}

fn a_full_queue_holds_the_destination_without_spending_attempts<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::bounded("full", ROOM as u32);
    behind_consumer::<C>(
        db,
        rabbitmq_to(&queue.name, Duration::from_secs(5)),
        |count| queue.take(count),
    );
}

backend_tests!(
    every_message_arrives_once_in_key_order_on_jetstream,
    every_message_arrives_in_key_order_on_rabbitmq,
    every_message_arrives_in_key_order_in_kafka_partitions,
    a_full_stream_holds_the_destination_without_spending_attempts,
    a_full_queue_holds_the_destination_without_spending_attempts
);

/// A Kafka producer whose local queue holds one record, fed by eight handler threads: the
/// others find it full (librdkafka's `QueueFull`), which is push-back too. Each message has two
/// attempts; all arrive, none retried.
fn a_full_producer_queue_holds_the_destination_without_spending_attempts<C: TestConnection>(
    db: &TestDb,
) {
    let Some(_broker) = take(Broker::Kafka) else {
        return;
    };
    let topic = TestTopic::create("full");
    let target = KafkaDestination::builder(Broker::Kafka.url())
        .topic(&topic.name)
        .timeout(Duration::from_secs(10))
        .set("queue.buffering.max.messages", "1")
        .build()
        .unwrap();
    let pool = db.pool::<C>(23);
    let mut ledger = Ledger::new();
    enqueue(&pool, BEHIND, 7, &mut ledger);
    let worker = worker_with_attempts(&pool, target, 2);
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).is_empty()),
        "{} still pending",
        pending(&pool).len()
    );
    let stats = worker.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (stats.retried, stats.dead_lettered),
        (0, 0),
        "push-back never spends an attempt: {stats:?}"
    );
    assert!(stats.deferred > 0, "the queue was never full: {stats:?}");
    let received = by_partition(topic.records());
    let report = check(&ledger, &arrivals(&received), &dead_ids(&pool));
    assert!(report.holds(0), "{report:#?}");
    assert_eq!(report.delivered, BEHIND as usize);
}

/// RabbitMQ raises a memory alarm while the worker relays: it blocks the connection (it reads
/// no more publishes from it), so publishes get no confirm. Each message has one attempt, so a
/// publish timing out counted as a failure would dead-letter it; instead the destination is
/// held while the connection is blocked, and everything arrives once the alarm clears (a
/// publish stuck in the blocked connection may arrive twice, as after any lost confirm).
fn a_blocked_rabbitmq_connection_holds_the_destination_without_spending_attempts<
    C: TestConnection,
>(
    db: &TestDb,
) {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::declare("blocked");
    let pool = db.pool::<C>(24);
    let mut ledger = Ledger::new();
    enqueue(&pool, 30, 5, &mut ledger);
    let alarm = RabbitMqAlarm::raise();
    let worker = worker_with_attempts(&pool, rabbitmq_to(&queue.name, Duration::from_secs(1)), 1);
    // Past the publish timeout a few times over: the blocked publishes time out, and the
    // destination is held instead of the messages failing.
    std::thread::sleep(Duration::from_secs(4));
    let waiting = pending(&pool);
    assert!(dead(&pool).is_empty(), "{:#?}", dead(&pool));
    assert!(
        waiting.len() > 20 && waiting.iter().all(|m| m.attempts == 0),
        "{waiting:#?}"
    );
    drop(alarm);
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).is_empty()),
        "{} still pending after the alarm cleared",
        pending(&pool).len()
    );
    let stats = worker.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (stats.retried, stats.dead_lettered),
        (0, 0),
        "a blocked connection never spends an attempt: {stats:?}"
    );
    assert!(
        stats.deferred > 0,
        "the destination was never held: {stats:?}"
    );
    let received = queue.take_all();
    let report = check(&ledger, &arrivals(&received), &dead_ids(&pool));
    assert!(report.holds(8), "{report:#?}");
    assert_eq!(report.delivered, 30);
}

/// Delivers `data` to `subject` of `destination` as the worker would, outside any worker.
fn send(
    destination: &impl Destination,
    subject: &str,
    data: &serde_json::Value,
) -> Result<(), DeliveryError> {
    let envelope = Envelope::new(
        MessageId::new(),
        "test.relay",
        serde_json::to_vec(data).unwrap(),
    );
    destination.deliver(&envelope.with_subject(subject))
}

fn permanent(result: Result<(), DeliveryError>, reason: &str) {
    let error = result.expect_err("the broker must not take it");
    assert_eq!(error.kind(), FailureKind::Permanent, "{error}");
    assert!(error.reason().contains(reason), "{error}");
}

fn retryable(result: Result<(), DeliveryError>, reason: &str) {
    let error = result.expect_err("the broker is not there");
    assert_eq!(error.kind(), FailureKind::Retryable, "{error}");
    assert!(error.reason().contains(reason), "{error}");
}

#[test]
fn what_jetstream_will_never_take_is_permanent_and_the_rest_still_goes() {
    let Some(_broker) = take(Broker::JetStream) else {
        return;
    };
    let stream = TestStream::create("limits", 512, Duration::from_secs(120));
    let nats = jetstream(Duration::from_secs(5));
    let data = serde_json::json!({"n": 1});
    permanent(
        send(&nats, "outbox_test.nobody_listens_here", &data),
        "no stream has the subject `outbox_test.nobody_listens_here`",
    );
    for subject in [
        "",
        "a..b",
        "orders.*",
        "orders.>",
        "with space",
        "crlf\r\nPUB x 1",
    ] {
        permanent(send(&nats, subject, &data), "is not a subject");
    }
    let large = serde_json::json!({ "padding": "x".repeat(2_000) });
    permanent(send(&nats, &stream.subject("big"), &large), "too large");
    // Over the server's max_payload (1 MiB by default): refused before it is sent.
    let huge = serde_json::json!({ "padding": "x".repeat(2 << 20) });
    permanent(send(&nats, &stream.subject("huge"), &huge), "too large");
    send(&nats, &stream.subject("fine"), &data).unwrap();
    assert_eq!(stream.count(), 1);
}

#[test]
fn what_rabbitmq_will_never_take_is_permanent_and_the_rest_still_goes() {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::declare("limits");
    let rabbit = rabbitmq(Duration::from_secs(5));
    let data = serde_json::json!({"n": 1});
    permanent(
        send(&rabbit, "outbox_test.no_such_queue", &data),
        "no queue is bound to receive routing key `outbox_test.no_such_queue`",
    );
    permanent(send(&rabbit, &"k".repeat(256), &data), "at most 255 bytes");
    let missing_exchange = RabbitMqDestination::builder(Broker::RabbitMq.url())
        .exchange("outbox_test.no_such_exchange")
        .build()
        .unwrap();
    permanent(
        send(&missing_exchange, &queue.name, &data),
        "no exchange 'outbox_test.no_such_exchange'",
    );
    // The channel the refusal closed is replaced.
    send(&rabbit, &queue.name, &data).unwrap();
    send(&rabbit, &queue.name, &data).unwrap();
    assert_eq!(queue.take_all().len(), 2);
}

/// One batch on one channel: messages that come back unroutable, one whose routing key is too
/// long, and one over the broker's size limit (which closes the channel on the rest) each fail
/// with their own reason, and every other message arrives.
#[test]
fn a_rabbitmq_batch_tells_each_refused_message_apart() {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::declare("batch_limits");
    let _limit = RabbitMqMessageLimit::set(1 << 20);
    let rabbit = rabbitmq(Duration::from_secs(5));
    assert!(rabbit.batch_limit() >= 20, "{}", rabbit.batch_limit());
    let batch = |oversized: Option<usize>| -> Vec<Envelope> {
        (0..20)
            .map(|n| {
                let padding = if Some(n) == oversized {
                    "x".repeat(2 << 20)
                } else {
                    String::new()
                };
                let data = serde_json::json!({ "n": n, "padding": padding });
                let subject = match n {
                    3 | 11 | 17 => "outbox_test.nobody_is_bound_here".to_owned(),
                    7 => "k".repeat(256),
                    _ => queue.name.clone(),
                };
                Envelope::new(
                    MessageId::new(),
                    "test.relay",
                    serde_json::to_vec(&data).unwrap(),
                )
                .with_subject(subject)
            })
            .collect()
    };
    for oversized in [None, Some(13)] {
        let sent = batch(oversized);
        let outcomes = rabbit.deliver_batch(&sent);
        assert_eq!(outcomes.len(), sent.len());
        let mut delivered = HashSet::new();
        for (n, outcome) in outcomes.into_iter().enumerate() {
            match n {
                3 | 11 | 17 => permanent(
                    outcome.map(drop),
                    "no queue is bound to receive routing key `outbox_test.nobody_is_bound_here`",
                ),
                7 => permanent(outcome.map(drop), "at most 255 bytes"),
                n if Some(n) == oversized => permanent(outcome.map(drop), "too large"),
                n => {
                    outcome.unwrap_or_else(|error| panic!("message {n}: {error}"));
                    delivered.insert(sent[n].message_id.to_string());
                }
            }
        }
        let arrived: Vec<String> = queue
            .take_all()
            .into_iter()
            .map(|message| message.id.to_string())
            .collect();
        let distinct: HashSet<&String> = arrived.iter().collect();
        assert_eq!(
            distinct,
            delivered.iter().collect(),
            "with message {oversized:?} oversized"
        );
        if oversized.is_none() {
            // Nothing closed the channel, so nothing was published twice.
            assert_eq!(arrived.len(), delivered.len(), "{arrived:?}");
        }
    }
}

#[test]
fn what_kafka_will_never_take_is_permanent_and_the_rest_still_goes() {
    let Some(_broker) = take(Broker::Kafka) else {
        return;
    };
    let topic = TestTopic::create("limits");
    let producer = KafkaDestination::builder(Broker::Kafka.url())
        .timeout(Duration::from_secs(5))
        .set("message.max.bytes", "2000")
        .build()
        .unwrap();
    let data = serde_json::json!({"n": 1});
    for name in ["", "with space", "orders/shipped", &"t".repeat(250)] {
        permanent(send(&producer, name, &data), "is not a topic name");
    }
    let large = serde_json::json!({ "padding": "x".repeat(5_000) });
    permanent(send(&producer, &topic.name, &large), "too large");
    send(&producer, &topic.name, &data).unwrap();
    assert_eq!(topic.count(), 1);
}

#[test]
fn an_unreachable_broker_is_retried_never_dead_lettered() {
    // Nothing listens on port 1 of the loopback address.
    let nats = JetStreamDestination::builder("nats://127.0.0.1:1")
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    retryable(
        send(&nats, "orders.shipped", &serde_json::json!(1)),
        "did not acknowledge the message within 300ms",
    );
    let rabbit = RabbitMqDestination::builder("amqp://guest:guest@127.0.0.1:1/%2f")
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let error = send(&rabbit, "orders", &serde_json::json!(1)).unwrap_err();
    assert_eq!(error.kind(), FailureKind::Retryable, "{error}");
    assert!(
        error.reason().contains("is unavailable: cannot connect"),
        "{error}"
    );
    assert!(
        !error.reason().contains("guest:guest"),
        "no password in reasons: {error}"
    );
}

#[test]
fn destinations_are_built_and_dropped_inside_an_async_runtime_without_panicking() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let nats = jetstream(Duration::from_secs(1));
        let rabbit = rabbitmq(Duration::from_secs(1));
        assert!(format!("{nats:?}").contains("JetStream"));
        assert!(!format!("{rabbit:?}").contains("guest:guest"));
        drop(nats);
        drop(rabbit);
    });
}

/// Restarts the broker once 200 messages arrived (of 2,000; RabbitMQ 10,000), and checks that
/// the destination was paused meanwhile and every message still arrives, in key order, with no
/// duplicate unless `deduplicates` is false; then at most one per failed attempt (a duplicate
/// is a publish the broker stored but whose acknowledgement the restart swallowed, so its
/// attempt failed). A message has 4 attempts: the outage lasts seconds, so without the pause
/// (messages waiting without spending attempts, a probe resuming them) some would be
/// dead-lettered.
fn survive_a_restart<C: TestConnection>(
    broker: Broker,
    target: impl Destination,
    count: impl Fn() -> usize,
    read: impl FnOnce() -> Vec<Received>,
    db: &TestDb,
    deduplicates: bool,
) {
    let pool = db.pool::<C>(13);
    let mut ledger = Ledger::new();
    // `rabbitmqctl` starts an Erlang VM before it stops anything, seconds under load: a backlog
    // that lasts longer than that, so that the restart meets the drain.
    let messages = if broker == Broker::RabbitMq {
        10_000
    } else {
        2_000
    };
    enqueue(&pool, messages, 16, &mut ledger);
    let worker = worker_with_attempts(&pool, target, 4);
    assert!(
        eventually(Duration::from_secs(60), || count() >= 200),
        "nothing arrived before the restart"
    );
    let left_at_restart = pending(&pool).len();
    let watching = std::sync::atomic::AtomicBool::new(true);
    let states = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut seen = HashSet::new();
            while watching.load(Ordering::Relaxed) {
                if let Some(state) = worker.destination_state(RELAY) {
                    seen.insert(state.name());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            seen
        });
        broker.restart();
        assert!(
            eventually(Duration::from_secs(120), || pending(&pool).is_empty()),
            "the outbox did not drain after the restart: {} left",
            pending(&pool).len()
        );
        watching.store(false, Ordering::Relaxed);
        watcher.join().unwrap()
    });
    let stats = worker.stats();
    let final_state = worker.destination_state(RELAY).unwrap();
    worker.shutdown(Duration::from_secs(10)).unwrap();
    let report = check(&ledger, &arrivals(&read()), &dead_ids(&pool));
    eprintln!(
        "{broker:?} restart: {left_at_restart} left at the restart, {} attempts failed, {} \
         deferred, states {states:?}, {}",
        stats.retried,
        stats.deferred,
        report.figures()
    );
    assert!(left_at_restart > 0, "the drain ended before the restart");
    assert!(
        stats.retried > 0,
        "the restart failed no publish: it did not hit the drain"
    );
    assert!(
        states.contains("paused"),
        "the outage did not pause the destination: {states:?}"
    );
    assert!(stats.deferred > 0, "no message waited out the pause");
    assert_eq!(final_state.name(), "healthy", "a probe resumed it");
    // A duplicate is a publish the broker stored whose confirm the restart swallowed: at most
    // one per publish that failed, counted as a retry, or deferred when the pause came while
    // its batch was in flight.
    let allowed_duplicates = if deduplicates {
        0
    } else {
        (stats.retried + stats.deferred) as usize
    };
    assert!(report.holds(allowed_duplicates), "{report:#?}");
    assert_eq!(report.dead_lettered, 0);
}

fn a_jetstream_restart_mid_drain_loses_nothing_and_duplicates_nothing<C: TestConnection>(
    db: &TestDb,
) {
    let Some(_broker) = take(Broker::JetStream) else {
        return;
    };
    let stream = TestStream::create("restart", -1, Duration::from_secs(120));
    let target = jetstream_to(&stream.subject("events"), Duration::from_secs(2));
    survive_a_restart::<C>(
        Broker::JetStream,
        target,
        || stream.count() as usize,
        || stream.messages(),
        db,
        true,
    );
}

/// The Kafka broker here keeps its topics in memory: a restart loses them, and what it had
/// acknowledged. So this drill checks what the relay answers for: every message not
/// acknowledged when the broker went down (none can be while it is down) arrives after the
/// restart, once the topic is back, and nothing is dead-lettered on the way.
fn a_kafka_restart_mid_drain_loses_nothing_unacknowledged<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::Kafka) else {
        return;
    };
    let topic = TestTopic::create("restart");
    let pool = db.pool::<C>(13);
    let mut ledger = Ledger::new();
    enqueue(&pool, 2_000, 16, &mut ledger);
    let target = kafka_to(&topic.name, Duration::from_secs(2));
    let worker = worker(&pool, target);
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).len() <= 1_800),
        "nothing was relayed before the restart"
    );
    let mut unacknowledged = HashSet::new();
    Broker::Kafka.restart_with(|| {
        unacknowledged = pending(&pool).into_iter().map(|m| m.message_id).collect();
    });
    topic.recreate();
    assert!(
        eventually(Duration::from_secs(120), || pending(&pool).is_empty()),
        "the outbox did not drain after the restart: {} left, errors {:?}",
        pending(&pool).len(),
        pending(&pool)
            .iter()
            .filter_map(|m| m.last_error.clone())
            .take(3)
            .collect::<Vec<_>>()
    );
    let stats = worker.stats();
    worker.shutdown(Duration::from_secs(10)).unwrap();
    let records = by_partition(topic.records());
    let arrived: HashSet<MessageId> = records.iter().map(|r| r.id).collect();
    let missing = unacknowledged.difference(&arrived).count();
    eprintln!(
        "Kafka restart: {} unacknowledged at the restart, {} attempts failed, {} records after it, {missing} missing",
        unacknowledged.len(),
        stats.retried,
        records.len()
    );
    assert!(
        !unacknowledged.is_empty(),
        "the drain ended before the restart"
    );
    assert_eq!(
        missing, 0,
        "messages not acknowledged before the restart are missing"
    );
    assert!(
        dead_ids(&pool).is_empty(),
        "a restart dead-lettered messages"
    );
    assert!(
        stats.retried > 0,
        "the restart failed no publish: it did not hit the drain"
    );
}

fn a_rabbitmq_restart_mid_drain_loses_nothing<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::declare("restart");
    let target = rabbitmq_to(&queue.name, Duration::from_secs(2));
    survive_a_restart::<C>(
        Broker::RabbitMq,
        target,
        || queue.count(),
        || queue.take_all(),
        db,
        false,
    );
}

/// With RabbitMQ's `max_message_size` at 1 MiB, one message of 2 MiB and one to a routing key no
/// queue is bound to, among 2,700 small ones relayed by 16 handler threads, and one of 2 MiB
/// among 2,000 routed ones published in batches: those three are dead-lettered, with their
/// reasons, and nothing else. (On one shared channel, the broker
/// closing it for the large message failed every confirm pending on it: 16 dead letters, 15 of
/// them messages the broker had taken.)
fn a_message_rabbitmq_refuses_fails_alone<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::declare("refused");
    let _limit = RabbitMqMessageLimit::set(1 << 20);
    let pool = db.pool::<C>(21);
    let mut batch = Batch::new();
    for n in 0..2_700 {
        batch.push(&Relayed::new(n, None)).unwrap();
    }
    let mut large = Relayed::new(5_000, None);
    large.padding = "x".repeat(2 << 20);
    let mut lost = Relayed::new(5_001, None);
    lost.subject = Some("outbox_test.nobody_is_bound_here".into());
    let big = EnqueueOptions::new().max_payload_bytes(4 << 20);
    let large_id = batch.push_with(&large, &big).unwrap();
    let lost_id = batch.push(&lost).unwrap();
    for n in 2_700..2_710 {
        batch.push(&Relayed::new(n, None)).unwrap();
    }
    // Routed, so sent in batches: the large one among them fails alone as well.
    let mut large_routed_id = None;
    for n in 6_000..8_000 {
        if n == 7_000 {
            let large = Routed {
                n,
                key: Some("x".repeat(2 << 20)),
            };
            large_routed_id = Some(batch.push_with(&large, &big).unwrap());
        } else {
            batch.push(&Routed { n, key: None }).unwrap();
        }
    }
    let large_routed_id = large_routed_id.unwrap();
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .destination(RELAY, rabbitmq_to(&queue.name, Duration::from_secs(10)))
        .handler_threads(16)
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(120), || pending(&pool).is_empty()),
        "{} left",
        pending(&pool).len()
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();
    let dead = dead(&pool);
    let dead_ids: HashSet<MessageId> = dead.iter().map(|d| d.message_id).collect();
    assert_eq!(
        dead_ids,
        HashSet::from([large_id, lost_id, large_routed_id]),
        "{dead:#?}"
    );
    for letter in &dead {
        let reason = &letter.last_error;
        if letter.message_id != lost_id {
            assert!(reason.contains("too large"), "{reason}");
        } else {
            assert!(reason.contains("no queue is bound"), "{reason}");
        }
    }
    let arrived: HashSet<u64> = queue
        .take_all()
        .iter()
        .map(|m| m.body["n"].as_u64().unwrap())
        .collect();
    assert_eq!(
        arrived.len(),
        2_710 + 1_999,
        "every small message, once or more"
    );
}

/// A worker process relaying to `destination` is killed with SIGKILL mid-drain; an
/// in-process worker finishes after its leases expire. Returns the report and the messages
/// in flight at the kill.
fn kill_mid_drain<C: TestConnection>(
    db: &TestDb,
    destination: &str,
    target: impl Destination,
    read: impl FnOnce() -> Vec<Received>,
) -> (Report, HashSet<MessageId>) {
    let pool = db.pool::<C>(13);
    let mut ledger = Ledger::new();
    enqueue(&pool, 1_000, 16, &mut ledger);
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-test-worker"))
        .env("OUTBOX_WORKER_DATABASE_URL", db.url())
        .env("OUTBOX_WORKER_DESTINATION", destination)
        .env("OUTBOX_WORKER_LEASE_MS", "3000")
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the worker process");
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).len() <= 800),
        "the child relayed nothing"
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaping the child");
    let in_flight: HashSet<MessageId> = pending(&pool)
        .into_iter()
        .filter(|m| m.in_flight)
        .map(|m| m.message_id)
        .collect();
    let worker = worker(&pool, target);
    assert!(eventually(Duration::from_secs(60), || pending(&pool).is_empty()));
    worker.shutdown(Duration::from_secs(10)).unwrap();
    (
        check(&ledger, &arrivals(&read()), &dead_ids(&pool)),
        in_flight,
    )
}

fn a_killed_worker_puts_each_message_into_the_stream_once<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::JetStream) else {
        return;
    };
    let stream = TestStream::create("kill", -1, Duration::from_secs(120));
    let subject = stream.subject("events");
    let target = jetstream_to(&subject, Duration::from_secs(5));
    let (report, in_flight) =
        kill_mid_drain::<C>(db, &format!("jetstream:{subject}"), target, || {
            stream.messages()
        });
    eprintln!(
        "JetStream kill: {} in flight, {}",
        in_flight.len(),
        report.figures()
    );
    assert!(report.holds(0), "{report:#?}");
}

/// For brokers that keep duplicates: nothing lost or reordered, and only messages in flight
/// at the kill arrived twice.
fn assert_duplicates_only_in_flight(broker: &str, report: &Report, in_flight: &HashSet<MessageId>) {
    eprintln!(
        "{broker} kill: {} in flight, {}",
        in_flight.len(),
        report.figures()
    );
    assert!(report.holds(in_flight.len()), "{report:#?}");
    let duplicated: HashSet<MessageId> = report.duplicated.iter().copied().collect();
    assert!(
        duplicated.is_subset(in_flight),
        "a message not in flight arrived twice"
    );
}

fn a_killed_worker_duplicates_only_what_was_in_flight_on_rabbitmq<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::RabbitMq) else {
        return;
    };
    let queue = TestQueue::declare("kill");
    let target = rabbitmq_to(&queue.name, Duration::from_secs(5));
    let (report, in_flight) =
        kill_mid_drain::<C>(db, &format!("rabbitmq:{}", queue.name), target, || {
            queue.take_all()
        });
    assert_duplicates_only_in_flight("RabbitMQ", &report, &in_flight);
}

fn a_killed_worker_duplicates_only_what_was_in_flight_on_kafka<C: TestConnection>(db: &TestDb) {
    let Some(_broker) = take(Broker::Kafka) else {
        return;
    };
    let topic = TestTopic::create("kill");
    let target = kafka_to(&topic.name, Duration::from_secs(5));
    let (report, in_flight) =
        kill_mid_drain::<C>(db, &format!("kafka:{}", topic.name), target, || {
            by_partition(topic.records())
        });
    assert_duplicates_only_in_flight("Kafka", &report, &in_flight);
}

mod on_postgres {
    use outbox_testkit::{diesel::PgConnection, Backend, TestDb};

    #[test]
    fn a_blocked_rabbitmq_connection_holds_the_destination_without_spending_attempts() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_blocked_rabbitmq_connection_holds_the_destination_without_spending_attempts::<
                PgConnection,
            >(&db);
        }
    }

    #[test]
    fn a_full_producer_queue_holds_the_destination_without_spending_attempts() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_full_producer_queue_holds_the_destination_without_spending_attempts::<
                PgConnection,
            >(&db);
        }
    }

    #[test]
    fn a_message_rabbitmq_refuses_fails_alone() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_message_rabbitmq_refuses_fails_alone::<PgConnection>(&db);
        }
    }

    #[test]
    fn a_jetstream_restart_mid_drain_loses_nothing_and_duplicates_nothing() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_jetstream_restart_mid_drain_loses_nothing_and_duplicates_nothing::<PgConnection>(
                &db,
            );
        }
    }

    #[test]
    fn a_rabbitmq_restart_mid_drain_loses_nothing() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_rabbitmq_restart_mid_drain_loses_nothing::<PgConnection>(&db);
        }
    }

    #[test]
    fn a_kafka_restart_mid_drain_loses_nothing_unacknowledged() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_kafka_restart_mid_drain_loses_nothing_unacknowledged::<PgConnection>(&db);
        }
    }

    #[test]
    fn a_killed_worker_duplicates_only_what_was_in_flight_on_kafka() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_killed_worker_duplicates_only_what_was_in_flight_on_kafka::<PgConnection>(&db);
        }
    }

    #[test]
    fn a_killed_worker_puts_each_message_into_the_stream_once() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_killed_worker_puts_each_message_into_the_stream_once::<PgConnection>(&db);
        }
    }

    #[test]
    fn a_killed_worker_duplicates_only_what_was_in_flight_on_rabbitmq() {
        if let Some(db) = TestDb::new(Backend::Postgres) {
            super::a_killed_worker_duplicates_only_what_was_in_flight_on_rabbitmq::<PgConnection>(
                &db,
            );
        }
    }
}
