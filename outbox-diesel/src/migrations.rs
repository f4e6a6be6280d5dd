//! The outbox's tables, created and upgraded by [`run_migrations`] with the migrations embedded
//! for each backend.

use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use crate::connection::{BackendConnection, OutboxConnection};
use crate::error::{Error, Result};

#[cfg(feature = "postgres")]
const POSTGRES: EmbeddedMigrations = embed_migrations!("migrations/postgres");
#[cfg(feature = "mysql")]
const MYSQL: EmbeddedMigrations = embed_migrations!("migrations/mysql");
#[cfg(feature = "sqlite")]
const SQLITE: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// Creates or upgrades the outbox tables, returning the versions it applied (none when the
/// schema is current, so calling it at every start-up is cheap and safe).
///
/// The outbox's migrations are recorded in Diesel's own `__diesel_schema_migrations` table beside
/// the application's, under versions that sort before any `diesel migration generate` timestamp,
/// so `diesel migration run` and `revert` keep working on the application's own set.
pub fn run_migrations<C: OutboxConnection>(conn: &mut C) -> Result<Vec<String>> {
    let applied = match conn.backend_connection() {
        #[cfg(feature = "postgres")]
        BackendConnection::Pg(c) => c.run_pending_migrations(POSTGRES),
        #[cfg(feature = "mysql")]
        BackendConnection::Mysql(c) => c.run_pending_migrations(MYSQL),
        #[cfg(feature = "sqlite")]
        BackendConnection::Sqlite(c) => c.run_pending_migrations(SQLITE),
    }
    .map_err(Error::Migration)?;
    Ok(applied
        .into_iter()
        .map(|version| version.to_string())
        .collect())
}
