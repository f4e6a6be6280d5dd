//! `outbox dead requeue`, `outbox dead purge` and `outbox cancel`.

use std::io::{BufRead, IsTerminal, Write};

use outbox_diesel::admin::{self, DeadLetter, DeadLetterSelection};
use outbox_diesel::OutboxConnection;
use serde_json::json;

use super::listing::dead_table;
use super::output::Output;
use crate::cli::{CancelTarget, Selector};
use crate::error::CliError;

/// Positions listed in human output before the rest are only counted.
const POSITIONS_SHOWN: usize = 50;

/// The positions named on the command line, each once, in the order given.
fn unique_positions(positions: &[i64]) -> Vec<i64> {
    let mut seen = std::collections::HashSet::new();
    positions
        .iter()
        .copied()
        .filter(|p| seen.insert(*p))
        .collect()
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

/// The positions of the dead letters a selector names, and the named positions that hold
/// none. `--all` and `--type` read positions only: a million dead letters are 8 MB of
/// positions, not a million payloads.
fn selected<C: OutboxConnection>(
    conn: &mut C,
    selector: &Selector,
) -> Result<(Vec<i64>, Vec<i64>), CliError> {
    if selector.all || selector.message_type.is_some() {
        let positions = admin::dead_letter_positions(conn, selector.message_type.as_deref())?;
        return Ok((positions, Vec::new()));
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for position in unique_positions(&selector.positions) {
        match admin::dead_letter(conn, position)? {
            Some(_) => found.push(position),
            None => missing.push(position),
        }
    }
    Ok((found, missing))
}

/// The first [`POSITIONS_SHOWN`] of the selected dead letters, for a dry run's table.
fn preview<C: OutboxConnection>(
    conn: &mut C,
    positions: &[i64],
) -> Result<Vec<DeadLetter>, CliError> {
    let mut letters = Vec::new();
    for &position in positions.iter().take(POSITIONS_SHOWN) {
        letters.extend(admin::dead_letter(conn, position)?);
    }
    Ok(letters)
}

/// What a requeue or purge did (or, dry, would do).
struct Report<'a> {
    action: &'a str,
    done: &'a str,
    dry_run: bool,
    count: usize,
    positions: Vec<i64>,
    not_found: Vec<i64>,
    /// For a dry run: the first of the dead letters that would be affected.
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
            let mut text = format!("would {} {what} (dry run: nothing changed)\n", self.action);
            if !self.letters.is_empty() {
                text.push_str(&dead_table(self.letters));
            }
            if let Some(rest) = self
                .count
                .checked_sub(self.letters.len())
                .filter(|n| *n > 0)
            {
                text.push_str(&format!("… and {}\n", plural(rest, "more dead letter")));
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

pub(super) fn requeue<C: OutboxConnection>(
    conn: &mut C,
    selector: &Selector,
    dry_run: bool,
    json: bool,
) -> Result<Output, CliError> {
    let selection = selection(selector);
    let (positions, not_found, letters) = if dry_run {
        let (positions, not_found) = selected(conn, selector)?;
        let letters = preview(conn, &positions)?;
        (positions, not_found, letters)
    } else {
        let moved = admin::requeue_dead_letters(conn, &selection)?;
        let not_found = match &selection {
            DeadLetterSelection::Positions(asked) => asked
                .iter()
                .copied()
                .filter(|p| !moved.contains(p))
                .collect(),
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

pub(super) fn purge<C>(
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
    let (positions, not_found) = selected(conn, selector)?;
    let letters = if dry_run {
        preview(conn, &positions)?
    } else {
        Vec::new()
    };
    let mut count = positions.len();
    if !dry_run && !positions.is_empty() {
        let question = format!("Purge {}? [y/N] ", plural(count, "dead letter"));
        if !yes && !confirm(&question) {
            return Err(CliError::Aborted);
        }
        count =
            admin::purge_dead_letters(conn, &DeadLetterSelection::Positions(positions.clone()))?;
    }
    Report {
        action: "purge",
        done: "purged",
        dry_run,
        count,
        positions,
        not_found,
        letters: &letters,
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

/// `outbox cancel`.
pub(super) fn cancel<C: OutboxConnection>(
    conn: &mut C,
    target: &CancelTarget,
    older_than: Option<std::time::Duration>,
    reason: &str,
    json: bool,
) -> Result<Output, CliError> {
    let mut selection = admin::CancelSelection::new();
    if let Some(id) = target.message_id {
        selection = selection.message_id(id);
    }
    if let Some(message_type) = &target.message_type {
        selection = selection.message_type(message_type.clone());
    }
    if let Some(subscription) = &target.subscription {
        selection = selection.subscription(subscription.clone());
    }
    if let Some(age) = older_than {
        selection = selection.older_than(age);
    }
    let cancelled = admin::cancel(conn, &selection, reason)?;
    if json {
        return Ok(Output::json(&json!({
            "cancelled": cancelled.cancelled,
            "in_flight": cancelled.in_flight,
            "reason": reason.trim(),
        })));
    }
    let mut text = format!("cancelled {} messages\n", cancelled.cancelled);
    if cancelled.in_flight > 0 {
        text.push_str(&format!(
            "{} more are being delivered right now and were left alone; should one fail, \
             cancel again before its next attempt\n",
            cancelled.in_flight
        ));
    }
    Ok(Output::text(text))
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
