//! [`Error`]: what went wrong in an outbox operation, and what to do about it.

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

    /// An idempotency key is empty or contains U+0000.
    #[error(
        "the idempotency key is empty or contains the character U+0000 (NUL); use 1 to 255 \
         bytes of text without NUL"
    )]
    InvalidIdempotencyKey,

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

    /// A header set with `EnqueueOptions::header` cannot be carried; nothing was written.
    #[error("the message's headers were refused: {0}")]
    Header(#[from] outbox_core::HeaderError),

    /// The message's `not_before` (or `delay`) lies past the end of year 9999, which not every
    /// backend can store.
    #[error(
        "the message's not_before time is past the end of year 9999 (or its delay overflows the \
         clock); the outbox stores times up to 9999-12-31"
    )]
    NotBeforeOutOfRange,

    /// The database refused or failed a statement. Inside a transaction, roll back (return the
    /// error from the closure): PostgreSQL rejects every further statement of a failed one.
    #[error("database error: {0}")]
    Database(#[source] diesel::result::Error),

    /// An outbox table does not exist in this database: the outbox migrations have not run.
    #[error(
        "the outbox table `{table}` does not exist; run outbox_diesel::run_migrations (or \
         `outbox migrate`) on this database first"
    )]
    SchemaMissing {
        /// The missing table.
        table: &'static str,
        /// What the database said.
        #[source]
        source: diesel::result::Error,
    },

    /// An outbox table lacks a column a later migration adds: the database's outbox schema is
    /// older than this library.
    #[error(
        "the outbox tables have no column `{column}`: their schema is older than this library; \
         run outbox_diesel::run_migrations (or `outbox migrate`) on this database"
    )]
    SchemaOutOfDate {
        /// The missing column.
        column: &'static str,
        /// What the database said.
        #[source]
        source: diesel::result::Error,
    },

    /// An ordering key that is empty or holds control characters (a line break, a tab, a
    /// NUL): it travels as a header on brokers, where such characters cannot go.
    #[error(
        "an ordering key must not be empty or hold control characters (line breaks, tabs, NUL); \
         use printable text such as `order-42`"
    )]
    InvalidOrderingKey,

    /// A group that is empty or holds control characters.
    #[error(
        "a group must not be empty or hold control characters (line breaks, tabs, NUL); use \
         printable text such as `tenant-42`"
    )]
    InvalidGroup,

    /// An owner that is empty or holds control characters.
    #[error(
        "an owner must not be empty or hold control characters (line breaks, tabs, NUL); use \
         printable text such as `customer-42`"
    )]
    InvalidOwner,

    /// A subscription that cannot be created as given.
    #[error("the subscription cannot be created: {reason}")]
    InvalidSubscription {
        /// Why.
        reason: String,
    },

    /// A cancel that names no message, type or subscription (it would cancel every pending
    /// message), or gives no reason (it would leave no record of why).
    #[error("nothing was cancelled: {reason}")]
    InvalidCancel {
        /// Why.
        reason: String,
    },

    /// A replay or a resend names a range that ends before it starts, a destination no worker
    /// has, a subscription that does not exist, or a message the archive does not have.
    #[error("nothing was replayed: {reason}")]
    InvalidReplay {
        /// Why.
        reason: String,
    },

    /// A subscription's stored secret cannot be read with the keys given.
    #[error(
        "a subscription's secret cannot be read: {reason}; give every key its secrets were \
         encrypted with (`Subscriptions::secret_key`)"
    )]
    SecretKey {
        /// Why.
        reason: String,
    },

    /// The system's random number source failed, so no secret could be made.
    #[error("the system's random number source failed: {0}")]
    Random(String),

    /// A message type or destination name to pause or resume that is empty, longer than 255
    /// characters or holds control characters: no message type or destination is named so.
    #[error(
        "cannot pause or resume `{name}`: a message type or destination name is 1 to 255 \
         characters without control characters (copy it from `outbox stats` or `outbox \
         destinations`)"
    )]
    InvalidPauseName {
        /// The name given (its first 80 characters).
        name: String,
    },

    /// The database URL's scheme names no backend the outbox supports.
    #[error(
        "unsupported database URL `{0}`: use postgres://, postgresql://, mysql://, sqlite://PATH, \
         file:PATH or a plain SQLite path"
    )]
    UnsupportedUrl(String),

    /// The text is a keyword/value connection string (`host=… dbname=…`), not a URL. Not
    /// shown: it may hold a password.
    #[error(
        "the database URL is a keyword/value connection string (host=… dbname=…), which the \
         outbox does not read (and would otherwise take for an SQLite file name); give a URL \
         such as postgres://user:password@host:5432/dbname"
    )]
    KeywordConnectionString,

    /// A backend name that is not `postgres`, `mysql` or `sqlite`.
    #[error("unknown backend `{0}`: use postgres, mysql or sqlite")]
    UnknownBackend(String),

    /// The URL names a backend the connection type (or this build) has no driver for.
    #[error(
        "the URL names {backend}, which `{connection}` cannot open; build outbox-diesel with \
         the `{backend}` feature (and add a {backend} variant to a MultiConnection enum)"
    )]
    BackendNotCompiledIn {
        /// The URL's backend.
        backend: crate::Backend,
        /// The connection type asked to open it.
        connection: &'static str,
    },

    /// The database could not be reached or refused the connection. The message never holds
    /// the URL's password.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL, without its password.
        url: String,
        /// What the driver said, without the URL's password.
        reason: String,
    },

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
}

/// The outbox's tables, as a missing-table error names them. The later tables come first: a
/// message naming one of them may quote a statement that names `outbox_message` too.
const OUTBOX_TABLES: [&str; 6] = [
    "outbox_cancelled",
    "outbox_subscription",
    "outbox_message",
    "outbox_failure",
    "outbox_inbox",
    "outbox_idempotency",
];

impl From<diesel::result::Error> for Error {
    fn from(error: diesel::result::Error) -> Self {
        if let Some(column) = missing_outbox_column(&error) {
            return Error::SchemaOutOfDate {
                column,
                source: error,
            };
        }
        match missing_outbox_table(&error) {
            Some(table) => Error::SchemaMissing {
                table,
                source: error,
            },
            None => Error::Database(error),
        }
    }
}

/// Columns that migrations after the first add to the outbox tables.
const LATER_COLUMNS: [&str; 7] = [
    "headers",
    "parked",
    "payload_bytes",
    "leased_until",
    "resumed_at",
    "owner",
    "subscription_id",
];

/// Which later outbox column a database error says does not exist: PostgreSQL `column
/// "headers" of relation "outbox_message" does not exist`, MySQL and MariaDB `Unknown column
/// 'headers' in 'field list'`, SQLite `table outbox_message has no column named headers` or
/// `no such column: headers`.
fn missing_outbox_column(error: &diesel::result::Error) -> Option<&'static str> {
    let diesel::result::Error::DatabaseError(_, info) = error else {
        return None;
    };
    let message = info.message().to_ascii_lowercase();
    LATER_COLUMNS.into_iter().find(|column| {
        (message.contains(&format!("column \"{column}\"")) && message.contains("does not exist"))
            || message.contains(&format!("unknown column '{column}'"))
            || message.contains(&format!("no column named {column}"))
            || message.contains(&format!("no such column: {column}"))
    })
}

/// Which outbox table a database error says does not exist. The backends report it only in
/// words (Diesel has no kind for it): PostgreSQL `relation "outbox_message" does not exist`,
/// MySQL and MariaDB `Table 'db.outbox_message' doesn't exist`, SQLite `no such table:
/// outbox_message`.
pub(crate) fn missing_outbox_table(error: &diesel::result::Error) -> Option<&'static str> {
    let diesel::result::Error::DatabaseError(_, info) = error else {
        return None;
    };
    let message = info.message().to_ascii_lowercase();
    let missing = message.contains("does not exist")
        || message.contains("doesn't exist")
        || message.contains("no such table");
    if !missing {
        return None;
    }
    OUTBOX_TABLES
        .into_iter()
        .find(|table| message.contains(table))
}
