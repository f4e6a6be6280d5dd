use std::fmt;
use std::time::Duration;

use crate::message::MessageId;

/// Identifies one claim: the worker that made it writes it into the rows it leases, and every
/// later change to those rows is conditioned on it (fencing). A worker whose lease expired and
/// whose rows were claimed again by another cannot touch them any more.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken(uuid::Uuid);

impl ClaimToken {
    /// A new, unique token.
    pub fn new() -> Self {
        ClaimToken(uuid::Uuid::new_v4())
    }

    /// The token as a UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimToken({})", self.0)
    }
}

impl fmt::Display for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A message leased to this worker.
#[derive(Debug, Clone)]
pub struct ClaimedMessage {
    /// The row's position in the outbox (its auto-increment id).
    pub position: i64,
    /// The message's stable id.
    pub message_id: MessageId,
    /// The message's type string.
    pub message_type: String,
    /// The message's JSON payload.
    pub payload: String,
    /// The message's ordering key.
    pub ordering_key: Option<String>,
    /// Which attempt this claim starts, from 1.
    pub attempt: u32,
}

/// What became of a claimed message.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// Processed: remove it from the outbox.
    Done,
    /// Failed, worth another attempt after `delay`.
    Retry {
        /// How long to wait.
        delay: Duration,
        /// The failure, stored as the message's last error.
        error: String,
    },
    /// Failed for good: move it to the dead-letter table.
    DeadLetter {
        /// Why, stored with the dead letter.
        error: String,
    },
    /// Not processed (the worker is stopping, or the lease was too short to start): give it back
    /// at once, without counting the attempt.
    Release,
}

/// A settlement for one message of one claim.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The claim the message was leased under.
    pub token: ClaimToken,
    /// The message's position.
    pub position: i64,
    /// The message's id, for logs.
    pub message_id: MessageId,
    /// What to do with it.
    pub settlement: Settlement,
}

/// Where the worker's messages live. `outbox-diesel` implements it for PostgreSQL, MySQL and
/// SQLite; it is public so that other storage can be plugged in.
pub trait Store: Send + Sync + 'static {
    /// Leases up to `limit` due messages for `lease` under `token`, oldest due first, taking at
    /// most the first pending message of each ordering key.
    fn claim(
        &self,
        token: ClaimToken,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedMessage>, StoreError>;

    /// Applies `outcomes` atomically. An outcome whose row is no longer leased under its token is
    /// skipped; returns the positions of those skipped (fenced) outcomes.
    fn settle(&self, outcomes: &[Outcome]) -> Result<Vec<i64>, StoreError>;

    /// Checks, once at start-up, that the store is reachable and ready, so a wrong URL or a
    /// missing migration is an error from `spawn` rather than a log line every poll.
    fn check(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// A way to be told promptly that new messages were committed (e.g. PostgreSQL
    /// `LISTEN`), or `None` if the store can only be polled.
    fn listen(&self) -> Result<Option<Box<dyn Listener>>, StoreError> {
        Ok(None)
    }

    /// Whether enqueues in this process should wake the worker directly. Stores whose
    /// [`listen`](Store::listen) reports commits exactly return `false`: an in-process wake
    /// comes before the commit and would only cost an empty claim.
    fn wants_local_wakeups(&self) -> bool {
        true
    }
}

/// Waits for a store's notifications.
pub trait Listener: Send {
    /// Blocks for at most `timeout`; `Ok(true)` if new messages may have been committed.
    fn wait(&mut self, timeout: Duration) -> Result<bool, StoreError>;
}

/// The store failed; the worker logs it, waits, and tries again.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct StoreError {
    context: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl StoreError {
    /// Wraps `source`, saying what the store was doing.
    pub fn new(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError {
            context,
            source: source.into(),
        }
    }
}
