//! The worker's storage on Diesel: claims with leases, batched settlements, `LISTEN`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::r2d2::{ManageConnection, Pool};
use diesel::{Connection, QueryResult};
use outbox_core::store::{
    Backlog, ClaimLimit, ClaimToken, ClaimedMessage, DestinationReport, Listener, Notifications,
    Outcome, Paused, Pauses, Pruned, SettleTarget, Settlement, SharedDestinations, SharedTurns,
    Store, StoreError, StoredDestination, Subscriptions, SuccessorLease, SyncedDestination,
    TransactionalSettlement, Turns,
};
use outbox_core::subscription::Subscription;
use outbox_core::{Headers, MessageId, ProcessError};

use crate::claim_cursor::{ClaimCursor, Listening};
#[cfg(feature = "postgres")]
use crate::connection::BackendConnection;
use crate::connection::{execute_batch, with_backend, Backend, OutboxConnection};
use crate::delivery_log::{DeliveryLog, DeliveryLogRetention};
use crate::error::Error;
use crate::fan_outs::{self, FanOut, FanOuts, RunFanOuts};
use crate::held::{HeldConnections, ListenerConnection, Role};
use crate::idempotency::{self, SweepCursor, DEFAULT_IDEMPOTENCY_WINDOW};
use crate::retention::Retention;
use crate::sql::codec::{
    backlog_of, parse_message_id, paused_from_rows, priority_from_level, time_from_micros,
};
use crate::sql::subscription::{SubscriptionRow, SubscriptionStatements as _};
use crate::sql::Keeping;
use crate::sql::{self, micros, Claim, ClaimRow, Statements, Successors};

/// The outbox tables behind an r2d2 pool, as the worker's [`Store`].
///
/// The pool may be the application's own, of any manager whose connections are
/// [`OutboxConnection`]s: Diesel's `ConnectionManager<PgConnection>` (or MySQL, SQLite), or
/// [`OutboxManager`](crate::OutboxManager) of a `MultiConnection` enum. The worker holds four
/// of its connections for its lifetime (the claimer's, the acker's, the housekeeper's and, on
/// PostgreSQL, the `LISTEN` connection) and briefly one more at start-up, so size the pool for
/// the worker plus the application.
///
/// On PostgreSQL, claims and settlements commit without waiting for the WAL flush
/// (`synchronous_commit = off` for those transactions only, never the session): a database
/// crash can undo the last of them, which makes those messages run again but loses none.
///
/// # Claims while a transaction is held open elsewhere
///
/// Claimed and settled messages leave dead entries in the due index until vacuum (PostgreSQL)
/// or purge (InnoDB) removes them, and a transaction held open anywhere in the database (a
/// report, a `pg_dump`, a session idle in a transaction) keeps them from removing any. Claims
/// therefore read the due index from a cursor (where the last claim found its first due message)
/// rather than from its start, and their cost stays flat however long the transaction lasts. A
/// message whose transaction commits after claims passed its due time is found through the
/// notification its commit sends on PostgreSQL (it carries the transaction's clock and steps
/// the cursor back); without a listener (MySQL) claims read a second behind the cursor; and
/// every backlog sample (the worker's housekeeper, on its own connection, every
/// `backlog_interval`) steps the cursor back to the oldest due message if claims passed it. SQLite
/// removes index entries at once and always reads from the start.
///
/// On PostgreSQL the claimer's connection plans without bitmap scans (`enable_bitmapscan = off`
/// for that session only, reset before the connection goes back to the pool): statistics taken
/// before a burst made a claim read and sort every due row instead of walking the due index in
/// order to its limit.
///
/// On PostgreSQL the store also lets its connections' cached query plans go every 10 seconds
/// (`DISCARD PLANS`; the prepared statements stay): a plan made while the outbox was empty
/// reads the whole table, which a held transaction grows by every settled row while no vacuum
/// can run to have the plan made again.
/// [`admin::backlog`](crate::admin::backlog) and the metrics report the oldest open transaction
/// and the dead rows, so that operators see what holds clean-up back.
pub struct DieselStore<M: ManageConnection> {
    /// Held per role, not checked out per call: a checkout costs a validation round trip
    /// (r2d2 pings). The housekeeper's chores (a backlog count, a prune) never hold up a claim;
    /// the handler threads take the turns of rate limits across processes one at a time (the
    /// destination's row lock takes them one at a time anyway), on a connection taken only once
    /// such a limit is.
    connections: HeldConnections<M>,
    /// Where the next claim reads from (see `sql::Cursor`).
    claim_cursor: ClaimCursor,
    /// The last group the last claim visited: the next visits the groups after it, so that
    /// every group gets its turn however many there are.
    groups_after: Mutex<String>,
    idempotency_window: Duration,
    idempotency_sweep: Mutex<SweepCursor>,
    retention: Retention,
    keeping: Keeping,
    /// Fan-outs waiting for the settlement connection, committed together.
    fan_outs: FanOuts,
}

impl<M: ManageConnection> fmt::Debug for DieselStore<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DieselStore")
            .field("pool", &self.connections.pool().state())
            .finish()
    }
}

impl<M> DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Send,
{
    /// A store over `pool`. Run [`run_migrations`](crate::run_migrations) first.
    pub fn new(pool: Pool<M>) -> Self {
        DieselStore {
            connections: HeldConnections::new(pool),
            claim_cursor: ClaimCursor::default(),
            groups_after: Mutex::new(String::new()),
            idempotency_window: DEFAULT_IDEMPOTENCY_WINDOW,
            idempotency_sweep: Mutex::new(SweepCursor::default()),
            retention: Retention::default(),
            keeping: Keeping::default(),
            fan_outs: FanOuts::default(),
        }
    }

    /// How long an idempotency key is remembered after its message settled (default
    /// [`DEFAULT_IDEMPOTENCY_WINDOW`], a day; at most a hundred years). The worker forgets keys
    /// past it; see [`idempotency`](crate::idempotency).
    pub fn idempotency_window(mut self, window: Duration) -> Self {
        self.idempotency_window = window;
        self
    }

    /// What the [delivery log](crate::delivery_log) keeps of each exchange with a destination
    /// (default [`DeliveryLog::All`]).
    pub fn delivery_log(mut self, log: DeliveryLog) -> Self {
        self.keeping.log = log;
        self
    }

    /// Keeps each message and event that leaves the outbox delivered in the archive for
    /// `window` after its enqueue (default: none kept), so that an operator can replay a range
    /// of them, or resend one, to one destination or subscription
    /// ([`delivery_log::replay`](crate::delivery_log::replay)). The copy is written in the
    /// transaction that removes the message; the worker prunes what is older than `window`.
    pub fn archive(mut self, window: Duration) -> Self {
        self.keeping.archive = true;
        self.retention.archive = Some(window);
        self
    }

    /// How long, and how many, attempts the [delivery log](crate::delivery_log) keeps (default
    /// 7 days and 1,000,000 attempts); the worker prunes the rest a bounded number every few
    /// seconds.
    pub fn delivery_log_retention(mut self, retention: DeliveryLogRetention) -> Self {
        self.retention.delivery_log = retention;
        self
    }

    /// Lets the worker delete dead letters that failed more than `age` ago, oldest first, a
    /// bounded number every few seconds (default: kept until an operator purges them; 30 days
    /// is a reasonable setting). See [`retention`](crate::retention).
    pub fn dead_letter_retention(mut self, age: Duration) -> Self {
        self.retention.dead_letters = Some(age);
        self
    }

    /// Lets the worker delete received webhook ids (the [inbox](crate::inbox)) recorded more
    /// than `age` ago, a bounded number every few seconds (default: kept until
    /// `sweep_inbox`; keep them longer than any sender retries, e.g. 7 days). See
    /// [`retention`](crate::retention).
    pub fn inbox_retention(mut self, age: Duration) -> Self {
        self.retention.inbox_ids = Some(age);
        self
    }

    /// Runs `settle`, a settlement, and where it `makes_due` a message at its transaction's clock
    /// steps the claim cursor back to where it stood before (see [`crate::claim_cursor`]).
    fn keeping_cursor<T>(&self, makes_due: bool, settle: impl FnOnce() -> T) -> T {
        let before = makes_due.then(|| self.claim_cursor.position());
        let settled = settle();
        if let Some(before) = before {
            self.claim_cursor.rewind(before);
        }
        settled
    }

    /// Dead-letters rows a claim or a settlement leased but that cannot be delivered, on the
    /// connection that leased them.
    fn dead_letter_unreadable(&self, role: Role, unreadable: &[Outcome]) -> Result<(), StoreError> {
        if unreadable.is_empty() {
            return Ok(());
        }
        log::error!(
            "outbox: dead-lettering {} unreadable rows (positions {:?})",
            unreadable.len(),
            unreadable.iter().map(|o| o.position).collect::<Vec<_>>()
        );
        self.connections
            .with(role, "dead-lettering unreadable rows", |conn| {
                with_backend!(conn.backend_connection(), c => {
                    sql::settle(c, unreadable, Keeping::NOTHING)
                })
            })
            .map(drop)
    }

    fn groups_after(&self) -> std::sync::MutexGuard<'_, String> {
        // Every update leaves the state whole: a panic elsewhere while it was locked left
        // nothing half-done.
        self.groups_after
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How long an exactly-once handler's message waits when the pool lent no connection for its
/// transaction.
const SHORT_OF_CONNECTIONS_WAIT: Duration = Duration::from_secs(1);

/// Whether settling `outcomes` may make a message due at the settlement's own clock, before it
/// commits (see [`crate::claim_cursor`]): a key's next message promoted, a message given back, a
/// retry or deferral whose delay is shorter than the settlement takes. A keyless message done,
/// dead-lettered or paused makes nothing due.
fn makes_due(outcomes: &[Outcome]) -> bool {
    outcomes.iter().any(|outcome| match outcome.settlement {
        Settlement::Done | Settlement::DeadLetter { .. } => outcome.ordering_key.is_some(),
        Settlement::Pause { .. } => false,
        Settlement::Retry { .. } | Settlement::Defer { .. } | Settlement::Release => true,
    })
}

impl<M> Store for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Connection + Send,
{
    fn check(&self, connections: usize) -> Result<(), StoreError> {
        self.connections.expect(connections);
        let pool = self.connections.pool();
        let max = usize::try_from(pool.max_size()).unwrap_or(usize::MAX);
        let state = pool.state();
        let in_use = usize::try_from(state.connections.saturating_sub(state.idle_connections))
            .unwrap_or(usize::MAX);
        if max < connections + in_use && max >= connections {
            return Err(StoreError::new(
                "the connection pool is too small for the worker beside the application",
                format!(
                    "it lends at most {max} connections, the application holds {in_use} of them \
                     now, and the worker holds {connections} for as long as it runs (its \
                     claimer's, its acker's and its housekeeper's, on PostgreSQL its LISTEN \
                     connection, and one for the turns of rate limits across processes if it \
                     has any); build the pool with max_size({}) or more",
                    connections + in_use
                ),
            ));
        }
        if max < connections {
            return Err(StoreError::new(
                "the connection pool is too small for the worker",
                format!(
                    "it lends at most {max} connections, and the worker holds {connections} for \
                     as long as it runs (its claimer's, its acker's and its housekeeper's, on \
                     PostgreSQL its LISTEN connection, and one for the turns of rate limits \
                     across processes if it has any); build the pool with \
                     max_size({connections}) plus what the application needs at once"
                ),
            ));
        }
        let postgres = self.connections.backend()? == Backend::Postgres;
        let mut conn = self.connections.connection()?;
        // The newest table and column: a schema that has them is current.
        execute_batch(&mut *conn, "SELECT paused FROM outbox_message WHERE 1 = 0")
            .and_then(|_| execute_batch(&mut *conn, "SELECT 1 FROM outbox_pause WHERE 1 = 0"))
            .and_then(|_| execute_batch(&mut *conn, "SELECT 1 FROM outbox_failure WHERE 1 = 0"))
            .and_then(|_| {
                execute_batch(
                    &mut *conn,
                    "SELECT settled_at FROM outbox_idempotency WHERE 1 = 0",
                )
            })
            .and_then(|_| {
                execute_batch(
                    &mut *conn,
                    "SELECT kind, last_turn FROM outbox_destination WHERE 1 = 0",
                )
            })
            .and_then(|_| {
                execute_batch(
                    &mut *conn,
                    "SELECT resumed_at, subscription_id FROM outbox_message WHERE 1 = 0",
                )
            })
            .and_then(|_| {
                execute_batch(&mut *conn, "SELECT 1 FROM outbox_subscription WHERE 1 = 0")
            })
            .and_then(|_| {
                execute_batch(
                    &mut *conn,
                    "SELECT started_at FROM outbox_attempt WHERE 1 = 0",
                )
            })
            .and_then(|_| {
                execute_batch(
                    &mut *conn,
                    "SELECT archived_at FROM outbox_archive WHERE 1 = 0",
                )
            })
            .and_then(|_| {
                if postgres {
                    execute_batch(
                        &mut *conn,
                        "SELECT leased_until FROM outbox_message WHERE 1 = 0",
                    )
                } else {
                    Ok(())
                }
            })
            .map_err(|e| {
                StoreError::new(
                    "the outbox tables are missing, out of date or unreadable (run \
                     outbox_diesel::run_migrations first)",
                    e,
                )
            })?;
        let refusal = with_backend!(conn.backend_connection(), c => c.refusing_setting())
            .map_err(|e| StoreError::new("reading the server's settings", e))?;
        match refusal {
            Some(setting) => Err(StoreError::new(
                "the database server is set up in a way that refuses the worker's statements",
                setting,
            )),
            None => Ok(()),
        }
    }

    fn claim(
        &self,
        token: ClaimToken,
        limit: ClaimLimit,
        lease: Duration,
    ) -> Result<Vec<ClaimedMessage>, StoreError> {
        let token_text = token.to_string();
        let groups_after = self.groups_after().clone();
        let claim = Claim {
            token: &token_text,
            limit,
            lease_micros: micros(lease),
            groups_after: &groups_after,
        };
        let from = self.claim_cursor.start(Instant::now());
        let claimed = self.connections.with(
            Role::Claims,
            "claiming messages",
            |conn| with_backend!(conn.backend_connection(), c => c.claim(&claim, from)),
        )?;
        if let Some(first) = claimed.first {
            self.claim_cursor.advance(first);
        }
        if let Some(last_group) = claimed.last_group {
            *self.groups_after() = last_group;
        }
        let (claimed, unreadable) = read_claimed(token, claimed.rows);
        self.dead_letter_unreadable(Role::Claims, &unreadable)?;
        Ok(claimed)
    }

    fn settle(&self, outcomes: &[Outcome]) -> Result<Vec<i64>, StoreError> {
        self.keeping_cursor(makes_due(outcomes), || {
            self.connections
                .with(Role::Settlements, "settling processed messages", |conn| {
                    with_backend!(conn.backend_connection(), c => {
                        sql::settle(c, outcomes, self.keeping)
                    })
                })
        })
    }

    fn settle_and_lease(
        &self,
        outcomes: &[Outcome],
        successors: &SuccessorLease,
    ) -> Result<(Vec<i64>, Vec<ClaimedMessage>), StoreError> {
        let token_text = successors.token.to_string();
        let leasing = Successors {
            claim: Claim {
                token: &token_text,
                limit: ClaimLimit {
                    messages: outcomes.len() * successors.per_key.max(1),
                    bytes: successors.max_bytes,
                    oversized_alone: false,
                },
                lease_micros: micros(successors.lease),
                groups_after: "",
            },
            per_key: successors.per_key,
        };
        let (fenced, rows) = self.keeping_cursor(makes_due(outcomes), || {
            self.connections
                .with(Role::Settlements, "settling processed messages", |conn| {
                    with_backend!(conn.backend_connection(), c => {
                        sql::settle_leasing(c, outcomes, Some(&leasing), self.keeping)
                    })
                })
        })?;
        let (mut leased, unreadable) = read_claimed(successors.token, rows);
        leased.sort_by_key(|message| message.position);
        self.dead_letter_unreadable(Role::Settlements, &unreadable)?;
        Ok((fenced, leased))
    }

    fn extend_leases(
        &self,
        leases: &[(ClaimToken, i64)],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        self.connections.with(
            Role::Settlements,
            "renewing leases",
            |conn| with_backend!(conn.backend_connection(), c => extend_leases(c, leases, lease)),
        )
    }

    fn ping(&self) -> Result<(), StoreError> {
        self.connections
            .with(Role::Settlements, "checking the database", |conn| {
                execute_batch(&mut **conn, "SELECT 1")
            })
    }

    fn promote_stranded(&self) -> Result<usize, StoreError> {
        self.keeping_cursor(true, || {
            self.connections.with(
                Role::Chores,
                "promoting stranded ordering keys",
                |conn| with_backend!(conn.backend_connection(), c => c.promote_stranded()),
            )
        })
    }

    fn prune(&self) -> Result<Pruned, StoreError> {
        let mut cursor = self
            .idempotency_sweep
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.connections
            .with(Role::Chores, "pruning expired rows", |conn| {
                with_backend!(conn.backend_connection(), c => {
                    let mut pruned = self.retention.prune(c)?;
                    pruned.idempotency_keys =
                        idempotency::sweep(c, &mut cursor, self.idempotency_window)?;
                    pruned.empty_groups = c.remove_empty_groups()?;
                    Ok(pruned)
                })
            })
    }

    fn backlog(&self) -> Result<Option<Backlog>, StoreError> {
        self.connections
            .with(Role::Chores, "sampling the backlog", |conn| {
                with_backend!(conn.backend_connection(), c => {
                    let row = c.backlog()?;
                    // A role that may not see other sessions still samples the backlog.
                    let horizon = c.horizon().unwrap_or_default();
                    Ok((row.oldest_due_at, backlog_of(&row, &horizon)))
                })
            })
            .map(|(oldest_due_at, backlog)| {
                // The claims' safety net: the oldest due message, read off their path.
                if let Some(due_micros) = oldest_due_at {
                    self.claim_cursor.rewind(due_micros);
                }
                Some(backlog)
            })
    }

    fn connection_shortage(&self) -> Option<String> {
        self.connections.shortage_report()
    }
}

impl<M> SharedDestinations for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Connection + Send,
{
    fn sync_destinations(
        &self,
        destinations: &[SyncedDestination<'_>],
        reconcile: &mut dyn FnMut(&[StoredDestination]) -> Vec<DestinationReport>,
    ) -> Result<(), StoreError> {
        self.connections.with(
            Role::Chores,
            "sharing the destinations' health",
            |conn| with_backend!(conn.backend_connection(), c => sql::sync_destinations(c, destinations, reconcile)),
        )
    }
}

impl<M> SharedTurns for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Connection + Send,
{
    fn take_turn(
        &self,
        name: &str,
        kind: &str,
        take: &mut dyn FnMut(Option<Turns>, i64) -> Turns,
    ) -> Result<(), StoreError> {
        self.connections.with(
            Role::Turns,
            "taking a turn of a rate limit across processes",
            |conn| with_backend!(conn.backend_connection(), c => sql::take_turn(c, name, kind, take)),
        )
    }
}

impl<M> Pauses for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Connection + Send,
{
    fn paused(&self) -> Result<Paused, StoreError> {
        let rows = self.connections.with(
            Role::Chores,
            "reading pauses",
            |conn| with_backend!(conn.backend_connection(), c => c.pauses()),
        )?;
        Ok(paused_from_rows(rows))
    }

    fn release_paused(&self) -> Result<usize, StoreError> {
        let released = self.connections.with(
            Role::Chores,
            "making resumed messages due again",
            |conn| with_backend!(conn.backend_connection(), c => c.release_paused()),
        )?;
        // A resume makes its messages due at its transaction's clock, which claims may have
        // passed since: the next claim reads from the start of the due index.
        self.claim_cursor.rewind(0);
        Ok(released)
    }
}

impl<M> Subscriptions for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Connection + Send,
{
    fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        let rows = self.connections.with(
            Role::Chores,
            "reading subscriptions",
            |conn| with_backend!(conn.backend_connection(), c => c.subscriptions(None)),
        )?;
        Ok(rows.iter().map(SubscriptionRow::to_subscription).collect())
    }

    fn fan_out(&self, target: &SettleTarget<'_>) -> Result<Option<usize>, StoreError> {
        self.fan_outs
            .fan_out(target.position, target.token.to_string(), self)
    }

    fn release_subscription(&self, id: &str) -> Result<usize, StoreError> {
        let released = self.connections.with(
            Role::Chores,
            "making an enabled subscription's deliveries due",
            |conn| with_backend!(conn.backend_connection(), c => c.release_subscription(id)),
        )?;
        // Due at the statement's clock, which claims may have passed.
        self.claim_cursor.rewind(0);
        Ok(released)
    }
}

impl<M> Notifications for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Connection + Send,
{
    fn listens(&self) -> bool {
        matches!(self.connections.backend(), Ok(Backend::Postgres))
    }

    fn listen(&self) -> Result<Option<Box<dyn Listener>>, StoreError> {
        if self.connections.backend()? != Backend::Postgres {
            return Ok(None);
        }
        let mut conn = self.connections.listener_connection()?;
        execute_batch(&mut *conn.conn, "LISTEN outbox_message")
            .map_err(|e| StoreError::new("listening for new messages", e))?;
        Ok(Some(Box::new(NotificationListener {
            conn,
            listening: self.claim_cursor.listening(),
            checked: Instant::now(),
            last_notified: Instant::now(),
        })))
    }

    fn wants_local_wakeups(&self) -> bool {
        !self.listens()
    }
}

impl<M> TransactionalSettlement for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Connection + Send,
{
    type Connection = M::Connection;

    fn settle_within(
        &self,
        message: &SettleTarget<'_>,
        work: &mut dyn FnMut(&mut M::Connection) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessError> {
        let lent = self.connections.transaction_connection().map_err(|error| {
            ProcessError::retryable(format!(
                "{error}; an exactly-once handler takes a connection of its own while it runs"
            ))
        })?;
        let mut conn = lent.map_err(|shortage| {
            // Not the message's failure: it waits for a connection without spending an attempt.
            ProcessError::defer(
                format!(
                    "not processed: no connection for its exactly-once transaction ({shortage}); \
                     an exactly-once handler takes a connection of its own while it runs, so \
                     the pool needs one per handler thread beside the worker's own"
                ),
                SHORT_OF_CONNECTIONS_WAIT,
            )
        })?;
        let claims = [(message.token.to_string(), vec![message.position])];
        let keys: Vec<&str> = message.ordering_key.into_iter().collect();
        let mut outcome = Ok(());
        // The key's next message is promoted at the transaction's clock.
        let promotes = message.ordering_key.is_some();
        // Begun to write (`BEGIN IMMEDIATE` on SQLite): the work may read first, and a
        // deferred transaction whose read the worker's commit made stale cannot write after.
        let archive = self.keeping.archive;
        let committed = self.keeping_cursor(promotes, || {
            crate::write_transaction::<_, _, diesel::result::Error, _>(&mut *conn, |c| {
                outcome = work(c);
                if outcome.is_err() {
                    return Err(diesel::result::Error::RollbackTransaction);
                }
                // Removed last, fenced by the claim: while the work runs, the transaction holds no
                // lock on the message's row, so the worker's heartbeat and a watchdog's settlement
                // of a hung attempt never wait on it; a claim that lost its lease meanwhile removes
                // nothing, and its work rolls back.
                let removed = with_backend!(c.backend_connection(), b => {
                    if archive {
                        sql::delivery_log::archive(b, &claims)?;
                    }
                    let removed = b.delete_done(&claims, &keys)?;
                    b.keep_commit_durable()?;
                    removed
                });
                if removed == 0 {
                    outcome = Err(ProcessError::retryable(
                        "the lease on this message passed to another claim while the handler \
                     worked; its transaction rolled back, and the claim that holds the message \
                     now does the work",
                    ));
                    return Err(diesel::result::Error::RollbackTransaction);
                }
                Ok(())
            })
        });
        match committed {
            Ok(()) => Ok(()),
            Err(diesel::result::Error::RollbackTransaction) if outcome.is_err() => outcome,
            Err(error) => Err(ProcessError::retryable(format!(
                "the handler's transaction failed and rolled back: {error}"
            ))),
        }
    }
}

/// Renews the leases of each claim; returns the positions another claim holds now. A position
/// not renewed because it was settled or given back meanwhile (the worker's own settlement
/// racing its heartbeat) is not lost to anyone and is not returned.
fn extend_leases<C: Statements>(
    c: &mut C,
    leases: &[(ClaimToken, i64)],
    lease: Duration,
) -> QueryResult<Vec<i64>> {
    let mut by_claim: std::collections::BTreeMap<ClaimToken, Vec<i64>> = Default::default();
    for (token, position) in leases {
        by_claim.entry(*token).or_default().push(*position);
    }
    let mut lost = Vec::new();
    for (token, positions) in by_claim {
        let token = token.to_string();
        for chunk in positions.chunks(sql::ID_CHUNK) {
            let renewed = c.extend_leases(&token, chunk, micros(lease))?;
            let missed: Vec<i64> = chunk
                .iter()
                .copied()
                .filter(|p| !renewed.contains(p))
                .collect();
            if !missed.is_empty() {
                lost.extend(c.held_by_others(&token, &missed)?);
            }
        }
    }
    Ok(lost)
}

/// A pooled connection that `LISTEN`s on the channel the outbox table's trigger notifies.
struct NotificationListener<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    conn: ListenerConnection<M>,
    /// Each notification steps the store's claim cursor back to the committed transaction's
    /// clock (see [`crate::claim_cursor`]).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    listening: Listening,
    checked: Instant,
    last_notified: Instant,
}

/// How often the listener proves its connection alive: reading notifications never notices a
/// connection whose server vanished without closing it, and wake-ups would silently stop.
const LISTEN_HEALTH_CHECK: Duration = Duration::from_secs(30);

/// How often the listener checks its socket while notifications come (the wake-up latency it
/// adds at most), and when none came for [`LISTEN_QUIET_AFTER`]. Checking reads only what the
/// server already sent (no round trip); Diesel gives no way to block on the socket, so an idle
/// worker checks 50 times a second instead of 1,000.
const LISTEN_BUSY_CHECK: Duration = Duration::from_millis(1);
const LISTEN_QUIET_CHECK: Duration = Duration::from_millis(20);
const LISTEN_QUIET_AFTER: Duration = Duration::from_secs(1);

impl<M> Listener for NotificationListener<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Send,
{
    fn wait(&mut self, timeout: Duration) -> Result<bool, StoreError> {
        if self.checked.elapsed() >= LISTEN_HEALTH_CHECK {
            execute_batch(&mut *self.conn.conn, "SELECT 1")
                .map_err(|e| StoreError::new("checking the notification connection", e))?;
            self.checked = Instant::now();
        }
        let until = Instant::now() + timeout;
        loop {
            if self.drain()? {
                self.last_notified = Instant::now();
                return Ok(true);
            }
            let now = Instant::now();
            if now >= until {
                return Ok(false);
            }
            let pause = if self.last_notified.elapsed() < LISTEN_QUIET_AFTER {
                LISTEN_BUSY_CHECK
            } else {
                LISTEN_QUIET_CHECK
            };
            std::thread::sleep(pause.min(until - now));
        }
    }
}

impl<M> NotificationListener<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Send,
{
    fn drain(&mut self) -> Result<bool, StoreError> {
        match self.conn.conn.backend_connection() {
            #[cfg(feature = "postgres")]
            BackendConnection::Pg(c) => {
                let mut any = false;
                for notification in c.notifications_iter() {
                    let notification =
                        notification.map_err(|e| StoreError::new("receiving notifications", e))?;
                    // Another version's trigger may send no time: the sweep finds its messages.
                    if let Ok(due_micros) = notification.payload.parse::<i64>() {
                        self.listening.cursor().rewind(due_micros);
                    }
                    any = true;
                }
                Ok(any)
            }
            #[allow(unreachable_patterns)]
            _ => Ok(false),
        }
    }
}

impl<M: ManageConnection> Drop for NotificationListener<M>
where
    M::Connection: OutboxConnection,
{
    fn drop(&mut self) {
        // The connection goes back to the pool: it must not keep receiving notifications.
        let _ = execute_batch(&mut *self.conn.conn, "UNLISTEN *");
    }
}

/// Leased rows as messages for the handlers, in the order given (a claim's: priority, then
/// position), and the rows that cannot be
/// delivered (edited by hand: a message id or headers the library did not write) as
/// dead-letter outcomes: such a row must not hold up the others or its key.
fn read_claimed(token: ClaimToken, rows: Vec<ClaimRow>) -> (Vec<ClaimedMessage>, Vec<Outcome>) {
    let mut claimed = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for row in rows {
        let ClaimRow {
            message: m,
            created_micros,
            resumed_micros,
            subscription_id,
            priority,
        } = row;
        let readable = parse_message_id("outbox_message", m.id, &m.message_id).and_then(|id| {
            let headers =
                Headers::from_json(m.headers.as_deref()).map_err(|error| Error::InvalidRow {
                    table: "outbox_message",
                    id: m.id,
                    reason: format!("its headers cannot be delivered: {error}"),
                })?;
            Ok((id, headers))
        });
        match readable {
            Ok((message_id, headers)) => claimed.push(ClaimedMessage {
                message_id,
                headers,
                position: m.id,
                message_type: m.message_type,
                payload: m.payload,
                ordering_key: m.ordering_key,
                attempt: m.attempts.max(0).unsigned_abs(),
                enqueued_at: time_from_micros(created_micros),
                resumed_at: resumed_micros.map(time_from_micros),
                subscription_id,
                priority: priority_from_level(priority),
            }),
            Err(error) => unreadable.push(Outcome {
                token,
                position: m.id,
                message_id: MessageId::from(uuid::Uuid::nil()),
                ordering_key: m.ordering_key,
                log: None,
                settlement: Settlement::DeadLetter {
                    error: format!("the row cannot be delivered: {error}"),
                },
            }),
        }
    }
    (claimed, unreadable)
}

/// Fan-outs run on the settlement connection. The deliveries are due at the transaction's
/// clock, and each event's key's next message is promoted at it: the claim cursor steps back.
impl<M> RunFanOuts for DieselStore<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Send,
{
    fn together(&self, group: &[Arc<FanOut>]) -> Result<Vec<Option<usize>>, StoreError> {
        let archive = self.keeping.archive;
        self.keeping_cursor(true, || {
            self.connections.with(
                Role::Settlements,
                "fanning events out to their subscribers",
                |conn| {
                    with_backend!(conn.backend_connection(), c => {
                        c.settle_transaction(|c| {
                            fan_outs::each(c, group, |c, position, token| {
                                sql::subscription::fan_out(c, position, token, archive)
                            })
                        })
                    })
                },
            )
        })
    }

    fn alone(&self, fan_out: &FanOut) -> Result<Option<usize>, StoreError> {
        let archive = self.keeping.archive;
        self.keeping_cursor(true, || {
            self.connections.with(
                Role::Settlements,
                "fanning an event out to its subscribers",
                |conn| {
                    with_backend!(conn.backend_connection(), c => {
                        c.settle_transaction(|c| {
                            sql::subscription::fan_out(
                                c,
                                fan_out.position,
                                &fan_out.token,
                                archive,
                            )
                        })
                    })
                },
            )
        })
    }
}
