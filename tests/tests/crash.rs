//! A worker process killed with SIGKILL mid-delivery: after its leases expire another worker
//! delivers the rest. Nothing is lost; only messages in flight at the kill arrive twice.

use std::collections::{HashMap, HashSet};
use std::process::{Command, Stdio};
use std::time::Duration;

use outbox_diesel::{enqueue_all, MessageId};
use outbox_testkit::http::{Receiver, Reply};
use outbox_testkit::outbox::{endpoint, pending};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb};
use outbox_tests::handlers::{Hook, HOOK};

const MESSAGES: u32 = 300;

fn a_killed_worker_loses_nothing<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| {
        std::thread::sleep(Duration::from_millis(50));
        Reply::status(200)
    });
    let pool = db.pool::<C>(5);
    let hooks: Vec<Hook> = (0..MESSAGES).map(Hook::new).collect();
    let ids = enqueue_all(&mut pool.get().unwrap(), &hooks).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-test-worker"))
        .env("OUTBOX_WORKER_DATABASE_URL", db.url())
        .env("OUTBOX_WORKER_WEBHOOK_URL", receiver.url("/hook"))
        .env("OUTBOX_WORKER_LEASE_MS", "6000")
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the worker process");
    assert!(
        receiver.wait_for(40, Duration::from_secs(30)),
        "the child delivered nothing"
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaping the child");

    let in_flight: HashSet<MessageId> = pending(&pool)
        .into_iter()
        .filter(|m| m.in_flight)
        .map(|m| m.message_id)
        .collect();
    let before_kill = receiver.requests().len();
    assert!(!in_flight.is_empty(), "the kill found nothing in flight");
    // The child's batch of 16 and 8 handler threads: at most 2 × 16 + 8 held at once.
    assert!(
        in_flight.len() <= 2 * 16 + 8,
        "{} in flight",
        in_flight.len()
    );

    let worker = outbox_diesel::Worker::builder(outbox_diesel::DieselStore::new(pool.clone()))
        .handler_threads(8)
        .poll_interval(Duration::from_millis(100))
        .destination(
            HOOK,
            endpoint(&receiver.url("/hook"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(60), || pending(&pool).is_empty()));
    worker.shutdown(Duration::from_secs(10)).unwrap();

    let mut deliveries: HashMap<MessageId, usize> = HashMap::new();
    for request in receiver.requests() {
        let id: MessageId = request.header("webhook-id").unwrap().parse().unwrap();
        *deliveries.entry(id).or_default() += 1;
    }
    let lost: Vec<_> = ids
        .iter()
        .filter(|id| !deliveries.contains_key(id))
        .collect();
    assert!(lost.is_empty(), "{} messages lost", lost.len());
    let duplicated: HashSet<MessageId> = deliveries
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    assert!(
        duplicated.is_subset(&in_flight),
        "a message not in flight at the kill was delivered twice"
    );
    assert!(deliveries.values().all(|n| *n <= 2));
    eprintln!(
        "{:?}: {before_kill} delivered before the kill, {} in flight, {} delivered twice",
        db.backend(),
        in_flight.len(),
        duplicated.len()
    );
}

backend_tests!(a_killed_worker_loses_nothing);
