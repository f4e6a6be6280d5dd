//! Fault drills: a mixed workload (a third of it under 16 ordering keys, three in seven
//! messages at a raised priority, four in five in one of five groups) through worker processes against a real database while
//! faults are injected, then the delivery checker.
//!
//! ```text
//! outbox-drill <kill|db-restart|receiver|poison|concurrency|rollback|refused-outcome|trickle|hung-handler|all> --backend <postgres|mysql|sqlite> [--quick] [--messages N]
//! outbox-drill kill --destination <jetstream|rabbitmq|kafka> --backend <...> [--quick]
//! outbox-drill burst --backend <...> [--quick] [--messages N]
//! ```
//!
//! `burst` is a latency drill rather than a fault drill: N keyed messages (1,000,000; 50,000
//! with `--quick`) wait behind their key's head, which is delayed by ten minutes, and unkeyed
//! traffic (100 messages/s for 5 s) is enqueued after them; it prints the unkeyed messages'
//! enqueue-to-delivery latencies and fails if their p99 reaches one second or if a keyed one is
//! delivered.
//!
//! With `--destination`, the workers relay the messages to a broker on 127.0.0.1 instead of
//! POSTing them, and the checker reads what arrived from the broker: on JetStream each message
//! must arrive exactly once (the stream drops redeliveries by `Nats-Msg-Id`).
//!
//! Prints one JSON line of figures per drill (and one of details where something is wrong) and
//! exits non-zero if any drill's expectations fail: nothing lost, no ghosts, no order
//! violations, every poison message dead-lettered, and duplicates only where a process died or
//! the database restarted, at most as many as were in flight then. See RELIABILITY.md.

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::Connection;
use outbox_diesel::admin::{dead_letters, pending_messages, stats, ListOptions};
use outbox_diesel::prelude::*;
use outbox_diesel::{Batch, EnqueueOptions, Message, MessageId, Priority};
use outbox_testkit::http::{Receiver, Reply};
use outbox_testkit::{with_connection, Backend, TestConnection, TestDb, TestPool};
use outbox_tests::brokers::{arrivals, Broker, TestQueue, TestStream, TestTopic};
use outbox_tests::checker::{check, Arrival, Ledger};
use outbox_tests::handlers::{Hook, Relayed, Stall};
use serde::{Deserialize, Serialize};

/// A type no worker handles.
#[derive(Serialize, Deserialize)]
struct Nobody {
    n: u64,
}

impl Message for Nobody {
    const MESSAGE_TYPE: &'static str = "drill.nobody";
}

/// Stored as `test.hook`, shaped otherwise: it does not deserialize.
#[derive(Serialize, Deserialize)]
struct Garbled {
    garbled: bool,
}

impl Message for Garbled {
    const MESSAGE_TYPE: &'static str = "test.hook";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drill {
    Kill,
    DbRestart,
    Receiver,
    Poison,
    Concurrency,
    Rollback,
    /// A PostgreSQL database in LATIN1 refusing the error texts of a receiver that fails now
    /// and then with characters it cannot encode.
    RefusedOutcome,
    /// A receiver that trickles some answers, one byte every 100 ms.
    Trickle,
    /// Handlers that hang on their first attempt, five times past their timeout.
    HungHandler,
}

impl Drill {
    const ALL: [Drill; 9] = [
        Drill::Kill,
        Drill::DbRestart,
        Drill::Receiver,
        Drill::Poison,
        Drill::Concurrency,
        Drill::Rollback,
        Drill::RefusedOutcome,
        Drill::Trickle,
        Drill::HungHandler,
    ];

    fn name(self) -> &'static str {
        match self {
            Drill::Kill => "kill",
            Drill::DbRestart => "db-restart",
            Drill::Receiver => "receiver",
            Drill::Poison => "poison",
            Drill::Concurrency => "concurrency",
            Drill::Rollback => "rollback",
            Drill::RefusedOutcome => "refused-outcome",
            Drill::Trickle => "trickle",
            Drill::HungHandler => "hung-handler",
        }
    }

    /// Whether the drill means anything on `backend`.
    fn applies_to(self, backend: Backend) -> bool {
        match self {
            // SQLite has no server to restart.
            Drill::DbRestart => backend != Backend::Sqlite,
            // Only PostgreSQL databases come in encodings that refuse text.
            Drill::RefusedOutcome => backend == Backend::Postgres,
            _ => true,
        }
    }
}

/// Where the kill drill's workers relay to, with `--destination`.
#[derive(Debug)]
enum Destination {
    JetStream(TestStream),
    RabbitMq(TestQueue),
    Kafka(TestTopic),
}

impl Destination {
    fn create(broker: Broker) -> Destination {
        assert!(broker.available(), "{broker:?} is not reachable");
        match broker {
            Broker::JetStream => {
                Destination::JetStream(TestStream::create("drill", -1, Duration::from_secs(600)))
            }
            Broker::RabbitMq => Destination::RabbitMq(TestQueue::declare("drill")),
            Broker::Kafka => Destination::Kafka(TestTopic::create("drill")),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Destination::JetStream(_) => "jetstream",
            Destination::RabbitMq(_) => "rabbitmq",
            Destination::Kafka(_) => "kafka",
        }
    }

    /// The worker process's `OUTBOX_WORKER_DESTINATION`.
    fn worker_env(&self) -> String {
        match self {
            Destination::JetStream(stream) => format!("jetstream:{}", stream.subject("events")),
            Destination::RabbitMq(queue) => format!("rabbitmq:{}", queue.name),
            Destination::Kafka(topic) => format!("kafka:{}", topic.name),
        }
    }

    /// What arrived, in the order the checker needs (a Kafka topic partition by partition:
    /// a key lives in one partition).
    fn arrivals(&self) -> Vec<Arrival> {
        match self {
            Destination::JetStream(stream) => arrivals(&stream.messages()),
            Destination::RabbitMq(queue) => arrivals(&queue.take_all()),
            Destination::Kafka(topic) => {
                let records: Vec<_> = topic.records().into_iter().map(|(_, r)| r).collect();
                arrivals(&records)
            }
        }
    }
}

fn parse_broker(name: &str) -> Option<Broker> {
    match name {
        "jetstream" => Some(Broker::JetStream),
        "rabbitmq" => Some(Broker::RabbitMq),
        "kafka" => Some(Broker::Kafka),
        _ => None,
    }
}

#[derive(Debug, Clone)]
struct Plan {
    drill: Drill,
    /// The broker the workers relay to, if not the webhook receiver.
    broker: Option<Broker>,
    backend: Backend,
    quick: bool,
    messages: u64,
    workers: usize,
    kills: usize,
    rollback_every: u64,
    poison_every: u64,
    stall_every: u64,
}

impl Plan {
    fn new(
        drill: Drill,
        broker: Option<Broker>,
        backend: Backend,
        quick: bool,
        messages: Option<u64>,
    ) -> Plan {
        let full = if drill == Drill::Kill { 50_000 } else { 20_000 };
        Plan {
            drill,
            broker,
            backend,
            quick,
            messages: messages.unwrap_or(if quick { 2_000 } else { full }),
            workers: if drill == Drill::Concurrency { 4 } else { 1 },
            kills: match (drill, quick) {
                (Drill::Kill, false) => 20,
                (Drill::Kill, true) => 5,
                _ => 0,
            },
            rollback_every: if drill == Drill::Rollback { 3 } else { 20 },
            poison_every: if drill == Drill::Poison { 50 } else { 0 },
            stall_every: if drill == Drill::HungHandler { 100 } else { 0 },
        }
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: outbox-drill <kill|db-restart|receiver|poison|concurrency|rollback|\
         refused-outcome|trickle|hung-handler|all|burst> \
         --backend <postgres|mysql|sqlite> [--quick] [--messages N] \
         [--destination <jetstream|rabbitmq|kafka>, kill only]"
    );
    std::process::exit(2)
}

/// The `burst` drill; see the module documentation.
fn burst<C: TestConnection + Connection>(backend: Backend, messages: u64) -> bool {
    let started = Instant::now();
    let db = TestDb::new(backend).expect("the drill's database server is reachable");
    let pool = db.pool::<C>(8);
    let keyed = EnqueueOptions::new().ordering_key("burst");
    let mut conn = pool.get().expect("a connection");
    Hook::new(0)
        .enqueue_with(&mut *conn, &keyed.clone().delay(Duration::from_secs(600)))
        .expect("the delayed head");
    let mut n = 1;
    while n <= messages {
        let mut batch = Batch::new();
        for _ in 0..1_000.min(messages + 1 - n) {
            batch
                .push_with(&Hook::new(n as u32), &keyed)
                .expect("serializing");
            n += 1;
        }
        batch.enqueue(&mut *conn).expect("enqueuing the burst");
    }
    let filled = started.elapsed();
    let receiver = Receiver::ok();
    receiver.record_times(true);
    let worker = outbox_diesel::Worker::builder(outbox_diesel::DieselStore::new(pool.clone()))
        .destination(
            outbox_tests::handlers::HOOK,
            outbox_testkit::outbox::endpoint(&receiver.url("/hook"), Duration::from_secs(5)),
        )
        .spawn()
        .expect("the worker starts");
    let mut sent = Vec::new();
    let traffic = Instant::now();
    for i in 0..500u32 {
        let due = traffic + Duration::from_millis(10 * u64::from(i));
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let at = Instant::now();
        let id = Hook::new(2_000_000_000 + i)
            .enqueue(&mut *conn)
            .expect("enqueuing traffic");
        sent.push((id, at));
    }
    let everything = Instant::now() + Duration::from_secs(60);
    while receiver.count() < sent.len() && Instant::now() < everything {
        std::thread::sleep(Duration::from_millis(20));
    }
    let arrived: std::collections::HashMap<u128, Instant> =
        receiver.take_times().into_iter().collect();
    let mut latencies: Vec<Duration> = sent
        .iter()
        .map(|(id, at)| {
            arrived
                .get(&id.as_uuid().as_u128())
                .map_or(Duration::MAX, |arrival| {
                    arrival.saturating_duration_since(*at)
                })
        })
        .collect();
    let slowest_sent_at = latencies
        .iter()
        .zip(&sent)
        .max_by_key(|(latency, _)| **latency)
        .map(|(_, (_, at))| at.saturating_duration_since(traffic).as_secs_f64());
    latencies.sort_unstable();
    let keyed_delivered = receiver.count().saturating_sub(sent.len());
    let _ = worker.shutdown(Duration::from_secs(10));
    let quantile = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    let ms = |d: Duration| {
        if d == Duration::MAX {
            -1.0
        } else {
            d.as_secs_f64() * 1000.0
        }
    };
    let p99 = quantile(0.99);
    println!(
        "{}",
        serde_json::json!({
            "drill": "burst",
            "backend": backend.to_string(),
            "keyed_behind_a_delayed_head": messages,
            "fill_seconds": filled.as_secs_f64(),
            "unkeyed": latencies.len(),
            "unkeyed_latency_ms": {
                "p50": ms(quantile(0.5)),
                "p99": ms(p99),
                "max": ms(quantile(1.0)),
            },
            "slowest_sent_after_s": slowest_sent_at,
            "keyed_delivered": keyed_delivered,
            "seconds": started.elapsed().as_secs_f64(),
        })
    );
    let held = p99 < Duration::from_secs(1) && keyed_delivered == 0;
    if !held {
        eprintln!("burst: the unkeyed p99 reached 1 s, or a keyed message ran before its head");
    }
    held
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        outbox_tests::worker_process::run_from_env();
    }
    if args.first().map(String::as_str) == Some("burst") {
        let mut backend = None;
        let mut quick = false;
        let mut messages = None;
        let mut rest = args.iter().skip(1);
        while let Some(arg) = rest.next() {
            match arg.as_str() {
                "--backend" => backend = rest.next().and_then(|name| name.parse::<Backend>().ok()),
                "--quick" => quick = true,
                "--messages" => messages = rest.next().and_then(|n| n.parse().ok()),
                _ => usage(),
            }
        }
        let Some(backend) = backend else { usage() };
        let messages = messages.unwrap_or(if quick { 50_000 } else { 1_000_000 });
        let held = with_connection!(backend, C => burst::<C>(backend, messages));
        std::process::exit(if held { 0 } else { 1 });
    }
    let mut drills = Vec::new();
    let mut backend = None;
    let mut quick = false;
    let mut messages = None;
    let mut broker = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--backend" => {
                backend = match rest.next().map(|name| name.parse::<Backend>()) {
                    Some(Ok(backend)) => Some(backend),
                    _ => usage(),
                }
            }
            "--quick" => quick = true,
            "--destination" => {
                broker = Some(
                    rest.next()
                        .and_then(|n| parse_broker(n))
                        .unwrap_or_else(|| usage()),
                )
            }
            "--messages" => {
                messages = Some(
                    rest.next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| usage()),
                )
            }
            "all" => drills.extend(Drill::ALL),
            name => match Drill::ALL.iter().find(|d| d.name() == name) {
                Some(drill) => drills.push(*drill),
                None => usage(),
            },
        }
    }
    let Some(backend) = backend else { usage() };
    if drills.is_empty() || (broker.is_some() && drills != [Drill::Kill]) {
        usage();
    }
    let mut failed = 0;
    for drill in drills {
        if !drill.applies_to(backend) {
            eprintln!("{} does not apply to {backend}; skipped", drill.name());
            continue;
        }
        let plan = Plan::new(drill, broker, backend, quick, messages);
        let held = with_connection!(backend, C => run::<C>(&plan));
        if !held {
            failed += 1;
        }
    }
    if failed > 0 {
        eprintln!("{failed} drill(s) failed");
        std::process::exit(1);
    }
}

struct Workers {
    url: String,
    webhook: String,
    destination: Option<String>,
    children: Vec<Child>,
}

impl Workers {
    fn spawn_one(&self) -> Child {
        let mut command = Command::new(std::env::current_exe().expect("this executable"));
        if let Some(destination) = &self.destination {
            command.env("OUTBOX_WORKER_DESTINATION", destination);
        }
        command
            .arg("worker")
            .env("OUTBOX_WORKER_DATABASE_URL", &self.url)
            .env("OUTBOX_WORKER_WEBHOOK_URL", &self.webhook)
            .env("OUTBOX_WORKER_LEASE_MS", "6000")
            .env("OUTBOX_WORKER_TIMEOUT_MS", "1000")
            .stdout(Stdio::null())
            .spawn()
            .expect("starting a worker process")
    }

    fn kill(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }

    fn restart(&mut self, i: usize) {
        self.kill(i);
        self.children[i] = self.spawn_one();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

fn chaos(n: usize) -> Reply {
    match n % 20 {
        0 => Reply::Status(500, Vec::new(), b"internal error".to_vec()),
        3 => Reply::with_header(429, "retry-after", "1"),
        6 => Reply::Hang(Duration::from_secs(3)),
        9 => Reply::Truncated,
        12 => Reply::Status(200, Vec::new(), vec![b'x'; 10 << 20]),
        15 => Reply::TrickleHead(Duration::from_millis(60)),
        18 => Reply::with_header(308, "location", "http://127.0.0.1:9/elsewhere"),
        _ => Reply::status(200),
    }
}

/// Every fifth answer a 500 whose text a LATIN1 database cannot store.
fn unencodable(n: usize) -> Reply {
    if n.is_multiple_of(5) {
        Reply::with_body(500, "Ошибка: überlastet … 再試行")
    } else {
        Reply::status(200)
    }
}

/// Every tenth answer trickled: 50 bytes, one every 100 ms, five times the endpoint timeout.
fn trickling(n: usize) -> Reply {
    if n.is_multiple_of(10) {
        Reply::TrickleBody {
            every: Duration::from_millis(100),
            bytes: 50,
        }
    } else {
        Reply::status(200)
    }
}

/// The messages leased right now: after a fault, the only ones that may arrive twice.
fn in_flight<C: TestConnection>(pool: &TestPool<C>) -> HashSet<MessageId> {
    let mut conn = pool.get().expect("a connection");
    pending_messages(&mut conn, &ListOptions::new().limit(u32::MAX))
        .expect("listing pending messages")
        .into_iter()
        .filter(|m| m.in_flight)
        .map(|m| m.message_id)
        .collect()
}

fn pending<C: TestConnection>(pool: &TestPool<C>) -> Option<u64> {
    let mut conn = pool.get().ok()?;
    stats(&mut conn)
        .ok()
        .map(|types| types.iter().map(|t| t.pending).sum())
}

fn enqueue<C: TestConnection + Connection>(plan: &Plan, pool: &TestPool<C>, ledger: &mut Ledger) {
    let mut conn = pool.get().expect("a connection");
    let mut n = 0u64;
    let mut tx = 0u64;
    while n < plan.messages {
        tx += 1;
        let size = 1 + fastrand::u64(0..8);
        let roll_back = tx.is_multiple_of(plan.rollback_every);
        let mut batch = Batch::new();
        let mut written: Vec<(MessageId, Option<String>, bool)> = Vec::new();
        for _ in 0..size.min(plan.messages - n) {
            n += 1;
            if plan.poison_every > 0 && n.is_multiple_of(plan.poison_every) {
                let id = if n.is_multiple_of(2 * plan.poison_every) {
                    batch.push(&Garbled { garbled: true })
                } else {
                    batch.push(&Nobody { n })
                }
                .expect("serializing");
                written.push((id, None, true));
                continue;
            }
            let key = n.is_multiple_of(3).then(|| format!("key-{}", n % 16));
            let hook = Hook {
                n: n as u32,
                key: key.clone(),
            };
            // Some raised priorities, keyed and not: the checker holds each key to its order
            // whatever the priorities (and groups) of its messages.
            let priority = match n % 7 {
                0 => Priority::Urgent,
                1 | 2 => Priority::High,
                _ => Priority::Normal,
            };
            let options = match &key {
                Some(key) => EnqueueOptions::new().ordering_key(key.clone()),
                None => EnqueueOptions::new(),
            }
            .priority(priority);
            // Groups too, a key's messages in more than one of them: fairness shares claims
            // out among groups, and must not reorder a key either.
            let options = match n % 5 {
                0 => options,
                g => options.group(format!("tenant-{g}")),
            };
            let id = if plan.broker.is_some() {
                batch.push_with(&Relayed::new(n as u32, key.as_deref()), &options)
            } else if plan.stall_every > 0 && n.is_multiple_of(plan.stall_every) {
                let stall = Stall {
                    hook,
                    hang_ms: 5_000,
                };
                batch.push_with(&stall, &options)
            } else {
                batch.push_with(&hook, &options)
            };
            written.push((id.expect("serializing"), key, false));
        }
        let result: Result<(), outbox_diesel::Error> = conn.transaction(|conn| {
            batch.enqueue(conn)?;
            if roll_back {
                Err(outbox_diesel::Error::Database(
                    diesel::result::Error::RollbackTransaction,
                ))
            } else {
                Ok(())
            }
        });
        for (id, key, poison) in written {
            match (&result, poison) {
                (Ok(()), true) => ledger.committed_poison(id),
                (Ok(()), false) => ledger.committed(id, key),
                (Err(_), _) => ledger.rolled_back(id),
            }
        }
        if let Err(error) = &result {
            assert!(roll_back, "an enqueue failed: {error}");
        }
    }
}

fn restart_database(backend: Backend) {
    match backend {
        Backend::Postgres => {
            let version = std::fs::read_dir("/etc/postgresql")
                .ok()
                .and_then(|mut d| d.next())
                .and_then(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .expect("a PostgreSQL cluster under /etc/postgresql");
            let status = Command::new("pg_ctlcluster")
                .args(["--skip-systemctl-redirect", &version, "main", "restart"])
                .status()
                .expect("pg_ctlcluster");
            assert!(status.success(), "restarting PostgreSQL failed");
        }
        Backend::Mysql => {
            let _ = Command::new("mysqladmin")
                .args(["-uroot", "-h127.0.0.1", "shutdown"])
                .status();
            let until = Instant::now() + Duration::from_secs(30);
            while Command::new("pgrep")
                .args(["-x", "mariadbd"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                assert!(Instant::now() < until, "MariaDB did not stop");
                std::thread::sleep(Duration::from_millis(100));
            }
            let status = Command::new("start-stop-daemon")
                .args([
                    "--start",
                    "--oknodo",
                    "--background",
                    "--exec",
                    "/usr/sbin/mariadbd",
                ])
                .status()
                .expect("start-stop-daemon");
            assert!(status.success(), "starting MariaDB failed");
            while !Command::new("mysqladmin")
                .args(["-uroot", "-h127.0.0.1", "status"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                assert!(Instant::now() < until, "MariaDB did not come back");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Backend::Sqlite => {}
    }
}

fn run<C: TestConnection + Connection>(plan: &Plan) -> bool {
    let started = Instant::now();
    let options = match plan.drill {
        Drill::RefusedOutcome => "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
        _ => "",
    };
    let db =
        TestDb::new_with(plan.backend, options).expect("the drill's database server is reachable");
    let pool = db.pool::<C>(4);
    let receiver = match plan.drill {
        Drill::Receiver => Receiver::start(|_, n| chaos(n)),
        Drill::RefusedOutcome => Receiver::start(|_, n| unencodable(n)),
        Drill::Trickle => Receiver::start(|_, n| trickling(n)),
        // A receiver that takes a moment keeps messages in flight for the kills to hit. The
        // delay is the receiver's own (each connection waits on its own thread): a behaviour
        // that sleeps runs under the receiver's lock, one request at a time, and made this drill
        // last 50,000 × 5 ms, over four minutes, whatever the worker did.
        Drill::Kill => {
            let receiver = Receiver::ok();
            receiver.set_delay(Duration::from_millis(5));
            receiver
        }
        _ => Receiver::ok(),
    };
    let destination = plan.broker.map(Destination::create);
    let mut workers = Workers {
        url: db.url().to_owned(),
        webhook: receiver.url("/hook"),
        destination: destination.as_ref().map(Destination::worker_env),
        children: Vec::new(),
    };
    let mut ledger = Ledger::new();
    let enqueue_first = plan.drill == Drill::DbRestart;
    if enqueue_first {
        enqueue(plan, &pool, &mut ledger);
    }
    workers.children = (0..plan.workers).map(|_| workers.spawn_one()).collect();
    if !enqueue_first {
        enqueue(plan, &pool, &mut ledger);
    }

    let mut faults = 0;
    let mut in_flight_at_faults = HashSet::new();
    match plan.drill {
        Drill::Kill => {
            while faults < plan.kills && pending(&pool).is_some_and(|p| p > 0) {
                std::thread::sleep(Duration::from_millis(fastrand::u64(100..400)));
                let victim = fastrand::usize(0..workers.children.len());
                workers.kill(victim);
                in_flight_at_faults.extend(in_flight(&pool));
                workers.restart(victim);
                faults += 1;
            }
        }
        Drill::DbRestart => {
            let target = ledger.committed_count() * 3 / 10;
            let until = Instant::now() + Duration::from_secs(120);
            while receiver.requests().len() < target && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            in_flight_at_faults.extend(in_flight(&pool));
            restart_database(plan.backend);
            faults += 1;
        }
        _ => {}
    }

    // A 429 holds its destination for its Retry-After (issue 23), so the receiver drill's
    // quick run takes about two minutes: patience is for a stuck drain, not a slow one.
    let patience = Duration::from_secs(if plan.quick { 300 } else { 900 });
    let until = Instant::now() + patience;
    while pending(&pool) != Some(0) {
        if Instant::now() > until {
            eprintln!("{}: not drained after {patience:?}", plan.drill.name());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    drop(workers);

    let arrivals: Vec<Arrival> = match &destination {
        Some(destination) => destination.arrivals(),
        None => receiver
            .requests()
            .iter()
            .filter_map(|r| {
                Some(Arrival {
                    id: r.header("webhook-id")?.parse().ok()?,
                    delivered: (200..300).contains(&r.answered),
                })
            })
            .collect(),
    };
    let letters = dead_letters(
        &mut pool.get().expect("a connection"),
        &ListOptions::new().limit(u32::MAX),
    )
    .expect("listing dead letters");
    let dead: HashSet<MessageId> = letters.iter().map(|l| l.message_id).collect();
    let unexplained: Vec<&str> = letters
        .iter()
        .map(|l| l.last_error.as_str())
        .filter(|e| {
            !(e.contains("no handler is registered")
                || e.contains("does not deserialize")
                || e.contains("redirect"))
        })
        .collect();
    let report = check(&ledger, &arrivals, &dead);
    let duplicates_explained = report
        .duplicated
        .iter()
        .all(|id| in_flight_at_faults.contains(id));
    // JetStream drops redeliveries by `Nats-Msg-Id`: each message enters the stream once.
    let allowed_duplicates = match &destination {
        Some(Destination::JetStream(_)) => 0,
        _ => in_flight_at_faults.len(),
    };
    let held = report.holds(allowed_duplicates) && duplicates_explained && unexplained.is_empty();
    let mut line = report.figures();
    line["drill"] = plan.drill.name().into();
    if let Some(destination) = &destination {
        line["destination"] = destination.name().into();
    }
    line["backend"] = format!("{:?}", plan.backend).to_lowercase().into();
    line["mode"] = if plan.quick { "quick" } else { "full" }.into();
    line["workers"] = plan.workers.into();
    line["faults"] = faults.into();
    line["in_flight_at_faults"] = in_flight_at_faults.len().into();
    line["duplicates_not_in_flight"] = (!duplicates_explained).into();
    line["requests"] = arrivals.len().into();
    line["seconds"] = ((started.elapsed().as_secs_f64() * 10.0).round() / 10.0).into();
    line["ok"] = held.into();
    println!("{line}");
    if !held {
        let mut details = report.details();
        details["unexplained_dead_letters"] = unexplained
            .iter()
            .take(10)
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .into();
        println!("{details}");
        for lost in report.lost.iter().take(3) {
            let seen: Vec<u16> = receiver
                .requests()
                .iter()
                .filter(|r| r.header("webhook-id") == Some(lost.to_string().as_str()))
                .map(|r| r.answered)
                .collect();
            eprintln!("lost {lost}: answered {seen:?}");
        }
    }
    held
}
