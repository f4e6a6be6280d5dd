//! The brokers the relay tests and drills publish to: where they are, whether they are up
//! (with `CI=true` a missing broker fails instead of skipping), restarting them, and reading
//! back what arrived.
//!
//! `OUTBOX_TEST_NATS_URL` (default `nats://127.0.0.1:4222`) and `OUTBOX_TEST_AMQP_URL`
//! (default `amqp://guest:guest@127.0.0.1:5672/%2f`) point elsewhere.

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use outbox_diesel::MessageId;
use outbox_relay::{MESSAGE_ID_HEADER, MESSAGE_TYPE_HEADER, ORDERING_KEY_HEADER};
use outbox_testkit::db::in_ci;

use crate::checker::Arrival;

/// A broker the tests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    /// NATS with JetStream.
    JetStream,
    /// RabbitMQ.
    RabbitMq,
    /// A Kafka-compatible broker (`tansu`, memory storage).
    Kafka,
}

impl Broker {
    fn env_var(self) -> &'static str {
        match self {
            Broker::JetStream => "OUTBOX_TEST_NATS_URL",
            Broker::RabbitMq => "OUTBOX_TEST_AMQP_URL",
            Broker::Kafka => "OUTBOX_TEST_KAFKA_SERVERS",
        }
    }

    /// The broker's URL.
    pub fn url(self) -> String {
        std::env::var(self.env_var()).unwrap_or_else(|_| {
            match self {
                Broker::JetStream => "nats://127.0.0.1:4222",
                Broker::RabbitMq => "amqp://guest:guest@127.0.0.1:5672/%2f",
                Broker::Kafka => "127.0.0.1:9092",
            }
            .to_owned()
        })
    }

    fn address(self) -> String {
        let url = self.url();
        let rest = url.split("://").nth(1).unwrap_or(&url);
        let host = rest.rsplit('@').next().unwrap_or(rest);
        host.split('/').next().unwrap_or(host).to_owned()
    }

    /// Whether the broker accepts connections now.
    pub fn is_up(self) -> bool {
        self.address()
            .parse()
            .ok()
            .and_then(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok())
            .is_some()
    }

    /// Whether the test can run: the broker is up. If it is not, says which variable or
    /// command fixes it, and with `CI=true` fails the test.
    pub fn available(self) -> bool {
        if self.is_up() {
            return true;
        }
        let fix = match self {
            Broker::JetStream => {
                "start it with `nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server &`"
            }
            Broker::RabbitMq => {
                "start it with `rabbitmq-server -detached` or `rabbitmqctl start_app`"
            }
            Broker::Kafka => {
                "install and start tansu: `cargo install tansu --locked --features dynostore`, then \
                 `tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url \
                 tcp://127.0.0.1:9092 --storage-engine memory://tansu/ &` (scripts/test does both)"
            }
        };
        let message = format!(
            "{self:?} is not reachable at {} (set {} to point elsewhere, or {fix})",
            self.url(),
            self.env_var()
        );
        assert!(
            !in_ci(),
            "{message}; CI=true, so this fails instead of skipping"
        );
        eprintln!("SKIPPED: {message}");
        false
    }

    /// Restarts the local broker and waits until it accepts connections again.
    pub fn restart(self) {
        self.restart_with(|| {});
    }

    /// Restarts the local broker, running `while_down` while it is stopped, and waits until
    /// it accepts connections again.
    pub fn restart_with(self, while_down: impl FnOnce()) {
        match self {
            Broker::JetStream => restart_process("nats-server", while_down),
            Broker::Kafka => restart_process("tansu", while_down),
            Broker::RabbitMq => {
                run("rabbitmqctl", &["stop_app"]);
                while_down();
                run("rabbitmqctl", &["start_app"]);
            }
        }
        let start = Instant::now();
        while !self.is_up() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{self:?} did not come back within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// RabbitMQ's `max_message_size` set at runtime for as long as it lives, and back to the
/// default (128 MiB) when dropped.
#[derive(Debug)]
pub struct RabbitMqMessageLimit(());

impl RabbitMqMessageLimit {
    /// Sets the limit to `bytes`.
    pub fn set(bytes: usize) -> RabbitMqMessageLimit {
        set_max_message_size(bytes);
        RabbitMqMessageLimit(())
    }
}

impl Drop for RabbitMqMessageLimit {
    fn drop(&mut self) {
        set_max_message_size(134_217_728);
    }
}

/// A RabbitMQ memory alarm for as long as it lives: the high watermark set below what the broker
/// uses, so it blocks every connection that publishes, as a broker low on memory does. Dropped,
/// the watermark it found is back and the alarm clears.
#[derive(Debug)]
pub struct RabbitMqAlarm {
    watermark: String,
}

impl RabbitMqAlarm {
    /// Raises the alarm.
    pub fn raise() -> RabbitMqAlarm {
        let found = Command::new("rabbitmqctl")
            .args(["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])
            .output()
            .expect("running rabbitmqctl");
        let found = String::from_utf8_lossy(&found.stdout).trim().to_owned();
        // A relative watermark reads as a fraction; anything else (an absolute one left by a
        // test that was killed) gets RabbitMQ's default back.
        let watermark = if found.parse::<f64>().is_ok_and(|f| f > 0.0 && f < 1.0) {
            found
        } else {
            "0.4".to_owned()
        };
        run(
            "rabbitmqctl",
            &["set_vm_memory_high_watermark", "absolute", "10MB"],
        );
        RabbitMqAlarm { watermark }
    }
}

impl Drop for RabbitMqAlarm {
    fn drop(&mut self) {
        run(
            "rabbitmqctl",
            &["set_vm_memory_high_watermark", &self.watermark],
        );
    }
}

fn set_max_message_size(bytes: usize) {
    run(
        "rabbitmqctl",
        &[
            "eval",
            &format!("application:set_env(rabbit, max_message_size, {bytes})."),
        ],
    );
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

/// Kills the local server process `name` and starts it again with the same command line.
fn restart_process(name: &str, while_down: impl FnOnce()) {
    let pid = String::from_utf8(
        Command::new("pgrep")
            .args(["-o", "-x", name])
            .output()
            .expect("pgrep")
            .stdout,
    )
    .expect("a pid");
    let pid = pid.trim();
    assert!(!pid.is_empty(), "no {name} process to restart");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("its command line");
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    // SIGKILL: a crash, the harder case for what the broker had acknowledged.
    run("kill", &["-KILL", pid]);
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nats-server did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    while_down();
    // `setsid --fork` leaves the server in a session of its own, outliving the test.
    let status = Command::new("setsid")
        .arg("--fork")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("starting {name} again: {e}"));
    assert!(status.success(), "setsid {name}: {status}");
}

/// A message as a consumer received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The outbox message id it carried.
    pub id: MessageId,
    /// Its type header.
    pub message_type: String,
    /// Its ordering key header.
    pub ordering_key: Option<String>,
    /// Its body.
    pub body: serde_json::Value,
    /// The other headers, by name.
    pub headers: Vec<(String, String)>,
}

impl Received {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What arrived, in the checker's terms (in arrival order).
pub fn arrivals(received: &[Received]) -> Vec<Arrival> {
    received
        .iter()
        .map(|r| Arrival {
            id: r.id,
            delivered: true,
        })
        .collect()
}

fn received(body: &[u8], headers: Vec<(String, String)>) -> Received {
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    Received {
        id: find(MESSAGE_ID_HEADER)
            .expect("every message carries its id")
            .parse()
            .expect("a message id"),
        message_type: find(MESSAGE_TYPE_HEADER).expect("every message carries its type"),
        ordering_key: find(ORDERING_KEY_HEADER),
        body: serde_json::from_slice(body).expect("a JSON body"),
        headers,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn connect() -> Result<jetstream::Context, async_nats::ConnectError> {
    Ok(jetstream::new(
        async_nats::connect(Broker::JetStream.url()).await?,
    ))
}

/// A stream of its own on the JetStream server, deleted when dropped.
/// Each call connects anew, so that a restart of the server in between costs nothing.
#[derive(Debug)]
pub struct TestStream {
    runtime: tokio::runtime::Runtime,
    /// The stream's name.
    pub name: String,
    /// The subject prefix it takes: `<prefix>.>`.
    pub prefix: String,
}

impl TestStream {
    /// A file-backed stream taking `<prefix>.>`, with the given size limit per message (`-1`:
    /// none) and duplicate window.
    pub fn create(label: &str, max_message_size: i32, duplicate_window: Duration) -> TestStream {
        Self::create_with(label, |config| {
            config.max_message_size = max_message_size;
            config.duplicate_window = duplicate_window;
        })
    }

    /// A stream that holds at most `max_messages` and refuses more (`discard: new`) until some
    /// are taken out ([`take_oldest`](Self::take_oldest)): a stream its consumers are behind.
    pub fn bounded(label: &str, max_messages: i64) -> TestStream {
        Self::create_with(label, |config| {
            config.max_messages = max_messages;
            config.discard = jetstream::stream::DiscardPolicy::New;
            config.duplicate_window = Duration::from_secs(120);
        })
    }

    fn create_with(
        label: &str,
        configure: impl FnOnce(&mut jetstream::stream::Config),
    ) -> TestStream {
        let runtime = runtime();
        let tag = format!("{label}_{}", fastrand::u64(..));
        let prefix = format!("outbox_test.{tag}");
        let name = format!("OUTBOX_TEST_{tag}");
        runtime.block_on(async {
            connect()
                .await
                .expect("connecting to NATS")
                .create_stream({
                    let mut config = jetstream::stream::Config {
                        name: name.clone(),
                        subjects: vec![format!("{prefix}.>")],
                        storage: jetstream::stream::StorageType::File,
                        ..Default::default()
                    };
                    configure(&mut config);
                    config
                })
                .await
                .expect("creating the stream");
        });
        TestStream {
            runtime,
            name,
            prefix,
        }
    }

    /// A subject of the stream.
    pub fn subject(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    /// Every message in the stream, in stream order.
    pub fn messages(&self) -> Vec<Received> {
        self.read(usize::MAX, false)
    }

    /// Takes up to `count` of the oldest messages out of the stream (a consumer catching up),
    /// in stream order.
    pub fn take_oldest(&self, count: usize) -> Vec<Received> {
        self.read(count, true)
    }

    fn read(&self, count: usize, delete: bool) -> Vec<Received> {
        self.runtime.block_on(async {
            let context = connect().await.expect("connecting to NATS");
            let mut stream = context.get_stream(&self.name).await.expect("the stream");
            let state = stream.info().await.expect("stream info").state.clone();
            let mut out = Vec::new();
            if state.messages == 0 {
                return out;
            }
            for sequence in state.first_sequence..=state.last_sequence {
                if out.len() == count {
                    break;
                }
                let Ok(message) = stream.get_raw_message(sequence).await else {
                    assert!(delete, "message {sequence} of the stream is missing");
                    continue;
                };
                if delete {
                    stream
                        .delete_message(sequence)
                        .await
                        .expect("deleting a message");
                }
                let headers = message
                    .headers
                    .iter()
                    .flat_map(|(name, values)| {
                        values
                            .iter()
                            .map(move |v| (name.to_string(), v.as_str().to_owned()))
                    })
                    .collect();
                out.push(received(&message.payload, headers));
            }
            out
        })
    }

    /// How many messages the stream holds.
    pub fn count(&self) -> u64 {
        self.runtime.block_on(async {
            let Ok(context) = connect().await else {
                return 0;
            };
            match context.get_stream(&self.name).await {
                Ok(mut stream) => stream.info().await.map(|i| i.state.messages).unwrap_or(0),
                Err(_) => 0,
            }
        })
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        self.runtime.block_on(async {
            if let Ok(context) = connect().await {
                let _ = context.delete_stream(&self.name).await;
            }
        });
    }
}

/// A durable queue of its own on RabbitMQ, deleted when dropped.
#[derive(Debug)]
pub struct TestQueue {
    runtime: tokio::runtime::Runtime,
    url: String,
    /// The queue's name (publish to it through the default exchange with it as routing key).
    pub name: String,
}

impl TestQueue {
    /// Declares a durable queue.
    pub fn declare(label: &str) -> TestQueue {
        Self::declare_with(label, FieldTable::default())
    }

    /// Declares a durable queue that holds at most `max_length` messages and refuses more
    /// (`x-overflow: reject-publish`: publishers get `basic.nack`) until some are taken out:
    /// a queue its consumers are behind.
    pub fn bounded(label: &str, max_length: u32) -> TestQueue {
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongUInt(max_length));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        Self::declare_with(label, arguments)
    }

    fn declare_with(label: &str, arguments: FieldTable) -> TestQueue {
        let queue = TestQueue {
            runtime: runtime(),
            url: Broker::RabbitMq.url(),
            name: format!("outbox_test.{label}.{}", fastrand::u64(..)),
        };
        queue.runtime.block_on(async {
            let channel = queue.channel().await;
            channel
                .queue_declare(
                    queue.name.as_str().into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    arguments,
                )
                .await
                .expect("declaring the queue");
        });
        queue
    }

    async fn channel(&self) -> lapin::Channel {
        let connection = lapin::Connection::connect(&self.url, Default::default())
            .await
            .expect("connecting to RabbitMQ");
        connection.create_channel().await.expect("a channel")
    }

    /// How many messages the queue holds.
    pub fn count(&self) -> usize {
        self.runtime.block_on(async {
            let channel = self.channel().await;
            channel
                .queue_declare(
                    self.name.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map(|queue| queue.message_count() as usize)
                .unwrap_or(0)
        })
    }

    /// Takes every message in the queue, in queue order.
    pub fn take_all(&self) -> Vec<Received> {
        self.take(usize::MAX)
    }

    /// Takes up to `count` messages out of the queue, in queue order.
    pub fn take(&self, count: usize) -> Vec<Received> {
        self.runtime.block_on(async {
            let channel = self.channel().await;
            let mut out = Vec::new();
            while out.len() < count {
                let Some(message) = channel
                    .basic_get(self.name.as_str().into(), BasicGetOptions { no_ack: true })
                    .await
                    .expect("basic.get")
                else {
                    break;
                };
                let properties = &message.delivery.properties;
                let mut headers: Vec<(String, String)> = Vec::new();
                if let Some(table) = properties.headers() {
                    for (name, value) in table.inner() {
                        if let AMQPValue::LongString(text) = value {
                            headers.push((name.to_string(), text.to_string()));
                        }
                    }
                }
                let got = received(&message.delivery.data, headers);
                assert_eq!(
                    properties.message_id().as_ref().map(|id| id.to_string()),
                    Some(got.id.to_string()),
                    "message_id and the id header agree"
                );
                assert_eq!(properties.delivery_mode(), &Some(2), "persistent");
                assert_eq!(
                    properties.kind().as_ref().map(|t| t.to_string()),
                    Some(got.message_type.clone())
                );
                out.push(got);
            }
            out
        })
    }
}

impl Drop for TestQueue {
    fn drop(&mut self) {
        self.runtime.block_on(async {
            if let Ok(connection) = lapin::Connection::connect(&self.url, Default::default()).await
            {
                if let Ok(channel) = connection.create_channel().await {
                    let _ = channel
                        .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
            }
        });
    }
}

/// A topic of its own on the Kafka broker (three partitions), deleted when dropped.
#[derive(Debug)]
pub struct TestTopic {
    /// The topic's name.
    pub name: String,
    /// Its partitions.
    pub partitions: i32,
}

fn tansu(args: &[&str]) -> std::process::Output {
    let program = std::env::var("HOME")
        .map(|home| format!("{home}/.cargo/bin/tansu"))
        .ok()
        .filter(|path| std::path::Path::new(path).exists())
        .unwrap_or_else(|| "tansu".to_owned());
    Command::new(program).args(args).output().expect(
        "running tansu (install it with `cargo install tansu --locked --features dynostore`)",
    )
}

impl TestTopic {
    /// Creates the topic with `tansu topic create`.
    pub fn create(label: &str) -> TestTopic {
        let topic = TestTopic {
            name: format!("outbox_test.{label}.{}", fastrand::u64(..)),
            partitions: 3,
        };
        topic.recreate();
        topic
    }

    /// Creates the topic (again, after a restart of the memory-backed broker lost it).
    pub fn recreate(&self) {
        let broker = format!("tcp://{}", Broker::Kafka.url());
        let output = tansu(&[
            "topic",
            "create",
            "--broker",
            &broker,
            "--partitions",
            &self.partitions.to_string(),
            &self.name,
        ]);
        assert!(
            output.status.success(),
            "creating topic {}: {}",
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Every record in the topic, partition by partition in offset order, with its partition.
    pub fn records(&self) -> Vec<(i32, Received)> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::{Headers, Message};
        use rdkafka::{Offset, TopicPartitionList};

        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", Broker::Kafka.url())
            .set("group.id", format!("outbox-test-{}", fastrand::u64(..)))
            .set("enable.auto.commit", "false")
            .create()
            .expect("a Kafka consumer");
        let mut assignment = TopicPartitionList::new();
        let mut ends = Vec::new();
        for partition in 0..self.partitions {
            let (_, high) = consumer
                .fetch_watermarks(&self.name, partition, Duration::from_secs(10))
                .expect("the partition's watermarks");
            ends.push(high);
            assignment
                .add_partition_offset(&self.name, partition, Offset::Beginning)
                .expect("an assignment");
        }
        consumer
            .assign(&assignment)
            .expect("assigning the partitions");
        let mut next = vec![0_i64; ends.len()];
        let mut out = Vec::new();
        let start = Instant::now();
        // tansu 0.6 reports a partition's high watermark as the base offset of its last batch
        // plus one, short of the batch's other records: read on until the topic stays quiet.
        let mut quiet_since: Option<Instant> = None;
        loop {
            let caught_up = next.iter().zip(&ends).all(|(next, end)| next >= end);
            if caught_up
                && quiet_since.is_some_and(|since| since.elapsed() > Duration::from_secs(2))
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "read up to offsets {next:?} of {ends:?}"
            );
            let Some(message) = consumer.poll(Duration::from_millis(200)) else {
                quiet_since.get_or_insert_with(Instant::now);
                continue;
            };
            quiet_since = None;
            let message = message.expect("a record");
            let partition = message.partition();
            next[partition as usize] = message.offset() + 1;
            let headers = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let got = received(message.payload().unwrap_or_default(), headers);
            assert_eq!(
                message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                got.ordering_key,
                "the record key is the ordering key"
            );
            out.push((partition, message.offset(), got));
        }
        out.sort_by_key(|(partition, offset, _)| (*partition, *offset));
        out.into_iter()
            .map(|(partition, _, got)| (partition, got))
            .collect::<Vec<_>>()
    }

    /// How many records the topic holds (read, not from the watermarks: see
    /// [`records`](Self::records)).
    pub fn count(&self) -> usize {
        self.records().len()
    }
}

impl Drop for TestTopic {
    fn drop(&mut self) {
        let broker = format!("tcp://{}", Broker::Kafka.url());
        let _ = tansu(&["topic", "delete", "--broker", &broker, &self.name]);
    }
}
