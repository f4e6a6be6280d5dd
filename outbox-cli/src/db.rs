//! Which backend a database URL names, and connecting to it.

use std::path::Path;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection, PgConnection, SqliteConnection};

use crate::error::CliError;

/// How long an SQLite connection waits for a worker's write lock before failing.
const SQLITE_BUSY_TIMEOUT_MS: u32 = 5000;

/// A database URL, by backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// `postgres://` or `postgresql://`.
    Postgres(String),
    /// `mysql://`.
    Mysql(String),
    /// A file path (from `sqlite://PATH` or a plain path) or an SQLite `file:` URI.
    Sqlite(String),
}

impl DatabaseUrl {
    /// Picks the backend from the URL's scheme.
    pub fn parse(url: &str) -> Result<Self, CliError> {
        let url = url.trim();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(DatabaseUrl::Postgres(url.to_owned()))
        } else if url.starts_with("mysql://") {
            Ok(DatabaseUrl::Mysql(url.to_owned()))
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            Ok(DatabaseUrl::Sqlite(path.to_owned()))
        } else if url.starts_with("file:")
            || (!url.contains("://")
                && [".db", ".sqlite", ".sqlite3"]
                    .iter()
                    .any(|ext| url.ends_with(ext)))
        {
            Ok(DatabaseUrl::Sqlite(url.to_owned()))
        } else {
            Err(CliError::UnsupportedUrl(redacted(url)))
        }
    }
}

/// What of a rejected URL to repeat: its scheme, or for something without one, the text itself
/// (which then holds no password).
fn redacted(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, _)) => format!("{scheme}://…"),
        None => url.to_owned(),
    }
}

/// Connects to PostgreSQL.
pub fn postgres(url: &str) -> Result<PgConnection, CliError> {
    establish(url)
}

/// Connects to MySQL or MariaDB.
pub fn mysql(url: &str) -> Result<MysqlConnection, CliError> {
    establish(url)
}

/// Opens an SQLite database, which must exist unless `create` (for `migrate`), and makes it
/// wait for a busy worker instead of failing at once.
pub fn sqlite(path: &str, create: bool) -> Result<SqliteConnection, CliError> {
    if !create && !path.starts_with("file:") && path != ":memory:" && !Path::new(path).exists() {
        return Err(CliError::NoSqliteFile(path.to_owned()));
    }
    let mut conn: SqliteConnection = establish(path)?;
    conn.batch_execute(&format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}"))
        .map_err(|e| CliError::Connect(e.to_string()))?;
    Ok(conn)
}

fn establish<C: Connection>(url: &str) -> Result<C, CliError> {
    C::establish(url).map_err(|e| CliError::Connect(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_picks_the_backend() {
        let parse = |url: &str| DatabaseUrl::parse(url).ok();
        assert_eq!(
            parse("postgres://u@h/db"),
            Some(DatabaseUrl::Postgres("postgres://u@h/db".into()))
        );
        assert_eq!(
            parse("postgresql://u@h/db"),
            Some(DatabaseUrl::Postgres("postgresql://u@h/db".into()))
        );
        assert_eq!(
            parse("mysql://root@h:3306/db"),
            Some(DatabaseUrl::Mysql("mysql://root@h:3306/db".into()))
        );
        assert_eq!(
            parse("sqlite:///tmp/x.db"),
            Some(DatabaseUrl::Sqlite("/tmp/x.db".into()))
        );
        assert_eq!(
            parse("sqlite://rel/app"),
            Some(DatabaseUrl::Sqlite("rel/app".into()))
        );
        assert_eq!(
            parse("file:app.db?mode=ro"),
            Some(DatabaseUrl::Sqlite("file:app.db?mode=ro".into()))
        );
        for path in ["app.db", "/var/x.sqlite", "y.sqlite3"] {
            assert_eq!(parse(path), Some(DatabaseUrl::Sqlite(path.into())));
        }
        for bad in ["redis://h/0", "app.txt", "", "http://x.db"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_rejected_url_keeps_its_password_to_itself() {
        let error = DatabaseUrl::parse("pg://user:secret@h/db")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("`pg://…`"), "{error}");
        assert!(!error.contains("secret"), "{error}");
    }
}
