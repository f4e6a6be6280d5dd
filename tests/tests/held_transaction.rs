//! A transaction held open elsewhere in the database (a report, a `pg_dump`, a forgotten
//! session) keeps vacuum and purge from removing what claimed and settled messages leave in the
//! due index. Claims must not walk all of it each time, a message whose transaction commits
//! after claims passed its due time must still be claimed, and the backlog must show what holds
//! the clean-up back.

use std::time::{Duration, Instant};

use diesel::connection::{SimpleConnection, TransactionManager};
use diesel::prelude::*;
use outbox_diesel::admin;
use outbox_diesel::store::{ClaimLimit, ClaimToken, Notifications, Settlement, Store};
use outbox_diesel::{enqueue_all, DieselStore, Enqueue, EnqueueOptions, Message, OutboxManager};
use outbox_testkit::outbox::outcome;
use outbox_testkit::{Backend, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Held {
    n: u32,
}

impl Message for Held {
    const MESSAGE_TYPE: &'static str = "held.message";
}

const LEASE: Duration = Duration::from_secs(60);

/// Longer than the allowance a claim reads behind its cursor without a listener (one second):
/// only a backlog sample (or the store's sweep from the start every ten minutes) finds a message
/// this far behind.
const LATE_COMMIT: Duration = Duration::from_millis(1_600);

fn a_message_committed_after_claims_passed_its_due_time_is_claimed<C: TestConnection>(db: &TestDb) {
    let _alone = INNODB_COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
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

/// A settlement makes a key's next message due at its transaction's clock, which is its
/// start; the message becomes visible only at the commit. A claim that found a newer message
/// meanwhile moved the cursor past that time: the promoted message (and a retry due at once)
/// must still be claimed at the next claim, not at the next backlog sample.
fn a_message_a_settlement_makes_due_is_claimed_at_once<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let store = std::sync::Arc::new(DieselStore::new(pool.clone()));
    let _listener = store.listen().unwrap();
    let keyed = || EnqueueOptions::new().ordering_key("k");
    let head = Held { n: 1 }
        .enqueue_with(&mut pool.get().unwrap(), &keyed())
        .unwrap();
    let successor = Held { n: 2 }
        .enqueue_with(&mut pool.get().unwrap(), &keyed())
        .unwrap();
    let retried = Held { n: 3 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let token = ClaimToken::new();
    let claimed = store.claim(token, ClaimLimit::messages(10), LEASE).unwrap();
    let ids = |claimed: &[outbox_diesel::store::ClaimedMessage]| {
        claimed.iter().map(|m| m.message_id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&claimed),
        [head, retried],
        "the successor waits behind its head"
    );
    let (head_row, retried_row) = (&claimed[0], &claimed[1]);

    // Another session locks the retried row: the settlement waits for it.
    let mut locker = db.connect::<C>();
    <C as Connection>::TransactionManager::begin_transaction(&mut locker).unwrap();
    locker
        .batch_execute(&format!(
            "SELECT id FROM outbox_message WHERE id = {} FOR UPDATE",
            retried_row.position
        ))
        .unwrap();
    let outcomes = vec![
        outcome(
            token,
            retried_row,
            Settlement::Retry {
                delay: Duration::ZERO,
                error: "503".into(),
            },
        ),
        outcome(token, head_row, Settlement::Done),
    ];
    let settling = {
        let store = std::sync::Arc::clone(&store);
        std::thread::spawn(move || store.settle(&outcomes).unwrap())
    };
    std::thread::sleep(LATE_COMMIT);
    // A newer message, claimed while the settlement waits: the cursor moves to it.
    let newer = Held { n: 4 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let next = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    assert_eq!(ids(&next), [newer]);
    <C as Connection>::TransactionManager::commit_transaction(&mut locker).unwrap();
    assert!(settling.join().unwrap().is_empty(), "nothing fenced");

    let mut after = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    after.sort_by_key(|m| m.position);
    assert_eq!(
        ids(&after),
        [successor, retried],
        "the settlement's promoted and retried messages, at the next claim"
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

/// A claim whose worker died: its messages come due again when its lease runs out, at the
/// latest once the next backlog sample has run. On PostgreSQL a leased message keeps its place
/// in the due index (the lease is a column of its own), so claims that passed it since find it
/// through the sample's rewind; on MySQL and SQLite the lease is the due time, ahead of them.
fn a_lapsed_lease_behind_the_claim_cursor_is_claimed_again<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let store = DieselStore::new(pool.clone());
    let lapsing = Held { n: 0 }.enqueue(&mut pool.get().unwrap()).unwrap();
    // Due further behind the cursor the next claims leave than a claim reads behind it.
    std::thread::sleep(LATE_COMMIT);
    enqueue_all(&mut pool.get().unwrap(), &[Held { n: 1 }, Held { n: 2 }]).unwrap();
    let message_ids = |claimed: &[outbox_diesel::store::ClaimedMessage]| {
        claimed.iter().map(|m| m.message_id).collect::<Vec<_>>()
    };
    let lost = store
        .claim(
            ClaimToken::new(),
            ClaimLimit::messages(1),
            Duration::from_millis(300),
        )
        .unwrap();
    assert_eq!(
        message_ids(&lost),
        [lapsing],
        "the first claim reads from the start"
    );
    for _ in 0..2 {
        let held = store
            .claim(ClaimToken::new(), ClaimLimit::messages(1), LEASE)
            .unwrap();
        assert_eq!(held.len(), 1, "a claim skips a message whose lease runs");
        assert_ne!(message_ids(&held), [lapsing]);
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut found = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
        .unwrap();
    if found.is_empty() {
        store.backlog().unwrap();
        found = store
            .claim(ClaimToken::new(), ClaimLimit::messages(10), LEASE)
            .unwrap();
    }
    assert_eq!(
        message_ids(&found),
        [lapsing],
        "the lapsed lease's message, and none of those still held"
    );
}

/// On PostgreSQL a claim leases each message in place: the lease is a column outside every
/// index and the table's pages keep room for a new row version, so leasing adds no entry to any
/// index (a HOT update), and a transaction held open elsewhere keeps no second due-index entry of
/// a leased message for the claims to walk. Renewing a lease is the same.
#[test]
fn a_claim_leases_each_message_in_place() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let counter = |column: &str| {
        reported_statistic(
            &db,
            &format!(
                "SELECT {column} AS n FROM pg_stat_user_tables WHERE relname = 'outbox_message'"
            ),
        )
    };
    let pool = db.pool::<PgConnection>(3);
    let store = DieselStore::new(pool.clone());
    let (updates_before, in_place_before) = (counter("n_tup_upd"), counter("n_tup_hot_upd"));
    {
        let messages: Vec<Held> = (0..1_000).map(|n| Held { n }).collect();
        enqueue_all(&mut pool.get().unwrap(), &messages).unwrap();
        let mut leased = Vec::new();
        loop {
            let token = ClaimToken::new();
            let claimed = store
                .claim(token, ClaimLimit::messages(256), LEASE)
                .unwrap();
            if claimed.is_empty() {
                break;
            }
            leased.extend(claimed.iter().map(|m| (token, m.position)));
        }
        assert_eq!(leased.len(), 1_000);
        assert!(
            store
                .extend_leases(&leased[..256], LEASE)
                .unwrap()
                .is_empty(),
            "every lease renewed"
        );
    }
    // The pool closes, and its connections report their statistics.
    drop(store);
    drop(pool);
    let updates = counter("n_tup_upd") - updates_before;
    let in_place = counter("n_tup_hot_upd") - in_place_before;
    assert_eq!(updates, 1_256, "one update a lease and a renewal");
    // A renewal finds its page holding the row twice (as enqueued, as leased) and makes room by
    // pruning the first version where it can: a few renewals move off the page. Before the lease
    // had its own column none of these updates was in place.
    assert!(
        in_place * 100 >= updates * 95,
        "{in_place} of {updates} leases and renewals in place (HOT)"
    );
}

/// `idx_tup_read` of the due index: every index entry a scan returned, dead ones included.
fn due_index_reads(db: &TestDb) -> i64 {
    index_reads(db, "outbox_message_due")
}

/// `idx_tup_read` of one of the outbox table's indexes.
fn index_reads(db: &TestDb, index: &str) -> i64 {
    reported_statistic(
        db,
        &format!(
            "SELECT idx_tup_read AS n FROM pg_stat_user_indexes WHERE indexrelname = '{index}'"
        ),
    )
}

/// One counter of PostgreSQL's statistics views (`sql` selects it as `n`). Statistics reach the
/// views when the backend that counted them reports them (at the latest when it closes): read
/// until two reads agree.
fn reported_statistic(db: &TestDb, sql: &str) -> i64 {
    let read = || -> i64 {
        let mut conn = db.connect::<PgConnection>();
        diesel::sql_query(sql)
            .get_result::<Count>(&mut conn)
            .unwrap()
            .n
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

/// Enqueues `n` messages and claims and settles each alone, through `store`.
fn claim_and_settle_one_by_one<C: TestConnection>(
    pool: &TestPool<C>,
    store: &DieselStore<OutboxManager<C>>,
    n: u32,
) {
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

/// Claims and settles `settled` messages in batches while `holder` keeps a snapshot: each
/// leaves an entry in the due index that neither vacuum nor purge can remove while it lives.
/// Its pool closes at the end, and with it the connections' unreported statistics. On MySQL
/// and SQLite a lease moves a message's due entry forward to the lease's end, which leaves a
/// second entry there; on PostgreSQL it is an update in place that leaves none.
fn settle_behind_a_held_snapshot<C: TestConnection>(db: &TestDb, settled: u32, lease: Duration) {
    let pool = db.pool::<C>(3);
    settle_in_batches(&pool, &DieselStore::new(pool.clone()), settled, lease);
}

/// Enqueues `settled` messages, then claims and settles them through `store` in batches.
fn settle_in_batches<C: TestConnection>(
    pool: &TestPool<C>,
    store: &DieselStore<OutboxManager<C>>,
    settled: u32,
    lease: Duration,
) {
    let messages: Vec<Held> = (0..settled).map(|n| Held { n }).collect();
    for chunk in messages.chunks(5_000) {
        enqueue_all(&mut pool.get().unwrap(), chunk).unwrap();
    }
    loop {
        let token = ClaimToken::new();
        let claimed = store
            .claim(token, ClaimLimit::messages(500), lease)
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

const CLAIMS: u32 = 40;

/// A session holding a snapshot with an xid, as a report or a `pg_dump` does: vacuum keeps
/// every row it may still see. Commit it to let go.
fn hold_a_snapshot(db: &TestDb) -> PgConnection {
    let mut holder = db.connect::<PgConnection>();
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current();")
        .unwrap();
    holder
}

#[test]
fn claims_do_not_walk_the_dead_rows_a_held_transaction_keeps() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let mut holder = hold_a_snapshot(&db);
    // Each settled message leaves a dead entry where it was due (and one where its lease ran
    // to, past the claims' reach).
    const SETTLED: u32 = 3_000;
    settle_behind_a_held_snapshot::<PgConnection>(&db, SETTLED, LEASE);
    let dead_entries = i64::from(SETTLED);
    let before = due_index_reads(&db);
    {
        // Closed before the count: a connection reports its statistics when it closes.
        let pool = db.pool::<PgConnection>(3);
        claim_and_settle_one_by_one(&pool, &DieselStore::new(pool.clone()), CLAIMS);
    }
    let read = due_index_reads(&db) - before;
    assert!(
        read >= i64::from(CLAIMS),
        "each claim reads at least its message's entry; {read} counted: statistics not reported"
    );

    // A claim from the start reads every dead entry: CLAIMS of them would read 40 times the
    // dead entries. A new store's first claim reads from the start, the others from its cursor.
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

#[test]
fn claims_and_settlements_look_rows_up_by_id_after_a_vacuum_found_the_table_empty() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let mut holder = hold_a_snapshot(&db);
    settle_behind_a_held_snapshot::<PgConnection>(&db, 3_000, LEASE);
    // Vacuum (autovacuum, or a cron job) runs while the worker keeps up: it finds no live
    // row and records that, though the pages are full of dead ones.
    let mut conn = db.connect::<PgConnection>();
    conn.batch_execute("VACUUM outbox_message").unwrap();
    #[derive(QueryableByName)]
    struct Estimate {
        #[diesel(sql_type = diesel::sql_types::Float)]
        reltuples: f32,
    }
    let estimate =
        diesel::sql_query("SELECT reltuples FROM pg_class WHERE relname = 'outbox_message'")
            .get_result::<Estimate>(&mut conn)
            .unwrap();
    assert!(estimate.reltuples < 1.0, "{}", estimate.reltuples);

    // Then a backlog builds up, and the worker claims and settles it in batches.
    const BACKLOG: u32 = 2_000;
    const CLAIMS: i64 = 5;
    let before = index_reads(&db, "outbox_message_pkey");
    {
        let pool = db.pool::<PgConnection>(3);
        let messages: Vec<Held> = (0..BACKLOG).map(|n| Held { n }).collect();
        enqueue_all(&mut pool.get().unwrap(), &messages).unwrap();
        let store = DieselStore::new(pool.clone());
        for _ in 0..CLAIMS {
            let token = ClaimToken::new();
            let claimed = store.claim(token, ClaimLimit::messages(64), LEASE).unwrap();
            assert_eq!(claimed.len(), 64);
            let outcomes: Vec<_> = claimed
                .iter()
                .map(|m| outcome(token, m, Settlement::Done))
                .collect();
            store.settle(&outcomes).unwrap();
        }
    }
    let read = index_reads(&db, "outbox_message_pkey") - before;
    // By id: a few entries per message. By a join the planner thinks free for an "empty"
    // table: every entry, live and dead, each time.
    println!("{CLAIMS} claims of 64 and their settlements read {read} primary-key entries");
    assert!(
        read < CLAIMS * 64 * 8,
        "{CLAIMS} claims of 64 read {read} primary-key entries: a statement joins the whole \
         table instead of looking rows up by id"
    );
    holder.batch_execute("COMMIT").unwrap();
}

#[test]
fn a_claim_larger_than_the_statistics_promise_walks_the_due_index_in_order() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let pool = db.pool::<PgConnection>(3);
    // Statistics taken while the outbox was empty (autovacuum off or behind, as on a server
    // that has not caught up with a burst): PostgreSQL expects a few dozen due rows.
    let mut conn = pool.get().unwrap();
    conn.batch_execute("ANALYZE outbox_message").unwrap();
    const BACKLOG: u32 = 20_000;
    const CLAIMS: i64 = 3;
    let messages: Vec<Held> = (0..BACKLOG).map(|n| Held { n }).collect();
    for chunk in messages.chunks(5_000) {
        enqueue_all(&mut conn, chunk).unwrap();
    }
    drop(conn);
    let before = due_index_reads(&db);
    {
        let store = DieselStore::new(pool.clone());
        for _ in 0..CLAIMS {
            let claimed = store
                .claim(ClaimToken::new(), ClaimLimit::messages(256), LEASE)
                .unwrap();
            assert_eq!(claimed.len(), 256);
        }
    }
    drop(pool);
    let read = due_index_reads(&db) - before;
    println!("{CLAIMS} claims of 256 read {read} entries of the due index");
    // In due order each claim reads its candidates and stops; a bitmap scan, which such
    // statistics make look cheaper, reads every due entry (20,000) and sorts them.
    assert!(
        read < CLAIMS * 256 * 4,
        "{CLAIMS} claims of 256 read {read} entries of the due index: the claim read every due \
         row instead of walking the index in order"
    );
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    enable_bitmapscan: String,
}

#[test]
fn the_claimers_session_is_reset_before_its_connection_goes_back_to_the_pool() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    // One connection: the claimer's, and the application's after it.
    let pool = db.pool::<PgConnection>(1);
    let store = DieselStore::new(pool.clone());
    store
        .claim(ClaimToken::new(), ClaimLimit::messages(16), LEASE)
        .unwrap();
    drop(store);
    let setting = diesel::sql_query("SHOW enable_bitmapscan")
        .get_result::<Setting>(&mut pool.get().unwrap())
        .unwrap();
    assert_eq!(
        setting.enable_bitmapscan, "on",
        "the claimer's planner setting leaked into the application's connection"
    );
}

/// `seq_scan` of the outbox table: how many sequential scans of it began, once the backends
/// that counted them reported (closed, or idle for ten seconds).
fn outbox_table_scans(db: &TestDb) -> i64 {
    reported_statistic(
        db,
        "SELECT seq_scan AS n FROM pg_stat_user_tables WHERE relname = 'outbox_message'",
    )
}

/// How long the store keeps its connections' query plans on PostgreSQL (see `DieselStore`).
const PLANS_KEPT: Duration = Duration::from_secs(10);

#[test]
fn claims_and_settlements_are_planned_again_as_a_held_snapshot_grows_the_table() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let pool = db.pool::<PgConnection>(3);
    let store = DieselStore::new(pool.clone());
    // A worker starts on an empty outbox: after five runs of a prepared statement PostgreSQL
    // keeps a generic plan, made for a table it takes to be ten pages long, where reading all
    // of it is cheaper than looking rows up by id.
    claim_and_settle_one_by_one(&pool, &store, 12);
    // Then a held snapshot keeps every settled row: the table grows to hundreds of pages, and
    // nothing (no vacuum, no ANALYZE: they cannot remove a row yet) tells the plan.
    let mut holder = hold_a_snapshot(&db);
    settle_in_batches(&pool, &store, 20_000, LEASE);
    // Long enough for the store to let its plans go, and for the backends to report.
    std::thread::sleep(PLANS_KEPT + Duration::from_secs(2));
    let before = outbox_table_scans(&db);
    claim_and_settle_one_by_one(&pool, &store, CLAIMS);
    drop(store);
    drop(pool);
    let scans = outbox_table_scans(&db) - before;
    println!("{CLAIMS} claims and settlements began {scans} sequential scans of the outbox");
    assert_eq!(
        scans, 0,
        "{CLAIMS} claims and settlements read the whole outbox table {scans} times: a plan made \
         when the table was empty is still in use"
    );
    holder.batch_execute("COMMIT").unwrap();
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = diesel::sql_types::Text)]
    detail: String,
}

#[test]
fn sqlite_claims_read_only_pending_entries_while_a_reader_is_held() {
    let Some(db) = TestDb::new(Backend::Sqlite) else {
        return;
    };
    let pool = db.pool::<SqliteConnection>(3);
    // A reader held open (a backup, a report): WAL mode keeps its snapshot in the log, which
    // grows until the reader ends, while the writer's b-trees lose every settled row at once.
    let mut reader = db.connect::<SqliteConnection>();
    reader
        .batch_execute("BEGIN; SELECT COUNT(*) FROM outbox_message;")
        .unwrap();
    const SETTLED: u32 = 5_000;
    settle_in_batches(&pool, &DieselStore::new(pool.clone()), SETTLED, LEASE);
    const PENDING: u32 = 40;
    let pending: Vec<Held> = (0..PENDING).map(|n| Held { n }).collect();
    enqueue_all(&mut pool.get().unwrap(), &pending).unwrap();

    let mut conn = db.connect::<SqliteConnection>();
    let count = |conn: &mut SqliteConnection, sql: &str| {
        diesel::sql_query(sql).get_result::<Count>(conn).unwrap().n
    };
    assert_eq!(
        count(&mut reader, "SELECT COUNT(*) AS n FROM outbox_message"),
        0,
        "the reader no longer holds its snapshot: the test proves nothing"
    );
    // A claim reads the due index from its start ...
    let claim = outbox_diesel::__private::claim_sql::SQLITE_CANDIDATES.replace('?', "64");
    let plan: Vec<String> = diesel::sql_query(format!("EXPLAIN QUERY PLAN {claim}"))
        .load::<PlanLine>(&mut conn)
        .unwrap()
        .into_iter()
        .map(|line| line.detail)
        .collect();
    assert!(
        plan.iter().any(|l| l.contains("INDEX outbox_message_due")),
        "the claim does not read the due index: {plan:?}"
    );
    assert!(
        plan.iter()
            .any(|l| l.contains("INDEX outbox_message_prioritized")),
        "the claim does not read the raised priorities by their index: {plan:?}"
    );
    // (A `SCAN (subquery-N)` reads a lane's rows as they come, not a table.)
    assert!(
        !plan
            .iter()
            .any(|l| l.starts_with("SCAN") && !l.starts_with("SCAN (subquery")),
        "the claim reads a whole table: {plan:?}"
    );
    // ... which holds the pending messages and nothing of the settled ones, the reader open.
    let entries = count(
        &mut conn,
        "SELECT COALESCE(SUM(ncell), 0) AS n FROM dbstat WHERE name = 'outbox_message_due'",
    );
    println!(
        "with a reader held over {SETTLED} settled messages, the due index holds {entries} \
         entries for {PENDING} pending"
    );
    assert_eq!(
        entries,
        i64::from(PENDING),
        "the due index keeps entries of settled messages behind a held reader: claims would \
         read them"
    );
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store.claim(token, ClaimLimit::messages(64), LEASE).unwrap();
    assert_eq!(claimed.len(), PENDING as usize);
    reader.batch_execute("COMMIT").unwrap();
}

/// InnoDB's logical page reads, server-wide: index entries deleted behind a read view stay
/// (delete-marked) until purge, and a scan skips them inside the engine, so no row counter sees
/// them, but the pages that hold them are read.
fn innodb_page_reads(conn: &mut MysqlConnection) -> i64 {
    #[derive(QueryableByName)]
    struct Reads {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        page_reads: i64,
    }
    diesel::sql_query(
        "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS page_reads FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME = 'INNODB_BUFFER_POOL_READ_REQUESTS'",
    )
    .get_result::<Reads>(conn)
    .unwrap()
    .page_reads
}

#[test]
fn claims_do_not_walk_the_entries_purge_cannot_remove_behind_a_held_transaction() {
    let Some(db) = TestDb::new(Backend::Mysql) else {
        return;
    };
    // The counter is the server's: the other MySQL tests of this file wait.
    let _alone = INNODB_COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
    let mut holder = db.connect::<MysqlConnection>();
    holder
        .batch_execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .unwrap();
    // InnoDB packs hundreds of entries into a page: enough of them that walking them costs
    // several times a claim's own work (which grows with the indexes a claim's writes touch:
    // on MySQL the priority and group indexes hold every row; at 160,000 entries the group
    // index brought the ratio to 1.98, at 320,000 it is 2.7 to 2.9).
    const SETTLED: u32 = 320_000;
    // Leases that ended before the claims measured: the entries they leave lie behind the
    // cursor too. (Entries of leases still running lie past the claims' end, where InnoDB reads
    // the delete-marked ones until the first live entry: a cost this test does not measure, see
    // the notes of `sql::mysql::CANDIDATES`.)
    settle_behind_a_held_snapshot::<MysqlConnection>(&db, SETTLED, Duration::from_millis(1));
    let pool = db.pool::<MysqlConnection>(3);
    let mut counter = db.connect::<MysqlConnection>();

    // The pages the claims alone read (enqueues and settlements cost the same either way),
    // through one store (its first claim reads from the start, the others from its cursor),
    // then through a new store for each claim (each from the start).
    // Batches of several: a claim's statements over a list of ids must not walk either.
    const BATCH: u32 = 10;
    let mut claim_pages = |store: &DieselStore<OutboxManager<MysqlConnection>>| {
        let batch: Vec<Held> = (0..BATCH).map(|n| Held { n }).collect();
        enqueue_all(&mut pool.get().unwrap(), &batch).unwrap();
        let token = ClaimToken::new();
        let before = innodb_page_reads(&mut counter);
        let claimed = store
            .claim(token, ClaimLimit::messages(BATCH as usize), LEASE)
            .unwrap();
        let read = innodb_page_reads(&mut counter) - before;
        assert_eq!(claimed.len(), BATCH as usize);
        let outcomes: Vec<_> = claimed
            .iter()
            .map(|m| outcome(token, m, Settlement::Done))
            .collect();
        store.settle(&outcomes).unwrap();
        read
    };
    let one_store = DieselStore::new(pool.clone());
    let from_cursor: i64 = (0..CLAIMS).map(|_| claim_pages(&one_store)).sum();
    // A store holds a claim and a settlement connection.
    drop(one_store);
    let from_start: i64 = (0..CLAIMS)
        .map(|_| claim_pages(&DieselStore::new(pool.clone())))
        .sum();

    println!(
        "{CLAIMS} claims with {SETTLED} purge-blocked entries in front read {from_cursor} pages \
         from a cursor, {from_start} from the start"
    );
    assert!(
        from_cursor * 2 < from_start,
        "{CLAIMS} claims read {from_cursor} pages through one store and {from_start} each from \
         the start: claims walk the entries a held transaction keeps from purge"
    );
    holder.batch_execute("COMMIT").unwrap();
}

/// Serializes the tests that read or disturb InnoDB's server-wide counters.
static INNODB_COUNTERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn the_backlog_shows_the_transaction_that_holds_back_clean_up<C: TestConnection>(db: &TestDb) {
    let _alone = INNODB_COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
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
    fn a_lapsed_lease_behind_the_claim_cursor_is_claimed_again() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Postgres) {
            super::a_lapsed_lease_behind_the_claim_cursor_is_claimed_again::<diesel::PgConnection>(
                &db,
            );
        }
    }

    #[test]
    fn a_message_a_settlement_makes_due_is_claimed_at_once() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Postgres) {
            super::a_message_a_settlement_makes_due_is_claimed_at_once::<diesel::PgConnection>(&db);
        }
    }

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
    fn a_lapsed_lease_behind_the_claim_cursor_is_claimed_again() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Mysql) {
            super::a_lapsed_lease_behind_the_claim_cursor_is_claimed_again::<diesel::MysqlConnection>(
                &db,
            );
        }
    }

    #[test]
    fn a_message_a_settlement_makes_due_is_claimed_at_once() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Mysql) {
            super::a_message_a_settlement_makes_due_is_claimed_at_once::<diesel::MysqlConnection>(
                &db,
            );
        }
    }

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

mod sqlite {
    #[test]
    fn a_lapsed_lease_behind_the_claim_cursor_is_claimed_again() {
        if let Some(db) = outbox_testkit::TestDb::new(outbox_testkit::Backend::Sqlite) {
            super::a_lapsed_lease_behind_the_claim_cursor_is_claimed_again::<
                diesel::SqliteConnection,
            >(&db);
        }
    }
}
