//! The statements of cancelling pending messages ([`crate::admin::cancel`]) that every backend
//! shares in shape: which rows a cancel takes, the order of its statements, and what each
//! backend implements ([`CancelStatements`], in each backend's file beside its other
//! statements).

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryResult;

use super::bind::Bind;
use super::Statements;

/// The pending messages a cancel takes: every filter given must hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CancelRows<'a> {
    /// The message id (a UUID's text): every row of it, the event and its deliveries alike.
    pub(crate) message_id: Option<&'a str>,
    pub(crate) message_type: Option<&'a str>,
    /// Deliveries for this subscription.
    pub(crate) subscription: Option<&'a str>,
    /// Enqueued at least this many µs ago.
    pub(crate) older_than_micros: Option<i64>,
    /// At most this many rows a transaction.
    pub(crate) limit: i64,
}

impl<'a> CancelRows<'a> {
    /// The binds of the filters, in every backend's order: message id, type, subscription, age.
    pub(crate) fn filter_binds(&self) -> [Bind<'a>; 4] {
        [
            Bind::NullableText(self.message_id),
            Bind::NullableText(self.message_type),
            Bind::NullableText(self.subscription),
            Bind::NullableBigInt(self.older_than_micros),
        ]
    }

    /// The binds of the statement that finds the rows a cancel takes: the filters, then the
    /// limit.
    pub(crate) fn cancellable_binds(&self) -> [Bind<'a>; 5] {
        let [id, kind, subscription, age] = self.filter_binds();
        [id, kind, subscription, age, Bind::BigInt(self.limit)]
    }
}

/// A pending row a cancel takes: its position and ordering key.
#[derive(diesel::QueryableByName, Debug)]
pub(crate) struct KeyedRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) ordering_key: Option<String>,
}

/// What each backend implements for cancels.
pub(crate) trait CancelStatements: Statements {
    /// The rows of `rows` no claim holds, locked for the transaction (skipping those another
    /// transaction holds), oldest first.
    fn cancellable(&mut self, rows: &CancelRows<'_>) -> QueryResult<Vec<KeyedRow>>;

    /// How many rows of `rows` a claim holds now (a worker is delivering them).
    fn cancel_in_flight(&mut self, rows: &CancelRows<'_>) -> QueryResult<i64>;

    /// Moves the rows at `ids` to `outbox_cancelled` with `reason`; how many.
    fn move_to_cancelled(&mut self, ids: &[i64], reason: &str) -> QueryResult<usize>;

    /// Runs `body` in a transaction that commits durably and, on SQLite, writes from its start.
    fn cancel_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T>;
}

/// Cancels one batch of `rows` inside the caller's transaction: moves them to
/// `outbox_cancelled` and lets each key whose head went move on. How many.
pub(crate) fn cancel_batch<C: CancelStatements>(
    c: &mut C,
    rows: &CancelRows<'_>,
    reason: &str,
) -> QueryResult<usize> {
    let found = c.cancellable(rows)?;
    if found.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = found.iter().map(|row| row.id).collect();
    let moved = c.move_to_cancelled(&ids, reason)?;
    let mut keys: Vec<&str> = found
        .iter()
        .filter_map(|row| row.ordering_key.as_deref())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if !keys.is_empty() {
        c.promote_heads(&keys)?;
    }
    Ok(moved)
}
