//! Which backend a connection talks to, and the SQL that differs between them.

#[cfg(feature = "mysql")]
use diesel::mysql::MysqlConnection;
#[cfg(feature = "postgres")]
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection};
#[cfg(feature = "sqlite")]
use diesel::sqlite::SqliteConnection;

mod sealed {
    pub trait Sealed {}
}

/// A Diesel connection the outbox can write through: `PgConnection`, `MysqlConnection`,
/// `SqliteConnection` (each behind its cargo feature), or an r2d2 pooled connection of one.
///
/// The trait is sealed: the SQL the outbox runs is written and tested for these backends only.
pub trait OutboxConnection: sealed::Sealed {
    #[doc(hidden)]
    fn backend_connection(&mut self) -> BackendConnection<'_>;
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
    pub insert_values: fn(&[String; 5]) -> String,
    /// The current time, in the type of the time columns.
    pub now: &'static str,
    /// A UUID column as text.
    pub uuid_text: fn(&str) -> String,
    /// A JSON column as text.
    pub json_text: fn(&str) -> String,
    /// A time column as microseconds since the Unix epoch (BIGINT).
    pub epoch_micros: fn(&str) -> String,
}

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
    uuid_text: |column| format!("{column}::text"),
    json_text: |column| format!("{column}::text"),
    epoch_micros: |column| format!("(EXTRACT(EPOCH FROM {column}) * 1000000)::BIGINT"),
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
    uuid_text: |column| column.to_owned(),
    json_text: |column| format!("CAST({column} AS CHAR)"),
    epoch_micros: |column| format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {column})"),
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
    uuid_text: |column| column.to_owned(),
    json_text: |column| column.to_owned(),
    epoch_micros: |column| {
        format!("CAST(ROUND((julianday({column}) - 2440587.5) * 86400000.0) AS INTEGER) * 1000")
    },
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
