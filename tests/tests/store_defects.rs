//! Defects of the store found in review, each a regression test on every backend: a row whose
//! message id does not parse, a dead-lettering by a claim that lost its lease, and a settlement
//! of two claims at once that took one claim's done message for its key's next one, and a lock
//! timeout taken for a refused outcome.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{QueryableByName, RunQueryDsl};
use outbox_diesel::admin::{dead_letters, pending_messages, ListOptions};
use outbox_diesel::store::{ClaimLimit, ClaimToken, Outcome, Settlement, Store, SuccessorLease};
use outbox_diesel::{DieselStore, Enqueue, EnqueueOptions, Error, Message};
use outbox_testkit::outbox::outcome;
use outbox_testkit::{backend_tests, with_connection, Backend, TestConnection, TestDb};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Item {
    n: u32,
}

impl Message for Item {
    const MESSAGE_TYPE: &'static str = "store_defects.item";
}

#[derive(QueryableByName)]
struct Reason {
    #[diesel(sql_type = diesel::sql_types::Text)]
    last_error: String,
}

/// One bad row is dead-lettered alone with the reason; the rest of the claim is delivered, and
/// the bad row's key moves on.
fn a_row_whose_message_id_does_not_parse_is_dead_lettered_alone<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    let keyed = EnqueueOptions::new().ordering_key("k");
    Item { n: 0 }.enqueue(&mut conn).unwrap();
    Item { n: 1 }.enqueue_with(&mut conn, &keyed).unwrap();
    Item { n: 2 }.enqueue_with(&mut conn, &keyed).unwrap();
    Item { n: 3 }.enqueue(&mut conn).unwrap();
    let rows = pending_messages(&mut conn, &ListOptions::new()).unwrap();
    let bad = rows[1].position;
    let corrupt = format!("UPDATE outbox_message SET message_id = 'not-a-uuid' WHERE id = {bad}");
    if db.backend() == Backend::Postgres {
        // The uuid column refuses it: the defect cannot happen here.
        assert!(conn.batch_execute(&corrupt).is_err());
        return;
    }
    conn.batch_execute(&corrupt).unwrap();

    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(10), Duration::from_secs(30))
        .unwrap();
    let positions: Vec<i64> = claimed.iter().map(|m| m.position).collect();
    assert_eq!(positions, [rows[0].position, rows[3].position]);
    // Listing it names the row and what is wrong with it (purge it by position).
    let listing = dead_letters(&mut conn, &ListOptions::new()).unwrap_err();
    assert!(
        matches!(listing, Error::InvalidRow { table: "outbox_failure", id, .. } if id == bad),
        "{listing}"
    );
    let query = format!("SELECT last_error FROM outbox_failure WHERE id = {bad}");
    let reason: Vec<Reason> = with_connection!(db.backend(), Conn => {
        diesel::sql_query(&query).load(&mut db.connect::<Conn>()).unwrap()
    });
    assert_eq!(reason.len(), 1);
    assert!(
        reason[0].last_error.contains("not-a-uuid"),
        "{}",
        reason[0].last_error
    );

    let next = store
        .claim(
            ClaimToken::new(),
            ClaimLimit::messages(10),
            Duration::from_secs(30),
        )
        .unwrap();
    assert_eq!(
        next.iter().map(|m| m.position).collect::<Vec<_>>(),
        [rows[2].position],
        "the key moved on"
    );
}

/// A claim whose lease passed to another cannot dead-letter the message: its outcome is fenced,
/// and the message stays live for the claim that holds it.
fn a_dead_lettering_by_a_lost_claim_is_fenced<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    Item { n: 0 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let store = DieselStore::new(pool.clone());
    let lost = ClaimToken::new();
    let first = store
        .claim(lost, ClaimLimit::messages(1), Duration::from_millis(500))
        .unwrap();
    assert_eq!(first.len(), 1);
    std::thread::sleep(Duration::from_millis(800));
    let holder = ClaimToken::new();
    let second = store
        .claim(holder, ClaimLimit::messages(1), Duration::from_secs(30))
        .unwrap();
    assert_eq!(second.len(), 1, "the lease ran out");

    let dead = Settlement::DeadLetter {
        error: "from the lost claim".into(),
    };
    let fenced = store.settle(&[outcome(lost, &first[0], dead)]).unwrap();
    assert_eq!(fenced, [first[0].position]);
    let mut conn = pool.get().unwrap();
    assert!(dead_letters(&mut conn, &ListOptions::new())
        .unwrap()
        .is_empty());
    assert_eq!(
        pending_messages(&mut conn, &ListOptions::new())
            .unwrap()
            .len(),
        1
    );

    let dead = Settlement::DeadLetter {
        error: "from the holder".into(),
    };
    assert!(store
        .settle(&[outcome(holder, &second[0], dead)])
        .unwrap()
        .is_empty());
    let letters = dead_letters(&mut conn, &ListOptions::new()).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].last_error, "from the holder");
    assert!(pending_messages(&mut conn, &ListOptions::new())
        .unwrap()
        .is_empty());
}

/// One settlement holds the done messages of two claims, and the second claim's message (key
/// b) has outlived its lease. Settling the first claim's messages must not take b's done
/// message for b's next one and lease it again (it ran once already): each done message is
/// removed, none is leased back, nothing is fenced, and b's real next message is what follows.
fn a_settlement_of_two_claims_never_leases_a_done_message_again<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    let store = DieselStore::new(pool.clone());
    let a = EnqueueOptions::new().ordering_key("a");
    let b = EnqueueOptions::new().ordering_key("b");
    Item { n: 0 }.enqueue_with(&mut conn, &a).unwrap();
    let first = ClaimToken::new();
    let first_claim = store
        .claim(first, ClaimLimit::messages(10), Duration::from_secs(30))
        .unwrap();
    Item { n: 1 }.enqueue_with(&mut conn, &b).unwrap();
    Item { n: 2 }.enqueue_with(&mut conn, &b).unwrap();
    let second = ClaimToken::new();
    let second_claim = store
        .claim(second, ClaimLimit::messages(10), Duration::from_millis(1))
        .unwrap();
    assert_eq!((first_claim.len(), second_claim.len()), (1, 1));
    // The second claim's lease runs out; nobody claims its message again.
    std::thread::sleep(Duration::from_millis(50));

    let outcomes: Vec<Outcome> = [(first, &first_claim[0]), (second, &second_claim[0])]
        .into_iter()
        .map(|(token, message)| outcome(token, message, Settlement::Done))
        .collect();
    let successors = SuccessorLease {
        token: ClaimToken::new(),
        lease: Duration::from_secs(30),
        max_bytes: 1 << 20,
        per_key: 1,
    };
    let (fenced, leased) = store.settle_and_lease(&outcomes, &successors).unwrap();
    assert!(fenced.is_empty(), "{fenced:?}");
    let leased: Vec<i64> = leased.iter().map(|m| m.position).collect();
    assert!(
        !leased.contains(&second_claim[0].position),
        "b's done message was leased again: {leased:?}"
    );
    let left = pending_messages(&mut conn, &ListOptions::new()).unwrap();
    let left: Vec<i64> = left.iter().map(|m| m.position).collect();
    assert_eq!(left.len(), 1, "only b's next message is left: {left:?}");
    assert!(leased.iter().all(|position| left.contains(position)));
}

/// Sets MySQL's lock wait timeout to one second on each connection of a pool.
#[derive(Debug)]
struct QuickLockWait;

impl<C: diesel::Connection + diesel::connection::SimpleConnection>
    diesel::r2d2::CustomizeConnection<C, Error> for QuickLockWait
{
    fn on_acquire(&self, conn: &mut C) -> Result<(), Error> {
        conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
            .map_err(Error::from)
    }
}

/// A lock held elsewhere outlasts the database's lock timeout while the worker settles: the
/// settlement fails as "busy", which the worker waits out, not as a refusal of the outcome,
/// which it would give up after a few tries (and the message would run again without any
/// crash). MySQL's lock wait timeout (1 s here) and SQLite's busy timeout (5 s); PostgreSQL
/// has none unless configured, and its timeouts read the same way.
fn a_lock_timeout_is_a_busy_store_not_a_refused_outcome<C: TestConnection>(db: &TestDb) {
    if db.backend() == Backend::Postgres {
        return;
    }
    let tables = db.pool::<C>(4);
    Item { n: 1 }.enqueue(&mut tables.get().unwrap()).unwrap();
    let store = DieselStore::new(if db.backend() == Backend::Mysql {
        diesel::r2d2::Pool::builder()
            .max_size(4)
            .connection_customizer(Box::new(QuickLockWait))
            .build(outbox_diesel::OutboxManager::<C>::new(db.url()).unwrap())
            .unwrap()
    } else {
        tables.clone()
    });
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
        .unwrap();
    let done = [outcome(token, &claimed[0], Settlement::Done)];

    let mut holder = db.connect::<C>();
    let hold = match db.backend() {
        // Locks every row without changing it, until the rollback.
        Backend::Mysql => "BEGIN; UPDATE outbox_message SET attempts = attempts;",
        _ => "BEGIN IMMEDIATE;",
    };
    holder.batch_execute(hold).unwrap();
    let busy = store.settle(&done).unwrap_err();
    assert_eq!(
        busy.kind(),
        outbox_diesel::store::StoreErrorKind::Busy,
        "{busy}"
    );
    holder.batch_execute("ROLLBACK").unwrap();
    assert!(store.settle(&done).unwrap().is_empty(), "settled once free");
    assert!(
        pending_messages(&mut tables.get().unwrap(), &ListOptions::new())
            .unwrap()
            .is_empty()
    );
}

backend_tests!(
    a_lock_timeout_is_a_busy_store_not_a_refused_outcome,
    a_settlement_of_two_claims_never_leases_a_done_message_again,
    a_row_whose_message_id_does_not_parse_is_dead_lettered_alone,
    a_dead_lettering_by_a_lost_claim_is_fenced,
);
