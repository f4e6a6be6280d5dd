//! Retention: how long the outbox keeps rows it no longer delivers.
//!
//! Dead letters stay until an operator re-queues or purges them, unless the application sets
//! [`DieselStore::dead_letter_retention`](crate::DieselStore::dead_letter_retention): then the
//! worker deletes those that failed longer ago than that, oldest first. Received webhook ids
//! (the [inbox](crate::inbox)) are pruned the same way with
//! [`DieselStore::inbox_retention`](crate::DieselStore::inbox_retention). Both are off by
//! default: deleting an operator's evidence is the application's decision.
//!
//! Suggested settings: dead letters, 30 days (time to notice the alert, fix the cause and
//! re-queue); inbox ids, 7 days (longer than any sender retries: the default retry policy
//! gives up after about 15 hours).
//!
//! Every few seconds the worker deletes at most 10 batches of 1,000 rows per table, so a
//! pass stays short however much has piled up; a large backlog of expired rows goes over a few
//! passes. An index on `failed_at` (and the inbox's on `received_at`) keeps each batch from
//! reading the table. Where no worker runs, call [`prune_dead_letters`] and
//! [`sweep_inbox`](crate::inbox::sweep_inbox) from a scheduled job.
//!
//! ```
//! # use diesel::prelude::*;
//! # use diesel::r2d2::{ConnectionManager, Pool};
//! use std::time::Duration;
//!
//! use outbox_diesel::DieselStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = Pool::builder().max_size(1).build(ConnectionManager::<SqliteConnection>::new(":memory:"))?;
//! const DAY: Duration = Duration::from_secs(24 * 60 * 60);
//! let store = DieselStore::new(pool)
//!     .dead_letter_retention(30 * DAY)
//!     .inbox_retention(7 * DAY);
//! # let _ = store;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use diesel::QueryResult;
use outbox_core::store::Pruned;

use crate::connection::{with_backend, OutboxConnection};
use crate::delivery_log::{self, DeliveryLogRetention};
use crate::error::Result;
use crate::sql::delivery_log::DeliveryLogStatements;
use crate::sql::{age_micros, delete_in_batches, Statements, PRUNE_ROUNDS};

/// What a store keeps for a limited time, as the application configured it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Retention {
    pub dead_letters: Option<Duration>,
    pub inbox_ids: Option<Duration>,
    pub delivery_log: DeliveryLogRetention,
    /// How long the archive keeps a message after its enqueue (`None`: no archive).
    pub archive: Option<Duration>,
}

impl Retention {
    /// One bounded pass of the worker over the dead letters, the inbox and the delivery log (the idempotency
    /// keys are counted by their own sweep).
    pub fn prune<C: DeliveryLogStatements>(&self, c: &mut C) -> QueryResult<Pruned> {
        let mut pruned = Pruned::default();
        if let Some(age) = self.dead_letters {
            let age = age_micros(age);
            pruned.dead_letters =
                delete_in_batches(c, PRUNE_ROUNDS, |c, limit| c.prune_dead_letters(age, limit))?;
        }
        if let Some(age) = self.inbox_ids {
            let age = age_micros(age);
            pruned.inbox_ids =
                delete_in_batches(c, PRUNE_ROUNDS, |c, limit| c.inbox_sweep(age, limit))?;
        }
        pruned.logged_attempts =
            delivery_log::prune_rounds(c, self.delivery_log, delivery_log::WORKER_ROUNDS)?;
        if let Some(window) = self.archive {
            pruned.archived = delivery_log::prune_archive_rounds(c, window, PRUNE_ROUNDS)?;
        }
        Ok(pruned)
    }
}

/// Deletes every dead letter that failed more than `older_than` ago, in batches; returns how
/// many. The worker does this by itself when the store has a
/// [`dead_letter_retention`](crate::DieselStore::dead_letter_retention); call it where no
/// worker runs on the database (e.g. from a scheduled job).
pub fn prune_dead_letters<C: OutboxConnection>(
    conn: &mut C,
    older_than: Duration,
) -> Result<usize> {
    let age = age_micros(older_than);
    Ok(with_backend!(conn.backend_connection(), c => {
        delete_in_batches(c, usize::MAX, |c, limit| c.prune_dead_letters(age, limit))
    })?)
}
