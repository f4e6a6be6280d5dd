//! Idempotent enqueue: a message enqueued with an idempotency key is written once, however
//! often the enqueue runs.
//!
//! An application that retries a request (a double-clicked form, a client's retry after a
//! timeout, a job run twice) would otherwise enqueue its message again. With
//! [`EnqueueOptions::idempotency_key`](crate::EnqueueOptions::idempotency_key), the enqueue
//! first records the key in the `outbox_idempotency` table; when the key is recorded already,
//! it writes nothing and returns the id of the message first enqueued with it. It never fails
//! the caller's transaction for a duplicate: the record is an `INSERT … ON CONFLICT DO NOTHING`
//! (`INSERT IGNORE` on MySQL, `INSERT OR IGNORE` on SQLite).
//!
//! ```
//! # use diesel::prelude::*;
//! use outbox_diesel::prelude::*;
//! use outbox_diesel::{EnqueueOptions, Message};
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct ThankYou { member_id: i64 }
//! # impl Message for ThankYou { const MESSAGE_TYPE: &'static str = "comment.thankYou"; }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut conn = SqliteConnection::establish(":memory:")?;
//! # outbox_diesel::run_migrations(&mut conn)?;
//! let once = EnqueueOptions::new().idempotency_key("thank-you/comment-42");
//! let first = ThankYou { member_id: 7 }.enqueue_with(&mut conn, &once)?;
//! let again = ThankYou { member_id: 7 }.enqueue_with(&mut conn, &once)?;
//! assert_eq!(first, again);
//! assert_eq!(outbox_diesel::admin::stats(&mut conn)?[0].pending, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # How long a key is remembered
//!
//! While its message is pending or dead-lettered (a dead letter may be re-queued), and then for
//! a window after it settled: [`DEFAULT_IDEMPOTENCY_WINDOW`] unless the worker's store says
//! otherwise ([`DieselStore::idempotency_window`](crate::DieselStore::idempotency_window)).
//! The worker notices settled messages every few seconds, reading a bounded page of keys per
//! round in position order (so a large backlog of keyed messages makes it notice later, which
//! only keeps keys longer), stamps their keys settled and deletes keys whose window has passed,
//! in bounded batches. Applications that run no worker can call [`expire_idempotency_keys`].
//!
//! # Concurrent enqueues with one key
//!
//! The second transaction waits on the key's primary key until the first one ends: if it
//! commits, the second gets its message id; if it rolls back, the second enqueues its own
//! message. On PostgreSQL under REPEATABLE READ or SERIALIZABLE, the second instead fails with a
//! serialization error (the first's row is not in its snapshot), which applications at those
//! levels retry anyway; on MySQL, when the first rolls back while two or more wait, one of the
//! waiters may be chosen as a deadlock victim and must be retried.
//!
//! Keys compare byte for byte on every backend (no case folding, no trailing-space padding),
//! are 1 to 255 bytes long and may not contain U+0000.

use std::time::Duration;

use diesel::QueryResult;
use outbox_core::MessageId;

use crate::connection::{with_backend, OutboxConnection};
use crate::error::{Error, Result};
use crate::sql::new_message::NewMessage;
use crate::sql::{age_micros, delete_in_batches, Statements, ID_CHUNK, PRUNE_ROUNDS};

/// How long a key is remembered after its message settled, unless configured otherwise: a day,
/// longer than most clients retry a request.
pub const DEFAULT_IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest window honoured (a hundred years: "forever"); longer ones are cut to it, which
/// every backend's time arithmetic can take.
pub const MAX_IDEMPOTENCY_WINDOW: Duration = crate::sql::LONGEST_AGE;

/// Inserts `rows` in order, the keyed ones after recording their keys (skipping those whose key
/// is recorded), in one transaction (a savepoint inside the caller's); returns each row's
/// message id, or for a skipped row the id of the message first enqueued with its key.
///
/// The keys are recorded first, in byte order, then the rows inserted in enqueue order: two
/// transactions enqueuing the same keys in opposite orders wait for each other instead of
/// deadlocking (each reservation locks its key's entry until the transaction ends).
pub(crate) fn insert<C>(c: &mut C, rows: &[NewMessage]) -> QueryResult<Vec<MessageId>>
where
    C: Statements,
{
    c.transaction(|c| {
        let mut keys: Vec<(&str, &NewMessage)> = rows
            .iter()
            .filter_map(|row| Some((row.idempotency_key()?, row)))
            .collect();
        // The first row of a key is the one recorded; later ones in the batch are duplicates.
        keys.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
        keys.dedup_by_key(|(key, _)| *key);
        let mut reserved = std::collections::HashSet::new();
        for (key, row) in keys {
            if c.reserve_idempotency_key(key, row.message_id())? {
                reserved.insert(row.message_id());
            }
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut unkeyed_run = 0;
        for (at, row) in rows.iter().enumerate() {
            let Some(key) = row.idempotency_key() else {
                unkeyed_run += 1;
                ids.push(row.id());
                continue;
            };
            // Positions follow the enqueue order, so the rows before go in first.
            c.insert_messages(&rows[at - unkeyed_run..at])?;
            unkeyed_run = 0;
            if reserved.contains(row.message_id()) {
                c.insert_messages(std::slice::from_ref(row))?;
                c.set_idempotency_position(key)?;
                ids.push(row.id());
            } else {
                ids.push(recorded_or_insert(c, row, key)?);
            }
        }
        c.insert_messages(&rows[rows.len() - unkeyed_run..])?;
        Ok(ids)
    })
}

/// The message recorded with `key`; or, if its record vanished meanwhile (it expired just
/// then), `row` inserted and recorded in its place.
fn recorded_or_insert<C: Statements>(
    c: &mut C,
    row: &NewMessage,
    key: &str,
) -> QueryResult<MessageId> {
    for _ in 0..3 {
        if let Some(existing) = c.idempotent_message(key)? {
            log::debug!("outbox: idempotency key {key:?} is recorded; enqueue skipped");
            return existing.parse().map_err(|error| {
                diesel::result::Error::DeserializationError(
                    format!("outbox_idempotency holds an invalid message id {existing:?}: {error}")
                        .into(),
                )
            });
        }
        if c.reserve_idempotency_key(key, row.message_id())? {
            c.insert_messages(std::slice::from_ref(row))?;
            c.set_idempotency_position(key)?;
            return Ok(row.id());
        }
    }
    Err(diesel::result::Error::NotFound)
}

/// Where the worker's sweep goes on next time: the position after which it reads the next page
/// of unsettled keys.
#[derive(Debug, Default)]
pub(crate) struct SweepCursor(i64);

/// One round of the worker: stamps settled the keys of up to [`PRUNE_ROUNDS`] pages from the
/// cursor on (starting over at the end), then deletes up to as many batches of expired keys;
/// returns how many were deleted.
pub(crate) fn sweep<C: Statements>(
    c: &mut C,
    cursor: &mut SweepCursor,
    window: Duration,
) -> QueryResult<usize> {
    for _ in 0..PRUNE_ROUNDS {
        if !stamp_page(c, cursor)? {
            break;
        }
    }
    expire(c, window, PRUNE_ROUNDS)
}

/// Stamps one page of keys; whether more follow (false: the cursor went back to the start).
fn stamp_page<C: Statements>(c: &mut C, cursor: &mut SweepCursor) -> QueryResult<bool> {
    let page_size = crate::sql::to_i64(ID_CHUNK);
    let page = c.unsettled_idempotency_keys(cursor.0, page_size)?;
    if !page.is_empty() {
        c.settle_idempotency_keys(&page)?;
    }
    match page.last() {
        Some(&last) if page.len() == ID_CHUNK => {
            cursor.0 = last;
            Ok(true)
        }
        _ => {
            cursor.0 = 0;
            Ok(false)
        }
    }
}

/// Deletes expired keys in batches, at most `rounds` of them; how many.
fn expire<C: Statements>(c: &mut C, window: Duration, rounds: usize) -> QueryResult<usize> {
    let window = age_micros(window);
    delete_in_batches(c, rounds, |c, limit| {
        c.expire_idempotency_keys(window, limit)
    })
}

/// Stamps every key whose message has settled and deletes those settled more than `window`
/// ago; returns how many were deleted. The worker does this by itself, a bounded part at a
/// time; call it where no worker runs on the database (e.g. from a scheduled job).
pub fn expire_idempotency_keys<C: OutboxConnection>(
    conn: &mut C,
    window: Duration,
) -> Result<usize> {
    with_backend!(conn.backend_connection(), c => {
        let mut cursor = SweepCursor::default();
        while stamp_page(c, &mut cursor)? {}
        expire(c, window, usize::MAX)
    })
    .map_err(Error::from)
}
