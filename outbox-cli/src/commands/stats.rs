//! `outbox stats`.

use std::time::SystemTime;

use outbox_diesel::admin::{self, ListOptions, TypeStats};
use outbox_diesel::OutboxConnection;
use serde_json::{json, Value};

use super::Output;
use crate::error::CliError;
use crate::format;
use crate::table::{Align, Table};

pub(super) fn stats<C: OutboxConnection>(conn: &mut C, json: bool) -> Result<Output, CliError> {
    let now = SystemTime::now();
    let types = type_stats(conn)?;
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

/// The counts of one message type.
struct TypeCounts {
    message_type: String,
    pending: u64,
    in_flight: u64,
    dead: u64,
    oldest_pending: Option<SystemTime>,
}

impl From<TypeStats> for TypeCounts {
    fn from(t: TypeStats) -> Self {
        TypeCounts {
            message_type: t.message_type,
            pending: t.pending,
            in_flight: t.in_flight,
            dead: t.dead,
            oldest_pending: t.oldest_pending,
        }
    }
}

/// The counts by message type, sorted by type.
///
/// Works around a bug of `admin::stats` on PostgreSQL: its dead-letter query selects
/// `0 AS in_flight`, an `integer` that Diesel refuses to decode as the `BigInt` the row declares,
/// so it fails as soon as one dead letter exists. There (a deserialization error) the counts
/// come from the listings instead, which read every row.
fn type_stats<C: OutboxConnection>(conn: &mut C) -> Result<Vec<TypeCounts>, CliError> {
    match admin::stats(conn) {
        Ok(types) => Ok(types.into_iter().map(TypeCounts::from).collect()),
        Err(outbox_diesel::Error::Database(diesel::result::Error::DeserializationError(_))) => {
            counted_from_listings(conn)
        }
        Err(e) => Err(e.into()),
    }
}

fn counted_from_listings<C: OutboxConnection>(conn: &mut C) -> Result<Vec<TypeCounts>, CliError> {
    let everything = ListOptions::new().limit(u32::MAX);
    let mut by_type = std::collections::BTreeMap::<String, TypeCounts>::new();
    fn entry<'a>(
        by_type: &'a mut std::collections::BTreeMap<String, TypeCounts>,
        message_type: &str,
    ) -> &'a mut TypeCounts {
        by_type
            .entry(message_type.to_owned())
            .or_insert_with(|| TypeCounts {
                message_type: message_type.to_owned(),
                pending: 0,
                in_flight: 0,
                dead: 0,
                oldest_pending: None,
            })
    }
    for m in admin::pending_messages(conn, &everything)? {
        let counts = entry(&mut by_type, &m.message_type);
        counts.pending += 1;
        counts.in_flight += u64::from(m.in_flight);
        counts.oldest_pending = Some(
            counts
                .oldest_pending
                .map_or(m.created_at, |t| t.min(m.created_at)),
        );
    }
    for d in admin::dead_letters(conn, &everything)? {
        entry(&mut by_type, &d.message_type).dead += 1;
    }
    Ok(by_type.into_values().collect())
}

/// The sums over every message type.
struct Totals {
    pending: u64,
    in_flight: u64,
    dead: u64,
    oldest_pending: Option<SystemTime>,
}

impl Totals {
    fn of(types: &[TypeCounts]) -> Self {
        Totals {
            pending: types.iter().map(|t| t.pending).sum(),
            in_flight: types.iter().map(|t| t.in_flight).sum(),
            dead: types.iter().map(|t| t.dead).sum(),
            oldest_pending: types.iter().filter_map(|t| t.oldest_pending).min(),
        }
    }
}
