//! Transactional enqueue on every backend: what commits is stored, what rolls back is not.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use diesel::r2d2::{ConnectionManager, Pool, R2D2Connection};
use diesel::Connection;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use outbox_diesel::admin::{pending_messages, ListOptions, PendingMessage};
use outbox_diesel::prelude::*;
use outbox_diesel::{
    enqueue_all, outbox_handler, run_migrations, Batch, Context, EnqueueOptions, Error, Message,
    OutboxConnection, ProcessError,
};
use outbox_testkit::{backend_tests, Backend, TestDb};
use serde::{Deserialize, Serialize};

#[outbox_handler("comment.thankYou")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ThankYou {
    member_id: i64,
}

impl Handler for ThankYou {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

#[outbox_handler("test.text")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Text {
    body: String,
}

impl Handler for Text {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// Serializing it fails: JSON object keys must be strings.
#[outbox_handler("test.unserializable")]
#[derive(Debug, Serialize, Deserialize)]
struct Unserializable {
    by_pair: HashMap<(u8, u8), u8>,
}

impl Handler for Unserializable {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

trait TestConnection:
    Connection
    + outbox_diesel::Establish
    + R2D2Connection
    + MigrationHarness<<Self as Connection>::Backend>
    + 'static
{
}
impl<C> TestConnection for C where
    C: Connection
        + outbox_diesel::Establish
        + R2D2Connection
        + MigrationHarness<<Self as Connection>::Backend>
        + 'static
{
}

fn migrated<C: TestConnection>(db: &TestDb) -> C {
    let mut conn = db.connect::<C>();
    run_migrations(&mut conn).expect("outbox migrations apply");
    conn
}

fn all_pending<C: OutboxConnection>(conn: &mut C) -> Vec<PendingMessage> {
    pending_messages(conn, &ListOptions::new().limit(1_000_000)).expect("listing pending messages")
}

fn committed_enqueue_stores_exactly_that_message<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let before = SystemTime::now() - Duration::from_secs(5);
    let id = conn
        .transaction(|conn| ThankYou { member_id: 7 }.enqueue(conn))
        .unwrap();

    let rows = all_pending(&mut db.connect::<C>());
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.message_id, id);
    assert_eq!(row.message_type, "comment.thankYou");
    assert_eq!(row.message_type, ThankYou::MESSAGE_TYPE);
    let payload: serde_json::Value = serde_json::from_str(&row.payload).unwrap();
    assert_eq!(payload, serde_json::json!({ "member_id": 7 }));
    assert_eq!(row.attempts, 0);
    assert_eq!(row.ordering_key, None);
    assert!(!row.in_flight);
    assert!(
        row.created_at > before,
        "created_at is the enqueue time in UTC"
    );
    assert!(row.next_attempt_at <= SystemTime::now() + Duration::from_secs(5));
}

fn rolled_back_enqueue_stores_nothing<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let result: Result<(), Error> = conn.transaction(|conn| {
        ThankYou { member_id: 7 }.enqueue(conn)?;
        Err(Error::Database(diesel::result::Error::RollbackTransaction))
    });
    assert!(result.is_err());
    assert!(all_pending(&mut conn).is_empty());
}

fn enqueue_outside_a_transaction_commits_on_its_own<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let id = ThankYou { member_id: 1 }.enqueue(&mut conn).unwrap();
    let seen_elsewhere = all_pending(&mut db.connect::<C>());
    assert_eq!(seen_elsewhere.len(), 1);
    assert_eq!(seen_elsewhere[0].message_id, id);
}

fn pooled_connections_enqueue_in_their_transactions<C: TestConnection>(db: &TestDb) {
    drop(migrated::<C>(db));
    let pool = Pool::builder()
        .max_size(2)
        .build(ConnectionManager::<C>::new(db.url()))
        .unwrap();
    let mut pooled = pool.get().unwrap();
    let committed = pooled
        .transaction(|conn| ThankYou { member_id: 1 }.enqueue(conn))
        .unwrap();
    let _ = pooled.transaction(|conn| {
        ThankYou { member_id: 2 }.enqueue(conn)?;
        Err::<(), _>(Error::Database(diesel::result::Error::RollbackTransaction))
    });
    ThankYou { member_id: 3 }.enqueue(&mut pooled).unwrap();
    let rows = all_pending(&mut pool.get().unwrap());
    let members: Vec<ThankYou> = rows
        .iter()
        .map(|r| serde_json::from_str(&r.payload).unwrap())
        .collect();
    assert_eq!(
        members,
        [ThankYou { member_id: 1 }, ThankYou { member_id: 3 }]
    );
    assert_eq!(rows[0].message_id, committed);
}

fn ten_thousand_messages_in_one_transaction<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let messages: Vec<_> = (0..10_000)
        .map(|member_id| ThankYou { member_id })
        .collect();
    let ids = conn
        .transaction(|conn| enqueue_all(conn, &messages))
        .unwrap();
    assert_eq!(ids.len(), 10_000);

    let rows = all_pending(&mut conn);
    assert_eq!(rows.len(), 10_000);
    for (i, (row, id)) in rows.iter().zip(&ids).enumerate() {
        assert_eq!(row.message_id, *id, "row {i} keeps push order");
        let stored: ThankYou = serde_json::from_str(&row.payload).unwrap();
        assert_eq!(stored, messages[i]);
    }
}

fn a_batch_that_rolls_back_leaves_nothing<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let result: Result<(), Error> = conn.transaction(|conn| {
        let mut batch = Batch::new();
        for member_id in 0..100 {
            batch.push(&ThankYou { member_id })?;
        }
        batch.push(&Text {
            body: "mixed types".into(),
        })?;
        assert_eq!(batch.len(), 101);
        batch.enqueue(conn)?;
        Err(Error::Database(diesel::result::Error::RollbackTransaction))
    });
    assert!(result.is_err());
    assert!(all_pending(&mut conn).is_empty());
}

fn large_and_non_ascii_payloads_round_trip<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let mut body = String::from("Ünïcödé ✓ 日本語 🚀 \"quotes\" \\ \n\t");
    while body.len() < 1 << 20 {
        body.push_str("ßçø日本🚀 abc ");
    }
    let big = Text { body };
    let small = Text {
        body: "Grüße aus Köln 👋".into(),
    };
    conn.transaction(|conn| {
        big.enqueue(conn)?;
        small.enqueue(conn)
    })
    .unwrap();
    let rows = all_pending(&mut conn);
    assert_eq!(rows.len(), 2);
    let stored_big: Text = serde_json::from_str(&rows[0].payload).unwrap();
    assert!(stored_big.body.len() >= 1 << 20);
    assert_eq!(stored_big.body.as_bytes(), big.body.as_bytes());
    let stored_small: Text = serde_json::from_str(&rows[1].payload).unwrap();
    assert_eq!(stored_small, small);
}

fn ordering_key_and_delay_are_stored<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let options = EnqueueOptions::new()
        .ordering_key("post-7")
        .delay(Duration::from_secs(3600));
    ThankYou { member_id: 1 }
        .enqueue_with(&mut conn, &options)
        .unwrap();
    let rows = all_pending(&mut conn);
    assert_eq!(rows[0].ordering_key.as_deref(), Some("post-7"));
    let due_in = rows[0]
        .next_attempt_at
        .duration_since(SystemTime::now())
        .expect("due in the future");
    assert!(
        (3540..=3600).contains(&due_in.as_secs()),
        "due in about an hour, not {due_in:?}"
    );
}

/// Options built once and used for several enqueues delay each message from its own enqueue,
/// on the database's clock (the options used to hold a time fixed when they were built).
fn reused_options_delay_each_message_from_its_own_enqueue<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let options = EnqueueOptions::new().delay(Duration::from_secs(2));
    ThankYou { member_id: 1 }
        .enqueue_with(&mut conn, &options)
        .unwrap();
    std::thread::sleep(Duration::from_millis(2_500));
    ThankYou { member_id: 2 }
        .enqueue_with(&mut conn, &options)
        .unwrap();
    let rows = all_pending(&mut conn);
    let second = rows.iter().find(|m| m.payload.contains('2')).unwrap();
    let due_in = second
        .next_attempt_at
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(
        due_in > Duration::from_millis(500),
        "the second message is due about 2 s after its own enqueue, not {due_in:?} from now"
    );
    let gap = second
        .next_attempt_at
        .duration_since(rows[0].next_attempt_at)
        .unwrap_or_default();
    assert!(gap >= Duration::from_secs(2), "{gap:?}");
}

/// An ordering key travels as a header on brokers: a key with a line break or another control
/// character is refused at enqueue, writing nothing, the same on every backend.
fn an_ordering_key_with_control_characters_is_refused<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    for key in ["order\r\n42", "tab\tkey", "", "nul\0"] {
        let err = ThankYou { member_id: 1 }
            .enqueue_with(&mut conn, &EnqueueOptions::new().ordering_key(key))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidOrderingKey), "{key:?}: {err}");
    }
    assert!(all_pending(&mut conn).is_empty());
}

/// A single message's INSERT has one text per backend, so Diesel prepares it once per connection
/// and reuses it; a batch's text varies with its size, and is not kept.
fn a_single_enqueue_is_prepared_once_per_connection<C: TestConnection>(db: &TestDb) {
    use diesel::connection::InstrumentationEvent;
    let mut conn = migrated::<C>(db);
    let prepared = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = std::sync::Arc::clone(&prepared);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::CacheQuery { sql, .. } = event {
            seen.lock().unwrap().push(sql.to_owned());
        }
    });
    for member_id in 0..3 {
        ThankYou { member_id }.enqueue(&mut conn).unwrap();
    }
    let options = EnqueueOptions::new()
        .ordering_key("member-9")
        .delay(Duration::from_secs(60));
    ThankYou { member_id: 9 }
        .enqueue_with(&mut conn, &options)
        .unwrap();
    let batch: Vec<ThankYou> = (10..13).map(|member_id| ThankYou { member_id }).collect();
    enqueue_all(&mut conn, &batch).unwrap();

    let inserts: Vec<String> = prepared
        .lock()
        .unwrap()
        .iter()
        .filter(|sql| sql.contains("outbox_message"))
        .cloned()
        .collect();
    assert_eq!(inserts.len(), 1, "prepared once: {inserts:?}");
    assert!(
        inserts[0].starts_with("INSERT INTO outbox_message"),
        "{inserts:?}"
    );
    let stored: Vec<Option<String>> = all_pending(&mut conn)
        .into_iter()
        .map(|row| row.ordering_key)
        .collect();
    assert_eq!(stored.len(), 7);
    assert_eq!(stored.iter().flatten().collect::<Vec<_>>(), ["member-9"]);
}

fn values_too_long_for_their_column_are_refused<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let options = EnqueueOptions::new().ordering_key("k".repeat(256));
    let err = ThankYou { member_id: 1 }
        .enqueue_with(&mut conn, &options)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLong {
                what: "ordering key",
                len: 256
            }
        ),
        "{err}"
    );
    assert!(all_pending(&mut conn).is_empty());
}

fn serialization_failure_is_returned_and_the_transaction_goes_on<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let bad = Unserializable {
        by_pair: HashMap::from([((1, 2), 3)]),
    };
    let good_id = conn
        .transaction(|conn| {
            let err = bad.enqueue(conn).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Serialize {
                        message_type: "test.unserializable",
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("key must be a string"), "{err}");
            ThankYou { member_id: 9 }.enqueue(conn)
        })
        .unwrap();
    let rows = all_pending(&mut conn);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].message_id, good_id);
}

fn outbox_migrations(db: &TestDb) -> usize {
    match db.backend() {
        Backend::Postgres => 23,
        Backend::Mysql | Backend::Sqlite => 20,
    }
}

fn migrations_twice_are_a_no_op<C: TestConnection>(db: &TestDb) {
    let mut conn = db.connect::<C>();
    let first = run_migrations(&mut conn).unwrap();
    assert_eq!(
        first.len(),
        outbox_migrations(db),
        "outbox tables, inbox table, payload sizes, parked messages, idempotency keys, the dead \
         letters' age index, headers, destinations, parking what waits behind its key, signed-out \
         admin sessions, pauses, priorities, groups, shared turns, the end of a pause, \
         subscriptions, cancelled messages (and on PostgreSQL autovacuum settings, the due time in notifications and \
         the lease in a column of its own): {first:?}"
    );
    let second = run_migrations(&mut conn).unwrap();
    assert!(second.is_empty(), "{second:?}");
    ThankYou { member_id: 1 }.enqueue(&mut conn).unwrap();
}

const USER_POSTGRES: EmbeddedMigrations = embed_migrations!("user-migrations/postgres");
const USER_MYSQL: EmbeddedMigrations = embed_migrations!("user-migrations/mysql");
const USER_SQLITE: EmbeddedMigrations = embed_migrations!("user-migrations/sqlite");

fn migrations_live_beside_the_applications_own<C: TestConnection>(db: &TestDb) {
    let user = || match db.backend() {
        Backend::Postgres => USER_POSTGRES,
        Backend::Mysql => USER_MYSQL,
        Backend::Sqlite => USER_SQLITE,
    };
    let mut conn = db.connect::<C>();
    conn.run_pending_migrations(user()).unwrap();
    assert_eq!(
        run_migrations(&mut conn).unwrap().len(),
        outbox_migrations(db)
    );
    assert!(!conn.has_pending_migration(user()).unwrap());
    assert!(run_migrations(&mut conn).unwrap().is_empty());

    conn.transaction(|conn| {
        conn.batch_execute("INSERT INTO comments (body) VALUES ('first!')")?;
        ThankYou { member_id: 1 }.enqueue(conn)?;
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(all_pending(&mut conn).len(), 1);

    // The application's revert sees its own last migration, not the outbox's.
    conn.revert_last_migration(user()).unwrap();
    assert!(conn.has_pending_migration(user()).unwrap());
    assert!(run_migrations(&mut conn).unwrap().is_empty());
    assert_eq!(all_pending(&mut conn).len(), 1);
}

/// A type string no column can hold, possible only with a hand-written `Message` impl.
#[derive(Serialize, Deserialize)]
struct LongType;

impl Message for LongType {
    const MESSAGE_TYPE: &'static str = concat!(
        "a.very.long.type.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    );
}

fn bad_input_is_refused_before_anything_is_written<C: TestConnection>(db: &TestDb) {
    let mut conn = migrated::<C>(db);
    let err = LongType.enqueue(&mut conn).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLong {
                what: "message type",
                ..
            }
        ),
        "{err}"
    );

    let big = Text {
        body: "x".repeat(2048),
    };
    let small_limit = EnqueueOptions::new().max_payload_bytes(1024);
    let err = big.enqueue_with(&mut conn, &small_limit).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                message_type: "test.text",
                max: 1024,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("reference"), "{err}");

    // A batch with one bad message is refused whole, before its INSERT.
    let result: Result<Vec<_>, Error> = conn.transaction(|conn| {
        let mut batch = Batch::new();
        batch.push(&ThankYou { member_id: 1 })?;
        batch.push_with(&big, &small_limit)?;
        batch.enqueue(conn)
    });
    assert!(matches!(result, Err(Error::PayloadTooLarge { .. })));
    let nul = Text {
        body: "a\0b".into(),
    };
    let err = nul.enqueue(&mut conn).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NulInPayload {
                message_type: "test.text"
            }
        ),
        "{err}"
    );
    let backslash = Text {
        body: "a\\u0000b".into(),
    };
    backslash.enqueue(&mut conn).unwrap();
    let stored = all_pending(&mut conn);
    let round_trip: Text = serde_json::from_str(&stored[0].payload).unwrap();
    assert_eq!(
        round_trip, backslash,
        "a backslash before `u0000` is not a NUL"
    );
    conn.batch_execute("DELETE FROM outbox_message").unwrap();

    let huge = Text {
        body: "x".repeat(outbox_diesel::DEFAULT_MAX_PAYLOAD_BYTES),
    };
    assert!(matches!(
        huge.enqueue(&mut conn),
        Err(Error::PayloadTooLarge { .. })
    ));
    assert!(all_pending(&mut conn).is_empty(), "nothing half-written");
}

backend_tests!(
    reused_options_delay_each_message_from_its_own_enqueue,
    an_ordering_key_with_control_characters_is_refused,
    committed_enqueue_stores_exactly_that_message,
    rolled_back_enqueue_stores_nothing,
    enqueue_outside_a_transaction_commits_on_its_own,
    pooled_connections_enqueue_in_their_transactions,
    ten_thousand_messages_in_one_transaction,
    a_batch_that_rolls_back_leaves_nothing,
    large_and_non_ascii_payloads_round_trip,
    ordering_key_and_delay_are_stored,
    a_single_enqueue_is_prepared_once_per_connection,
    values_too_long_for_their_column_are_refused,
    serialization_failure_is_returned_and_the_transaction_goes_on,
    migrations_twice_are_a_no_op,
    migrations_live_beside_the_applications_own,
    bad_input_is_refused_before_anything_is_written,
);
