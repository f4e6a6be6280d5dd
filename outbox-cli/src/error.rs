//! What can go wrong, each said in one line.

/// An error that ends the command with exit code 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An SQLite path that names no file, for a command that only reads or changes the outbox.
    #[error("no SQLite database at `{0}` (`outbox migrate` creates it)")]
    NoSqliteFile(String),

    /// An outbox table does not exist.
    #[error("the outbox table `{0}` does not exist; run `outbox migrate` first")]
    MissingSchema(&'static str),

    /// No dead letter at these positions.
    #[error("no dead letter at {}", positions(.0))]
    UnknownPositions(Vec<i64>),

    /// No message with this id in the outbox or the dead letters.
    #[error(
        "no message {0} in the outbox or the dead letters (delivered, purged, or never enqueued)"
    )]
    UnknownMessage(outbox_diesel::MessageId),

    /// No worker has reported a destination of this name.
    #[error(
        "no destination named `{}` has been reported by a worker (`outbox destinations` lists \
         those that have)",
        crate::table::one_line(.0)
    )]
    UnknownDestination(String),

    /// No subscription of this id.
    #[error("no subscription {} (`outbox subscription list` lists them)", crate::table::one_line(.0))]
    UnknownSubscription(String),

    /// Metadata that is not JSON.
    #[error("--metadata is not JSON: {0}")]
    Metadata(String),

    /// `outbox resume` of something that is not paused.
    #[error("{0} is not paused (`outbox paused` lists what is)")]
    NotPaused(String),

    /// The operator did not confirm a purge.
    #[error("aborted: nothing was purged")]
    Aborted,

    /// The outbox library failed.
    #[error("{0}")]
    Outbox(outbox_diesel::Error),

    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Io(#[from] std::io::Error),
}

/// `position 4` or `positions 3, 4`
fn positions(positions: &[i64]) -> String {
    match positions {
        [one] => format!("position {one}"),
        many => format!("positions {}", list(many)),
    }
}

/// `1, 2, 5`
pub fn list(positions: &[i64]) -> String {
    positions
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl From<outbox_diesel::Error> for CliError {
    fn from(error: outbox_diesel::Error) -> Self {
        match error {
            outbox_diesel::Error::SchemaMissing { table, .. } => CliError::MissingSchema(table),
            error => CliError::Outbox(error),
        }
    }
}
