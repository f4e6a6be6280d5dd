//! Endpoint health against a real receiver, on every backend: an outage pauses the endpoint
//! and its messages wait without spending their attempts, failed probes included (without the
//! pause, every one of them would be dead-lettered), a probe finds the receiver back and all
//! are delivered; a
//! `410 Gone` disables the endpoint, dead-letters what follows with that reason, and after
//! `enable` the re-queued messages are delivered.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use outbox_admin::{Admin, Request};
use outbox_diesel::admin::{requeue_dead_letters, DeadLetterSelection};
use outbox_diesel::prelude::*;
use outbox_diesel::webhook::{EndpointState, HealthPolicy, WebhookEndpoint};
use outbox_diesel::{DieselStore, RetryPolicy, Worker};
use outbox_testkit::http::{Receiver, Reply};
use outbox_testkit::outbox::{dead, pending, secret};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb};
use outbox_tests::handlers::Hook;

const PATIENCE: Duration = Duration::from_secs(30);

fn endpoint(receiver: &Receiver, policy: HealthPolicy) -> WebhookEndpoint {
    WebhookEndpoint::builder(receiver.url("/hook"))
        .name("mail")
        .secret(secret())
        .timeout(Duration::from_secs(5))
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .health_policy(policy)
        .build()
        .unwrap()
}

/// Three quick attempts: without pausing, an outage longer than a second dead-letters all.
fn impatient() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(50))
}

fn an_outage_pauses_the_endpoint_and_messages_wait_without_spending_attempts<C>(db: &TestDb)
where
    C: TestConnection,
{
    let receiver = Receiver::start(|_, _| Reply::status(503));
    let pool = db.pool::<C>(4);
    for n in 0..2 {
        Hook::new(n).enqueue(&mut pool.get().unwrap()).unwrap();
    }
    // Short pauses: the outage below sees a probe about every second (a deferred message waits
    // a second at least), some five, two or three per message on top of the failures before
    // the pause. Were a failed probe an attempt, both messages would be dead-lettered.
    let mail = endpoint(
        &receiver,
        HealthPolicy::new()
            .failures_to_pause(3)
            .first_pause(Duration::from_millis(250))
            .longest_pause(Duration::from_millis(250)),
    );
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .retry_policy(impatient())
        .webhook(mail.clone())
        .spawn()
        .unwrap();
    assert!(
        eventually(PATIENCE, || matches!(
            mail.health(),
            EndpointState::Paused { .. }
        )),
        "paused: {:?}",
        mail.health()
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
        (5..20).contains(&during),
        "the receiver saw {during} requests: the failures before the pause, then one probe per \
         pause"
    );
    let waiting = pending(&pool);
    assert_eq!(waiting.len(), 2);
    assert!(
        waiting
            .iter()
            .any(|m| m.last_error.as_deref().is_some_and(|e| {
                e.contains("webhook endpoint mail is paused") || e.contains("the probe of paused")
            })),
        "{waiting:?}"
    );
    assert!(
        waiting.iter().all(|m| m.attempts <= 2),
        "deferrals and failed probes are not attempts: {:?}",
        waiting.iter().map(|m| m.attempts).collect::<Vec<_>>()
    );

    receiver.set_behaviour(|_, _| Reply::status(200));
    // A message leaves the outbox only when the receiver took it.
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "all delivered after the probe: {:?}",
        mail.health()
    );
    assert_eq!(receiver.unique(), 2);
    worker.shutdown(PATIENCE).unwrap();
    assert!(matches!(
        mail.health(),
        EndpointState::Healthy {
            consecutive_failures: 0
        }
    ));
    assert!(pending(&pool).is_empty() && dead(&pool).is_empty());
}

fn gone_disables_the_endpoint_until_it_is_enabled<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| Reply::status(410));
    let pool = db.pool::<C>(4);
    let mail = endpoint(&receiver, HealthPolicy::new());
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .handler_threads(1)
        .retry_policy(impatient())
        .webhook(mail.clone())
        .spawn()
        .unwrap();
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
            .filter(|d| d.last_error.contains("webhook endpoint mail is disabled"))
            .count(),
        4,
        "{letters:?}"
    );
    assert_eq!(mail.health().name(), "disabled");

    // The operator sees it on the admin pages and enables it there.
    let admin = Admin::builder(pool.clone(), "an-admin-token-for-the-tests")
        .endpoint(mail.clone())
        .build()
        .unwrap();
    let bearer = "Bearer an-admin-token-for-the-tests";
    let listed =
        admin.handle(&Request::new("GET", "/api/endpoints").header("authorization", bearer));
    let listed: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    assert_eq!(listed["endpoints"][0]["name"], "mail");
    assert_eq!(listed["endpoints"][0]["state"], "disabled");
    assert!(listed["endpoints"][0]["reason"]
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
        overview.contains("action=\"/outbox/endpoints/mail/enable\""),
        "{overview}"
    );
    receiver.set_behaviour(|_, _| Reply::status(200));
    let enabled = admin.handle(
        &Request::new("POST", "/endpoints/mail/enable")
            .header("cookie", &cookie)
            .header("sec-fetch-site", "same-origin"),
    );
    assert_eq!(enabled.status, 303);
    assert_eq!(mail.health().name(), "healthy");
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

backend_tests!(
    an_outage_pauses_the_endpoint_and_messages_wait_without_spending_attempts,
    gone_disables_the_endpoint_until_it_is_enabled,
);
