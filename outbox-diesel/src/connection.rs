//! Which backend a connection talks to, and the SQL that differs between them.

#[cfg(feature = "mysql")]
use diesel::mysql::MysqlConnection;
#[cfg(feature = "postgres")]
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, Text};
#[cfg(feature = "sqlite")]
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryResult, RunQueryDsl};

pub(crate) mod sealed {
    /// Implemented only by this crate and [`impl_outbox_connection!`](crate::impl_outbox_connection).
    pub trait Sealed {}
}

/// A Diesel connection the outbox can write through: `PgConnection`, `MysqlConnection`,
/// `SqliteConnection` (each behind its cargo feature), an r2d2 pooled connection of one, or a
/// connection enum made with Diesel's `#[derive(MultiConnection)]` and
/// [`impl_outbox_connection!`](crate::impl_outbox_connection).
///
/// The trait is sealed: the SQL the outbox runs is written and tested for these backends only.
pub trait OutboxConnection: sealed::Sealed {
    #[doc(hidden)]
    fn backend_connection(&mut self) -> BackendConnection<'_>;

    /// Which database this connection talks to.
    fn backend(&mut self) -> Backend {
        match self.backend_connection() {
            #[cfg(feature = "postgres")]
            BackendConnection::Pg(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            BackendConnection::Mysql(_) => Backend::Mysql,
            #[cfg(feature = "sqlite")]
            BackendConnection::Sqlite(_) => Backend::Sqlite,
        }
    }
}

/// Makes a connection enum derived with Diesel's `#[derive(MultiConnection)]` an
/// [`OutboxConnection`], so messages are enqueued through it (and its transaction) directly.
/// Name the enum and its variants, each holding a `PgConnection`, `MysqlConnection` or
/// `SqliteConnection`; variants may carry `#[cfg(..)]` attributes.
///
/// ```
/// # use diesel::SqliteConnection;
/// #[derive(diesel::MultiConnection)]
/// enum AnyConnection {
///     Sqlite(SqliteConnection),
/// }
///
/// outbox_diesel::impl_outbox_connection!(AnyConnection { Sqlite });
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! impl_outbox_connection {
    ($connection:ty { $($(#[$attr:meta])* $variant:ident),+ $(,)? }) => {
        impl $crate::__private::Sealed for $connection {}

        impl $crate::OutboxConnection for $connection {
            fn backend_connection(&mut self) -> $crate::__private::BackendConnection<'_> {
                match self {
                    $(
                        $(#[$attr])*
                        Self::$variant(inner) => $crate::OutboxConnection::backend_connection(inner),
                    )+
                }
            }
        }
    };
}

/// The database products the outbox supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 or MariaDB 10.6+.
    Mysql,
    /// SQLite.
    Sqlite,
}

/// The concrete connection behind an [`OutboxConnection`]; matching on it gives every backend
/// its own SQL while the logic around it is written once.
#[doc(hidden)]
#[allow(missing_debug_implementations)]
pub enum BackendConnection<'a> {
    #[cfg(feature = "postgres")]
    Pg(&'a mut PgConnection),
    #[cfg(feature = "mysql")]
    Mysql(&'a mut MysqlConnection),
    #[cfg(feature = "sqlite")]
    Sqlite(&'a mut SqliteConnection),
}

#[cfg(feature = "postgres")]
impl sealed::Sealed for PgConnection {}
#[cfg(feature = "postgres")]
impl OutboxConnection for PgConnection {
    fn backend_connection(&mut self) -> BackendConnection<'_> {
        BackendConnection::Pg(self)
    }
}

#[cfg(feature = "mysql")]
impl sealed::Sealed for MysqlConnection {}
#[cfg(feature = "mysql")]
impl OutboxConnection for MysqlConnection {
    fn backend_connection(&mut self) -> BackendConnection<'_> {
        BackendConnection::Mysql(self)
    }
}

#[cfg(feature = "sqlite")]
impl sealed::Sealed for SqliteConnection {}
#[cfg(feature = "sqlite")]
impl OutboxConnection for SqliteConnection {
    fn backend_connection(&mut self) -> BackendConnection<'_> {
        BackendConnection::Sqlite(self)
    }
}

impl<C> sealed::Sealed for PooledConnection<ConnectionManager<C>> where
    C: OutboxConnection + R2D2Connection + Send + 'static
{
}
impl<C> OutboxConnection for PooledConnection<ConnectionManager<C>>
where
    C: OutboxConnection + R2D2Connection + Send + 'static,
{
    fn backend_connection(&mut self) -> BackendConnection<'_> {
        (**self).backend_connection()
    }
}

/// The SQL fragments that differ between backends.
#[derive(Debug)]
pub(crate) struct Dialect {
    /// Placeholder for the n-th bind parameter (1-based).
    pub placeholder: fn(usize) -> String,
    /// Bind parameters one statement may carry.
    pub max_binds: usize,
    /// The columns an insert names, in the order of `insert_values`.
    pub insert_columns: &'static str,
    /// The VALUES tuple of one inserted message, given its five placeholders
    /// (message id, type, payload, ordering key, not-before in µs since the epoch or NULL).
    pub insert_values: fn(&[&str; 5]) -> String,
    /// The current time, in the type of the time columns.
    pub now: &'static str,
    /// What makes a SELECT lock its rows (nothing on SQLite, whose write transactions lock the
    /// whole database).
    pub for_update: &'static str,
    /// A bind parameter holding a UUID as text, in the type of the UUID columns.
    pub uuid_param: fn(&str) -> String,
    /// The current time plus the microseconds in the given bind parameter.
    pub now_plus_micros: fn(&str) -> String,
    /// Records a webhook id (one bind) in the inbox unless it is there; changes 1 row or 0.
    #[cfg_attr(not(feature = "webhook"), allow(dead_code))]
    pub inbox_insert: &'static str,
    /// A UUID column as text.
    pub uuid_text: fn(&str) -> String,
    /// A JSON column as text.
    pub json_text: fn(&str) -> String,
    /// A time column as microseconds since the Unix epoch (BIGINT).
    pub epoch_micros: fn(&str) -> String,
    /// Where the worker's own transactions (claims, settlements) may commit without waiting
    /// for the log flush: the statement that says so inside a transaction, and a `USING` item
    /// that says so from within a single `DELETE`. Losing such a commit in a database crash
    /// only undoes a lease or a settlement, so the message runs again: at-least-once holds,
    /// and the worker stops waiting for a flush per batch.
    pub async_commit_statement: Option<&'static str>,
    pub async_commit_using: &'static str,
}

/// A one-row relation whose reading turns off `synchronous_commit` for the current transaction
/// (`set_config(.., true)`), which for a single statement is the statement's own: joined into
/// it, the statement's commit does not wait for the WAL flush.
#[cfg(feature = "postgres")]
macro_rules! pg_async_commit {
    () => {
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
    };
}
#[cfg(feature = "postgres")]
pub(crate) use pg_async_commit;

#[cfg(feature = "postgres")]
pub(crate) const POSTGRES: Dialect = Dialect {
    placeholder: |n| format!("${n}"),
    max_binds: 65_535,
    insert_columns: "message_id, message_type, payload, ordering_key, next_attempt_at",
    insert_values: |[id, kind, payload, key, not_before]| {
        format!(
            "({id}::uuid, {kind}, {payload}::jsonb, {key}, \
             COALESCE(TIMESTAMPTZ 'epoch' + {not_before} * INTERVAL '1 microsecond', now()))"
        )
    },
    now: "now()",
    for_update: " FOR UPDATE",
    uuid_param: |param| format!("{param}::uuid"),
    now_plus_micros: |param| format!("now() + {param} * INTERVAL '1 microsecond'"),
    inbox_insert: "INSERT INTO outbox_inbox (webhook_id) VALUES ($1) ON CONFLICT DO NOTHING",
    uuid_text: |column| format!("{column}::text"),
    json_text: |column| format!("{column}::text"),
    epoch_micros: |column| format!("(EXTRACT(EPOCH FROM {column}) * 1000000)::BIGINT"),
    async_commit_statement: Some("SET LOCAL synchronous_commit = off"),
    async_commit_using: concat!(" USING ", pg_async_commit!()),
};

#[cfg(feature = "mysql")]
pub(crate) const MYSQL: Dialect = Dialect {
    placeholder: |_| "?".to_owned(),
    max_binds: 65_535,
    // The column default would be in the session's time zone, so created_at is written in UTC.
    insert_columns: "message_id, message_type, payload, ordering_key, created_at, next_attempt_at",
    insert_values: |[id, kind, payload, key, not_before]| {
        format!(
            "({id}, {kind}, {payload}, {key}, UTC_TIMESTAMP(6), \
             COALESCE(TIMESTAMPADD(MICROSECOND, {not_before}, '1970-01-01'), UTC_TIMESTAMP(6)))"
        )
    },
    now: "UTC_TIMESTAMP(6)",
    for_update: " FOR UPDATE",
    uuid_param: |param| param.to_owned(),
    now_plus_micros: |param| format!("TIMESTAMPADD(MICROSECOND, {param}, UTC_TIMESTAMP(6))"),
    inbox_insert: "INSERT IGNORE INTO outbox_inbox (webhook_id, received_at) \
                   VALUES (?, UTC_TIMESTAMP(6))",
    uuid_text: |column| column.to_owned(),
    json_text: |column| format!("CAST({column} AS CHAR)"),
    epoch_micros: |column| format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {column})"),
    // innodb_flush_log_at_trx_commit is global: the server's choice, not the worker's.
    async_commit_statement: None,
    async_commit_using: "",
};

#[cfg(feature = "sqlite")]
pub(crate) const SQLITE: Dialect = Dialect {
    placeholder: |_| "?".to_owned(),
    // SQLITE_MAX_VARIABLE_NUMBER of the bundled (3.32+) library.
    max_binds: 32_766,
    insert_columns: "message_id, message_type, payload, ordering_key, next_attempt_at",
    insert_values: |[id, kind, payload, key, not_before]| {
        format!(
            "({id}, {kind}, {payload}, {key}, \
             COALESCE(strftime('%Y-%m-%d %H:%M:%f', {not_before} / 1000000.0, 'unixepoch'), \
                      strftime('%Y-%m-%d %H:%M:%f', 'now')))"
        )
    },
    now: "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    for_update: "",
    uuid_param: |param| param.to_owned(),
    now_plus_micros: |param| {
        format!(
            "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', {param} / 1000000.0))"
        )
    },
    inbox_insert: "INSERT OR IGNORE INTO outbox_inbox (webhook_id) VALUES (?)",
    uuid_text: |column| column.to_owned(),
    json_text: |column| column.to_owned(),
    epoch_micros: |column| {
        format!("CAST(ROUND((julianday({column}) - 2440587.5) * 86400000.0) AS INTEGER) * 1000")
    },
    // WAL with synchronous = NORMAL (PoolCustomizer) already commits without a sync.
    async_commit_statement: None,
    async_commit_using: "",
};

impl BackendConnection<'_> {
    pub(crate) fn dialect(&self) -> &'static Dialect {
        match self {
            #[cfg(feature = "postgres")]
            BackendConnection::Pg(_) => &POSTGRES,
            #[cfg(feature = "mysql")]
            BackendConnection::Mysql(_) => &MYSQL,
            #[cfg(feature = "sqlite")]
            BackendConnection::Sqlite(_) => &SQLITE,
        }
    }
}

/// A bind parameter of one of the few SQL types the outbox's statements take.
pub(crate) enum Bind<'a> {
    Text(&'a str),
    BigInt(i64),
    NullableText(Option<&'a str>),
    NullableBigInt(Option<i64>),
}

/// A statement Diesel may prepare once per connection and reuse, which it never does for
/// `sql_query`: PostgreSQL then skips parsing and planning, MySQL the prepare and close round
/// trips, SQLite `sqlite3_prepare`. Only for texts that do not vary with the data (each text
/// is kept prepared for the connection's lifetime). Binds are written `?` in the text on every
/// backend; the text must hold no other `?`.
pub(crate) struct CachedStatement<'a> {
    sql: &'a str,
    binds: &'a [Bind<'a>],
}

impl<'a> CachedStatement<'a> {
    pub(crate) fn new(sql: &'a str, binds: &'a [Bind<'a>]) -> Self {
        CachedStatement { sql, binds }
    }
}

impl<DB> diesel::query_builder::QueryFragment<DB> for CachedStatement<'_>
where
    DB: diesel::backend::Backend
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<BigInt>,
    str: ToSql<Text, DB>,
    i64: ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        let mut pieces = self.sql.split('?');
        if let Some(first) = pieces.next() {
            out.push_sql(first);
        }
        let mut binds = self.binds.iter();
        for piece in pieces {
            let bind = binds.next().ok_or_else(|| {
                diesel::result::Error::QueryBuilderError("more `?` than binds".into())
            })?;
            match bind {
                Bind::Text(text) => out.push_bind_param::<Text, str>(*text)?,
                Bind::BigInt(n) => out.push_bind_param::<BigInt, i64>(n)?,
                Bind::NullableText(text) => {
                    out.push_bind_param::<diesel::sql_types::Nullable<Text>, _>(text)?
                }
                Bind::NullableBigInt(n) => {
                    out.push_bind_param::<diesel::sql_types::Nullable<BigInt>, _>(n)?
                }
            }
            out.push_sql(piece);
        }
        if binds.next().is_some() {
            return Err(diesel::result::Error::QueryBuilderError(
                "more binds than `?`".into(),
            ));
        }
        Ok(())
    }
}

impl diesel::query_builder::QueryId for CachedStatement<'_> {
    type QueryId = ();
    // Cached by its text, not its type: every statement shares this type.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Conn> RunQueryDsl<Conn> for CachedStatement<'_> {}

/// Raw SQL with [`Bind`] parameters on a concrete connection, so statements that differ only in
/// their dialect fragments are written once.
pub(crate) trait RawSql: Sized {
    /// Runs a statement, returning the rows it changed.
    fn run(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize>;
    /// Runs a query whose single column is a BIGINT named `id`.
    fn ids(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<i64>>;
    /// A transaction that will write: on SQLite it takes the write lock at once (`BEGIN
    /// IMMEDIATE`), so it waits for the busy timeout instead of failing on a lock upgrade.
    /// Inside an open transaction it is a savepoint of that transaction.
    fn write_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T>;
}

macro_rules! raw_sql {
    ($connection:ty, $transaction:ident) => {
        impl RawSql for $connection {
            fn run(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize> {
                bound(sql, binds).execute(self)
            }

            fn ids(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<i64>> {
                let rows: Vec<crate::store::IdRow> = bound(sql, binds).load(self)?;
                Ok(rows.into_iter().map(|row| row.id).collect())
            }

            fn write_transaction<T>(
                &mut self,
                body: impl FnOnce(&mut Self) -> QueryResult<T>,
            ) -> QueryResult<T> {
                use diesel::connection::{AnsiTransactionManager, TransactionManager};
                let depth = AnsiTransactionManager::transaction_manager_status_mut(self)
                    .transaction_depth()?;
                if depth.is_some() {
                    // Inside the caller's transaction: a savepoint, and the caller's locks.
                    self.transaction(body)
                } else {
                    self.$transaction(body)
                }
            }
        }
    };
}

fn bound<'a, DB>(
    sql: &'a str,
    binds: &[Bind<'a>],
) -> diesel::query_builder::BoxedSqlQuery<'a, DB, diesel::query_builder::SqlQuery>
where
    DB: diesel::backend::Backend
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<BigInt>,
    &'a str: ToSql<Text, DB>,
    i64: ToSql<BigInt, DB>,
{
    let mut query = diesel::sql_query(sql).into_boxed::<DB>();
    for bind in binds {
        query = match *bind {
            Bind::Text(text) => query.bind::<Text, _>(text),
            Bind::BigInt(n) => query.bind::<BigInt, _>(n),
            Bind::NullableText(text) => query.bind::<diesel::sql_types::Nullable<Text>, _>(text),
            Bind::NullableBigInt(n) => query.bind::<diesel::sql_types::Nullable<BigInt>, _>(n),
        };
    }
    query
}

#[cfg(feature = "postgres")]
raw_sql!(PgConnection, transaction);
#[cfg(feature = "mysql")]
raw_sql!(MysqlConnection, transaction);
#[cfg(feature = "sqlite")]
raw_sql!(SqliteConnection, immediate_transaction);

/// Runs `$body` once per backend arm with `$conn` bound to the concrete connection, so code that
/// must type-check against each backend is still written once.
macro_rules! with_backend {
    ($connection:expr, $conn:ident => $body:expr) => {
        match $connection {
            #[cfg(feature = "postgres")]
            $crate::connection::BackendConnection::Pg($conn) => $body,
            #[cfg(feature = "mysql")]
            $crate::connection::BackendConnection::Mysql($conn) => $body,
            #[cfg(feature = "sqlite")]
            $crate::connection::BackendConnection::Sqlite($conn) => $body,
        }
    };
}
pub(crate) use with_backend;

/// How long an SQLite connection waits for the write lock before failing with "busy".
pub(crate) const SQLITE_BUSY_TIMEOUT_MS: u32 = 5000;

/// Settings an r2d2 pool's connections need for the outbox, applied as each connection opens:
/// on SQLite a busy timeout (so the worker and the application wait for each other's write
/// transactions instead of failing with "database is locked") and WAL journaling (readers do
/// not block the writer); nothing on the other backends.
///
/// ```
/// # use diesel::r2d2::{ConnectionManager, Pool};
/// # use diesel::SqliteConnection;
/// let pool = Pool::builder()
///     .connection_customizer(Box::new(outbox_diesel::PoolCustomizer))
///     .build(ConnectionManager::<SqliteConnection>::new("file:quickstart?mode=memory&cache=shared"))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolCustomizer;

impl<C> diesel::r2d2::CustomizeConnection<C, diesel::r2d2::Error> for PoolCustomizer
where
    C: OutboxConnection + Connection + 'static,
{
    fn on_acquire(&self, conn: &mut C) -> Result<(), diesel::r2d2::Error> {
        if conn.backend() == Backend::Sqlite {
            conn.batch_execute(&format!(
                "PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}; PRAGMA journal_mode = WAL; \
                 PRAGMA synchronous = NORMAL;"
            ))
            .map_err(diesel::r2d2::Error::QueryError)?;
        }
        Ok(())
    }
}
