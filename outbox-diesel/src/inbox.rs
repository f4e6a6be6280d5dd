//! The receiving side: verify a webhook and do its work at most once, in one transaction.
//!
//! Delivery is at least once, so a receiver sees the same webhook again after a sender's crash
//! or a lost answer. [`Inbox::receive`] verifies the Standard Webhooks signature, then, inside
//! the receiver's own transaction, records the `webhook-id` in the `outbox_inbox` table and runs
//! the receiver's work. A duplicate finds its id already recorded and is skipped; if the work
//! fails, the transaction rolls back, the id with it, and the sender's retry runs the work again.
//!
//! Keep ids at least as long as a sender may retry: with this library's default
//! [`RetryPolicy`](crate::RetryPolicy) that is about 15 hours after the first attempt, plus the
//! time a message may wait before its first attempt. [`sweep_inbox`] with seven days is a
//! comfortable margin.
//!
//! ```
//! # use diesel::prelude::*;
//! use std::time::Duration;
//!
//! use outbox_diesel::inbox::{Inbox, Received};
//! use outbox_diesel::webhook::{WebhookSecret, DEFAULT_TOLERANCE};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut conn = SqliteConnection::establish(":memory:")?;
//! # outbox_diesel::run_migrations(&mut conn)?;
//! let secret = WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
//! let inbox = Inbox::new([secret.clone()]).tolerance(DEFAULT_TOLERANCE);
//!
//! // What a sender would POST.
//! let body = br#"{"id":"m1","type":"comment.thankYou","data":{"member_id":7}}"#;
//! let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
//! let signature = secret.sign("m1", now, body);
//! let headers = [
//!     ("webhook-id", "m1".to_string()),
//!     ("webhook-timestamp", now.to_string()),
//!     ("webhook-signature", signature),
//! ];
//!
//! let first = inbox.receive(&mut conn, &headers, body, |_conn, webhook| {
//!     // The receiver's own database work goes here, in the same transaction.
//!     Ok::<_, diesel::result::Error>(webhook.id.clone())
//! })?;
//! assert!(matches!(first, Received::Processed(ref id) if id == "m1"));
//!
//! let again = inbox.receive(&mut conn, &headers, body, |_conn, _| Ok::<_, diesel::result::Error>(String::new()))?;
//! assert!(matches!(again, Received::Duplicate { .. }));
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use diesel::Connection;
use outbox_webhook::{verify, VerifiedWebhook, VerifyError, WebhookHeaders, WebhookSecret};

use crate::connection::{with_backend, OutboxConnection};
use crate::enqueue::MAX_KEY_LEN;
use crate::error::Result;
use crate::sql::Statements;

/// Verifies webhooks and records their ids; see the [module documentation](self).
#[derive(Clone)]
pub struct Inbox {
    secrets: Vec<WebhookSecret>,
    tolerance: Duration,
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("secrets", &self.secrets.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

/// What became of a received webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received<T> {
    /// First delivery: the work ran and committed with the recorded id.
    Processed(T),
    /// This id was received before; the work did not run. Answer 2xx so the sender stops.
    Duplicate {
        /// The webhook's id.
        id: String,
    },
}

/// Why a webhook was not received.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError<E> {
    /// The signature, timestamp or headers are wrong: answer 401 (or 400), do no work.
    #[error("webhook rejected: {0}")]
    Verify(#[from] VerifyError),
    /// The `webhook-id` is longer than the inbox stores (255 bytes).
    #[error("webhook id is {0} bytes long; the inbox stores at most 255")]
    IdTooLong(usize),
    /// Recording the id failed: answer 5xx so the sender retries.
    #[error("recording the webhook id failed: {0}")]
    Database(#[source] diesel::result::Error),
    /// The receiver's work failed and everything rolled back: answer 5xx so the sender retries.
    #[error("processing the webhook failed: {0}")]
    Work(#[source] E),
}

impl<E> From<diesel::result::Error> for InboxError<E> {
    fn from(error: diesel::result::Error) -> Self {
        InboxError::Database(error)
    }
}

impl Inbox {
    /// An inbox accepting webhooks signed with any of `secrets`, timestamps within five minutes.
    pub fn new(secrets: impl IntoIterator<Item = WebhookSecret>) -> Self {
        Inbox {
            secrets: secrets.into_iter().collect(),
            tolerance: outbox_webhook::DEFAULT_TOLERANCE,
        }
    }

    /// How far a webhook's timestamp may be from now (replay protection).
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Verifies the webhook, then in one transaction records its id and runs `work`, unless the
    /// id was recorded before. `body` must be the raw body as received.
    pub fn receive<C, T, E>(
        &self,
        conn: &mut C,
        headers: &(impl WebhookHeaders + ?Sized),
        body: &[u8],
        work: impl FnOnce(&mut C, &VerifiedWebhook) -> Result<T, E>,
    ) -> Result<Received<T>, InboxError<E>>
    where
        C: OutboxConnection + Connection,
    {
        let webhook = verify(&self.secrets, headers, body, self.tolerance)?;
        if webhook.id.len() > MAX_KEY_LEN {
            return Err(InboxError::IdTooLong(webhook.id.len()));
        }
        conn.transaction(|conn| {
            if !record(conn, &webhook.id)? {
                log::info!("inbox: webhook {} received again; skipped", webhook.id);
                return Ok(Received::Duplicate {
                    id: webhook.id.clone(),
                });
            }
            work(conn, &webhook)
                .map(Received::Processed)
                .map_err(InboxError::Work)
        })
    }
}

/// Inserts the id unless present; whether it was new. A concurrent duplicate waits on the
/// primary key until the first commits, then finds it.
fn record<C: OutboxConnection>(conn: &mut C, id: &str) -> diesel::QueryResult<bool> {
    with_backend!(conn.backend_connection(), c => c.inbox_record(id))
}

/// Deletes inbox ids received more than `older_than` ago; returns how many. Run it now and then
/// with a retention longer than any sender's retry horizon (see the module documentation).
pub fn sweep_inbox<C: OutboxConnection>(conn: &mut C, older_than: Duration) -> Result<usize> {
    let micros = crate::sql::age_micros(older_than);
    Ok(with_backend!(conn.backend_connection(), c => {
        crate::sql::delete_in_batches(c, usize::MAX, |c, limit| c.inbox_sweep(micros, limit))
    })?)
}
