//! The statements of the delivery log and the archive ([`crate::delivery_log`]), one
//! implementation for every backend: each backend only says how it writes a placeholder, a
//! message id, a time and an insert that skips taken keys ([`DeliveryLogStatements`], in its
//! own file), and the statements are built here.

use std::time::SystemTime;

use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::QueryResult;
use outbox_core::store::{AttemptLog, Exchange, Outcome};
use outbox_core::MessageId;

use super::bind::{Bind, Placeholders};
use super::codec::micros_from_time;
use super::{micros, to_i64, Statements};

/// The columns an exchange is written to, in the order of [`LoggedRow::binds`].
pub(crate) const COLUMNS: &str =
    "message_id, message_type, destination, subscription_id, attempt, \
     outcome, status, answer, error, latency_micros, started_at";

/// Binds of one row.
const BINDS: usize = 11;

/// Rows written by one statement: far below every backend's bind limit.
const ROWS_PER_STATEMENT: usize = 500;

// The log's settings and filter are the SQL layer's input; `crate::delivery_log` publishes them.

/// What the delivery log keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryLog {
    /// Every exchange with a destination.
    #[default]
    All,
    /// Only the exchanges that did not deliver (failed, rejected, pushed back): the evidence of
    /// trouble, at a fraction of the writes.
    Failures,
    /// Nothing.
    Off,
}

impl DeliveryLog {
    /// Whether an exchange that went `outcome` is kept.
    pub(crate) fn keeps(self, outcome: &str) -> bool {
        match self {
            DeliveryLog::All => true,
            DeliveryLog::Failures => outcome != "delivered",
            DeliveryLog::Off => false,
        }
    }
}

/// Which logged attempts to read. Every field narrows; the default reads the newest 100.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptFilter {
    /// Only this message's attempts.
    pub message_id: Option<MessageId>,
    /// Only those to this destination (`subscription:<id>` for a subscription's).
    pub destination: Option<String>,
    /// Only those of deliveries for this subscription.
    pub subscription_id: Option<String>,
    /// Only those of messages of this type.
    pub message_type: Option<String>,
    /// Only those that did not deliver.
    pub failures_only: bool,
    /// Only those that started at or after this time.
    pub since: Option<SystemTime>,
    /// Only those that started before this time.
    pub until: Option<SystemTime>,
    /// Only those logged before the attempt with this id: the next page after it.
    pub before: Option<i64>,
    /// At most this many, newest first.
    pub limit: u32,
}

impl Default for AttemptFilter {
    fn default() -> Self {
        AttemptFilter {
            message_id: None,
            destination: None,
            subscription_id: None,
            message_type: None,
            failures_only: false,
            since: None,
            until: None,
            before: None,
            limit: 100,
        }
    }
}

impl AttemptFilter {
    /// Only message `id`'s attempts.
    pub fn message(mut self, id: MessageId) -> Self {
        self.message_id = Some(id);
        self
    }

    /// Only those to destination `name`.
    pub fn destination(mut self, name: impl Into<String>) -> Self {
        self.destination = Some(name.into());
        self
    }

    /// Only those of deliveries for subscription `id`.
    pub fn subscription(mut self, id: impl Into<String>) -> Self {
        self.subscription_id = Some(id.into());
        self
    }

    /// Only those that did not deliver.
    pub fn failures_only(mut self) -> Self {
        self.failures_only = true;
        self
    }
}

/// What each backend says of how it writes the delivery log's statements.
pub(crate) trait DeliveryLogStatements: Statements {
    /// How it writes placeholders.
    const PLACEHOLDERS: Placeholders;

    /// The columns of a logged attempt as read into [`AttemptRow`], with the `FROM`.
    const SELECT: &'static str;

    /// The text of the placeholder numbered `n` holding a UUID (a message id, a claim token).
    fn uuid_param(n: usize) -> String;

    /// The text of the placeholder numbered `n` holding µs since the epoch, as a time.
    fn time_param(n: usize) -> String;

    /// The expression of `column`, a time, as µs since the epoch.
    fn micros_of(column: &str) -> String;

    /// Runs `sql`, built for this call, with `binds`; how many rows it changed.
    fn execute_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize>;

    /// Loads the attempts `sql`, built for this call, selects.
    fn load_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<AttemptRow>>;

    /// The highest id in the log, if it has a row.
    fn last_attempt_id(&mut self) -> QueryResult<Option<i64>>;

    /// Inserts `rows` into the log (by default many rows a statement, built for the call).
    fn insert_attempts(&mut self, rows: &[LoggedRow<'_>]) -> QueryResult<()> {
        insert_rows(self, rows)
    }

    /// A transaction that writes: one that has begun to write on SQLite, whose deferred
    /// transactions fail on a write that a commit elsewhere came before.
    fn write<T>(&mut self, body: impl FnOnce(&mut Self) -> QueryResult<T>) -> QueryResult<T> {
        self.transaction(body)
    }

    /// The database's clock as the outbox's time columns keep it.
    const NOW: &'static str;

    /// An insert that skips rows whose key is taken: the text before `table (columns) SELECT
    /// …`, and after it.
    const INSERT_IGNORING: (&'static str, &'static str);

    /// Loads the archived messages `sql`, built for this call, selects.
    fn load_archived(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<ArchivedRow>>;
}

/// An archived message, as a replay chooses it.
#[derive(diesel::QueryableByName, Debug)]
pub(crate) struct ArchivedRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) owner: Option<String>,
    /// When it was enqueued, µs since the epoch.
    #[diesel(sql_type = BigInt)]
    pub(crate) created_micros: i64,
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

/// One exchange of one outcome, as a row of the log.
#[derive(Debug)]
pub(crate) struct LoggedRow<'a> {
    pub message_id: String,
    pub message_type: &'a str,
    pub destination: &'a str,
    pub subscription_id: Option<&'a str>,
    pub attempt: i64,
    pub outcome: &'a str,
    pub status: Option<i64>,
    pub answer: Option<&'a str>,
    pub error: Option<&'a str>,
    pub latency_micros: i64,
    /// µs since the epoch.
    pub started_micros: i64,
}

impl<'a> LoggedRow<'a> {
    fn of(outcome: &'a Outcome, log: &'a AttemptLog, exchange: &'a Exchange) -> Self {
        LoggedRow {
            message_id: outcome.message_id.to_string(),
            message_type: &log.message_type,
            destination: &exchange.destination,
            subscription_id: log.subscription_id.as_deref(),
            attempt: i64::from(log.attempt),
            outcome: exchange.outcome,
            status: exchange
                .answer
                .as_ref()
                .and_then(|answer| answer.status())
                .map(i64::from),
            answer: exchange.answer.as_ref().map(|answer| answer.text()),
            error: exchange.error.as_deref(),
            latency_micros: micros(exchange.latency),
            started_micros: micros_from_time(exchange.started_at),
        }
    }

    /// The binds of one row, in the order of [`COLUMNS`].
    pub(crate) fn binds(&self) -> [Bind<'_>; BINDS] {
        [
            Bind::Text(&self.message_id),
            Bind::Text(self.message_type),
            Bind::Text(self.destination),
            Bind::NullableText(self.subscription_id),
            Bind::BigInt(self.attempt),
            Bind::Text(self.outcome),
            Bind::NullableBigInt(self.status),
            Bind::NullableText(self.answer),
            Bind::NullableText(self.error),
            Bind::BigInt(self.latency_micros),
            Bind::BigInt(self.started_micros),
        ]
    }
}

/// Inserts `rows` into the log: many rows a statement, numbered from the first placeholder.
/// What a backend without a better way does.
pub(crate) fn insert_rows<C: DeliveryLogStatements>(
    c: &mut C,
    rows: &[LoggedRow<'_>],
) -> QueryResult<()> {
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
                .map(move |exchange| LoggedRow::of(outcome, log, exchange))
        })
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    c.insert_attempts(&rows)
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
    format!(
        "({}, {}, {})",
        C::uuid_param(first),
        params(C::PLACEHOLDERS, first + 1, BINDS - 2),
        C::time_param(first + BINDS - 1)
    )
}

/// The logged attempts `filter` selects, newest first.
pub(crate) fn attempts<C: DeliveryLogStatements>(
    c: &mut C,
    filter: &AttemptFilter,
) -> QueryResult<Vec<AttemptRow>> {
    let message_id = filter.message_id.map(|id| id.to_string());
    let since = filter.since.map(micros_from_time);
    let until = filter.until.map(micros_from_time);
    let mut conditions: Vec<String> = Vec::new();
    let mut binds: Vec<Bind<'_>> = Vec::new();
    // Each condition but one adds one bind; `n` numbers the last.
    let mut n = 0;
    if let Some(id) = &message_id {
        n += 1;
        conditions.push(format!("message_id = {}", C::uuid_param(n)));
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

/// What a pruning by age reads: a table whose ids grow with `time`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Aged {
    pub table: &'static str,
    pub time: &'static str,
}

/// The delivery log, by the start of each attempt.
pub(crate) const LOGGED: Aged = Aged {
    table: "outbox_attempt",
    time: "started_at",
};

/// The archive, by each message's enqueue.
pub(crate) const ARCHIVED: Aged = Aged {
    table: "outbox_archive",
    time: "created_at",
};

/// Deletes up to `limit` of the oldest rows of `aged` from before `cutoff_micros` (µs since the
/// epoch); how many. Reads the oldest `limit` rows by id, not a time index: ids grow with time,
/// so the oldest rows are first.
pub(crate) fn prune_older<C: DeliveryLogStatements>(
    c: &mut C,
    aged: Aged,
    cutoff_micros: i64,
    limit: i64,
) -> QueryResult<usize> {
    let Aged { table, time } = aged;
    let p = |n| param(C::PLACEHOLDERS, n);
    let sql = format!(
        "DELETE FROM {table} WHERE id IN (SELECT id FROM (SELECT id, {time} FROM {table} \
         ORDER BY id LIMIT {}) oldest WHERE {time} < {})",
        p(1),
        C::time_param(2)
    );
    c.execute_built(&sql, &[Bind::BigInt(limit), Bind::BigInt(cutoff_micros)])
}

/// The columns the archive keeps of a message, the same in both tables.
const ARCHIVED_COLUMNS: &str =
    "id, message_id, message_type, payload, payload_bytes, headers, priority, owner, created_at";

/// `first, …` placeholders for `n` binds from the number `first`.
fn params(style: Placeholders, first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| param(style, i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Copies the messages at the positions of `claims` still held by their claim (by token) into
/// the archive, in the caller's transaction, before they leave the outbox: a message another
/// claim took meanwhile is not this settlement's to archive. Deliveries to a subscription or a
/// destination are not copied (their event is archived already), and one archived already is
/// left as it is.
pub(crate) fn archive<C: DeliveryLogStatements>(
    c: &mut C,
    claims: &[(String, Vec<i64>)],
) -> QueryResult<()> {
    let (head, tail) = C::INSERT_IGNORING;
    for (token, positions) in claims {
        for chunk in positions.chunks(super::ID_CHUNK) {
            let sql = format!(
                "{head} outbox_archive ({ARCHIVED_COLUMNS}) SELECT {ARCHIVED_COLUMNS} FROM \
                 outbox_message WHERE subscription_id IS NULL AND locked_by = {} \
                 AND id IN ({}){tail}",
                C::uuid_param(1),
                params(C::PLACEHOLDERS, 2, chunk.len())
            );
            let mut binds = vec![Bind::Text(token)];
            binds.extend(chunk.iter().map(|id| Bind::BigInt(*id)));
            c.execute_built(&sql, &binds)?;
        }
    }
    Ok(())
}

/// Which archived messages a replay reads.
#[derive(Debug, Default)]
pub(crate) struct ArchiveQuery<'a> {
    pub since_micros: Option<i64>,
    pub until_micros: Option<i64>,
    pub message_type: Option<&'a str>,
    pub message_id: Option<&'a str>,
    pub after: i64,
    pub limit: i64,
}

/// Archived messages `query` selects, by position, after `query.after`.
pub(crate) fn archived<C: DeliveryLogStatements>(
    c: &mut C,
    query: &ArchiveQuery<'_>,
) -> QueryResult<Vec<ArchivedRow>> {
    let mut conditions = vec![format!("id > {}", param(C::PLACEHOLDERS, 1))];
    let mut binds = vec![Bind::BigInt(query.after)];
    if let Some(since) = query.since_micros {
        conditions.push(format!("created_at >= {}", C::time_param(binds.len() + 1)));
        binds.push(Bind::BigInt(since));
    }
    if let Some(until) = query.until_micros {
        conditions.push(format!("created_at < {}", C::time_param(binds.len() + 1)));
        binds.push(Bind::BigInt(until));
    }
    if let Some(message_type) = query.message_type {
        conditions.push(format!(
            "message_type = {}",
            param(C::PLACEHOLDERS, binds.len() + 1)
        ));
        binds.push(Bind::Text(message_type));
    }
    if let Some(message_id) = query.message_id {
        conditions.push(format!("message_id = {}", C::uuid_param(binds.len() + 1)));
        binds.push(Bind::Text(message_id));
    }
    let sql = format!(
        "SELECT id, message_type, owner, {} AS created_micros FROM outbox_archive WHERE {} \
         ORDER BY id LIMIT {}",
        C::micros_of("created_at"),
        conditions.join(" AND "),
        param(C::PLACEHOLDERS, binds.len() + 1)
    );
    binds.push(Bind::BigInt(query.limit));
    c.load_archived(&sql, &binds)
}

/// Enqueues the archived messages at `positions` again, in their order, as deliveries to
/// `target` (a subscription's id, or `destination:<name>`), with their ids, types, payloads,
/// headers, priorities and owners; how many.
pub(crate) fn enqueue_archived<C: DeliveryLogStatements>(
    c: &mut C,
    positions: &[i64],
    target: &str,
) -> QueryResult<usize> {
    let mut enqueued = 0;
    for chunk in positions.chunks(super::ID_CHUNK) {
        let sql = format!(
            "INSERT INTO outbox_message (message_id, message_type, payload, payload_bytes, \
             headers, priority, owner, subscription_id, created_at, next_attempt_at) \
             SELECT message_id, message_type, payload, payload_bytes, headers, priority, owner, \
             {}, {now}, {now} FROM outbox_archive WHERE id IN ({}) ORDER BY id",
            param(C::PLACEHOLDERS, 1),
            params(C::PLACEHOLDERS, 2, chunk.len()),
            now = C::NOW,
        );
        let mut binds = vec![Bind::Text(target)];
        binds.extend(chunk.iter().map(|id| Bind::BigInt(*id)));
        enqueued += c.execute_built(&sql, &binds)?;
    }
    Ok(enqueued)
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
        assert_eq!(params(Placeholders::Numbered, 3, 3), "$3, $4, $5");
    }
}
