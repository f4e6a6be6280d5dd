//! The benchmark's databases (`outbox_bench`, dropped and created at start) and the hand-written
//! SQL of the baselines, per backend.

use std::path::PathBuf;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::mysql::MysqlConnection;
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, Pool, R2D2Connection};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryResult, QueryableByName, RunQueryDsl};
use outbox_diesel::{OutboxConnection, PoolCustomizer};

use crate::{Backend, Res, WithContext};

/// The database every scenario uses, on the servers the tests use.
pub const DB_NAME: &str = "outbox_bench";

/// Where the benchmark's database lives.
#[derive(Debug, Clone)]
pub struct BenchDb {
    pub backend: Backend,
    /// The URL (a file path for SQLite) of `outbox_bench`.
    pub url: String,
    admin_url: String,
    sqlite_file: Option<PathBuf>,
}

/// Splits `scheme://authority/db?query` into (everything up to the db name, the query).
fn server_prefix(url: &str) -> (String, String) {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    match base[scheme_end..].find('/') {
        Some(slash) => (base[..=scheme_end + slash].to_owned(), query),
        None => (format!("{base}/"), query),
    }
}

impl BenchDb {
    /// Where `outbox_bench` is on `backend`'s server, without touching it.
    pub fn locate(backend: Backend) -> BenchDb {
        let (var, default) = match backend {
            Backend::Postgres => (
                "OUTBOX_TEST_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/outbox_test",
            ),
            Backend::Mysql => (
                "OUTBOX_TEST_MYSQL_URL",
                "mysql://root@127.0.0.1:3306/outbox_test",
            ),
            Backend::Sqlite => {
                let file = std::env::temp_dir().join(format!("{DB_NAME}.db"));
                return BenchDb {
                    backend,
                    url: file.display().to_string(),
                    admin_url: String::new(),
                    sqlite_file: Some(file),
                };
            }
        };
        let configured = std::env::var(var).unwrap_or_else(|_| default.to_owned());
        let (prefix, query) = server_prefix(&configured);
        let admin_url = match backend {
            Backend::Postgres => format!("{prefix}postgres{query}"),
            _ => format!("{prefix}{query}"),
        };
        BenchDb {
            backend,
            url: format!("{prefix}{DB_NAME}{query}"),
            admin_url,
            sqlite_file: None,
        }
    }

    /// Drops and creates `outbox_bench`, runs the outbox migrations and creates the business
    /// table.
    pub fn recreate(backend: Backend) -> Res<BenchDb> {
        let db = BenchDb::locate(backend);
        db.drop_database()?;
        match backend {
            Backend::Postgres => {
                let mut admin = PgConnection::establish(&db.admin_url)
                    .ctx(format!("connecting to PostgreSQL at {}", db.admin_url))?;
                admin
                    .batch_execute(&format!("CREATE DATABASE {DB_NAME}"))
                    .ctx("creating the PostgreSQL database")?;
            }
            Backend::Mysql => {
                let mut admin = MysqlConnection::establish(&db.admin_url)
                    .ctx(format!("connecting to MariaDB at {}", db.admin_url))?;
                admin
                    .batch_execute(&format!("CREATE DATABASE {DB_NAME}"))
                    .ctx("creating the MariaDB database")?;
            }
            Backend::Sqlite => {}
        }
        match backend {
            Backend::Postgres => db.migrate::<PgConnection>()?,
            Backend::Mysql => db.migrate::<MysqlConnection>()?,
            Backend::Sqlite => db.migrate::<SqliteConnection>()?,
        }
        Ok(db)
    }

    fn migrate<C: BenchConnection>(&self) -> Res<()> {
        let mut conn = self.connect::<C>()?;
        outbox_diesel::run_migrations(&mut conn).ctx("running the outbox migrations")?;
        conn.batch_execute(C::SQL.business_table)
            .ctx("creating the business table")?;
        Ok(())
    }

    /// Drops `outbox_bench` (or deletes the SQLite file).
    pub fn drop_database(&self) -> Res<()> {
        match self.backend {
            Backend::Postgres => {
                let mut admin = PgConnection::establish(&self.admin_url)
                    .ctx(format!("connecting to PostgreSQL at {}", self.admin_url))?;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)"))
                    .ctx("dropping the PostgreSQL database")?;
            }
            Backend::Mysql => {
                let mut admin = MysqlConnection::establish(&self.admin_url)
                    .ctx(format!("connecting to MariaDB at {}", self.admin_url))?;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {DB_NAME}"))
                    .ctx("dropping the MariaDB database")?;
            }
            Backend::Sqlite => {
                if let Some(file) = &self.sqlite_file {
                    for suffix in ["", "-wal", "-shm"] {
                        let path = format!("{}{suffix}", file.display());
                        match std::fs::remove_file(&path) {
                            Ok(()) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(e).ctx(format!("removing {path}")),
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A new connection (with the SQLite settings the pool would apply).
    pub fn connect<C: BenchConnection>(&self) -> Res<C> {
        let mut conn = C::establish(&self.url).ctx(format!("connecting to {}", self.url))?;
        if self.backend == Backend::Sqlite {
            conn.batch_execute(
                "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;",
            )
            .ctx("configuring SQLite")?;
        }
        Ok(conn)
    }

    /// A pool for a worker (it holds three connections: claimer, acker, listener).
    pub fn worker_pool<C: BenchConnection>(&self, size: u32) -> Res<Pool<ConnectionManager<C>>> {
        Pool::builder()
            .max_size(size)
            .min_idle(Some(size))
            .connection_timeout(Duration::from_secs(30))
            .connection_customizer(Box::new(PoolCustomizer))
            .build(ConnectionManager::<C>::new(self.url.clone()))
            .ctx(format!("building a pool for {}", self.url))
    }

    /// The database at `url` (made by [`BenchDb::recreate`] in the parent process).
    pub fn existing(backend: Backend, url: &str) -> BenchDb {
        BenchDb {
            backend,
            url: url.to_owned(),
            admin_url: String::new(),
            sqlite_file: None,
        }
    }

    /// Empties the outbox and business tables (fresh storage on PostgreSQL and MariaDB).
    pub fn empty<C: BenchConnection>(&self) -> Res<()> {
        let mut conn = self.connect::<C>()?;
        conn.batch_execute(C::SQL.empty)
            .ctx("emptying the tables")?;
        Ok(())
    }
}

/// The SQL the baselines write by hand.
#[derive(Debug)]
pub struct Sql {
    pub business_table: &'static str,
    pub business_insert: &'static str,
    /// The same outbox row the library's `enqueue` writes (id, type, payload), by hand.
    pub outbox_insert: &'static str,
    /// The statement the library's `enqueue` sends (connection.rs), with its five binds.
    pub library_insert: &'static str,
    pub empty: &'static str,
    pub count_outbox: &'static str,
    /// The one-at-a-time loop's pick: the oldest due message, locked.
    pub select_one: &'static str,
    pub delete_one: &'static str,
}

const PG_SQL: Sql = Sql {
    business_table: "CREATE TABLE bench_business (id BIGSERIAL PRIMARY KEY, \
                     member_id BIGINT NOT NULL, body TEXT NOT NULL)",
    business_insert: "INSERT INTO bench_business (member_id, body) VALUES ($1, $2)",
    outbox_insert: "INSERT INTO outbox_message (message_id, message_type, payload) \
                    VALUES ($1::uuid, $2, $3::jsonb)",
    library_insert: "INSERT INTO outbox_message (message_id, message_type, payload, ordering_key, \
                     next_attempt_at) VALUES ($1::uuid, $2, $3::jsonb, $4, \
                     COALESCE(TIMESTAMPTZ 'epoch' + $5 * INTERVAL '1 microsecond', now()))",
    empty: "TRUNCATE outbox_message, outbox_failure, bench_business",
    count_outbox: "SELECT COUNT(*) AS n FROM outbox_message",
    select_one:
        "SELECT id, message_id::text AS message_id, message_type, payload::text AS payload \
                 FROM outbox_message WHERE next_attempt_at <= now() \
                 ORDER BY next_attempt_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
    delete_one: "DELETE FROM outbox_message WHERE id = $1",
};

const MYSQL_SQL: Sql = Sql {
    business_table: "CREATE TABLE bench_business (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                     member_id BIGINT NOT NULL, body TEXT NOT NULL) ENGINE = InnoDB",
    business_insert: "INSERT INTO bench_business (member_id, body) VALUES (?, ?)",
    outbox_insert: "INSERT INTO outbox_message (message_id, message_type, payload, created_at, \
                    next_attempt_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    library_insert: "INSERT INTO outbox_message (message_id, message_type, payload, ordering_key, \
                     created_at, next_attempt_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), \
                     COALESCE(TIMESTAMPADD(MICROSECOND, ?, '1970-01-01'), UTC_TIMESTAMP(6)))",
    empty: "TRUNCATE TABLE outbox_message; TRUNCATE TABLE outbox_failure; \
            TRUNCATE TABLE bench_business",
    count_outbox: "SELECT COUNT(*) AS n FROM outbox_message",
    select_one: "SELECT id, message_id, message_type, CAST(payload AS CHAR) AS payload \
                 FROM outbox_message WHERE next_attempt_at <= UTC_TIMESTAMP(6) \
                 ORDER BY next_attempt_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
    delete_one: "DELETE FROM outbox_message WHERE id = ?",
};

const SQLITE_SQL: Sql = Sql {
    business_table: "CREATE TABLE bench_business (id INTEGER PRIMARY KEY, \
                     member_id BIGINT NOT NULL, body TEXT NOT NULL)",
    business_insert: "INSERT INTO bench_business (member_id, body) VALUES (?, ?)",
    outbox_insert: "INSERT INTO outbox_message (message_id, message_type, payload) \
                    VALUES (?, ?, ?)",
    library_insert: "INSERT INTO outbox_message (message_id, message_type, payload, ordering_key, \
                     next_attempt_at) VALUES (?, ?, ?, ?, \
                     COALESCE(strftime('%Y-%m-%d %H:%M:%f', ? / 1000000.0, 'unixepoch'), \
                              strftime('%Y-%m-%d %H:%M:%f', 'now')))",
    empty: "DELETE FROM outbox_message; DELETE FROM outbox_failure; DELETE FROM bench_business",
    count_outbox: "SELECT COUNT(*) AS n FROM outbox_message",
    select_one: "SELECT id, message_id, message_type, payload FROM outbox_message \
                 WHERE next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') \
                 ORDER BY next_attempt_at, id LIMIT 1",
    delete_one: "DELETE FROM outbox_message WHERE id = ?",
};

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// One outbox row as the one-at-a-time loop reads it.
#[derive(QueryableByName, Debug)]
pub struct OneRow {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Text)]
    pub message_id: String,
    #[diesel(sql_type = Text)]
    pub message_type: String,
    #[diesel(sql_type = Text)]
    pub payload: String,
}

/// A connection type the benchmark runs on: the library's bounds plus the baselines' SQL.
pub trait BenchConnection: OutboxConnection + R2D2Connection + Send + 'static {
    /// Its hand-written SQL.
    const SQL: Sql;
    /// Runs a statement without binds.
    fn exec(&mut self, sql: &str) -> QueryResult<usize>;
    /// Runs a query returning one BIGINT column named `n`.
    fn count(&mut self, sql: &str) -> QueryResult<i64>;
    /// One business row.
    fn insert_business(&mut self, member_id: i64, body: &str) -> QueryResult<usize>;
    /// One outbox row, written by hand.
    fn insert_outbox(
        &mut self,
        message_id: &str,
        message_type: &str,
        payload: &str,
    ) -> QueryResult<usize>;
    /// One outbox row, by hand, with the library's own statement text and binds.
    fn insert_outbox_library_sql(
        &mut self,
        message_id: &str,
        message_type: &str,
        payload: &str,
    ) -> QueryResult<usize>;
    /// The oldest due message, locked until the transaction ends.
    fn select_one(&mut self) -> QueryResult<Option<OneRow>>;
    /// Deletes one message.
    fn delete_one(&mut self, id: i64) -> QueryResult<usize>;
    /// A transaction that writes (`BEGIN IMMEDIATE` on SQLite).
    fn write_tx<T, E: From<diesel::result::Error>>(
        &mut self,
        body: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E>;
}

macro_rules! bench_connection {
    ($connection:ty, $sql:expr, $transaction:ident) => {
        impl BenchConnection for $connection {
            const SQL: Sql = $sql;

            fn exec(&mut self, sql: &str) -> QueryResult<usize> {
                diesel::sql_query(sql).execute(self)
            }

            fn count(&mut self, sql: &str) -> QueryResult<i64> {
                let rows: Vec<Count> = diesel::sql_query(sql).load(self)?;
                Ok(rows.first().map(|row| row.n).unwrap_or(0))
            }

            fn insert_business(&mut self, member_id: i64, body: &str) -> QueryResult<usize> {
                diesel::sql_query(Self::SQL.business_insert)
                    .bind::<BigInt, _>(member_id)
                    .bind::<Text, _>(body)
                    .execute(self)
            }

            fn insert_outbox(
                &mut self,
                message_id: &str,
                message_type: &str,
                payload: &str,
            ) -> QueryResult<usize> {
                diesel::sql_query(Self::SQL.outbox_insert)
                    .bind::<Text, _>(message_id)
                    .bind::<Text, _>(message_type)
                    .bind::<Text, _>(payload)
                    .execute(self)
            }

            fn insert_outbox_library_sql(
                &mut self,
                message_id: &str,
                message_type: &str,
                payload: &str,
            ) -> QueryResult<usize> {
                diesel::sql_query(Self::SQL.library_insert)
                    .bind::<Text, _>(message_id)
                    .bind::<Text, _>(message_type)
                    .bind::<Text, _>(payload)
                    .bind::<Nullable<Text>, _>(None::<&str>)
                    .bind::<Nullable<BigInt>, _>(None::<i64>)
                    .execute(self)
            }

            fn select_one(&mut self) -> QueryResult<Option<OneRow>> {
                let mut rows: Vec<OneRow> = diesel::sql_query(Self::SQL.select_one).load(self)?;
                Ok(rows.pop())
            }

            fn delete_one(&mut self, id: i64) -> QueryResult<usize> {
                diesel::sql_query(Self::SQL.delete_one)
                    .bind::<BigInt, _>(id)
                    .execute(self)
            }

            fn write_tx<T, E: From<diesel::result::Error>>(
                &mut self,
                body: impl FnOnce(&mut Self) -> Result<T, E>,
            ) -> Result<T, E> {
                self.$transaction(body)
            }
        }
    };
}

bench_connection!(PgConnection, PG_SQL, transaction);
bench_connection!(MysqlConnection, MYSQL_SQL, transaction);
bench_connection!(SqliteConnection, SQLITE_SQL, immediate_transaction);

/// Calls `$body` with `$c` naming the connection type of `$backend`.
macro_rules! with_connection {
    ($backend:expr, $c:ident => $body:expr) => {
        match $backend {
            $crate::Backend::Postgres => {
                type $c = diesel::pg::PgConnection;
                $body
            }
            $crate::Backend::Mysql => {
                type $c = diesel::mysql::MysqlConnection;
                $body
            }
            $crate::Backend::Sqlite => {
                type $c = diesel::sqlite::SqliteConnection;
                $body
            }
        }
    };
}
pub(crate) use with_connection;
