//! The delivery log on every backend, against a real receiver on 127.0.0.1: every exchange of a
//! message that failed twice and then succeeded is kept with its status, answer and error, in
//! order; a subscription's deliveries are logged under their subscription; "failures only"
//! keeps what did not deliver and "off" keeps nothing; retention prunes the log by count and by
//! age, and the worker prunes it by itself; a settlement that fails writes no attempt.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use diesel::connection::SimpleConnection;
use outbox_diesel::delivery_log::{
    self, AttemptFilter, DeliveryLog, DeliveryLogRetention, LoggedAttempt,
};
use outbox_diesel::destination::{Answer, DestinationOptions, HealthPolicy};
use outbox_diesel::store::{ClaimLimit, ClaimToken, Exchange, Settlement, Store};
use outbox_diesel::subscription::NewSubscription;
use outbox_diesel::{
    outbox_handler, Batch, DieselStore, Enqueue, MessageId, OutboxManager, RetryPolicy, Worker,
    WorkerHandle,
};
use outbox_testkit::http::{Receiver, Reply, Request};
use outbox_testkit::outbox::{dead, endpoint, outcome, pending, subscriptions};
use outbox_testkit::{backend_tests, eventually, Backend, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(30);

/// An invoice event, delivered to the `hooks` webhook.
#[outbox_handler("log.invoice", deliver_to = "hooks")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Invoice {
    n: u32,
}

/// An event for subscribers.
#[outbox_handler("log.event", deliver_to = "subscribers")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    n: u32,
}

fn worker_on<C: TestConnection>(
    store: DieselStore<OutboxManager<C>>,
    receiver: &Receiver,
) -> WorkerHandle {
    Worker::builder(store)
        .handler_threads(2)
        .poll_interval(Duration::from_millis(50))
        .destination_with(
            "hooks",
            endpoint(&receiver.url("/hooks"), PATIENCE),
            DestinationOptions::new().health_policy(HealthPolicy::never_pause()),
        )
        .subscriptions(
            subscriptions()
                .delivery()
                .options(DestinationOptions::new().health_policy(HealthPolicy::never_pause())),
        )
        .retry_policy(
            RetryPolicy::new()
                .max_attempts(5)
                .initial_backoff(Duration::from_millis(50))
                .max_backoff(Duration::from_millis(100)),
        )
        .spawn()
        .expect("the worker starts")
}

fn stop(worker: WorkerHandle) {
    worker.shutdown(PATIENCE).expect("the worker stops");
}

/// The attempts `filter` selects, as the library reads them (its limit kept: paging is tried).
fn logged<C: TestConnection>(pool: &TestPool<C>, filter: &AttemptFilter) -> Vec<LoggedAttempt> {
    delivery_log::attempts(&mut pool.get().unwrap(), filter).expect("the log reads")
}

/// The message's three attempts are in the log, oldest last: two `500`s with the receiver's
/// answer and the error, then the `200` that delivered it, each timed and in order.
fn every_attempt_of_a_message_that_failed_twice_then_succeeded_is_logged<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(8);
    let receiver = Receiver::start(|_: &Request, n| {
        if n < 2 {
            Reply::with_body(500, "down for maintenance")
        } else {
            Reply::with_body(200, "thanks")
        }
    });
    let before = SystemTime::now();
    let id = Invoice { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = worker_on::<C>(DieselStore::new(pool.clone()), &receiver);
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "delivered after two failures; the receiver got {}",
        receiver.count()
    );
    stop(worker);
    assert_eq!(receiver.count(), 3);

    let mut attempts = logged(&pool, &AttemptFilter::default().message(id));
    attempts.reverse();
    let summary: Vec<(u32, &str, Option<u16>, Option<&str>)> = attempts
        .iter()
        .map(|a| (a.attempt, a.outcome.as_str(), a.status, a.answer.as_deref()))
        .collect();
    assert_eq!(
        summary,
        [
            (1, "failed", Some(500), Some("down for maintenance")),
            (2, "failed", Some(500), Some("down for maintenance")),
            (3, "delivered", Some(200), Some("thanks")),
        ]
    );
    for attempt in &attempts {
        assert_eq!(attempt.message_id, id);
        assert_eq!(attempt.message_type, "log.invoice");
        assert_eq!(attempt.destination, "hooks");
        assert_eq!(attempt.subscription_id, None);
        assert!(attempt.latency_ms >= 0.0 && attempt.latency_ms < 30_000.0);
        // Times come from the worker's clock and the database's text of it.
        let skew = Duration::from_millis(5);
        assert!(attempt.started_at + skew >= before, "{attempt:?}");
        assert!(attempt.started_at <= SystemTime::now(), "{attempt:?}");
    }
    let errors: Vec<bool> = attempts.iter().map(|a| a.error.is_some()).collect();
    assert_eq!(errors, [true, true, false]);
    assert!(
        attempts[0].error.as_deref().unwrap_or("").contains("500"),
        "{:?}",
        attempts[0].error
    );
    assert!(attempts
        .windows(2)
        .all(|w| w[0].id < w[1].id && w[0].started_at <= w[1].started_at));

    // The destination's failures, by filter: the two 500s and nothing else.
    let failures = logged(
        &pool,
        &AttemptFilter::default()
            .destination("hooks")
            .failures_only(),
    );
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(logged(&pool, &AttemptFilter::default().destination("crm")).is_empty());
    // Paging: the newest first, then the one before it.
    let newest = logged(
        &pool,
        &AttemptFilter {
            limit: 1,
            ..AttemptFilter::default()
        },
    );
    assert_eq!(newest[0].status, Some(200));
    let before_newest = logged(
        &pool,
        &AttemptFilter {
            limit: 1,
            before: Some(newest[0].id),
            ..AttemptFilter::default()
        },
    );
    assert_eq!(before_newest[0].attempt, 2);
    // A time range that ends before the first attempt has none of them.
    let earlier = logged(
        &pool,
        &AttemptFilter {
            until: Some(before - Duration::from_secs(1)),
            ..AttemptFilter::default()
        },
    );
    assert!(earlier.is_empty(), "{earlier:?}");
}

/// A subscription's deliveries are logged under `subscription:<id>` with the subscription's
/// id, each subscriber's own, and found by it.
fn a_subscriptions_deliveries_are_logged_under_it<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    let hooks = Receiver::ok();
    let (accepting, refusing) = (
        Receiver::ok(),
        Receiver::start(|_: &Request, _| Reply::with_body(422, "unknown event")),
    );
    let subscribe = |receiver: &Receiver| {
        subscriptions()
            .create(
                &mut pool.get().unwrap(),
                &NewSubscription::new(receiver.url("/hooks"), ["log.*"]).allow_http(),
            )
            .unwrap()
            .subscription
            .id
    };
    let (accepting_id, refusing_id) = (subscribe(&accepting), subscribe(&refusing));
    let mut batch = Batch::new();
    let mut events = BTreeSet::new();
    for n in 0..3 {
        events.insert(batch.push(&Event { n }).unwrap());
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = worker_on::<C>(DieselStore::new(pool.clone()), &hooks);
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()
            && dead(&pool).len() == 3),
        "each event reached both; {} pending, {} dead",
        pending(&pool).len(),
        dead(&pool).len()
    );
    stop(worker);

    let accepted = logged(
        &pool,
        &AttemptFilter::default().subscription(accepting_id.clone()),
    );
    let refused = logged(
        &pool,
        &AttemptFilter::default().subscription(refusing_id.clone()),
    );
    let ids = |attempts: &[LoggedAttempt]| -> BTreeSet<MessageId> {
        attempts.iter().map(|a| a.message_id).collect()
    };
    assert_eq!(accepted.len(), 3, "{accepted:?}");
    assert_eq!(refused.len(), 3, "{refused:?}");
    // Each delivery carries the event's id to each subscriber.
    assert_eq!(ids(&accepted), events);
    assert_eq!(ids(&refused), events);
    assert!(accepted.iter().all(|a| a.outcome == "delivered"
        && a.status == Some(200)
        && a.destination == format!("subscription:{accepting_id}")));
    assert!(refused.iter().all(|a| a.outcome == "rejected"
        && a.status == Some(422)
        && a.answer.as_deref() == Some("unknown event")
        && a.destination == format!("subscription:{refusing_id}")));
    // The fan-out itself is no exchange with a destination: six rows in all.
    assert_eq!(logged(&pool, &AttemptFilter::default()).len(), 6);
}

/// `Failures` keeps only what did not deliver; `Off` keeps nothing.
fn failures_only_keeps_what_did_not_deliver_and_off_keeps_nothing<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    // Odd invoices are refused for good; even ones delivered.
    let receiver = Receiver::start(|request: &Request, _| {
        if request.json()["data"]["n"].as_u64().unwrap_or(0) % 2 == 1 {
            Reply::with_body(400, "no such customer")
        } else {
            Reply::status(204)
        }
    });
    let mut batch = Batch::new();
    let mut refused = BTreeSet::new();
    for n in 0..6 {
        let id = batch.push(&Invoice { n }).unwrap();
        if n % 2 == 1 {
            refused.insert(id);
        }
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let store = DieselStore::new(pool.clone()).delivery_log(DeliveryLog::Failures);
    let worker = worker_on::<C>(store, &receiver);
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    stop(worker);
    let kept = logged(&pool, &AttemptFilter::default());
    assert_eq!(
        kept.iter().map(|a| a.message_id).collect::<BTreeSet<_>>(),
        refused
    );
    assert!(kept
        .iter()
        .all(|a| a.outcome == "rejected" && a.status == Some(400)));

    let mut batch = Batch::new();
    for n in 10..16 {
        batch.push(&Invoice { n }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let store = DieselStore::new(pool.clone()).delivery_log(DeliveryLog::Off);
    let worker = worker_on::<C>(store, &receiver);
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    stop(worker);
    assert_eq!(receiver.count(), 12);
    assert_eq!(logged(&pool, &AttemptFilter::default()).len(), kept.len());
}

/// Pruning by count keeps the newest; by age removes what is older and keeps what is not; a
/// worker whose store keeps few attempts prunes the rest by itself.
fn retention_prunes_the_log<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    let receiver = Receiver::ok();
    let deliver = |from: u32, to: u32, store: DieselStore<OutboxManager<C>>| {
        let mut batch = Batch::new();
        for n in from..to {
            batch.push(&Invoice { n }).unwrap();
        }
        batch.enqueue(&mut pool.get().unwrap()).unwrap();
        let worker = worker_on::<C>(store, &receiver);
        assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
        stop(worker);
    };
    deliver(0, 30, DieselStore::new(pool.clone()));
    let all = logged(&pool, &AttemptFilter::default());
    assert_eq!(all.len(), 30);

    let by_count = DeliveryLogRetention {
        max_age: None,
        max_rows: Some(10),
    };
    let pruned = delivery_log::prune(&mut pool.get().unwrap(), by_count).unwrap();
    assert_eq!(pruned, 20);
    let kept: Vec<i64> = logged(&pool, &AttemptFilter::default())
        .iter()
        .map(|a| a.id)
        .collect();
    let newest: Vec<i64> = all.iter().take(10).map(|a| a.id).collect();
    assert_eq!(kept, newest, "the newest ten are kept");

    // Ten older than two seconds, then five new ones: an age of one and a half seconds
    // prunes the old ten only.
    std::thread::sleep(Duration::from_secs(2));
    deliver(30, 35, DieselStore::new(pool.clone()));
    let by_age = DeliveryLogRetention {
        max_age: Some(Duration::from_millis(1500)),
        max_rows: None,
    };
    assert_eq!(
        delivery_log::prune(&mut pool.get().unwrap(), by_age).unwrap(),
        10
    );
    let left = logged(&pool, &AttemptFilter::default());
    assert_eq!(left.len(), 5);
    assert!(left.iter().all(|a| !kept.contains(&a.id)));

    // A worker keeping three prunes the rest itself, on its housekeeping round.
    let store = DieselStore::new(pool.clone()).delivery_log_retention(DeliveryLogRetention {
        max_age: None,
        max_rows: Some(3),
    });
    let mut batch = Batch::new();
    for n in 40..45 {
        batch.push(&Invoice { n }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = worker_on::<C>(store, &receiver);
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()
            && logged(&pool, &AttemptFilter::default()).len() == 3),
        "{} logged",
        logged(&pool, &AttemptFilter::default()).len()
    );
    stop(worker);
}

/// A settlement that fails writes no attempt: the log and the outcome commit together. A
/// trigger refuses the outcome's delete; the attempt it carried is not in the log, and the
/// message is still pending. Without the trigger, the same settlement writes both.
fn a_settlement_that_fails_logs_nothing<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let id = Invoice { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let exchange = Exchange {
        destination: "hooks".to_owned(),
        outcome: "delivered",
        answer: Some(Answer::new(Some(200), "ok")),
        error: None,
        started_at: SystemTime::now(),
        latency: Duration::from_millis(4),
    };
    let done = outcome(token, &claimed[0], Settlement::Done).logging(&claimed[0], vec![exchange]);
    let (refuse, allow) = match db.backend() {
        Backend::Postgres => (
            "CREATE FUNCTION refuse_delete() RETURNS trigger AS $$ BEGIN \
             RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER refuse BEFORE DELETE ON outbox_message FOR EACH ROW \
             EXECUTE FUNCTION refuse_delete();",
            "DROP TRIGGER refuse ON outbox_message;",
        ),
        Backend::Mysql => (
            "CREATE TRIGGER refuse BEFORE DELETE ON outbox_message FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test';",
            "DROP TRIGGER refuse;",
        ),
        Backend::Sqlite => (
            "CREATE TRIGGER refuse BEFORE DELETE ON outbox_message \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
            "DROP TRIGGER refuse;",
        ),
    };
    pool.get().unwrap().batch_execute(refuse).unwrap();
    let refused = store.settle(std::slice::from_ref(&done));
    assert!(refused.is_err(), "{refused:?}");
    assert!(logged(&pool, &AttemptFilter::default()).is_empty());
    assert_eq!(pending(&pool).len(), 1);

    pool.get().unwrap().batch_execute(allow).unwrap();
    assert_eq!(store.settle(&[done]).unwrap(), Vec::<i64>::new());
    assert!(pending(&pool).is_empty());
    let attempts = logged(&pool, &AttemptFilter::default());
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        (attempts[0].message_id, attempts[0].status),
        (id, Some(200))
    );
}

backend_tests!(
    a_settlement_that_fails_logs_nothing,
    every_attempt_of_a_message_that_failed_twice_then_succeeded_is_logged,
    a_subscriptions_deliveries_are_logged_under_it,
    failures_only_keeps_what_did_not_deliver_and_off_keeps_nothing,
    retention_prunes_the_log,
);
