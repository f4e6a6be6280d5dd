//! The destination conformance kit (`outbox_core::testing::destination_kit`) run on the
//! workspace's destinations, each against a real receiver on 127.0.0.1.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::testing::destination_kit::{DestinationHarness, Received};
use outbox_diesel::webhook::WebhookEndpoint;
use outbox_relay::{JetStreamDestination, KafkaDestination, RabbitMqDestination};
use outbox_testkit::http::{Receiver, Reply};
use outbox_testkit::outbox::endpoint;
use outbox_tests::brokers::{self, Broker, TestQueue, TestStream, TestTopic};

/// A loopback address nothing listens on.
fn closed_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let address = listener.local_addr().expect("the bound address");
    drop(listener);
    address.to_string()
}

/// A message as a broker's consumer got it, in the kit's terms.
fn received(message: brokers::Received) -> Received {
    Received {
        message_id: message.id.to_string(),
        message_type: message.message_type,
        body: serde_json::to_vec(&message.body).unwrap(),
        headers: message
            .headers
            .into_iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value))
            .collect(),
    }
}

/// How long a broker's destination waits for its acknowledgement in these checks.
const BROKER_TIMEOUT: Duration = Duration::from_secs(3);

/// A JetStream destination publishing to a stream of its own.
struct JetStream {
    stream: TestStream,
}

impl JetStream {
    fn new() -> Option<Self> {
        Broker::JetStream.available().then(|| JetStream {
            stream: TestStream::create("kit", -1, Duration::from_secs(120)),
        })
    }

    fn to(&self, url: &str) -> JetStreamDestination {
        JetStreamDestination::builder(url)
            .subject(self.stream.subject("kit"))
            .timeout(BROKER_TIMEOUT)
            .build()
            .unwrap()
    }
}

impl DestinationHarness for JetStream {
    type Destination = JetStreamDestination;

    fn destination(&self) -> JetStreamDestination {
        self.to(&Broker::JetStream.url())
    }

    fn unreachable(&self) -> JetStreamDestination {
        self.to(&format!("nats://{}", closed_address()))
    }

    fn received(&self) -> Vec<Received> {
        self.stream.messages().into_iter().map(received).collect()
    }

    fn push_back(&self, _: Duration) -> bool {
        // A JetStream server has no way to ask a publisher to wait.
        false
    }

    fn restart(&self) {
        Broker::JetStream.restart();
    }
}

/// A RabbitMQ destination publishing to a durable queue of its own.
struct RabbitMq {
    queue: TestQueue,
    /// What was taken out of the queue so far: reading consumes.
    taken: Mutex<Vec<Received>>,
}

impl RabbitMq {
    fn new() -> Option<Self> {
        Broker::RabbitMq.available().then(|| RabbitMq {
            queue: TestQueue::declare("kit"),
            taken: Mutex::new(Vec::new()),
        })
    }

    fn to(&self, url: &str) -> RabbitMqDestination {
        RabbitMqDestination::builder(url)
            .routing_key(&self.queue.name)
            .timeout(BROKER_TIMEOUT)
            .build()
            .unwrap()
    }
}

impl DestinationHarness for RabbitMq {
    type Destination = RabbitMqDestination;

    fn destination(&self) -> RabbitMqDestination {
        self.to(&Broker::RabbitMq.url())
    }

    fn unreachable(&self) -> RabbitMqDestination {
        self.to(&format!("amqp://guest:guest@{}/%2f", closed_address()))
    }

    fn received(&self) -> Vec<Received> {
        let mut taken = self.taken.lock().unwrap();
        taken.extend(self.queue.take_all().into_iter().map(received));
        taken.clone()
    }

    fn push_back(&self, _: Duration) -> bool {
        // A blocked connection (a resource alarm) pushes back until the alarm clears, not for
        // a time: the relay's own tests raise one.
        false
    }

    fn restart(&self) {
        Broker::RabbitMq.restart();
    }
}

/// A Kafka destination producing to a topic of its own.
struct Kafka {
    topic: TestTopic,
}

impl Kafka {
    fn new() -> Option<Self> {
        Broker::Kafka.available().then(|| Kafka {
            topic: TestTopic::create("kit"),
        })
    }

    fn to(&self, servers: &str) -> KafkaDestination {
        KafkaDestination::builder(servers)
            .topic(&self.topic.name)
            .timeout(BROKER_TIMEOUT)
            .build()
            .unwrap()
    }
}

impl DestinationHarness for Kafka {
    type Destination = KafkaDestination;

    fn destination(&self) -> KafkaDestination {
        self.to(&Broker::Kafka.url())
    }

    fn unreachable(&self) -> KafkaDestination {
        self.to(&closed_address())
    }

    fn received(&self) -> Vec<Received> {
        let records = self.topic.records().into_iter();
        records.map(|(_, message)| received(message)).collect()
    }

    fn push_back(&self, _: Duration) -> bool {
        // Kafka's quotas throttle inside the client, which waits: no answer to classify.
        false
    }

    fn restart(&self) {
        // The test broker keeps its topics in memory: they are lost with it, so recreate them.
        Broker::Kafka.restart();
        self.topic.recreate();
    }
}

/// A signed webhook endpoint and a receiver that answers 200 unless told otherwise.
struct Webhook {
    receiver: Receiver,
}

impl DestinationHarness for Webhook {
    type Destination = WebhookEndpoint;

    fn destination(&self) -> WebhookEndpoint {
        endpoint(&self.receiver.url("/hook"), Duration::from_secs(2))
    }

    fn unreachable(&self) -> WebhookEndpoint {
        endpoint(
            &format!("http://{}/hook", closed_address()),
            Duration::from_secs(2),
        )
    }

    fn received(&self) -> Vec<Received> {
        self.receiver
            .requests()
            .into_iter()
            .filter(|request| (200..300).contains(&request.answered))
            .map(|request| {
                let body = request.json();
                Received {
                    message_id: request.webhook_id().unwrap_or_default().to_owned(),
                    message_type: body["type"].as_str().unwrap_or_default().to_owned(),
                    body: serde_json::to_vec(&body["data"]).unwrap(),
                    headers: request.headers.clone(),
                }
            })
            .collect()
    }

    fn push_back(&self, wait: Duration) -> bool {
        let pushed = Arc::new(AtomicBool::new(false));
        let seconds = wait.as_secs().to_string();
        self.receiver.set_behaviour(move |_, _| {
            if pushed.swap(true, Ordering::SeqCst) {
                Reply::status(200)
            } else {
                Reply::with_header(429, "retry-after", &seconds)
            }
        });
        true
    }

    fn restart(&self) {
        self.receiver.restart();
    }
}

mod webhook {
    outbox_core::destination_conformance!(super::Webhook {
        receiver: outbox_testkit::http::Receiver::ok(),
    });
}

mod jetstream {
    outbox_core::destination_conformance!(optional super::JetStream::new());
}

mod rabbitmq {
    outbox_core::destination_conformance!(optional super::RabbitMq::new());
}

mod kafka {
    outbox_core::destination_conformance!(optional super::Kafka::new());
}
