//! `outbox pending list`, `outbox dead list`, `outbox dead show`, `outbox show` and
//! `outbox blocked`.

use std::time::SystemTime;

use outbox_diesel::admin::{self, DeadLetter, FoundMessage, ListOptions, PendingMessage};
use outbox_diesel::{Headers, MessageId, OutboxConnection};
use serde_json::json;

use super::output::Output;
use crate::cli::ListArgs;
use crate::error::CliError;
use crate::format;
use crate::table::{self, Align, Table};

/// Characters of an error message shown in a table cell.
const ERROR_WIDTH: usize = 60;

/// The options of a listing, asking for one more row than shown to learn whether there are
/// more, and for payload previews only where they are shown (in JSON; the tables show none).
fn list_options(args: &ListArgs, json: bool) -> ListOptions {
    let preview = if json { admin::PREVIEW_CHARS } else { 0 };
    let options = ListOptions::new()
        .limit(args.limit.saturating_add(1))
        .payload_preview(preview);
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
    let mut messages = admin::pending_messages(conn, &list_options(args, json))?;
    let more = cut_to_limit(&mut messages, args.limit);
    if json {
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
            if m.paused {
                "when resumed".to_owned()
            } else {
                format::relative(m.next_attempt_at, now)
            },
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

pub(super) fn dead_list<C: OutboxConnection>(
    conn: &mut C,
    args: &ListArgs,
    json: bool,
) -> Result<Output, CliError> {
    let mut letters = admin::dead_letters(conn, &list_options(args, json))?;
    let more = cut_to_limit(&mut letters, args.limit);
    if json {
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

pub(super) fn dead_show<C: OutboxConnection>(
    conn: &mut C,
    position: i64,
    json: bool,
) -> Result<Output, CliError> {
    let Some(d) = admin::dead_letter(conn, position)? else {
        return Err(CliError::UnknownPositions(vec![position]));
    };
    if json {
        return Ok(Output::json(&json!(d)));
    }
    Ok(Output::text(dead_fields(&d)))
}

/// Every field of a dead letter, one per line, then its payload.
fn dead_fields(d: &DeadLetter) -> String {
    let now = SystemTime::now();
    let fields = vec![
        ("position", d.position.to_string()),
        ("message id", d.message_id.to_string()),
        ("type", d.message_type.clone()),
        ("attempts", d.attempts.to_string()),
        ("ordering key", or_dash(d.ordering_key.as_deref())),
        ("created at", when(d.created_at, now)),
        ("failed at", when(d.failed_at, now)),
        ("last error", d.last_error.clone()),
    ];
    fields_text(fields, &d.headers, &d.payload)
}

/// Every field of a pending message, one per line, then its payload.
fn pending_fields(m: &PendingMessage) -> String {
    let now = SystemTime::now();
    let state = if m.in_flight {
        "in flight (a worker holds it)"
    } else if m.paused {
        "paused by an operator (its type or destination): due when resumed"
    } else if m.parked {
        "waiting behind an earlier message of its ordering key"
    } else {
        "waiting"
    };
    let fields = vec![
        ("position", m.position.to_string()),
        ("message id", m.message_id.to_string()),
        ("type", m.message_type.clone()),
        ("state", state.to_owned()),
        ("priority", m.priority.as_str().to_owned()),
        ("group", or_dash(m.group.as_deref())),
        ("attempts", m.attempts.to_string()),
        ("ordering key", or_dash(m.ordering_key.as_deref())),
        ("created at", when(m.created_at, now)),
        (
            "due",
            if m.paused {
                "when resumed".to_owned()
            } else {
                when(m.next_attempt_at, now)
            },
        ),
        ("last error", or_dash(m.last_error.as_deref())),
    ];
    fields_text(fields, &m.headers, &m.payload)
}

fn or_dash(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}

fn when(time: SystemTime, now: SystemTime) -> String {
    format!(
        "{} ({})",
        format::timestamp(time),
        format::relative(time, now)
    )
}

/// Labelled fields, then the headers and the payload, every value escaped for the terminal.
fn fields_text(mut fields: Vec<(&str, String)>, headers: &Headers, payload: &str) -> String {
    let header_lines: Vec<String> = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}"))
        .collect();
    let headers = if header_lines.is_empty() {
        "-".to_owned()
    } else {
        header_lines.join("\n")
    };
    fields.push(("headers", headers));
    let label_width = fields.iter().map(|(l, _)| l.len()).max().unwrap_or(0) + 2;
    let mut text = String::new();
    for (label, value) in fields {
        // Continuation lines of a multi-line value sit under its first line.
        let value = table::visible(&value).replace('\n', &format!("\n{}", " ".repeat(label_width)));
        text.push_str(&format!("{label:<label_width$}{value}\n"));
    }
    text.push_str("payload:\n");
    text.push_str(&table::visible(&format::payload_pretty(payload)));
    text.push('\n');
    text
}

pub(super) fn show<C: OutboxConnection>(
    conn: &mut C,
    message_id: MessageId,
    json: bool,
) -> Result<Output, CliError> {
    let Some(found) = admin::find_message(conn, message_id)? else {
        return Err(CliError::UnknownMessage(message_id));
    };
    Ok(match (found, json) {
        (FoundMessage::Pending(m), true) => Output::json(&json!({
            "state": "pending",
            "message": m,
        })),
        (FoundMessage::Dead(d), true) => Output::json(&json!({
            "state": "dead",
            "message": d,
        })),
        (FoundMessage::Pending(m), false) => {
            Output::text(format!("pending in the outbox\n{}", pending_fields(&m)))
        }
        (FoundMessage::Dead(d), false) => {
            Output::text(format!("dead-lettered\n{}", dead_fields(&d)))
        }
    })
}

pub(super) fn blocked<C: OutboxConnection>(
    conn: &mut C,
    limit: u32,
    json: bool,
) -> Result<Output, CliError> {
    let mut keys = admin::blocked_keys(conn, limit.saturating_add(1))?;
    let more = cut_to_limit(&mut keys, limit);
    if json {
        return Ok(Output::json(&json!({ "blocked_keys": keys, "more": more })));
    }
    if keys.is_empty() {
        return Ok(Output::text("no blocked ordering keys\n".to_owned()));
    }
    let now = SystemTime::now();
    let mut table = Table::new(&[
        ("ORDERING KEY", Align::Left),
        ("WAITING", Align::Right),
        ("HEAD", Align::Right),
        ("TYPE", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("NEXT ATTEMPT", Align::Left),
        ("LAST ERROR", Align::Left),
    ]);
    for k in &keys {
        table.row(vec![
            k.ordering_key.clone(),
            k.waiting.to_string(),
            k.position.to_string(),
            k.message_type.clone(),
            k.attempts.to_string(),
            format::relative(k.next_attempt_at, now),
            table::truncate(&k.last_error, ERROR_WIDTH),
        ]);
    }
    let mut text = table.render();
    if more {
        text.push_str(&more_note(limit));
    }
    Ok(Output::text(text))
}
