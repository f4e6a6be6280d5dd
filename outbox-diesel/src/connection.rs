//! Which backend a connection talks to: the [`Backend`]s, the sealed [`OutboxConnection`]
//! trait and the concrete connection behind it.

#[cfg(feature = "mysql")]
use diesel::mysql::MysqlConnection;
#[cfg(feature = "postgres")]
use diesel::pg::PgConnection;
use diesel::r2d2::{ManageConnection, PooledConnection};
#[cfg(feature = "sqlite")]
use diesel::sqlite::SqliteConnection;
use diesel::QueryResult;

/// The database products the outbox supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// MySQL 8 or MariaDB 10.6+.
    Mysql,
    /// SQLite.
    Sqlite,
}

impl Backend {
    /// Every backend, whether compiled in or not.
    pub const ALL: [Backend; 3] = [Backend::Postgres, Backend::Mysql, Backend::Sqlite];

    /// The backend's short name: `postgres`, `mysql` or `sqlite`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Sqlite => "sqlite",
        }
    }

    /// The cargo feature of `outbox-diesel` that supports this backend.
    pub fn feature(self) -> &'static str {
        self.name()
    }

    /// Whether this build of `outbox-diesel` has the backend's feature.
    pub fn is_compiled_in(self) -> bool {
        match self {
            Backend::Postgres => cfg!(feature = "postgres"),
            Backend::Mysql => cfg!(feature = "mysql"),
            Backend::Sqlite => cfg!(feature = "sqlite"),
        }
    }
}

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
/// [`OutboxConnection`], so messages are enqueued through it (and its transaction) directly,
/// and [`Establish`](crate::Establish), so that [`establish`](crate::establish) and
/// [`OutboxManager`](crate::OutboxManager) open the variant a URL's scheme names (and only
/// that one). Name the enum and its variants, each holding a `PgConnection`,
/// `MysqlConnection` or `SqliteConnection`; variants may carry `#[cfg(..)]` attributes.
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

        impl $crate::Establish for $connection {
            fn establish_backend(
                url: &$crate::DatabaseUrl,
            ) -> ::core::option::Option<$crate::__private::ConnectionResult<Self>> {
                $(
                    $(#[$attr])*
                    if let ::core::option::Option::Some(opened) =
                        $crate::__private::establish_variant(url, Self::$variant)
                    {
                        return ::core::option::Option::Some(opened);
                    }
                )+
                ::core::option::Option::None
            }
        }
    };
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

impl<M> sealed::Sealed for PooledConnection<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
}
impl<M> OutboxConnection for PooledConnection<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    fn backend_connection(&mut self) -> BackendConnection<'_> {
        (**self).backend_connection()
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

/// Runs statements without results or binds on any outbox connection.
pub(crate) fn execute_batch<C: OutboxConnection + ?Sized>(
    conn: &mut C,
    sql: &str,
) -> QueryResult<()> {
    use diesel::connection::SimpleConnection;
    with_backend!(conn.backend_connection(), c => c.batch_execute(sql))
}
