//! The benchmark's databases (`outbox_bench`, dropped and created at start, through the test
//! kit) and the hand-written SQL of the baselines, per backend.

use std::time::Duration;

use diesel::mysql::MysqlConnection;
use diesel::pg::PgConnection;
use diesel::r2d2::{Pool, R2D2Connection};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryResult, QueryableByName, RunQueryDsl};
use outbox_diesel::{Establish, OutboxManager};
use outbox_testkit::TestDb;

use crate::{Backend, Res, WithContext};

/// The database every scenario uses, on the servers the tests use.
pub const DB_NAME: &str = "outbox_bench";

/// Where the benchmark's database lives.
#[derive(Debug, Clone)]
pub struct BenchDb {
    pub backend: Backend,
    /// The URL (a file path for SQLite) of `outbox_bench`.
    pub url: String,
}

impl BenchDb {
    /// Drops and creates `outbox_bench`, runs the outbox migrations and creates the business
    /// table.
    pub fn recreate(backend: Backend) -> Res<BenchDb> {
        let created = TestDb::recreate(backend, DB_NAME).map_err(crate::failed)?;
        let db = BenchDb {
            backend,
            url: created.url().to_owned(),
        };
        crate::db::with_connection!(backend, C => db.migrate::<C>())?;
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
        TestDb::locate(self.backend, self.name())
            .drop_database()
            .map_err(crate::failed)
    }

    fn name(&self) -> &str {
        match self.backend {
            Backend::Sqlite => &self.url,
            _ => DB_NAME,
        }
    }

    /// A new connection, set up as the library sets up its own.
    pub fn connect<C: Establish>(&self) -> Res<C> {
        outbox_diesel::establish(&self.url).ctx(format!("connecting to {}", self.url))
    }

    /// A pool for a worker (it holds three connections: claimer, acker, listener).
    pub fn worker_pool<C: BenchConnection>(&self, size: u32) -> Res<Pool<OutboxManager<C>>> {
        Pool::builder()
            .max_size(size)
            .min_idle(Some(size))
            .connection_timeout(Duration::from_secs(30))
            .build(OutboxManager::<C>::new(&self.url).ctx("a manager for the benchmark's URL")?)
            .ctx(format!("building a pool for {}", self.url))
    }

    /// The database at `url` (made by [`BenchDb::recreate`] in the parent process).
    pub fn existing(backend: Backend, url: &str) -> BenchDb {
        BenchDb {
            backend,
            url: url.to_owned(),
        }
    }

    /// Empties the outbox and business tables (fresh storage on PostgreSQL and MariaDB).
    pub fn empty<C: BenchConnection>(&self) -> Res<()> {
        let mut conn = self.connect::<C>()?;
        conn.batch_execute(C::SQL.empty)
            .ctx("emptying the tables")?;
        Ok(())
    }

    /// Removes every subscription.
    pub fn empty_subscriptions<C: BenchConnection>(&self) -> Res<()> {
        let mut conn = self.connect::<C>()?;
        conn.batch_execute("DELETE FROM outbox_subscription")
            .ctx("removing the subscriptions")?;
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
    library_insert:
        "INSERT INTO outbox_message (message_id, message_type, payload, payload_bytes, \
                     ordering_key, next_attempt_at) VALUES ($1::uuid, $2, $3::jsonb, $4, $5, \
                     COALESCE(TIMESTAMPTZ 'epoch' + $6 * INTERVAL '1 microsecond', now()))",
    empty: "TRUNCATE outbox_message, outbox_failure, outbox_attempt, bench_business",
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
    library_insert:
        "INSERT INTO outbox_message (message_id, message_type, payload, payload_bytes, \
                     ordering_key, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, \
                     UTC_TIMESTAMP(6), \
                     COALESCE(TIMESTAMPADD(MICROSECOND, ?, '1970-01-01'), UTC_TIMESTAMP(6)))",
    empty: "TRUNCATE TABLE outbox_message; TRUNCATE TABLE outbox_failure; \
            TRUNCATE TABLE outbox_attempt; TRUNCATE TABLE bench_business",
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
    library_insert:
        "INSERT INTO outbox_message (message_id, message_type, payload, payload_bytes, \
                     ordering_key, next_attempt_at) VALUES (?, ?, ?, ?, ?, \
                     COALESCE(strftime('%Y-%m-%d %H:%M:%f', ? / 1000000.0, 'unixepoch'), \
                              strftime('%Y-%m-%d %H:%M:%f', 'now')))",
    empty: "DELETE FROM outbox_message; DELETE FROM outbox_failure; DELETE FROM outbox_attempt; \
            DELETE FROM bench_business",
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
pub trait BenchConnection: Establish + R2D2Connection + Send + 'static {
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
                    .bind::<BigInt, _>(i64::try_from(payload.len()).unwrap_or(i64::MAX))
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

pub(crate) use outbox_testkit::with_connection;

/// Runs a scenario, `$run_on::<C>(opts, &db)` with `C` the connection type of the backend
/// `opts` names, on a freshly created `outbox_bench`, and drops it afterwards unless `--keep`.
macro_rules! on_fresh_database {
    ($opts:expr, $run_on:ident) => {{
        let opts: &$crate::Opts = $opts;
        let db = $crate::db::BenchDb::recreate(opts.backend)?;
        let result = $crate::db::with_connection!(opts.backend, C => $run_on::<C>(opts, &db));
        if !opts.keep {
            db.drop_database()?;
        }
        result
    }};
}
pub(crate) use on_fresh_database;
