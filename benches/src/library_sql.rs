//! The library's own claim and settle SQL (copied from `outbox-diesel/src/store.rs`), run in a
//! plain single-threaded loop: the database's claim-and-delete rate without the worker's
//! threads, channels and pool around it.

use diesel::connection::SimpleConnection;
use diesel::mysql::MysqlConnection;
use diesel::pg::PgConnection;
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryResult, QueryableByName, RunQueryDsl};

/// Only the first pending message of each ordering key is claimable (store.rs).
pub const HEAD_OF_ITS_KEY: &str = "(m.ordering_key IS NULL OR NOT EXISTS (\
     SELECT 1 FROM outbox_message e WHERE e.ordering_key = m.ordering_key AND e.id < m.id))";

/// The PostgreSQL claim of store.rs, for `limit` messages; binds: token (text), lease (µs).
pub fn pg_claim_sql(limit: usize) -> String {
    format!(
        "WITH due AS (\
            SELECT id FROM outbox_message m \
            WHERE m.next_attempt_at <= now() AND {HEAD_OF_ITS_KEY} \
            ORDER BY m.next_attempt_at, m.id LIMIT {limit} \
            FOR UPDATE SKIP LOCKED) \
         UPDATE outbox_message o \
         SET locked_by = $1::uuid, attempts = o.attempts + 1, \
             next_attempt_at = now() + $2 * INTERVAL '1 microsecond' \
         FROM due WHERE o.id = due.id \
         RETURNING o.id, o.message_id::text AS message_id, o.message_type, \
             o.payload::text AS payload, o.ordering_key, o.attempts"
    )
}

/// The MySQL claim's first statement: the candidates, read without locks.
pub fn mysql_candidates_sql(limit: usize) -> String {
    format!(
        "SELECT id FROM outbox_message m \
         WHERE m.next_attempt_at <= UTC_TIMESTAMP(6) AND {HEAD_OF_ITS_KEY} \
         ORDER BY m.next_attempt_at, m.id LIMIT {limit}"
    )
}

/// The SQLite claim's candidates (inside its UPDATE .. RETURNING).
pub fn sqlite_candidates_sql(limit: usize) -> String {
    format!(
        "SELECT id FROM outbox_message m \
         WHERE m.next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') AND {HEAD_OF_ITS_KEY} \
         ORDER BY m.next_attempt_at, m.id LIMIT {limit}"
    )
}

#[derive(QueryableByName)]
#[allow(dead_code)] // loaded as the library loads it; only the id is used afterwards
struct ClaimRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = Text)]
    message_type: String,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Nullable<Text>)]
    ordering_key: Option<String>,
    #[diesel(sql_type = Integer)]
    attempts: i32,
}

#[derive(QueryableByName)]
struct IdRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

fn id_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// The library's claim and its settle of `Done` outcomes, statement for statement.
pub trait LibrarySql {
    /// Leases up to `limit` due messages under `token`; returns their ids.
    fn claim(&mut self, token: &str, limit: usize, lease_us: i64) -> QueryResult<Vec<i64>>;
    /// Deletes the claimed rows in one transaction, as the acker settles `Done`.
    fn settle_done(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize>;
}

impl LibrarySql for PgConnection {
    fn claim(&mut self, token: &str, limit: usize, lease_us: i64) -> QueryResult<Vec<i64>> {
        let rows: Vec<ClaimRow> = diesel::sql_query(pg_claim_sql(limit))
            .bind::<Text, _>(token)
            .bind::<BigInt, _>(lease_us)
            .load(self)?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    fn settle_done(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize> {
        let sql = format!(
            "DELETE FROM outbox_message WHERE locked_by = $1::uuid AND id IN ({})",
            id_list(ids)
        );
        self.transaction(|c| diesel::sql_query(&sql).bind::<Text, _>(token).execute(c))
    }
}

impl LibrarySql for MysqlConnection {
    fn claim(&mut self, token: &str, limit: usize, lease_us: i64) -> QueryResult<Vec<i64>> {
        self.batch_execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
        self.transaction(|c| {
            let candidates: Vec<IdRow> = diesel::sql_query(mysql_candidates_sql(limit)).load(c)?;
            if candidates.is_empty() {
                return Ok(Vec::new());
            }
            let ids: Vec<i64> = candidates.iter().map(|row| row.id).collect();
            let rows: Vec<ClaimRow> = diesel::sql_query(format!(
                "SELECT id, message_id, message_type, CAST(payload AS CHAR) AS payload, \
                     ordering_key, attempts \
                 FROM outbox_message \
                 WHERE id IN ({}) AND next_attempt_at <= UTC_TIMESTAMP(6) \
                 FOR UPDATE SKIP LOCKED",
                id_list(&ids)
            ))
            .load(c)?;
            if rows.is_empty() {
                return Ok(Vec::new());
            }
            let locked: Vec<i64> = rows.iter().map(|row| row.id).collect();
            diesel::sql_query(format!(
                "UPDATE outbox_message SET locked_by = ?, attempts = attempts + 1, \
                     next_attempt_at = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)) \
                 WHERE id IN ({})",
                id_list(&locked)
            ))
            .bind::<Text, _>(token)
            .bind::<BigInt, _>(lease_us)
            .execute(c)?;
            Ok(locked)
        })
    }

    fn settle_done(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize> {
        let sql = format!(
            "DELETE FROM outbox_message WHERE locked_by = ? AND id IN ({})",
            id_list(ids)
        );
        self.transaction(|c| diesel::sql_query(&sql).bind::<Text, _>(token).execute(c))
    }
}

impl LibrarySql for SqliteConnection {
    fn claim(&mut self, token: &str, limit: usize, lease_us: i64) -> QueryResult<Vec<i64>> {
        let sql = format!(
            "UPDATE outbox_message \
             SET locked_by = ?, attempts = attempts + 1, \
                 next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', \
                     printf('%+.6f seconds', ? / 1000000.0)) \
             WHERE id IN ({}) \
             RETURNING id, message_id, message_type, payload, ordering_key, attempts",
            sqlite_candidates_sql(limit)
        );
        self.immediate_transaction(|c| {
            let rows: Vec<ClaimRow> = diesel::sql_query(&sql)
                .bind::<Text, _>(token)
                .bind::<BigInt, _>(lease_us)
                .load(c)?;
            Ok(rows.into_iter().map(|row| row.id).collect())
        })
    }

    fn settle_done(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize> {
        let sql = format!(
            "DELETE FROM outbox_message WHERE locked_by = ? AND id IN ({})",
            id_list(ids)
        );
        self.immediate_transaction(|c| diesel::sql_query(&sql).bind::<Text, _>(token).execute(c))
    }
}
