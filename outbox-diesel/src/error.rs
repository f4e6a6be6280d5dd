/// A `Result` whose error is the outbox's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in an outbox operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The message could not be turned into JSON, so nothing was written. The connection and its
    /// transaction are untouched: return the error to roll back, or carry on without the message.
    #[error(
        "could not serialize a `{message_type}` message to JSON: {source}; \
         make sure every field serializes (maps need string keys)"
    )]
    Serialize {
        /// The message's type string.
        message_type: &'static str,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },

    /// A string in the message holds the character U+0000, which PostgreSQL cannot store in
    /// JSON; it is refused on every backend so that code moves between them unchanged.
    #[error(
        "a `{message_type}` message contains the character U+0000 (NUL), which the outbox \
         cannot store; remove it from the message's strings"
    )]
    NulInPayload {
        /// The message's type string.
        message_type: &'static str,
    },

    /// A message type or ordering key is longer than the column that stores it.
    #[error("the {what} is {len} bytes long; the outbox stores at most 255")]
    TooLong {
        /// Which value.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },

    /// The message's JSON is larger than allowed, so nothing was written. Put large content in
    /// your own tables and send a reference, or raise `EnqueueOptions::max_payload_bytes`.
    #[error(
        "a `{message_type}` message is {len} bytes of JSON, more than the {max} allowed; send a \
         reference to large content instead, or raise EnqueueOptions::max_payload_bytes"
    )]
    PayloadTooLarge {
        /// The message's type string.
        message_type: &'static str,
        /// Its size in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// The database refused or failed a statement. Inside a transaction, roll back (return the
    /// error from the closure): PostgreSQL rejects every further statement of a failed one.
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),

    /// The outbox tables could not be created or upgraded.
    #[error("running the outbox migrations failed: {0}")]
    Migration(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// A row in an outbox table holds a value the library did not write, e.g. edited by hand.
    #[error("row {id} of {table} is invalid: {reason}")]
    InvalidRow {
        /// The table.
        table: &'static str,
        /// The row's id.
        id: i64,
        /// What is wrong with it.
        reason: String,
    },

    /// A bug in this library; please report it.
    #[error("internal error in outbox-diesel: {0}")]
    Internal(&'static str),
}
