//! A worker process for tests and drills that kill it: it runs until killed, delivering
//! `test.hook` messages to a webhook and applying `test.effect` messages exactly once.
//!
//! Configured by environment: `OUTBOX_WORKER_DATABASE_URL` (a postgres:// or mysql:// URL, or
//! an SQLite file path), `OUTBOX_WORKER_WEBHOOK_URL` (on 127.0.0.1) and/or
//! `OUTBOX_WORKER_DESTINATION` (`jetstream:SUBJECT`, `rabbitmq:ROUTING_KEY` or `kafka:TOPIC`, where
//! `test.relay` and `test.routed` messages go, on the brokers of [`crate::brokers`]), and optionally
//! `OUTBOX_WORKER_LEASE_MS` (6000), `OUTBOX_WORKER_TIMEOUT_MS` (1000, the webhook and handler
//! timeout), `OUTBOX_WORKER_THREADS` (8), `OUTBOX_WORKER_BATCH` (16),
//! `OUTBOX_WORKER_UNKNOWN_GRACE_MS` (1000: how long unknown types are given back). It delivers
//! to the subscriptions of the database too, as `outbox_testkit::outbox::subscriptions` sees
//! them.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use diesel::r2d2::Pool;
use outbox_diesel::destination::{DeliveryError, Destination, Envelope};
use outbox_diesel::webhook::WebhookEndpoint;
use outbox_diesel::{Backend, DieselStore, OutboxManager, RetryPolicy, Worker};
use outbox_relay::{JetStreamDestination, KafkaDestination, RabbitMqDestination};
use outbox_testkit::outbox::secret;
use outbox_testkit::{with_connection, TestConnection};

use crate::brokers::Broker;
use crate::handlers::{HOOK, RELAY};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run<C: TestConnection>(url: &str) -> ! {
    let threads = number("OUTBOX_WORKER_THREADS", 8);
    // The worker's own connections, and one per handler thread for exactly-once handlers.
    let pool = Pool::builder()
        .max_size(4 + threads as u32)
        .connection_timeout(Duration::from_secs(5))
        .build_unchecked(OutboxManager::<C>::new(url).expect("a database URL"));
    let timeout = Duration::from_millis(number("OUTBOX_WORKER_TIMEOUT_MS", 1000));
    let backend = Backend::from_url(url).expect("a database URL");
    let mut builder = Worker::builder(DieselStore::new(pool));
    if let Ok(url) = std::env::var("OUTBOX_WORKER_WEBHOOK_URL") {
        let endpoint = WebhookEndpoint::builder(url)
            .secret(secret())
            .timeout(timeout)
            .max_retry_after(Duration::from_secs(2))
            .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .build()
            .expect("an endpoint");
        // Default options: the receiver drill's 429s come one in twenty, as faults, and must
        // not teach a rate (they held the drill near ten deliveries a second when they did).
        builder = builder.destination(HOOK, endpoint);
    }
    builder = match std::env::var("OUTBOX_WORKER_DESTINATION") {
        Ok(destination) => builder.destination(RELAY, relay_destination(&destination, timeout)),
        // The worker process's routed type needs its destination; none is enqueued here.
        Err(_) => builder.destination(RELAY, NoBroker),
    };
    let _worker = builder
        .subscriptions(outbox_testkit::outbox::subscriptions().delivery())
        .resource(backend)
        .handler_threads(threads as usize)
        .batch_size(number("OUTBOX_WORKER_BATCH", 16) as usize)
        .poll_interval(Duration::from_millis(100))
        .handler_timeout(timeout)
        .unknown_type_grace(Duration::from_millis(number(
            "OUTBOX_WORKER_UNKNOWN_GRACE_MS",
            1000,
        )))
        .lease(Duration::from_millis(number(
            "OUTBOX_WORKER_LEASE_MS",
            6000,
        )))
        .retry_policy(
            RetryPolicy::new()
                .max_attempts(20)
                .initial_backoff(Duration::from_millis(100))
                .multiplier(2.0)
                .max_backoff(Duration::from_secs(2))
                .max_retry_after(Duration::from_secs(2)),
        )
        .spawn()
        .expect("the worker starts");
    println!("ready");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The relay of a worker process given no broker: it takes nothing.
struct NoBroker;

impl Destination for NoBroker {
    fn kind(&self) -> &'static str {
        "no-broker"
    }

    fn deliver(&self, _: &Envelope) -> Result<(), DeliveryError> {
        Err(DeliveryError::unavailable(
            "this worker process was given no broker (OUTBOX_WORKER_DESTINATION)",
        ))
    }
}

/// The broker destination `jetstream:SUBJECT`, `rabbitmq:ROUTING_KEY` or `kafka:TOPIC` names.
pub fn relay_destination(destination: &str, timeout: Duration) -> Box<dyn Destination> {
    match destination.split_once(':') {
        Some(("jetstream", subject)) => Box::new(
            JetStreamDestination::builder(Broker::JetStream.url())
                .subject(subject)
                .timeout(timeout)
                .build()
                .expect("a JetStream destination"),
        ),
        Some(("rabbitmq", routing_key)) => Box::new(
            RabbitMqDestination::builder(Broker::RabbitMq.url())
                .routing_key(routing_key)
                .timeout(timeout)
                .build()
                .expect("a RabbitMQ destination"),
        ),
        Some(("kafka", topic)) => Box::new(
            KafkaDestination::builder(Broker::Kafka.url())
                .topic(topic)
                .timeout(timeout)
                .build()
                .expect("a Kafka destination"),
        ),
        _ => panic!(
            "OUTBOX_WORKER_DESTINATION is jetstream:SUBJECT, rabbitmq:ROUTING_KEY or kafka:TOPIC, \
             not {destination}"
        ),
    }
}

/// Runs the worker the environment describes, until the process is killed.
pub fn run_from_env() -> ! {
    outbox_testkit::log_to_stderr_from_env("OUTBOX_WORKER_LOG");
    let url = env("OUTBOX_WORKER_DATABASE_URL");
    let backend = Backend::from_url(&url).expect("OUTBOX_WORKER_DATABASE_URL names a backend");
    with_connection!(backend, C => run::<C>(&url))
}
