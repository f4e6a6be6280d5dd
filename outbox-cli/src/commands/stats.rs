//! `outbox stats`.

use std::time::{Duration, SystemTime};

use outbox_diesel::admin::{self, TypeStats};
use outbox_diesel::OutboxConnection;
use serde_json::{json, Value};

use super::output::Output;
use crate::error::CliError;
use crate::format;
use crate::table::{Align, Table};

pub(super) fn stats<C: OutboxConnection>(conn: &mut C, json: bool) -> Result<Output, CliError> {
    let now = SystemTime::now();
    let types = admin::stats(conn)?;
    let backlog = admin::backlog(conn)?;
    let total = Totals::of(&types);
    let age = |oldest: Option<SystemTime>| oldest.map(|t| format::age(t, now));
    if json {
        let types: Vec<Value> = types
            .iter()
            .map(|t| {
                let mut entry = json!(t);
                entry["oldest_pending_age_secs"] =
                    json!(age(t.oldest_pending).map(|a| a.as_secs()));
                entry
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
            "horizon": {
                "oldest_transaction_age_secs":
                    backlog.oldest_transaction_age.map(|a| a.as_secs()),
                "dead_rows": backlog.dead_rows,
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
    let mut text = table.render();
    if let Some(warning) = horizon_warning(backlog.long_transaction(), backlog.dead_rows) {
        text.push('\n');
        text.push_str(&warning);
        text.push('\n');
    }
    Ok(Output::text(text))
}

/// The warning about a transaction that holds back the database's clean-up of the outbox table
/// (PostgreSQL's vacuum, InnoDB's purge), if one has been open long: `Backlog::long_transaction`.
fn horizon_warning(long_transaction: Option<Duration>, dead_rows: Option<u64>) -> Option<String> {
    let age = long_transaction?;
    let dead = dead_rows.map_or_else(String::new, |n| format!(" ({n} rows wait for it)"));
    Some(format!(
        "warning: a transaction has been open for {}; until it ends the database cannot clean up \
         what settled messages leave behind{dead}. Claims stay fast, but the table and its \
         indexes grow: end it, or bound such sessions (PostgreSQL: \
         idle_in_transaction_session_timeout; 17 and later: transaction_timeout).",
        format::duration(age)
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_transaction_is_named_with_the_rows_it_holds_back() {
        assert_eq!(horizon_warning(None, Some(10)), None);
        let warning = horizon_warning(Some(Duration::from_secs(312)), Some(40_000)).unwrap();
        assert!(
            warning.starts_with("warning: a transaction has been open for 5m12s;"),
            "{warning}"
        );
        assert!(warning.contains("(40000 rows wait for it)"), "{warning}");
        let unknown = horizon_warning(Some(Duration::from_secs(60)), None).unwrap();
        assert!(!unknown.contains("rows wait"), "{unknown}");
    }
}
