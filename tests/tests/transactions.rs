//! `write_transaction`: a transaction that reads, then enqueues, while another connection
//! commits in between, succeeds on every backend; on SQLite the same with a plain
//! `transaction` fails ("database is locked"), which is why it exists. Also through a
//! `MultiConnection` enum, with a nested transaction inside.

use std::sync::mpsc;
use std::time::Duration;

use diesel::{Connection, SqliteConnection};
use outbox_diesel::admin::{pending_messages, ListOptions};
use outbox_diesel::prelude::*;
use outbox_diesel::{write_transaction, Error, Message, OutboxConnection};
use outbox_testkit::outbox::pending;
use outbox_testkit::{backend_tests, Backend, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Noted {
    by: String,
}

impl Message for Noted {
    const MESSAGE_TYPE: &'static str = "transactions.noted";
}

fn noted(by: &str) -> Noted {
    Noted { by: by.to_owned() }
}

/// Who enqueued the pending messages, sorted.
fn authors<C: TestConnection>(pool: &TestPool<C>) -> Vec<String> {
    let mut by: Vec<String> = pending(pool)
        .iter()
        .map(|m| serde_json::from_str::<Noted>(&m.payload).unwrap().by)
        .collect();
    by.sort();
    by
}

/// The body a transaction runs.
type Body<'a, T> = &'a mut dyn FnMut(&mut T) -> Result<(), Error>;

/// Runs `transaction` on `conn`: it reads the outbox, lets another connection enqueue, waits a
/// little, then enqueues itself. Returns the transaction's result.
fn read_then_write_around_another_commit<C, T>(
    pool: &TestPool<C>,
    conn: &mut T,
    transaction: fn(&mut T, Body<'_, T>) -> Result<(), Error>,
) -> Result<(), Error>
where
    C: TestConnection,
    T: OutboxConnection,
{
    let (read, other_may_write) = mpsc::channel();
    std::thread::scope(|scope| {
        let other = scope.spawn(move || {
            other_may_write.recv().unwrap();
            noted("other").enqueue(&mut pool.get().unwrap()).unwrap();
        });
        let result = transaction(conn, &mut |conn| {
            pending_messages(conn, &ListOptions::new())?;
            read.send(()).unwrap();
            // The other connection commits meanwhile (or, with the write lock held, waits).
            std::thread::sleep(Duration::from_millis(300));
            noted("this").enqueue(conn)?;
            Ok(())
        });
        other.join().unwrap();
        result
    })
}

fn with_write_transaction<T: OutboxConnection + Connection>(
    conn: &mut T,
    body: Body<'_, T>,
) -> Result<(), Error> {
    write_transaction(conn, |conn| body(conn))
}

fn with_plain_transaction<T: OutboxConnection + Connection>(
    conn: &mut T,
    body: Body<'_, T>,
) -> Result<(), Error> {
    conn.transaction(|conn| body(conn))
}

fn a_transaction_that_reads_first_survives_a_commit_in_between<C>(db: &TestDb)
where
    C: TestConnection + OutboxConnection,
{
    let pool = db.pool::<C>(3);
    let mut conn = db.connect::<C>();
    read_then_write_around_another_commit(&pool, &mut conn, with_write_transaction).unwrap();
    assert_eq!(authors(&pool), ["other", "this"]);

    if db.backend() == Backend::Sqlite {
        // What it guards against: a plain transaction whose snapshot went stale.
        let err = read_then_write_around_another_commit(&pool, &mut conn, with_plain_transaction)
            .unwrap_err();
        assert!(err.to_string().contains("locked"), "{err}");
        assert_eq!(
            authors(&pool),
            ["other", "other", "this"],
            "the failed transaction wrote nothing"
        );
    }
}

backend_tests!(a_transaction_that_reads_first_survives_a_commit_in_between);

#[derive(diesel::MultiConnection)]
enum AnyConnection {
    Sqlite(SqliteConnection),
}

outbox_diesel::impl_outbox_connection!(AnyConnection { Sqlite });

/// Through a connection enum, with a nested transaction (a savepoint) that rolls back alone.
#[test]
fn a_connection_enum_takes_the_write_lock_and_nests() {
    let db = TestDb::new(Backend::Sqlite).unwrap();
    let pool = db.pool::<SqliteConnection>(2);
    let mut conn = db.connect::<AnyConnection>();
    read_then_write_around_another_commit(&pool, &mut conn, |conn, body| {
        write_transaction(conn, |conn| {
            let nested: Result<(), Error> = conn.transaction(|conn| {
                noted("rolled back").enqueue(conn)?;
                Err(Error::Database(diesel::result::Error::RollbackTransaction))
            });
            assert!(nested.is_err());
            body(conn)
        })
    })
    .unwrap();
    assert_eq!(authors(&pool), ["other", "this"]);
}
