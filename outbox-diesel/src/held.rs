//! The connections a worker holds from the application's pool, one per role, and what happens
//! when the pool cannot lend a role one of its own.
//!
//! Each role (the claimer, the acker, the housekeeper, the turns of rate limits across
//! processes) keeps a connection between calls: a checkout costs a validation round trip. A
//! role that has none (at start, or after its connection failed) takes one from the pool. When
//! every connection of the pool is in use (an application that keeps some of a pool sized for
//! the worker alone), the role does not wait: it runs its call on the connection another role
//! holds, one call at a time, so the worker keeps claiming and settling on the connections it
//! has. The shortage is logged as an error (again every minute while it lasts), reported in the
//! worker's health ([`HeldConnections::shortage`]) with what the worker and the application
//! hold, and over as soon as the pool lends the role its own again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use diesel::r2d2::{ManageConnection, Pool, PooledConnection};
use diesel::QueryResult;
use outbox_core::store::{StoreError, StoreErrorKind};

use crate::connection::{execute_batch, Backend, OutboxConnection};
use crate::database::ensure_busy_timeout;

/// The longest the worker waits for the pool to open a connection, or for an exactly-once
/// handler's connection: it retries after logging, and a shutdown is not held up by a pool the
/// application has exhausted.
pub(crate) const POOL_WAIT: Duration = Duration::from_secs(5);

/// How long a held PostgreSQL connection keeps its cached query plans (see [`HeldConnection`]).
const PLANS_KEPT: Duration = Duration::from_secs(10);

/// How long a role may go without its own connection before it counts as a shortage: the
/// application's requests take connections for moments, and a role that lost its connection to
/// an error finds the pool busy now and then.
const SHORTAGE_GRACE: Duration = Duration::from_secs(1);

/// How often a shortage that lasts is logged again.
const SHORTAGE_REMINDER: Duration = Duration::from_secs(60);

/// The claimer's session on PostgreSQL: no bitmap scans, so that each lane of a claim walks its
/// index in due order and stops at its limit.
///
/// PostgreSQL estimates the due rows from statistics, and statistics taken before a burst (an
/// outbox analyzed while nearly empty; a server whose autovacuum has not caught up) put them
/// below a claim's limit. Then a bitmap scan that reads every due row and sorts them looks
/// cheaper than the ordered walk, and a claim of 256 read all 20,000 due rows of a backlog:
/// 18 ms against 3 ms (the drain at 13,120 against 68,406 messages a second). The ordered walk
/// is what the claim is written for whatever the statistics say; index scans by id (the parked
/// and leased rows) are unaffected. Set for the session, and reset before the connection goes
/// back to the pool.
pub const CLAIMS_IN_ORDER: &str = "SET enable_bitmapscan = off";

/// Undoes [`CLAIMS_IN_ORDER`].
const PLANS_AS_GIVEN: &str = "RESET enable_bitmapscan";

/// Resets a claimer's session (see [`CLAIMS_IN_ORDER`]).
fn reset_claims_session<C: OutboxConnection>(conn: &mut C) {
    if let Err(error) = execute_batch(conn, PLANS_AS_GIVEN) {
        // A connection that fails here is broken: the pool's check on checkout discards it.
        log::debug!("outbox: resetting the claimer's session: {error}");
    }
}

/// What a held connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    /// The claimer's claims.
    Claims,
    /// The acker's settlements and the warden's lease renewals.
    Settlements,
    /// The housekeeper's chores: backlog samples, pruning, pauses, destinations' health.
    Chores,
    /// The handler threads' turns under rate limits across processes.
    Turns,
}

impl Role {
    /// Whose connection it is, for the shortage's report.
    fn name(self) -> &'static str {
        match self {
            Role::Claims => "the claimer",
            Role::Settlements => "the acker",
            Role::Chores => "the housekeeper",
            Role::Turns => "the turns of rate limits across processes",
        }
    }

    /// Every role, in the order of their slots.
    const ALL: [Role; 4] = [Role::Claims, Role::Settlements, Role::Chores, Role::Turns];

    /// Whose connections a role without one borrows, least busy first.
    const LENDERS: [Role; 4] = [Role::Chores, Role::Turns, Role::Settlements, Role::Claims];
}

/// A connection a role keeps between calls, and when its query plans were last let go.
///
/// PostgreSQL plans a prepared statement for its parameters five times, then keeps one generic
/// plan until something invalidates it (a vacuum or `ANALYZE` of the table, a schema change).
/// A worker that starts on an empty outbox gets plans made for a table PostgreSQL takes to be
/// ten pages long, where reading the whole table beats looking rows up by id. Behind a
/// transaction held open elsewhere the table grows by every settled row, no vacuum can run to
/// invalidate the plans, and each claim read the whole table twice (the first minute of the
/// held-transaction benchmark: p99 67 ms against 3 ms). `DISCARD PLANS` every [`PLANS_KEPT`]
/// (prepared statements stay; the next runs plan again for the table as it is) bounds that to
/// seconds, for a few plannings per connection each time.
struct HeldConnection<M: ManageConnection> {
    conn: PooledConnection<M>,
    plans_made: Instant,
    /// Undoes the session settings this connection was taken with (the claimer's) before it
    /// goes back to a pool the application may share.
    reset: Option<fn(&mut M::Connection)>,
}

impl<M: ManageConnection> Drop for HeldConnection<M> {
    fn drop(&mut self) {
        if let Some(reset) = self.reset {
            reset(&mut self.conn);
        }
    }
}

type Slot<M> = Mutex<Option<HeldConnection<M>>>;

/// The roles short of a connection of their own: since when, and when that was last logged.
#[derive(Debug, Default)]
struct Shortage {
    since: BTreeMap<Role, Instant>,
    logged: Option<Instant>,
}

/// A pool's connections as the worker holds them; see the [module documentation](self).
pub(crate) struct HeldConnections<M: ManageConnection> {
    pool: Pool<M>,
    backend: OnceLock<Backend>,
    slots: [Slot<M>; 4],
    /// Connections held by notification listeners.
    listening: Arc<AtomicUsize>,
    /// How many connections the worker holds while it runs, as it told the store at start.
    needed: AtomicUsize,
    shortage: Mutex<Shortage>,
}

/// A connection a notification listener holds: counted among the worker's while it lives.
pub(crate) struct ListenerConnection<M: ManageConnection> {
    pub(crate) conn: PooledConnection<M>,
    _held: ListenerMark,
}

struct ListenerMark(Arc<AtomicUsize>);

impl Drop for ListenerMark {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<M: ManageConnection> HeldConnections<M> {
    pub(crate) fn pool(&self) -> &Pool<M> {
        &self.pool
    }
}

impl<M> HeldConnections<M>
where
    M: ManageConnection,
    M::Connection: OutboxConnection + Send,
{
    pub(crate) fn new(pool: Pool<M>) -> Self {
        HeldConnections {
            pool,
            backend: OnceLock::new(),
            slots: Default::default(),
            listening: Arc::default(),
            needed: AtomicUsize::new(0),
            shortage: Mutex::default(),
        }
    }

    /// The pool's backend, asked of its first connection.
    pub(crate) fn backend(&self) -> Result<Backend, StoreError> {
        if let Some(backend) = self.backend.get() {
            return Ok(*backend);
        }
        let mut conn = self
            .pool
            .get()
            .map_err(|e| StoreError::new("getting a connection from the pool", e))?;
        Ok(*self.backend.get_or_init(|| conn.backend()))
    }

    fn is_postgres(&self) -> bool {
        self.backend.get() == Some(&Backend::Postgres)
    }

    /// Notes how many connections the worker holds while it runs, for the shortage's report.
    pub(crate) fn expect(&self, connections: usize) {
        self.needed.store(connections, Ordering::Relaxed);
    }

    /// A connection set up as the outbox needs it: at once if one is idle, after opening one if
    /// the pool has room (or after up to `wait` for one to come back, if given); `Ok(None)` if
    /// every connection of the pool is in use.
    fn lend(&self, wait: Option<Duration>) -> Result<Option<PooledConnection<M>>, StoreError> {
        let conn = match self.pool.try_get() {
            Some(conn) => conn,
            None => {
                let full = self.pool.state().connections >= self.pool.max_size();
                if full && wait.is_none() {
                    return Ok(None);
                }
                match self.pool.get_timeout(wait.unwrap_or(POOL_WAIT)) {
                    Ok(conn) => conn,
                    Err(_) if self.exhausted() => return Ok(None),
                    Err(error) => {
                        return Err(StoreError::new("getting a connection from the pool", error))
                    }
                }
            }
        };
        self.prepared(conn).map(Some)
    }

    /// Whether every connection the pool may open is open and in use.
    fn exhausted(&self) -> bool {
        let state = self.pool.state();
        state.connections >= self.pool.max_size() && state.idle_connections == 0
    }

    fn prepared(&self, mut conn: PooledConnection<M>) -> Result<PooledConnection<M>, StoreError> {
        self.backend.get_or_init(|| conn.backend());
        ensure_busy_timeout(&mut *conn)
            .map_err(|e| StoreError::new("setting the SQLite busy timeout", e))?;
        Ok(conn)
    }

    /// A connection for a call of its own (a start-up check), waiting for the pool as long as it
    /// takes to open one.
    pub(crate) fn connection(&self) -> Result<PooledConnection<M>, StoreError> {
        let conn = self
            .pool
            .get_timeout(POOL_WAIT)
            .map_err(|e| StoreError::new("getting a connection from the pool", e))?;
        self.prepared(conn)
    }

    /// A connection for a notification listener, counted among the worker's while it lives.
    pub(crate) fn listener_connection(&self) -> Result<ListenerConnection<M>, StoreError> {
        let conn = self.connection()?;
        self.listening.fetch_add(1, Ordering::SeqCst);
        Ok(ListenerConnection {
            conn,
            _held: ListenerMark(Arc::clone(&self.listening)),
        })
    }

    /// A connection for an exactly-once handler's transaction, for as long as it runs: waits for
    /// one to come back to the pool for a while, then reports the shortage (the message waits
    /// without spending an attempt).
    pub(crate) fn transaction_connection(
        &self,
    ) -> Result<Result<PooledConnection<M>, String>, StoreError> {
        match self.lend(Some(POOL_WAIT))? {
            Some(conn) => Ok(Ok(conn)),
            None => Ok(Err(self.report(None))),
        }
    }

    fn slot(&self, role: Role) -> MutexGuard<'_, Option<HeldConnection<M>>> {
        // A connection is taken or let go whole: a panic elsewhere while it was locked left
        // nothing half-done.
        self.slots[role as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `work` on `role`'s connection, taking one from the pool if it has none, or on
    /// another role's while the pool lends none; after a failure the connection is let go, as
    /// it may be broken.
    pub(crate) fn with<T>(
        &self,
        role: Role,
        what: &'static str,
        work: impl FnOnce(&mut PooledConnection<M>) -> QueryResult<T>,
    ) -> Result<T, StoreError> {
        let mut slot = self.slot(role);
        if slot.is_none() {
            match self.lend(None)? {
                Some(conn) => {
                    *slot = Some(self.held(role, conn)?);
                    self.supplied(role);
                }
                None => {
                    drop(slot);
                    self.short(role);
                    return self.borrowed(role, what, work);
                }
            }
        }
        self.run(&mut slot, what, work)
    }

    /// Runs `work` on the connection another role holds, waiting for its call to end.
    fn borrowed<T>(
        &self,
        role: Role,
        what: &'static str,
        work: impl FnOnce(&mut PooledConnection<M>) -> QueryResult<T>,
    ) -> Result<T, StoreError> {
        for lender in Role::LENDERS {
            if lender == role {
                continue;
            }
            let mut slot = self.slot(lender);
            if slot.is_some() {
                return self.run(&mut slot, what, work);
            }
        }
        Err(StoreError::new(
            what,
            format!(
                "the pool lends no connection, and the worker holds none to share: {}",
                self.report(Some(role))
            ),
        ))
    }

    fn held(
        &self,
        role: Role,
        mut conn: PooledConnection<M>,
    ) -> Result<HeldConnection<M>, StoreError> {
        let mut reset = None;
        if role == Role::Claims && self.is_postgres() {
            execute_batch(&mut *conn, CLAIMS_IN_ORDER)
                .map_err(|e| StoreError::new("setting up the claimer's session", e))?;
            reset = Some(reset_claims_session::<M::Connection> as fn(&mut M::Connection));
        }
        Ok(HeldConnection {
            conn,
            plans_made: Instant::now(),
            reset,
        })
    }

    fn run<T>(
        &self,
        slot: &mut MutexGuard<'_, Option<HeldConnection<M>>>,
        what: &'static str,
        work: impl FnOnce(&mut PooledConnection<M>) -> QueryResult<T>,
    ) -> Result<T, StoreError> {
        let Some(held) = slot.as_mut() else {
            return Err(StoreError::new(what, "the connection was let go meanwhile"));
        };
        let plans_stale = self.is_postgres() && held.plans_made.elapsed() >= PLANS_KEPT;
        let result = if plans_stale {
            held.plans_made = Instant::now();
            execute_batch(&mut *held.conn, "DISCARD PLANS").and_then(|()| work(&mut held.conn))
        } else {
            work(&mut held.conn)
        };
        result.map_err(|error| {
            let busy = crate::sql::is_busy(&error);
            **slot = None;
            let error = StoreError::new(what, error);
            if busy {
                error.with_kind(StoreErrorKind::Busy)
            } else {
                error
            }
        })
    }

    fn shortage(&self) -> MutexGuard<'_, Shortage> {
        self.shortage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `role` found the pool lending nothing.
    fn short(&self, role: Role) {
        let now = Instant::now();
        let mut shortage = self.shortage();
        shortage.since.entry(role).or_insert(now);
        let lasting = shortage
            .since
            .values()
            .any(|since| now.saturating_duration_since(*since) >= SHORTAGE_GRACE);
        let due = shortage
            .logged
            .is_none_or(|at| now.saturating_duration_since(at) >= SHORTAGE_REMINDER);
        if lasting && due {
            shortage.logged = Some(now);
            drop(shortage);
            log::error!(
                "outbox: the worker is short of connections and shares the ones it has, more \
                 slowly: {}",
                self.report(None)
            );
        }
    }

    /// `role` has a connection of its own again.
    fn supplied(&self, role: Role) {
        let mut shortage = self.shortage();
        if shortage.since.remove(&role).is_some()
            && shortage.since.is_empty()
            && shortage.logged.take().is_some()
        {
            log::warn!("outbox: the worker has its connections again");
        }
    }

    /// What keeps the worker short of connections, if anything has for a while and still does.
    ///
    /// A role marked short takes its own connection at its next call, which may be long in
    /// coming (the acker of an idle worker): once the pool has a connection to lend, the
    /// shortage is over whether or not the role has asked yet.
    /// A role that is taking its own connection back counts as supplied already: its slot is
    /// locked until it has been told so.
    pub(crate) fn shortage_report(&self) -> Option<String> {
        let now = Instant::now();
        let lasting: Vec<Role> = self
            .shortage()
            .since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= SHORTAGE_GRACE)
            .map(|(role, _)| *role)
            .collect();
        let short = lasting.into_iter().any(|role| !self.holds(role));
        (short && self.exhausted()).then(|| self.report(None))
    }

    /// Whether `role` holds a connection, or is in a call on its own slot (taking one, or using
    /// the one it has). Never waits on the role's call: health reports come through here.
    fn holds(&self, role: Role) -> bool {
        match self.slots[role as usize].try_lock() {
            Ok(slot) => slot.is_some(),
            Err(std::sync::TryLockError::WouldBlock) => true,
            Err(std::sync::TryLockError::Poisoned(slot)) => slot.into_inner().is_some(),
        }
    }

    /// The shortage in words: the pool, what the worker and the application hold, and the fix.
    fn report(&self, also: Option<Role>) -> String {
        let max = usize::try_from(self.pool.max_size()).unwrap_or(usize::MAX);
        let state = self.pool.state();
        let in_use = usize::try_from(state.connections.saturating_sub(state.idle_connections))
            .unwrap_or(usize::MAX);
        let listening = self.listening.load(Ordering::SeqCst);
        let held = Role::ALL.iter().filter(|role| self.holds(**role)).count() + listening;
        let mut short: Vec<&str> = self
            .shortage()
            .since
            .keys()
            .map(|role| role.name())
            .collect();
        if let Some(role) = also.filter(|role| !self.shortage().since.contains_key(role)) {
            short.push(role.name());
        }
        let needed = self.needed.load(Ordering::Relaxed).max(held);
        let elsewhere = in_use.saturating_sub(held);
        let without = if short.is_empty() {
            "an exactly-once handler's transaction waits for one".to_owned()
        } else {
            format!("{} without one of its own", short.join(", "))
        };
        format!(
            "the connection pool lends at most {max} and all are in use: the worker holds \
             {held} of the {needed} it needs ({without}), and the application (or exactly-once \
             handlers) {elsewhere}; build the pool with max_size({}) or more, or hold fewer \
             connections in the application at once",
            needed + elsewhere
        )
    }
}
