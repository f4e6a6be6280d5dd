//! The commands, written once for every backend.

use std::io::{BufRead, IsTerminal, Write};
use std::time::SystemTime;

use outbox_diesel::admin::{
    self, DeadLetter, DeadLetterSelection, ListOptions, PendingMessage, TypeStats,
};
use outbox_diesel::OutboxConnection;
use serde_json::{json, Value};

use crate::cli::{Command, DeadCommand, ListArgs, PendingCommand, Selector};
use crate::error::CliError;
use crate::format;
use crate::table::{self, Align, Table};

/// Characters of an error message shown in a table cell.
const ERROR_WIDTH: usize = 60;
/// Positions listed in human output before the rest are only counted.
const POSITIONS_SHOWN: usize = 50;
/// Positions deleted per statement by a purge.
const PURGE_CHUNK: usize = 1000;

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
    fn text(stdout: String) -> Self {
        Output {
            stdout,
            error: None,
        }
    }

    fn json(value: &Value) -> Self {
        let mut stdout = serde_json::to_string_pretty(value).unwrap_or_default();
        stdout.push('\n');
        Output::text(stdout)
    }
}

/// Runs `command` on `conn`, rendering JSON when `json`.
pub fn run<C>(conn: &mut C, command: &Command, json: bool) -> Result<Output, CliError>
where
    C: OutboxConnection + diesel::Connection,
{
    match command {
        Command::Migrate => migrate(conn, json),
        Command::Stats => stats(conn, json),
        Command::Pending(PendingCommand::List(args)) => pending_list(conn, args, json),
        Command::Dead(DeadCommand::List(args)) => dead_list(conn, args, json),
        Command::Dead(DeadCommand::Show { position }) => dead_show(conn, *position, json),
        Command::Dead(DeadCommand::Requeue { selector, dry_run }) => {
            requeue(conn, selector, *dry_run, json)
        }
        Command::Dead(DeadCommand::Purge {
            selector,
            dry_run,
            yes,
        }) => purge(conn, selector, *dry_run, *yes, json),
    }
}

fn migrate<C: OutboxConnection>(conn: &mut C, json: bool) -> Result<Output, CliError> {
    let applied = outbox_diesel::run_migrations(conn)?;
    if json {
        return Ok(Output::json(&json!({ "applied": applied })));
    }
    if applied.is_empty() {
        return Ok(Output::text(
            "the outbox schema is up to date; nothing to apply\n".to_owned(),
        ));
    }
    Ok(Output::text(
        applied
            .iter()
            .map(|version| format!("applied migration {version}\n"))
            .collect(),
    ))
}

fn stats<C: OutboxConnection>(conn: &mut C, json: bool) -> Result<Output, CliError> {
    let now = SystemTime::now();
    let types = admin::stats(conn)?;
    let total = Totals::of(&types);
    let age = |oldest: Option<SystemTime>| oldest.map(|t| format::age(t, now));
    if json {
        let types: Vec<Value> = types
            .iter()
            .map(|t| {
                json!({
                    "message_type": t.message_type,
                    "pending": t.pending,
                    "in_flight": t.in_flight,
                    "dead": t.dead,
                    "oldest_pending": t.oldest_pending.map(format::timestamp_micros),
                    "oldest_pending_age_secs": age(t.oldest_pending).map(|a| a.as_secs()),
                })
            })
            .collect();
        return Ok(Output::json(&json!({
            "types": types,
            "total": {
                "pending": total.pending,
                "in_flight": total.in_flight,
                "dead": total.dead,
                "oldest_pending": total.oldest_pending.map(format::timestamp_micros),
                "oldest_pending_age_secs": age(total.oldest_pending).map(|a| a.as_secs()),
            },
        })));
    }
    let mut table = Table::new(&[
        ("TYPE", Align::Left),
        ("PENDING", Align::Right),
        ("IN FLIGHT", Align::Right),
        ("DEAD", Align::Right),
        ("OLDEST PENDING", Align::Right),
    ]);
    let oldest = |t: Option<SystemTime>| age(t).map_or_else(|| "-".to_owned(), format::duration);
    for t in &types {
        table.row(vec![
            t.message_type.clone(),
            t.pending.to_string(),
            t.in_flight.to_string(),
            t.dead.to_string(),
            oldest(t.oldest_pending),
        ]);
    }
    table.row(vec![
        "total".to_owned(),
        total.pending.to_string(),
        total.in_flight.to_string(),
        total.dead.to_string(),
        oldest(total.oldest_pending),
    ]);
    Ok(Output::text(table.render()))
}

/// The sums over every message type.
struct Totals {
    pending: u64,
    in_flight: u64,
    dead: u64,
    oldest_pending: Option<SystemTime>,
}

impl Totals {
    fn of(types: &[TypeStats]) -> Self {
        Totals {
            pending: types.iter().map(|t| t.pending).sum(),
            in_flight: types.iter().map(|t| t.in_flight).sum(),
            dead: types.iter().map(|t| t.dead).sum(),
            oldest_pending: types.iter().filter_map(|t| t.oldest_pending).min(),
        }
    }
}

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

fn pending_list<C: OutboxConnection>(
    conn: &mut C,
    args: &ListArgs,
    json: bool,
) -> Result<Output, CliError> {
    let now = SystemTime::now();
    let mut messages = admin::pending_messages(conn, &list_options(args))?;
    let more = cut_to_limit(&mut messages, args.limit);
    if json {
        let messages: Vec<Value> = messages.iter().map(pending_json).collect();
        return Ok(Output::json(
            &json!({ "messages": messages, "more": more }),
        ));
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

fn dead_list<C: OutboxConnection>(
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

fn dead_table(letters: &[DeadLetter]) -> String {
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

fn dead_show<C: OutboxConnection>(
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
        let value = value.replace('\n', &format!("\n{}", " ".repeat(label_width)));
        text.push_str(&format!("{label:<label_width$}{value}\n"));
    }
    text.push_str("payload:\n");
    text.push_str(&format::payload_pretty(&d.payload));
    text.push('\n');
    Ok(Output::text(text))
}

/// The positions named on the command line, each once, in the order given.
fn unique_positions(positions: &[i64]) -> Vec<i64> {
    let mut seen = std::collections::HashSet::new();
    positions.iter().copied().filter(|p| seen.insert(*p)).collect()
}

fn selection(selector: &Selector) -> DeadLetterSelection {
    if selector.all {
        DeadLetterSelection::All
    } else if let Some(message_type) = &selector.message_type {
        DeadLetterSelection::MessageType(message_type.clone())
    } else {
        DeadLetterSelection::Positions(unique_positions(&selector.positions))
    }
}

/// The dead letters a selector names, and the named positions that hold none.
fn selected<C: OutboxConnection>(
    conn: &mut C,
    selection: &DeadLetterSelection,
) -> Result<(Vec<DeadLetter>, Vec<i64>), CliError> {
    let everything = ListOptions::new().limit(u32::MAX);
    match selection {
        DeadLetterSelection::All => Ok((admin::dead_letters(conn, &everything)?, Vec::new())),
        DeadLetterSelection::MessageType(t) => Ok((
            admin::dead_letters(conn, &everything.message_type(t.clone()))?,
            Vec::new(),
        )),
        DeadLetterSelection::Positions(positions) => {
            let mut found = Vec::new();
            let mut missing = Vec::new();
            for &position in positions {
                match admin::dead_letter(conn, position)? {
                    Some(d) => found.push(d),
                    None => missing.push(position),
                }
            }
            Ok((found, missing))
        }
    }
}

/// What a requeue or purge did (or, dry, would do).
struct Report<'a> {
    action: &'a str,
    done: &'a str,
    dry_run: bool,
    count: usize,
    positions: Vec<i64>,
    not_found: Vec<i64>,
    /// For a dry run: the dead letters that would be affected.
    letters: &'a [DeadLetter],
}

impl Report<'_> {
    /// The output, with the missing positions as the error that follows it. A selection of
    /// positions none of which exists is an error only.
    fn finish(self, json: bool) -> Result<Output, CliError> {
        if self.count == 0 && !self.not_found.is_empty() {
            return Err(CliError::UnknownPositions(self.not_found));
        }
        let mut output = if json {
            Output::json(&json!({
                "action": self.action,
                "dry_run": self.dry_run,
                "count": self.count,
                "positions": self.positions,
                "not_found": self.not_found,
            }))
        } else {
            Output::text(self.human())
        };
        if !self.not_found.is_empty() {
            output.error = Some(CliError::UnknownPositions(self.not_found));
        }
        Ok(output)
    }

    fn human(&self) -> String {
        let what = plural(self.count, "dead letter");
        if self.dry_run {
            let mut text =
                format!("would {} {what} (dry run: nothing changed)\n", self.action);
            if !self.letters.is_empty() {
                text.push_str(&dead_table(self.letters));
            }
            return text;
        }
        if self.positions.is_empty() {
            return format!("{} {what}\n", self.done);
        }
        format!("{} {what}: {}\n", self.done, abbreviated(&self.positions))
    }
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `1, 2, 3` up to [`POSITIONS_SHOWN`] positions, then `… and N more`.
fn abbreviated(positions: &[i64]) -> String {
    let shown = crate::error::list(&positions[..positions.len().min(POSITIONS_SHOWN)]);
    match positions.len().checked_sub(POSITIONS_SHOWN) {
        Some(rest) if rest > 0 => format!("{shown} … and {rest} more"),
        _ => shown,
    }
}

fn requeue<C: OutboxConnection>(
    conn: &mut C,
    selector: &Selector,
    dry_run: bool,
    json: bool,
) -> Result<Output, CliError> {
    let selection = selection(selector);
    let (positions, not_found, letters) = if dry_run {
        let (letters, not_found) = selected(conn, &selection)?;
        let positions = letters.iter().map(|d| d.position).collect();
        (positions, not_found, letters)
    } else {
        let moved = admin::requeue_dead_letters(conn, &selection)?;
        let not_found = match &selection {
            DeadLetterSelection::Positions(asked) => {
                asked.iter().copied().filter(|p| !moved.contains(p)).collect()
            }
            _ => Vec::new(),
        };
        (moved, not_found, Vec::new())
    };
    Report {
        action: "requeue",
        done: "requeued",
        dry_run,
        count: positions.len(),
        positions,
        not_found,
        letters: &letters,
    }
    .finish(json)
}

fn purge<C>(
    conn: &mut C,
    selector: &Selector,
    dry_run: bool,
    yes: bool,
    json: bool,
) -> Result<Output, CliError>
where
    C: OutboxConnection + diesel::Connection,
{
    // Listing first gives the count to confirm, and deleting exactly the listed positions
    // means a dead letter that arrives while the operator reads the question is kept.
    let (letters, not_found) = selected(conn, &selection(selector))?;
    let positions: Vec<i64> = letters.iter().map(|d| d.position).collect();
    let mut count = positions.len();
    if !dry_run && !positions.is_empty() {
        let question = format!("Purge {}? [y/N] ", plural(count, "dead letter"));
        if !yes && !confirm(&question) {
            return Err(CliError::Aborted);
        }
        count = conn.transaction::<_, outbox_diesel::Error, _>(|conn| {
            let mut purged = 0;
            for chunk in positions.chunks(PURGE_CHUNK) {
                let chunk = DeadLetterSelection::Positions(chunk.to_vec());
                purged += admin::purge_dead_letters(conn, &chunk)?;
            }
            Ok(purged)
        })?;
    }
    Report {
        action: "purge",
        done: "purged",
        dry_run,
        count,
        positions,
        not_found,
        letters: if dry_run { &letters } else { &[] },
    }
    .finish(json)
}

/// Asks `question` on stderr and reads the answer from stdin: only `y` or `yes` agree; an
/// empty line, end of input or a read error decline.
fn confirm(question: &str) -> bool {
    let mut stderr = std::io::stderr().lock();
    // A prompt that cannot be shown still gets its answer read: declining is the safe side.
    let _ = write!(stderr, "{question}");
    let _ = stderr.flush();
    let mut stdin = std::io::stdin().lock();
    let mut answer = String::new();
    let read = stdin.read_line(&mut answer);
    // A terminal echoes the operator's Enter; piped or missing input ends the line here.
    if !stdin.is_terminal() || !matches!(read, Ok(n) if n > 0) {
        let _ = writeln!(stderr);
    }
    match read {
        Ok(0) | Err(_) => false,
        Ok(_) => matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_deduplicated_in_order() {
        assert_eq!(unique_positions(&[3, 1, 3, 2, 1]), [3, 1, 2]);
    }

    #[test]
    fn long_position_lists_are_abbreviated() {
        assert_eq!(abbreviated(&[1, 2, 3]), "1, 2, 3");
        let many: Vec<i64> = (1..=52).collect();
        let text = abbreviated(&many);
        assert!(text.ends_with("49, 50 … and 2 more"), "{text}");
    }

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(plural(1, "dead letter"), "1 dead letter");
        assert_eq!(plural(0, "dead letter"), "0 dead letters");
        assert_eq!(plural(3, "dead letter"), "3 dead letters");
    }
}
