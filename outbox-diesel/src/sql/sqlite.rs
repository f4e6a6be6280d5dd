//! SQLite's statements. Times are UTC text `YYYY-MM-DD HH:MM:SS.SSS`, which sorts in time
//! order; lists of ids take one bind each. SQLite has one writer at a time: the worker's
//! transactions take the write lock at once (`BEGIN IMMEDIATE`), so they wait for the busy
//! timeout instead of failing on a lock upgrade, and what they read stays true until they
//! commit.

use std::cmp::Reverse;

use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{Connection, QueryResult, QueryableByName, RunQueryDsl};

use super::bind::{dynamic, Bind, Placeholders, Prepared};
use super::cancel::{CancelRows, CancelStatements, KeyedRow};
use super::delivery_log::{
    ArchivedRow, AttemptRow, DeliveryLogStatements, LastIdRow, LoggedRow, LAST_ATTEMPT_ID,
};
use super::subscription::{SubscriptionDialect, SubscriptionStatements};
use super::{
    placeholders, Claim, ClaimRow, Claimed, CountRow, Cursor, Dialect, IdRow, LoadFixed, Selection,
    Statements, ID_CHUNK,
};
use crate::sql::new_message::NewMessage;

const STYLE: Placeholders = Placeholders::Question;

/// Bind parameters one statement may carry (`SQLITE_MAX_VARIABLE_NUMBER` of the bundled
/// library, 3.32+).
pub(crate) const MAX_BINDS: usize = 32_766;

/// Now, as the time columns hold it.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

/// Now plus the microseconds of a bind.
macro_rules! now_plus_bind {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', ? / 1000000.0))"
    };
}

/// A time column as microseconds since the epoch.
macro_rules! micros_of {
    ($column:literal) => {
        concat!(
            "CAST(ROUND((julianday(",
            $column,
            ") - 2440587.5) * 86400000.0) AS INTEGER) * 1000"
        )
    };
}

/// The VALUES tuple of one inserted message.
macro_rules! insert_values {
    () => {
        concat!(
            "(?, ?, ?, ?, ?, COALESCE(strftime('%Y-%m-%d %H:%M:%f', ? / 1000000.0, 'unixepoch'), \
             strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', COALESCE(?, 0) / 1000000.0))), \
             ?, ?, ?, ?, ? OR EXISTS (SELECT 1 FROM outbox_message e WHERE e.ordering_key = ?))"
        )
    };
}

/// One message, as `enqueue` writes it: binds message id, type, payload, its size in bytes,
/// ordering key, not-before in µs since the epoch (NULL: now plus the delay), delay in µs
/// (NULL: none), headers (JSON, NULL: none), priority level, group, whether an earlier row of
/// the insert has its key, and the ordering key again. A keyed message is parked from the start
/// when its key has a pending message already (an index probe): a burst behind a head that is
/// not due never comes before a claim.
pub(crate) const INSERT_MESSAGE: &str = concat!(
    "INSERT INTO outbox_message \
     (message_id, message_type, payload, payload_bytes, ordering_key, next_attempt_at, \
      headers, priority, group_name, owner, parked) \
     VALUES ",
    insert_values!()
);

/// What a claim reads of each candidate: its position, whether it heads its key (an index
/// probe), its payload size, priority, due time and group.
macro_rules! candidate_columns {
    () => {
        "id, \
         CASE WHEN ordering_key IS NULL OR NOT EXISTS (\
             SELECT 1 FROM outbox_message e \
             WHERE e.ordering_key = m.ordering_key AND e.id < m.id) THEN 1 ELSE 0 END AS head, \
         COALESCE(payload_bytes, length(CAST(payload AS BLOB))) AS size, priority, \
         next_attempt_at AS due, group_name"
    };
}

/// The claim's candidates: a batch of due, unparked rows, each judged a head of its key or not,
/// with its payload size; the raised priorities by their own index, in priority and due order,
/// then the ordinary ones in due order. Binds: candidates, twice.
pub const CANDIDATES: &str = concat!(
    "SELECT * FROM (SELECT ",
    candidate_columns!(),
    " FROM outbox_message m \
     WHERE priority > 0 AND parked = 0 AND next_attempt_at <= ",
    now!(),
    " ORDER BY priority DESC, next_attempt_at, id LIMIT ?) \
     UNION ALL SELECT * FROM (SELECT ",
    candidate_columns!(),
    " FROM outbox_message m \
     WHERE priority <= 0 AND parked = 0 AND next_attempt_at <= ",
    now!(),
    " ORDER BY next_attempt_at, id LIMIT ?)"
);

/// A group's share of a claim's candidates: its first due, unparked, ordinary messages, by the
/// grouped index. Binds: group, the share.
pub const GROUP_SHARE: &str = concat!(
    "SELECT ",
    candidate_columns!(),
    " FROM outbox_message m \
     WHERE group_name = ? AND parked = 0 AND priority <= 0 AND next_attempt_at <= ",
    now!(),
    " ORDER BY next_attempt_at, id LIMIT ?"
);

/// Candidates behind the head of their key, parked. Binds: ids.
fn park(n: usize) -> String {
    format!(
        "UPDATE outbox_message SET parked = 1 WHERE id IN ({})",
        placeholders(n)
    )
}

/// The chosen heads leased and read. Binds: token, lease µs, ids.
fn lease(n: usize) -> String {
    format!(
        concat!(
            "UPDATE outbox_message SET locked_by = ?, attempts = attempts + 1, \
             next_attempt_at = ",
            now_plus_bind!(),
            " WHERE id IN ({}) \
             RETURNING id, message_id, message_type, payload, ordering_key, attempts, headers, \
             priority, ",
            micros_of!("created_at"),
            " AS created_micros, ",
            micros_of!("resumed_at"),
            " AS resumed_micros, subscription_id"
        ),
        placeholders(n)
    )
}

/// Done messages removed if still leased under their claims, one `(token, ids)` group per
/// claim. Binds: per group, token and ids.
fn delete_done(groups: &[(String, Vec<i64>)]) -> String {
    let owned: Vec<String> = groups
        .iter()
        .map(|(_, ids)| format!("(locked_by = ? AND id IN ({}))", placeholders(ids.len())))
        .collect();
    format!("DELETE FROM outbox_message WHERE {}", owned.join(" OR "))
}

/// Messages given back undone, the attempt not counted. Binds: token, ids.
fn release(n: usize) -> String {
    format!(
        concat!(
            "UPDATE outbox_message SET locked_by = NULL, next_attempt_at = ",
            now!(),
            ", attempts = attempts - 1 WHERE locked_by = ? AND id IN ({})"
        ),
        placeholders(n)
    )
}

/// One message copied to the dead letters if its claim holds it (replacing a dead letter at its
/// position, which only a row edited by hand could leave). Binds: error, id, token.
pub(crate) const COPY_TO_DEAD: &str = concat!(
    "INSERT INTO outbox_failure (id, message_id, message_type, payload, ordering_key, attempts, \
         last_error, created_at, failed_at, headers, priority, group_name, owner, \
         subscription_id) \
     SELECT id, message_id, message_type, payload, ordering_key, attempts, ?, created_at, ",
    now!(),
    ", headers, priority, group_name, owner, subscription_id FROM outbox_message \
     WHERE id = ? AND locked_by = ? \
     ON CONFLICT (id) DO UPDATE SET message_id = excluded.message_id, \
         message_type = excluded.message_type, payload = excluded.payload, \
         ordering_key = excluded.ordering_key, attempts = excluded.attempts, \
         headers = excluded.headers, priority = excluded.priority, \
         group_name = excluded.group_name, owner = excluded.owner, \
         subscription_id = excluded.subscription_id, last_error = excluded.last_error, \
         created_at = excluded.created_at, failed_at = excluded.failed_at"
);

/// The copied message removed, in the same write transaction as the copy. Binds: id, token.
pub(crate) const DELETE_OWNED: &str = "DELETE FROM outbox_message WHERE id = ? AND locked_by = ?";

/// The lowest pending message of each key unparked, if parked: a `min` per key, which SQLite
/// reads off the ordering index in one probe (`min(..) GROUP BY` would read every pending row
/// of the keys). Binds: keys.
fn promote_heads(n: usize) -> String {
    format!(
        "UPDATE outbox_message SET parked = 0 WHERE parked = 1 AND id IN (\
            SELECT (SELECT min(m.id) FROM outbox_message m WHERE m.ordering_key = k.column1) \
            FROM (VALUES {}) AS k)",
        vec!["(?)"; n].join(", ")
    )
}

/// Of some ids, those still in the outbox. Binds: ids.
fn present(n: usize) -> String {
    format!(
        "SELECT id FROM outbox_message WHERE id IN ({})",
        placeholders(n)
    )
}

/// Of some ids, those leased to another claim. Binds: token, ids.
fn held_by_others(n: usize) -> String {
    format!(
        "SELECT id FROM outbox_message \
         WHERE locked_by IS NOT NULL AND locked_by <> ? AND id IN ({})",
        placeholders(n)
    )
}

/// Leases renewed while the claim holds them. Binds: lease µs, token, ids.
fn extend_leases(n: usize) -> String {
    format!(
        concat!(
            "UPDATE outbox_message SET next_attempt_at = ",
            now_plus_bind!(),
            " WHERE locked_by = ? AND id IN ({}) RETURNING id"
        ),
        placeholders(n)
    )
}

/// The safety net of parking: the lowest parked message of each key with parked messages (from
/// the parked rows' own index), unparked if no lower position of its key is pending.
pub(crate) const PROMOTE_STRANDED: &str = "UPDATE outbox_message SET parked = 0 \
     WHERE id IN (SELECT min(id) FROM outbox_message WHERE parked = 1 GROUP BY ordering_key) \
     AND NOT EXISTS (SELECT 1 FROM outbox_message e \
         WHERE e.ordering_key = outbox_message.ordering_key AND e.id < outbox_message.id)";

/// The columns of a pending message as listed, from the outbox table.
macro_rules! pending_columns {
    () => {
        concat!(
            "SELECT id, message_id, message_type, substr(payload, 1, ?) AS payload, ordering_key, \
             attempts, headers, ",
            micros_of!("created_at"),
            " AS created_at, ",
            micros_of!("next_attempt_at"),
            " AS next_attempt_at, \
             CASE WHEN locked_by IS NOT NULL AND next_attempt_at > ",
            now!(),
            " THEN 1 ELSE 0 END AS in_flight, parked, paused, priority, group_name, \
             last_error \
             FROM outbox_message "
        )
    };
}

/// One attempt into the delivery log. Binds: see `LoggedRow::binds`.
pub(crate) const INSERT_ATTEMPT: &str = "INSERT INTO outbox_attempt \
     (message_id, message_type, destination, subscription_id, attempt, outcome, status, answer, \
      error, latency_micros, started_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%d %H:%M:%f', ? / 1000000.0, 'unixepoch'))";

/// The columns of a dead letter as listed.
macro_rules! dead_letter_columns {
    () => {
        concat!(
            "SELECT id, message_id, message_type, substr(payload, 1, ?) AS payload, ordering_key, \
             attempts, headers, last_error, ",
            micros_of!("created_at"),
            " AS created_at, ",
            micros_of!("failed_at"),
            " AS failed_at FROM outbox_failure "
        )
    };
}

/// The dead letters of a selection (the write transaction holds them). Binds: type (NULL:
/// every one).
pub(crate) const SELECT_DEAD: &str = "SELECT id FROM outbox_failure \
     WHERE message_type = COALESCE(?, message_type) ORDER BY id";

/// Dead letters at some positions. Binds: ids.
fn select_dead_at(n: usize) -> String {
    format!(
        "SELECT id FROM outbox_failure WHERE id IN ({}) ORDER BY id",
        placeholders(n)
    )
}

/// Dead letters copied back into the outbox at their positions, as first attempts. Binds: ids.
fn requeue(n: usize) -> String {
    format!(
        concat!(
            "INSERT INTO outbox_message (id, message_id, message_type, payload, payload_bytes, \
                 ordering_key, attempts, created_at, next_attempt_at, last_error, headers, \
                 priority, group_name, owner, subscription_id) \
             SELECT id, message_id, message_type, payload, length(CAST(payload AS BLOB)), \
                 ordering_key, 0, created_at, ",
            now!(),
            ", last_error, headers, priority, group_name, owner, subscription_id \
             FROM outbox_failure WHERE id IN ({}) \
             ORDER BY id"
        ),
        placeholders(n)
    )
}

/// The groups of dead letters about to be re-queued, listed again (the housekeeper removes a
/// group once empty). Binds: ids.
fn list_groups_of_dead(n: usize) -> String {
    format!(
        "INSERT OR IGNORE INTO outbox_group (name) \
         SELECT DISTINCT group_name FROM outbox_failure \
         WHERE id IN ({}) AND group_name IS NOT NULL",
        placeholders(n)
    )
}

/// Groups listed for claims (a group listed already is left alone). Binds: names.
fn register_groups(n: usize) -> String {
    format!(
        "INSERT OR IGNORE INTO outbox_group (name) VALUES {}",
        vec!["(?)"; n].join(", ")
    )
}

/// Groups without a pending unparked message removed (one probe of the grouped index each).
pub(crate) const REMOVE_EMPTY_GROUPS: &str = "DELETE FROM outbox_group WHERE NOT EXISTS (\
     SELECT 1 FROM outbox_message m WHERE m.group_name = outbox_group.name AND m.parked = 0)";

/// The groups a claim visits: up to eight after the last claim's last group, and up to eight
/// from the first (the claim keeps eight in all). Binds: the last group, twice.
pub(crate) const GROUPS: &str = "SELECT * FROM (SELECT name, 0 AS pass FROM outbox_group \
         WHERE name > ? ORDER BY name LIMIT 8) \
     UNION ALL SELECT * FROM (SELECT name, 1 AS pass FROM outbox_group WHERE name <= ? \
         ORDER BY name LIMIT 8)";

/// Dead letters deleted. Binds: ids.
fn purge_at(n: usize) -> String {
    format!(
        "DELETE FROM outbox_failure WHERE id IN ({})",
        placeholders(n)
    )
}

/// Dead letters of a type deleted (NULL: every one). Binds: type.
pub(crate) const PURGE: &str =
    "DELETE FROM outbox_failure WHERE message_type = COALESCE(?, message_type)";

/// Keys stamped settled whose message has left the outbox and the dead letters (a dead letter
/// may still be re-queued). Binds: positions.
fn settle_keys(n: usize) -> String {
    format!(
        concat!(
            "UPDATE outbox_idempotency AS k SET settled_at = ",
            now!(),
            " WHERE settled_at IS NULL AND message_position IN ({}) \
             AND NOT EXISTS (SELECT 1 FROM outbox_message m WHERE m.id = k.message_position) \
             AND NOT EXISTS (SELECT 1 FROM outbox_failure f WHERE f.id = k.message_position)"
        ),
        placeholders(n)
    )
}

/// The groups a claim visits, in turn.
fn groups_to_visit(c: &mut SqliteConnection, claim: &Claim<'_>) -> QueryResult<Vec<String>> {
    let after = Bind::Text(claim.groups_after);
    Ok(super::groups_in_turn(
        Prepared::new(GROUPS, STYLE, &[after, after]).load(c)?,
    ))
}

/// The columns of a subscription as read ([`SubscriptionRow`]).
macro_rules! subscription_columns {
    () => {
        concat!(
            "SELECT id, owner, url, event_types, secret, \
                 CASE WHEN previous_secret_until > ",
            now!(),
            " THEN previous_secret END AS previous_secret, \
                 rate_limit, allow_http, description, metadata, enabled, ",
            micros_of!("created_at"),
            " AS created_micros, ",
            micros_of!("updated_at"),
            " AS updated_micros, ",
            micros_of!("previous_secret_until"),
            " AS previous_until_micros FROM outbox_subscription "
        )
    };
}

/// One delivery per subscription of an event, in the order given: the event's id, type,
/// payload, headers, priority, group, owner and enqueue time, due now. Binds: per delivery its
/// subscription id and ordering key, then the event's position.
fn insert_deliveries(n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| format!("SELECT ? AS subscription, ? AS ordering_key, {i} AS n"))
        .collect();
    format!(
        concat!(
            "INSERT INTO outbox_message (message_id, message_type, payload, payload_bytes, \
                 ordering_key, created_at, next_attempt_at, headers, priority, group_name, owner, \
                 subscription_id) \
             SELECT e.message_id, e.message_type, e.payload, e.payload_bytes, d.ordering_key, \
                 e.created_at, ",
            now!(),
            ", e.headers, e.priority, e.group_name, e.owner, d.subscription \
             FROM outbox_message e JOIN ({}) d \
             WHERE e.id = ? ORDER BY d.n"
        ),
        rows.join(" UNION ALL ")
    )
}

/// The filters of a cancel, in its binds' order: message id, type, subscription, age in µs.
/// A filter not given (NULL) takes every row.
macro_rules! cancel_filters {
    () => {
        "message_id = COALESCE(?, message_id) \
         AND message_type = COALESCE(?, message_type) \
         AND COALESCE(?, subscription_id) IS subscription_id \
         AND created_at <= strftime('%Y-%m-%d %H:%M:%f', 'now', \
             printf('%+.6f seconds', -COALESCE(?, 0) / 1000000.0))"
    };
}

/// The rows a cancel takes: those no claim holds (a write transaction: no other holds any).
/// Binds: the filters, limit.
pub(crate) const CANCELLABLE: &str = concat!(
    "SELECT id, ordering_key FROM outbox_message WHERE ",
    cancel_filters!(),
    " AND (locked_by IS NULL OR next_attempt_at <= ",
    now!(),
    ") ORDER BY id LIMIT ?"
);

/// How many rows of a cancel a claim holds. Binds: the filters.
pub(crate) const CANCEL_IN_FLIGHT: &str = concat!(
    "SELECT count(*) AS n FROM outbox_message WHERE ",
    cancel_filters!(),
    " AND locked_by IS NOT NULL AND next_attempt_at > ",
    now!()
);

/// Deletes rows. Binds: ids.
fn delete_at(n: usize) -> String {
    format!(
        "DELETE FROM outbox_message WHERE id IN ({})",
        placeholders(n)
    )
}

/// Copies rows to `outbox_cancelled`. Binds: reason, ids.
fn copy_to_cancelled(n: usize) -> String {
    format!(
        "INSERT INTO outbox_cancelled (id, message_id, message_type, payload, ordering_key, \
             attempts, created_at, headers, priority, group_name, owner, subscription_id, \
             reason) \
         SELECT id, message_id, message_type, payload, ordering_key, attempts, created_at, \
             headers, priority, group_name, owner, subscription_id, ? \
         FROM outbox_message WHERE id IN ({})",
        placeholders(n)
    )
}

impl CancelStatements for SqliteConnection {
    fn cancellable(&mut self, rows: &CancelRows<'_>) -> QueryResult<Vec<KeyedRow>> {
        Prepared::new(CANCELLABLE, STYLE, &rows.cancellable_binds()).load(self)
    }

    fn cancel_in_flight(&mut self, rows: &CancelRows<'_>) -> QueryResult<i64> {
        let counted: Vec<CountRow> =
            Prepared::new(CANCEL_IN_FLIGHT, STYLE, &rows.filter_binds()).load(self)?;
        Ok(counted.first().map_or(0, |row| row.n))
    }

    fn move_to_cancelled(&mut self, ids: &[i64], reason: &str) -> QueryResult<usize> {
        let mut moved = 0;
        for chunk in ids.chunks(ID_CHUNK) {
            moved += dynamic::<Sqlite>(
                &copy_to_cancelled(chunk.len()),
                &with_ids(&[Bind::Text(reason)], chunk),
            )
            .execute(self)?;
            dynamic::<Sqlite>(&delete_at(chunk.len()), &ids_bound(chunk)).execute(self)?;
        }
        Ok(moved)
    }

    fn cancel_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T> {
        write(self, body)
    }
}

fn run(c: &mut SqliteConnection, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize> {
    Prepared::new(sql, STYLE, binds).execute(c)
}

fn ids_bound(ids: &[i64]) -> Vec<Bind<'_>> {
    ids.iter().map(|id| Bind::BigInt(*id)).collect()
}

/// `binds` followed by one bind per id.
fn with_ids<'a>(binds: &[Bind<'a>], ids: &[i64]) -> Vec<Bind<'a>> {
    let mut all = binds.to_vec();
    all.extend(ids.iter().map(|id| Bind::BigInt(*id)));
    all
}

fn load_ids(c: &mut SqliteConnection, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<i64>> {
    let rows: Vec<IdRow> = dynamic::<Sqlite>(sql, binds).load(c)?;
    Ok(rows.into_iter().map(|row| row.id).collect())
}

/// A write transaction: `BEGIN IMMEDIATE`, or a savepoint inside an open transaction.
fn write<T>(
    c: &mut SqliteConnection,
    body: impl FnOnce(&mut SqliteConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    if super::transaction_open(c)? {
        c.transaction(body)
    } else {
        c.immediate_transaction(body)
    }
}

/// A claim candidate: its position, whether it heads its key, its payload size.
#[derive(diesel::QueryableByName)]
struct Candidate {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    head: i32,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    size: i64,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    priority: i32,
    #[diesel(sql_type = diesel::sql_types::Text)]
    due: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    group_name: Option<String>,
}

impl SubscriptionDialect for SqliteConnection {
    /// A subscription removed. Binds: id.
    const DELETE_SUBSCRIPTION: &'static str = "DELETE FROM outbox_subscription WHERE id = ?";

    /// A removed subscription's pending deliveries that no claim holds, removed. Binds: id.
    const DELETE_SUBSCRIPTION_DELIVERIES: &'static str = concat!(
        "DELETE FROM outbox_message WHERE subscription_id = ? \
         AND (locked_by IS NULL OR next_attempt_at <= ",
        now!(),
        ")"
    );

    /// The enabled subscriptions of an event's owner created no later than the event (a
    /// subscription added later gets only later events). Binds: the event's position.
    const FAN_OUT_CANDIDATES: &'static str = "SELECT s.id, s.event_types \
         FROM outbox_message e JOIN outbox_subscription s \
             ON s.owner IS e.owner AND s.created_at <= e.created_at \
         WHERE e.id = ? AND s.enabled = 1 ORDER BY s.created_at, s.id";

    /// A new subscription. Binds: id, owner, URL, filters (JSON), secret, rate limit, whether
    /// `http` is allowed, description, metadata (JSON), enabled.
    const INSERT_SUBSCRIPTION: &'static str = "INSERT INTO outbox_subscription \
         (id, owner, url, event_types, secret, rate_limit, allow_http, description, metadata, \
          enabled) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

    /// The event a fan-out holds, if its claim holds it (the fan-out's write transaction holds
    /// the one writer lock). Binds: position, token.
    const LOCK_EVENT: &'static str = "SELECT message_type, ordering_key FROM outbox_message \
         WHERE id = ? AND locked_by = ?";

    /// The paused deliveries of a subscription enabled again, due now. Binds: id.
    const RELEASE_SUBSCRIPTION: &'static str = concat!(
        "UPDATE outbox_message SET paused = 0, next_attempt_at = ",
        now!(),
        ", resumed_at = ",
        now!(),
        " WHERE subscription_id = ? AND paused = 1 AND locked_by IS NULL"
    );

    /// A subscription's stored secrets rewritten. Binds: secret, previous secret, id.
    const RESEAL_SUBSCRIPTION_SECRETS: &'static str =
        "UPDATE outbox_subscription SET secret = ?, previous_secret = ? WHERE id = ?";

    /// A subscription's new secret; the old one stays the previous secret for the overlap. Binds:
    /// secret, overlap µs, id.
    const ROTATE_SUBSCRIPTION_SECRET: &'static str = concat!(
        "UPDATE outbox_subscription SET previous_secret = secret, secret = ?, \
             previous_secret_until = ",
        now_plus_bind!(),
        ", updated_at = ",
        now!(),
        " WHERE id = ?"
    );

    /// A subscription enabled or disabled. Binds: enabled, id.
    const SET_SUBSCRIPTION_ENABLED: &'static str = concat!(
        "UPDATE outbox_subscription SET enabled = ?, updated_at = ",
        now!(),
        " WHERE id = ?"
    );

    /// One subscription. Binds: id.
    const SUBSCRIPTION: &'static str = concat!(subscription_columns!(), "WHERE id = ?");

    /// Every subscription, oldest first.
    const SUBSCRIPTIONS: &'static str = concat!(subscription_columns!(), "ORDER BY created_at, id");

    /// One owner's subscriptions, oldest first. Binds: owner (NULL: those without an owner).
    const SUBSCRIPTIONS_OF: &'static str = concat!(
        subscription_columns!(),
        "WHERE owner IS ? ORDER BY created_at, id"
    );
}

impl SubscriptionStatements for SqliteConnection {
    fn insert_deliveries(
        &mut self,
        id: i64,
        deliveries: &[(&str, Option<String>)],
    ) -> QueryResult<()> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let sql = insert_deliveries(deliveries.len());
        let mut binds: Vec<Bind<'_>> = deliveries
            .iter()
            .flat_map(|(subscription, key)| {
                [Bind::Text(subscription), Bind::NullableText(key.as_deref())]
            })
            .collect();
        binds.push(Bind::BigInt(id));
        dynamic::<Sqlite>(&sql, &binds).execute(self).map(drop)
    }
}

impl Dialect for SqliteConnection {
    /// A destination recorded as healthy unless it is known. Binds: name.
    const ADD_DESTINATION: &'static str = "INSERT INTO outbox_destination (name, kind, state) \
         VALUES (?, ?, 'healthy') ON CONFLICT (name) DO NOTHING";

    /// The backlog for the worker's gauges: messages in the outbox, and the microseconds the oldest
    /// due, unheld message has waited (NULL: none waits; held messages are due at their lease's
    /// end, so they are not due). The second is the first entry of the due index.
    const BACKLOG: &'static str = concat!(
        "SELECT (SELECT COUNT(*) FROM outbox_message) AS pending, (SELECT ",
        micros_of!("'now'"),
        " - ",
        micros_of!("MIN(next_attempt_at)"),
        " FROM outbox_message WHERE NOT parked AND next_attempt_at <= ",
        now!(),
        ") AS oldest_due_micros, NULL AS oldest_due_at"
    );

    /// Heads of ordering keys that failed and wait for a retry, holding up the messages behind
    /// them, soonest retry first; with how many wait behind each (one probe of the ordering index
    /// per key). Binds: limit.
    const BLOCKED_KEYS: &'static str = concat!(
        "SELECT h.ordering_key, h.id, h.message_id, h.message_type, h.attempts, h.last_error, ",
        micros_of!("h.next_attempt_at"),
        " AS next_attempt_at, \
         (SELECT COUNT(*) FROM outbox_message w \
          WHERE w.ordering_key = h.ordering_key AND w.id > h.id) AS waiting \
         FROM outbox_message h \
         WHERE h.parked = 0 AND h.ordering_key IS NOT NULL AND h.last_error IS NOT NULL \
         ORDER BY h.next_attempt_at, h.id LIMIT ?"
    );

    /// A dead letter by its message id (indexed). Binds: characters of its payload to read, id.
    const DEAD_BY_MESSAGE_ID: &'static str =
        concat!(dead_letter_columns!(), "WHERE message_id = ?");

    /// The positions of the dead letters of a type (NULL: every one), without their payloads.
    /// Binds: type.
    const DEAD_POSITIONS: &'static str = SELECT_DEAD;

    /// Every destination, by name.
    const DESTINATIONS: &'static str = concat!(
        "SELECT name, kind, state, consecutive_failures, last_error, ",
        micros_of!("next_probe_at"),
        " AS next_probe_at, disabled_reason, ",
        micros_of!("reported_at"),
        " AS reported_at FROM outbox_destination ORDER BY name"
    );

    /// An operator's disable, which the workers adopt. Binds: reason, name.
    const DISABLE_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET state = 'disabled', next_probe_at = NULL, disabled_reason = ? WHERE name = ?";

    /// An operator's enable: healthy again, and one more enable for the workers to follow. Binds:
    /// name.
    const ENABLE_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET state = 'healthy', consecutive_failures = 0, last_error = NULL, next_probe_at = NULL, \
             disabled_reason = NULL, enables = enables + 1 \
         WHERE name = ?";

    /// Keys settled longer ago than the window deleted, at most a batch. Binds: window µs, limit.
    const EXPIRE_KEYS: &'static str = "DELETE FROM outbox_idempotency WHERE rowid IN (\
         SELECT rowid FROM outbox_idempotency WHERE settled_at <= \
         strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ? / 1000000.0)) LIMIT ?)";

    /// Revoked admin sessions that have expired anyway, forgotten. Binds: now (Unix seconds).
    const FORGET_REVOKED: &'static str = "DELETE FROM outbox_admin_revoked WHERE expires_at < ?";

    /// A received webhook id recorded unless recorded. Binds: id.
    const INBOX_RECORD: &'static str = "INSERT OR IGNORE INTO outbox_inbox (webhook_id) VALUES (?)";

    /// Inbox ids older than some age deleted, a batch at a time. Binds: age µs, limit.
    const INBOX_SWEEP: &'static str = "DELETE FROM outbox_inbox WHERE rowid IN (\
         SELECT rowid FROM outbox_inbox WHERE received_at < \
         strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ? / 1000000.0)) LIMIT ?)";

    /// The message an idempotency key was recorded for. Binds: key.
    const KEYED_MESSAGE: &'static str =
        "SELECT message_id FROM outbox_idempotency WHERE idempotency_key = ?";

    /// A destination as the store keeps it (the transaction is a write transaction already, so
    /// nobody changes it meanwhile). Binds: name.
    const LOCK_DESTINATION: &'static str =
        "SELECT name, state, disabled_reason, enables FROM outbox_destination WHERE name = ?";

    /// A destination's turns under a rate limit across processes, with the database's clock in
    /// µs, (the transaction is a write transaction already, so nobody takes one meanwhile). Binds: name.
    const LOCK_TURNS: &'static str = concat!(
        "SELECT turn_tokens, turns_refilled, turns_booked_until, last_turn, ",
        micros_of!("'now'"),
        " AS now FROM outbox_destination WHERE name = ?"
    );

    /// An operator's pause, unless that one is paused already. Binds: kind, name, reason.
    const PAUSE: &'static str =
        "INSERT OR IGNORE INTO outbox_pause (kind, name, reason) VALUES (?, ?, ?)";

    /// Every pause, by kind and name.
    const PAUSES: &'static str = concat!(
        "SELECT kind, name, reason, ",
        micros_of!("paused_at"),
        " AS paused_at FROM outbox_pause ORDER BY kind, name"
    );

    /// One message found paused by its worker: given back without counting the attempt, marked
    /// paused, and due too far ahead for any claim until a resume releases it. Binds: delay µs,
    /// reason, id, token.
    const PAUSE_MESSAGE: &'static str = concat!(
        "UPDATE outbox_message SET locked_by = NULL, paused = 1, next_attempt_at = ",
        now_plus_bind!(),
        ", last_error = ?, attempts = attempts - 1 WHERE id = ? AND locked_by = ?"
    );

    /// A pending message by its message id: the outbox table has no index on it (every enqueue
    /// would pay for one), so this reads the table, as only an operator's lookup does. Binds:
    /// characters of its payload to read, id.
    const PENDING_BY_MESSAGE_ID: &'static str = concat!(pending_columns!(), "WHERE message_id = ?");

    /// Dead letters that failed longer ago than some age deleted, oldest first, a batch at a time
    /// (the `failed_at` index bounds the read). Binds: age µs, limit.
    const PRUNE_DEAD_LETTERS: &'static str = "DELETE FROM outbox_failure WHERE id IN (\
         SELECT id FROM outbox_failure WHERE failed_at < \
         strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ? / 1000000.0)) \
         ORDER BY failed_at LIMIT ?)";

    /// Every paused message whose type is not paused (any more) due at once, from the paused rows'
    /// own index.
    const RELEASE_PAUSED: &'static str = concat!(
        "UPDATE outbox_message SET paused = 0, next_attempt_at = ",
        now!(),
        ", resumed_at = ",
        now!(),
        " WHERE paused = 1 AND locked_by IS NULL \
           AND message_type NOT IN (SELECT name FROM outbox_pause WHERE kind = 'type')"
    );

    /// A worker's report of a destination's health. Binds: kind, state, consecutive failures,
    /// last error, µs until the next probe (NULL: none; a NULL modifier makes `strftime` NULL),
    /// why it is disabled, name.
    const REPORT_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET kind = ?, state = ?, consecutive_failures = ?, last_error = ?, \
             next_probe_at = strftime('%Y-%m-%d %H:%M:%f', 'now', (? / 1000000.0) || ' seconds'), \
             disabled_reason = ?, reported_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
         WHERE name = ?";

    /// An idempotency key recorded for a message unless recorded (one writer at a time: another
    /// transaction with the same key has committed or rolled back). Binds: key, message id.
    const RESERVE_KEY: &'static str =
        "INSERT OR IGNORE INTO outbox_idempotency (idempotency_key, message_id) VALUES (?, ?)";

    /// An operator's resume. Binds: kind, name.
    const RESUME: &'static str = "DELETE FROM outbox_pause WHERE kind = ? AND name = ?";

    /// An admin session ended by a sign-out, until it would have expired. Binds: session id,
    /// expiry (Unix seconds).
    const REVOKE_SESSION: &'static str =
        "INSERT OR IGNORE INTO outbox_admin_revoked (session_id, expires_at) VALUES (?, ?)";

    /// Whether an admin session signed out (1) or not (0). Binds: session id.
    const SESSION_REVOKED: &'static str =
        "SELECT COUNT(*) AS found FROM outbox_admin_revoked WHERE session_id = ?";

    /// The position of the message this connection inserted last, stored with its key. Binds:
    /// key.
    const SET_KEY_POSITION: &'static str = "UPDATE outbox_idempotency \
         SET message_position = last_insert_rowid() WHERE idempotency_key = ?";

    /// Keys not stamped settled, by their message's position, from a position on. Binds: after,
    /// limit.
    const UNSETTLED_KEYS: &'static str = "SELECT message_position AS id FROM outbox_idempotency \
         WHERE settled_at IS NULL AND message_position > ? ORDER BY message_position LIMIT ?";

    /// A destination's turns written back. Binds: tokens in millionths, refilled µs, booked-until
    /// µs (NULL: nobody in line), last turn µs, name.
    const WRITE_TURNS: &'static str = "UPDATE outbox_destination \
         SET turn_tokens = ?, turns_refilled = ?, turns_booked_until = ?, \
             last_turn = ? \
         WHERE name = ?";

    /// Dead letters, by position. Binds: characters of each payload to read, type (NULL: any), key
    /// twice (NULL: any), from position, limit.
    const DEAD_LETTERS: &'static str = concat!(
        dead_letter_columns!(),
        "WHERE message_type = COALESCE(?, message_type) \
         AND (? IS NULL OR ordering_key = ?) AND id >= ? ORDER BY id LIMIT ?"
    );

    /// Pending messages, by position: a page reads the primary key from its first position on,
    /// however deep it is (a type or attempts filter walks it until the page is full). Binds:
    /// characters of each payload to read, type (NULL: any), least attempts, due only (0/1), from
    /// position, limit.
    const PENDING: &'static str = concat!(
        pending_columns!(),
        "WHERE message_type = COALESCE(?, message_type) AND attempts >= ? \
         AND (? = 0 OR (parked = 0 AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now'))) \
         AND id >= ? ORDER BY id LIMIT ?"
    );

    /// The pending messages of one ordering key, by position: the ordering index gives them in
    /// order. Binds: characters of each payload to read, key, then as [`PENDING`](Self::PENDING).
    const PENDING_BY_KEY: &'static str = concat!(
        pending_columns!(),
        "WHERE ordering_key = ? AND message_type = COALESCE(?, message_type) AND attempts >= ? \
         AND (? = 0 OR (parked = 0 AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now'))) \
         AND id >= ? ORDER BY ordering_key, id LIMIT ?"
    );

    /// One message scheduled for later with its last error. Binds: delay µs, text, attempts to
    /// take back (0 or 1), id, token.
    const RESCHEDULE: &'static str = concat!(
        "UPDATE outbox_message SET locked_by = NULL, next_attempt_at = ",
        now_plus_bind!(),
        ", last_error = ?, attempts = attempts - ? WHERE id = ? AND locked_by = ?"
    );

    /// Dead-letter counts by type.
    const STATS_DEAD: &'static str = "SELECT message_type, COUNT(*) AS total, \
             COUNT(CASE WHEN 1 = 0 THEN 1 END) AS in_flight, NULL AS oldest \
         FROM outbox_failure GROUP BY message_type";

    /// Pending and in-flight counts and the oldest enqueue time, by type.
    const STATS_PENDING: &'static str = concat!(
        "SELECT message_type, COUNT(*) AS total, \
             COUNT(CASE WHEN locked_by IS NOT NULL AND next_attempt_at > ",
        now!(),
        " THEN 1 END) AS in_flight, ",
        micros_of!("MIN(created_at)"),
        " AS oldest FROM outbox_message GROUP BY message_type"
    );
}

impl<R: QueryableByName<Sqlite> + 'static> LoadFixed<R> for SqliteConnection {
    fn load_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<Vec<R>> {
        Prepared::new(sql, STYLE, binds).load(self)
    }
}

impl Statements for SqliteConnection {
    fn insert_messages(&mut self, rows: &[NewMessage]) -> QueryResult<()> {
        const BINDS: usize = NewMessage::BINDS + 1;
        for chunk in NewMessage::chunks(rows, MAX_BINDS / BINDS) {
            if let [row] = chunk {
                run(self, INSERT_MESSAGE, &row.binds_with_key())?;
                continue;
            }
            let sql = format!(
                "{INSERT_MESSAGE}{}",
                concat!(", ", insert_values!()).repeat(chunk.len() - 1)
            );
            let binds: Vec<Bind<'_>> = chunk.iter().flat_map(NewMessage::binds_with_key).collect();
            dynamic::<Sqlite>(&sql, &binds).execute(self)?;
        }
        Ok(())
    }

    fn claim(&mut self, claim: &Claim<'_>, _from: Cursor) -> QueryResult<Claimed> {
        // SQLite removes a deleted row from its indexes at once: nothing dead to walk past, so
        // every claim reads from the start.
        write(self, |c| {
            let limit = Bind::BigInt(claim.candidates());
            let read: Vec<Candidate> = Prepared::new(CANDIDATES, STYLE, &[limit, limit]).load(c)?;
            let groups = groups_to_visit(c, claim)?;
            let mut shares = Vec::with_capacity(groups.len());
            for group in &groups {
                let binds = [Bind::Text(group), Bind::BigInt(claim.per_group())];
                shares.push(Prepared::new(GROUP_SHARE, STYLE, &binds).load::<Candidate>(c)?);
            }
            let last_group = groups.last().cloned();
            let mut candidates = super::share_out(
                read,
                shares,
                |cand| cand.id,
                |cand| cand.group_name.as_deref(),
                |cand| cand.priority > 0,
                |cand| (Reverse(cand.priority), cand.due.clone(), cand.id),
            );
            candidates.truncate(usize::try_from(claim.candidates()).unwrap_or(usize::MAX));
            let behind: Vec<i64> = candidates
                .iter()
                .filter(|cand| cand.head == 0)
                .map(|cand| cand.id)
                .collect();
            if !behind.is_empty() {
                dynamic::<Sqlite>(&park(behind.len()), &ids_bound(&behind)).execute(c)?;
            }
            let heads: Vec<&Candidate> = candidates.iter().filter(|cand| cand.head != 0).collect();
            let take = claim.limit.take(
                heads
                    .iter()
                    .map(|h| usize::try_from(h.size).unwrap_or(usize::MAX)),
            );
            let chosen: Vec<i64> = heads.iter().take(take).map(|h| h.id).collect();
            if chosen.is_empty() {
                return Ok(Claimed {
                    last_group,
                    ..Claimed::default()
                });
            }
            let binds = with_ids(
                &[Bind::Text(claim.token), Bind::BigInt(claim.lease_micros)],
                &chosen,
            );
            let mut rows: Vec<ClaimRow> =
                dynamic::<Sqlite>(&lease(chosen.len()), &binds).load(c)?;
            // Handed to the handlers by priority, then position: a raised priority first in
            // its batch too (RETURNING promises no order).
            rows.sort_by_key(|row| (Reverse(row.priority), row.message.id));
            Ok(Claimed {
                rows,
                first: None,
                last_group,
            })
        })
    }

    fn register_groups(&mut self, groups: &[&str]) -> QueryResult<()> {
        let binds: Vec<Bind<'_>> = groups.iter().map(|group| Bind::Text(group)).collect();
        dynamic::<Sqlite>(&register_groups(groups.len()), &binds)
            .execute(self)
            .map(drop)
    }

    fn remove_empty_groups(&mut self) -> QueryResult<usize> {
        run(self, REMOVE_EMPTY_GROUPS, &[])
    }

    fn delete_done(&mut self, claims: &[(String, Vec<i64>)], keys: &[&str]) -> QueryResult<usize> {
        let mut binds = Vec::new();
        for (token, ids) in claims {
            binds.push(Bind::Text(token));
            binds.extend(ids.iter().map(|id| Bind::BigInt(*id)));
        }
        let sql = delete_done(claims);
        if keys.is_empty() {
            return dynamic::<Sqlite>(&sql, &binds).execute(self);
        }
        write(self, |c| {
            let deleted = dynamic::<Sqlite>(&sql, &binds).execute(c)?;
            c.promote_heads(keys)?;
            Ok(deleted)
        })
    }

    fn release(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize> {
        dynamic::<Sqlite>(&release(ids.len()), &with_ids(&[Bind::Text(token)], ids)).execute(self)
    }

    fn dead_letter(&mut self, token: &str, id: i64, error: &str) -> QueryResult<bool> {
        write(self, |c| {
            let copied = run(
                c,
                COPY_TO_DEAD,
                &[Bind::Text(error), Bind::BigInt(id), Bind::Text(token)],
            )?;
            if copied == 0 {
                return Ok(false);
            }
            run(c, DELETE_OWNED, &[Bind::BigInt(id), Bind::Text(token)])?;
            Ok(true)
        })
    }

    fn promote_heads(&mut self, keys: &[&str]) -> QueryResult<()> {
        for chunk in keys.chunks(ID_CHUNK) {
            let binds: Vec<Bind<'_>> = chunk.iter().map(|key| Bind::Text(key)).collect();
            dynamic::<Sqlite>(&promote_heads(chunk.len()), &binds).execute(self)?;
        }
        Ok(())
    }

    fn present(&mut self, ids: &[i64]) -> QueryResult<Vec<i64>> {
        let mut found = Vec::new();
        for chunk in ids.chunks(ID_CHUNK) {
            found.extend(load_ids(self, &present(chunk.len()), &ids_bound(chunk))?);
        }
        Ok(found)
    }

    fn held_by_others(&mut self, token: &str, ids: &[i64]) -> QueryResult<Vec<i64>> {
        load_ids(
            self,
            &held_by_others(ids.len()),
            &with_ids(&[Bind::Text(token)], ids),
        )
    }

    fn extend_leases(
        &mut self,
        token: &str,
        ids: &[i64],
        lease_micros: i64,
    ) -> QueryResult<Vec<i64>> {
        let binds = with_ids(&[Bind::BigInt(lease_micros), Bind::Text(token)], ids);
        load_ids(self, &extend_leases(ids.len()), &binds)
    }

    fn promote_stranded(&mut self) -> QueryResult<usize> {
        run(self, PROMOTE_STRANDED, &[])
    }

    fn settle_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T> {
        write(self, body)
    }

    fn requeue(&mut self, selection: &Selection<'_>) -> QueryResult<Vec<i64>> {
        write(self, |c| {
            let ids = match selection {
                Selection::Positions(ids) => {
                    let mut found = Vec::new();
                    for chunk in ids.chunks(ID_CHUNK) {
                        found.extend(load_ids(
                            c,
                            &select_dead_at(chunk.len()),
                            &ids_bound(chunk),
                        )?);
                    }
                    found
                }
                Selection::MessageType(t) => {
                    load_ids(c, SELECT_DEAD, &[Bind::NullableText(Some(t))])?
                }
                Selection::All => load_ids(c, SELECT_DEAD, &[Bind::NullableText(None)])?,
            };
            for chunk in ids.chunks(ID_CHUNK) {
                dynamic::<Sqlite>(&list_groups_of_dead(chunk.len()), &ids_bound(chunk))
                    .execute(c)?;
                dynamic::<Sqlite>(&requeue(chunk.len()), &ids_bound(chunk)).execute(c)?;
                dynamic::<Sqlite>(&purge_at(chunk.len()), &ids_bound(chunk)).execute(c)?;
            }
            Ok(ids)
        })
    }

    fn purge(&mut self, selection: &Selection<'_>) -> QueryResult<usize> {
        match selection {
            Selection::Positions(ids) => write(self, |c| {
                let mut purged = 0;
                for chunk in ids.chunks(ID_CHUNK) {
                    purged +=
                        dynamic::<Sqlite>(&purge_at(chunk.len()), &ids_bound(chunk)).execute(c)?;
                }
                Ok(purged)
            }),
            Selection::MessageType(t) => run(self, PURGE, &[Bind::NullableText(Some(t))]),
            Selection::All => run(self, PURGE, &[Bind::NullableText(None)]),
        }
    }

    fn settle_idempotency_keys(&mut self, positions: &[i64]) -> QueryResult<usize> {
        dynamic::<Sqlite>(&settle_keys(positions.len()), &ids_bound(positions)).execute(self)
    }

    fn run_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize> {
        run(self, sql, binds)
    }
}

impl DeliveryLogStatements for SqliteConnection {
    const PLACEHOLDERS: Placeholders = STYLE;

    const SELECT: &'static str = concat!(
        "SELECT id, message_id, message_type, destination, subscription_id, attempt, outcome, \
         status, answer, error, latency_micros, ",
        micros_of!("started_at"),
        " AS started_at FROM outbox_attempt"
    );

    fn uuid_param(_: usize) -> String {
        "?".to_owned()
    }

    fn time_param(_: usize) -> String {
        "strftime('%Y-%m-%d %H:%M:%f', ? / 1000000.0, 'unixepoch')".to_owned()
    }

    fn micros_of(column: &str) -> String {
        format!("CAST(ROUND((julianday({column}) - 2440587.5) * 86400000.0) AS INTEGER) * 1000")
    }

    fn execute_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize> {
        dynamic::<Sqlite>(sql, binds).execute(self)
    }

    fn load_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<AttemptRow>> {
        dynamic::<Sqlite>(sql, binds).load(self)
    }

    fn last_attempt_id(&mut self) -> QueryResult<Option<i64>> {
        Prepared::new(LAST_ATTEMPT_ID, STYLE, &[])
            .get_result::<LastIdRow>(self)
            .map(|row| row.id)
    }

    const NOW: &'static str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
    const INSERT_IGNORING: (&'static str, &'static str) = ("INSERT OR IGNORE INTO", "");

    fn load_archived(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<ArchivedRow>> {
        dynamic::<Sqlite>(sql, binds).load(self)
    }

    fn write<T>(&mut self, body: impl FnOnce(&mut Self) -> QueryResult<T>) -> QueryResult<T> {
        write(self, body)
    }

    /// A row a statement, kept prepared: in process, a prepared statement run again costs
    /// less than parsing one built for the call.
    fn insert_attempts(&mut self, rows: &[LoggedRow<'_>]) -> QueryResult<()> {
        for row in rows {
            run(self, INSERT_ATTEMPT, &row.binds())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use diesel::debug_query;

    use super::*;

    #[test]
    fn the_claim_reads_only_unparked_due_rows_and_binds_its_limit() {
        let query = Prepared::new(CANDIDATES, STYLE, &[Bind::BigInt(256), Bind::BigInt(256)]);
        let shown = debug_query::<Sqlite, _>(&query).to_string();
        assert!(
            shown.contains(
                "WHERE priority > 0 AND parked = 0 \
                 AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') \
                 ORDER BY priority DESC, next_attempt_at, id LIMIT ?"
            ),
            "the raised priorities, by their partial index: {shown}"
        );
        assert!(
            shown.contains(
                "WHERE priority <= 0 AND parked = 0 \
                 AND next_attempt_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') \
                 ORDER BY next_attempt_at, id LIMIT ?"
            ),
            "the ordinary ones, in due order: {shown}"
        );
        assert!(shown.ends_with("-- binds: [256, 256]"), "{shown}");
    }

    #[test]
    fn leasing_binds_the_token_the_lease_and_each_id() {
        let ids = [4_i64, 9];
        let binds = with_ids(&[Bind::Text("t"), Bind::BigInt(60_000_000)], &ids);
        let sql = lease(ids.len());
        let query = dynamic::<Sqlite>(&sql, &binds);
        let shown = debug_query::<Sqlite, _>(&query).to_string();
        assert!(shown.contains("WHERE id IN (?, ?) RETURNING id"), "{shown}");
        assert!(
            shown.ends_with("-- binds: [\"t\", 60000000, 4, 9]"),
            "{shown}"
        );
    }

    #[test]
    fn fixed_statements_take_as_many_binds_as_they_say() {
        for (sql, binds) in [
            (INSERT_MESSAGE, NewMessage::BINDS + 1),
            (<SqliteConnection as Dialect>::PENDING_BY_MESSAGE_ID, 2),
            (<SqliteConnection as Dialect>::DEAD_BY_MESSAGE_ID, 2),
            (<SqliteConnection as Dialect>::DEAD_POSITIONS, 1),
            (<SqliteConnection as Dialect>::BLOCKED_KEYS, 1),
            (CANDIDATES, 2),
            (GROUPS, 2),
            (GROUP_SHARE, 2),
            (REMOVE_EMPTY_GROUPS, 0),
            (<SqliteConnection as Dialect>::RESCHEDULE, 5),
            (COPY_TO_DEAD, 3),
            (DELETE_OWNED, 2),
            (PROMOTE_STRANDED, 0),
            (<SqliteConnection as Dialect>::PENDING, 6),
            (<SqliteConnection as Dialect>::PENDING_BY_KEY, 7),
            (<SqliteConnection as Dialect>::DEAD_LETTERS, 6),
            (PURGE, 1),
            (<SqliteConnection as Dialect>::INBOX_RECORD, 1),
            (<SqliteConnection as Dialect>::REVOKE_SESSION, 2),
            (<SqliteConnection as Dialect>::SESSION_REVOKED, 1),
            (<SqliteConnection as Dialect>::FORGET_REVOKED, 1),
            (<SqliteConnection as Dialect>::INBOX_SWEEP, 2),
            (<SqliteConnection as Dialect>::PRUNE_DEAD_LETTERS, 2),
            (<SqliteConnection as Dialect>::BACKLOG, 0),
            (<SqliteConnection as Dialect>::RESERVE_KEY, 2),
            (<SqliteConnection as Dialect>::KEYED_MESSAGE, 1),
            (<SqliteConnection as Dialect>::SET_KEY_POSITION, 1),
            (<SqliteConnection as Dialect>::UNSETTLED_KEYS, 2),
            (<SqliteConnection as Dialect>::EXPIRE_KEYS, 2),
            (<SqliteConnection as Dialect>::ADD_DESTINATION, 2),
            (<SqliteConnection as Dialect>::LOCK_DESTINATION, 1),
            (<SqliteConnection as Dialect>::LOCK_TURNS, 1),
            (<SqliteConnection as Dialect>::WRITE_TURNS, 5),
            (<SqliteConnection as Dialect>::REPORT_DESTINATION, 7),
            (<SqliteConnection as Dialect>::DESTINATIONS, 0),
            (<SqliteConnection as Dialect>::ENABLE_DESTINATION, 1),
            (<SqliteConnection as Dialect>::DISABLE_DESTINATION, 2),
            (<SqliteConnection as Dialect>::PAUSE_MESSAGE, 4),
            (<SqliteConnection as Dialect>::RELEASE_PAUSED, 0),
            (<SqliteConnection as Dialect>::PAUSE, 3),
            (<SqliteConnection as Dialect>::RESUME, 2),
            (<SqliteConnection as Dialect>::PAUSES, 0),
        ] {
            assert_eq!(sql.matches('?').count(), binds, "{sql}");
        }
    }
}
