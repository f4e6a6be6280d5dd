//! Destination health against a real webhook receiver, on every backend: an outage pauses the
//! destination and its messages wait without spending their attempts, failed probes included
//! (without the pause, every one of them would be dead-lettered), a probe finds the receiver
//! back and all are delivered; a `410 Gone` disables the destination, dead-letters what follows
//! with that reason, and after an operator's enable the re-queued messages are delivered. The
//! state is shared through the store: a 410 survives a restart and reaches the other workers,
//! and so do an operator's disable and enable. (`relay.rs` does the same with brokers that are
//! stopped and restarted.)

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use outbox_admin::{Admin, Request};
use outbox_diesel::admin::{
    destinations, disable_destination, enable_destination, requeue_dead_letters,
    DeadLetterSelection,
};
use outbox_diesel::destination::{DestinationOptions, DestinationState, HealthPolicy};
use outbox_diesel::prelude::*;
use outbox_diesel::webhook::WebhookEndpoint;
use outbox_diesel::{DieselStore, RetryPolicy, Worker, WorkerHandle};
use outbox_testkit::http::{Receiver, Reply};
use outbox_testkit::outbox::{dead, pending, secret};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb, TestPool};
use outbox_tests::handlers::{Hook, HOOK};

const PATIENCE: Duration = Duration::from_secs(30);

fn endpoint(receiver: &Receiver) -> WebhookEndpoint {
    WebhookEndpoint::builder(receiver.url("/hook"))
        .secret(secret())
        .timeout(Duration::from_secs(5))
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .build()
        .unwrap()
}

/// Where the worker's destination `hook` stands.
fn state(worker: &WorkerHandle) -> DestinationState {
    worker.destination_state(HOOK).expect("the worker has it")
}

/// Three quick attempts: without pausing, an outage longer than a second dead-letters all.
fn impatient() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(50))
}

fn an_outage_pauses_the_destination_and_messages_wait_without_spending_attempts<C>(db: &TestDb)
where
    C: TestConnection,
{
    let receiver = Receiver::start(|_, _| Reply::status(503));
    let pool = db.pool::<C>(5);
    for n in 0..2 {
        Hook::new(n).enqueue(&mut pool.get().unwrap()).unwrap();
    }
    // Short pauses: the outage below sees a probe about every quarter second (a deferred message
    // waits that long at least), some twenty on top of the failures before the pause, never
    // one per message per poll. Were a failed probe an attempt, both messages would be
    // dead-lettered.
    let policy = HealthPolicy::new()
        .failures_to_pause(3)
        .first_pause(Duration::from_millis(250))
        .longest_pause(Duration::from_millis(250));
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .retry_policy(impatient())
        .destination_with(
            HOOK,
            endpoint(&receiver),
            DestinationOptions::new().health_policy(policy),
        )
        .spawn()
        .unwrap();
    assert!(
        eventually(PATIENCE, || matches!(
            state(&worker),
            DestinationState::Paused { .. }
        )),
        "paused: {:?}",
        state(&worker)
    );
    // Five seconds of outage: long enough for every message's three attempts many times over.
    std::thread::sleep(Duration::from_secs(5));
    let during = receiver.count();
    assert!(
        dead(&pool).is_empty(),
        "nothing dead-lettered: {:?}",
        dead(&pool)
    );
    assert!(
        (5..=30).contains(&during),
        "the receiver saw {during} requests: the failures before the pause, then one probe per \
         pause"
    );
    let waiting = pending(&pool);
    assert_eq!(waiting.len(), 2);
    assert!(
        waiting
            .iter()
            .any(|m| m.last_error.as_deref().is_some_and(|e| {
                e.contains("destination hook is paused") || e.contains("the probe of paused")
            })),
        "{waiting:?}"
    );
    // A message in flight (a probe under way) counts its attempt until the probe is settled
    // and the attempt given back: one more than it has spent.
    assert!(
        waiting
            .iter()
            .all(|m| m.attempts <= 2 + u32::from(m.in_flight)),
        "deferrals and failed probes are not attempts: {:?}",
        waiting
            .iter()
            .map(|m| (m.attempts, m.in_flight))
            .collect::<Vec<_>>()
    );

    // The workers' report in the store, as `outbox destinations` and the admin pages show it.
    assert!(eventually(PATIENCE, || recorded_state(&pool).as_deref()
        == Some("paused")));
    let recorded = destinations(&mut pool.get().unwrap()).unwrap().remove(0);
    assert_eq!(recorded.kind, "webhook");
    assert!(recorded.consecutive_failures >= 3, "{recorded:?}");
    assert!(
        recorded
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("503")),
        "{recorded:?}"
    );
    assert!(recorded.next_probe_at.is_some() && recorded.disabled_reason.is_none());

    receiver.set_behaviour(|_, _| Reply::status(200));
    // A message leaves the outbox only when the receiver took it.
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "all delivered after the probe: {:?}",
        state(&worker)
    );
    assert_eq!(receiver.unique(), 2);
    assert!(matches!(
        state(&worker),
        DestinationState::Healthy {
            consecutive_failures: 0
        }
    ));
    worker.shutdown(PATIENCE).unwrap();
    assert!(pending(&pool).is_empty() && dead(&pool).is_empty());
}

fn gone_disables_the_destination_until_it_is_enabled<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| Reply::status(410));
    let pool = db.pool::<C>(6);
    let worker = one_thread_worker(&pool, endpoint(&receiver));
    for n in 0..5 {
        Hook::new(n).enqueue(&mut pool.get().unwrap()).unwrap();
    }
    assert!(eventually(PATIENCE, || dead(&pool).len() == 5));
    assert_eq!(receiver.count(), 1, "one 410, then nothing is sent");
    let letters = dead(&pool);
    let gone: Vec<_> = letters
        .iter()
        .filter(|d| d.last_error.contains("410"))
        .collect();
    assert_eq!(gone.len(), 5, "{letters:?}");
    assert_eq!(
        letters
            .iter()
            .filter(|d| d.last_error.contains("destination hook is disabled"))
            .count(),
        4,
        "{letters:?}"
    );
    assert_eq!(state(&worker).name(), "disabled");

    // The worker recorded it in the store: the operator sees it on the admin pages (which
    // know nothing of the worker) and enables it there.
    let admin = Admin::builder(pool.clone(), "an-admin-token-for-the-tests")
        .build()
        .unwrap();
    let bearer = "Bearer an-admin-token-for-the-tests";
    let listed = || {
        let listed =
            admin.handle(&Request::new("GET", "/api/destinations").header("authorization", bearer));
        serde_json::from_slice::<serde_json::Value>(&listed.body).unwrap()
    };
    assert!(
        eventually(PATIENCE, || listed()["destinations"][0]["state"]
            == "disabled"),
        "{}",
        listed()
    );
    let listed = listed();
    assert_eq!(listed["destinations"][0]["name"], HOOK);
    assert_eq!(listed["destinations"][0]["kind"], "webhook");
    assert!(listed["destinations"][0]["disabled_reason"]
        .as_str()
        .unwrap()
        .contains("410"));
    let signed_in = admin.handle(
        &Request::new("POST", "/login")
            .header("sec-fetch-site", "same-origin")
            .body("token=an-admin-token-for-the-tests"),
    );
    let cookie = signed_in
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let overview = admin
        .handle(&Request::new("GET", "/").header("cookie", &cookie))
        .text();
    assert!(
        overview.contains("action=\"/outbox/destinations/hook/enable\""),
        "{overview}"
    );
    receiver.set_behaviour(|_, _| Reply::status(200));
    let enabled = admin.handle(
        &Request::new("POST", "/destinations/hook/enable")
            .header("cookie", &cookie)
            .header("sec-fetch-site", "same-origin"),
    );
    assert_eq!(enabled.status, 303);
    assert!(
        eventually(PATIENCE, || state(&worker).name() == "healthy"),
        "the worker follows the operator's enable"
    );
    requeue_dead_letters(&mut pool.get().unwrap(), &DeadLetterSelection::All).unwrap();
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()
            && dead(&pool).is_empty()),
        "delivered once enabled"
    );
    assert_eq!(receiver.count(), 6, "the 410, then each message once");
    worker.shutdown(PATIENCE).unwrap();
    assert!(pending(&pool).is_empty() && dead(&pool).is_empty());
}

/// A worker with one handler thread delivering to `hook`, impatient with retries.
fn one_thread_worker<C: TestConnection>(pool: &TestPool<C>, hook: WebhookEndpoint) -> WorkerHandle {
    Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .handler_threads(1)
        .retry_policy(impatient())
        .destination(HOOK, hook)
        .spawn()
        .unwrap()
}

fn recorded_state<C: TestConnection>(pool: &TestPool<C>) -> Option<String> {
    destinations(&mut pool.get().unwrap())
        .unwrap()
        .into_iter()
        .find(|e| e.name == HOOK)
        .map(|e| e.state)
}

/// A `410 Gone` survives a restart: the next run's worker reads the disable from the store
/// before its first claim, so the receiver that said "gone" gets nothing more, even with
/// messages waiting from the start; an operator's enable in the store reaches it.
fn a_gone_destination_stays_disabled_after_a_restart<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| Reply::status(410));
    let pool = db.pool::<C>(6);
    let worker = one_thread_worker(&pool, endpoint(&receiver));
    Hook::new(0).enqueue(&mut pool.get().unwrap()).unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    assert!(eventually(PATIENCE, || recorded_state(&pool).as_deref()
        == Some("disabled")));
    worker.shutdown(PATIENCE).unwrap();

    // The receiver would take deliveries now; the endpoint is still disabled.
    receiver.set_behaviour(|_, _| Reply::status(200));
    for n in 1..4 {
        Hook::new(n).enqueue(&mut pool.get().unwrap()).unwrap();
    }
    let worker = one_thread_worker(&pool, endpoint(&receiver));
    assert!(eventually(PATIENCE, || dead(&pool).len() == 4));
    assert_eq!(
        receiver.count(),
        1,
        "only the first run's 410 was ever sent"
    );
    assert!(
        matches!(state(&worker), DestinationState::Disabled { reason } if reason.contains("410"))
    );

    assert!(enable_destination(&mut pool.get().unwrap(), HOOK).unwrap());
    assert!(eventually(PATIENCE, || state(&worker).name() == "healthy"));
    requeue_dead_letters(&mut pool.get().unwrap(), &DeadLetterSelection::All).unwrap();
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()
        && dead(&pool).is_empty()));
    assert_eq!(receiver.count(), 5, "the 410, then each message once");
    assert!(eventually(PATIENCE, || recorded_state(&pool).as_deref()
        == Some("healthy")));
    worker.shutdown(PATIENCE).unwrap();
}

/// Two workers (two processes' destinations of one name): an operator's disable reaches both
/// and dead-letters with the operator's reason; the enable reaches both; a `410 Gone` told to
/// one reaches the other through the store.
fn what_one_worker_or_an_operator_decides_reaches_every_worker<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| Reply::status(200));
    let pool = db.pool::<C>(11);
    let (a, b) = (
        one_thread_worker(&pool, endpoint(&receiver)),
        one_thread_worker(&pool, endpoint(&receiver)),
    );
    assert!(eventually(PATIENCE, || recorded_state(&pool).is_some()));
    assert!(!disable_destination(&mut pool.get().unwrap(), "someone-else", "why").unwrap());
    assert!(disable_destination(
        &mut pool.get().unwrap(),
        HOOK,
        "the partner asked us to stop"
    )
    .unwrap());
    let disabled = |worker: &WorkerHandle| matches!(state(worker), DestinationState::Disabled { reason } if reason == "the partner asked us to stop");
    assert!(eventually(PATIENCE, || disabled(&a) && disabled(&b)));
    for n in 0..4 {
        Hook::new(n).enqueue(&mut pool.get().unwrap()).unwrap();
    }
    assert!(eventually(PATIENCE, || dead(&pool).len() == 4));
    assert_eq!(receiver.count(), 0);
    assert!(dead(&pool)
        .iter()
        .all(|d| d.last_error.contains("the partner asked us to stop")));

    assert!(enable_destination(&mut pool.get().unwrap(), HOOK).unwrap());
    assert!(eventually(PATIENCE, || state(&a).name() == "healthy"
        && state(&b).name() == "healthy"));
    assert_eq!(recorded_state(&pool).as_deref(), Some("healthy"));

    receiver.set_behaviour(|_, _| Reply::status(410));
    Hook::new(10).enqueue(&mut pool.get().unwrap()).unwrap();
    assert!(eventually(PATIENCE, || state(&a).name() == "disabled"
        && state(&b).name() == "disabled"));
    assert_eq!(
        receiver.count(),
        1,
        "one worker was told; the other learnt it from the store"
    );
    for worker in [a, b] {
        worker.shutdown(PATIENCE).unwrap();
    }
}

/// A destination that stays paused (a receiver gone without saying so) does not keep its
/// messages forever: past `max_deferral` since its enqueue a message waiting for it is
/// dead-lettered with the reason, though its attempts are far from spent.
fn a_message_deferred_past_max_deferral_is_dead_lettered<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| Reply::status(503));
    let pool = db.pool::<C>(5);
    Hook::new(0).enqueue(&mut pool.get().unwrap()).unwrap();
    let policy = HealthPolicy::new()
        .failures_to_pause(1)
        .first_pause(Duration::from_millis(300))
        .longest_pause(Duration::from_millis(300));
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .retry_policy(impatient().max_attempts(100))
        .max_deferral(Duration::from_secs(2))
        .destination_with(
            HOOK,
            endpoint(&receiver),
            DestinationOptions::new().health_policy(policy),
        )
        .spawn()
        .unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    let letter = dead(&pool).remove(0);
    assert!(
        letter.last_error.contains("deferred for longer than 2s")
            && (letter.last_error.contains("paused destination hook")
                || letter.last_error.contains("destination hook is paused")),
        "{letter:?}"
    );
    assert!(letter.attempts < 10, "{letter:?}");
    worker.shutdown(PATIENCE).unwrap();
}

backend_tests!(
    a_message_deferred_past_max_deferral_is_dead_lettered,
    an_outage_pauses_the_destination_and_messages_wait_without_spending_attempts,
    gone_disables_the_destination_until_it_is_enabled,
    a_gone_destination_stays_disabled_after_a_restart,
    what_one_worker_or_an_operator_decides_reaches_every_worker,
);
