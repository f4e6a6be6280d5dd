//! Connecting to the database a URL names, the library's way.

use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use outbox_diesel::{Backend, DatabaseUrl};

use crate::cli::Command;
use crate::commands::{self, Output};
use crate::error::CliError;

/// Connects to the database `url` names and runs `command` there. An SQLite file must exist
/// unless the command is `migrate`, so that a mistyped path is an error, not a new empty file.
pub fn run(url: &str, command: &Command, json: bool) -> Result<Output, CliError> {
    let url = DatabaseUrl::parse(url)?;
    match url.backend() {
        Backend::Postgres => commands::run(&mut url.establish::<PgConnection>()?, command, json),
        Backend::Mysql => commands::run(&mut url.establish::<MysqlConnection>()?, command, json),
        Backend::Sqlite => {
            if let Some(path) = url.sqlite_file() {
                if !matches!(command, Command::Migrate) && !std::path::Path::new(path).exists() {
                    return Err(CliError::NoSqliteFile(path.to_owned()));
                }
            }
            commands::run(&mut url.establish::<SqliteConnection>()?, command, json)
        }
    }
}
