//! Replay and resend on every backend, against real receivers on 127.0.0.1: a replay of a time
//! range (and a type) re-delivers exactly the archived messages of that range, with their
//! original ids, to the one destination named and to no other; a subscription's replay takes
//! only its owner's events of the types it takes; a resend sends one message again; what the
//! archive does not have, a destination no worker has and a range that ends before it starts
//! are refused; the archive is pruned by its window.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use diesel::sql_types::BigInt;
use diesel::{QueryableByName, RunQueryDsl};
use outbox_diesel::admin;
use outbox_diesel::delivery_log::{self, AttemptFilter, Replay, ReplayTarget};
use outbox_diesel::destination::{DestinationOptions, HealthPolicy};
use outbox_diesel::subscription::NewSubscription;
use outbox_diesel::{
    outbox_handler, Batch, DieselStore, Enqueue, EnqueueOptions, Error, MessageId, Worker,
    WorkerHandle,
};
use outbox_testkit::http::Receiver;
use outbox_testkit::outbox::{endpoint, pending, subscriptions};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(30);
const HOUR: Duration = Duration::from_secs(3600);

#[outbox_handler("replay.invoice", deliver_to = "hooks")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Invoice {
    n: u32,
}

#[outbox_handler("replay.refund", deliver_to = "crm")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Refund {
    n: u32,
}

#[outbox_handler("replay.event", deliver_to = "subscribers")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    n: u32,
}

#[outbox_handler("replay.notice", deliver_to = "subscribers")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Notice {
    n: u32,
}

fn never_pause() -> DestinationOptions {
    DestinationOptions::new().health_policy(HealthPolicy::never_pause())
}

/// A worker delivering invoices to `hooks` and refunds to `crm`, and events to subscribers,
/// on a store that archives what it delivers (unless `archive` is `None`).
fn spawn_worker<C: TestConnection>(
    pool: &TestPool<C>,
    hooks: &Receiver,
    crm: &Receiver,
    archive: Option<Duration>,
) -> WorkerHandle {
    let mut store = DieselStore::new(pool.clone());
    if let Some(window) = archive {
        store = store.archive(window);
    }
    let worker = Worker::builder(store)
        .handler_threads(4)
        .poll_interval(Duration::from_millis(50))
        .destination_with(
            "hooks",
            endpoint(&hooks.url("/hooks"), PATIENCE),
            never_pause(),
        )
        .destination_with("crm", endpoint(&crm.url("/crm"), PATIENCE), never_pause())
        .subscriptions(subscriptions().delivery().options(never_pause()))
        .spawn()
        .expect("the worker starts");
    // A replay names a destination a worker has reported.
    assert!(
        eventually(PATIENCE, || {
            let reported = admin::destinations(&mut pool.get().unwrap()).unwrap();
            ["hooks", "crm"]
                .iter()
                .all(|name| reported.iter().any(|d| d.name == *name))
        }),
        "the worker reports its destinations"
    );
    worker
}

fn stop(worker: WorkerHandle) {
    worker.shutdown(PATIENCE).expect("the worker stops");
}

/// The ids a receiver was sent, as a set.
fn ids(receiver: &Receiver) -> BTreeSet<String> {
    receiver
        .requests()
        .iter()
        .filter_map(|r| r.webhook_id().map(str::to_owned))
        .collect()
}

fn text_ids(ids: &[MessageId]) -> BTreeSet<String> {
    ids.iter().map(MessageId::to_string).collect()
}

/// Waits until nothing is pending (every delivery done), then a moment for the clocks: the
/// next enqueue is strictly later than anything before.
fn delivered<C: TestConnection>(pool: &TestPool<C>) -> SystemTime {
    assert!(
        eventually(PATIENCE, || pending(pool).is_empty()),
        "{} pending",
        pending(pool).len()
    );
    std::thread::sleep(Duration::from_millis(30));
    let now = SystemTime::now();
    std::thread::sleep(Duration::from_millis(30));
    now
}

/// Invoices and refunds in three rounds; a replay of the middle round's invoices to `hooks`
/// sends exactly those, with their ids, and nothing to `crm`; a replay of the whole middle round
/// to `crm` sends it all there (invoices included) and nothing to `hooks`.
fn a_replay_of_a_range_redelivers_exactly_its_messages_to_the_one_destination_named<
    C: TestConnection,
>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(8);
    let (hooks, crm) = (Receiver::ok(), Receiver::ok());
    let worker = spawn_worker(&pool, &hooks, &crm, Some(HOUR));
    let round = |from: u32| -> (Vec<MessageId>, Vec<MessageId>) {
        let mut batch = Batch::new();
        let invoices: Vec<MessageId> = (from..from + 5)
            .map(|n| batch.push(&Invoice { n }).unwrap())
            .collect();
        let refunds: Vec<MessageId> = (from..from + 3)
            .map(|n| batch.push(&Refund { n }).unwrap())
            .collect();
        batch.enqueue(&mut pool.get().unwrap()).unwrap();
        (invoices, refunds)
    };
    round(0);
    let since = delivered(&pool);
    let (invoices, refunds) = round(10);
    let until = delivered(&pool);
    round(20);
    delivered(&pool);
    assert_eq!((hooks.count(), crm.count()), (15, 9));
    hooks.reset();
    crm.reset();

    let mut conn = pool.get().unwrap();
    let replay = Replay::new(ReplayTarget::Destination("hooks".into()), since)
        .until(until)
        .message_type("replay.invoice");
    let replayed = delivery_log::replay(&mut conn, &replay).unwrap();
    assert_eq!((replayed.enqueued, replayed.skipped), (5, 0));
    assert!(hooks.wait_for(5, PATIENCE), "got {}", hooks.count());
    delivered(&pool);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(hooks.count(), 5);
    assert_eq!(ids(&hooks), text_ids(&invoices));
    assert_eq!(crm.count(), 0, "no other destination gets a replay");
    let bodies: Vec<String> = hooks
        .requests()
        .iter()
        .map(|r| r.json()["type"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(bodies.iter().all(|t| t == "replay.invoice"), "{bodies:?}");

    hooks.reset();
    let everything = Replay::new(ReplayTarget::Destination("crm".into()), since).until(until);
    let replayed = delivery_log::replay(&mut conn, &everything).unwrap();
    assert_eq!(replayed.enqueued, 8);
    assert!(crm.wait_for(8, PATIENCE), "got {}", crm.count());
    delivered(&pool);
    let mut both = text_ids(&invoices);
    both.extend(text_ids(&refunds));
    assert_eq!(ids(&crm), both);
    assert_eq!(hooks.count(), 0);

    // The delivery log has the replayed attempts under their destinations, with their ids.
    let logged =
        delivery_log::attempts(&mut conn, &AttemptFilter::default().destination("crm")).unwrap();
    let replayed_ids: BTreeSet<String> = logged
        .iter()
        .filter(|a| invoices.contains(&a.message_id))
        .map(|a| a.message_id.to_string())
        .collect();
    assert_eq!(replayed_ids, text_ids(&invoices));
    assert!(logged.iter().all(|a| a.subscription_id.is_none()));
    stop(worker);
}

/// A subscription's replay takes its owner's events of the types its filters take, enqueued
/// since it was created, and no other subscription gets them.
fn a_subscriptions_replay_takes_only_its_owners_events_of_its_types<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(8);
    let (hooks, crm) = (Receiver::ok(), Receiver::ok());
    let (all_of_acme, notices_of_acme) = (Receiver::ok(), Receiver::ok());
    let subscribe = |receiver: &Receiver, types: &[&str]| {
        subscriptions()
            .create(
                &mut pool.get().unwrap(),
                &NewSubscription::new(receiver.url("/hooks"), types.iter().copied())
                    .owner("acme")
                    .allow_http(),
            )
            .unwrap()
            .subscription
            .id
    };
    let all_id = subscribe(&all_of_acme, &["replay.*"]);
    subscribe(&notices_of_acme, &["replay.notice"]);
    let worker = spawn_worker(&pool, &hooks, &crm, Some(HOUR));
    let since = SystemTime::now() - Duration::from_secs(1);
    let acme = EnqueueOptions::new().owner("acme");
    let other = EnqueueOptions::new().owner("globex");
    let mut conn = pool.get().unwrap();
    let mut acme_events = Vec::new();
    for n in 0..3 {
        acme_events.push(Event { n }.enqueue_with(&mut conn, &acme).unwrap());
        Event { n }.enqueue_with(&mut conn, &other).unwrap();
    }
    let notice = Notice { n: 9 }.enqueue_with(&mut conn, &acme).unwrap();
    delivered(&pool);
    assert_eq!((all_of_acme.count(), notices_of_acme.count()), (4, 1));
    all_of_acme.reset();
    notices_of_acme.reset();

    let to_all = Replay::new(ReplayTarget::Subscription(all_id.clone()), since);
    let replayed = delivery_log::replay(&mut conn, &to_all).unwrap();
    assert_eq!(
        (replayed.enqueued, replayed.skipped),
        (4, 3),
        "acme's four events; globex's three are not its owner's"
    );
    assert!(all_of_acme.wait_for(4, PATIENCE));
    delivered(&pool);
    let mut expected = text_ids(&acme_events);
    expected.insert(notice.to_string());
    assert_eq!(ids(&all_of_acme), expected);
    assert_eq!(
        notices_of_acme.count(),
        0,
        "another subscription gets nothing"
    );
    assert_eq!(hooks.count() + crm.count(), 0);
    let logged =
        delivery_log::attempts(&mut conn, &AttemptFilter::default().subscription(all_id)).unwrap();
    assert_eq!(logged.len(), 8, "four first deliveries and four replays");

    // A subscription created after the events never took them, and a replay does not send them.
    let late = Receiver::ok();
    let late_id = subscribe(&late, &["replay.*"]);
    let to_late = Replay::new(ReplayTarget::Subscription(late_id), since);
    let replayed = delivery_log::replay(&mut conn, &to_late).unwrap();
    assert_eq!((replayed.enqueued, replayed.skipped), (0, 7));
    assert!(pending(&pool).is_empty());
    stop(worker);
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn archived(db: &TestDb) -> i64 {
    let sql = if db.backend() == outbox_testkit::Backend::Mysql {
        "SELECT CAST(COUNT(*) AS SIGNED) AS n FROM outbox_archive"
    } else {
        "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM outbox_archive"
    };
    let counted: Vec<Count> = outbox_testkit::with_connection!(db.backend(), Conn => {
        diesel::sql_query(sql).load(&mut db.connect::<Conn>()).unwrap()
    });
    counted[0].n
}

/// A resend sends one archived message to the destination named; what the archive lacks, a
/// destination no worker has and a range that ends before it starts are refused, saying why;
/// a store without an archive keeps nothing to resend; the archive is pruned by its window.
fn a_resend_sends_one_message_again_and_what_cannot_be_replayed_is_refused<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(8);
    let (hooks, crm) = (Receiver::ok(), Receiver::ok());
    let worker = spawn_worker(&pool, &hooks, &crm, Some(HOUR));
    let mut conn = pool.get().unwrap();
    let invoice = Invoice { n: 1 }.enqueue(&mut conn).unwrap();
    delivered(&pool);
    stop(worker);
    assert_eq!(archived(db), 1);

    let refused = |result: Result<delivery_log::Replayed, Error>, says: &str| match result {
        Err(Error::InvalidReplay { reason }) => {
            assert!(reason.contains(says), "{reason} should say {says}")
        }
        other => panic!("refused for {says}, not {other:?}"),
    };
    refused(
        delivery_log::resend(
            &mut conn,
            MessageId::new(),
            &ReplayTarget::Destination("crm".into()),
        ),
        "not in the archive",
    );
    refused(
        delivery_log::resend(
            &mut conn,
            invoice,
            &ReplayTarget::Destination("nowhere".into()),
        ),
        "no worker has reported a destination named `nowhere`",
    );
    refused(
        delivery_log::resend(
            &mut conn,
            invoice,
            &ReplayTarget::Subscription("none".into()),
        ),
        "there is no subscription none",
    );
    let now = SystemTime::now();
    refused(
        delivery_log::replay(
            &mut conn,
            &Replay::new(ReplayTarget::Destination("crm".into()), now).until(now - HOUR),
        ),
        "ends before it starts",
    );
    assert!(pending(&pool).is_empty(), "nothing refused was enqueued");

    let worker = spawn_worker(&pool, &hooks, &crm, None);
    let sent =
        delivery_log::resend(&mut conn, invoice, &ReplayTarget::Destination("crm".into())).unwrap();
    assert_eq!(sent.enqueued, 1);
    assert!(crm.wait_for(1, PATIENCE));
    assert_eq!(ids(&crm), text_ids(&[invoice]));
    // Without an archive, what this worker delivers is not kept.
    let unkept = Invoice { n: 2 }.enqueue(&mut conn).unwrap();
    delivered(&pool);
    stop(worker);
    assert_eq!(archived(db), 1);
    refused(
        delivery_log::resend(&mut conn, unkept, &ReplayTarget::Destination("crm".into())),
        "not in the archive",
    );

    // The window: what was enqueued more than 1.5 s ago goes, what is younger stays.
    std::thread::sleep(Duration::from_secs(2));
    let worker = spawn_worker(&pool, &hooks, &crm, Some(HOUR));
    Invoice { n: 3 }.enqueue(&mut conn).unwrap();
    delivered(&pool);
    stop(worker);
    assert_eq!(archived(db), 2);
    assert_eq!(
        delivery_log::prune_archive(&mut conn, Duration::from_millis(1500)).unwrap(),
        1
    );
    assert_eq!(archived(db), 1);
}

backend_tests!(
    a_replay_of_a_range_redelivers_exactly_its_messages_to_the_one_destination_named,
    a_subscriptions_replay_takes_only_its_owners_events_of_its_types,
    a_resend_sends_one_message_again_and_what_cannot_be_replayed_is_refused,
);
