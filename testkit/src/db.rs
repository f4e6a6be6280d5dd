//! Databases for tests and benchmarks on the real servers: one of its own for each test,
//! created on the local PostgreSQL or MariaDB (or an SQLite file) and dropped afterwards.
//!
//! Server URLs come from `OUTBOX_TEST_POSTGRES_URL` and `OUTBOX_TEST_MYSQL_URL` and default to
//! the local servers (`postgres://postgres@127.0.0.1:5432/outbox_test`,
//! `mysql://root@127.0.0.1:3306/outbox_test`). A test database is named after that one plus a
//! unique suffix, so tests run concurrently and repeatedly without seeing each other. Where a
//! server cannot be reached, [`TestDb::new`] says which variable to set or command to run and
//! returns `None` (the test passes without running), except with `CI=true`, where it panics:
//! CI skips nothing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::r2d2::{Pool, R2D2Connection};
use diesel::Connection;
use outbox_diesel::{Backend, Establish, OutboxManager};

/// A connection type the tests run on: any backend's, opened by URL.
pub trait TestConnection: Establish + R2D2Connection + Send + 'static {}
impl<C> TestConnection for C where C: Establish + R2D2Connection + Send + 'static {}

/// A pool of `C` the way the tests and benchmarks build them.
pub type TestPool<C> = Pool<OutboxManager<C>>;

/// The environment variable naming `backend`'s test server.
pub fn env_var(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "OUTBOX_TEST_POSTGRES_URL",
        Backend::Mysql => "OUTBOX_TEST_MYSQL_URL",
        Backend::Sqlite => "",
    }
}

/// The test server's URL for `backend`: its environment variable, or the local server.
pub fn server_url(backend: Backend) -> String {
    let default = match backend {
        Backend::Postgres => "postgres://postgres@127.0.0.1:5432/outbox_test",
        Backend::Mysql => "mysql://root@127.0.0.1:3306/outbox_test",
        Backend::Sqlite => "",
    };
    std::env::var(env_var(backend)).unwrap_or_else(|_| default.to_owned())
}

/// Whether this is CI (`CI=true`), where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A database of its own, on a real server or in an SQLite file, dropped with this value
/// unless [`kept`](TestDb::kept).
#[derive(Debug)]
pub struct TestDb {
    backend: Backend,
    url: String,
    admin_url: String,
    name: String,
    keep: bool,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

/// Splits `scheme://authority/db?query` into (everything before the db name, db name, query).
fn split_db_url(url: &str) -> (String, String, String) {
    let (without_query, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let scheme_end = without_query.find("://").map(|i| i + 3).unwrap_or(0);
    match without_query[scheme_end..].find('/') {
        Some(slash) => {
            let slash = scheme_end + slash;
            (
                without_query[..=slash].to_owned(),
                without_query[slash + 1..].to_owned(),
                query,
            )
        }
        None => (format!("{without_query}/"), String::new(), query),
    }
}

/// Removes an SQLite database file and its `-wal` and `-shm` companions.
pub fn remove_sqlite_files(path: &str) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        match std::fs::remove_file(format!("{path}{suffix}")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// A path for a new SQLite file in the temporary directory.
pub fn temp_sqlite_path(label: &str) -> String {
    std::env::temp_dir()
        .join(format!("outbox-{label}-{}.db", unique_suffix()))
        .display()
        .to_string()
}

impl TestDb {
    /// A fresh database on `backend`, or `None` (after saying how to fix it) where the server
    /// cannot be reached outside CI.
    pub fn new(backend: Backend) -> Option<TestDb> {
        Self::new_with(backend, "")
    }

    /// A fresh database created with these extra `CREATE DATABASE` options (e.g. a PostgreSQL
    /// database in `ENCODING 'LATIN1'`); SQLite ignores them.
    pub fn new_with(backend: Backend, options: &str) -> Option<TestDb> {
        if backend == Backend::Sqlite {
            let path = temp_sqlite_path("test");
            return Some(TestDb {
                backend,
                url: path.clone(),
                admin_url: String::new(),
                name: path,
                keep: false,
            });
        }
        let configured = server_url(backend);
        let (_, base_name, _) = split_db_url(&configured);
        let base_name = if base_name.is_empty() {
            "outbox_test".to_owned()
        } else {
            base_name
        };
        match Self::create(
            backend,
            &format!("{base_name}_{}", unique_suffix()),
            options,
        ) {
            Ok(db) => Some(db),
            Err(error) => {
                let message = format!(
                    "cannot reach the {backend} test server at {configured} ({error}). Start it \
                     (`scripts/test` does) or point {} at a server where this user may create \
                     databases.",
                    env_var(backend)
                );
                if in_ci() {
                    panic!("{message} CI=true, so this is a failure, not a skip.");
                }
                eprintln!("\n!!! SKIPPED: {message}\n");
                None
            }
        }
    }

    /// The database `name` on `backend`'s test server (an SQLite file of that name in the
    /// temporary directory), dropped first if it exists, and kept afterwards: for the
    /// benchmarks, whose worker processes open it by URL.
    pub fn recreate(backend: Backend, name: &str) -> Result<TestDb, String> {
        if backend == Backend::Sqlite {
            let path = std::env::temp_dir()
                .join(format!("{name}.db"))
                .display()
                .to_string();
            remove_sqlite_files(&path).map_err(|e| format!("removing {path}: {e}"))?;
            return Ok(TestDb {
                backend,
                url: path.clone(),
                admin_url: String::new(),
                name: path,
                keep: true,
            });
        }
        let mut db = Self::locate(backend, name);
        db.drop_database()?;
        db = Self::create(backend, name, "")?;
        db.keep = true;
        Ok(db)
    }

    /// The database `name` on `backend`'s test server, as it is (kept on drop).
    pub fn locate(backend: Backend, name: &str) -> TestDb {
        if backend == Backend::Sqlite {
            let path = if name.contains(std::path::MAIN_SEPARATOR) || name.ends_with(".db") {
                name.to_owned()
            } else {
                std::env::temp_dir()
                    .join(format!("{name}.db"))
                    .display()
                    .to_string()
            };
            return TestDb {
                backend,
                url: path.clone(),
                admin_url: String::new(),
                name: path,
                keep: true,
            };
        }
        let (prefix, _, query) = split_db_url(&server_url(backend));
        let admin_url = match backend {
            Backend::Postgres => format!("{prefix}postgres{query}"),
            Backend::Mysql | Backend::Sqlite => format!("{prefix}{query}"),
        };
        TestDb {
            backend,
            url: format!("{prefix}{name}{query}"),
            admin_url,
            name: name.to_owned(),
            keep: true,
        }
    }

    fn create(backend: Backend, name: &str, options: &str) -> Result<TestDb, String> {
        let mut db = Self::locate(backend, name);
        db.keep = false;
        db.admin(&format!("CREATE DATABASE {} {options}", db.quoted_name()))?;
        Ok(db)
    }

    fn quoted_name(&self) -> String {
        match self.backend {
            Backend::Mysql => format!("`{}`", self.name),
            Backend::Postgres | Backend::Sqlite => format!("\"{}\"", self.name),
        }
    }

    /// Runs `sql` on the server's administrative database.
    fn admin(&self, sql: &str) -> Result<(), String> {
        let run = |conn: &mut dyn SimpleConnection| conn.batch_execute(sql);
        let result = match self.backend {
            Backend::Postgres => diesel::PgConnection::establish(&self.admin_url)
                .map_err(|e| e.to_string())
                .and_then(|mut c| run(&mut c).map_err(|e| e.to_string())),
            Backend::Mysql => diesel::MysqlConnection::establish(&self.admin_url)
                .map_err(|e| e.to_string())
                .and_then(|mut c| run(&mut c).map_err(|e| e.to_string())),
            Backend::Sqlite => Ok(()),
        };
        result.map_err(|error| format!("{sql}: {error}"))
    }

    /// Drops the database (deletes the SQLite files).
    pub fn drop_database(&self) -> Result<(), String> {
        match self.backend {
            Backend::Sqlite => {
                remove_sqlite_files(&self.name).map_err(|e| format!("removing {}: {e}", self.name))
            }
            Backend::Postgres => self.admin(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.quoted_name()
            )),
            Backend::Mysql => {
                self.admin(&format!("DROP DATABASE IF EXISTS {}", self.quoted_name()))
            }
        }
    }

    /// Keeps the database when this value is dropped (to look at it after a failure).
    pub fn kept(mut self) -> TestDb {
        self.keep = true;
        self
    }

    /// The URL (a file path for SQLite) of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The SQLite file, for SQLite.
    pub fn sqlite_file(&self) -> Option<PathBuf> {
        (self.backend == Backend::Sqlite).then(|| PathBuf::from(&self.name))
    }

    /// Which server the database is on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// A new connection to this database, set up as the outbox sets up its own.
    pub fn connect<C: Establish>(&self) -> C {
        outbox_diesel::establish(&self.url)
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.url))
    }

    /// A pool of `size` connections to this database, without migrations.
    pub fn bare_pool<C: TestConnection>(&self, size: u32) -> TestPool<C> {
        let manager = OutboxManager::<C>::new(&self.url)
            .unwrap_or_else(|e| panic!("a manager for {}: {e}", self.url));
        Pool::builder()
            .max_size(size)
            .connection_timeout(Duration::from_secs(30))
            .build(manager)
            .unwrap_or_else(|e| panic!("building a pool for {}: {e}", self.url))
    }

    /// A pool of `size` connections to this database, with the outbox migrations run.
    pub fn pool<C: TestConnection>(&self, size: u32) -> TestPool<C> {
        let pool = self.bare_pool::<C>(size);
        let mut conn = pool.get().expect("a connection from the test pool");
        outbox_diesel::run_migrations(&mut conn).expect("the outbox migrations");
        drop(conn);
        pool
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Err(error) = self.drop_database() {
            eprintln!("could not drop test database {}: {error}", self.name);
        }
    }
}

/// The outbox's migrations of `backend`, as the library embeds them.
fn outbox_migrations(backend: Backend) -> diesel_migrations::EmbeddedMigrations {
    use diesel_migrations::{embed_migrations, EmbeddedMigrations};
    const POSTGRES: EmbeddedMigrations = embed_migrations!("../outbox-diesel/migrations/postgres");
    const MYSQL: EmbeddedMigrations = embed_migrations!("../outbox-diesel/migrations/mysql");
    const SQLITE: EmbeddedMigrations = embed_migrations!("../outbox-diesel/migrations/sqlite");
    match backend {
        Backend::Postgres => POSTGRES,
        Backend::Mysql => MYSQL,
        Backend::Sqlite => SQLITE,
    }
}

/// Brings a fresh database to the schema an older release left: the outbox's migrations of
/// `backend` up to, not including, the one whose version ends with `before` (e.g. `"500"`), for
/// tests that upgrade a database with messages in it. PostgreSQL has one migration more than
/// the others (autovacuum settings), so versions, not counts, name the point.
pub fn migrate_to_before<C>(conn: &mut C, backend: Backend, before: &str)
where
    C: diesel::Connection + diesel_migrations::MigrationHarness<C::Backend>,
{
    use diesel::migration::MigrationSource;
    let migrations = outbox_migrations(backend);
    let versions: Vec<String> = MigrationSource::<C::Backend>::migrations(&migrations)
        .expect("the embedded migrations")
        .iter()
        .map(|m| m.name().version().to_string())
        .collect();
    let stop = versions
        .iter()
        .position(|v| v.ends_with(before))
        .unwrap_or_else(|| panic!("no outbox migration `..{before}` in {versions:?}"));
    for _ in 0..stop {
        conn.run_next_migration(outbox_migrations(backend))
            .expect("running an outbox migration");
    }
    assert!(
        conn.has_pending_migration(outbox_migrations(backend))
            .expect("reading the applied migrations"),
        "the migration ..{before} is left to run"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_at_the_database_name() {
        assert_eq!(
            split_db_url("postgres://u@h:5432/outbox_test?sslmode=disable"),
            (
                "postgres://u@h:5432/".to_owned(),
                "outbox_test".to_owned(),
                "?sslmode=disable".to_owned()
            )
        );
        assert_eq!(
            split_db_url("mysql://root@h:3306"),
            (
                "mysql://root@h:3306/".to_owned(),
                String::new(),
                String::new()
            )
        );
    }

    #[test]
    fn an_sqlite_database_is_created_and_removed_with_its_companions() {
        let db = TestDb::new(Backend::Sqlite).expect("SQLite needs no server");
        let pool = db.pool::<diesel::SqliteConnection>(2);
        let file = db.sqlite_file().expect("a file");
        assert!(file.exists());
        drop(pool);
        drop(db);
        for suffix in ["", "-wal", "-shm"] {
            assert!(!PathBuf::from(format!("{}{suffix}", file.display())).exists());
        }
    }
}
