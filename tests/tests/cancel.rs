//! Cancelling pending messages on every backend, delivered to a real receiver on 127.0.0.1: a
//! cancelled message never reaches its destination and keeps the operator's reason; a
//! cancelled head lets its key continue, in order; a message a worker holds is left alone and
//! counted; a subscription's deliveries are cancelled without touching another's; a cancel
//! that names nothing or gives no reason changes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel::{QueryableByName, RunQueryDsl};
use outbox_diesel::admin::{self, CancelSelection};
use outbox_diesel::destination::{DestinationOptions, HealthPolicy};
use outbox_diesel::subscription::NewSubscription;
use outbox_diesel::{
    outbox_handler, Batch, DieselStore, Enqueue, EnqueueOptions, Error, MessageId, RetryPolicy,
    Worker, WorkerHandle,
};
use outbox_testkit::http::{Receiver, Reply, Request};
use outbox_testkit::outbox::{claim, dead, endpoint, pending, subscriptions};
use outbox_testkit::{backend_tests, eventually, Backend, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(30);

/// A note sent by mistake, the kind an operator cancels.
#[outbox_handler("cancel.note", deliver_to = "hooks")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Note {
    n: u32,
}

/// A message nobody cancels.
#[outbox_handler("cancel.keep", deliver_to = "hooks")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Keep {
    n: u32,
}

/// An event for subscribers.
#[outbox_handler("cancel.event", deliver_to = "subscribers")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    n: u32,
}

fn spawn_worker<C: TestConnection>(pool: &TestPool<C>, receiver: &Receiver) -> WorkerHandle {
    Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(4)
        .poll_interval(Duration::from_millis(50))
        .destination("hooks", endpoint(&receiver.url("/hooks"), PATIENCE))
        .subscriptions(
            subscriptions()
                .delivery()
                .options(DestinationOptions::new().health_policy(HealthPolicy::never_pause())),
        )
        .retry_policy(
            RetryPolicy::new()
                .max_attempts(5)
                .initial_backoff(Duration::from_secs(3600)),
        )
        .spawn()
        .expect("the worker starts")
}

fn stop(worker: WorkerHandle) {
    worker.shutdown(PATIENCE).expect("the worker stops");
}

/// `(type, n)` of each request the receiver took, in arrival order.
fn received(receiver: &Receiver) -> Vec<(String, u64)> {
    receiver
        .requests()
        .iter()
        .map(|r| {
            let body = r.json();
            (
                body["type"].as_str().unwrap_or_default().to_owned(),
                body["data"]["n"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}

#[derive(QueryableByName, Debug)]
struct CancelledRow {
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = Text)]
    message_type: String,
    #[diesel(sql_type = Text)]
    reason: String,
    #[diesel(sql_type = BigInt)]
    attempts: i64,
}

#[derive(QueryableByName, Debug)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Pending messages that are deliveries to subscription `id` (a UUID: safe to inline).
fn deliveries_to(db: &TestDb, id: &str) -> i64 {
    let sql = format!(
        "SELECT CAST(count(*) AS {}) AS n FROM outbox_message WHERE subscription_id = '{id}'",
        if db.backend() == Backend::Mysql {
            "SIGNED"
        } else {
            "BIGINT"
        }
    );
    let counted: Vec<Count> = outbox_testkit::with_connection!(db.backend(), Conn => {
        diesel::sql_query(sql).load(&mut db.connect::<Conn>()).unwrap()
    });
    counted[0].n
}

/// The record of cancelled messages.
fn cancelled_rows(db: &TestDb) -> Vec<CancelledRow> {
    // Each backend's text of a UUID and a 32-bit integer, as one query.
    let sql = "SELECT CAST(message_id AS CHAR(36)) AS message_id, message_type, reason, \
               CAST(attempts AS BIGINT) AS attempts FROM outbox_cancelled ORDER BY id";
    let mysql = "SELECT message_id, message_type, reason, CAST(attempts AS SIGNED) AS attempts \
                 FROM outbox_cancelled ORDER BY id";
    let sql = if db.backend() == Backend::Mysql {
        mysql
    } else {
        sql
    };
    outbox_testkit::with_connection!(db.backend(), Conn => {
        diesel::sql_query(sql).load(&mut db.connect::<Conn>()).unwrap()
    })
}

/// A cancel of a type removes every pending message of it before a worker starts: the worker
/// then delivers the other type only, nothing is dead-lettered, and each cancelled message is
/// kept with its id, type and the operator's reason.
fn cancelled_messages_never_reach_their_destination<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    let receiver = Receiver::ok();
    let mut batch = Batch::new();
    let mut notes = BTreeSet::new();
    for n in 0..10 {
        notes.insert(batch.push(&Note { n }).unwrap().to_string());
        batch.push(&Keep { n }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();

    let cancelled = admin::cancel(
        &mut pool.get().unwrap(),
        &CancelSelection::new().message_type("cancel.note"),
        "  sent by mistake ",
    )
    .unwrap();
    assert_eq!((cancelled.cancelled, cancelled.in_flight), (10, 0));

    let worker = spawn_worker(&pool, &receiver);
    assert!(
        receiver.wait_unique(10, PATIENCE),
        "got {}",
        receiver.unique()
    );
    // Give a cancelled message every chance to show up.
    std::thread::sleep(Duration::from_millis(500));
    stop(worker);
    let got = received(&receiver);
    assert_eq!(got.len(), 10, "{got:?}");
    assert!(got.iter().all(|(t, _)| t == "cancel.keep"), "{got:?}");
    assert!(pending(&pool).is_empty());
    assert!(dead(&pool).is_empty(), "a cancel is never a dead letter");

    let rows = cancelled_rows(db);
    assert_eq!(
        rows.iter()
            .map(|r| r.message_id.clone())
            .collect::<BTreeSet<_>>(),
        notes
    );
    assert!(rows
        .iter()
        .all(|r| r.message_type == "cancel.note" && r.reason == "sent by mistake"));
    assert!(rows.iter().all(|r| r.attempts == 0));
}

/// Cancelling the head of a key (and a message further down it) lets the key's next message
/// run at once, and the rest arrive in order.
fn cancelling_a_keyed_head_lets_its_key_continue_in_order<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    let receiver = Receiver::ok();
    let mut ids: Vec<MessageId> = Vec::new();
    for n in 0..6 {
        let id = Note { n }
            .enqueue_with(
                &mut pool.get().unwrap(),
                &EnqueueOptions::new().ordering_key("customer-7"),
            )
            .unwrap();
        ids.push(id);
    }
    let parked = |pool: &TestPool<C>| pending(pool).iter().filter(|m| m.parked).count();
    let parked_before = parked(&pool);
    for (id, reason) in [(ids[0], "the head"), (ids[3], "one further down")] {
        let cancelled = admin::cancel(
            &mut pool.get().unwrap(),
            &CancelSelection::new().message_id(id),
            reason,
        )
        .unwrap();
        assert_eq!(cancelled.cancelled, 1, "{reason}");
    }
    // Where the enqueue parks the messages behind a head (PostgreSQL, SQLite), the cancel
    // promoted the next one itself: no safety net had to.
    assert_eq!(
        parked(&pool),
        parked_before.saturating_sub(2),
        "the head's successor is unparked (and the other cancelled message was parked)"
    );
    let heads: Vec<_> = pending(&pool)
        .into_iter()
        .filter(|m| !m.parked)
        .map(|m| m.message_id)
        .collect();
    assert!(
        heads.contains(&ids[1]),
        "the next message heads the key: {heads:?}"
    );

    let worker = spawn_worker(&pool, &receiver);
    assert!(
        receiver.wait_unique(4, PATIENCE),
        "got {}",
        receiver.unique()
    );
    std::thread::sleep(Duration::from_millis(300));
    stop(worker);
    let order: Vec<u64> = received(&receiver).into_iter().map(|(_, n)| n).collect();
    assert_eq!(order, [1, 2, 4, 5]);
    assert!(pending(&pool).is_empty());
}

/// A message a worker holds right now cannot be called back: the cancel leaves it, counts it,
/// and takes the rest.
fn a_message_a_worker_holds_is_left_alone_and_counted<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    let mut batch = Batch::new();
    for n in 0..3 {
        batch.push(&Note { n }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let store = DieselStore::new(pool.clone());
    let (_token, held) = claim(&store, 1, PATIENCE);
    assert_eq!(held.len(), 1);

    let cancelled = admin::cancel(
        &mut pool.get().unwrap(),
        &CancelSelection::new().message_type("cancel.note"),
        "stop them",
    )
    .unwrap();
    assert_eq!((cancelled.cancelled, cancelled.in_flight), (2, 1));
    let left = pending(&pool);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].message_id, held[0].message_id);
    assert!(left[0].in_flight);
}

/// Cancelling one subscription's deliveries leaves another subscription's, and the events
/// still to be fanned out, alone.
fn a_subscriptions_deliveries_are_cancelled_alone<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    let hooks = Receiver::ok();
    // Both subscribers answer 500: every delivery waits an hour for its second attempt.
    let (gone, kept) = (
        Receiver::start(|_: &Request, _| Reply::status(500)),
        Receiver::start(|_: &Request, _| Reply::status(500)),
    );
    let subscribe = |receiver: &Receiver| {
        subscriptions()
            .create(
                &mut pool.get().unwrap(),
                &NewSubscription::new(receiver.url("/hooks"), ["cancel.*"]).allow_http(),
            )
            .unwrap()
            .subscription
            .id
    };
    let (gone_id, kept_id) = (subscribe(&gone), subscribe(&kept));
    let mut batch = Batch::new();
    for n in 0..5 {
        batch.push(&Event { n }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = spawn_worker(&pool, &hooks);
    assert!(
        eventually(PATIENCE, || gone.requests().len() == 5
            && kept.requests().len() == 5
            && pending(&pool).iter().all(|m| !m.in_flight)),
        "each subscriber's first attempts: {} and {}",
        gone.requests().len(),
        kept.requests().len()
    );
    let cancelled = admin::cancel(
        &mut pool.get().unwrap(),
        &CancelSelection::new().subscription(gone_id.clone()),
        "the customer removed the endpoint",
    )
    .unwrap();
    stop(worker);
    assert_eq!((cancelled.cancelled, cancelled.in_flight), (5, 0));
    assert_eq!(pending(&pool).len(), 5);
    assert_eq!(
        deliveries_to(db, &kept_id),
        5,
        "the other subscriber's wait"
    );
    assert_eq!(deliveries_to(db, &gone_id), 0);
    assert!(cancelled_rows(db)
        .iter()
        .all(|r| r.message_type == "cancel.event"));
}

/// A cancel that names no message, type or subscription, or gives no reason, is refused and
/// changes nothing.
fn a_cancel_names_what_it_cancels_and_why<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    Note { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let refused = admin::cancel(
        &mut pool.get().unwrap(),
        &CancelSelection::new().older_than(Duration::ZERO),
        "everything",
    );
    assert!(
        matches!(&refused, Err(Error::InvalidCancel { reason }) if reason.contains("message id")),
        "{refused:?}"
    );
    let refused = admin::cancel(
        &mut pool.get().unwrap(),
        &CancelSelection::new().message_type("cancel.note"),
        " ",
    );
    assert!(
        matches!(&refused, Err(Error::InvalidCancel { reason }) if reason.contains("reason")),
        "{refused:?}"
    );
    // An age the message has not reached takes nothing.
    let young = admin::cancel(
        &mut pool.get().unwrap(),
        &CancelSelection::new()
            .message_type("cancel.note")
            .older_than(Duration::from_secs(3600)),
        "too young",
    )
    .unwrap();
    assert_eq!(young.cancelled, 0);
    assert_eq!(pending(&pool).len(), 1);
    assert!(cancelled_rows(db).is_empty());
}

backend_tests!(
    cancelled_messages_never_reach_their_destination,
    cancelling_a_keyed_head_lets_its_key_continue_in_order,
    a_message_a_worker_holds_is_left_alone_and_counted,
    a_subscriptions_deliveries_are_cancelled_alone,
    a_cancel_names_what_it_cancels_and_why,
);
