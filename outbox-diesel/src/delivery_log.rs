//! The delivery log, replay and resend: every exchange with a destination, kept to answer
//! "where is my webhook?", and archived messages sent again to one destination or
//! subscription.
//!
//! Each time the worker hands a message to a destination (a webhook endpoint, a broker, a
//! subscription's endpoint), the delivery log keeps a row: when, which destination, which
//! attempt, how it went (`delivered`, `failed`, `rejected`, `pushed_back`), the status code and
//! the first bytes of the answer ([`MAX_ANSWER_BYTES`](outbox_core::destination::MAX_ANSWER_BYTES)),
//! the error, and how long it took. The row is written in the transaction that saves the
//! attempt's outcome: a settlement that fails writes none, and is written again with the
//! outcome. An attempt whose worker died before saving its outcome is not there (the message
//! runs again, and that attempt is), nor one the watchdog gave up on; an exactly-once
//! handler's exchanges are saved just after its transaction, not in it.
//!
//! What it keeps is the store's choice ([`DieselStore::delivery_log`](crate::DieselStore::delivery_log)):
//! every exchange ([`DeliveryLog::All`], the default), failures only, or nothing. The worker
//! prunes it by age and by count ([`DieselStore::delivery_log_retention`](crate::DieselStore::delivery_log_retention),
//! by default 7 days and 1,000,000 rows), a batch at a time like the rest of its chores.
//!
//! Handlers that call no destination (a handler that writes to the database, say) leave no
//! row: their outcome is the message's own (`outbox show`, the dead letters).
//!
//! **Replay and resend.** A store with an archive ([`DieselStore::archive`](crate::DieselStore::archive))
//! keeps each message it delivers for a window. [`replay`] enqueues the archived messages of a
//! time range (optionally of one type) again, and [`resend`] one of them, as new deliveries to
//! one [`ReplayTarget`] with their original ids: a destination gets the stored payload without
//! the type's handler, a subscription only its owner's events of its types, and no one else
//! gets anything. Receivers drop what they already have by id.
//!
//! ```
//! # use diesel::prelude::*;
//! # use diesel::r2d2::{ConnectionManager, Pool};
//! use outbox_diesel::delivery_log::{self, AttemptFilter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut conn = SqliteConnection::establish(":memory:")?;
//! # outbox_diesel::run_migrations(&mut conn)?;
//! // The failed deliveries to the `crm` webhook, newest first.
//! let failed = delivery_log::attempts(
//!     &mut conn,
//!     &AttemptFilter::default().destination("crm").failures_only(),
//! )?;
//! for attempt in failed {
//!     println!("{} {} {:?} {}", attempt.message_id, attempt.attempt, attempt.status, attempt.outcome);
//! }
//! # Ok(())
//! # }
//! ```

use std::time::{Duration, SystemTime};

use outbox_core::destination::DESTINATION_TARGET_PREFIX;
use outbox_core::subscription::filter_takes;
use outbox_core::MessageId;

use crate::connection::{with_backend, OutboxConnection};
use crate::error::{Error, Result};
use crate::sql::codec::{micros_from_time, parse_message_id, time_from_micros};
use crate::sql::delivery_log::{
    self as statements, ArchiveQuery, ArchivedRow, AttemptRow, DeliveryLogStatements as _,
};
use crate::sql::{delete_in_batches, Statements as _, PRUNE_ROUNDS};

pub use crate::sql::delivery_log::{AttemptFilter, DeliveryLog};

/// How long the delivery log keeps an attempt by default.
pub const DEFAULT_DELIVERY_LOG_AGE: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// How many attempts the delivery log keeps at most by default.
pub const DEFAULT_DELIVERY_LOG_ROWS: usize = 1_000_000;

/// How long, and how much, the delivery log keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryLogRetention {
    /// Attempts older than this are pruned (`None`: kept however old).
    pub max_age: Option<Duration>,
    /// At most this many attempts are kept, the newest (`None`: however many).
    pub max_rows: Option<usize>,
}

impl Default for DeliveryLogRetention {
    fn default() -> Self {
        DeliveryLogRetention {
            max_age: Some(DEFAULT_DELIVERY_LOG_AGE),
            max_rows: Some(DEFAULT_DELIVERY_LOG_ROWS),
        }
    }
}

/// One exchange with a destination, as the delivery log keeps it.
/// Serializes (serde) to the JSON form of the admin pages' API and the CLI's `--json`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedAttempt {
    /// Its place in the log: later attempts have higher ids.
    pub id: i64,
    /// The message's id.
    pub message_id: MessageId,
    /// The message's type.
    pub message_type: String,
    /// The destination's name (`subscription:<id>` for a subscription's).
    pub destination: String,
    /// The subscription the message is a delivery for, if it is one.
    pub subscription_id: Option<String>,
    /// Which attempt of the message, from 1.
    pub attempt: u32,
    /// How it went: `delivered`, `failed`, `rejected` or `pushed_back`.
    pub outcome: String,
    /// The status code the other side answered, where it has one (HTTP).
    pub status: Option<u16>,
    /// The first bytes of its answer.
    pub answer: Option<String>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// How long the exchange took, in milliseconds.
    pub latency_ms: f64,
    /// When it started.
    pub started_at: SystemTime,
}

impl LoggedAttempt {
    fn from_row(row: AttemptRow) -> Option<LoggedAttempt> {
        Some(LoggedAttempt {
            id: row.id,
            message_id: parse_message_id("outbox_attempt", row.id, &row.message_id).ok()?,
            message_type: row.message_type,
            destination: row.destination,
            subscription_id: row.subscription_id,
            attempt: u32::try_from(row.attempt).unwrap_or(0),
            outcome: row.outcome,
            status: row.status.and_then(|status| u16::try_from(status).ok()),
            answer: row.answer,
            error: row.error,
            latency_ms: row.latency_micros as f64 / 1000.0,
            started_at: time_from_micros(row.started_at),
        })
    }
}

/// The logged attempts `filter` selects, newest first.
pub fn attempts<C: OutboxConnection>(
    conn: &mut C,
    filter: &AttemptFilter,
) -> Result<Vec<LoggedAttempt>> {
    let rows = with_backend!(conn.backend_connection(), c => statements::attempts(c, filter))?;
    Ok(rows
        .into_iter()
        .filter_map(LoggedAttempt::from_row)
        .collect())
}

/// Deletes the logged attempts past `retention`, in batches; how many. The worker does this by
/// itself; call it where no worker runs on the database.
pub fn prune<C: OutboxConnection>(conn: &mut C, retention: DeliveryLogRetention) -> Result<usize> {
    Ok(with_backend!(conn.backend_connection(), c => {
        prune_rounds(c, retention, usize::MAX)
    })?)
}

/// Up to `rounds` batches of each of `retention`'s prunings.
pub(crate) fn prune_rounds<C: statements::DeliveryLogStatements>(
    c: &mut C,
    retention: DeliveryLogRetention,
    rounds: usize,
) -> diesel::QueryResult<usize> {
    let mut pruned = 0;
    if let Some(age) = retention.max_age {
        let cutoff = micros_from_time(
            SystemTime::now()
                .checked_sub(age)
                .unwrap_or(SystemTime::UNIX_EPOCH),
        );
        pruned += delete_in_batches(c, rounds, |c, limit| {
            statements::prune_older(c, statements::LOGGED, cutoff, limit)
        })?;
    }
    if let Some(rows) = retention.max_rows {
        pruned += delete_in_batches(c, rounds, |c, limit| {
            statements::prune_beyond(c, rows, limit)
        })?;
    }
    Ok(pruned)
}

/// The rounds of the worker's pass.
pub(crate) const WORKER_ROUNDS: usize = PRUNE_ROUNDS;

/// Up to `rounds` batches of archived messages enqueued more than `window` ago deleted.
pub(crate) fn prune_archive_rounds<C: statements::DeliveryLogStatements>(
    c: &mut C,
    window: Duration,
    rounds: usize,
) -> diesel::QueryResult<usize> {
    let cutoff = micros_from_time(
        SystemTime::now()
            .checked_sub(window)
            .unwrap_or(SystemTime::UNIX_EPOCH),
    );
    delete_in_batches(c, rounds, |c, limit| {
        statements::prune_older(c, statements::ARCHIVED, cutoff, limit)
    })
}

/// Deletes the archived messages enqueued more than `window` ago, in batches; how many. The
/// worker does this by itself for a store with an [archive](crate::DieselStore::archive).
pub fn prune_archive<C: OutboxConnection>(conn: &mut C, window: Duration) -> Result<usize> {
    Ok(with_backend!(conn.backend_connection(), c => {
        prune_archive_rounds(c, window, usize::MAX)
    })?)
}

/// A time as operators write one: RFC 3339 (`2025-01-31T14:00:00Z`), or an age before now
/// (`90m`, `1h`); what the CLI's and the admin pages' `since` and `until` take.
pub fn parse_time(text: &str) -> std::result::Result<SystemTime, String> {
    let text = text.trim();
    if let Ok(time) = humantime::parse_rfc3339_weak(text) {
        return Ok(time);
    }
    let age = humantime::parse_duration(text).map_err(|_| {
        format!("`{text}` is neither an RFC 3339 time (2025-01-31T14:00:00Z) nor an age (1h)")
    })?;
    SystemTime::now()
        .checked_sub(age)
        .ok_or_else(|| format!("`{text}` reaches before the epoch"))
}

/// Where a replay or a resend delivers: one of the workers' destinations, or one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayTarget {
    /// The destination of this name (as given to `WorkerBuilder::destination`): the archived
    /// payload goes to it as it is, without the type's handler.
    Destination(String),
    /// The subscription of this id: only messages of its owner that its filters take,
    /// enqueued since it was created (as the live fan-out gives it).
    Subscription(String),
}

/// The longest destination name a replay can name: the row keeps `destination:<name>` where a
/// subscription's delivery keeps the subscription's id.
pub const MAX_REPLAY_DESTINATION: usize = 64 - DESTINATION_TARGET_PREFIX.len();

/// Which archived messages to send again, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Where they go.
    pub target: ReplayTarget,
    /// Those enqueued at or after this time.
    pub since: SystemTime,
    /// Those enqueued before this time (`None`: up to now).
    pub until: Option<SystemTime>,
    /// Only messages of this type.
    pub message_type: Option<String>,
}

impl Replay {
    /// The messages enqueued since `since`, to `target`.
    pub fn new(target: ReplayTarget, since: SystemTime) -> Self {
        Replay {
            target,
            since,
            until: None,
            message_type: None,
        }
    }

    /// Only those enqueued before `until`.
    pub fn until(mut self, until: SystemTime) -> Self {
        self.until = Some(until);
        self
    }

    /// Only messages of `message_type`.
    pub fn message_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }
}

/// What a replay or a resend did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Replayed {
    /// Messages enqueued again as deliveries to the target.
    pub enqueued: usize,
    /// Archived messages in the range the target does not take: another owner's, or of a type
    /// the subscription's filters do not take.
    pub skipped: usize,
}

/// Archived messages read at once.
const REPLAY_CHUNK: i64 = 1000;

/// Sends the archived messages `replay` selects again, each as a new delivery to its target
/// with its original id, type, payload, headers and priority, in their original order
/// (receivers drop what they have by id). Needs a store that keeps an
/// [archive](crate::DieselStore::archive): only messages delivered within its window are
/// there. A replay does not keep per-key order against messages still pending.
///
/// Refused ([`Error::InvalidReplay`]) for a range that ends before it starts, a destination no
/// worker has reported (see [`admin::destinations`](crate::admin::destinations)) or a
/// subscription that does not exist.
pub fn replay<C: OutboxConnection>(conn: &mut C, replay: &Replay) -> Result<Replayed> {
    if replay.until.is_some_and(|until| until <= replay.since) {
        return Err(Error::InvalidReplay {
            reason: "the range ends before it starts: give --until after --since".to_owned(),
        });
    }
    let query = ArchiveQuery {
        since_micros: Some(micros_from_time(replay.since)),
        until_micros: replay.until.map(micros_from_time),
        message_type: replay.message_type.as_deref(),
        ..ArchiveQuery::default()
    };
    send_archived(conn, &replay.target, query)
}

/// Sends archived message `message_id` again to `target`, as [`replay`] does for a range.
/// Refused if the archive does not have it ([`Error::InvalidReplay`]).
pub fn resend<C: OutboxConnection>(
    conn: &mut C,
    message_id: MessageId,
    target: &ReplayTarget,
) -> Result<Replayed> {
    let id = message_id.to_string();
    let query = ArchiveQuery {
        message_id: Some(&id),
        ..ArchiveQuery::default()
    };
    let sent = send_archived(conn, target, query)?;
    if sent.enqueued + sent.skipped == 0 {
        return Err(Error::InvalidReplay {
            reason: format!(
                "message {message_id} is not in the archive: it is still pending or dead (see \
                 `outbox show`), was delivered before the archive's window, or the store keeps \
                 no archive (DieselStore::archive)"
            ),
        });
    }
    Ok(sent)
}

/// Who a target takes: a destination every message, a subscription its owner's messages of the
/// types its filters take.
enum Taker {
    Everything,
    Subscriber {
        owner: Option<String>,
        filters: Vec<String>,
        /// When the subscription was created: it never took earlier events, and a replay
        /// does not send them either.
        created_micros: i64,
    },
}

impl Taker {
    fn takes(&self, row: &ArchivedRow) -> bool {
        match self {
            Taker::Everything => true,
            Taker::Subscriber {
                owner,
                filters,
                created_micros,
            } => {
                row.owner == *owner
                    && row.created_micros >= *created_micros
                    && filters
                        .iter()
                        .any(|filter| filter_takes(filter, &row.message_type))
            }
        }
    }
}

fn send_archived<C: OutboxConnection>(
    conn: &mut C,
    target: &ReplayTarget,
    mut query: ArchiveQuery<'_>,
) -> Result<Replayed> {
    let (row_target, taker) = match target {
        ReplayTarget::Destination(name) => {
            check_destination(conn, name)?;
            (
                format!("{DESTINATION_TARGET_PREFIX}{name}"),
                Taker::Everything,
            )
        }
        ReplayTarget::Subscription(id) => {
            let Some(subscription) = crate::subscription::get(conn, id)? else {
                return Err(Error::InvalidReplay {
                    reason: format!("there is no subscription {id}"),
                });
            };
            (
                id.clone(),
                Taker::Subscriber {
                    owner: subscription.owner,
                    filters: subscription.event_types,
                    created_micros: micros_from_time(subscription.created_at),
                },
            )
        }
    };
    query.limit = REPLAY_CHUNK;
    let mut replayed = Replayed::default();
    loop {
        let chunk = with_backend!(conn.backend_connection(), c => {
            // Begun to write (`BEGIN IMMEDIATE` on SQLite): a worker's writes may come between
            // the read and the insert.
            c.write(|c| {
                let rows = statements::archived(c, &query)?;
                let taken: Vec<i64> = rows
                    .iter()
                    .filter(|row| taker.takes(row))
                    .map(|row| row.id)
                    .collect();
                let sent = statements::enqueue_archived(c, &taken, &row_target)?;
                Ok((rows, sent))
            })
        });
        let (rows, sent) = chunk.inspect_err(|error| {
            if replayed.enqueued > 0 {
                log::error!(
                    "outbox: a replay to {target:?} stopped after enqueuing {} messages: {error}",
                    replayed.enqueued
                );
            }
        })?;
        replayed.enqueued += sent;
        let read = rows.len();
        replayed.skipped += read - rows.iter().filter(|row| taker.takes(row)).count();
        match rows.last() {
            Some(last) if read == REPLAY_CHUNK as usize => query.after = last.id,
            _ => return Ok(replayed),
        }
    }
}

/// Refuses a destination name no worker has reported, or one too long for a delivery's row.
fn check_destination<C: OutboxConnection>(conn: &mut C, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_REPLAY_DESTINATION {
        return Err(Error::InvalidReplay {
            reason: format!(
                "a replay names a destination of 1 to {MAX_REPLAY_DESTINATION} bytes, not `{name}`"
            ),
        });
    }
    let known: Vec<String> = with_backend!(conn.backend_connection(), c => c.destinations())?
        .into_iter()
        .map(|destination| destination.name)
        .collect();
    if !known.iter().any(|known| known == name) {
        return Err(Error::InvalidReplay {
            reason: format!(
                "no worker has reported a destination named `{name}` (known: {known:?}); \
                 name one a running worker delivers to"
            ),
        });
    }
    Ok(())
}
