//! `outbox pause`, `outbox resume` and `outbox paused`: an operator stops and restarts the
//! processing of a message type, or the deliveries to a destination, on every worker.

use std::time::SystemTime;

use outbox_diesel::admin::{self, PauseKind};
use outbox_diesel::OutboxConnection;
use serde_json::json;

use super::output::Output;
use crate::cli::PauseTarget;
use crate::error::CliError;
use crate::format;
use crate::table::{self, Align, Table};

/// Characters of a reason shown in a table cell.
const REASON_WIDTH: usize = 60;

fn target(target: &PauseTarget) -> (PauseKind, &str) {
    match (&target.destination, &target.message_type) {
        (Some(name), _) => (PauseKind::Destination, name),
        (None, Some(message_type)) => (PauseKind::MessageType, message_type),
        // clap requires one of the two.
        (None, None) => (PauseKind::MessageType, ""),
    }
}

/// "message type `x`" or "destination `x`", for messages.
fn described(kind: PauseKind, name: &str) -> String {
    let what = match kind {
        PauseKind::Destination => "destination",
        _ => "message type",
    };
    format!("{what} {}", table::one_line(name))
}

/// The `outbox resume` arguments that end a pause of `name`.
fn resume_args(kind: PauseKind, name: &str) -> String {
    match kind {
        PauseKind::Destination => format!("--destination {}", table::one_line(name)),
        _ => table::one_line(name),
    }
}

pub(super) fn pause<C: OutboxConnection>(
    conn: &mut C,
    pause: &PauseTarget,
    reason: &str,
    json: bool,
) -> Result<Output, CliError> {
    let (kind, name) = target(pause);
    let new = admin::pause(conn, kind, name, reason)?;
    if json {
        return Ok(Output::json(&json!({
            "paused": { "kind": kind.as_str(), "name": name },
            "already_paused": !new,
        })));
    }
    let what = described(kind, name);
    if !new {
        return Ok(Output::text(format!(
            "{what} was paused already (`outbox paused` says since when and why)\n"
        )));
    }
    Ok(Output::text(format!(
        "paused {what}: within a few seconds no worker processes its messages; they stay \
         pending, spending no attempt, until `outbox resume {}`\n",
        resume_args(kind, name)
    )))
}

pub(super) fn resume<C: OutboxConnection>(
    conn: &mut C,
    pause: &PauseTarget,
    json: bool,
) -> Result<Output, CliError> {
    let (kind, name) = target(pause);
    let Some(released) = admin::resume(conn, kind, name)? else {
        return Err(CliError::NotPaused(described(kind, name)));
    };
    if json {
        return Ok(Output::json(&json!({
            "resumed": { "kind": kind.as_str(), "name": name },
            "released": released,
        })));
    }
    Ok(Output::text(format!(
        "resumed {}: {released} paused messages are due again, and every worker follows within \
         a few seconds\n",
        described(kind, name)
    )))
}

pub(super) fn list<C: OutboxConnection>(conn: &mut C, json: bool) -> Result<Output, CliError> {
    let pauses = admin::pauses(conn)?;
    if json {
        return Ok(Output::json(&json!({ "paused": pauses })));
    }
    if pauses.is_empty() {
        return Ok(Output::text("nothing is paused\n".to_owned()));
    }
    let now = SystemTime::now();
    let mut table = Table::new(&[
        ("KIND", Align::Left),
        ("NAME", Align::Left),
        ("SINCE", Align::Left),
        ("REASON", Align::Left),
    ]);
    for pause in &pauses {
        table.row(vec![
            pause.kind.as_str().to_owned(),
            table::truncate(&pause.name, REASON_WIDTH),
            format::relative(pause.paused_at, now),
            table::truncate(&pause.reason, REASON_WIDTH),
        ]);
    }
    Ok(Output::text(table.render()))
}
