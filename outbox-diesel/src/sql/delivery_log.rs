//! The statements of the delivery log ([`crate::delivery_log`]), one implementation for every
//! backend: each backend only says how it writes a placeholder, a message id and a time
//! ([`DeliveryLogStatements`], in its own file), and the statements are built here.

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::QueryResult;
use outbox_core::store::{Exchange, Outcome};

use super::bind::{Bind, Placeholders};
use super::{micros, to_i64, Statements};
use crate::delivery_log::{AttemptFilter, DeliveryLog};

/// The columns an exchange is written to, in the order of [`LoggedRow::binds`].
const COLUMNS: &str = "message_id, message_type, destination, subscription_id, attempt, \
     outcome, status, answer, error, latency_micros, started_at";

/// Binds of one row.
const BINDS: usize = 11;

/// Rows written by one statement: far below every backend's bind limit.
const ROWS_PER_STATEMENT: usize = 500;

/// What each backend says of how it writes the delivery log's statements.
pub(crate) trait DeliveryLogStatements: Statements {
    /// How it writes placeholders.
    const PLACEHOLDERS: Placeholders;

    /// The columns of a logged attempt as read into [`AttemptRow`], with the `FROM`.
    const SELECT: &'static str;

    /// The text of the placeholder numbered `n` holding a message id.
    fn message_id_param(n: usize) -> String;

    /// The text of the placeholder numbered `n` holding µs since the epoch, as a time.
    fn time_param(n: usize) -> String;

    /// Runs `sql`, built for this call, with `binds`; how many rows it changed.
    fn execute_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize>;

    /// Loads the attempts `sql`, built for this call, selects.
    fn load_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<AttemptRow>>;

    /// The highest id in the log, if it has a row.
    fn last_attempt_id(&mut self) -> QueryResult<Option<i64>>;
}

/// A logged attempt as stored.
#[derive(diesel::QueryableByName, Debug)]
pub(crate) struct AttemptRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = Text)]
    pub(crate) destination: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) subscription_id: Option<String>,
    #[diesel(sql_type = Integer)]
    pub(crate) attempt: i32,
    #[diesel(sql_type = Text)]
    pub(crate) outcome: String,
    #[diesel(sql_type = Nullable<Integer>)]
    pub(crate) status: Option<i32>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) answer: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) error: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) latency_micros: i64,
    /// µs since the epoch.
    #[diesel(sql_type = BigInt)]
    pub(crate) started_at: i64,
}

/// The highest id in the log (NULL: the log is empty).
pub(crate) const LAST_ATTEMPT_ID: &str = "SELECT MAX(id) AS id FROM outbox_attempt";

/// The highest id in the log.
#[derive(diesel::QueryableByName, Debug)]
pub(crate) struct LastIdRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) id: Option<i64>,
}

/// One exchange of one outcome, ready to bind.
struct LoggedRow<'a> {
    message_id: String,
    outcome: &'a Outcome,
    exchange: &'a Exchange,
}

impl LoggedRow<'_> {
    fn binds(&self) -> [Bind<'_>; BINDS] {
        let log = self.outcome.log.as_deref();
        let answer = self.exchange.answer.as_ref();
        [
            Bind::Text(&self.message_id),
            Bind::Text(log.map_or("", |log| log.message_type.as_str())),
            Bind::Text(&self.exchange.destination),
            Bind::NullableText(log.and_then(|log| log.subscription_id.as_deref())),
            Bind::BigInt(log.map_or(0, |log| i64::from(log.attempt))),
            Bind::Text(self.exchange.outcome),
            Bind::NullableBigInt(answer.and_then(|answer| answer.status()).map(i64::from)),
            Bind::NullableText(answer.map(|answer| answer.text())),
            Bind::NullableText(self.exchange.error.as_deref()),
            Bind::BigInt(micros(self.exchange.latency)),
            Bind::BigInt(micros_since_epoch(self.exchange.started_at)),
        ]
    }
}

fn micros_since_epoch(time: std::time::SystemTime) -> i64 {
    micros(
        time.duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// The placeholder numbered `n` in `style`.
fn param(style: Placeholders, n: usize) -> String {
    match style {
        Placeholders::Numbered => format!("${n}"),
        Placeholders::Question => "?".to_owned(),
    }
}

/// Writes the exchanges of `outcomes` that `mode` keeps, in the caller's transaction.
pub(crate) fn log_exchanges<C: DeliveryLogStatements>(
    c: &mut C,
    outcomes: &[Outcome],
    mode: DeliveryLog,
) -> QueryResult<()> {
    let rows: Vec<LoggedRow<'_>> = outcomes
        .iter()
        .filter_map(|outcome| outcome.log.as_deref().map(|log| (outcome, log)))
        .flat_map(|(outcome, log)| {
            log.exchanges
                .iter()
                .filter(move |exchange| mode.keeps(exchange.outcome))
                .map(move |exchange| LoggedRow {
                    message_id: outcome.message_id.to_string(),
                    outcome,
                    exchange,
                })
        })
        .collect();
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let values: Vec<String> = (0..chunk.len())
            .map(|i| row_values::<C>(i * BINDS + 1))
            .collect();
        let sql = format!(
            "INSERT INTO outbox_attempt ({COLUMNS}) VALUES {}",
            values.join(", ")
        );
        let binds: Vec<Bind<'_>> = chunk.iter().flat_map(LoggedRow::binds).collect();
        c.execute_built(&sql, &binds)?;
    }
    Ok(())
}

/// Whether any outcome has an exchange `mode` keeps: a settlement then writes in a transaction.
pub(crate) fn has_exchanges(outcomes: &[Outcome], mode: DeliveryLog) -> bool {
    outcomes.iter().any(|outcome| {
        outcome.log.as_deref().is_some_and(|log| {
            log.exchanges
                .iter()
                .any(|exchange| mode.keeps(exchange.outcome))
        })
    })
}

/// The VALUES tuple of one row, from its first placeholder's number.
fn row_values<C: DeliveryLogStatements>(first: usize) -> String {
    let p = |i: usize| param(C::PLACEHOLDERS, first + i);
    format!(
        "({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {})",
        C::message_id_param(first),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8),
        p(9),
        C::time_param(first + 10)
    )
}

/// The logged attempts `filter` selects, newest first.
pub(crate) fn attempts<C: DeliveryLogStatements>(
    c: &mut C,
    filter: &AttemptFilter,
) -> QueryResult<Vec<AttemptRow>> {
    let message_id = filter.message_id.map(|id| id.to_string());
    let since = filter.since.map(micros_since_epoch);
    let until = filter.until.map(micros_since_epoch);
    let mut conditions: Vec<String> = Vec::new();
    let mut binds: Vec<Bind<'_>> = Vec::new();
    // Each condition but one adds one bind; `n` numbers the last.
    let mut n = 0;
    if let Some(id) = &message_id {
        n += 1;
        conditions.push(format!("message_id = {}", C::message_id_param(n)));
        binds.push(Bind::Text(id));
    }
    if let Some(destination) = &filter.destination {
        n += 1;
        conditions.push(format!("destination = {}", param(C::PLACEHOLDERS, n)));
        binds.push(Bind::Text(destination));
    }
    if let Some(subscription) = &filter.subscription_id {
        n += 1;
        conditions.push(format!("subscription_id = {}", param(C::PLACEHOLDERS, n)));
        binds.push(Bind::Text(subscription));
    }
    if let Some(message_type) = &filter.message_type {
        n += 1;
        conditions.push(format!("message_type = {}", param(C::PLACEHOLDERS, n)));
        binds.push(Bind::Text(message_type));
    }
    if filter.failures_only {
        conditions.push("outcome <> 'delivered'".to_owned());
    }
    if let Some(since) = since {
        n += 1;
        conditions.push(format!("started_at >= {}", C::time_param(n)));
        binds.push(Bind::BigInt(since));
    }
    if let Some(until) = until {
        n += 1;
        conditions.push(format!("started_at < {}", C::time_param(n)));
        binds.push(Bind::BigInt(until));
    }
    if let Some(before) = filter.before {
        n += 1;
        conditions.push(format!("id < {}", param(C::PLACEHOLDERS, n)));
        binds.push(Bind::BigInt(before));
    }
    let filters = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    n += 1;
    let sql = format!(
        "{}{filters} ORDER BY id DESC LIMIT {}",
        C::SELECT,
        param(C::PLACEHOLDERS, n)
    );
    binds.push(Bind::BigInt(i64::from(filter.limit)));
    c.load_built(&sql, &binds)
}

/// Deletes up to `limit` of the oldest logged attempts that started before `cutoff_micros`
/// (µs since the epoch); how many. Reads the oldest `limit` rows by id, not a time index: ids
/// grow with time, so the oldest rows are first.
pub(crate) fn prune_older<C: DeliveryLogStatements>(
    c: &mut C,
    cutoff_micros: i64,
    limit: i64,
) -> QueryResult<usize> {
    let p = |n| param(C::PLACEHOLDERS, n);
    let sql = format!(
        "DELETE FROM outbox_attempt WHERE id IN (SELECT id FROM (SELECT id, started_at FROM \
         outbox_attempt ORDER BY id LIMIT {}) oldest WHERE started_at < {})",
        p(1),
        C::time_param(2)
    );
    c.execute_built(&sql, &[Bind::BigInt(limit), Bind::BigInt(cutoff_micros)])
}

/// Deletes up to `limit` of the oldest logged attempts beyond the newest `keep`; how many.
pub(crate) fn prune_beyond<C: DeliveryLogStatements>(
    c: &mut C,
    keep: usize,
    limit: i64,
) -> QueryResult<usize> {
    let Some(last) = c.last_attempt_id()? else {
        return Ok(0);
    };
    let below = last.saturating_sub(to_i64(keep));
    if below <= 0 {
        return Ok(0);
    }
    let p = |n| param(C::PLACEHOLDERS, n);
    let sql = format!(
        "DELETE FROM outbox_attempt WHERE id IN (SELECT id FROM (SELECT id FROM outbox_attempt \
         WHERE id <= {} ORDER BY id LIMIT {}) oldest)",
        p(1),
        p(2)
    );
    c.execute_built(&sql, &[Bind::BigInt(below), Bind::BigInt(limit)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_written_in_each_style() {
        assert_eq!(param(Placeholders::Numbered, 12), "$12");
        assert_eq!(param(Placeholders::Question, 12), "?");
    }
}
