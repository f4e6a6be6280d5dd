//! `outbox attempts`, `replay` and `resend`: the delivery log, newest first, and sending
//! archived messages again.

use std::time::SystemTime;

use outbox_diesel::delivery_log::{self, AttemptFilter, Replay, ReplayTarget, Replayed};
use outbox_diesel::{MessageId, OutboxConnection};
use serde_json::json;

use super::output::Output;
use crate::cli::{AttemptsArgs, ReplayTargetArgs};
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

pub(super) fn replay<C: OutboxConnection>(
    conn: &mut C,
    target: &ReplayTargetArgs,
    since: SystemTime,
    until: Option<SystemTime>,
    message_type: Option<&str>,
    json: bool,
) -> Result<Output, CliError> {
    let mut replay = Replay::new(target.target(), since);
    replay.until = until;
    replay.message_type = message_type.map(str::to_owned);
    let replayed = delivery_log::replay(conn, &replay)?;
    Ok(sent(&replay.target, replayed, json))
}

pub(super) fn resend<C: OutboxConnection>(
    conn: &mut C,
    message_id: MessageId,
    target: &ReplayTargetArgs,
    json: bool,
) -> Result<Output, CliError> {
    let target = target.target();
    let replayed = delivery_log::resend(conn, message_id, &target)?;
    Ok(sent(&target, replayed, json))
}

/// What a replay or a resend did, for people or as JSON.
fn sent(target: &ReplayTarget, replayed: Replayed, json: bool) -> Output {
    if json {
        return Output::json(&json!(replayed));
    }
    let to = match target {
        ReplayTarget::Destination(name) => format!("destination {}", table::one_line(name)),
        ReplayTarget::Subscription(id) => format!("subscription {}", table::one_line(id)),
    };
    let mut text = format!(
        "enqueued {} deliveries to {to}, with their original ids\n",
        replayed.enqueued
    );
    if replayed.skipped > 0 {
        text.push_str(&format!(
            "{} archived messages in the range are not for it (another owner's, or a type its \
             filters do not take)\n",
            replayed.skipped
        ));
    }
    Output::text(text)
}
