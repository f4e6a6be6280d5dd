//! Exactly-once handlers for database work: the handler's writes and the removal of its message
//! commit in one transaction.
//!
//! Delivery is at least once: a worker that dies after a handler's effect but before the
//! message is settled runs the handler again. When the effect is a change in the same database
//! as the outbox (a counter, a row, the next message of a chain), [`exactly_once`] makes the
//! two one transaction: the handler's writes are made, then the message is removed (only if
//! this worker's claim still holds it), then both commit, or neither does. A crash before the commit
//! undoes both, and the next attempt does the work; after it, the message is gone. So the
//! effect happens once, whatever crashes.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel::SqliteConnection;
//! use outbox_diesel::prelude::*;
//! use outbox_diesel::{exactly_once, outbox_handler, Context, ProcessError};
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_handler("points.award")]
//! #[derive(Serialize, Deserialize)]
//! struct AwardPoints {
//!     member_id: i64,
//!     points: i64,
//! }
//!
//! #[outbox_handler("points.awarded")]
//! #[derive(Serialize, Deserialize)]
//! struct PointsAwarded {
//!     member_id: i64,
//! }
//! # impl Handler for PointsAwarded {
//! #     fn process(self, _: &mut Context<'_>) -> Result<(), ProcessError> { Ok(()) }
//! # }
//!
//! impl Handler for AwardPoints {
//!     fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
//!         // The connection type is the one of the pool given to the worker's DieselStore.
//!         exactly_once(ctx, |conn: &mut SqliteConnection| {
//!             diesel::sql_query("UPDATE members SET points = points + ? WHERE id = ?")
//!                 .bind::<diesel::sql_types::BigInt, _>(self.points)
//!                 .bind::<diesel::sql_types::BigInt, _>(self.member_id)
//!                 .execute(conn)
//!                 .map_err(ProcessError::retryable)?;
//!             // A chain: the next message commits with this one's work, or not at all.
//!             PointsAwarded { member_id: self.member_id }
//!                 .enqueue(conn)
//!                 .map_err(ProcessError::retryable)?;
//!             Ok(())
//!         })
//!     }
//! }
//! ```
//!
//! Things to know:
//! - Each call takes a connection from the worker's pool for the length of the transaction, so
//!   give the pool one connection per handler thread beside the worker's own.
//! - Keep slow calls (HTTP, brokers) out of the closure: the transaction holds the locks of
//!   what it wrote until it ends (on SQLite, the database's write lock, which every other
//!   writer, the worker included, waits for). It does not lock the message's row until its
//!   last statement, so a hung closure does not hold up the worker on PostgreSQL and MySQL:
//!   past `handler_timeout` the attempt counts as timed out, and whatever it does later rolls
//!   back when it finds its claim gone.
//! - A handler calls it once per attempt. If the handler fails after it committed, the attempt
//!   counts as succeeded anyway (the message is gone); an error returned by the closure rolls
//!   everything back and is the attempt's failure, retried or dead-lettered as usual.
//! - On PostgreSQL the transaction commits with the session's `synchronous_commit` (the worker
//!   turns it off for its own settlements only).
//! - On MySQL, concurrent handler transactions can deadlock (InnoDB's next-key locks, e.g. two
//!   chains enqueueing while their messages are removed; about one run in twelve of the test
//!   with four threads). The victim rolls back and its attempt is retried like any failure: the
//!   effect still happens once, but count on a few extra retries.

use outbox_core::{Context, ProcessError};

/// Runs `work` on the worker's connection in one transaction that also removes this message
/// from the outbox; see the [module documentation](self). `C` is the connection type of the
/// pool given to [`DieselStore`](crate::DieselStore) (a mismatch is a permanent failure that
/// names both types).
pub fn exactly_once<C, T>(
    ctx: &mut Context<'_>,
    work: impl FnOnce(&mut C) -> Result<T, ProcessError>,
) -> Result<T, ProcessError>
where
    C: 'static,
{
    let mut work = Some(work);
    let mut output = None;
    ctx.settle_within(&mut |conn: &mut C| {
        let work = work.take().ok_or_else(|| {
            ProcessError::permanent("the store ran a handler's transaction body twice")
        })?;
        output = Some(work(conn)?);
        Ok(())
    })?;
    output.ok_or_else(|| {
        ProcessError::permanent("the store committed without running the handler's work")
    })
}
