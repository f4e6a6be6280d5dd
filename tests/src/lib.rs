//! Test support shared by the integration tests: a database of its own for each test, on the
//! real servers, dropped afterwards.
//!
//! Server URLs come from `OUTBOX_TEST_POSTGRES_URL` and `OUTBOX_TEST_MYSQL_URL` and default to
//! the local servers (`postgres://postgres@127.0.0.1:5432/outbox_test`,
//! `mysql://root@127.0.0.1:3306/outbox_test`). Each test creates a database named after that one
//! plus a unique suffix, so tests run concurrently and repeatedly without seeing each other.
//! Where a server cannot be reached, the test says which variable to set and passes, except
//! with `CI=true`, where it fails: CI skips nothing.

pub mod checker;
pub mod handlers;
pub mod receiver;
pub mod worker_process;
pub mod worker_support;

use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::Connection;

/// The database servers the tests know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB.
    Mysql,
    /// SQLite, in a temporary file.
    Sqlite,
}

impl Backend {
    fn env_var(self) -> &'static str {
        match self {
            Backend::Postgres => "OUTBOX_TEST_POSTGRES_URL",
            Backend::Mysql => "OUTBOX_TEST_MYSQL_URL",
            Backend::Sqlite => "",
        }
    }

    fn default_url(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres://postgres@127.0.0.1:5432/outbox_test",
            Backend::Mysql => "mysql://root@127.0.0.1:3306/outbox_test",
            Backend::Sqlite => "",
        }
    }
}

/// A database created for one test and dropped when this value is.
#[derive(Debug)]
pub struct TestDb {
    backend: Backend,
    url: String,
    admin_url: String,
    name: String,
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

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
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

impl TestDb {
    /// A fresh database on `backend`, or `None` (after saying how to fix it) where the server
    /// cannot be reached outside CI.
    pub fn new(backend: Backend) -> Option<TestDb> {
        if backend == Backend::Sqlite {
            let name = std::env::temp_dir()
                .join(format!("outbox-test-{}.db", unique_suffix()))
                .display()
                .to_string();
            return Some(TestDb {
                backend,
                url: name.clone(),
                admin_url: String::new(),
                name,
            });
        }
        let configured =
            std::env::var(backend.env_var()).unwrap_or_else(|_| backend.default_url().to_owned());
        let (prefix, base_name, query) = split_db_url(&configured);
        let base_name = if base_name.is_empty() {
            "outbox_test".to_owned()
        } else {
            base_name
        };
        let name = format!("{base_name}_{}", unique_suffix());
        let admin_url = match backend {
            Backend::Postgres => format!("{prefix}postgres{query}"),
            _ => format!("{prefix}{query}"),
        };
        let created = match backend {
            Backend::Postgres => create_database::<diesel::PgConnection>(&admin_url, &name, "\""),
            Backend::Mysql => create_database::<diesel::MysqlConnection>(&admin_url, &name, "`"),
            Backend::Sqlite => unreachable!("handled above"),
        };
        if let Err(error) = created {
            let message = format!(
                "cannot reach the {backend:?} test server at {configured} ({error}). Start it (see \
                 .ci/run) or point {} at a server where this user may create databases.",
                backend.env_var()
            );
            if in_ci() {
                panic!("{message} CI=true, so this is a failure, not a skip.");
            }
            eprintln!("\n!!! SKIPPED: {message}\n");
            return None;
        }
        Some(TestDb {
            backend,
            url: format!("{prefix}{name}{query}"),
            admin_url,
            name,
        })
    }

    /// The URL (a file path for SQLite) of this test's database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Which server the database is on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// A new connection to this test's database.
    pub fn connect<C: Connection>(&self) -> C {
        C::establish(&self.url)
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.url))
    }
}

fn create_database<C: Connection>(
    admin_url: &str,
    name: &str,
    quote: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut admin = C::establish(admin_url)?;
    admin.batch_execute(&format!("CREATE DATABASE {quote}{name}{quote}"))?;
    Ok(())
}

fn drop_database<C: Connection>(admin_url: &str, name: &str, quote: &str, force: &str) {
    let dropped = C::establish(admin_url)
        .map_err(|e| e.to_string())
        .and_then(|mut admin| {
            admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {quote}{name}{quote}{force}"
                ))
                .map_err(|e| e.to_string())
        });
    if let Err(error) = dropped {
        eprintln!("could not drop test database {name}: {error}");
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match self.backend {
            Backend::Postgres => drop_database::<diesel::PgConnection>(
                &self.admin_url,
                &self.name,
                "\"",
                " WITH (FORCE)",
            ),
            Backend::Mysql => {
                drop_database::<diesel::MysqlConnection>(&self.admin_url, &self.name, "`", "")
            }
            Backend::Sqlite => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", self.name));
                }
            }
        }
    }
}

/// Declares one `#[test]` per backend for each listed generic test function, in modules
/// `postgres`, `mysql` and `sqlite`. Each function takes `&TestDb` and is generic over the
/// connection type.
#[macro_export]
macro_rules! backend_tests {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(
                #[test]
                fn $test() {
                    if let Some(db) = $crate::TestDb::new($crate::Backend::Postgres) {
                        super::$test::<diesel::PgConnection>(&db);
                    }
                }
            )*
        }
        mod mysql {
            $(
                #[test]
                fn $test() {
                    if let Some(db) = $crate::TestDb::new($crate::Backend::Mysql) {
                        super::$test::<diesel::MysqlConnection>(&db);
                    }
                }
            )*
        }
        mod sqlite {
            $(
                #[test]
                fn $test() {
                    if let Some(db) = $crate::TestDb::new($crate::Backend::Sqlite) {
                        super::$test::<diesel::SqliteConnection>(&db);
                    }
                }
            )*
        }
    };
}
