//! `outbox subscription add|list|show|disable|enable|remove|rotate-secret`: the subscriptions
//! the application's customers add, as an operator sees and changes them. Secrets are printed
//! once, when made, and never again.

use std::time::{Duration, SystemTime};

use outbox_diesel::subscription::{self, NewSubscription, SubscriptionInfo, Subscriptions};
use outbox_diesel::OutboxConnection;
use serde_json::json;

use super::output::Output;
use crate::cli::AddSubscription;
use crate::error::CliError;
use crate::format;
use crate::table::{self, Align, Table};

/// Characters of a URL or description shown in a table cell.
const CELL_WIDTH: usize = 50;

/// The keys secrets are encrypted with, from `OUTBOX_SECRET_KEYS`.
fn keys() -> Result<Subscriptions, CliError> {
    let list = std::env::var("OUTBOX_SECRET_KEYS").unwrap_or_default();
    Ok(Subscriptions::new().secret_keys(&list)?)
}

pub(super) fn add<C: OutboxConnection>(
    conn: &mut C,
    args: &AddSubscription,
    json: bool,
) -> Result<Output, CliError> {
    let mut settings = keys()?;
    for address in &args.allow_address {
        settings = settings.allow_address(*address);
    }
    let mut new = NewSubscription::new(&args.url, args.event_types.iter().map(String::as_str));
    if let Some(owner) = &args.owner {
        new = new.owner(owner);
    }
    if let Some(secret) = &args.secret {
        new = new.secret(secret);
    }
    if let Some(rate) = args.rate_limit {
        new = new.rate_limit(rate);
    }
    if let Some(description) = &args.description {
        new = new.description(description);
    }
    if let Some(metadata) = &args.metadata {
        let value =
            serde_json::from_str(metadata).map_err(|e| CliError::Metadata(e.to_string()))?;
        new = new.metadata(value);
    }
    if args.allow_http {
        new = new.allow_http();
    }
    if args.disabled {
        new = new.disabled();
    }
    let created = settings.create(conn, &new)?;
    if json {
        return Ok(Output::json(&json!({
            "subscription": created.subscription,
            "secret": created.secret,
        })));
    }
    Ok(Output::text(format!(
        "added subscription {}\nsigning secret (shown this once; give it to the subscriber): {}\n",
        created.subscription.id, created.secret
    )))
}

pub(super) fn list<C: OutboxConnection>(
    conn: &mut C,
    owner: Option<&str>,
    json: bool,
) -> Result<Output, CliError> {
    let subscriptions = subscription::list(conn, owner.map(Some))?;
    if json {
        return Ok(Output::json(&json!({ "subscriptions": subscriptions })));
    }
    if subscriptions.is_empty() {
        return Ok(Output::text("no subscriptions\n".to_owned()));
    }
    let now = SystemTime::now();
    let mut table = Table::new(&[
        ("ID", Align::Left),
        ("OWNER", Align::Left),
        ("STATE", Align::Left),
        ("EVENT TYPES", Align::Left),
        ("URL", Align::Left),
        ("CREATED", Align::Left),
    ]);
    for s in &subscriptions {
        table.row(vec![
            s.id.clone(),
            table::truncate(s.owner.as_deref().unwrap_or("-"), CELL_WIDTH),
            state(s).to_owned(),
            table::truncate(&s.event_types.join(","), CELL_WIDTH),
            table::truncate(&s.url, CELL_WIDTH),
            format::relative(s.created_at, now),
        ]);
    }
    Ok(Output::text(table.render()))
}

fn state(subscription: &SubscriptionInfo) -> &'static str {
    if subscription.enabled {
        "enabled"
    } else {
        "disabled"
    }
}

pub(super) fn show<C: OutboxConnection>(
    conn: &mut C,
    id: &str,
    json: bool,
) -> Result<Output, CliError> {
    let found =
        subscription::get(conn, id)?.ok_or_else(|| CliError::UnknownSubscription(id.to_owned()))?;
    if json {
        return Ok(Output::json(&json!({ "subscription": found })));
    }
    let now = SystemTime::now();
    let line = |name: &str, value: &str| format!("{name:<22} {}\n", table::one_line(value));
    let mut text = String::new();
    text.push_str(&line("id", &found.id));
    text.push_str(&line("owner", found.owner.as_deref().unwrap_or("-")));
    text.push_str(&line("state", state(&found)));
    text.push_str(&line("url", &found.url));
    text.push_str(&line("event types", &found.event_types.join(", ")));
    text.push_str(&line(
        "rate limit",
        &found
            .rate_limit
            .map_or_else(|| "-".to_owned(), |rate| format!("{rate}/s")),
    ));
    text.push_str(&line("allows http", &found.allow_http.to_string()));
    text.push_str(&line(
        "description",
        found.description.as_deref().unwrap_or("-"),
    ));
    text.push_str(&line(
        "metadata",
        &found
            .metadata
            .as_ref()
            .map_or_else(|| "-".to_owned(), ToString::to_string),
    ));
    text.push_str(&line("created", &format::relative(found.created_at, now)));
    if let Some(until) = found.previous_secret_until {
        text.push_str(&line(
            "old secret signs until",
            &format::relative(until, now),
        ));
    }
    text.push_str(&line("destination", &found.destination));
    Ok(Output::text(text))
}

pub(super) fn switch<C: OutboxConnection>(
    conn: &mut C,
    id: &str,
    enabled: bool,
    json: bool,
) -> Result<Output, CliError> {
    let found = if enabled {
        subscription::enable(conn, id)?
    } else {
        subscription::disable(conn, id)?
    };
    if !found {
        return Err(CliError::UnknownSubscription(id.to_owned()));
    }
    if json {
        return Ok(Output::json(&json!({ "id": id, "enabled": enabled })));
    }
    Ok(Output::text(if enabled {
        format!(
            "enabled subscription {id}: its paused deliveries are due now, and the workers follow \
             within a few seconds\n"
        )
    } else {
        format!(
            "disabled subscription {id}: within a few seconds the workers fan no new events out \
             to it and pause its waiting deliveries\n"
        )
    }))
}

pub(super) fn remove<C: OutboxConnection>(
    conn: &mut C,
    id: &str,
    json: bool,
) -> Result<Output, CliError> {
    if !subscription::remove(conn, id)? {
        return Err(CliError::UnknownSubscription(id.to_owned()));
    }
    if json {
        return Ok(Output::json(&json!({ "removed": id })));
    }
    Ok(Output::text(format!(
        "removed subscription {id} and its waiting deliveries\n"
    )))
}

pub(super) fn rotate_secret<C: OutboxConnection>(
    conn: &mut C,
    id: &str,
    overlap: Duration,
    json: bool,
) -> Result<Output, CliError> {
    let secret = keys()?
        .rotate_secret(conn, id, overlap)?
        .ok_or_else(|| CliError::UnknownSubscription(id.to_owned()))?;
    if json {
        return Ok(Output::json(&json!({ "id": id, "secret": secret })));
    }
    Ok(Output::text(format!(
        "new signing secret of subscription {id} (shown this once): {secret}\nthe old one keeps \
         signing beside it for {}\n",
        humantime::format_duration(overlap)
    )))
}
