//! The rows the statements read, as Diesel loads them: one struct per shape of result.

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::QueryableByName;
use outbox_core::store::{StoredDestination, Turns};

/// The columns every reading of a message row selects: claims, listings, dead letters.
#[derive(QueryableByName, Debug)]
pub(crate) struct MessageRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = Text)]
    pub(crate) payload: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) ordering_key: Option<String>,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) headers: Option<String>,
}

/// A claimed row: the message, when it was enqueued, and its priority level.
#[derive(QueryableByName, Debug)]
pub(crate) struct ClaimRow {
    #[diesel(embed)]
    pub(crate) message: MessageRow,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_micros: i64,
    /// When an operator's pause that held it last ended, if one did.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) resumed_micros: Option<i64>,
    /// The subscription it is a delivery for, if it is one.
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) subscription_id: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) priority: i64,
}

/// A pending message as listed.
#[derive(QueryableByName, Debug)]
pub(crate) struct PendingRow {
    #[diesel(embed)]
    pub(crate) message: MessageRow,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_at: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) next_attempt_at: i64,
    #[diesel(sql_type = Integer)]
    pub(crate) in_flight: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) parked: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) paused: i32,
    #[diesel(sql_type = BigInt)]
    pub(crate) priority: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) group_name: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) last_error: Option<String>,
}

/// A dead letter as listed.
#[derive(QueryableByName, Debug)]
pub(crate) struct DeadLetterRow {
    #[diesel(embed)]
    pub(crate) message: MessageRow,
    #[diesel(sql_type = Text)]
    pub(crate) last_error: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_at: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) failed_at: i64,
}

/// A count of rows found.
#[derive(QueryableByName, Debug)]
pub(crate) struct FoundRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) found: i64,
}

/// One line of the stats: counts of one message type.
#[derive(QueryableByName, Debug)]
pub(crate) struct StatsRow {
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) total: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) in_flight: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest: Option<i64>,
}

/// The backlog: messages in the outbox, and the microseconds the oldest due one has waited.
#[derive(QueryableByName, Debug)]
pub(crate) struct BacklogRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) pending: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest_due_micros: Option<i64>,
    /// When the oldest due, unheld message became due, in µs since the epoch (PostgreSQL and
    /// MySQL: where the claim cursor steps back to if it passed it).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest_due_at: Option<i64>,
}

/// What keeps the database from cleaning up: the oldest transaction holding it back (µs open)
/// and the rows waiting for it.
#[derive(QueryableByName, Debug, Default)]
pub(crate) struct HorizonRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest_transaction_micros: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) dead_rows: Option<i64>,
}

/// The head of an ordering key waiting for a retry, and how many wait behind it.
#[derive(QueryableByName, Debug)]
pub(crate) struct BlockedKeyRow {
    #[diesel(sql_type = Text)]
    pub(crate) ordering_key: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = Text)]
    pub(crate) last_error: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) next_attempt_at: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) waiting: i64,
}

/// A destination as a worker reads it to adopt what the store says.
#[derive(QueryableByName, Debug)]
pub(crate) struct StoredDestinationRow {
    #[diesel(sql_type = Text)]
    pub(crate) name: String,
    #[diesel(sql_type = Text)]
    pub(crate) state: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) disabled_reason: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) enables: i64,
}

/// A destination's turns as [`Statements::lock_turns`] reads them, with the database's clock.
#[derive(QueryableByName, Debug)]
pub(crate) struct TurnsRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    turn_tokens: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    turns_refilled: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    turns_booked_until: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    last_turn: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub(crate) now: i64,
}

impl TurnsRow {
    /// The turns kept, if a worker took one before.
    pub(crate) fn turns(&self) -> Option<Turns> {
        Some(Turns {
            tokens: self.turn_tokens? as f64 / 1e6,
            refilled: self.turns_refilled?,
            booked_until: self.turns_booked_until,
            last_turn: self.last_turn?,
        })
    }

    /// Turns in millionths, as the column keeps them.
    pub(crate) fn millionths(tokens: f64) -> i64 {
        (tokens * 1e6).round() as i64
    }
}

impl StoredDestinationRow {
    pub(crate) fn into_stored(self) -> StoredDestination {
        let disabled = (self.state == DISABLED).then(|| self.disabled_reason.unwrap_or_default());
        StoredDestination::new(self.name, disabled, self.enables)
    }
}

/// The state word of a disabled destination, as workers and operators write it.
pub(crate) const DISABLED: &str = "disabled";

/// A destination as listed.
#[derive(QueryableByName, Debug)]
pub(crate) struct DestinationRow {
    #[diesel(sql_type = Text)]
    pub(crate) name: String,
    #[diesel(sql_type = Text)]
    pub(crate) kind: String,
    #[diesel(sql_type = Text)]
    pub(crate) state: String,
    #[diesel(sql_type = Integer)]
    pub(crate) consecutive_failures: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) last_error: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) next_probe_at: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) disabled_reason: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) reported_at: i64,
}

/// A row of one text column named `message_id`.
#[derive(QueryableByName, Debug)]
pub(crate) struct MessageIdRow {
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
}

/// A row of one BIGINT column named `id`.
#[derive(QueryableByName, Debug)]
pub(crate) struct IdRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
}

/// A row of one BIGINT column named `n`.
#[derive(QueryableByName, Debug)]
pub(crate) struct CountRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}

/// A pause as stored.
#[derive(QueryableByName, Debug)]
pub(crate) struct PauseRow {
    #[diesel(sql_type = Text)]
    pub(crate) kind: String,
    #[diesel(sql_type = Text)]
    pub(crate) name: String,
    #[diesel(sql_type = Text)]
    pub(crate) reason: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) paused_at: i64,
}

/// A group listed for claims, and whether it comes after the last claim's last group (0) or
/// from the first again (1).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[derive(QueryableByName, Debug)]
pub(crate) struct GroupRow {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = BigInt)]
    pub pass: i64,
}
