//! `outbox attempts`: the delivery log, newest first.

use std::time::SystemTime;

use outbox_diesel::delivery_log::{self, AttemptFilter};
use outbox_diesel::OutboxConnection;
use serde_json::json;

use super::Output;
use crate::cli::AttemptsArgs;
use crate::error::CliError;
use crate::format;
use crate::table::{self, Align, Table};

/// Characters of a destination, answer or error shown in a table cell.
const DETAIL_WIDTH: usize = 60;

pub(super) fn list<C: OutboxConnection>(
    conn: &mut C,
    args: &AttemptsArgs,
    json: bool,
) -> Result<Output, CliError> {
    let filter = AttemptFilter {
        message_id: args.message_id,
        destination: args.destination.clone(),
        subscription_id: args.subscription.clone(),
        message_type: args.message_type.clone(),
        failures_only: args.failures,
        since: args.since,
        until: args.until,
        before: args.before,
        limit: args.limit,
    };
    let attempts = delivery_log::attempts(conn, &filter)?;
    if json {
        return Ok(Output::json(&json!({ "attempts": attempts })));
    }
    if attempts.is_empty() {
        return Ok(Output::text(
            "no attempts logged that match (the log keeps each exchange with a destination \
             for 7 days by default; a store may keep failures only, or none)\n"
                .to_owned(),
        ));
    }
    let now = SystemTime::now();
    let mut table = Table::new(&[
        ("ID", Align::Right),
        ("STARTED", Align::Left),
        ("MESSAGE", Align::Left),
        ("TYPE", Align::Left),
        ("DESTINATION", Align::Left),
        ("ATTEMPT", Align::Right),
        ("OUTCOME", Align::Left),
        ("STATUS", Align::Right),
        ("MS", Align::Right),
        ("ANSWER OR ERROR", Align::Left),
    ]);
    for a in &attempts {
        let detail = match (&a.error, &a.answer) {
            (Some(error), _) => error.as_str(),
            (None, Some(answer)) => answer.as_str(),
            (None, None) => "-",
        };
        table.row(vec![
            a.id.to_string(),
            format::relative(a.started_at, now),
            a.message_id.to_string(),
            table::truncate(&a.message_type, DETAIL_WIDTH),
            table::truncate(&a.destination, DETAIL_WIDTH),
            a.attempt.to_string(),
            a.outcome.clone(),
            a.status.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            format!("{:.0}", a.latency_ms),
            table::truncate(detail, DETAIL_WIDTH),
        ]);
    }
    let mut text = table.render();
    if let Some(last) = attempts.last() {
        if attempts.len() == args.limit as usize {
            text.push_str(&format!("(older: --before {})\n", last.id));
        }
    }
    Ok(Output::text(text))
}
