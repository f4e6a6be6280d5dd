//! What a command prints ([`Output`]).

use serde_json::Value;

use crate::error::CliError;

/// What a command prints on stdout, and an error to report after it when the command did only
/// part of its work (e.g. some positions of a requeue did not exist).
#[derive(Debug)]
pub struct Output {
    /// The text for stdout.
    pub stdout: String,
    /// An error to report afterwards, making the exit code 1.
    pub error: Option<CliError>,
}

impl Output {
    /// Human text.
    pub(crate) fn text(stdout: String) -> Self {
        Output {
            stdout,
            error: None,
        }
    }

    /// One pretty-printed JSON document.
    pub(crate) fn json(value: &Value) -> Self {
        let mut stdout = serde_json::to_string_pretty(value).unwrap_or_default();
        stdout.push('\n');
        Output::text(stdout)
    }
}
