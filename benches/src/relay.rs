//! `drain --destination jetstream|rabbitmq`: the worker relays a prefilled backlog to a broker,
//! against the broker's own async client publishing the same messages with the same
//! acknowledgements (a JetStream publish ack with `Nats-Msg-Id`; a RabbitMQ publisher confirm,
//! mandatory and persistent) from as many concurrent tasks as the worker has handler threads,
//! each with as many in flight as the destination's batches hold, in the same run. The worker's
//! no-op drain of the same backlog (its ceiling on this database, sharing the machine's cores
//! with the database server) is measured alongside.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::protocol::BasicProperties;
use lapin::types::FieldTable;
use outbox_diesel::{DieselStore, MessageId, Worker};
use outbox_relay::{JetStreamDestination, KafkaDestination, RabbitMqDestination};
use serde_json::{json, Map, Value};

use crate::cpu;
use crate::db::{BenchConnection, BenchDb};
use crate::drain::{backlog, drain_timeout, prefill, wait_for, Kind};
use crate::handlers::{Relayed, RELAY};
use crate::report::Report;
use crate::{failed, Opts, Res, WithContext};

const NATS_URL: &str = "nats://127.0.0.1:4222";
const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const STREAM: &str = "OUTBOX_BENCH";
const SUBJECT: &str = "outbox_bench.relay";
const QUEUE: &str = "outbox_bench.relay";
const KAFKA_SERVERS: &str = "127.0.0.1:9092";
const TOPIC: &str = "outbox_bench.relay";
const PARTITIONS: i32 = 3;

/// A broker the backlog is relayed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Destination {
    /// NATS JetStream on 127.0.0.1:4222, a file-backed stream.
    Jetstream,
    /// RabbitMQ on 127.0.0.1:5672, a durable queue.
    Rabbitmq,
    /// A Kafka-compatible broker on 127.0.0.1:9092 (tansu), a topic of 3 partitions.
    Kafka,
}

impl Destination {
    /// The command names of the broker's server processes on this machine.
    fn server_processes(self) -> &'static [&'static str] {
        match self {
            Destination::Jetstream => &["nats-server"],
            Destination::Rabbitmq => &["beam.smp"],
            Destination::Kafka => &["tansu"],
        }
    }
}

/// The broker side of the benchmark: its client for the baseline and for counting.
struct Broker {
    destination: Destination,
    runtime: tokio::runtime::Runtime,
}

impl Broker {
    fn new(destination: Destination) -> Res<Broker> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .ctx("starting the baseline's runtime")?;
        Ok(Broker {
            destination,
            runtime,
        })
    }

    /// An empty stream or queue.
    fn reset(&self) -> Res<()> {
        self.runtime.block_on(async {
            match self.destination {
                Destination::Jetstream => {
                    let context = nats().await?;
                    let _ = context.delete_stream(STREAM).await;
                    context
                        .create_stream(jetstream::stream::Config {
                            name: STREAM.into(),
                            subjects: vec![format!("{SUBJECT}.>"), SUBJECT.into()],
                            storage: jetstream::stream::StorageType::File,
                            ..Default::default()
                        })
                        .await
                        .ctx("creating the benchmark stream")?;
                }
                Destination::Rabbitmq => {
                    let channel = amqp_channel().await?;
                    channel
                        .queue_declare(
                            QUEUE.into(),
                            QueueDeclareOptions {
                                durable: true,
                                ..Default::default()
                            },
                            FieldTable::default(),
                        )
                        .await
                        .ctx("declaring the benchmark queue")?;
                    channel
                        .queue_purge(QUEUE.into(), QueuePurgeOptions::default())
                        .await
                        .ctx("purging the benchmark queue")?;
                }
                Destination::Kafka => {
                    tansu(&[
                        "topic",
                        "delete",
                        "--broker",
                        &format!("tcp://{KAFKA_SERVERS}"),
                        TOPIC,
                    ]);
                    let created = tansu(&[
                        "topic",
                        "create",
                        "--broker",
                        &format!("tcp://{KAFKA_SERVERS}"),
                        "--partitions",
                        &PARTITIONS.to_string(),
                        TOPIC,
                    ]);
                    if !created {
                        return Err(failed("creating the benchmark topic with tansu"));
                    }
                }
            }
            Ok(())
        })
    }

    /// Messages in the stream or queue.
    fn count(&self) -> Res<u64> {
        self.runtime.block_on(async {
            match self.destination {
                Destination::Jetstream => {
                    let mut stream = nats()
                        .await?
                        .get_stream(STREAM)
                        .await
                        .ctx("finding the stream")?;
                    Ok(stream.info().await.ctx("stream info")?.state.messages)
                }
                Destination::Rabbitmq => {
                    let queue = amqp_channel()
                        .await?
                        .queue_declare(
                            QUEUE.into(),
                            QueueDeclareOptions {
                                passive: true,
                                ..Default::default()
                            },
                            FieldTable::default(),
                        )
                        .await
                        .ctx("counting the queue")?;
                    Ok(u64::from(queue.message_count()))
                }
                Destination::Kafka => kafka_count(),
            }
        })
    }

    /// The baseline: `count` messages from `tasks` concurrent publishers, each publishing
    /// `in_flight` at a time and then waiting for their acknowledgements (as deep as the
    /// destination's batches: the client's fastest way to the same acknowledgements); messages
    /// per second.
    fn bare_publish(&self, tasks: usize, in_flight: usize, count: u64) -> Res<f64> {
        let body = serde_json::to_vec(&Relayed::new(1)).ctx("serializing")?;
        if self.destination == Destination::Kafka {
            return kafka_bare_publish(tasks, count, &body);
        }
        self.runtime.block_on(async {
            let started = Instant::now();
            let mut publishers = Vec::new();
            let share = count.div_ceil(tasks as u64);
            match self.destination {
                Destination::Jetstream => {
                    let context = nats().await?;
                    for task in 0..tasks as u64 {
                        let (context, body) = (context.clone(), body.clone());
                        let n = share.min(count.saturating_sub(task * share));
                        publishers.push(tokio::spawn(async move {
                            let mut acks = Vec::with_capacity(in_flight);
                            for sent in 1..=n {
                                let id = MessageId::new().to_string();
                                let mut headers = async_nats::HeaderMap::new();
                                headers.insert("outbox-message-id", id.as_str());
                                headers.insert("outbox-message-type", "bench.relay");
                                headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
                                acks.push(
                                    context
                                        .publish_with_headers(SUBJECT, headers, body.clone().into())
                                        .await
                                        .map_err(|e| failed(format!("publishing: {e}")))?,
                                );
                                if acks.len() == in_flight || sent == n {
                                    for ack in acks.drain(..) {
                                        ack.await
                                            .map_err(|e| failed(format!("the publish ack: {e}")))?;
                                    }
                                }
                            }
                            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                        }));
                    }
                }
                Destination::Rabbitmq => {
                    let channel = amqp_channel().await?;
                    channel
                        .confirm_select(ConfirmSelectOptions::default())
                        .await
                        .ctx("enabling confirms")?;
                    for task in 0..tasks as u64 {
                        let (channel, body) = (channel.clone(), body.clone());
                        let n = share.min(count.saturating_sub(task * share));
                        publishers.push(tokio::spawn(async move {
                            let mut confirms = Vec::with_capacity(in_flight);
                            for sent in 1..=n {
                                let id = MessageId::new().to_string();
                                let properties = BasicProperties::default()
                                    .with_message_id(id.as_str().into())
                                    .with_type("bench.relay".into())
                                    .with_content_type("application/json".into())
                                    .with_delivery_mode(2);
                                let confirm = channel
                                    .basic_publish(
                                        "".into(),
                                        QUEUE.into(),
                                        BasicPublishOptions {
                                            mandatory: true,
                                            immediate: false,
                                        },
                                        &body,
                                        properties,
                                    )
                                    .await
                                    .map_err(|e| failed(format!("publishing: {e}")))?;
                                confirms.push(confirm);
                                if confirms.len() < in_flight && sent < n {
                                    continue;
                                }
                                for confirm in confirms.drain(..) {
                                    let confirm = confirm
                                        .await
                                        .map_err(|e| failed(format!("the confirm: {e}")))?;
                                    if !confirm.is_ack() {
                                        return Err(failed(format!("not confirmed: {confirm:?}")));
                                    }
                                }
                            }
                            Ok(())
                        }));
                    }
                }
                Destination::Kafka => unreachable!("published by threads, above"),
            }
            for publisher in publishers {
                publisher.await.ctx("a publisher task")??;
            }
            Ok(count as f64 / started.elapsed().as_secs_f64())
        })
    }

    fn target(&self) -> Res<Box<dyn outbox_diesel::destination::Destination>> {
        Ok(match self.destination {
            Destination::Jetstream => Box::new(
                JetStreamDestination::builder(NATS_URL)
                    .subject(SUBJECT)
                    .build()
                    .ctx("building the JetStream destination")?,
            ),
            Destination::Rabbitmq => Box::new(
                RabbitMqDestination::builder(AMQP_URL)
                    .routing_key(QUEUE)
                    .build()
                    .ctx("building the RabbitMQ destination")?,
            ),
            Destination::Kafka => Box::new(
                KafkaDestination::builder(KAFKA_SERVERS)
                    .topic(TOPIC)
                    .build()
                    .ctx("building the Kafka destination")?,
            ),
        })
    }
}

/// Records in the topic, read from the beginning until it stays quiet for 2 s: tansu 0.6
/// reports a partition's high watermark as its last batch's base offset plus one, short of
/// the batch's other records, so the watermarks cannot count.
fn kafka_count() -> Res<u64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};

    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", KAFKA_SERVERS)
        .set("group.id", "outbox-bench-count")
        .set("enable.auto.commit", "false")
        .create()
        .ctx("a Kafka consumer")?;
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(TOPIC, partition, Offset::Beginning)
            .ctx("an assignment")?;
    }
    consumer
        .assign(&assignment)
        .ctx("assigning the partitions")?;
    let mut count = 0;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(2) {
        if let Some(record) = consumer.poll(Duration::from_millis(200)) {
            record.ctx("reading a record")?;
            count += 1;
            quiet_since = Instant::now();
        }
    }
    Ok(count)
}

/// Runs the tansu CLI; whether it succeeded.
fn tansu(args: &[&str]) -> bool {
    let program = std::env::var("HOME")
        .map(|home| format!("{home}/.cargo/bin/tansu"))
        .ok()
        .filter(|path| std::path::Path::new(path).exists())
        .unwrap_or_else(|| "tansu".to_owned());
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false)
}

/// Hands each record's delivery report to the thread waiting for it.
struct Reports;

impl rdkafka::ClientContext for Reports {}

impl rdkafka::producer::ProducerContext for Reports {
    type DeliveryOpaque = Box<std::sync::mpsc::SyncSender<bool>>;

    fn delivery(
        &self,
        result: &rdkafka::message::DeliveryResult<'_>,
        waiting: Self::DeliveryOpaque,
    ) {
        let _ = waiting.try_send(result.is_ok());
    }
}

/// librdkafka's producer as the relay configures it (idempotent, `acks=all`, `linger.ms` 1),
/// `threads` threads each producing a record and waiting for its report before the next.
fn kafka_bare_publish(threads: usize, count: u64, body: &[u8]) -> Res<f64> {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, ThreadedProducer};

    let producer: ThreadedProducer<Reports> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", KAFKA_SERVERS)
        .set("linger.ms", "1")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create_with_context(Reports)
        .ctx("a Kafka producer")?;
    let share = count.div_ceil(threads as u64);
    let started = Instant::now();
    std::thread::scope(|scope| {
        let producers: Vec<_> = (0..threads as u64)
            .map(|thread| {
                let producer = &producer;
                let n = share.min(count.saturating_sub(thread * share));
                scope.spawn(move || -> Res<()> {
                    for _ in 0..n {
                        let id = MessageId::new().to_string();
                        let headers = OwnedHeaders::new()
                            .insert(Header {
                                key: "outbox-message-id",
                                value: Some(id.as_bytes()),
                            })
                            .insert(Header {
                                key: "outbox-message-type",
                                value: Some("bench.relay"),
                            });
                        let (report, delivered) = std::sync::mpsc::sync_channel(1);
                        producer
                            .send(
                                BaseRecord::<'_, (), [u8], _>::with_opaque_to(
                                    TOPIC,
                                    Box::new(report),
                                )
                                .payload(body)
                                .headers(headers),
                            )
                            .map_err(|(e, _)| failed(format!("producing: {e}")))?;
                        if !delivered.recv().unwrap_or(false) {
                            return Err(failed("a record was not delivered"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for producer in producers {
            producer
                .join()
                .map_err(|_| failed("a producer thread panicked"))??;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

async fn nats() -> Res<jetstream::Context> {
    let client = async_nats::connect(NATS_URL)
        .await
        .ctx("connecting to NATS on 127.0.0.1:4222 (is nats-server -js running?)")?;
    Ok(jetstream::new(client))
}

async fn amqp_channel() -> Res<lapin::Channel> {
    let connection = lapin::Connection::connect(AMQP_URL, Default::default())
        .await
        .ctx("connecting to RabbitMQ on 127.0.0.1:5672 (is rabbitmq-server running?)")?;
    connection.create_channel().await.ctx("opening a channel")
}

/// Runs `drain --destination` on a fresh database.
pub fn run(opts: &Opts) -> Res<bool> {
    crate::db::on_fresh_database!(opts, drain_on)
}

fn drain_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    match opts.destination {
        Some(destination) => relay_drain_on::<C>(opts, db, destination),
        None => Err(failed("drain --destination needs a destination")),
    }
}

/// `drain --destination`: per run, the bare client's rate, then the worker's.
fn relay_drain_on<C: BenchConnection>(
    opts: &Opts,
    db: &BenchDb,
    destination: Destination,
) -> Res<bool> {
    let count = backlog(opts);
    let bare_count = count.min(50_000) as u64;
    let broker = Broker::new(destination)?;
    // As many acknowledgements in flight a publisher as the destination has a batch.
    let in_flight = broker.target()?.batch_limit();
    let mut report = Report::new(
        "drain-relay",
        opts,
        json!({
            "destination": format!("{destination:?}").to_lowercase(),
            "messages": count,
            "baseline_messages": bare_count,
            "baseline_in_flight_per_publisher": in_flight,
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
        }),
    );
    for _ in 0..opts.runs() {
        broker.reset()?;
        let servers = cpu::pids_named(destination.server_processes());
        let cpu_before = cpu::snapshot(&servers);
        let bare = broker.bare_publish(opts.handler_threads, in_flight, bare_count)?;
        let cpu_after = cpu::snapshot(&servers);
        let bare_cpu = json!({
            "cores": cpu::used(&cpu_before, &cpu_after),
            "client_us_per_message": cpu::process_us_per_message(&cpu_before, &cpu_after, bare_count),
            "broker_us_per_message": cpu::children_us_per_message(&cpu_before, &cpu_after, bare_count),
        });
        // The worker's own ceiling on this database: the same backlog with a no-op handler.
        let noop = crate::drain::noop_drain::<C>(db, opts, count, Kind::Noop, &mut report)?.per_s;
        broker.reset()?;
        db.empty::<C>()?;
        prefill::<C>(db, count, Kind::Relay)?;
        let pool = db.worker_pool::<C>(4)?;
        let cpu_before = cpu::snapshot(&servers);
        let started = Instant::now();
        let worker = opts
            .claims
            .apply(
                Worker::builder(DieselStore::new(pool))
                    .subscriptions(crate::handlers::subscribers())
                    .handler_threads(opts.handler_threads),
            )
            .destination(RELAY, broker.target()?)
            .spawn()
            .ctx("starting the worker")?;
        let done = wait_for(drain_timeout(count), || {
            worker.stats().succeeded >= count as u64
        });
        let seconds = started.elapsed().as_secs_f64();
        let cpu_after = cpu::snapshot(&servers);
        let roles = crate::drain::pg_backend_roles(db)?;
        let outbox_cpu = json!({
            "cores": cpu::used(&cpu_before, &cpu_after),
            "phases": cpu::phases(&cpu_before, &cpu_after, &roles, count as u64),
            "broker_us_per_message": cpu::children_us_per_message(&cpu_before, &cpu_after, count as u64),
        });
        let stats = worker
            .shutdown(Duration::from_secs(30))
            .ctx("stopping the worker")?;
        let arrived = broker.count()?;
        if !done || arrived != count as u64 {
            report.problem(format!(
                "relay: {arrived} of {count} messages at the broker ({stats:?})"
            ));
        }
        let outbox = count as f64 / seconds;
        let mut figures = Map::new();
        figures.insert("bare_client_per_s".into(), json!(bare.round()));
        figures.insert("outbox_per_s".into(), json!(outbox.round()));
        figures.insert("noop_drain_per_s".into(), json!(noop.round()));
        figures.insert(
            "outbox_vs_bare".into(),
            json!((outbox / bare * 1000.0).round() / 1000.0),
        );
        figures.insert("seconds".into(), json!((seconds * 100.0).round() / 100.0));
        figures.insert("retried".into(), Value::from(stats.retried));
        // Where the CPU went (`worker_processes` in `cores` is the broker's server here).
        figures.insert("cpu_bare_client".into(), bare_cpu);
        figures.insert("cpu_outbox".into(), outbox_cpu);
        report.run(figures);
    }
    let ratio = report.median("outbox_vs_bare");
    report.target("outbox_vs_bare_client", ratio, 0.7, true);
    Ok(report.finish())
}
