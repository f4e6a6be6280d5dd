//! Looking into the outbox: pending messages and, for operators, dead letters.
//!
//! Every record listed here serializes (serde) to one JSON form, the one the admin pages' JSON
//! API and the CLI's `--json` print: times in RFC 3339, payloads as JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::store::Backlog;
use outbox_core::{Headers, MessageId};

use crate::connection::{with_backend, OutboxConnection};
use crate::error::{Error, Result};
pub use crate::sql::codec::PauseKind;
use crate::sql::codec::{backlog_of, parse_message_id, priority_from_level, time_from_micros};
use outbox_core::Priority;
mod serialized;

use crate::sql::{
    retry_deadlocks, BlockedKeyRow, DeadLetterRow, Filter, PendingRow, Selection, Statements,
};

/// The characters of each payload the admin pages and the CLI list in their JSON (the
/// dead-letter page shows them too); a message's own page shows its payload whole.
pub const PREVIEW_CHARS: u32 = 300;

/// Which messages a listing returns: filters, and a page by position (keyset pagination: a
/// page starts at a position, so reading the ten-thousandth page costs what the first does).
///
/// ```
/// # use diesel::prelude::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # outbox_diesel::run_migrations(&mut conn)?;
/// use outbox_diesel::admin::{self, ListOptions};
///
/// let mut options = ListOptions::new().message_type("comment.thankYou").limit(50);
/// loop {
///     let page = admin::pending_messages(&mut conn, &options)?;
///     // ... show the page ...
///     match page.last() {
///         Some(last) if page.len() == 50 => options = options.after(last.position),
///         _ => break,
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ListOptions {
    message_type: Option<String>,
    ordering_key: Option<String>,
    min_attempts: u32,
    due_only: bool,
    after: Option<i64>,
    limit: u32,
    payload_preview: Option<u32>,
}

impl Default for ListOptions {
    fn default() -> Self {
        ListOptions {
            message_type: None,
            ordering_key: None,
            min_attempts: 0,
            due_only: false,
            after: None,
            limit: 100,
            payload_preview: None,
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

    /// Only messages with this ordering key.
    pub fn ordering_key(mut self, ordering_key: impl Into<String>) -> Self {
        self.ordering_key = Some(ordering_key.into());
        self
    }

    /// Pending messages only: those with at least this many attempts started (1: the ones
    /// that have failed or are being tried). Ignored by dead-letter listings.
    pub fn min_attempts(mut self, attempts: u32) -> Self {
        self.min_attempts = attempts;
        self
    }

    /// Pending messages only: those a worker could claim now (due, not held, not waiting
    /// behind an earlier message of their key). Ignored by dead-letter listings.
    pub fn due_only(mut self) -> Self {
        self.due_only = true;
        self
    }

    /// The page after the message at `position`: the next messages by position.
    pub fn after(mut self, position: i64) -> Self {
        self.after = Some(position);
        self
    }

    /// At most this many messages.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// Read at most this many characters of each payload (the database sends no more); the
    /// listed message says whether its payload was cut (`payload_truncated`). Listings that
    /// show payloads whole or not at all read them whole by default; a page of previews of
    /// 4 MiB payloads is then kilobytes, not hundreds of megabytes.
    pub fn payload_preview(mut self, chars: u32) -> Self {
        self.payload_preview = Some(chars);
        self
    }

    fn filter(&self) -> Filter<'_> {
        Filter {
            message_type: self.message_type.as_deref(),
            ordering_key: self.ordering_key.as_deref(),
            min_attempts: self.min_attempts,
            due_only: self.due_only,
            position: self.after.map(|after| after.saturating_add(1)),
            limit: Some(self.limit),
            // One character more than shown tells whether there was more.
            payload_chars: self.payload_preview.map(|chars| chars.saturating_add(1)),
        }
    }
}

/// A payload as read, cut to `preview` characters when it is longer: the payload and whether
/// it was cut.
fn previewed(mut payload: String, preview: Option<u32>) -> (String, bool) {
    let cut_at = preview.and_then(|chars| {
        payload
            .char_indices()
            .nth(usize::try_from(chars).unwrap_or(usize::MAX))
            .map(|(at, _)| at)
    });
    match cut_at {
        Some(at) => {
            payload.truncate(at);
            (payload, true)
        }
        None => (payload, false),
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
    /// Its payload, the JSON text of the message struct: its first characters only when the
    /// listing asked for a [preview](ListOptions::payload_preview) and it is longer.
    pub payload: String,
    /// Whether `payload` is only the first characters of the payload.
    pub payload_truncated: bool,
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
    /// Whether it waits behind an earlier message of its ordering key (parked: not claimable
    /// until that one is settled).
    pub parked: bool,
    /// Whether a worker found its message type or destination paused by an operator: it
    /// waits, not due, until [`resume`] (its `next_attempt_at` is then far ahead).
    pub paused: bool,
    /// How soon it is claimed against other due messages.
    pub priority: Priority,
    /// The group it shares claims with (`EnqueueOptions::group`), if any.
    pub group: Option<String>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// The headers set at enqueue.
    pub headers: Headers,
}

/// A row's headers for a listing. Unreadable ones (a row edited by hand; the claim
/// dead-letters such a message with the reason) are listed as none, so that the row can still
/// be seen, re-queued and purged.
fn listed_headers(table: &str, id: i64, json: Option<&str>) -> Headers {
    Headers::from_json(json).unwrap_or_else(|error| {
        log::warn!("outbox: the headers of {table} row {id} are unreadable: {error}");
        Headers::new()
    })
}

/// How much waits in the outbox: the messages in it and how long the oldest due one has
/// waited; what the worker's `outbox_pending_messages` and `outbox_oldest_due_age_seconds`
/// gauges show. One query: a count of the outbox table and the first entry of its due index.
///
/// ```
/// # use diesel::prelude::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # outbox_diesel::run_migrations(&mut conn)?;
/// let backlog = outbox_diesel::admin::backlog(&mut conn)?;
/// assert_eq!(backlog.pending, 0);
/// assert_eq!(backlog.oldest_due_age, std::time::Duration::ZERO);
/// # Ok(())
/// # }
/// ```
pub fn backlog<C: OutboxConnection>(conn: &mut C) -> Result<Backlog> {
    let row = with_backend!(conn.backend_connection(), c => c.backlog())?;
    // What holds the clean-up back is read apart: a role without the right to see other
    // sessions still gets the backlog.
    let horizon = with_backend!(conn.backend_connection(), c => c.horizon()).unwrap_or_default();
    Ok(backlog_of(&row, &horizon))
}

/// Messages in the outbox, by position (enqueue order), as `options` filter and page them.
pub fn pending_messages<C: OutboxConnection>(
    conn: &mut C,
    options: &ListOptions,
) -> Result<Vec<PendingMessage>> {
    let filter = options.filter();
    let rows: Vec<PendingRow> = with_backend!(conn.backend_connection(), c => c.pending(&filter))?;
    rows.into_iter()
        .map(|row| pending_message(row, options.payload_preview))
        .collect()
}

fn pending_message(row: PendingRow, preview: Option<u32>) -> Result<PendingMessage> {
    let m = row.message;
    let (payload, payload_truncated) = previewed(m.payload, preview);
    Ok(PendingMessage {
        message_id: parse_message_id("outbox_message", m.id, &m.message_id)?,
        position: m.id,
        message_type: m.message_type,
        payload,
        payload_truncated,
        ordering_key: m.ordering_key,
        attempts: m.attempts.max(0).unsigned_abs(),
        created_at: time_from_micros(row.created_at),
        next_attempt_at: time_from_micros(row.next_attempt_at),
        in_flight: row.in_flight != 0,
        parked: row.parked != 0,
        paused: row.paused != 0,
        priority: priority_from_level(row.priority),
        group: row.group_name,
        last_error: row.last_error,
        headers: listed_headers("outbox_message", m.id, m.headers.as_deref()),
    })
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
    /// Its payload: its first characters only when the listing asked for a
    /// [preview](ListOptions::payload_preview) and it is longer.
    pub payload: String,
    /// Whether `payload` is only the first characters of the payload.
    pub payload_truncated: bool,
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
    /// The headers set at enqueue.
    pub headers: Headers,
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
    fn as_sql(&self) -> Selection<'_> {
        match self {
            DeadLetterSelection::Positions(ids) => Selection::Positions(ids),
            DeadLetterSelection::MessageType(t) => Selection::MessageType(t),
            DeadLetterSelection::All => Selection::All,
        }
    }
}

fn load_dead_letters<C: OutboxConnection>(
    conn: &mut C,
    filter: &Filter<'_>,
) -> Result<Vec<DeadLetter>> {
    let rows: Vec<DeadLetterRow> =
        with_backend!(conn.backend_connection(), c => c.dead_letters(filter))?;
    // The filter reads one character more than the preview shows.
    let preview = filter.payload_chars.map(|chars| chars.saturating_sub(1));
    rows.into_iter()
        .map(|row| dead_letter_of(row, preview))
        .collect()
}

fn dead_letter_of(row: DeadLetterRow, preview: Option<u32>) -> Result<DeadLetter> {
    let m = row.message;
    let (payload, payload_truncated) = previewed(m.payload, preview);
    Ok(DeadLetter {
        message_id: parse_message_id("outbox_failure", m.id, &m.message_id)?,
        position: m.id,
        message_type: m.message_type,
        payload,
        payload_truncated,
        ordering_key: m.ordering_key,
        attempts: m.attempts.max(0).unsigned_abs(),
        last_error: row.last_error,
        created_at: time_from_micros(row.created_at),
        failed_at: time_from_micros(row.failed_at),
        headers: listed_headers("outbox_failure", m.id, m.headers.as_deref()),
    })
}

/// Dead letters, by position, as `options` filter and page them (the pending-only filters
/// do not apply).
pub fn dead_letters<C: OutboxConnection>(
    conn: &mut C,
    options: &ListOptions,
) -> Result<Vec<DeadLetter>> {
    load_dead_letters(conn, &options.filter())
}

/// One dead letter by its position, if it exists.
pub fn dead_letter<C: OutboxConnection>(conn: &mut C, position: i64) -> Result<Option<DeadLetter>> {
    let filter = Filter {
        position: Some(position),
        ..Filter::new(Some(1))
    };
    Ok(load_dead_letters(conn, &filter)?
        .into_iter()
        .find(|letter| letter.position == position))
}

/// The positions of the dead letters of `message_type` (`None`: every dead letter), in order,
/// without reading their payloads: what a bulk re-queue or purge affects, to count or confirm.
pub fn dead_letter_positions<C: OutboxConnection>(
    conn: &mut C,
    message_type: Option<&str>,
) -> Result<Vec<i64>> {
    Ok(with_backend!(conn.backend_connection(), c => c.dead_positions(message_type))?)
}

/// Where a message is: waiting in the outbox, or dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FoundMessage {
    /// In the outbox, pending or in flight.
    Pending(PendingMessage),
    /// Among the dead letters.
    Dead(DeadLetter),
}

/// The message with id `message_id`, pending or dead, or `None` when it is in neither table
/// (delivered, purged, or never enqueued).
///
/// The dead letters are searched by an index; the outbox table has none on message ids (each
/// enqueue would pay for it), so a lookup there reads the table: fine for an operator's
/// question, not for a hot path.
pub fn find_message<C: OutboxConnection>(
    conn: &mut C,
    message_id: MessageId,
) -> Result<Option<FoundMessage>> {
    let id = message_id.to_string();
    let dead = with_backend!(conn.backend_connection(), c => c.dead_by_message_id(&id))?;
    if let Some(row) = dead.into_iter().next() {
        return Ok(Some(FoundMessage::Dead(dead_letter_of(row, None)?)));
    }
    let pending = with_backend!(conn.backend_connection(), c => c.pending_by_message_id(&id))?;
    pending
        .into_iter()
        .next()
        .map(|row| pending_message(row, None).map(FoundMessage::Pending))
        .transpose()
}

/// The head of an ordering key that failed and waits for a retry: every later message of its
/// key waits behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockedKey {
    /// The ordering key.
    pub ordering_key: String,
    /// The head's position.
    pub position: i64,
    /// The head's message id.
    pub message_id: MessageId,
    /// The head's type.
    pub message_type: String,
    /// Attempts the head has had.
    pub attempts: u32,
    /// Why its last attempt failed.
    pub last_error: String,
    /// When it is tried again (or, while a worker holds it, when that lease ends).
    pub next_attempt_at: SystemTime,
    /// Messages of the key waiting behind it.
    pub waiting: u64,
}

/// Ordering keys held up by a head that failed and waits for a retry, soonest retry first, at
/// most `limit`: the "what is stuck" question. A key stays blocked until its head succeeds or
/// runs out of attempts and is dead-lettered.
pub fn blocked_keys<C: OutboxConnection>(conn: &mut C, limit: u32) -> Result<Vec<BlockedKey>> {
    let rows: Vec<BlockedKeyRow> =
        with_backend!(conn.backend_connection(), c => c.blocked_keys(i64::from(limit)))?;
    rows.into_iter()
        .map(|row| {
            Ok(BlockedKey {
                message_id: parse_message_id("outbox_message", row.id, &row.message_id)?,
                ordering_key: row.ordering_key,
                position: row.id,
                message_type: row.message_type,
                attempts: row.attempts.max(0).unsigned_abs(),
                last_error: row.last_error,
                next_attempt_at: time_from_micros(row.next_attempt_at),
                waiting: row.waiting.max(0).unsigned_abs(),
            })
        })
        .collect()
}

/// Moves the selected dead letters back into the outbox, atomically, to be processed again
/// from the first attempt with their original message ids and at their original positions:
/// a re-queued message of an ordering key runs before the later messages of its key that are
/// still pending (one already running finishes first). Returns the positions.
pub fn requeue_dead_letters<C: OutboxConnection>(
    conn: &mut C,
    selection: &DeadLetterSelection,
) -> Result<Vec<i64>> {
    let selection = selection.as_sql();
    let moved = with_backend!(conn.backend_connection(), c => retry_deadlocks(c, |c| c.requeue(&selection)))?;
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
    let selection = selection.as_sql();
    let purged = with_backend!(conn.backend_connection(), c => c.purge(&selection))?;
    log::info!("outbox: purged {purged} dead letters");
    Ok(purged)
}

/// Which pending messages [`cancel`] removes: every filter given must hold, and at least one
/// of message, type and subscription must be given.
///
/// ```
/// # use diesel::prelude::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # outbox_diesel::run_migrations(&mut conn)?;
/// use std::time::Duration;
/// use outbox_diesel::admin::{self, CancelSelection};
///
/// // A customer's endpoint is gone for good: stop the hour-old backlog of its deliveries.
/// let selection = CancelSelection::new()
///     .subscription("0193a3b4-5c6d-7e8f-9a0b-1c2d3e4f5a6b")
///     .older_than(Duration::from_secs(3600));
/// let cancelled = admin::cancel(&mut conn, &selection, "endpoint retired (ticket 4211)")?;
/// println!("{} cancelled, {} being delivered", cancelled.cancelled, cancelled.in_flight);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CancelSelection {
    message_id: Option<MessageId>,
    message_type: Option<String>,
    subscription: Option<String>,
    older_than: Option<Duration>,
}

impl CancelSelection {
    /// No filter yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The message with this id: every row of it (an event waiting to be fanned out and its
    /// deliveries to subscriptions share it; add [`subscription`](Self::subscription) for one).
    /// The outbox table has no index on message ids: this reads the table, as
    /// [`find_message`] does.
    pub fn message_id(mut self, id: MessageId) -> Self {
        self.message_id = Some(id);
        self
    }

    /// Messages of this type.
    pub fn message_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }

    /// Deliveries to this subscription.
    pub fn subscription(mut self, id: impl Into<String>) -> Self {
        self.subscription = Some(id.into());
        self
    }

    /// Messages enqueued at least this long ago.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }
}

/// What [`cancel`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Cancelled {
    /// Messages cancelled: removed from the outbox, recorded in `outbox_cancelled`.
    pub cancelled: u64,
    /// Selected messages a worker is delivering right now, which were left alone: they finish
    /// (or, should they fail, wait for their next attempt, where a second cancel takes them).
    pub in_flight: u64,
}

/// Messages a cancel moves in one transaction.
const CANCEL_BATCH: i64 = 1_000;

/// Cancels the pending messages `selection` names: each is removed from the outbox and
/// recorded in `outbox_cancelled` with `reason`, never dead-lettered, and never delivered.
/// A cancelled message that headed its ordering key lets the key's next message run. A message
/// a worker is delivering at this moment cannot be called back: it is left alone and counted
/// in [`Cancelled::in_flight`].
///
/// Runs its own transactions, a thousand messages each, so a large cancel never holds locks
/// long; the messages of one transaction are cancelled together or not at all.
pub fn cancel<C: OutboxConnection>(
    conn: &mut C,
    selection: &CancelSelection,
    reason: &str,
) -> Result<Cancelled> {
    if selection.message_id.is_none()
        && selection.message_type.is_none()
        && selection.subscription.is_none()
    {
        return Err(Error::InvalidCancel {
            reason: "name a message id, a message type or a subscription (a cancel of every \
                     pending message is refused)"
                .into(),
        });
    }
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(Error::InvalidCancel {
            reason: "give a reason: it is kept with each cancelled message".into(),
        });
    }
    let message_id = selection.message_id.map(|id| id.to_string());
    let rows = crate::sql::cancel::CancelRows {
        message_id: message_id.as_deref(),
        message_type: selection.message_type.as_deref(),
        subscription: selection.subscription.as_deref(),
        older_than_micros: selection
            .older_than
            .map(|age| i64::try_from(age.as_micros()).unwrap_or(i64::MAX)),
        limit: CANCEL_BATCH,
    };
    let mut cancelled = 0;
    let in_flight = with_backend!(conn.backend_connection(), c => {
        use crate::sql::cancel::CancelStatements as _;
        loop {
            // A batch a worker's settlement deadlocks (MySQL) was rolled back whole: run again.
            let moved = retry_deadlocks(c, |c| {
                c.cancel_transaction(|c| crate::sql::cancel::cancel_batch(c, &rows, reason))
            })?;
            cancelled += moved as u64;
            if (moved as i64) < CANCEL_BATCH {
                break;
            }
        }
        c.cancel_in_flight(&rows)?
    });
    log::info!("outbox: cancelled {cancelled} messages ({reason})");
    Ok(Cancelled {
        cancelled,
        in_flight: u64::try_from(in_flight).unwrap_or(0),
    })
}

/// A destination's health as the workers that deliver to it report it: every worker given
/// the destination (`WorkerBuilder::destination`) writes what it sees when it starts and every
/// few seconds after (the last report wins when several deliver to it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DestinationStatus {
    /// The destination's name, as the workers were given it.
    pub name: String,
    /// Its kind: `webhook`, `jetstream`, `rabbitmq`, `kafka`, ...
    pub kind: String,
    /// `healthy`, `held` (it asked for no deliveries for a while), `paused` (failing again and
    /// again: deliveries wait, probed with backoff) or `disabled` (it said it is gone, or an
    /// operator disabled it: deliveries are dead-lettered).
    pub state: String,
    /// Retryable failures since the destination last answered.
    pub consecutive_failures: u32,
    /// The last failure while paused, or what the destination said while held.
    pub last_error: Option<String>,
    /// When the next probe may go out while paused, or deliveries resume while held.
    pub next_probe_at: Option<SystemTime>,
    /// Why it is disabled.
    pub disabled_reason: Option<String>,
    /// When a worker last reported it: a report older than a minute means no running worker
    /// delivers to it.
    pub reported_at: SystemTime,
}

/// Every destination a worker has reported, by name.
pub fn destinations<C: OutboxConnection>(conn: &mut C) -> Result<Vec<DestinationStatus>> {
    let rows = with_backend!(conn.backend_connection(), c => c.destinations())?;
    Ok(rows
        .into_iter()
        .map(|row| DestinationStatus {
            name: row.name,
            kind: row.kind,
            state: row.state,
            consecutive_failures: row.consecutive_failures.max(0).unsigned_abs(),
            last_error: row.last_error,
            next_probe_at: row.next_probe_at.map(time_from_micros),
            disabled_reason: row.disabled_reason,
            reported_at: time_from_micros(row.reported_at),
        })
        .collect())
}

/// Enables a destination for every worker that delivers to it, whatever disabled or paused
/// it: each follows within a few seconds (its next sync with the store). Messages dead-lettered
/// while it was disabled stay dead letters until re-queued. Returns `false` if no worker has
/// reported a destination of that name.
pub fn enable_destination<C: OutboxConnection>(conn: &mut C, name: &str) -> Result<bool> {
    let changed = with_backend!(conn.backend_connection(), c => c.enable_destination(name))?;
    if changed > 0 {
        log::warn!("outbox: destination {name} enabled by an operator");
    }
    Ok(changed > 0)
}
/// Ends an admin session for every process that shares the database: the admin pages refuse
/// a session recorded here (a copied cookie after sign-out) until `expires`, when its cookie
/// would have expired anyway. Forgets the sessions that have since expired.
pub fn revoke_admin_session<C: OutboxConnection>(
    conn: &mut C,
    session_id: &str,
    expires: SystemTime,
) -> Result<()> {
    let unix = |time: SystemTime| {
        time.duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    };
    with_backend!(conn.backend_connection(), c => c.revoke_session(session_id, unix(expires)))?;
    with_backend!(
        conn.backend_connection(),
        c => c.forget_revoked_sessions(unix(SystemTime::now()))
    )?;
    Ok(())
}

/// Whether an admin session was ended by [`revoke_admin_session`].
pub fn admin_session_revoked<C: OutboxConnection>(conn: &mut C, session_id: &str) -> Result<bool> {
    Ok(with_backend!(conn.backend_connection(), c => c.session_revoked(session_id))?)
}

/// Disables a destination for every worker that delivers to it, as a `410 Gone` does: within
/// a few seconds its deliveries stop and their messages are dead-lettered with `reason`, until
/// [`enable_destination`]. Returns `false` if no worker has reported a destination of that name.
pub fn disable_destination<C: OutboxConnection>(
    conn: &mut C,
    name: &str,
    reason: &str,
) -> Result<bool> {
    let changed =
        with_backend!(conn.backend_connection(), c => c.disable_destination(name, reason))?;
    if changed > 0 {
        log::warn!("outbox: destination {name} disabled by an operator: {reason}");
    }
    Ok(changed > 0)
}

/// A message type or destination an operator paused: [`pauses`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pause {
    /// What is paused.
    pub kind: PauseKind,
    /// The message type or the destination's name.
    pub name: String,
    /// Why, as the operator said.
    pub reason: String,
    /// Since when.
    pub paused_at: SystemTime,
}

/// The longest name a pause takes, in characters (the outbox's type and name columns).
const MAX_PAUSE_NAME_CHARS: usize = 255;

/// Pauses a message type or a destination for every worker on the database: within a few
/// seconds (each worker's next read of the pauses) no worker processes a message of that type,
/// or delivers to that destination. Its messages stay pending, their attempts not counted, and
/// are never dead-lettered for the pause; they are delivered again after [`resume`]. A
/// message a worker holds when the pause begins still finishes. Returns `false` if it was
/// paused already (the first reason stays).
///
/// ```
/// # use diesel::prelude::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let mut conn = SqliteConnection::establish(":memory:")?;
/// # outbox_diesel::run_migrations(&mut conn)?;
/// use outbox_diesel::admin::{self, PauseKind};
///
/// admin::pause(&mut conn, PauseKind::MessageType, "comment.thankYou", "mail provider incident")?;
/// assert_eq!(admin::pauses(&mut conn)?[0].name, "comment.thankYou");
/// // ... later: its messages are delivered again.
/// let released = admin::resume(&mut conn, PauseKind::MessageType, "comment.thankYou")?;
/// assert_eq!(released, Some(0));
/// # Ok(())
/// # }
/// ```
pub fn pause<C: OutboxConnection>(
    conn: &mut C,
    kind: PauseKind,
    name: &str,
    reason: &str,
) -> Result<bool> {
    check_pause_name(name)?;
    let added =
        with_backend!(conn.backend_connection(), c => c.pause(kind.as_str(), name, reason))?;
    if added > 0 {
        log::warn!(
            "outbox: {} {name} paused by an operator: {reason}",
            kind.as_str()
        );
    }
    Ok(added > 0)
}

/// Ends a [`pause`]: the paused messages are due at once (those of a type still paused
/// stay), and every worker follows within a few seconds. Returns `None` if it was not paused,
/// or how many paused messages were made due.
pub fn resume<C: OutboxConnection>(
    conn: &mut C,
    kind: PauseKind,
    name: &str,
) -> Result<Option<usize>> {
    check_pause_name(name)?;
    // The pause ends first, in its own statement: a worker that pauses a message after this
    // commits reads it as ended. One that paused a message just before is caught by the
    // release below, or by its own release when it sees the pause end.
    let removed = with_backend!(conn.backend_connection(), c => {
        retry_deadlocks(c, |c| c.resume(kind.as_str(), name))
    })?;
    if removed == 0 {
        return Ok(None);
    }
    let released =
        with_backend!(conn.backend_connection(), c => retry_deadlocks(c, |c| c.release_paused()))?;
    log::warn!(
        "outbox: {} {name} resumed by an operator; {released} paused messages due again",
        kind.as_str()
    );
    Ok(Some(released))
}

/// Every message type and destination paused, by kind and name.
pub fn pauses<C: OutboxConnection>(conn: &mut C) -> Result<Vec<Pause>> {
    let rows = with_backend!(conn.backend_connection(), c => c.pauses())?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            Some(Pause {
                kind: PauseKind::from_stored(&row.kind)?,
                name: row.name,
                reason: row.reason,
                paused_at: time_from_micros(row.paused_at),
            })
        })
        .collect())
}

fn check_pause_name(name: &str) -> Result<()> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_PAUSE_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(Error::InvalidPauseName {
            name: name.chars().take(80).collect(),
        });
    }
    Ok(())
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

/// Pending, in-flight and dead counts by message type, sorted by type.
pub fn stats<C: OutboxConnection>(conn: &mut C) -> Result<Vec<TypeStats>> {
    let (pending, dead) = with_backend!(conn.backend_connection(), c => c.stats())?;
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
