use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::RunQueryDsl;
use outbox_core::{Message, MessageId};

use crate::connection::{with_backend, Bind, CachedStatement, OutboxConnection};
use crate::error::{Error, Result};

/// The longest message type and ordering key the tables store, in bytes.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// The largest payload enqueued unless [`EnqueueOptions::max_payload_bytes`] says otherwise:
/// 4 MiB, well within MySQL's default `max_allowed_packet` (16 MiB) and large for a message,
/// which should carry references rather than documents.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 4 << 20;

/// Bytes of payload one batched `INSERT` carries at most, well under MySQL's default
/// `max_allowed_packet` (16 MiB) and cheap for any backend to parse.
const MAX_BATCH_PAYLOAD_BYTES: usize = 8 << 20;

/// Bind parameters per inserted message.
const BINDS_PER_ROW: usize = 5;

/// How a message is enqueued: when it may be processed, and which messages it is ordered with.
#[derive(Debug, Clone)]
pub struct EnqueueOptions {
    ordering_key: Option<String>,
    not_before: Option<SystemTime>,
    max_payload_bytes: usize,
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        EnqueueOptions {
            ordering_key: None,
            not_before: None,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

impl EnqueueOptions {
    /// Process as soon as the transaction commits, in parallel with other messages.
    pub fn new() -> Self {
        Self::default()
    }

    /// Messages sharing an ordering key are processed one at a time, in enqueue order, e.g. all
    /// events of one order or one member. At most 255 bytes.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Not processed before `time`.
    pub fn not_before(mut self, time: SystemTime) -> Self {
        self.not_before = Some(time);
        self
    }

    /// Not processed before `delay` has passed from now.
    pub fn delay(self, delay: Duration) -> Self {
        self.not_before(SystemTime::now() + delay)
    }

    /// Refuse payloads larger than this many bytes of JSON (default
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`]).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }
}

/// One row about to be inserted.
#[derive(Debug)]
struct NewMessage {
    id: MessageId,
    message_id: String,
    message_type: &'static str,
    payload: String,
    ordering_key: Option<String>,
    not_before_micros: Option<i64>,
}

impl NewMessage {
    fn new<M: Message>(message: &M, options: &EnqueueOptions) -> Result<(MessageId, Self)> {
        if M::MESSAGE_TYPE.len() > MAX_KEY_LEN {
            return Err(Error::TooLong {
                what: "message type",
                len: M::MESSAGE_TYPE.len(),
            });
        }
        if let Some(key) = &options.ordering_key {
            if key.len() > MAX_KEY_LEN {
                return Err(Error::TooLong {
                    what: "ordering key",
                    len: key.len(),
                });
            }
        }
        let payload = serde_json::to_string(message).map_err(|source| Error::Serialize {
            message_type: M::MESSAGE_TYPE,
            source,
        })?;
        if contains_nul_escape(&payload) {
            return Err(Error::NulInPayload {
                message_type: M::MESSAGE_TYPE,
            });
        }
        if payload.len() > options.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                message_type: M::MESSAGE_TYPE,
                len: payload.len(),
                max: options.max_payload_bytes,
            });
        }
        let id = MessageId::new();
        let row = NewMessage {
            id,
            message_id: id.to_string(),
            message_type: M::MESSAGE_TYPE,
            payload,
            ordering_key: options.ordering_key.clone(),
            not_before_micros: options.not_before.map(micros_since_epoch),
        };
        Ok((id, row))
    }
}

/// Whether the JSON text holds the escape of U+0000 (`\u0000` not preceded by another escaping
/// backslash), which PostgreSQL's `jsonb` cannot store.
fn contains_nul_escape(json: &str) -> bool {
    let bytes = json.as_bytes();
    json.match_indices("\\u0000").any(|(at, _)| {
        let backslashes = bytes[..at]
            .iter()
            .rev()
            .take_while(|b| **b == b'\\')
            .count();
        backslashes % 2 == 0
    })
}

fn micros_since_epoch(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        // A time before 1970 only means "already due".
        Err(_) => 0,
    }
}

/// Writes messages into the outbox through the caller's connection.
///
/// In scope with `use outbox_diesel::prelude::*;` and implemented for every [`Message`]. Called
/// inside `conn.transaction(..)`, the message exists exactly when that transaction commits; called
/// outside one, the insert commits on its own. Either way it is one `INSERT`, one round trip.
pub trait Enqueue: Message {
    /// Enqueues this message to be processed as soon as its transaction commits.
    fn enqueue<C: OutboxConnection>(&self, conn: &mut C) -> Result<MessageId> {
        self.enqueue_with(conn, &EnqueueOptions::new())
    }

    /// Enqueues this message with an ordering key or a delay.
    fn enqueue_with<C: OutboxConnection>(
        &self,
        conn: &mut C,
        options: &EnqueueOptions,
    ) -> Result<MessageId> {
        let (id, row) = NewMessage::new(self, options)?;
        insert(conn, std::slice::from_ref(&row))?;
        outbox_core::__private::notify_enqueued();
        Ok(id)
    }
}

impl<M: Message> Enqueue for M {}

/// Many messages, of any types, enqueued in as few `INSERT`s as the backend allows (one for up to
/// thousands of messages).
///
/// ```
/// # use outbox_diesel::{Batch, Result};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Notify { member_id: i64 }
/// # impl outbox_diesel::Message for Notify { const MESSAGE_TYPE: &'static str = "comment.notification"; }
/// # fn fan_out(conn: &mut diesel::SqliteConnection, subscribers: &[i64]) -> Result<()> {
/// let mut batch = Batch::new();
/// for &member_id in subscribers {
///     batch.push(&Notify { member_id })?;
/// }
/// let ids = batch.enqueue(conn)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct Batch {
    rows: Vec<NewMessage>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a message, serializing it now, and returns the id it will have.
    pub fn push<M: Message>(&mut self, message: &M) -> Result<MessageId> {
        self.push_with(message, &EnqueueOptions::new())
    }

    /// Adds a message with an ordering key or a delay.
    pub fn push_with<M: Message>(
        &mut self,
        message: &M,
        options: &EnqueueOptions,
    ) -> Result<MessageId> {
        let (id, row) = NewMessage::new(message, options)?;
        self.rows.push(row);
        Ok(id)
    }

    /// How many messages the batch holds.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Inserts every message of the batch through `conn`, returning their ids in push order.
    ///
    /// Use it inside `conn.transaction(..)`: a batch too large for one statement is split into
    /// several, and only a transaction makes them all-or-nothing.
    pub fn enqueue<C: OutboxConnection>(self, conn: &mut C) -> Result<Vec<MessageId>> {
        insert(conn, &self.rows)?;
        outbox_core::__private::notify_enqueued();
        Ok(self.rows.iter().map(|row| row.id).collect())
    }
}

/// Enqueues every message of `messages` in as few statements as possible; see [`Batch`].
pub fn enqueue_all<'a, M, C>(
    conn: &mut C,
    messages: impl IntoIterator<Item = &'a M>,
) -> Result<Vec<MessageId>>
where
    M: Message + 'a,
    C: OutboxConnection,
{
    let mut batch = Batch::new();
    for message in messages {
        batch.push(message)?;
    }
    batch.enqueue(conn)
}

fn insert<C: OutboxConnection>(conn: &mut C, rows: &[NewMessage]) -> Result<()> {
    let mut conn = conn.backend_connection();
    let dialect = conn.dialect();
    let max_rows = dialect.max_binds / BINDS_PER_ROW;
    let mut rest = rows;
    while !rest.is_empty() {
        let mut take = 0;
        let mut bytes = 0;
        while take < rest.len() && take < max_rows {
            bytes += rest[take].payload.len();
            if take > 0 && bytes > MAX_BATCH_PAYLOAD_BYTES {
                break;
            }
            take += 1;
        }
        let (chunk, tail) = rest.split_at(take);
        rest = tail;

        if let [row] = chunk {
            // The common case has one text per backend: prepared once per connection.
            let sql = format!(
                "INSERT INTO outbox_message ({}) VALUES {}",
                dialect.insert_columns,
                (dialect.insert_values)(&["?"; BINDS_PER_ROW])
            );
            let binds = [
                Bind::Text(row.message_id.as_str()),
                Bind::Text(row.message_type),
                Bind::Text(row.payload.as_str()),
                Bind::NullableText(row.ordering_key.as_deref()),
                Bind::NullableBigInt(row.not_before_micros),
            ];
            with_backend!(&mut conn, c => CachedStatement::new(&sql, &binds).execute(*c)?);
            continue;
        }

        let mut sql = format!(
            "INSERT INTO outbox_message ({}) VALUES ",
            dialect.insert_columns
        );
        for (row, _) in chunk.iter().enumerate() {
            if row > 0 {
                sql.push_str(", ");
            }
            let first = row * BINDS_PER_ROW + 1;
            let placeholders: [String; BINDS_PER_ROW] =
                std::array::from_fn(|i| (dialect.placeholder)(first + i));
            sql.push_str(&(dialect.insert_values)(
                &placeholders.each_ref().map(String::as_str),
            ));
        }
        with_backend!(&mut conn, c => {
            let mut query = diesel::sql_query(&sql).into_boxed();
            for row in chunk {
                query = query
                    .bind::<Text, _>(row.message_id.as_str())
                    .bind::<Text, _>(row.message_type)
                    .bind::<Text, _>(row.payload.as_str())
                    .bind::<Nullable<Text>, _>(row.ordering_key.as_deref())
                    .bind::<Nullable<BigInt>, _>(row.not_before_micros);
            }
            query.execute(*c)?
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::contains_nul_escape;

    #[test]
    fn only_real_nul_escapes_are_found() {
        let with_nul = serde_json::to_string(&"a\0b").unwrap();
        assert!(contains_nul_escape(&with_nul), "{with_nul}");
        let backslash_then_text = serde_json::to_string(&"a\\u0000b").unwrap();
        assert!(
            !contains_nul_escape(&backslash_then_text),
            "{backslash_then_text}"
        );
        let both = serde_json::to_string(&"\\\0").unwrap();
        assert!(contains_nul_escape(&both), "{both}");
        assert!(!contains_nul_escape(r#"{"a":"plain"}"#));
    }
}
