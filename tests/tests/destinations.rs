//! Named destinations on one worker, against real receivers on 127.0.0.1, on every backend:
//! each receiver gets only the messages routed or delivered to its name, each signed with its
//! own secret; a route without its destination is refused at spawn; a routed payload that is
//! not JSON is dead-lettered; every destination's state is in the metrics from the start and
//! its attempts are counted by outcome.

use std::collections::HashMap;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use outbox_diesel::destination::{DestinationOptions, HealthPolicy};
use outbox_diesel::metrics::{DESTINATION_ATTEMPTS, DESTINATION_DURATION, DESTINATION_STATE};
use outbox_diesel::prelude::*;
use outbox_diesel::webhook::{verify, WebhookEndpoint, WebhookSecret, DEFAULT_TOLERANCE};
use outbox_diesel::{outbox_handler, Batch, DieselStore, Worker, WorkerBuilder, WorkerError};
use outbox_testkit::http::{Receiver, Reply, Request};
use outbox_testkit::outbox::{dead, endpoint, pending, secret};
use outbox_testkit::{backend_tests, eventually, Backend, TestConnection, TestDb, TestPool};
use outbox_tests::handlers::{Hook, HOOK};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(30);

/// Routed to the mail service: no handler code.
#[outbox_handler("test.mail", deliver_to = "mail")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mail {
    n: u32,
}

/// Routed to the CRM: no handler code.
#[outbox_handler("test.crm", deliver_to = "crm")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Crm {
    n: u32,
}

fn crm_secret() -> WebhookSecret {
    WebhookSecret::from_bytes(*b"the CRM's own secret, not the mail's").unwrap()
}

fn to(receiver: &Receiver, secret: WebhookSecret) -> WebhookEndpoint {
    WebhookEndpoint::builder(receiver.url("/in"))
        .secret(secret)
        .allow_address(std::net::Ipv4Addr::LOCALHOST.into())
        .build()
        .unwrap()
}

/// A worker with the three destinations every worker of this file needs (the two routes', and
/// `hook` for [`Hook`]'s handler).
fn builder<C: TestConnection>(
    pool: &TestPool<C>,
    mail: &Receiver,
    crm: &Receiver,
    hook: &Receiver,
) -> WorkerBuilder<DieselStore<outbox_diesel::OutboxManager<C>>> {
    Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination("mail", to(mail, secret()))
        .destination("crm", to(crm, crm_secret()))
        .destination(HOOK, endpoint(&hook.url("/hook"), Duration::from_secs(5)))
}

/// The requests that verify with `secret`, and the count of those that do not.
fn verified_by(requests: &[Request], secret: &WebhookSecret) -> (Vec<serde_json::Value>, usize) {
    let mut verified = Vec::new();
    let mut forged = 0;
    for request in requests {
        match verify(
            std::slice::from_ref(secret),
            &request.headers,
            &request.body,
            DEFAULT_TOLERANCE,
        ) {
            Ok(_) => verified.push(request.json()),
            Err(_) => forged += 1,
        }
    }
    (verified, forged)
}

fn each_destination_gets_only_its_own_messages_signed_with_its_own_secret<C: TestConnection>(
    db: &TestDb,
) {
    let (mail, crm, hook) = (Receiver::ok(), Receiver::ok(), Receiver::ok());
    let pool = db.pool::<C>(6);
    let mut batch = Batch::new();
    for n in 0..30 {
        match n % 3 {
            0 => batch.push(&Mail { n }).unwrap(),
            1 => batch.push(&Crm { n }).unwrap(),
            _ => batch.push(&Hook::new(n)).unwrap(),
        };
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &mail, &crm, &hook).spawn().unwrap();
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "{:?}",
        pending(&pool)
    );
    worker.shutdown(PATIENCE).unwrap();
    assert!(dead(&pool).is_empty(), "{:?}", dead(&pool));

    for (receiver, own, other, message_type) in [
        (&mail, secret(), crm_secret(), "test.mail"),
        (&crm, crm_secret(), secret(), "test.crm"),
    ] {
        let requests = receiver.requests();
        assert_eq!(requests.len(), 10, "{message_type}");
        let (verified, forged) = verified_by(&requests, &own);
        assert_eq!(
            forged, 0,
            "{message_type}: every request verifies with its own secret"
        );
        let (_, other_fails) = verified_by(&requests, &other);
        assert_eq!(other_fails, 10, "{message_type}: and with no other");
        for body in verified {
            assert_eq!(body["type"], message_type, "only its own type: {body}");
            let n = body["data"]["n"].as_u64().unwrap();
            assert_eq!(
                body["data"],
                serde_json::json!({ "n": n }),
                "the payload as enqueued"
            );
        }
    }
    let hooks = hook.requests();
    assert_eq!(hooks.len(), 10);
    assert!(hooks.iter().all(|r| r.json()["type"] == "test.hook"));
}

fn a_route_without_its_destination_is_refused_at_spawn<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(5);
    let err = Worker::builder(DieselStore::new(pool.clone()))
        .destination("mail", to(&receiver, secret()))
        .destination(HOOK, to(&receiver, secret()))
        .spawn()
        .unwrap_err();
    assert!(
        matches!(
            &err,
            WorkerError::UnknownDestination {
                message_type: "test.crm",
                destination: "crm",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("`destinations::Crm`"), "{err}");
    let err = builder(&pool, &receiver, &receiver, &receiver)
        .destination("crm", to(&receiver, secret()))
        .spawn()
        .unwrap_err();
    assert!(
        err.to_string().contains("two destinations are named `crm`"),
        "{err}"
    );
}

/// Two destinations on one host, on two paths: the one that answers `410 Gone` is disabled,
/// the other keeps delivering (names key health; they used to default to `host:port`, shared).
fn one_destination_gone_leaves_another_on_the_same_host_alone<C: TestConnection>(db: &TestDb) {
    let host = Receiver::start(|request, _| {
        if request.path == "/crm" {
            Reply::status(410)
        } else {
            Reply::status(200)
        }
    });
    let hook = Receiver::ok();
    let pool = db.pool::<C>(6);
    let on = |path: &str, secret: WebhookSecret| {
        WebhookEndpoint::builder(host.url(path))
            .secret(secret)
            .allow_address(std::net::Ipv4Addr::LOCALHOST.into())
            .build()
            .unwrap()
    };
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination("mail", on("/mail", secret()))
        .destination("crm", on("/crm", crm_secret()))
        .destination(HOOK, endpoint(&hook.url("/hook"), Duration::from_secs(5)))
        .spawn()
        .unwrap();
    Crm { n: 0 }.enqueue(&mut pool.get().unwrap()).unwrap();
    assert!(eventually(PATIENCE, || worker
        .destination_state("crm")
        .is_some_and(|state| state.name() == "disabled")));
    for n in 1..4 {
        Mail { n }.enqueue(&mut pool.get().unwrap()).unwrap();
    }
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    assert_eq!(
        worker.destination_state("mail").map(|s| s.name()),
        Some("healthy")
    );
    let mail_requests = host.requests().iter().filter(|r| r.path == "/mail").count();
    assert_eq!(mail_requests, 3);
    assert_eq!(dead(&pool).len(), 1, "only the CRM's message");
    worker.shutdown(PATIENCE).unwrap();
}

backend_tests!(
    one_destination_gone_leaves_another_on_the_same_host_alone,
    each_destination_gets_only_its_own_messages_signed_with_its_own_secret,
    a_route_without_its_destination_is_refused_at_spawn,
);

/// A row edited by hand may hold anything; only SQLite's text column lets it hold what is not
/// JSON (PostgreSQL's `jsonb` and MySQL's `json` refuse it).
#[test]
fn a_routed_payload_that_is_not_json_is_dead_lettered_with_the_reason() {
    let Some(db) = TestDb::new(Backend::Sqlite) else {
        return;
    };
    let (mail, crm, hook) = (Receiver::ok(), Receiver::ok(), Receiver::ok());
    let pool = db.pool::<diesel::SqliteConnection>(5);
    Mail { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    diesel::RunQueryDsl::execute(
        diesel::sql_query("UPDATE outbox_message SET payload = 'not {json'"),
        &mut pool.get().unwrap(),
    )
    .unwrap();
    let worker = builder(&pool, &mail, &crm, &hook).spawn().unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    worker.shutdown(PATIENCE).unwrap();
    let letter = dead(&pool).remove(0);
    assert!(
        letter
            .last_error
            .contains("payload of routed message type `test.mail` is not JSON"),
        "{letter:?}"
    );
    assert_eq!(mail.count(), 0, "nothing was sent");
}

/// The samples of the recorder's text rendering, by series as written.
fn samples(handle: &metrics_exporter_prometheus::PrometheusHandle) -> HashMap<String, f64> {
    handle
        .render()
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The only test of this file that installs the recorder, and the only one whose CRM refuses
/// messages or fails: the `rejected` and `failed` counts and the paused state are its own.
#[test]
fn every_destination_is_in_the_metrics_from_the_start_and_its_attempts_are_counted() {
    let Some(db) = TestDb::new(Backend::Sqlite) else {
        return;
    };
    let handle = PrometheusBuilder::new().install_recorder().unwrap();
    let (mail, hook) = (Receiver::ok(), Receiver::ok());
    let crm = Receiver::start(|_, n| {
        if n == 0 {
            Reply::status(400)
        } else {
            Reply::status(503)
        }
    });
    let pool = db.pool::<diesel::SqliteConnection>(5);
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .handler_threads(1)
        .destination("mail", to(&mail, secret()))
        .destination_with(
            "crm",
            to(&crm, crm_secret()),
            DestinationOptions::new().health_policy(HealthPolicy::new().failures_to_pause(2)),
        )
        .destination(HOOK, endpoint(&hook.url("/hook"), Duration::from_secs(5)))
        .spawn()
        .unwrap();
    let state = |samples: &HashMap<String, f64>, name: &str, state: &str| {
        samples
            .get(&format!(
                "{DESTINATION_STATE}{{destination=\"{name}\",kind=\"webhook\",state=\"{state}\"}}"
            ))
            .copied()
    };
    let at_start = samples(&handle);
    for name in ["mail", "crm", HOOK] {
        assert_eq!(state(&at_start, name, "healthy"), Some(1.0), "{name}");
        for other in ["held", "paused", "disabled"] {
            assert_eq!(state(&at_start, name, other), Some(0.0), "{name} {other}");
        }
    }

    for n in 0..4 {
        Mail { n }.enqueue(&mut pool.get().unwrap()).unwrap();
    }
    for n in 0..3 {
        Crm { n }.enqueue(&mut pool.get().unwrap()).unwrap();
    }
    // One 400 (rejected), then 503s until two in a row pause the CRM.
    assert!(eventually(PATIENCE, || {
        state(&samples(&handle), "crm", "paused") == Some(1.0)
    }));
    assert!(eventually(PATIENCE, || mail.count() == 4));
    let counted = samples(&handle);
    let attempts = |name: &str, outcome: &str| {
        counted
            .get(&format!(
                "{DESTINATION_ATTEMPTS}{{destination=\"{name}\",outcome=\"{outcome}\"}}"
            ))
            .copied()
            .unwrap_or(0.0)
    };
    assert_eq!(attempts("crm", "rejected"), 1.0);
    assert_eq!(attempts("crm", "failed"), 2.0);
    assert!(attempts("mail", "delivered") >= 4.0);
    assert_eq!(state(&counted, "crm", "healthy"), Some(0.0));
    assert!(
        counted.contains_key(&format!(
            "{DESTINATION_DURATION}_count{{destination=\"crm\"}}"
        )),
        "{:?}",
        counted
            .keys()
            .filter(|k| k.contains("duration"))
            .collect::<Vec<_>>()
    );
    worker.shutdown(PATIENCE).unwrap();
}
