//! Defects of the store found in review, each a regression test on every backend: a row whose
//! message id does not parse, and a dead-lettering by a claim that lost its lease.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{QueryableByName, RunQueryDsl};
use outbox_diesel::admin::{dead_letters, pending_messages, ListOptions};
use outbox_diesel::store::{ClaimLimit, ClaimToken, Settlement, Store};
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

backend_tests!(
    a_row_whose_message_id_does_not_parse_is_dead_lettered_alone,
    a_dead_lettering_by_a_lost_claim_is_fenced,
);
