//! `outbox stats`.

use std::time::SystemTime;

use outbox_diesel::admin::{self, TypeStats};
use outbox_diesel::OutboxConnection;
use serde_json::{json, Value};

use super::Output;
use crate::error::CliError;
use crate::format;
use crate::table::{Align, Table};

pub(super) fn stats<C: OutboxConnection>(conn: &mut C, json: bool) -> Result<Output, CliError> {
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
