//! `outbox destinations` and `outbox destination enable|disable`: the destinations' health as
//! the workers report it, and an operator's say over it.

use std::time::SystemTime;

use outbox_diesel::admin;
use outbox_diesel::OutboxConnection;
use serde_json::json;

use super::output::Output;
use crate::error::CliError;
use crate::format;
use crate::table::{self, Align, Table};

/// Characters of an error or reason shown in a table cell.
const DETAIL_WIDTH: usize = 60;

pub(super) fn list<C: OutboxConnection>(conn: &mut C, json: bool) -> Result<Output, CliError> {
    let destinations = admin::destinations(conn)?;
    if json {
        return Ok(Output::json(&json!({ "destinations": destinations })));
    }
    if destinations.is_empty() {
        return Ok(Output::text(
            "no destinations reported (workers report those given to \
             WorkerBuilder::destination)\n"
                .to_owned(),
        ));
    }
    let now = SystemTime::now();
    let mut table = Table::new(&[
        ("DESTINATION", Align::Left),
        ("KIND", Align::Left),
        ("STATE", Align::Left),
        ("FAILURES", Align::Right),
        ("NEXT PROBE", Align::Left),
        ("REPORTED", Align::Left),
        ("DETAIL", Align::Left),
    ]);
    for e in &destinations {
        let detail = e.disabled_reason.as_deref().or(e.last_error.as_deref());
        table.row(vec![
            table::truncate(&e.name, DETAIL_WIDTH),
            table::truncate(&e.kind, DETAIL_WIDTH),
            table::truncate(&e.state, DETAIL_WIDTH),
            e.consecutive_failures.to_string(),
            e.next_probe_at
                .map_or_else(|| "-".to_owned(), |at| format::relative(at, now)),
            format::relative(e.reported_at, now),
            table::truncate(detail.unwrap_or("-"), DETAIL_WIDTH),
        ]);
    }
    Ok(Output::text(table.render()))
}

pub(super) fn enable<C: OutboxConnection>(
    conn: &mut C,
    name: &str,
    json: bool,
) -> Result<Output, CliError> {
    if !admin::enable_destination(conn, name)? {
        return Err(CliError::UnknownDestination(name.to_owned()));
    }
    if json {
        return Ok(Output::json(&json!({ "enabled": name })));
    }
    Ok(Output::text(format!(
        "enabled destination {}: the workers delivering to it send again within a few \
         seconds; messages dead-lettered meanwhile stay dead letters until re-queued \
         (`outbox dead requeue`)\n",
        table::one_line(name)
    )))
}

pub(super) fn disable<C: OutboxConnection>(
    conn: &mut C,
    name: &str,
    reason: &str,
    json: bool,
) -> Result<Output, CliError> {
    if !admin::disable_destination(conn, name, reason)? {
        return Err(CliError::UnknownDestination(name.to_owned()));
    }
    if json {
        return Ok(Output::json(&json!({ "disabled": name, "reason": reason })));
    }
    Ok(Output::text(format!(
        "disabled destination {}: within a few seconds the workers stop delivering to it and \
         dead-letter its messages, until `outbox destination enable`\n",
        table::one_line(name)
    )))
}
