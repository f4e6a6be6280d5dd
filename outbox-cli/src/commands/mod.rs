//! The commands, written once for every backend: `run` dispatches to the module of each.

mod attempts;
mod changes;
mod destinations;
mod listing;
mod output;
mod pauses;
mod stats;
mod subscriptions;

use outbox_diesel::OutboxConnection;
use serde_json::json;

use crate::cli::{Command, DeadCommand, DestinationCommand, PendingCommand, SubscriptionCommand};
use crate::error::CliError;

pub use output::Output;

/// Runs `command` on `conn`, rendering JSON when `json`.
pub fn run<C>(conn: &mut C, command: &Command, json: bool) -> Result<Output, CliError>
where
    C: OutboxConnection + diesel::Connection,
{
    match command {
        Command::Migrate => migrate(conn, json),
        Command::Stats => stats::stats(conn, json),
        Command::Pending(PendingCommand::List(args)) => listing::pending_list(conn, args, json),
        Command::Dead(DeadCommand::List(args)) => listing::dead_list(conn, args, json),
        Command::Dead(DeadCommand::Show { position }) => listing::dead_show(conn, *position, json),
        Command::Show { message_id } => listing::show(conn, *message_id, json),
        Command::Blocked { limit } => listing::blocked(conn, *limit, json),
        Command::Destinations => destinations::list(conn, json),
        Command::Destination(DestinationCommand::Enable { name }) => {
            destinations::enable(conn, name, json)
        }
        Command::Destination(DestinationCommand::Disable { name, reason }) => {
            destinations::disable(conn, name, reason, json)
        }
        Command::Pause { target, reason } => pauses::pause(conn, target, reason, json),
        Command::Resume { target } => pauses::resume(conn, target, json),
        Command::Paused => pauses::list(conn, json),
        Command::Cancel {
            target,
            older_than,
            reason,
        } => changes::cancel(conn, target, *older_than, reason, json),
        Command::Attempts(args) => attempts::list(conn, args, json),
        Command::Replay {
            target,
            since,
            until,
            message_type,
        } => attempts::replay(conn, target, *since, *until, message_type.as_deref(), json),
        Command::Resend { message_id, target } => attempts::resend(conn, *message_id, target, json),
        Command::Subscription(command) => match command {
            SubscriptionCommand::Add(args) => subscriptions::add(conn, args, json),
            SubscriptionCommand::List { owner } => {
                subscriptions::list(conn, owner.as_deref(), json)
            }
            SubscriptionCommand::Show { id } => subscriptions::show(conn, id, json),
            SubscriptionCommand::Disable { id } => subscriptions::switch(conn, id, false, json),
            SubscriptionCommand::Enable { id } => subscriptions::switch(conn, id, true, json),
            SubscriptionCommand::Remove { id } => subscriptions::remove(conn, id, json),
            SubscriptionCommand::RotateSecret { id, overlap } => {
                subscriptions::rotate_secret(conn, id, *overlap, json)
            }
        },
        Command::Dead(DeadCommand::Requeue { selector, dry_run }) => {
            changes::requeue(conn, selector, *dry_run, json)
        }
        Command::Dead(DeadCommand::Purge {
            selector,
            dry_run,
            yes,
        }) => changes::purge(conn, selector, *dry_run, *yes, json),
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
