//! Transactions that write, begun the way the backend needs for a reader that turns writer.

use diesel::Connection;

use crate::connection::OutboxConnection;

/// Runs `body` in a transaction begun to write, committing if it returns `Ok` and rolling back
/// otherwise: use it for a transaction that reads before it writes (it looks something up,
/// then enqueues).
///
/// On SQLite it begins with `BEGIN IMMEDIATE`, taking the database's write lock at once. A
/// plain `BEGIN` takes it at the first write, and if another connection (the outbox worker's,
/// say) committed since this transaction's first read, that write fails at once with
/// "database is locked": no busy timeout helps, as the transaction's snapshot is stale. With
/// the lock taken first, others wait for this transaction instead (up to their busy timeout).
/// Nested in a transaction already open, it is a savepoint, as [`Connection::transaction`].
/// On PostgreSQL and MySQL, which lock rows rather than the database, it is
/// [`Connection::transaction`].
///
/// ```
/// # fn main() -> Result<(), outbox_diesel::Error> {
/// # use diesel::connection::SimpleConnection;
/// # use outbox_diesel::{outbox_handler, Context, Handler, ProcessError};
/// # #[outbox_handler("doc.write_transaction")]
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct ThankYou { member_id: i64 }
/// # impl Handler for ThankYou {
/// #     fn process(self, _: &mut Context<'_>) -> Result<(), ProcessError> { Ok(()) }
/// # }
/// use outbox_diesel::{write_transaction, Enqueue};
///
/// let mut conn = outbox_diesel::establish::<diesel::SqliteConnection>(":memory:")?;
/// outbox_diesel::run_migrations(&mut conn)?;
/// # conn.batch_execute("CREATE TABLE members (id INTEGER PRIMARY KEY)")?;
/// write_transaction(&mut conn, |conn| {
///     diesel::sql_query("INSERT INTO members (id) VALUES (7)").execute(conn)?;
///     ThankYou { member_id: 7 }.enqueue(conn)?;
///     Ok::<_, outbox_diesel::Error>(())
/// })?;
/// # Ok(())
/// # }
/// # use diesel::RunQueryDsl;
/// ```
pub fn write_transaction<C, T, E, F>(conn: &mut C, body: F) -> Result<T, E>
where
    C: OutboxConnection + Connection,
    F: FnOnce(&mut C) -> Result<T, E>,
    E: From<diesel::result::Error>,
{
    #[cfg(feature = "sqlite")]
    if sqlite::begin_immediate(conn)? {
        let result = body(conn);
        return match result {
            Ok(value) => {
                sqlite::commit(conn)?;
                Ok(value)
            }
            Err(error) => {
                sqlite::rollback(conn)?;
                Err(error)
            }
        };
    }
    conn.transaction(body)
}

/// The SQLite transaction, run on the `SqliteConnection` inside the caller's connection (an
/// enum's transaction manager reads the state of its variant's, so a nested
/// `transaction` in `body` sees this one open).
#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    use diesel::QueryResult;
    use diesel::SqliteConnection;

    use crate::connection::{BackendConnection, OutboxConnection};

    fn inner<C: OutboxConnection>(conn: &mut C) -> Option<&mut SqliteConnection> {
        #[allow(unreachable_patterns)] // with the sqlite feature alone
        match conn.backend_connection() {
            BackendConnection::Sqlite(inner) => Some(inner),
            _ => None,
        }
    }

    /// Begins the outermost transaction with `BEGIN IMMEDIATE`; false when the connection is
    /// not SQLite's or a transaction is open already.
    pub(super) fn begin_immediate<C: OutboxConnection>(conn: &mut C) -> QueryResult<bool> {
        let Some(inner) = inner(conn) else {
            return Ok(false);
        };
        if crate::sql::transaction_open(inner)? {
            return Ok(false);
        }
        AnsiTransactionManager::begin_transaction_sql(inner, "BEGIN IMMEDIATE")?;
        Ok(true)
    }

    pub(super) fn commit<C: OutboxConnection>(conn: &mut C) -> QueryResult<()> {
        match inner(conn) {
            Some(inner) => AnsiTransactionManager::commit_transaction(inner),
            None => Ok(()),
        }
    }

    pub(super) fn rollback<C: OutboxConnection>(conn: &mut C) -> QueryResult<()> {
        match inner(conn) {
            Some(inner) => AnsiTransactionManager::rollback_transaction(inner),
            None => Ok(()),
        }
    }
}
