//! Looking into the outbox: pending messages and, for operators, dead letters.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::{QueryableByName, RunQueryDsl};
use outbox_core::MessageId;

use crate::connection::{with_backend, OutboxConnection};
use crate::error::{Error, Result};

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
            Ok(PendingMessage {
                message_id: parse_message_id("outbox_message", row.id, &row.message_id)?,
                position: row.id,
                message_type: row.message_type,
                payload: row.payload,
                ordering_key: row.ordering_key,
                attempts: row.attempts.max(0).unsigned_abs(),
                created_at: time_from_micros(row.created_at),
                next_attempt_at: time_from_micros(row.next_attempt_at),
                in_flight: row.in_flight != 0,
                last_error: row.last_error,
            })
        })
        .collect()
}
