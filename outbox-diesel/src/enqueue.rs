//! Writing messages into the outbox table through the caller's connection, inside the
//! caller's transaction: [`Enqueue`], [`Batch`], [`enqueue_all`] and [`EnqueueOptions`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::{Headers, Message, MessageId, Priority};

use crate::connection::{with_backend, OutboxConnection};
use crate::error::{Error, Result};
use crate::sql::new_message::NewMessage;
use crate::sql::Statements;

/// The longest message type and ordering key the tables store, in bytes.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// The largest payload enqueued unless [`EnqueueOptions::max_payload_bytes`] says otherwise:
/// 4 MiB, well within MySQL's default `max_allowed_packet` (16 MiB) and large for a message,
/// which should carry references rather than documents.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 4 << 20;

/// The latest `not_before` every backend stores and orders correctly: the end of year 9999
/// (MySQL's `DATETIME` ends there; SQLite's text times stop sorting after it).
const LATEST_NOT_BEFORE_SECS: u64 = 253_402_300_799;

/// When a message may first be processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotBefore {
    Now,
    At(SystemTime),
    /// This long after the enqueue, on the database's clock.
    After(Duration),
}

/// How a message is enqueued: when it may be processed, and which messages it is ordered with.
#[derive(Debug, Clone)]
pub struct EnqueueOptions {
    ordering_key: Option<String>,
    priority: Priority,
    group: Option<String>,
    owner: Option<String>,
    idempotency_key: Option<String>,
    not_before: NotBefore,
    max_payload_bytes: usize,
    headers: Vec<(String, String)>,
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        EnqueueOptions {
            ordering_key: None,
            priority: Priority::Normal,
            group: None,
            owner: None,
            idempotency_key: None,
            not_before: NotBefore::Now,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            headers: Vec::new(),
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

    /// Claimed before due messages of lower priorities (default [`Priority::Normal`]).
    ///
    /// ```
    /// # use outbox_diesel::{EnqueueOptions, Priority};
    /// let options = EnqueueOptions::new().priority(Priority::High);
    /// ```
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Shares claims fairly with other groups, e.g. one group per tenant: besides the due
    /// messages in due order, every claim reads a share of each group with due messages (eight
    /// groups a claim, the next eight in the next one), and takes the first of each group
    /// before the second of any. One group's flood then does not hold up another group's few
    /// messages. Messages without a group are one more group as far as a claim reads them, in
    /// due order behind the groups' overflow: give every tenant a group if none may hold up
    /// another. Priorities come first, and order within an [ordering key](Self::ordering_key)
    /// first of all. At most 255 bytes, without control characters.
    ///
    /// ```
    /// # use outbox_diesel::EnqueueOptions;
    /// let options = EnqueueOptions::new().group("tenant-42");
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The owner (tenant) of an event routed to the subscriptions
    /// ([`subscription`](crate::subscription)): it reaches only the subscriptions of this
    /// owner, and an event without one reaches only subscriptions without one. At most 255
    /// bytes, without control characters.
    ///
    /// ```
    /// # use outbox_diesel::EnqueueOptions;
    /// let options = EnqueueOptions::new().owner("customer-42");
    /// ```
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Enqueued once per key: a later enqueue with the same key, while the first message is
    /// pending or dead-lettered and for a window after it settled, writes nothing and returns
    /// the first message's id (see [`idempotency`](crate::idempotency)). 1 to 255 bytes, without
    /// U+0000; compared byte for byte.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Not processed before `time` (at most the end of year 9999: a later time is refused by
    /// the enqueue with [`Error::NotBeforeOutOfRange`]).
    pub fn not_before(mut self, time: SystemTime) -> Self {
        self.not_before = NotBefore::At(time);
        self
    }

    /// Not processed before `delay` has passed from the enqueue, on the database's clock (the
    /// one claims compare with): options built once and used for many enqueues delay each by
    /// `delay` from its own enqueue. A delay that would end past year 9999 is refused by the
    /// enqueue with [`Error::NotBeforeOutOfRange`].
    pub fn delay(mut self, delay: Duration) -> Self {
        self.not_before = NotBefore::After(delay);
        self
    }

    /// A header the message carries to its delivery (a webhook sends it as an HTTP header):
    /// a tenant, a correlation id, a W3C `traceparent`. Names are case-insensitive; a later
    /// value for a name replaces an earlier one. The enqueue refuses, with [`Error::Header`],
    /// what an HTTP header could not carry unchanged and the names the webhook sets itself
    /// (`webhook-*`, `content-type`, ...); see [`Headers::insert`].
    ///
    /// With the `opentelemetry` feature, the current span's `traceparent` and `tracestate` are
    /// added unless a `traceparent` is given here.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Refuse payloads larger than this many bytes of JSON (default
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`]).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }
}

impl NewMessage {
    fn new<M: Message>(message: &M, options: &EnqueueOptions) -> Result<(MessageId, Self)> {
        if M::MESSAGE_TYPE.len() > MAX_KEY_LEN {
            return Err(Error::TooLong {
                what: "message type",
                len: M::MESSAGE_TYPE.len(),
            });
        }
        check_printable(
            options.ordering_key.as_deref(),
            "ordering key",
            Error::InvalidOrderingKey,
        )?;
        check_printable(options.group.as_deref(), "group", Error::InvalidGroup)?;
        check_printable(options.owner.as_deref(), "owner", Error::InvalidOwner)?;
        if let Some(key) = &options.idempotency_key {
            if key.len() > MAX_KEY_LEN {
                return Err(Error::TooLong {
                    what: "idempotency key",
                    len: key.len(),
                });
            }
            if key.is_empty() || key.contains('\0') {
                return Err(Error::InvalidIdempotencyKey);
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
        let (not_before_micros, delay_micros) = match options.not_before {
            NotBefore::Now => (None, None),
            NotBefore::At(time) => (
                Some(micros_since_epoch(time).ok_or(Error::NotBeforeOutOfRange)?),
                None,
            ),
            NotBefore::After(delay) => {
                // Checked on this process's clock; the database adds it to its own.
                SystemTime::now()
                    .checked_add(delay)
                    .and_then(micros_since_epoch)
                    .ok_or(Error::NotBeforeOutOfRange)?;
                let micros =
                    i64::try_from(delay.as_micros()).map_err(|_| Error::NotBeforeOutOfRange)?;
                (None, Some(micros))
            }
        };
        let mut headers = Headers::new();
        for (name, value) in &options.headers {
            headers.insert(name, value)?;
        }
        #[cfg(feature = "opentelemetry")]
        headers.insert_current_trace_context();
        let id = MessageId::new();
        let row = NewMessage {
            id,
            message_id: id.to_string(),
            message_type: M::MESSAGE_TYPE,
            payload,
            ordering_key: options.ordering_key.clone(),
            priority: options.priority,
            group: options.group.clone(),
            owner: options.owner.clone(),
            idempotency_key: options.idempotency_key.clone(),
            not_before_micros,
            delay_micros,
            headers: headers.to_json(),
            behind_in_batch: false,
        };
        Ok((id, row))
    }
}

/// Refuses a name (an ordering key, a group) longer than 255 bytes, or one that is empty or
/// holds control characters (`invalid`): such names travel as headers and labels.
fn check_printable(name: Option<&str>, what: &'static str, invalid: Error) -> Result<()> {
    let Some(name) = name else {
        return Ok(());
    };
    if name.len() > MAX_KEY_LEN {
        return Err(Error::TooLong {
            what,
            len: name.len(),
        });
    }
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(invalid);
    }
    Ok(())
}

/// Marks the rows behind an earlier row of their ordering key in the same insert, which are
/// parked from the start. Not where idempotency keys are involved: an earlier row skipped as a
/// duplicate would leave the later one parked behind nothing.
fn mark_behind(rows: &mut [NewMessage]) {
    if rows.iter().any(|row| row.idempotency_key.is_some()) {
        return;
    }
    let mut seen = std::collections::HashSet::new();
    for row in rows {
        if let Some(key) = &row.ordering_key {
            row.behind_in_batch = !seen.insert(key.clone());
        }
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

/// Microseconds since the epoch, or `None` past the latest time every backend stores.
fn micros_since_epoch(time: SystemTime) -> Option<i64> {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) if after.as_secs() > LATEST_NOT_BEFORE_SECS => None,
        Ok(after) => i64::try_from(after.as_micros()).ok(),
        // A time before 1970 only means "already due".
        Err(_) => Some(0),
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

    /// Enqueues this message with an ordering key, a delay or an idempotency key. Returns its
    /// id; with an idempotency key already recorded, the id of the message first enqueued
    /// with it (and nothing is written).
    fn enqueue_with<C: OutboxConnection>(
        &self,
        conn: &mut C,
        options: &EnqueueOptions,
    ) -> Result<MessageId> {
        let (_, row) = NewMessage::new(self, options)?;
        let ids = insert(conn, std::slice::from_ref(&row))?;
        outbox_core::__private::notify_enqueued();
        ids.into_iter()
            .next()
            .ok_or(Error::Database(diesel::result::Error::NotFound))
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

    /// Adds a message with an ordering key, a delay or an idempotency key. The id returned is
    /// the one the message gets if its idempotency key (if any) is new; [`Batch::enqueue`]
    /// returns the ids as they turned out.
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

    /// Inserts every message of the batch through `conn`, returning their ids in push order
    /// (for a message whose idempotency key was recorded, the first message's id).
    ///
    /// Use it inside `conn.transaction(..)`: a batch too large for one statement is split into
    /// several, and only a transaction makes them all-or-nothing. Messages with an idempotency
    /// key cost a few statements each, not a share of one.
    pub fn enqueue<C: OutboxConnection>(mut self, conn: &mut C) -> Result<Vec<MessageId>> {
        mark_behind(&mut self.rows);
        let ids = insert(conn, &self.rows)?;
        outbox_core::__private::notify_enqueued();
        Ok(ids)
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

/// Inserts `rows`; returns their ids, or for rows whose idempotency key was recorded, the
/// first message's.
fn insert<C: OutboxConnection>(conn: &mut C, rows: &[NewMessage]) -> Result<Vec<MessageId>> {
    let mut groups: Vec<&str> = rows.iter().filter_map(NewMessage::group).collect();
    if !groups.is_empty() {
        groups.sort_unstable();
        groups.dedup();
        with_backend!(conn.backend_connection(), c => c.register_groups(&groups))?;
    }
    if rows.iter().all(|row| row.idempotency_key.is_none()) {
        with_backend!(conn.backend_connection(), c => c.insert_messages(rows))?;
        return Ok(rows.iter().map(|row| row.id).collect());
    }
    Ok(with_backend!(conn.backend_connection(), c => crate::idempotency::insert(c, rows))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Probe;

    impl Message for Probe {
        const MESSAGE_TYPE: &'static str = "test.probe";
    }

    #[test]
    fn groups_are_checked() {
        for bad in ["", "line\nbreak", "tab\there", "nul\0"] {
            assert!(
                matches!(
                    NewMessage::new(&Probe, &EnqueueOptions::new().group(bad)),
                    Err(Error::InvalidGroup)
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            NewMessage::new(&Probe, &EnqueueOptions::new().group("é".repeat(128))),
            Err(Error::TooLong {
                what: "group",
                len: 256
            })
        ));
        let (_, row) = NewMessage::new(&Probe, &EnqueueOptions::new().group("tenant-42")).unwrap();
        assert_eq!(row.group(), Some("tenant-42"));
        let (_, row) =
            NewMessage::new(&Probe, &EnqueueOptions::new().group("é".repeat(127))).unwrap();
        assert_eq!(row.group().map(str::len), Some(254));
    }

    #[test]
    fn ordering_keys_are_checked_and_rows_behind_a_key_in_the_same_insert_are_marked() {
        for bad in ["", "a\r\nb", "tab\there", "nul\0"] {
            assert!(
                matches!(
                    NewMessage::new(&Probe, &EnqueueOptions::new().ordering_key(bad)),
                    Err(Error::InvalidOrderingKey)
                ),
                "{bad:?}"
            );
        }
        let keyed = |key: Option<&str>| {
            let options = match key {
                Some(key) => EnqueueOptions::new().ordering_key(key),
                None => EnqueueOptions::new(),
            };
            NewMessage::new(&Probe, &options).unwrap().1
        };
        let mut rows = vec![
            keyed(Some("a")),
            keyed(None),
            keyed(Some("a")),
            keyed(Some("b")),
            keyed(None),
            keyed(Some("a")),
        ];
        mark_behind(&mut rows);
        let behind: Vec<bool> = rows.iter().map(|row| row.behind_in_batch).collect();
        assert_eq!(behind, [false, false, true, false, false, true]);
    }

    #[test]
    fn times_past_year_9999_and_overflowing_delays_are_refused() {
        let far = UNIX_EPOCH + Duration::from_secs(LATEST_NOT_BEFORE_SECS + 1);
        assert_eq!(micros_since_epoch(far), None);
        let last = UNIX_EPOCH + Duration::from_secs(LATEST_NOT_BEFORE_SECS);
        assert!(micros_since_epoch(last).is_some());
        assert_eq!(
            micros_since_epoch(UNIX_EPOCH - Duration::from_secs(1)),
            Some(0)
        );
        assert!(matches!(
            NewMessage::new(&Probe, &EnqueueOptions::new().delay(Duration::MAX)),
            Err(Error::NotBeforeOutOfRange)
        ));
        let (_, row) =
            NewMessage::new(&Probe, &EnqueueOptions::new().delay(Duration::from_secs(2))).unwrap();
        assert_eq!(
            (row.not_before_micros, row.delay_micros),
            (None, Some(2_000_000)),
            "a delay is resolved by the database, at the enqueue"
        );
    }

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
