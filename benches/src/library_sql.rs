//! The library's claim queries (copied from `outbox-diesel/src/store.rs`), for `EXPLAIN`: the
//! library does not expose its SQL.

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
         FROM due, (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
         WHERE o.id = due.id \
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
