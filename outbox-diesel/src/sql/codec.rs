//! How stored values read as the worker's and the operator's types, and how those types are
//! stored: times in microseconds, message ids as text, priority levels, pause kinds and the
//! backlog's figures. The store, the enqueue and the operator functions read rows through
//! here, so each value has one reading.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::store::{Backlog, Paused};
use outbox_core::{MessageId, Priority};

use super::{BacklogRow, HorizonRow, PauseRow};
use crate::error::{Error, Result};

/// The time `micros` microseconds after the Unix epoch (the epoch, for a time before it).
pub(crate) fn time_from_micros(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0).unsigned_abs())
}

/// `time` as microseconds after the Unix epoch (0 for a time before it): the inverse of
/// [`time_from_micros`].
pub(crate) fn micros_from_time(time: SystemTime) -> i64 {
    super::micros(time.duration_since(UNIX_EPOCH).unwrap_or_default())
}

/// A stored message id, or an error naming the row that holds something else.
pub(crate) fn parse_message_id(table: &'static str, id: i64, text: &str) -> Result<MessageId> {
    text.parse().map_err(|_| Error::InvalidRow {
        table,
        id,
        reason: format!("message_id `{text}` is not a UUID"),
    })
}

/// The level stored in the outbox's `priority` column: 0, 1 or 2.
pub(crate) fn priority_level(priority: Priority) -> i16 {
    match priority {
        Priority::Normal => 0,
        Priority::High => 1,
        Priority::Urgent => 2,
    }
}

/// The priority of a stored level (a level above the highest, written by hand, is `Urgent`;
/// one below 1, `Normal`).
pub(crate) fn priority_from_level(level: i64) -> Priority {
    match level {
        i64::MIN..=0 => Priority::Normal,
        1 => Priority::High,
        _ => Priority::Urgent,
    }
}

/// What an operator pauses: a message type or a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PauseKind {
    /// A message type: no worker processes its messages (whatever their destination).
    MessageType,
    /// A destination: no worker delivers to it (whatever the message type).
    Destination,
}

impl PauseKind {
    /// How the kind is stored and printed: `type` or `destination`.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseKind::MessageType => "type",
            PauseKind::Destination => "destination",
        }
    }

    pub(crate) fn from_stored(kind: &str) -> Option<Self> {
        match kind {
            "type" => Some(PauseKind::MessageType),
            "destination" => Some(PauseKind::Destination),
            _ => None,
        }
    }
}

/// The pauses as the worker follows them.
pub(crate) fn paused_from_rows(rows: Vec<PauseRow>) -> Paused {
    let mut paused = Paused::new();
    for row in rows {
        match PauseKind::from_stored(&row.kind) {
            Some(PauseKind::MessageType) => paused = paused.message_type(row.name, row.reason),
            Some(PauseKind::Destination) => paused = paused.destination(row.name, row.reason),
            None => {}
        }
    }
    paused
}

/// The backlog's figures from the rows that count them.
pub(crate) fn backlog_of(row: &BacklogRow, horizon: &HorizonRow) -> Backlog {
    let waited = row.oldest_due_micros.unwrap_or(0).max(0).unsigned_abs();
    Backlog::new(
        row.pending.max(0).unsigned_abs(),
        Duration::from_micros(waited),
    )
    .with_horizon(
        horizon
            .oldest_transaction_micros
            .map(|micros| Duration::from_micros(micros.max(0).unsigned_abs())),
        horizon.dead_rows.map(|rows| rows.max(0).unsigned_abs()),
    )
}
