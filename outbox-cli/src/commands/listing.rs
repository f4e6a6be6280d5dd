//! `outbox pending list`, `outbox dead list` and `outbox dead show`.

use std::time::SystemTime;

use outbox_diesel::admin::{self, DeadLetter, ListOptions, PendingMessage};
use outbox_diesel::OutboxConnection;
use serde_json::{json, Value};

use super::Output;
use crate::cli::ListArgs;
use crate::error::CliError;
use crate::format;
use crate::table::{self, Align, Table};

/// Characters of an error message shown in a table cell.
const ERROR_WIDTH: usize = 60;

/// The options of a listing, asking for one more row than shown to learn whether there are more.
fn list_options(args: &ListArgs) -> ListOptions {
    let options = ListOptions::new().limit(args.limit.saturating_add(1));
    match &args.message_type {
        Some(message_type) => options.message_type(message_type.clone()),
        None => options,
    }
}

/// Cuts `rows` to the limit; returns whether there were more.
fn cut_to_limit<T>(rows: &mut Vec<T>, limit: u32) -> bool {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let more = rows.len() > limit;
    rows.truncate(limit);
    more
}

/// The line under a listing that stopped at its limit.
fn more_note(limit: u32) -> String {
    format!("(only the first {limit} shown; raise --limit to see more)\n")
}

fn nothing_listed(what: &str, message_type: Option<&String>) -> String {
    match message_type {
        Some(t) => format!("no {what} of type `{t}`\n"),
        None => format!("no {what}\n"),
    }
}

pub(super) fn pending_list<C: OutboxConnection>(
    conn: &mut C,
    args: &ListArgs,
    json: bool,
) -> Result<Output, CliError> {
    let now = SystemTime::now();
    let mut messages = admin::pending_messages(conn, &list_options(args))?;
    let more = cut_to_limit(&mut messages, args.limit);
    if json {
        let messages: Vec<Value> = messages.iter().map(pending_json).collect();
        return Ok(Output::json(&json!({ "messages": messages, "more": more })));
    }
    if messages.is_empty() {
        return Ok(Output::text(nothing_listed(
            "pending messages",
            args.message_type.as_ref(),
        )));
    }
    let mut table = Table::new(&[
        ("POSITION", Align::Right),
        ("MESSAGE ID", Align::Left),
        ("TYPE", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("IN FLIGHT", Align::Left),
        ("DUE", Align::Left),
        ("ORDERING KEY", Align::Left),
        ("LAST ERROR", Align::Left),
    ]);
    for m in &messages {
        table.row(vec![
            m.position.to_string(),
            m.message_id.to_string(),
            m.message_type.clone(),
            m.attempts.to_string(),
            if m.in_flight { "yes" } else { "no" }.to_owned(),
            format::relative(m.next_attempt_at, now),
            m.ordering_key.clone().unwrap_or_else(|| "-".to_owned()),
            m.last_error
                .as_deref()
                .map_or_else(|| "-".to_owned(), |e| table::truncate(e, ERROR_WIDTH)),
        ]);
    }
    let mut text = table.render();
    if more {
        text.push_str(&more_note(args.limit));
    }
    Ok(Output::text(text))
}

fn pending_json(m: &PendingMessage) -> Value {
    json!({
        "position": m.position,
        "message_id": m.message_id.to_string(),
        "message_type": m.message_type,
        "attempts": m.attempts,
        "in_flight": m.in_flight,
        "created_at": format::timestamp_micros(m.created_at),
        "next_attempt_at": format::timestamp_micros(m.next_attempt_at),
        "ordering_key": m.ordering_key,
        "last_error": m.last_error,
        "payload": format::payload_json(&m.payload),
    })
}

pub(super) fn dead_list<C: OutboxConnection>(
    conn: &mut C,
    args: &ListArgs,
    json: bool,
) -> Result<Output, CliError> {
    let mut letters = admin::dead_letters(conn, &list_options(args))?;
    let more = cut_to_limit(&mut letters, args.limit);
    if json {
        let letters: Vec<Value> = letters.iter().map(dead_json).collect();
        return Ok(Output::json(
            &json!({ "dead_letters": letters, "more": more }),
        ));
    }
    if letters.is_empty() {
        return Ok(Output::text(nothing_listed(
            "dead letters",
            args.message_type.as_ref(),
        )));
    }
    let mut text = dead_table(&letters);
    if more {
        text.push_str(&more_note(args.limit));
    }
    Ok(Output::text(text))
}

pub(super) fn dead_table(letters: &[DeadLetter]) -> String {
    let mut table = Table::new(&[
        ("POSITION", Align::Right),
        ("MESSAGE ID", Align::Left),
        ("TYPE", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("FAILED AT", Align::Left),
        ("LAST ERROR", Align::Left),
    ]);
    for d in letters {
        table.row(vec![
            d.position.to_string(),
            d.message_id.to_string(),
            d.message_type.clone(),
            d.attempts.to_string(),
            format::timestamp(d.failed_at),
            table::truncate(&d.last_error, ERROR_WIDTH),
        ]);
    }
    table.render()
}

fn dead_json(d: &DeadLetter) -> Value {
    json!({
        "position": d.position,
        "message_id": d.message_id.to_string(),
        "message_type": d.message_type,
        "attempts": d.attempts,
        "ordering_key": d.ordering_key,
        "last_error": d.last_error,
        "created_at": format::timestamp_micros(d.created_at),
        "failed_at": format::timestamp_micros(d.failed_at),
        "payload": format::payload_json(&d.payload),
    })
}

pub(super) fn dead_show<C: OutboxConnection>(
    conn: &mut C,
    position: i64,
    json: bool,
) -> Result<Output, CliError> {
    let Some(d) = admin::dead_letter(conn, position)? else {
        return Err(CliError::UnknownPositions(vec![position]));
    };
    if json {
        return Ok(Output::json(&dead_json(&d)));
    }
    let now = SystemTime::now();
    let when = |t: SystemTime| format!("{} ({})", format::timestamp(t), format::relative(t, now));
    let fields = [
        ("position", d.position.to_string()),
        ("message id", d.message_id.to_string()),
        ("type", d.message_type.clone()),
        ("attempts", d.attempts.to_string()),
        (
            "ordering key",
            d.ordering_key.clone().unwrap_or_else(|| "-".to_owned()),
        ),
        ("created at", when(d.created_at)),
        ("failed at", when(d.failed_at)),
        ("last error", d.last_error.clone()),
    ];
    let label_width = fields.iter().map(|(l, _)| l.len()).max().unwrap_or(0) + 2;
    let mut text = String::new();
    for (label, value) in fields {
        // Continuation lines of a multi-line value sit under its first line.
        let value = table::visible(&value).replace('\n', &format!("\n{}", " ".repeat(label_width)));
        text.push_str(&format!("{label:<label_width$}{value}\n"));
    }
    text.push_str("payload:\n");
    text.push_str(&table::visible(&format::payload_pretty(&d.payload)));
    text.push('\n');
    Ok(Output::text(text))
}
