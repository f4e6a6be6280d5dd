//! Looking into the outbox: pending messages and, for operators, dead letters.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::{QueryableByName, RunQueryDsl};
use outbox_core::MessageId;

use crate::connection::{with_backend, Bind, Dialect, OutboxConnection, RawSql};
use crate::error::{Error, Result};
use crate::store::{id_list, MessageRow};

/// Which messages a listing returns.
#[derive(Debug, Clone)]
pub struct ListOptions {
    message_type: Option<String>,
    limit: u32,
}

impl Default for ListOptions {
    fn default() -> Self {
        ListOptions {
            message_type: None,
            limit: 100,
        }
    }
}

impl ListOptions {
    /// The first 100 messages of any type, oldest first.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only messages of this type.
    pub fn message_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }

    /// At most this many messages.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
}

/// A message waiting in the outbox, or being processed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMessage {
    /// Its position in the outbox (the row's auto-increment id): enqueue order.
    pub position: i64,
    /// Its stable id.
    pub message_id: MessageId,
    /// Its type string.
    pub message_type: String,
    /// Its payload, the JSON text of the message struct.
    pub payload: String,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// Attempts started so far.
    pub attempts: u32,
    /// When it was enqueued.
    pub created_at: SystemTime,
    /// When it is due: the next attempt, or the end of the lease while a worker holds it.
    pub next_attempt_at: SystemTime,
    /// Whether a worker holds it right now.
    pub in_flight: bool,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
}

#[derive(QueryableByName)]
struct PendingRow {
    #[diesel(embed)]
    message: MessageRow,
    #[diesel(sql_type = BigInt)]
    created_at: i64,
    #[diesel(sql_type = BigInt)]
    next_attempt_at: i64,
    #[diesel(sql_type = Integer)]
    in_flight: i32,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
}

pub(crate) fn time_from_micros(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0).unsigned_abs())
}

pub(crate) fn parse_message_id(table: &'static str, id: i64, text: &str) -> Result<MessageId> {
    text.parse().map_err(|_| Error::InvalidRow {
        table,
        id,
        reason: format!("message_id `{text}` is not a UUID"),
    })
}

/// Messages in the outbox, oldest first.
pub fn pending_messages<C: OutboxConnection>(
    conn: &mut C,
    options: &ListOptions,
) -> Result<Vec<PendingMessage>> {
    let mut conn = conn.backend_connection();
    let d = conn.dialect();
    let sql = format!(
        "SELECT id, {message_id} AS message_id, message_type, {payload} AS payload, ordering_key, \
         attempts, {created} AS created_at, {next} AS next_attempt_at, \
         CASE WHEN locked_by IS NOT NULL AND next_attempt_at > {now} THEN 1 ELSE 0 END AS in_flight, \
         last_error FROM outbox_message {filter} ORDER BY id LIMIT {limit}",
        message_id = (d.uuid_text)("message_id"),
        payload = (d.json_text)("payload"),
        created = (d.epoch_micros)("created_at"),
        next = (d.epoch_micros)("next_attempt_at"),
        now = d.now,
        filter = if options.message_type.is_some() {
            format!("WHERE message_type = {}", (d.placeholder)(1))
        } else {
            String::new()
        },
        limit = options.limit,
    );
    let rows: Vec<PendingRow> = with_backend!(&mut conn, c => {
        let mut query = diesel::sql_query(&sql).into_boxed();
        if let Some(message_type) = &options.message_type {
            query = query.bind::<Text, _>(message_type.as_str());
        }
        query.load(*c)?
    });
    rows.into_iter()
        .map(|row| {
            let m = row.message;
            Ok(PendingMessage {
                message_id: parse_message_id("outbox_message", m.id, &m.message_id)?,
                position: m.id,
                message_type: m.message_type,
                payload: m.payload,
                ordering_key: m.ordering_key,
                attempts: m.attempts.max(0).unsigned_abs(),
                created_at: time_from_micros(row.created_at),
                next_attempt_at: time_from_micros(row.next_attempt_at),
                in_flight: row.in_flight != 0,
                last_error: row.last_error,
            })
        })
        .collect()
}

/// A message that failed for good, kept with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its position in the outbox when it failed (the dead letter's id).
    pub position: i64,
    /// Its stable id, kept when it is re-queued.
    pub message_id: MessageId,
    /// Its type string.
    pub message_type: String,
    /// Its payload.
    pub payload: String,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// Attempts made.
    pub attempts: u32,
    /// Why it failed.
    pub last_error: String,
    /// When it was first enqueued.
    pub created_at: SystemTime,
    /// When it was dead-lettered.
    pub failed_at: SystemTime,
}

#[derive(QueryableByName)]
struct DeadLetterRow {
    #[diesel(embed)]
    message: MessageRow,
    #[diesel(sql_type = Text)]
    last_error: String,
    #[diesel(sql_type = BigInt)]
    created_at: i64,
    #[diesel(sql_type = BigInt)]
    failed_at: i64,
}

/// Which dead letters an operation applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterSelection {
    /// These dead letters, by [`DeadLetter::position`].
    Positions(Vec<i64>),
    /// Every dead letter of this type.
    MessageType(String),
    /// Every dead letter.
    All,
}

impl DeadLetterSelection {
    /// The WHERE clause (with at most one placeholder, for the type) and its bind.
    fn condition<'a>(&'a self, d: &Dialect) -> (String, Option<&'a str>) {
        match self {
            DeadLetterSelection::Positions(ids) if ids.is_empty() => ("1 = 0".into(), None),
            DeadLetterSelection::Positions(ids) => (format!("id IN ({})", id_list(ids)), None),
            DeadLetterSelection::MessageType(t) => (
                format!("message_type = {}", (d.placeholder)(1)),
                Some(t.as_str()),
            ),
            DeadLetterSelection::All => ("1 = 1".into(), None),
        }
    }
}

fn binds(message_type: Option<&str>) -> Vec<Bind<'_>> {
    message_type.map(Bind::Text).into_iter().collect()
}

fn dead_letter_sql(d: &Dialect, filter: &str, limit: Option<u32>) -> String {
    format!(
        "SELECT id, {message_id} AS message_id, message_type, {payload} AS payload, \
         ordering_key, attempts, last_error, {created} AS created_at, {failed} AS failed_at \
         FROM outbox_failure {filter} ORDER BY id{limit}",
        message_id = (d.uuid_text)("message_id"),
        payload = (d.json_text)("payload"),
        created = (d.epoch_micros)("created_at"),
        failed = (d.epoch_micros)("failed_at"),
        limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default(),
    )
}

fn dead_letters_where<C: OutboxConnection>(
    conn: &mut C,
    filter: impl FnOnce(&Dialect) -> (String, Option<String>),
    limit: Option<u32>,
) -> Result<Vec<DeadLetter>> {
    let mut conn = conn.backend_connection();
    let d = conn.dialect();
    let (filter, bind) = filter(d);
    let sql = dead_letter_sql(d, &filter, limit);
    let rows: Vec<DeadLetterRow> = with_backend!(&mut conn, c => {
        let mut query = diesel::sql_query(&sql).into_boxed();
        if let Some(bind) = &bind {
            query = query.bind::<Text, _>(bind.as_str());
        }
        query.load(*c)?
    });
    rows.into_iter()
        .map(|row| {
            let m = row.message;
            Ok(DeadLetter {
                message_id: parse_message_id("outbox_failure", m.id, &m.message_id)?,
                position: m.id,
                message_type: m.message_type,
                payload: m.payload,
                ordering_key: m.ordering_key,
                attempts: m.attempts.max(0).unsigned_abs(),
                last_error: row.last_error,
                created_at: time_from_micros(row.created_at),
                failed_at: time_from_micros(row.failed_at),
            })
        })
        .collect()
}

/// Dead letters, oldest first.
pub fn dead_letters<C: OutboxConnection>(
    conn: &mut C,
    options: &ListOptions,
) -> Result<Vec<DeadLetter>> {
    let message_type = options.message_type.clone();
    dead_letters_where(
        conn,
        |d| match message_type {
            Some(t) => (
                format!("WHERE message_type = {}", (d.placeholder)(1)),
                Some(t),
            ),
            None => (String::new(), None),
        },
        Some(options.limit),
    )
}

/// One dead letter by its position, if it exists.
pub fn dead_letter<C: OutboxConnection>(conn: &mut C, position: i64) -> Result<Option<DeadLetter>> {
    Ok(
        dead_letters_where(conn, |_| (format!("WHERE id = {position}"), None), Some(1))?
            .into_iter()
            .next(),
    )
}

/// Id lists in one statement stay well under every backend's limits.
const ID_CHUNK: usize = 1000;

/// Moves the selected dead letters back into the outbox, atomically, to be processed again
/// from the first attempt with their original message ids. Returns the positions the dead
/// letters had.
pub fn requeue_dead_letters<C: OutboxConnection>(
    conn: &mut C,
    selection: &DeadLetterSelection,
) -> Result<Vec<i64>> {
    let mut conn = conn.backend_connection();
    let d = conn.dialect();
    let (condition, message_type) = selection.condition(d);
    // Locking the rows first means a dead letter is either moved whole or left alone, even
    // while another operator re-queues the same ones.
    let select = format!(
        "SELECT id FROM outbox_failure WHERE {condition} ORDER BY id{}",
        d.for_update
    );
    let moved = with_backend!(&mut conn, c => c.write_transaction(|c| {
        let ids = c.ids(&select, &binds(message_type))?;
        for chunk in ids.chunks(ID_CHUNK) {
            let list = id_list(chunk);
            c.run(
                &format!(
                    "INSERT INTO outbox_message (message_id, message_type, payload, ordering_key, \
                         attempts, created_at, next_attempt_at, last_error) \
                     SELECT message_id, message_type, payload, ordering_key, 0, created_at, {}, \
                         last_error \
                     FROM outbox_failure WHERE id IN ({list}) ORDER BY id",
                    d.now
                ),
                &[],
            )?;
            c.run(&format!("DELETE FROM outbox_failure WHERE id IN ({list})"), &[])?;
        }
        Ok(ids)
    }))?;
    if !moved.is_empty() {
        log::info!("outbox: re-queued {} dead letters", moved.len());
        outbox_core::__private::notify_enqueued();
    }
    Ok(moved)
}

/// Deletes the selected dead letters for good. Returns how many were deleted.
pub fn purge_dead_letters<C: OutboxConnection>(
    conn: &mut C,
    selection: &DeadLetterSelection,
) -> Result<usize> {
    let mut conn = conn.backend_connection();
    let d = conn.dialect();
    let purged = match selection {
        DeadLetterSelection::Positions(ids) => with_backend!(&mut conn, c => {
            c.write_transaction(|c| {
                let mut purged = 0;
                for chunk in ids.chunks(ID_CHUNK) {
                    let sql = format!("DELETE FROM outbox_failure WHERE id IN ({})", id_list(chunk));
                    purged += c.run(&sql, &[])?;
                }
                Ok(purged)
            })?
        }),
        _ => {
            let (condition, message_type) = selection.condition(d);
            let sql = format!("DELETE FROM outbox_failure WHERE {condition}");
            with_backend!(&mut conn, c => c.run(&sql, &binds(message_type))?)
        }
    };
    log::info!("outbox: purged {purged} dead letters");
    Ok(purged)
}

/// Counts of one message type.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TypeStats {
    /// The type string.
    pub message_type: String,
    /// Messages in the outbox, in flight included.
    pub pending: u64,
    /// Messages a worker holds right now.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// When the oldest message in the outbox was enqueued.
    pub oldest_pending: Option<SystemTime>,
}

#[derive(QueryableByName)]
struct StatsRow {
    #[diesel(sql_type = Text)]
    message_type: String,
    #[diesel(sql_type = BigInt)]
    total: i64,
    #[diesel(sql_type = BigInt)]
    in_flight: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    oldest: Option<i64>,
}

/// Pending, in-flight and dead counts by message type, sorted by type.
pub fn stats<C: OutboxConnection>(conn: &mut C) -> Result<Vec<TypeStats>> {
    let mut conn = conn.backend_connection();
    let d = conn.dialect();
    let pending_sql = format!(
        "SELECT message_type, COUNT(*) AS total, \
             COUNT(CASE WHEN locked_by IS NOT NULL AND next_attempt_at > {now} THEN 1 END) \
                 AS in_flight, \
             {oldest} AS oldest \
         FROM outbox_message GROUP BY message_type",
        now = d.now,
        oldest = (d.epoch_micros)("MIN(created_at)"),
    );
    // COUNT of nothing is a BIGINT zero on every backend (a literal 0 is an INTEGER on
    // PostgreSQL, and MySQL cannot CAST to BIGINT).
    let dead_sql = "SELECT message_type, COUNT(*) AS total, COUNT(CASE WHEN 1 = 0 THEN 1 END) \
                    AS in_flight, NULL AS oldest FROM outbox_failure GROUP BY message_type";
    let (pending, dead): (Vec<StatsRow>, Vec<StatsRow>) = with_backend!(&mut conn, c => (
        diesel::sql_query(&pending_sql).load(*c)?,
        diesel::sql_query(dead_sql).load(*c)?,
    ));
    let mut by_type: std::collections::BTreeMap<String, TypeStats> = Default::default();
    for row in pending {
        let stats = by_type
            .entry(row.message_type.clone())
            .or_insert_with(|| TypeStats::empty(&row.message_type));
        stats.pending = row.total.max(0).unsigned_abs();
        stats.in_flight = row.in_flight.max(0).unsigned_abs();
        stats.oldest_pending = row.oldest.map(time_from_micros);
    }
    for row in dead {
        by_type
            .entry(row.message_type.clone())
            .or_insert_with(|| TypeStats::empty(&row.message_type))
            .dead = row.total.max(0).unsigned_abs();
    }
    Ok(by_type.into_values().collect())
}

impl TypeStats {
    fn empty(message_type: &str) -> Self {
        TypeStats {
            message_type: message_type.to_owned(),
            pending: 0,
            in_flight: 0,
            dead: 0,
            oldest_pending: None,
        }
    }
}
