//! A transaction held open elsewhere in the database (a report, a `pg_dump`, a forgotten
//! session) keeps vacuum and purge from removing what claimed and settled messages leave in the
//! due index. Claims must not walk all of it each time, a message whose transaction commits
//! after claims passed its due time must still be claimed, and the backlog must show what holds
//! the clean-up back.

use std::time::{Duration, Instant};

use diesel::connection::{SimpleConnection, TransactionManager};
use diesel::prelude::*;
use outbox_diesel::admin;
use outbox_diesel::store::{ClaimLimit, ClaimToken, Settlement, Store};
use outbox_diesel::{enqueue_all, DieselStore, Enqueue, Message};
use outbox_testkit::outbox::outcome;
use outbox_testkit::{Backend, TestConnection, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Held {
    n: u32,
}

impl Message for Held {
    const MESSAGE_TYPE: &'static str = "held.message";
}

const LEASE: Duration = Duration::from_secs(60);

/// Longer than the allowance a claim reads behind its cursor (one second): only the store's
/// sweep from the start finds a message this far behind.
const LATE_COMMIT: Duration = Duration::from_millis(1_600);

fn a_message_committed_after_claims_passed_its_due_time_is_claimed<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let store = DieselStore::new(pool.clone());
    let mut late = db.connect::<C>();
    <C as Connection>::TransactionManager::begin_transaction(&mut late).unwrap();
    let late_id = Held { n: 1 }.enqueue(&mut late).unwrap();
    std::thread::sleep(LATE_COMMIT);
    let early_id = Held { n: 2 }.enqueue(&mut pool.get().unwrap()).unwrap();

    let token = ClaimToken::new();
    let first = store.claim(token, ClaimLimit::messages(10), LEASE).unwrap();
    assert_eq!(
        first.iter().map(|m| m.message_id).collect::<Vec<_>>(),
        [early_id],
        "only the committed message is visible"
    );
    store
        .settle(&[outcome(token, &first[0], Settlement::Done)])
        .unwrap();
    <C as Connection>::TransactionManager::commit_transaction(&mut late).unwrap();

    // Its due time lies before where the last claim read from, by more than the allowance:
    // a claim from the cursor passes it.
    assert!(
        store
            .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
            .unwrap()
            .is_empty(),
        "claims read from the cursor, past the late message"
    );
    // The worker's housekeeper samples the backlog every `backlog_interval`.
    store.backlog().unwrap();
    let claimed = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    assert_eq!(
        claimed.iter().map(|m| m.message_id).collect::<Vec<_>>(),
        [late_id]
    );
}

#[test]
fn a_late_commit_notification_steps_the_claim_cursor_back_to_it() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let pool = db.pool::<PgConnection>(4);
    let store = DieselStore::new(pool.clone());
    // No backlog sample runs here: the notification alone must bring the late message to the
    // next claim.
    let mut listener = store.listen().unwrap().expect("PostgreSQL listens");
    let mut late = db.connect::<PgConnection>();
    late.batch_execute("BEGIN").unwrap();
    let late_id = Held { n: 1 }.enqueue(&mut late).unwrap();
    std::thread::sleep(LATE_COMMIT);
    let early_id = Held { n: 2 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let first = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    assert_eq!(
        first.iter().map(|m| m.message_id).collect::<Vec<_>>(),
        [early_id]
    );

    late.batch_execute("COMMIT").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(listener.wait(Duration::from_secs(5)).unwrap(), "notified");
    let next = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    assert_eq!(
        next.iter().map(|m| m.message_id).collect::<Vec<_>>(),
        [late_id],
        "the next claim reads from the late transaction's clock"
    );
}

#[test]
fn a_backlog_sample_steps_the_claim_cursor_back_to_a_message_nothing_announced() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let pool = db.pool::<PgConnection>(4);
    let store = DieselStore::new(pool.clone());
    let _listener = store.listen().unwrap().expect("PostgreSQL listens");
    // A commit whose notification never comes (a listener that lost its connection then).
    pool.get()
        .unwrap()
        .batch_execute("ALTER TABLE outbox_message DISABLE TRIGGER outbox_message_notify")
        .unwrap();
    let mut late = db.connect::<PgConnection>();
    late.batch_execute("BEGIN").unwrap();
    let late_id = Held { n: 1 }.enqueue(&mut late).unwrap();
    std::thread::sleep(LATE_COMMIT);
    Held { n: 2 }.enqueue(&mut pool.get().unwrap()).unwrap();
    assert_eq!(
        store
            .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
            .unwrap()
            .len(),
        1
    );
    late.batch_execute("COMMIT").unwrap();
    assert!(
        store
            .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
            .unwrap()
            .is_empty(),
        "claims read from the cursor, past the late message"
    );

    let backlog = store.backlog().unwrap().expect("a backlog");
    assert_eq!(backlog.pending, 2);
    let next = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    assert_eq!(
        next.iter().map(|m| m.message_id).collect::<Vec<_>>(),
        [late_id]
    );
}

/// `idx_tup_read` of the due index: every index entry a scan returned, dead ones included.
fn due_index_reads(db: &TestDb) -> i64 {
    #[derive(QueryableByName)]
    struct Reads {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        reads: i64,
    }
    // Statistics reach the view when the backend that counted them flushes them (at the latest
    // when it closes): read until two reads agree.
    let read = || -> i64 {
        let mut conn = db.connect::<PgConnection>();
        diesel::sql_query(
            "SELECT idx_tup_read AS reads FROM pg_stat_user_indexes \
             WHERE indexrelname = 'outbox_message_due'",
        )
        .get_result::<Reads>(&mut conn)
        .unwrap()
        .reads
    };
    let mut last = read();
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        std::thread::sleep(Duration::from_millis(700));
        let now = read();
        if now == last || Instant::now() > until {
            return now;
        }
        last = now;
    }
}

/// Claims `n` messages one at a time, each settled, through a store of its own whose
/// connections close at the end (so that their statistics are flushed).
fn claim_and_settle_one_by_one(db: &TestDb, n: u32) {
    let pool = db.pool::<PgConnection>(3);
    let store = DieselStore::new(pool.clone());
    for i in 0..n {
        Held { n: i }.enqueue(&mut pool.get().unwrap()).unwrap();
        let token = ClaimToken::new();
        let claimed = store.claim(token, ClaimLimit::messages(1), LEASE).unwrap();
        assert_eq!(claimed.len(), 1);
        store
            .settle(&[outcome(token, &claimed[0], Settlement::Done)])
            .unwrap();
    }
}

#[test]
fn claims_do_not_walk_the_dead_rows_a_held_transaction_keeps() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let mut holder = db.connect::<PgConnection>();
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current();")
        .unwrap();

    // Messages claimed and settled while the transaction is held: each leaves a dead entry where
    // it was due in the due index that no vacuum can remove (and one where its lease ran to,
    // past the claims' reach).
    const SETTLED: u32 = 3_000;
    {
        let pool = db.pool::<PgConnection>(3);
        let store = DieselStore::new(pool.clone());
        let messages: Vec<Held> = (0..SETTLED).map(|n| Held { n }).collect();
        enqueue_all(&mut pool.get().unwrap(), &messages).unwrap();
        loop {
            let token = ClaimToken::new();
            let claimed = store
                .claim(token, ClaimLimit::messages(200), LEASE)
                .unwrap();
            if claimed.is_empty() {
                break;
            }
            let outcomes: Vec<_> = claimed
                .iter()
                .map(|m| outcome(token, m, Settlement::Done))
                .collect();
            store.settle(&outcomes).unwrap();
        }
    }
    let dead_entries = i64::from(SETTLED);
    let before = due_index_reads(&db);

    const CLAIMS: u32 = 40;
    claim_and_settle_one_by_one(&db, CLAIMS);
    let read = due_index_reads(&db) - before;

    // A claim from the start reads every dead entry: CLAIMS of them would read 40 times the
    // dead entries. The store reads from the start once a second and from its cursor otherwise.
    println!(
        "{CLAIMS} claims read {read} due-index entries; {dead_entries} dead ones lie in front"
    );
    assert!(
        read < 4 * dead_entries,
        "{CLAIMS} claims read {read} entries of the due index: claims walk the {dead_entries} \
         dead entries a held transaction keeps"
    );
    holder.batch_execute("COMMIT").unwrap();
}

fn the_backlog_shows_the_transaction_that_holds_back_clean_up<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(2);
    let mut holder = db.connect::<C>();
    let begin = match db.backend() {
        Backend::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current();",
        _ => "START TRANSACTION WITH CONSISTENT SNAPSHOT",
    };
    holder.batch_execute(begin).unwrap();
    let held = Duration::from_millis(1_500);
    std::thread::sleep(held);

    let mut conn = pool.get().unwrap();
    let backlog = admin::backlog(&mut conn).unwrap();
    let age = backlog
        .oldest_transaction_age
        .expect("the held transaction is seen");
    assert!(age >= held, "held {held:?}, reported {age:?}");
    assert!(backlog.dead_rows.is_some(), "{backlog:?}");
    holder.batch_execute("COMMIT").unwrap();

    if db.backend() == Backend::Postgres {
        // PostgreSQL's horizon is per database, and this one is the test's own; InnoDB's purge
        // spans the server, where other tests hold transactions of their own.
        let after = admin::backlog(&mut conn).unwrap();
        assert!(
            after.oldest_transaction_age.is_none_or(|age| age < held),
            "{after:?}"
        );
    }
}

mod postgres {
    #[test]
    fn a_message_committed_after_claims_passed_its_due_time_is_claimed() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Postgres) {
            super::a_message_committed_after_claims_passed_its_due_time_is_claimed::<
                diesel::PgConnection,
            >(&db);
        }
    }

    #[test]
    fn the_backlog_shows_the_transaction_that_holds_back_clean_up() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Postgres) {
            super::the_backlog_shows_the_transaction_that_holds_back_clean_up::<diesel::PgConnection>(
                &db,
            );
        }
    }
}

// SQLite has one writer: no transaction commits behind a claim, and a reader held open costs
// WAL size, not claims.
mod mysql {
    #[test]
    fn a_message_committed_after_claims_passed_its_due_time_is_claimed() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Mysql) {
            super::a_message_committed_after_claims_passed_its_due_time_is_claimed::<
                diesel::MysqlConnection,
            >(&db);
        }
    }

    #[test]
    fn the_backlog_shows_the_transaction_that_holds_back_clean_up() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Mysql) {
            super::the_backlog_shows_the_transaction_that_holds_back_clean_up::<
                diesel::MysqlConnection,
            >(&db);
        }
    }
}
