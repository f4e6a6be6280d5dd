//! The receiving side: verified, recorded once, in the receiver's own transaction.

use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::Connection;
use outbox_diesel::inbox::{sweep_inbox, Inbox, InboxError, Received};
use outbox_diesel::prelude::*;
use outbox_diesel::webhook::{VerifyError, WebhookSecret};
use outbox_diesel::{Message, OutboxConnection};
use outbox_testkit::outbox::{pending, secret};
use outbox_testkit::{backend_tests, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

fn signed(secret: &WebhookSecret, id: &str, body: &[u8]) -> Vec<(String, String)> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    vec![
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), now.to_string()),
        ("webhook-signature".into(), secret.sign(id, now, body)),
    ]
}

fn setup<C: TestConnection + Connection>(db: &TestDb) -> TestPool<C> {
    db.pool::<C>(5)
}

/// What the receiver's work writes: a follow-up message of its own, in the same transaction.
#[derive(Serialize, Deserialize)]
struct Noted {
    note: String,
}

impl Message for Noted {
    const MESSAGE_TYPE: &'static str = "test.noted";
}

/// How many receiver transactions committed their work.
fn notes<C: TestConnection + Connection>(pool: &TestPool<C>) -> usize {
    pending(pool).len()
}

fn note<C: OutboxConnection>(conn: &mut C) -> Result<(), outbox_diesel::Error> {
    Noted {
        note: "hello".into(),
    }
    .enqueue(conn)
    .map(|_| ())
}

fn a_webhook_is_processed_once_however_often_it_arrives<C: TestConnection + Connection>(
    db: &TestDb,
) {
    let pool = setup::<C>(db);
    let inbox = Inbox::new([secret()]);
    let body = br#"{"id":"m1","type":"t","data":{}}"#;
    let headers = signed(&secret(), "m1", body);
    let mut conn = pool.get().unwrap();

    let first = inbox
        .receive(&mut conn, &headers, body, |c, webhook| {
            note(c).map(|_| webhook.id.clone())
        })
        .unwrap();
    assert_eq!(first, Received::Processed("m1".to_string()));
    for _ in 0..3 {
        let again = inbox
            .receive(&mut conn, &headers, body, |c, _| {
                note(c).map(|_| String::new())
            })
            .unwrap();
        assert_eq!(again, Received::Duplicate { id: "m1".into() });
    }
    assert_eq!(notes(&pool), 1);
}

fn failed_work_rolls_back_the_id_so_the_retry_runs_it<C: TestConnection + Connection>(db: &TestDb) {
    let pool = setup::<C>(db);
    let inbox = Inbox::new([secret()]);
    let body = br#"{"n":1}"#;
    let headers = signed(&secret(), "m2", body);
    let mut conn = pool.get().unwrap();

    let failed = inbox.receive(&mut conn, &headers, body, |c, _| {
        note(c)?;
        Err::<(), _>(outbox_diesel::Error::Database(
            diesel::result::Error::RollbackTransaction,
        ))
    });
    assert!(matches!(failed, Err(InboxError::Work(_))), "{failed:?}");
    assert_eq!(notes(&pool), 0, "the work rolled back");
    let retried = inbox
        .receive(&mut conn, &headers, body, |c, _| note(c))
        .unwrap();
    assert_eq!(retried, Received::Processed(()));
    assert_eq!(notes(&pool), 1);
}

fn forged_or_stale_webhooks_are_rejected_without_a_trace<C: TestConnection + Connection>(
    db: &TestDb,
) {
    let pool = setup::<C>(db);
    let inbox = Inbox::new([secret()]);
    let body = br#"{"n":1}"#;
    let mut conn = pool.get().unwrap();

    let forged = signed(&WebhookSecret::generate(), "m3", body);
    let err = inbox
        .receive(&mut conn, &forged, body, |c, _| note(c))
        .unwrap_err();
    assert!(
        matches!(
            err,
            InboxError::Verify(VerifyError::NoValidSignature { .. })
        ),
        "{err}"
    );

    let tampered = signed(&secret(), "m3", body);
    let err = inbox
        .receive(&mut conn, &tampered, br#"{"n":2}"#, |c, _| note(c))
        .unwrap_err();
    assert!(matches!(err, InboxError::Verify(_)), "{err}");

    let mut stale = signed(&secret(), "m3", body);
    let old = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        - 3600;
    stale[1].1 = old.to_string();
    stale[2].1 = secret().sign("m3", old, body);
    let err = inbox
        .receive(&mut conn, &stale, body, |c, _| note(c))
        .unwrap_err();
    assert!(
        matches!(err, InboxError::Verify(VerifyError::TimestampTooOld { .. })),
        "{err}"
    );

    assert_eq!(notes(&pool), 0);
    let genuine = signed(&secret(), "m3", body);
    let first = inbox
        .receive(&mut conn, &genuine, body, |c, _| note(c))
        .unwrap();
    assert_eq!(
        first,
        Received::Processed(()),
        "rejections recorded nothing"
    );
}

fn concurrent_duplicates_run_the_work_once<C: TestConnection + Connection>(db: &TestDb) {
    let pool = setup::<C>(db);
    let inbox = Inbox::new([secret()]);
    let body: &'static [u8] = br#"{"n":1}"#;
    let headers = signed(&secret(), "m4", body);
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (pool, inbox, headers, start) = (
                pool.clone(),
                inbox.clone(),
                headers.clone(),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                let mut conn = pool.get().unwrap();
                start.wait();
                inbox
                    .receive(&mut conn, &headers, body, |c, _| {
                        note(c)?;
                        std::thread::sleep(Duration::from_millis(100));
                        Ok::<_, outbox_diesel::Error>(())
                    })
                    .unwrap()
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let processed = results
        .iter()
        .filter(|r| matches!(r, Received::Processed(())))
        .count();
    assert_eq!(processed, 1, "{results:?}");
    assert_eq!(notes(&pool), 1);
}

fn the_sweep_removes_only_old_ids<C: TestConnection + Connection>(db: &TestDb) {
    let pool = setup::<C>(db);
    let inbox = Inbox::new([secret()]);
    let mut conn = pool.get().unwrap();
    for id in ["a", "b"] {
        let headers = signed(&secret(), id, b"{}");
        inbox
            .receive(&mut conn, &headers, b"{}", |c, _| note(c))
            .unwrap();
    }
    assert_eq!(
        sweep_inbox(&mut conn, Duration::from_secs(86_400)).unwrap(),
        0
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        sweep_inbox(&mut conn, Duration::from_millis(10)).unwrap(),
        2
    );
    let headers = signed(&secret(), "a", b"{}");
    let again = inbox
        .receive(&mut conn, &headers, b"{}", |c, _| note(c))
        .unwrap();
    assert_eq!(again, Received::Processed(()), "a swept id is new again");
}

backend_tests!(
    a_webhook_is_processed_once_however_often_it_arrives,
    failed_work_rolls_back_the_id_so_the_retry_runs_it,
    forged_or_stale_webhooks_are_rejected_without_a_trace,
    concurrent_duplicates_run_the_work_once,
    the_sweep_removes_only_old_ids,
);
