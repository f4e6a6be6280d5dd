//! Opening a database: which backend a URL names, and the settings each connection needs.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use diesel::r2d2::{ManageConnection, R2D2Connection};
use diesel::{ConnectionError, ConnectionResult};
use percent_encoding::percent_decode_str;

use crate::connection::{execute_batch, Backend, OutboxConnection};
use crate::error::{Error, Result};

impl Backend {
    /// The backend a database URL names; see [`DatabaseUrl::parse`].
    pub fn from_url(url: &str) -> Result<Backend> {
        DatabaseUrl::parse(url).map(|url| url.backend())
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;

    /// `postgres` (or `postgresql`, `pg`), `mysql` (or `mariadb`), `sqlite`.
    fn from_str(name: &str) -> Result<Backend> {
        match name.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" | "pg" => Ok(Backend::Postgres),
            "mysql" | "mariadb" => Ok(Backend::Mysql),
            "sqlite" => Ok(Backend::Sqlite),
            _ => Err(Error::UnknownBackend(name.to_owned())),
        }
    }
}

/// A database URL, with the backend its scheme names.
///
/// - `postgres://…` and `postgresql://…`: PostgreSQL.
/// - `mysql://…` (MariaDB too): MySQL.
/// - `sqlite://PATH`, `sqlite:PATH`, `file:PATH?…` (an SQLite URI), `:memory:`, or a plain path
///   without a scheme: SQLite.
///
/// Anything else is refused, so that a typo such as `postgre://…` is an error instead of an
/// SQLite file named after the URL (which is what Diesel's `MultiConnection` would open).
/// `Display` shows the URL without its password.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    /// What the backend's driver is given: the URL, or for SQLite the path or `file:` URI.
    target: String,
}

impl DatabaseUrl {
    /// Reads the backend from the URL's scheme.
    pub fn parse(url: &str) -> Result<DatabaseUrl> {
        let url = url.trim();
        let (backend, target) =
            if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                (Backend::Postgres, url)
            } else if url.starts_with("mysql://") {
                (Backend::Mysql, url)
            } else if let Some(path) = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
            {
                (Backend::Sqlite, path)
            } else if is_keyword_string(url) {
                return Err(Error::KeywordConnectionString);
            } else if url.starts_with("file:") || (!url.is_empty() && !url.contains("://")) {
                (Backend::Sqlite, url)
            } else {
                return Err(Error::UnsupportedUrl(redact(url)));
            };
        if target.is_empty() {
            return Err(Error::UnsupportedUrl(redact(url)));
        }
        Ok(DatabaseUrl {
            backend,
            target: target.to_owned(),
        })
    }

    /// The backend the URL names.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// What the backend's driver opens: the URL itself, or for SQLite the file path (or `file:`
    /// URI) without any `sqlite://` prefix.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// What the driver is given: [`target`](Self::target), and for PostgreSQL TCP keepalives
    /// and a TCP user timeout unless the URL sets them, so that a connection whose peer
    /// vanished (a half-open connection after a network fault) fails within about a minute
    /// instead of the system's retransmission timeout (about 15 minutes).
    pub(crate) fn driver_target(&self) -> std::borrow::Cow<'_, str> {
        if self.backend != Backend::Postgres {
            return std::borrow::Cow::Borrowed(&self.target);
        }
        let given: Vec<&str> = self
            .target
            .split_once('?')
            .map(|(_, query)| {
                query
                    .split('&')
                    .filter_map(|pair| pair.split('=').next())
                    .collect()
            })
            .unwrap_or_default();
        let mut target = self.target.clone();
        for (name, value) in PG_KEEPALIVES {
            if given.contains(&name) {
                continue;
            }
            target.push(if target.contains('?') { '&' } else { '?' });
            target.push_str(name);
            target.push('=');
            target.push_str(value);
        }
        std::borrow::Cow::Owned(target)
    }

    /// The SQLite file this URL names, if it names one on disk.
    pub fn sqlite_file(&self) -> Option<&str> {
        (self.backend == Backend::Sqlite
            && self.target != ":memory:"
            && !self.target.starts_with("file:"))
        .then_some(self.target.as_str())
    }

    /// `text` with this URL's password replaced, for error messages that may repeat it: the
    /// password as written in the URL and percent-decoded, from the user information or a
    /// `password` query parameter.
    pub fn redact_in(&self, text: &str) -> String {
        let mut secrets: Vec<String> = Vec::new();
        for range in secret_ranges(&self.target) {
            let raw = &self.target[range];
            secrets.push(raw.to_owned());
            secrets.push(percent_decode_str(raw).decode_utf8_lossy().into_owned());
        }
        // Longest first, so that a secret containing another is replaced whole.
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        secrets
            .iter()
            .filter(|secret| !secret.is_empty())
            .fold(text.to_owned(), |text, secret| {
                text.replace(secret.as_str(), "***")
            })
    }
}

impl FromStr for DatabaseUrl {
    type Err = Error;

    fn from_str(url: &str) -> Result<DatabaseUrl> {
        DatabaseUrl::parse(url)
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.target))
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseUrl")
            .field("backend", &self.backend)
            .field("url", &redact(&self.target))
            .finish()
    }
}

/// Where a URL keeps secrets, as byte ranges: the password of `scheme://user:password@host/…`
/// and the value of a `password=` query parameter (which libpq reads too).
fn secret_ranges(url: &str) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return ranges;
    };
    let query_at = url[scheme_end..].find(['?', '#']).map(|at| scheme_end + at);
    let head = &url[scheme_end..query_at.unwrap_or(url.len())];
    // The last `@` before the query ends the user information: an unencoded `@` in a password
    // is then part of the password, as libpq reads it.
    if let Some(at) = head.rfind('@') {
        if let Some(colon) = head[..at].find(':') {
            ranges.push(scheme_end + colon + 1..scheme_end + at);
        }
    }
    if let Some(query_at) = query_at.filter(|at| url[*at..].starts_with('?')) {
        let mut start = query_at + 1;
        let query_end = url[start..].find('#').map_or(url.len(), |at| start + at);
        for pair in url[start..query_end].split('&') {
            if let Some(value) = pair.strip_prefix("password=") {
                let value_start = start + "password=".len();
                ranges.push(value_start..value_start + value.len());
            }
            start += pair.len() + 1;
        }
    }
    ranges
}

/// The URL with its secrets replaced by `***`.
/// libpq's TCP settings for connections the outbox opens, unless the URL gives them: probes
/// after 30 s idle, every 10 s, 3 unanswered ones end the connection; data unacknowledged for
/// 60 s ends it too.
const PG_KEEPALIVES: [(&str, &str); 5] = [
    ("keepalives", "1"),
    ("keepalives_idle", "30"),
    ("keepalives_interval", "10"),
    ("keepalives_count", "3"),
    ("tcp_user_timeout", "60000"),
];

/// Whether `text` is a libpq keyword/value connection string (`host=db user=app
/// password=… dbname=shop`) rather than a path: a path never holds such a pair, while one
/// such string taken for an SQLite path would create a file named after its password.
fn is_keyword_string(text: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslrootcert",
        "application_name",
        "connect_timeout",
        "options",
        "service",
        "target_session_attrs",
    ];
    text.split_whitespace().any(|pair| {
        pair.split_once('=')
            .is_some_and(|(key, _)| KEYWORDS.contains(&key.to_ascii_lowercase().as_str()))
    })
}

fn redact(url: &str) -> String {
    let mut shown = url.to_owned();
    let mut ranges = secret_ranges(url);
    ranges.sort_by_key(|range| std::cmp::Reverse(range.start));
    for range in ranges.into_iter().filter(|range| !range.is_empty()) {
        shown.replace_range(range, "***");
    }
    shown
}

/// How long an SQLite connection waits for another's write lock before failing with "database
/// is locked": the worker and the application take turns instead of failing.
pub(crate) const SQLITE_BUSY_TIMEOUT_MS: u32 = 5000;

/// The size an SQLite write-ahead log is cut back to once a checkpoint has emptied it. A reader
/// that holds a snapshot stops checkpoints from reaching the log's end, so the log grows while it
/// lives (22 MB/s under the latency benchmark); without a limit the file keeps that size after
/// the reader ends.
pub(crate) const SQLITE_JOURNAL_SIZE_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

/// Applies what every connection the outbox uses needs. On SQLite: a busy timeout, WAL
/// journaling (readers do not block the writer), `synchronous = NORMAL` (no sync per commit
/// in WAL mode; a power loss may undo the last commits, an application crash never) and a
/// journal size limit (the log shrinks back after a long reader). Nothing on the other backends.
pub fn configure_connection<C: OutboxConnection>(conn: &mut C) -> diesel::QueryResult<()> {
    if conn.backend() == Backend::Sqlite {
        execute_batch(
            conn,
            &format!(
                "PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}; PRAGMA journal_mode = WAL; \
                 PRAGMA synchronous = NORMAL; \
                 PRAGMA journal_size_limit = {SQLITE_JOURNAL_SIZE_LIMIT_BYTES};"
            ),
        )?;
    }
    Ok(())
}

/// Sets only the SQLite busy timeout (a connection someone else configured may lack it).
pub(crate) fn ensure_busy_timeout<C: OutboxConnection>(conn: &mut C) -> diesel::QueryResult<()> {
    if conn.backend() == Backend::Sqlite {
        execute_batch(
            conn,
            &format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}"),
        )?;
    }
    Ok(())
}

/// A connection type the outbox can open from a [`DatabaseUrl`]: `PgConnection`,
/// `MysqlConnection`, `SqliteConnection`, or a Diesel `MultiConnection` enum made an
/// [`OutboxConnection`] with [`impl_outbox_connection!`](crate::impl_outbox_connection), which
/// opens the variant the URL's scheme names.
pub trait Establish: OutboxConnection + Sized {
    #[doc(hidden)]
    /// Opens `url` if this type has a variant for its backend; `None` if it has not.
    fn establish_backend(url: &DatabaseUrl) -> Option<ConnectionResult<Self>>;
}

#[doc(hidden)]
/// For [`impl_outbox_connection!`](crate::impl_outbox_connection): opens `url` through the
/// variant whose constructor is `variant`, if its connection type serves the URL's backend.
pub fn establish_variant<I: Establish, E>(
    url: &DatabaseUrl,
    variant: fn(I) -> E,
) -> Option<ConnectionResult<E>> {
    I::establish_backend(url).map(|opened| opened.map(variant))
}

macro_rules! establish_concrete {
    ($feature:literal, $connection:ty, $backend:expr) => {
        #[cfg(feature = $feature)]
        impl Establish for $connection {
            fn establish_backend(url: &DatabaseUrl) -> Option<ConnectionResult<Self>> {
                (url.backend() == $backend)
                    .then(|| <$connection as diesel::Connection>::establish(&url.driver_target()))
            }
        }
    };
}

establish_concrete!("postgres", diesel::PgConnection, Backend::Postgres);
establish_concrete!("mysql", diesel::MysqlConnection, Backend::Mysql);
establish_concrete!("sqlite", diesel::SqliteConnection, Backend::Sqlite);

/// Opens the database `url` names as a `C` (a backend's connection, or a `MultiConnection`
/// enum), with the settings the outbox needs ([`configure_connection`]).
///
/// Fails with [`Error::UnsupportedUrl`] for a scheme no backend serves, with
/// [`Error::BackendNotCompiledIn`] when `C` has no connection for the URL's backend, and with
/// [`Error::Connect`] when the server cannot be reached (the message never shows the URL's
/// password).
///
/// ```
/// let mut conn: diesel::SqliteConnection = outbox_diesel::establish(":memory:")?;
/// outbox_diesel::run_migrations(&mut conn)?;
/// # Ok::<(), outbox_diesel::Error>(())
/// ```
pub fn establish<C: Establish>(url: &str) -> Result<C> {
    DatabaseUrl::parse(url)?.establish()
}

impl DatabaseUrl {
    /// Opens this database as a `C`; see [`establish`].
    pub fn establish<C: Establish>(&self) -> Result<C> {
        let opened = C::establish_backend(self).ok_or(Error::BackendNotCompiledIn {
            backend: self.backend(),
            connection: std::any::type_name::<C>(),
        })?;
        let mut conn = opened.map_err(|error| connect_error(self, &error))?;
        configure_connection(&mut conn).map_err(|error| Error::Connect {
            url: self.to_string(),
            reason: self.redact_in(&error.to_string()),
        })?;
        Ok(conn)
    }
}

fn connect_error(url: &DatabaseUrl, error: &ConnectionError) -> Error {
    Error::Connect {
        url: url.to_string(),
        reason: url.redact_in(error.to_string().trim_end()),
    }
}

/// An r2d2 connection manager that opens the backend the URL names, with the settings the
/// outbox needs; the one way to pool connections of a `MultiConnection` enum, and as good as
/// Diesel's `ConnectionManager` plus [`PoolCustomizer`] for a single backend.
///
/// ```
/// use diesel::r2d2::Pool;
/// use outbox_diesel::OutboxManager;
///
/// let pool = Pool::builder()
///     .max_size(4)
///     .build(OutboxManager::<diesel::SqliteConnection>::new("file:manager-doc?mode=memory&cache=shared")?)?;
/// outbox_diesel::run_migrations(&mut pool.get()?)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OutboxManager<C> {
    url: DatabaseUrl,
    connection: PhantomData<fn() -> C>,
}

impl<C: Establish> OutboxManager<C> {
    /// A manager for `url`; fails at once if no backend serves its scheme or `C` has no
    /// connection for it.
    pub fn new(url: &str) -> Result<Self> {
        let url = DatabaseUrl::parse(url)?;
        Self::for_url(url)
    }

    /// A manager for an already parsed URL.
    pub fn for_url(url: DatabaseUrl) -> Result<Self> {
        if !Backend::is_compiled_in(url.backend()) {
            return Err(Error::BackendNotCompiledIn {
                backend: url.backend(),
                connection: std::any::type_name::<C>(),
            });
        }
        Ok(OutboxManager {
            url,
            connection: PhantomData,
        })
    }

    /// The URL connections are opened to.
    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }
}

impl<C> fmt::Debug for OutboxManager<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxManager")
            .field("url", &self.url)
            .field("connection", &std::any::type_name::<C>())
            .finish()
    }
}

impl<C> ManageConnection for OutboxManager<C>
where
    C: Establish + R2D2Connection + Send + 'static,
{
    type Connection = C;
    type Error = Error;

    fn connect(&self) -> Result<C> {
        self.url.establish()
    }

    fn is_valid(&self, conn: &mut C) -> Result<()> {
        conn.ping().map_err(Error::from)
    }

    fn has_broken(&self, conn: &mut C) -> bool {
        conn.is_broken()
    }
}

/// Applies [`configure_connection`] to each connection of an r2d2 pool of Diesel's own
/// `ConnectionManager` as it opens. ([`OutboxManager`] does this by itself.)
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
    C: OutboxConnection + 'static,
{
    fn on_acquire(&self, conn: &mut C) -> std::result::Result<(), diesel::r2d2::Error> {
        configure_connection(conn).map_err(diesel::r2d2::Error::QueryError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> Option<(Backend, String)> {
        DatabaseUrl::parse(url)
            .ok()
            .map(|url| (url.backend(), url.target().to_owned()))
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_connections_get_wal_a_busy_timeout_and_a_journal_size_limit() {
        use diesel::{Connection, QueryableByName, RunQueryDsl, SqliteConnection};

        #[derive(QueryableByName)]
        struct Setting {
            #[diesel(sql_type = diesel::sql_types::Text)]
            value: String,
        }
        let path = std::env::temp_dir().join(format!(
            "outbox-configure-{}-{}.db",
            std::process::id(),
            SQLITE_JOURNAL_SIZE_LIMIT_BYTES
        ));
        let _ = std::fs::remove_file(&path);
        let mut conn = SqliteConnection::establish(&path.to_string_lossy()).unwrap();
        configure_connection(&mut conn).unwrap();
        let mut setting = |pragma: &str, column: &str| {
            diesel::sql_query(format!(
                "SELECT CAST({column} AS TEXT) AS value FROM pragma_{pragma}"
            ))
            .get_result::<Setting>(&mut conn)
            .unwrap()
            .value
        };
        assert_eq!(setting("journal_mode", "journal_mode"), "wal");
        assert_eq!(
            setting("journal_size_limit", "journal_size_limit"),
            SQLITE_JOURNAL_SIZE_LIMIT_BYTES.to_string()
        );
        assert_eq!(
            setting("busy_timeout", "timeout"),
            SQLITE_BUSY_TIMEOUT_MS.to_string()
        );
        // NORMAL is 1.
        assert_eq!(setting("synchronous", "synchronous"), "1");
        drop(conn);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    #[test]
    fn the_scheme_picks_the_backend() {
        let pg = |t: &str| Some((Backend::Postgres, t.to_owned()));
        assert_eq!(parsed("postgres://u@h/db"), pg("postgres://u@h/db"));
        assert_eq!(parsed("postgresql://u@h/db"), pg("postgresql://u@h/db"));
        assert_eq!(
            parsed(" mysql://root@h:3306/db "),
            Some((Backend::Mysql, "mysql://root@h:3306/db".into()))
        );
        let sqlite = |t: &str| Some((Backend::Sqlite, t.to_owned()));
        assert_eq!(parsed("sqlite:///tmp/x.db"), sqlite("/tmp/x.db"));
        assert_eq!(parsed("sqlite://rel/app"), sqlite("rel/app"));
        assert_eq!(parsed("sqlite:app.db"), sqlite("app.db"));
        assert_eq!(parsed("file:app.db?mode=ro"), sqlite("file:app.db?mode=ro"));
        assert_eq!(parsed(":memory:"), sqlite(":memory:"));
        for path in ["app.db", "/var/x.sqlite", "blog", "C:\\data\\x.db"] {
            assert_eq!(parsed(path), sqlite(path), "{path}");
        }
        for keywords in [
            "host=db password=hunter2 dbname=shop",
            "dbname=shop",
            " user=app  password=x",
            "PASSWORD=x host=db",
        ] {
            let error = DatabaseUrl::parse(keywords).unwrap_err();
            assert!(
                matches!(error, Error::KeywordConnectionString),
                "{keywords:?}: {error}"
            );
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
        for bad in [
            "redis://h/0",
            "",
            "   ",
            "http://x.db",
            "postgre://u@h/db",
            "sqlite://",
        ] {
            assert_eq!(parsed(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn postgres_connections_get_keepalives_unless_the_url_sets_them() {
        let target = |url: &str| {
            DatabaseUrl::parse(url)
                .unwrap()
                .driver_target()
                .into_owned()
        };
        assert_eq!(
            target("postgres://u@h/db"),
            "postgres://u@h/db?keepalives=1&keepalives_idle=30&keepalives_interval=10\
             &keepalives_count=3&tcp_user_timeout=60000"
        );
        let kept = target("postgres://u@h/db?sslmode=require&tcp_user_timeout=5000");
        assert!(kept.starts_with("postgres://u@h/db?sslmode=require&tcp_user_timeout=5000&"));
        assert_eq!(kept.matches("tcp_user_timeout").count(), 1, "{kept}");
        assert_eq!(target("mysql://root@h/db"), "mysql://root@h/db");
        assert_eq!(
            DatabaseUrl::parse("postgres://u@h/db").unwrap().to_string(),
            "postgres://u@h/db",
            "shown as given"
        );
    }

    #[test]
    fn passwords_never_show() {
        let url = DatabaseUrl::parse("postgres://app:s3cret@db.internal:5432/shop?x=1").unwrap();
        assert_eq!(
            url.to_string(),
            "postgres://app:***@db.internal:5432/shop?x=1"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        assert_eq!(
            url.redact_in("password authentication failed (s3cret)"),
            "password authentication failed (***)"
        );
        let error = DatabaseUrl::parse("pg://user:secret@h/db").unwrap_err();
        assert!(error.to_string().contains("pg://user:***@h/db"), "{error}");
        assert!(!error.to_string().contains("secret"), "{error}");
        // An `@` left unencoded in the password, an encoded one, a password in the query.
        let at = DatabaseUrl::parse("postgres://app:p@ss@db:5432/shop").unwrap();
        assert_eq!(at.to_string(), "postgres://app:***@db:5432/shop");
        assert_eq!(at.redact_in("for p@ss"), "for ***");
        let encoded = DatabaseUrl::parse("postgres://app:s%40cr%20t@db/shop").unwrap();
        assert_eq!(encoded.to_string(), "postgres://app:***@db/shop");
        assert_eq!(
            encoded.redact_in("'s@cr t' or 's%40cr%20t'"),
            "'***' or '***'"
        );
        let query = DatabaseUrl::parse("postgres://app@db/shop?sslmode=require&password=hunter2#x")
            .unwrap();
        assert_eq!(
            query.to_string(),
            "postgres://app@db/shop?sslmode=require&password=***#x"
        );
        assert!(!format!("{query:?}").contains("hunter2"));
        assert_eq!(query.redact_in("hunter2!"), "***!");
        let plain = DatabaseUrl::parse("mysql://root@h/db").unwrap();
        assert_eq!(plain.to_string(), "mysql://root@h/db");
    }

    #[test]
    fn backends_have_names_that_parse_back() {
        for backend in Backend::ALL {
            assert_eq!(backend.name().parse::<Backend>().unwrap(), backend);
        }
        assert_eq!("MariaDB".parse::<Backend>().unwrap(), Backend::Mysql);
        assert!("oracle".parse::<Backend>().is_err());
    }

    #[test]
    fn sqlite_files_are_told_apart_from_memory_and_uris() {
        let file = |url: &str| {
            DatabaseUrl::parse(url)
                .unwrap()
                .sqlite_file()
                .map(str::to_owned)
        };
        assert_eq!(file("sqlite://a.db"), Some("a.db".into()));
        assert_eq!(file(":memory:"), None);
        assert_eq!(file("file:x?mode=memory"), None);
        assert_eq!(file("postgres://h/db"), None);
    }
}
