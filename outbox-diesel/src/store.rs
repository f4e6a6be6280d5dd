//! The worker's storage on Diesel: claims with leases, batched settlements, `LISTEN`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection, R2D2Connection};
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};
use outbox_core::{ClaimToken, ClaimedMessage, Listener, Outcome, Settlement, Store, StoreError};

use crate::admin::parse_message_id;
use crate::connection::{
    with_backend, Backend, BackendConnection, Bind, Dialect, OutboxConnection, RawSql,
    SQLITE_BUSY_TIMEOUT_MS,
};

/// Only the first pending message of each ordering key is claimable, so a key's messages run
/// one at a time, in order, and a key whose head is retrying waits for it.
const HEAD_OF_ITS_KEY: &str = "(m.ordering_key IS NULL OR NOT EXISTS (\
     SELECT 1 FROM outbox_message e WHERE e.ordering_key = m.ordering_key AND e.id < m.id))";

type Pooled<C> = PooledConnection<ConnectionManager<C>>;

/// The outbox tables behind an r2d2 pool, as the worker's [`Store`].
///
/// The worker holds three connections of the pool for its lifetime (the claimer's, the
/// acker's and, on PostgreSQL, the `LISTEN` connection) and briefly a fourth at start-up, so
/// give the worker a pool of its own (4 connections) or size the application's pool for it.
///
/// On PostgreSQL, claims and settlements commit without waiting for the WAL flush
/// (`synchronous_commit = off` for those transactions only, never the session): a database
/// crash can undo the last of them, which makes those messages run again but loses none.
pub struct DieselStore<C: R2D2Connection + 'static> {
    pool: Pool<ConnectionManager<C>>,
    backend: OnceLock<Backend>,
    // Held, not checked out per call: a checkout costs a validation round trip (r2d2 pings).
    claim_connection: Mutex<Option<Pooled<C>>>,
    settle_connection: Mutex<Option<Pooled<C>>>,
}

impl<C: R2D2Connection + 'static> fmt::Debug for DieselStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DieselStore")
            .field("pool", &self.pool.state())
            .finish()
    }
}

impl<C> DieselStore<C>
where
    C: OutboxConnection + R2D2Connection + Send + 'static,
{
    /// A store over `pool`. Run [`run_migrations`](crate::run_migrations) first.
    pub fn new(pool: Pool<ConnectionManager<C>>) -> Self {
        DieselStore {
            pool,
            backend: OnceLock::new(),
            claim_connection: Mutex::new(None),
            settle_connection: Mutex::new(None),
        }
    }

    /// Runs `work` on the connection held in `slot`, taking one from the pool if there is none;
    /// after a failure the connection is let go, as it may be broken.
    fn with_held<T>(
        &self,
        slot: &Mutex<Option<Pooled<C>>>,
        what: &'static str,
        work: impl FnOnce(&mut Pooled<C>) -> QueryResult<T>,
    ) -> Result<T, StoreError> {
        let mut slot = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let conn = match slot.as_mut() {
            Some(conn) => conn,
            None => slot.insert(self.connection()?),
        };
        work(conn).map_err(|error| {
            *slot = None;
            StoreError::new(what, error)
        })
    }

    /// The pool's backend, asked of its first connection.
    fn backend(&self) -> Result<Backend, StoreError> {
        if let Some(backend) = self.backend.get() {
            return Ok(*backend);
        }
        let mut conn = self
            .pool
            .get()
            .map_err(|e| StoreError::new("getting a connection from the pool", e))?;
        Ok(*self.backend.get_or_init(|| conn.backend()))
    }

    fn connection(&self) -> Result<PooledConnection<ConnectionManager<C>>, StoreError> {
        let mut conn = self
            .pool
            .get()
            .map_err(|e| StoreError::new("getting a connection from the pool", e))?;
        if *self.backend.get_or_init(|| conn.backend()) == Backend::Sqlite {
            conn.batch_execute(&format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}"))
                .map_err(|e| StoreError::new("setting the SQLite busy timeout", e))?;
        }
        Ok(conn)
    }
}

impl<C> Store for DieselStore<C>
where
    C: OutboxConnection + R2D2Connection + Send + 'static,
{
    fn claim(
        &self,
        token: ClaimToken,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<ClaimedMessage>, StoreError> {
        let rows = self.with_held(&self.claim_connection, "claiming messages", |conn| {
            claim(conn.backend_connection(), token, limit, lease)
        })?;
        let mut claimed = rows
            .into_iter()
            .map(|row| {
                Ok(ClaimedMessage {
                    message_id: parse_message_id("outbox_message", row.id, &row.message_id)
                        .map_err(|e| StoreError::new("reading a claimed message", e))?,
                    position: row.id,
                    message_type: row.message_type,
                    payload: row.payload,
                    ordering_key: row.ordering_key,
                    attempt: row.attempts.max(0).unsigned_abs(),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        claimed.sort_by_key(|message| message.position);
        Ok(claimed)
    }

    fn settle(&self, outcomes: &[Outcome]) -> Result<Vec<i64>, StoreError> {
        self.with_held(
            &self.settle_connection,
            "settling processed messages",
            |conn| settle(conn.backend_connection(), outcomes),
        )
    }

    fn check(&self) -> Result<(), StoreError> {
        let mut conn = self.connection()?;
        conn.batch_execute("SELECT 1 FROM outbox_message WHERE 1 = 0")
            .and_then(|_| conn.batch_execute("SELECT 1 FROM outbox_failure WHERE 1 = 0"))
            .map_err(|e| {
                StoreError::new(
                    "the outbox tables are missing or unreadable (run \
                     outbox_diesel::run_migrations first)",
                    e,
                )
            })
    }

    fn listen(&self) -> Result<Option<Box<dyn Listener>>, StoreError> {
        if self.backend()? != Backend::Postgres {
            return Ok(None);
        }
        let mut conn = self.connection()?;
        conn.batch_execute("LISTEN outbox_message")
            .map_err(|e| StoreError::new("listening for new messages", e))?;
        Ok(Some(Box::new(NotificationListener {
            conn,
            checked: Instant::now(),
        })))
    }

    fn wants_local_wakeups(&self) -> bool {
        !matches!(self.backend(), Ok(Backend::Postgres))
    }
}

/// The columns every reading of a message row selects: claims, listings, dead letters.
#[derive(QueryableByName)]
pub(crate) struct MessageRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = Text)]
    pub(crate) payload: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) ordering_key: Option<String>,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
}

#[derive(QueryableByName)]
pub(crate) struct IdRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

pub(crate) fn id_list(ids: &[i64]) -> String {
    let mut list = String::with_capacity(ids.len() * 8);
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        list.push_str(&id.to_string());
    }
    list
}

fn claim(
    conn: BackendConnection<'_>,
    token: ClaimToken,
    limit: usize,
    lease: Duration,
) -> QueryResult<Vec<MessageRow>> {
    let token = token.to_string();
    let lease = micros(lease);
    match conn {
        #[cfg(feature = "postgres")]
        BackendConnection::Pg(c) => diesel::sql_query(format!(
            // The lease commits without waiting for the flush: see Dialect::async_commit_using.
            "WITH due AS (\
                SELECT id FROM outbox_message m \
                WHERE m.next_attempt_at <= now() AND {HEAD_OF_ITS_KEY} \
                ORDER BY m.next_attempt_at, m.id LIMIT {limit} \
                FOR UPDATE SKIP LOCKED) \
             UPDATE outbox_message o \
             SET locked_by = $1::uuid, attempts = o.attempts + 1, \
                 next_attempt_at = now() + $2 * INTERVAL '1 microsecond' \
             FROM due, {} WHERE o.id = due.id \
             RETURNING o.id, o.message_id::text AS message_id, o.message_type, \
                 o.payload::text AS payload, o.ordering_key, o.attempts",
            crate::connection::pg_async_commit!()
        ))
        .bind::<Text, _>(&token)
        .bind::<BigInt, _>(lease)
        .load(c),

        // MySQL has no UPDATE .. RETURNING, and a locking read would also lock (and, with SKIP
        // LOCKED, skip) the rows its NOT EXISTS looks at, breaking key order. So: find the heads
        // with a plain read, lock those still due, then lease them.
        #[cfg(feature = "mysql")]
        BackendConnection::Mysql(c) => {
            c.batch_execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
            c.write_transaction(|c| {
                // Twice the limit, locked a limit at a time: a worker claiming at the same
                // moment reads the same oldest heads and locks the first of them (a locking
                // read locks every row of its IN list); this claim then takes the next ones
                // instead of coming back empty.
                let candidates: Vec<IdRow> = diesel::sql_query(format!(
                    "SELECT id FROM outbox_message m \
                     WHERE m.next_attempt_at <= UTC_TIMESTAMP(6) AND {HEAD_OF_ITS_KEY} \
                     ORDER BY m.next_attempt_at, m.id LIMIT {}",
                    limit.saturating_mul(2)
                ))
                .load(c)?;
                let ids: Vec<i64> = candidates.iter().map(|row| row.id).collect();
                let mut rows: Vec<MessageRow> = Vec::new();
                for chunk in ids.chunks(limit.max(1)) {
                    let wanted = limit - rows.len();
                    rows.extend(
                        diesel::sql_query(format!(
                            "SELECT id, message_id, message_type, \
                                 CAST(payload AS CHAR) AS payload, ordering_key, attempts \
                             FROM outbox_message \
                             WHERE id IN ({}) AND next_attempt_at <= UTC_TIMESTAMP(6) \
                             ORDER BY next_attempt_at, id LIMIT {wanted} \
                             FOR UPDATE SKIP LOCKED",
                            id_list(chunk)
                        ))
                        .load::<MessageRow>(c)?,
                    );
                    if rows.len() >= limit {
                        break;
                    }
                }
                if rows.is_empty() {
                    return Ok(rows);
                }
                let locked: Vec<i64> = rows.iter().map(|row| row.id).collect();
                diesel::sql_query(format!(
                    "UPDATE outbox_message SET locked_by = ?, attempts = attempts + 1, \
                         next_attempt_at = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)) \
                     WHERE id IN ({})",
                    id_list(&locked)
                ))
                .bind::<Text, _>(&token)
                .bind::<BigInt, _>(lease)
                .execute(c)?;
                for row in &mut rows {
                    row.attempts += 1;
                }
                Ok(rows)
            })
        }

        #[cfg(feature = "sqlite")]
        BackendConnection::Sqlite(c) => c.immediate_transaction(|c| {
            diesel::sql_query(format!(
                "UPDATE outbox_message \
                 SET locked_by = ?, attempts = attempts + 1, next_attempt_at = {} \
                 WHERE id IN (\
                    SELECT id FROM outbox_message m \
                    WHERE m.next_attempt_at <= {} AND {HEAD_OF_ITS_KEY} \
                    ORDER BY m.next_attempt_at, m.id LIMIT {limit}) \
                 RETURNING id, message_id, message_type, payload, ordering_key, attempts",
                (crate::connection::SQLITE.now_plus_micros)("?"),
                crate::connection::SQLITE.now,
            ))
            .bind::<Text, _>(&token)
            .bind::<BigInt, _>(lease)
            .load(c)
        }),
    }
}

/// Applies every outcome atomically and returns the positions whose lease had passed to
/// another claim (fenced), which are left untouched.
fn settle(conn: BackendConnection<'_>, outcomes: &[Outcome]) -> QueryResult<Vec<i64>> {
    let d = conn.dialect();
    if outcomes
        .iter()
        .all(|outcome| outcome.settlement == Settlement::Done)
    {
        // The common case, in one statement and one round trip: no transaction to open and
        // commit around it.
        return with_backend!(conn, c => delete_done(c, d, outcomes));
    }
    with_backend!(conn, c => c.write_transaction(|c| {
        if let Some(async_commit) = d.async_commit_statement {
            c.run(async_commit, &[])?;
        }
        let mut fenced = Vec::new();
        apply_outcomes(c, d, outcomes, &mut fenced)?;
        Ok(fenced)
    }))
}

/// Deletes finished messages still leased under their claims, in one statement.
fn delete_done<C: RawSql>(c: &mut C, d: &Dialect, outcomes: &[Outcome]) -> QueryResult<Vec<i64>> {
    let mut by_claim: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for outcome in outcomes {
        by_claim
            .entry(outcome.token.to_string())
            .or_default()
            .push(outcome.position);
    }
    // Tokens are UUIDs and ids integers: written into the text they cannot inject anything,
    // and the statement needs no bind per message.
    let owned: Vec<String> = by_claim
        .iter()
        .map(|(token, positions)| {
            format!(
                "(locked_by = {} AND id IN ({}))",
                (d.uuid_param)(&format!("'{token}'")),
                id_list(positions)
            )
        })
        .collect();
    let sql = format!(
        "DELETE FROM outbox_message{} WHERE {}",
        d.async_commit_using,
        owned.join(" OR ")
    );
    let deleted = c.run(&sql, &[])?;
    if deleted == outcomes.len() {
        return Ok(Vec::new());
    }
    let positions: Vec<i64> = outcomes.iter().map(|outcome| outcome.position).collect();
    still_present(c, &positions)
}

/// The outcomes grouped: done and released messages in one statement per claim, retries and
/// dead letters one by one (they carry their own errors and delays, and are rare).
fn apply_outcomes<C: RawSql>(
    c: &mut C,
    d: &Dialect,
    outcomes: &[Outcome],
    fenced: &mut Vec<i64>,
) -> QueryResult<()> {
    let mut done: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut released: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for outcome in outcomes {
        let token = outcome.token.to_string();
        match &outcome.settlement {
            Settlement::Done => done.entry(token).or_default().push(outcome.position),
            Settlement::Release => released.entry(token).or_default().push(outcome.position),
            Settlement::Retry { delay, error } => {
                let sql = format!(
                    "UPDATE outbox_message SET locked_by = NULL, next_attempt_at = {}, \
                     last_error = {} WHERE id = {} AND locked_by = {}",
                    (d.now_plus_micros)(&(d.placeholder)(1)),
                    (d.placeholder)(2),
                    outcome.position,
                    (d.uuid_param)(&(d.placeholder)(3)),
                );
                let changed = c.run(
                    &sql,
                    &[
                        Bind::BigInt(micros(*delay)),
                        Bind::Text(error),
                        Bind::Text(&token),
                    ],
                )?;
                if changed == 0 {
                    fenced.push(outcome.position);
                }
            }
            Settlement::DeadLetter { error } => {
                let owned = format!(
                    "id = {} AND locked_by = {}",
                    outcome.position,
                    (d.uuid_param)(&(d.placeholder)(2))
                );
                let copy = format!(
                    "INSERT INTO outbox_failure (id, message_id, message_type, payload, \
                         ordering_key, attempts, last_error, created_at, failed_at) \
                     SELECT id, message_id, message_type, payload, ordering_key, attempts, {}, \
                         created_at, {} \
                     FROM outbox_message WHERE {owned}",
                    (d.placeholder)(1),
                    d.now,
                );
                let copied = c.run(&copy, &[Bind::Text(error), Bind::Text(&token)])?;
                if copied == 0 {
                    fenced.push(outcome.position);
                    continue;
                }
                let remove = format!(
                    "DELETE FROM outbox_message WHERE id = {} AND locked_by = {}",
                    outcome.position,
                    (d.uuid_param)(&(d.placeholder)(1))
                );
                c.run(&remove, &[Bind::Text(&token)])?;
            }
        }
    }
    for (token, positions) in &done {
        let sql = format!(
            "DELETE FROM outbox_message WHERE locked_by = {} AND id IN ({})",
            (d.uuid_param)(&(d.placeholder)(1)),
            id_list(positions)
        );
        let changed = c.run(&sql, &[Bind::Text(token)])?;
        if changed < positions.len() {
            fenced.extend(still_present(c, positions)?);
        }
    }
    for (token, positions) in &released {
        let sql = format!(
            "UPDATE outbox_message SET locked_by = NULL, next_attempt_at = {}, \
             attempts = attempts - 1 WHERE locked_by = {} AND id IN ({})",
            d.now,
            (d.uuid_param)(&(d.placeholder)(1)),
            id_list(positions)
        );
        let changed = c.run(&sql, &[Bind::Text(token)])?;
        if changed < positions.len() {
            // Released rows stay, so only those now leased to someone else were fenced.
            let sql = format!(
                "SELECT id FROM outbox_message WHERE id IN ({}) AND locked_by IS NOT NULL \
                 AND locked_by <> {}",
                id_list(positions),
                (d.uuid_param)(&(d.placeholder)(1))
            );
            fenced.extend(c.ids(&sql, &[Bind::Text(token)])?);
        }
    }
    Ok(())
}

/// After deleting a claim's finished rows: those still there belong to another claim.
fn still_present<C: RawSql>(c: &mut C, positions: &[i64]) -> QueryResult<Vec<i64>> {
    let sql = format!(
        "SELECT id FROM outbox_message WHERE id IN ({})",
        id_list(positions)
    );
    c.ids(&sql, &[])
}

/// A pooled connection that `LISTEN`s on the channel the outbox table's trigger notifies.
struct NotificationListener<C: R2D2Connection + 'static> {
    conn: PooledConnection<ConnectionManager<C>>,
    checked: Instant,
}

/// How often the listener proves its connection alive: reading notifications never notices a
/// connection whose server vanished without closing it, and wake-ups would silently stop.
const LISTEN_HEALTH_CHECK: Duration = Duration::from_secs(30);

/// How often the listener checks its socket: the wake-up latency it adds at most. Checking
/// reads only what the server already sent; it costs no round trip.
const LISTEN_CHECK_INTERVAL: Duration = Duration::from_millis(1);

impl<C> Listener for NotificationListener<C>
where
    C: OutboxConnection + R2D2Connection + Send + 'static,
{
    fn wait(&mut self, timeout: Duration) -> Result<bool, StoreError> {
        if self.checked.elapsed() >= LISTEN_HEALTH_CHECK {
            self.conn
                .batch_execute("SELECT 1")
                .map_err(|e| StoreError::new("checking the notification connection", e))?;
            self.checked = Instant::now();
        }
        let until = Instant::now() + timeout;
        loop {
            if self.drain()? {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            std::thread::sleep(LISTEN_CHECK_INTERVAL);
        }
    }
}

impl<C> NotificationListener<C>
where
    C: OutboxConnection + R2D2Connection + Send + 'static,
{
    fn drain(&mut self) -> Result<bool, StoreError> {
        match self.conn.backend_connection() {
            #[cfg(feature = "postgres")]
            BackendConnection::Pg(c) => {
                let mut any = false;
                for notification in c.notifications_iter() {
                    notification.map_err(|e| StoreError::new("receiving notifications", e))?;
                    any = true;
                }
                Ok(any)
            }
            #[allow(unreachable_patterns)]
            _ => Ok(false),
        }
    }
}

impl<C: R2D2Connection + 'static> Drop for NotificationListener<C> {
    fn drop(&mut self) {
        // The connection goes back to the pool: it must not keep receiving notifications.
        let _ = self.conn.batch_execute("UNLISTEN *");
    }
}
