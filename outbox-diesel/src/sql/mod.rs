//! Every statement the outbox runs, one file per backend ([`postgres`], [`mysql`],
//! [`sqlite`]), each a whole statement with a comment; what they share (row types, the order
//! in which a settlement runs its statements) is here. Ids, tokens and texts are always bound,
//! never written into the text.
//!
//! # Ordering keys: heads, parked messages, promotion
//!
//! Messages sharing an ordering key are processed one at a time, in position (enqueue) order:
//! only the *head* of a key, its pending message with the lowest position, may be claimed. A
//! claim used to check that for every due row it walked past, so its cost grew with the keyed
//! backlog. Now the messages waiting behind a head are **parked**: a flag that takes them out
//! of the due index (a partial index on PostgreSQL and SQLite, the index's first column on
//! MySQL), so a claim reads only rows it may take, whatever the backlog.
//!
//! - **Who parks.** The claim: it reads as many due, unparked rows as its batch (16 at least),
//!   keeps the heads (no lower position of their key pending; an index probe each) and parks
//!   the others in the same statement or transaction. Each message is examined once before it
//!   is parked. A claim that parked some returns a short batch, and the claimer looks again
//!   at once; reading more rows to fill the batch cost more than it saved (every row read
//!   costs a lock on PostgreSQL and a probe on every backend, see BENCHMARKS.md).
//!   On PostgreSQL and SQLite the enqueue parks too: its `INSERT` parks a keyed message when
//!   its key has a pending message already (an index probe that locks nothing), so a burst
//!   behind a head that is not due never comes before a claim. On MySQL it stays one plain
//!   `INSERT` that reads nothing (an `INSERT … SELECT` would take a lock the worker could wait
//!   on, under REPEATABLE READ), and a keyed backlog costs its first claims a visit per
//!   message, once.
//! - **Who promotes.** The settlement that removes a head (done or dead-lettered) unparks the
//!   message with the lowest remaining position of its key, in the same statement (PostgreSQL)
//!   or transaction (MySQL, SQLite). A head that is retried stays the head, so its key waits.
//! - **Who leases the next one.** On PostgreSQL the settlement of done heads also leases each
//!   key's next message to the worker when it is due and small enough
//!   ([`Statements::delete_done_leasing`]), and the worker hands it straight to a handler: a
//!   key then costs one round trip per message (the settlement) instead of two (settlement,
//!   then a claim). The lease is judged on the row as the `UPDATE` finds it, after waiting for
//!   a claim that locked it, so a message is never leased twice. The worker asks for it only
//!   while it keeps room for a full claim (busy keys must not starve other messages). MySQL
//!   and SQLite promote only; their claims take the next messages.
//! - **The safety net.** Concurrent transactions can leave a key without a live head: a claim
//!   parks a message just as the settlement of its head looks for one to promote, or two
//!   enqueues race. Two things keep that harmless. The claim still checks that a candidate is
//!   the head of its key, so order never depends on the flag; and the worker runs
//!   [`promote_stranded`](Statements::promote_stranded) every few seconds, which unparks the
//!   lowest parked message of every key that has no lower one pending, reading a small index
//!   of the parked rows only (one entry per parked key, and a probe each).
//! - **Delayed messages.** A keyed message enqueued with a delay is still its key's place in
//!   the order: while it waits, the later messages of its key wait behind it.
//! - **Re-queued dead letters** go back to their original position: they run before the later
//!   messages of their key still pending (those not yet started; one already running finishes
//!   first). A re-queued head makes the current head a non-head, which the next claim parks.

/// The methods of [`Statements`] that run one fixed statement each, the same on every
/// backend but for the statement's text: expanded inside each backend's `impl Statements`, where
/// `run`, `STYLE` and the statement constants of that backend's file are in scope.
macro_rules! fixed_statement_methods {
    () => {
        fn reserve_idempotency_key(&mut self, key: &str, message_id: &str) -> QueryResult<bool> {
            Ok(run(
                self,
                RESERVE_KEY,
                &[Bind::Text(key), Bind::Text(message_id)],
            )? == 1)
        }

        fn idempotent_message(&mut self, key: &str) -> QueryResult<Option<String>> {
            let rows: Vec<MessageIdRow> =
                Prepared::new(KEYED_MESSAGE, STYLE, &[Bind::Text(key)]).load(self)?;
            Ok(rows.into_iter().next().map(|row| row.message_id))
        }

        fn set_idempotency_position(&mut self, key: &str) -> QueryResult<()> {
            run(self, SET_KEY_POSITION, &[Bind::Text(key)]).map(drop)
        }

        fn unsettled_idempotency_keys(&mut self, after: i64, limit: i64) -> QueryResult<Vec<i64>> {
            let binds = [Bind::BigInt(after), Bind::BigInt(limit)];
            let rows: Vec<IdRow> = Prepared::new(UNSETTLED_KEYS, STYLE, &binds).load(self)?;
            Ok(rows.into_iter().map(|row| row.id).collect())
        }

        fn expire_idempotency_keys(
            &mut self,
            window_micros: i64,
            limit: i64,
        ) -> QueryResult<usize> {
            let binds = [Bind::BigInt(window_micros), Bind::BigInt(limit)];
            run(self, EXPIRE_KEYS, &binds)
        }

        fn inbox_record(&mut self, id: &str) -> QueryResult<bool> {
            Ok(run(self, INBOX_RECORD, &[Bind::Text(id)])? == 1)
        }

        fn revoke_session(&mut self, session_id: &str, expires_unix: i64) -> QueryResult<()> {
            let binds = [Bind::Text(session_id), Bind::BigInt(expires_unix)];
            run(self, REVOKE_SESSION, &binds).map(drop)
        }

        fn session_revoked(&mut self, session_id: &str) -> QueryResult<bool> {
            let rows: Vec<FoundRow> =
                Prepared::new(SESSION_REVOKED, STYLE, &[Bind::Text(session_id)]).load(self)?;
            Ok(rows.first().is_some_and(|row| row.found > 0))
        }

        fn forget_revoked_sessions(&mut self, now_unix: i64) -> QueryResult<usize> {
            run(self, FORGET_REVOKED, &[Bind::BigInt(now_unix)])
        }

        fn inbox_sweep(&mut self, older_than_micros: i64, limit: i64) -> QueryResult<usize> {
            let binds = [Bind::BigInt(older_than_micros), Bind::BigInt(limit)];
            run(self, INBOX_SWEEP, &binds)
        }

        fn prune_dead_letters(&mut self, older_than_micros: i64, limit: i64) -> QueryResult<usize> {
            let binds = [Bind::BigInt(older_than_micros), Bind::BigInt(limit)];
            run(self, PRUNE_DEAD_LETTERS, &binds)
        }

        fn pending_by_message_id(&mut self, message_id: &str) -> QueryResult<Vec<PendingRow>> {
            let binds = [
                Bind::BigInt(crate::sql::WHOLE_PAYLOAD),
                Bind::Text(message_id),
            ];
            Prepared::new(PENDING_BY_MESSAGE_ID, STYLE, &binds).load(self)
        }

        fn dead_by_message_id(&mut self, message_id: &str) -> QueryResult<Vec<DeadLetterRow>> {
            let binds = [
                Bind::BigInt(crate::sql::WHOLE_PAYLOAD),
                Bind::Text(message_id),
            ];
            Prepared::new(DEAD_BY_MESSAGE_ID, STYLE, &binds).load(self)
        }

        fn dead_positions(&mut self, message_type: Option<&str>) -> QueryResult<Vec<i64>> {
            let binds = [Bind::NullableText(message_type)];
            let rows: Vec<IdRow> = Prepared::new(DEAD_POSITIONS, STYLE, &binds).load(self)?;
            Ok(rows.into_iter().map(|row| row.id).collect())
        }

        fn blocked_keys(&mut self, limit: i64) -> QueryResult<Vec<BlockedKeyRow>> {
            Prepared::new(BLOCKED_KEYS, STYLE, &[Bind::BigInt(limit)]).load(self)
        }

        fn add_destination(&mut self, name: &str, kind: &str) -> QueryResult<()> {
            run(self, ADD_DESTINATION, &[Bind::Text(name), Bind::Text(kind)]).map(drop)
        }

        fn lock_destination(&mut self, name: &str) -> QueryResult<Vec<StoredDestinationRow>> {
            Prepared::new(LOCK_DESTINATION, STYLE, &[Bind::Text(name)]).load(self)
        }

        fn lock_turns(&mut self, name: &str) -> QueryResult<Vec<TurnsRow>> {
            Prepared::new(LOCK_TURNS, STYLE, &[Bind::Text(name)]).load(self)
        }

        fn write_turns(&mut self, name: &str, turns: &Turns) -> QueryResult<()> {
            let binds = [
                Bind::BigInt(TurnsRow::millionths(turns.tokens)),
                Bind::BigInt(turns.refilled),
                Bind::NullableBigInt(turns.booked_until),
                Bind::BigInt(turns.last_turn),
                Bind::Text(name),
            ];
            run(self, WRITE_TURNS, &binds).map(drop)
        }

        fn report_destination(&mut self, report: &DestinationReport) -> QueryResult<()> {
            let binds = [
                Bind::Text(report.kind),
                Bind::Text(report.state),
                Bind::BigInt(i64::from(report.consecutive_failures)),
                Bind::NullableText(report.last_error.as_deref()),
                Bind::NullableBigInt(report.probe_in.map(micros)),
                Bind::NullableText(report.disabled_reason.as_deref()),
                Bind::Text(&report.name),
            ];
            run(self, REPORT_DESTINATION, &binds).map(drop)
        }

        fn destinations(&mut self) -> QueryResult<Vec<DestinationRow>> {
            Prepared::new(DESTINATIONS, STYLE, &[]).load(self)
        }

        fn enable_destination(&mut self, name: &str) -> QueryResult<usize> {
            run(self, ENABLE_DESTINATION, &[Bind::Text(name)])
        }

        fn disable_destination(&mut self, name: &str, reason: &str) -> QueryResult<usize> {
            run(
                self,
                DISABLE_DESTINATION,
                &[Bind::Text(reason), Bind::Text(name)],
            )
        }

        fn pause_message(&mut self, token: &str, id: i64, reason: &str) -> QueryResult<bool> {
            let binds = [
                Bind::BigInt(micros(crate::sql::PAUSED_FOR)),
                Bind::Text(reason),
                Bind::BigInt(id),
                Bind::Text(token),
            ];
            Ok(run(self, PAUSE_MESSAGE, &binds)? == 1)
        }

        fn release_paused(&mut self) -> QueryResult<usize> {
            run(self, RELEASE_PAUSED, &[])
        }

        fn pause(&mut self, kind: &str, name: &str, reason: &str) -> QueryResult<usize> {
            run(
                self,
                PAUSE,
                &[Bind::Text(kind), Bind::Text(name), Bind::Text(reason)],
            )
        }

        fn resume(&mut self, kind: &str, name: &str) -> QueryResult<usize> {
            run(self, RESUME, &[Bind::Text(kind), Bind::Text(name)])
        }

        fn pauses(&mut self) -> QueryResult<Vec<PauseRow>> {
            Prepared::new(PAUSES, STYLE, &[]).load(self)
        }

        fn backlog(&mut self) -> QueryResult<BacklogRow> {
            let rows: Vec<BacklogRow> = Prepared::new(BACKLOG, STYLE, &[]).load(self)?;
            rows.into_iter()
                .next()
                .ok_or(diesel::result::Error::NotFound)
        }
    };
}

pub(crate) mod bind;
pub(crate) mod cancel;
pub(crate) mod codec;
pub(crate) mod delivery_log;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
pub(crate) mod new_message;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
pub(crate) mod subscription;

use std::collections::BTreeMap;

use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::{QueryResult, QueryableByName};
use outbox_core::store::{
    ClaimLimit, DestinationReport, Outcome, Settlement, StoredDestination, SyncedDestination, Turns,
};

use bind::Bind;
use delivery_log::{DeliveryLog, DeliveryLogStatements};
use new_message::NewMessage;

/// The columns every reading of a message row selects: claims, listings, dead letters.
#[derive(QueryableByName, Debug)]
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
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) headers: Option<String>,
}

/// A claimed row: the message, when it was enqueued, and its priority level.
#[derive(QueryableByName, Debug)]
pub(crate) struct ClaimRow {
    #[diesel(embed)]
    pub(crate) message: MessageRow,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_micros: i64,
    /// When an operator's pause that held it last ended, if one did.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) resumed_micros: Option<i64>,
    /// The subscription it is a delivery for, if it is one.
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) subscription_id: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) priority: i64,
}

/// A pending message as listed.
#[derive(QueryableByName, Debug)]
pub(crate) struct PendingRow {
    #[diesel(embed)]
    pub(crate) message: MessageRow,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_at: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) next_attempt_at: i64,
    #[diesel(sql_type = Integer)]
    pub(crate) in_flight: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) parked: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) paused: i32,
    #[diesel(sql_type = BigInt)]
    pub(crate) priority: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) group_name: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) last_error: Option<String>,
}

/// A dead letter as listed.
#[derive(QueryableByName, Debug)]
pub(crate) struct DeadLetterRow {
    #[diesel(embed)]
    pub(crate) message: MessageRow,
    #[diesel(sql_type = Text)]
    pub(crate) last_error: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_at: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) failed_at: i64,
}

/// A count of rows found.
#[derive(QueryableByName, Debug)]
pub(crate) struct FoundRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) found: i64,
}

/// One line of the stats: counts of one message type.
#[derive(QueryableByName, Debug)]
pub(crate) struct StatsRow {
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) total: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) in_flight: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest: Option<i64>,
}

/// The backlog: messages in the outbox, and the microseconds the oldest due one has waited.
#[derive(QueryableByName, Debug)]
pub(crate) struct BacklogRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) pending: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest_due_micros: Option<i64>,
    /// When the oldest due, unheld message became due, in µs since the epoch (PostgreSQL and
    /// MySQL: where the claim cursor steps back to if it passed it).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest_due_at: Option<i64>,
}

/// What keeps the database from cleaning up: the oldest transaction holding it back (µs open)
/// and the rows waiting for it.
#[derive(QueryableByName, Debug, Default)]
pub(crate) struct HorizonRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest_transaction_micros: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) dead_rows: Option<i64>,
}

/// The head of an ordering key waiting for a retry, and how many wait behind it.
#[derive(QueryableByName, Debug)]
pub(crate) struct BlockedKeyRow {
    #[diesel(sql_type = Text)]
    pub(crate) ordering_key: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = Text)]
    pub(crate) last_error: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) next_attempt_at: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) waiting: i64,
}

/// A destination as a worker reads it to adopt what the store says.
#[derive(QueryableByName, Debug)]
pub(crate) struct StoredDestinationRow {
    #[diesel(sql_type = Text)]
    pub(crate) name: String,
    #[diesel(sql_type = Text)]
    pub(crate) state: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) disabled_reason: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) enables: i64,
}

/// A destination's turns as [`Statements::lock_turns`] reads them, with the database's clock.
#[derive(QueryableByName, Debug)]
pub(crate) struct TurnsRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    turn_tokens: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    turns_refilled: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    turns_booked_until: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    last_turn: Option<i64>,
    #[diesel(sql_type = BigInt)]
    now: i64,
}

impl TurnsRow {
    /// The turns kept, if a worker took one before.
    fn turns(&self) -> Option<Turns> {
        Some(Turns {
            tokens: self.turn_tokens? as f64 / 1e6,
            refilled: self.turns_refilled?,
            booked_until: self.turns_booked_until,
            last_turn: self.last_turn?,
        })
    }

    /// Turns in millionths, as the column keeps them.
    fn millionths(tokens: f64) -> i64 {
        (tokens * 1e6).round() as i64
    }
}

/// Takes a turn of destination `name`'s rate limit across processes
/// ([`SharedTurns::take_turn`](outbox_core::store::SharedTurns::take_turn)): its row locked (added first if
/// no worker of this destination synced it yet), its turns handed to `take` with the
/// database's clock, and what `take` returns written back, in one short transaction.
pub(crate) fn take_turn<C: Statements>(
    c: &mut C,
    name: &str,
    kind: &str,
    take: &mut dyn FnMut(Option<Turns>, i64) -> Turns,
) -> QueryResult<()> {
    c.settle_transaction(|c| {
        let mut rows = c.lock_turns(name)?;
        if rows.is_empty() {
            c.add_destination(name, kind)?;
            rows = c.lock_turns(name)?;
        }
        let row = rows.pop().ok_or(diesel::result::Error::NotFound)?;
        let turns = take(row.turns(), row.now);
        c.write_turns(name, &turns)
    })
}

impl StoredDestinationRow {
    fn into_stored(self) -> StoredDestination {
        let disabled = (self.state == DISABLED).then(|| self.disabled_reason.unwrap_or_default());
        StoredDestination::new(self.name, disabled, self.enables)
    }
}

/// The state word of a disabled destination, as workers and operators write it.
pub(crate) const DISABLED: &str = "disabled";

/// A destination as listed.
#[derive(QueryableByName, Debug)]
pub(crate) struct DestinationRow {
    #[diesel(sql_type = Text)]
    pub(crate) name: String,
    #[diesel(sql_type = Text)]
    pub(crate) kind: String,
    #[diesel(sql_type = Text)]
    pub(crate) state: String,
    #[diesel(sql_type = Integer)]
    pub(crate) consecutive_failures: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) last_error: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) next_probe_at: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) disabled_reason: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) reported_at: i64,
}

/// A row of one text column named `message_id`.
#[derive(QueryableByName, Debug)]
pub(crate) struct MessageIdRow {
    #[diesel(sql_type = Text)]
    pub(crate) message_id: String,
}

/// A row of one BIGINT column named `id`.
#[derive(QueryableByName, Debug)]
pub(crate) struct IdRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
}

/// A row of one BIGINT column named `n`.
#[derive(QueryableByName, Debug)]
pub(crate) struct CountRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}

/// Which messages a listing returns: of one type or all, from a position on, at most so many.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter<'a> {
    pub message_type: Option<&'a str>,
    pub ordering_key: Option<&'a str>,
    /// Pending messages only: at least this many attempts started.
    pub min_attempts: u32,
    /// Pending messages only: only those a claim could take now.
    pub due_only: bool,
    /// The lowest position listed: pages go on from the last position shown plus one.
    pub position: Option<i64>,
    pub limit: Option<u32>,
    /// How many characters of each payload to read (`None`: all of it).
    pub payload_chars: Option<u32>,
}

/// The characters a listing reads of a payload it reads whole: more than a payload can hold.
pub(crate) const WHOLE_PAYLOAD: i64 = i32::MAX as i64;

impl<'a> Filter<'a> {
    /// Every row, up to `limit`.
    pub fn new(limit: Option<u32>) -> Self {
        Filter {
            message_type: None,
            ordering_key: None,
            min_attempts: 0,
            due_only: false,
            position: None,
            limit,
            payload_chars: None,
        }
    }

    /// The first bind of every listing: how many characters of each payload to read.
    fn payload_bind(&self) -> Bind<'a> {
        Bind::BigInt(self.payload_chars.map_or(WHOLE_PAYLOAD, i64::from))
    }

    /// The pending listing's statement, `by_key` when a key is asked for (it reads the
    /// ordering index, whatever the plan) or `every` otherwise, and its binds: the key if
    /// asked, then type (NULL: any), least attempts, due only (0/1), from position, limit;
    /// all after [the payload's](Self::payload_bind).
    pub fn pending_query<'s>(&self, every: &'s str, by_key: &'s str) -> (&'s str, Vec<Bind<'a>>) {
        let mut binds = Vec::with_capacity(7);
        binds.push(self.payload_bind());
        let statement = match self.ordering_key {
            Some(key) => {
                binds.push(Bind::Text(key));
                by_key
            }
            None => every,
        };
        binds.extend([
            Bind::NullableText(self.message_type),
            Bind::BigInt(i64::from(self.min_attempts)),
            Bind::BigInt(i64::from(self.due_only)),
            Bind::BigInt(self.position.unwrap_or(0)),
            Bind::BigInt(self.limit.map_or(i64::MAX, i64::from)),
        ]);
        (statement, binds)
    }

    /// The binds of the dead-letter listing: [the payload's](Self::payload_bind), type (NULL:
    /// any), key twice (NULL: any), from position, limit.
    pub fn dead_binds(&self) -> [Bind<'a>; 6] {
        [
            self.payload_bind(),
            Bind::NullableText(self.message_type),
            Bind::NullableText(self.ordering_key),
            Bind::NullableText(self.ordering_key),
            Bind::BigInt(self.position.unwrap_or(0)),
            Bind::BigInt(self.limit.map_or(i64::MAX, i64::from)),
        ]
    }
}

/// A claim as the statements take it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    /// The claim's token, as text.
    pub token: &'a str,
    pub limit: ClaimLimit,
    /// The lease, in microseconds.
    pub lease_micros: i64,
    /// The last group the store's last claim visited: this one visits the groups after it,
    /// wrapping to the first (empty: from the first).
    pub groups_after: &'a str,
}

impl Claim<'_> {
    /// How many due rows a claim reads: see [`candidates`].
    pub fn candidates(&self) -> i64 {
        candidates(self.limit.messages)
    }

    /// How many due rows a claim reads of each group it visits: an eighth of its candidates,
    /// one at least, so that the groups' shares together read no more than the ordinary lane.
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    pub fn per_group(&self) -> i64 {
        (self.candidates() / to_i64(GROUPS_PER_CLAIM)).max(1)
    }

    /// The byte limit as SQL takes it.
    #[cfg(feature = "postgres")]
    pub fn bytes(&self) -> i64 {
        to_i64(self.limit.bytes)
    }
}

/// How many groups one claim gives a share of its batch (PostgreSQL's claim writes it in).
#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) const GROUPS_PER_CLAIM: usize = 8;

/// What a claim leased, and where the next one starts.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub rows: Vec<ClaimRow>,
    /// Where the claim found its first ordinary candidate (the next claim's cursor), if the
    /// backend keeps a cursor and this claim leased any.
    pub first: Option<Cursor>,
    /// The last group the claim visited, if it leased any.
    pub last_group: Option<String>,
}

/// A group listed for claims, and whether it comes after the last claim's last group (0) or
/// from the first again (1).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
#[derive(QueryableByName, Debug)]
pub(crate) struct GroupRow {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = BigInt)]
    pub pass: i64,
}

/// The groups a claim visits, in turn: those after the last claim's last group, then from the
/// first again, [`GROUPS_PER_CLAIM`] at most.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn groups_in_turn(mut rows: Vec<GroupRow>) -> Vec<String> {
    // A union's rows come in no promised order.
    rows.sort_unstable_by(|a, b| (a.pass, &a.name).cmp(&(b.pass, &b.name)));
    rows.truncate(GROUPS_PER_CLAIM);
    rows.into_iter().map(|row| row.name).collect()
}

/// A claim's candidates in the order its batch takes them: the raised priorities first, then
/// the groups in turn, the first of each before the second of any (messages without a group
/// are one more group), each group in `order` (priority, due time, position). `read` holds the
/// raised and the ordinary lanes as read, `shares` each visited group's share in due order; a
/// row read in both is kept in its group's share, and a group's rows in the ordinary lane come
/// after its share, so no group's rows are taken out of their order.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn share_out<T, K: Ord>(
    read: Vec<T>,
    shares: Vec<Vec<T>>,
    id: impl Fn(&T) -> i64,
    group: impl Fn(&T) -> Option<&str>,
    raised: impl Fn(&T) -> bool,
    order: impl Fn(&T) -> K,
) -> Vec<T> {
    use std::collections::{HashMap, HashSet};

    let in_shares: HashSet<i64> = shares.iter().flatten().map(&id).collect();
    let mut turns_taken: HashMap<Option<String>, usize> = HashMap::new();
    let mut turns: Vec<(usize, T)> = Vec::with_capacity(read.len());
    for share in shares {
        for row in share {
            let taken = turns_taken
                .entry(group(&row).map(str::to_owned))
                .or_default();
            *taken += 1;
            turns.push((*taken, row));
        }
    }
    let mut read: Vec<T> = read
        .into_iter()
        .filter(|row| !in_shares.contains(&id(row)))
        .collect();
    read.sort_by_key(|row| order(row));
    for row in read {
        if raised(&row) {
            turns.push((0, row));
        } else {
            let taken = turns_taken
                .entry(group(&row).map(str::to_owned))
                .or_default();
            *taken += 1;
            turns.push((*taken, row));
        }
    }
    turns.sort_by_key(|(turn, row)| (*turn, order(row)));
    turns.into_iter().map(|(_, row)| row).collect()
}

/// How many due rows a claim of `messages` reads: the batch, and 16 at least, so that a claim
/// of one message can look past a few messages to park. Four times the batch, so that a claim
/// that parks some still fills its batch, made a drain over 1,000 ordering keys 0.72 times as
/// fast as one without keys; the batch alone, 0.92 (BENCHMARKS.md, "candidate window").
pub fn candidates(messages: usize) -> i64 {
    to_i64(messages.max(16))
}

/// A count or size as a BIGINT.
pub(crate) fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A duration in microseconds, saturating.
pub(crate) fn micros(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// The longest age a statement compares with "now minus an age" (a hundred years: "forever"):
/// every backend's time arithmetic takes it, where `Duration::MAX` would overflow PostgreSQL's.
pub(crate) const LONGEST_AGE: std::time::Duration =
    std::time::Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// An age (a retention, a window) in microseconds, cut to [`LONGEST_AGE`].
pub(crate) fn age_micros(age: std::time::Duration) -> i64 {
    micros(age.min(LONGEST_AGE))
}

/// `?, ?, ?` for `n` binds, for `IN (..)` lists on the backends without array binds.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn placeholders(n: usize) -> String {
    let mut text = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            text.push_str(", ");
        }
        text.push('?');
    }
    text
}

/// Id lists longer than this are split over several statements (MySQL and SQLite bind one
/// parameter per id).
pub(crate) const ID_CHUNK: usize = 1000;

/// A position in the due index (due time, then position): where a claim starts reading due rows.
/// PostgreSQL and MySQL keep one per store, so that the dead entries claimed and settled
/// messages leave in front of the first live one (which vacuum or purge cannot remove while a
/// transaction is held open) are not walked by every claim; SQLite removes deleted rows from its
/// indexes at once and reads from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cursor {
    /// The due time, in µs since the epoch.
    pub due_micros: i64,
    /// The position.
    pub id: i64,
}

impl Cursor {
    /// The start of the due index: a claim from here finds every due row.
    pub const START: Cursor = Cursor {
        due_micros: 0,
        id: 0,
    };
}

/// What a backend's statements do; each backend implements it in its own file.
pub(crate) trait Statements:
    Sized + diesel::Connection<TransactionManager = AnsiTransactionManager>
{
    /// Inserts messages (one statement for up to the backend's bind limit).
    fn insert_messages(&mut self, rows: &[NewMessage]) -> QueryResult<()>;

    /// What keeps the database from cleaning up the outbox table, where the backend can tell
    /// (SQLite: nothing to tell; a reader there keeps the WAL from being checkpointed, which
    /// costs disk, not claims).
    fn horizon(&mut self) -> QueryResult<HorizonRow> {
        Ok(HorizonRow::default())
    }

    /// Parks the non-heads among the due candidates, read from `from` on in due order (and a
    /// share of each of the groups after `claim.groups_after`), and leases heads within the
    /// limit.
    fn claim(&mut self, claim: &Claim<'_>, from: Cursor) -> QueryResult<Claimed>;

    /// Lists `groups` for claims to visit (a group listed already is left as it is). Inside the
    /// enqueuing transaction.
    fn register_groups(&mut self, groups: &[&str]) -> QueryResult<()>;

    /// Removes the groups without a pending unparked message; returns how many.
    fn remove_empty_groups(&mut self) -> QueryResult<usize>;

    /// Deletes done messages still leased under their claims and promotes the next message of
    /// each of `keys`; returns how many were deleted. One statement where the backend allows.
    fn delete_done(&mut self, claims: &[(String, Vec<i64>)], keys: &[&str]) -> QueryResult<usize>;

    /// As [`delete_done`](Statements::delete_done), and leases under `successors` each key's
    /// next message where it is due and within `successors`' bytes; returns how many were
    /// deleted and the leased rows. Where the backend cannot do it in the same statement, it
    /// leases nothing (the claimer takes those messages).
    fn delete_done_leasing(
        &mut self,
        claims: &[(String, Vec<i64>)],
        keys: &[&str],
        successors: &Claim<'_>,
    ) -> QueryResult<(usize, Vec<ClaimRow>)> {
        let _ = successors;
        Ok((self.delete_done(claims, keys)?, Vec::new()))
    }

    /// Undoes what [`delete_done`](Statements::delete_done) does to the durability of the
    /// transaction it runs in (PostgreSQL commits the worker's own settlements without waiting
    /// for the log flush), for a transaction that also holds an application's writes.
    fn keep_commit_durable(&mut self) -> QueryResult<()> {
        Ok(())
    }

    /// Gives messages back undone, not counting the attempt; returns how many.
    fn release(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize>;

    /// Schedules one message for later with `text` as its last error, counting the attempt
    /// or not; whether its claim still held it.
    fn reschedule(
        &mut self,
        token: &str,
        id: i64,
        delay_micros: i64,
        text: &str,
        count_attempt: bool,
    ) -> QueryResult<bool>;

    /// Moves one message to the dead letters, atomically and only if its claim still holds
    /// it; whether it did.
    fn dead_letter(&mut self, token: &str, id: i64, error: &str) -> QueryResult<bool>;

    /// Unparks the lowest pending message of each key, if it is parked.
    fn promote_heads(&mut self, keys: &[&str]) -> QueryResult<()>;

    /// Of `ids`, those still in the outbox.
    fn present(&mut self, ids: &[i64]) -> QueryResult<Vec<i64>>;

    /// Of `ids`, those leased to another claim than `token`.
    fn held_by_others(&mut self, token: &str, ids: &[i64]) -> QueryResult<Vec<i64>>;

    /// Renews the leases of `ids` still held by `token`; returns those renewed.
    fn extend_leases(
        &mut self,
        token: &str,
        ids: &[i64],
        lease_micros: i64,
    ) -> QueryResult<Vec<i64>>;

    /// The safety net of parking: unparks the lowest parked message of every key with no
    /// lower one pending; returns how many.
    fn promote_stranded(&mut self) -> QueryResult<usize>;

    /// A transaction for a settlement: writes at once (SQLite), commits without waiting for
    /// the log flush (PostgreSQL).
    fn settle_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T>;

    /// Pending messages, by position.
    fn pending(&mut self, filter: &Filter<'_>) -> QueryResult<Vec<PendingRow>>;

    /// Dead letters, by position.
    fn dead_letters(&mut self, filter: &Filter<'_>) -> QueryResult<Vec<DeadLetterRow>>;

    /// Moves the selected dead letters back into the outbox at their positions, locked first
    /// so a dead letter moves whole or not at all; returns their positions.
    fn requeue(&mut self, selection: &Selection<'_>) -> QueryResult<Vec<i64>>;

    /// Deletes the selected dead letters; returns how many.
    fn purge(&mut self, selection: &Selection<'_>) -> QueryResult<usize>;

    /// Pending and in-flight counts and the oldest enqueue time by type; dead counts by type.
    fn stats(&mut self) -> QueryResult<(Vec<StatsRow>, Vec<StatsRow>)>;

    /// A server setting that would refuse the worker's statements, as a sentence saying what
    /// to change; checked once when a worker starts.
    fn refusing_setting(&mut self) -> QueryResult<Option<String>> {
        Ok(None)
    }

    /// Records `key` for the message `message_id` unless recorded; whether it was new. An
    /// enqueue in another transaction with the same key waits until this one ends.
    fn reserve_idempotency_key(&mut self, key: &str, message_id: &str) -> QueryResult<bool>;

    /// The message id recorded with `key`, as committed (whatever snapshot the transaction
    /// holds, where the backend allows).
    fn idempotent_message(&mut self, key: &str) -> QueryResult<Option<String>>;

    /// Stores with `key` the position of the message this connection inserted last.
    fn set_idempotency_position(&mut self, key: &str) -> QueryResult<()>;

    /// The positions of up to `limit` keys not stamped settled, after `after`, in order.
    fn unsettled_idempotency_keys(&mut self, after: i64, limit: i64) -> QueryResult<Vec<i64>>;

    /// Stamps settled the keys at `positions` whose message has left the outbox and the dead
    /// letters (at most [`ID_CHUNK`] positions); returns how many.
    fn settle_idempotency_keys(&mut self, positions: &[i64]) -> QueryResult<usize>;

    /// Deletes up to `limit` keys stamped settled more than `window_micros` ago; returns how
    /// many.
    fn expire_idempotency_keys(&mut self, window_micros: i64, limit: i64) -> QueryResult<usize>;

    /// Records a received webhook id unless recorded; whether it was new.
    #[cfg_attr(not(feature = "webhook"), allow(dead_code))]
    fn inbox_record(&mut self, id: &str) -> QueryResult<bool>;

    /// Records an admin session as signed out until `expires_unix`.
    fn revoke_session(&mut self, session_id: &str, expires_unix: i64) -> QueryResult<()>;

    /// Whether an admin session signed out.
    fn session_revoked(&mut self, session_id: &str) -> QueryResult<bool>;

    /// Forgets signed-out sessions that expired before `now_unix`; returns how many.
    fn forget_revoked_sessions(&mut self, now_unix: i64) -> QueryResult<usize>;

    /// Deletes up to `limit` inbox ids received more than `older_than_micros` ago; returns
    /// how many.
    fn inbox_sweep(&mut self, older_than_micros: i64, limit: i64) -> QueryResult<usize>;

    /// Deletes up to `limit` dead letters, oldest first, that failed more than
    /// `older_than_micros` ago; returns how many.
    fn prune_dead_letters(&mut self, older_than_micros: i64, limit: i64) -> QueryResult<usize>;

    /// Messages in the outbox and how long the oldest due one has waited.
    fn backlog(&mut self) -> QueryResult<BacklogRow>;

    /// The pending message with this message id (at most one row).
    fn pending_by_message_id(&mut self, message_id: &str) -> QueryResult<Vec<PendingRow>>;

    /// The dead letter with this message id (at most one row).
    fn dead_by_message_id(&mut self, message_id: &str) -> QueryResult<Vec<DeadLetterRow>>;

    /// The positions of the dead letters of a type (`None`: every one), in order.
    fn dead_positions(&mut self, message_type: Option<&str>) -> QueryResult<Vec<i64>>;

    /// Heads of ordering keys waiting for a retry, at most `limit`, soonest retry first.
    fn blocked_keys(&mut self, limit: i64) -> QueryResult<Vec<BlockedKeyRow>>;

    /// Records a destination as healthy unless it is known.
    fn add_destination(&mut self, name: &str, kind: &str) -> QueryResult<()>;

    /// A destination, locked until the transaction ends (no row: unknown).
    fn lock_destination(&mut self, name: &str) -> QueryResult<Vec<StoredDestinationRow>>;

    /// A destination's turns under a rate limit across processes, locked until the
    /// transaction ends (no row: unknown).
    fn lock_turns(&mut self, name: &str) -> QueryResult<Vec<TurnsRow>>;

    /// Writes a destination's turns back.
    fn write_turns(&mut self, name: &str, turns: &Turns) -> QueryResult<()>;

    /// Writes a worker's report of a destination.
    fn report_destination(&mut self, report: &DestinationReport) -> QueryResult<()>;

    /// Every destination, by name.
    fn destinations(&mut self) -> QueryResult<Vec<DestinationRow>>;

    /// An operator's enable; how many destinations it changed (0: unknown name).
    fn enable_destination(&mut self, name: &str) -> QueryResult<usize>;

    /// An operator's disable; how many destinations it changed (0: unknown name).
    fn disable_destination(&mut self, name: &str, reason: &str) -> QueryResult<usize>;

    /// A message its worker found paused, given back marked paused and due [`PAUSED_FOR`]
    /// from now, the attempt not counted; whether its claim still held it.
    fn pause_message(&mut self, token: &str, id: i64, reason: &str) -> QueryResult<bool>;

    /// Every paused message whose type is not paused made due now; how many.
    fn release_paused(&mut self) -> QueryResult<usize>;

    /// An operator's pause of a `type` or `destination`; 0 if it was paused already.
    fn pause(&mut self, kind: &str, name: &str, reason: &str) -> QueryResult<usize>;

    /// An operator's resume; 0 if it was not paused.
    fn resume(&mut self, kind: &str, name: &str) -> QueryResult<usize>;

    /// Every pause, by kind and name.
    fn pauses(&mut self) -> QueryResult<Vec<PauseRow>>;
}

/// How far ahead a paused message is due: out of every claim's way (claims read due rows
/// only) until a resume makes it due at once; a time every backend's arithmetic takes.
pub(crate) const PAUSED_FOR: std::time::Duration = LONGEST_AGE;

/// A pause as stored.
#[derive(QueryableByName, Debug)]
pub(crate) struct PauseRow {
    #[diesel(sql_type = Text)]
    pub(crate) kind: String,
    #[diesel(sql_type = Text)]
    pub(crate) name: String,
    #[diesel(sql_type = Text)]
    pub(crate) reason: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) paused_at: i64,
}

/// One sync of a worker's destinations ([`SharedDestinations::sync_destinations`](outbox_core::store::SharedDestinations::sync_destinations)):
/// in one transaction, the unknown ones recorded, all read locked (in name order, so that two
/// workers lock them in one order), handed to `reconcile`, its reports written.
pub(crate) fn sync_destinations<C: Statements>(
    c: &mut C,
    destinations: &[SyncedDestination<'_>],
    reconcile: &mut dyn FnMut(&[StoredDestination]) -> Vec<DestinationReport>,
) -> QueryResult<()> {
    let mut destinations = destinations.to_vec();
    destinations.sort_unstable_by_key(|d| d.name);
    destinations.dedup_by_key(|d| d.name);
    // The settlement's transaction: a write transaction at once on SQLite; on PostgreSQL a
    // report lost to a database crash is simply written again a few seconds later.
    c.settle_transaction(|c| {
        for destination in &destinations {
            c.add_destination(destination.name, destination.kind)?;
        }
        let mut stored = Vec::with_capacity(destinations.len());
        for destination in &destinations {
            stored.extend(
                c.lock_destination(destination.name)?
                    .into_iter()
                    .map(StoredDestinationRow::into_stored),
            );
        }
        for report in reconcile(&stored) {
            c.report_destination(&report)?;
        }
        Ok(())
    })
}

/// How many batches of [`ID_CHUNK`] rows one pruning pass of the worker reads or deletes at
/// most (idempotency keys, dead letters, inbox ids), so that it stays short whatever the
/// tables hold.
pub(crate) const PRUNE_ROUNDS: usize = 10;

/// How many times a statement chosen as a deadlock's victim is run again before its error is
/// returned.
pub(crate) const DEADLOCK_RETRIES: usize = 5;

/// Whether the database answered "not now": a lock held elsewhere outlasted the wait for it, a
/// deadlock, a statement or lock timeout (by each backend's message: Diesel keeps no error
/// codes but PostgreSQL's few kinds).
pub(crate) fn is_busy(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};

    const BUSY: &[&str] = &[
        "lock wait timeout exceeded",                   // MySQL 1205
        "deadlock found when trying to get lock",       // MySQL 1213
        "database is locked",                           // SQLite BUSY
        "database table is locked",                     // SQLite LOCKED
        "deadlock detected",                            // PostgreSQL 40P01
        "canceling statement due to lock timeout",      // PostgreSQL 55P03
        "canceling statement due to statement timeout", // PostgreSQL 57014
        "could not obtain lock",                        // PostgreSQL 55P03
    ];
    match error {
        Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => true,
        Error::DatabaseError(_, info) => {
            let message = info.message().to_ascii_lowercase();
            BUSY.iter().any(|busy| message.contains(busy))
        }
        _ => false,
    }
}

/// Runs `statement` again, up to [`DEADLOCK_RETRIES`] times, while the database picks it as a
/// deadlock's victim (MySQL, where two workers' batched deletes over one index range, or an
/// operator's resume and a worker's settlement of the same rows, lock in orders that cross):
/// the victim was rolled back whole, and running it again does what it would have done. Never
/// inside a transaction open on `c` (a caller's), which the deadlock rolled back whole too: its
/// error goes back to the caller, whose transaction it ended.
pub(crate) fn retry_deadlocks<C, T>(
    c: &mut C,
    mut statement: impl FnMut(&mut C) -> QueryResult<T>,
) -> QueryResult<T>
where
    C: Statements,
{
    let mut outcome = statement(c);
    for _ in 0..DEADLOCK_RETRIES {
        let deadlocked = matches!(
            outcome,
            Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::SerializationFailure,
                _
            ))
        );
        if !deadlocked || transaction_open(c).unwrap_or(true) {
            break;
        }
        outcome = statement(c);
    }
    outcome
}

/// Whether a transaction (or a savepoint within one) is open on `c`.
pub(crate) fn transaction_open<C>(c: &mut C) -> QueryResult<bool>
where
    C: diesel::Connection<TransactionManager = AnsiTransactionManager>,
{
    Ok(AnsiTransactionManager::transaction_manager_status_mut(c)
        .transaction_depth()?
        .is_some())
}

/// Runs `delete_batch` (which deletes up to the limit it is given and says how many) until a
/// batch comes back short or `rounds` batches ran; how many rows were deleted. Every pruning of
/// the worker deletes this way, so that one call's work stays bounded. Workers on one database
/// prune at the same time, so a batch may be a deadlock's victim: it runs again (outside a
/// caller's transaction, see [`retry_deadlocks`]).
pub(crate) fn delete_in_batches<C>(
    c: &mut C,
    rounds: usize,
    mut delete_batch: impl FnMut(&mut C, i64) -> QueryResult<usize>,
) -> QueryResult<usize>
where
    C: Statements,
{
    let mut deleted = 0;
    for _ in 0..rounds {
        let n = retry_deadlocks(c, |c| delete_batch(c, to_i64(ID_CHUNK)))?;
        deleted += n;
        if n < ID_CHUNK {
            break;
        }
    }
    Ok(deleted)
}

/// Which dead letters an operation applies to, as the statements take it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Selection<'a> {
    Positions(&'a [i64]),
    MessageType(&'a str),
    All,
}

/// Applies every outcome and returns the positions whose lease had passed to another claim
/// (fenced), which are left untouched: done ones in one statement, the rest in one
/// transaction, promoting the next message of every key whose head left.
pub(crate) fn settle<C: DeliveryLogStatements>(
    c: &mut C,
    outcomes: &[Outcome],
    keeping: Keeping,
) -> QueryResult<Vec<i64>> {
    settle_leasing(c, outcomes, None, keeping).map(|(fenced, _)| fenced)
}

/// What a settlement keeps beside the outcomes: the attempts' exchanges in the delivery log,
/// and the messages leaving the outbox delivered in the archive.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Keeping {
    pub log: DeliveryLog,
    pub archive: bool,
}

impl Keeping {
    /// Nothing: a settlement of the store's own (dead-lettering unreadable rows).
    pub const NOTHING: Keeping = Keeping {
        log: DeliveryLog::Off,
        archive: false,
    };
}

/// [`settle`], and where every outcome is done, the next message of each key leased under
/// `successors` in the same statement ([`Statements::delete_done_leasing`]); returns the fenced
/// positions and the leased rows. What `keeping` keeps (the exchanges in the delivery log, the
/// done messages in the archive) is written in the same transaction.
pub(crate) fn settle_leasing<C: DeliveryLogStatements>(
    c: &mut C,
    outcomes: &[Outcome],
    successors: Option<&Claim<'_>>,
    keeping: Keeping,
) -> QueryResult<(Vec<i64>, Vec<ClaimRow>)> {
    if outcomes.is_empty() {
        // Nothing to write: MySQL and SQLite would refuse an empty `IN ()`.
        return Ok((Vec::new(), Vec::new()));
    }
    let logs = delivery_log::has_exchanges(outcomes, keeping.log);
    let archived = if keeping.archive {
        group_by_claim(
            outcomes
                .iter()
                .filter(|outcome| outcome.settlement == Settlement::Done),
        )
    } else {
        Vec::new()
    };
    let all_done = outcomes
        .iter()
        .all(|outcome| outcome.settlement == Settlement::Done);
    if logs || !archived.is_empty() {
        return c.settle_transaction(|c| {
            delivery_log::log_exchanges(c, outcomes, keeping.log)?;
            delivery_log::archive(c, &archived)?;
            if all_done {
                settle_done(c, outcomes, successors)
            } else {
                settle_each(c, outcomes)
            }
        });
    }
    if all_done {
        // One statement: no transaction to open.
        return settle_done(c, outcomes, successors);
    }
    c.settle_transaction(|c| settle_each(c, outcomes))
}

/// Settles `outcomes`, every one done: deleted in one statement (which leases each key's next
/// message under `successors`, if given).
fn settle_done<C: Statements>(
    c: &mut C,
    outcomes: &[Outcome],
    successors: Option<&Claim<'_>>,
) -> QueryResult<(Vec<i64>, Vec<ClaimRow>)> {
    let keys = leaving_keys(outcomes);
    {
        let claims = group_by_claim(outcomes);
        let (deleted, leased) = match successors {
            Some(successors) if !keys.is_empty() => {
                c.delete_done_leasing(&claims, &keys, successors)?
            }
            _ => (c.delete_done(&claims, &keys)?, Vec::new()),
        };
        if deleted == outcomes.len() {
            return Ok((Vec::new(), leased));
        }
        let positions: Vec<i64> = outcomes.iter().map(|outcome| outcome.position).collect();
        Ok((c.present(&positions)?, leased))
    }
}

/// Settles `outcomes` one kind at a time, inside the caller's transaction.
fn settle_each<C: Statements>(
    c: &mut C,
    outcomes: &[Outcome],
) -> QueryResult<(Vec<i64>, Vec<ClaimRow>)> {
    let keys = leaving_keys(outcomes);
    {
        let mut fenced = Vec::new();
        let mut done: Vec<&Outcome> = Vec::new();
        let mut released: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for outcome in outcomes {
            let token = outcome.token.to_string();
            let id = outcome.position;
            let kept = match &outcome.settlement {
                Settlement::Done => {
                    done.push(outcome);
                    true
                }
                Settlement::Release => {
                    released.entry(token).or_default().push(id);
                    true
                }
                Settlement::Retry { delay, error } => {
                    c.reschedule(&token, id, micros(*delay), error, true)?
                }
                Settlement::Defer { delay, reason } => {
                    c.reschedule(&token, id, micros(*delay), reason, false)?
                }
                Settlement::Pause { reason } => c.pause_message(&token, id, reason)?,
                Settlement::DeadLetter { error } => c.dead_letter(&token, id, error)?,
            };
            if !kept {
                fenced.push(id);
            }
        }
        if !done.is_empty() {
            let claims = group_by_claim(done.iter().copied());
            if c.delete_done(&claims, &[])? < done.len() {
                let positions: Vec<i64> = done.iter().map(|o| o.position).collect();
                fenced.extend(c.present(&positions)?);
            }
        }
        for (token, ids) in &released {
            if c.release(token, ids)? < ids.len() {
                // Released rows stay: only those now leased to someone else were fenced.
                fenced.extend(c.held_by_others(token, ids)?);
            }
        }
        if !keys.is_empty() {
            c.promote_heads(&keys)?;
        }
        Ok((fenced, Vec::new()))
    }
}

/// The ordering keys of outcomes that take their message out of the outbox.
fn leaving_keys(outcomes: &[Outcome]) -> Vec<&str> {
    let mut keys: Vec<&str> = outcomes
        .iter()
        .filter(|outcome| {
            matches!(
                outcome.settlement,
                Settlement::Done | Settlement::DeadLetter { .. }
            )
        })
        .filter_map(|outcome| outcome.ordering_key.as_deref())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The outcomes' positions by claim token.
fn group_by_claim<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Vec<(String, Vec<i64>)> {
    let mut by_claim: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for outcome in outcomes {
        by_claim
            .entry(outcome.token.to_string())
            .or_default()
            .push(outcome.position);
    }
    by_claim.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use outbox_core::store::ClaimToken;
    use outbox_core::MessageId;

    use super::*;

    /// A deadlock's victim runs again on its own, never inside a transaction of the caller's,
    /// which the deadlock rolled back whole.
    #[cfg(feature = "sqlite")]
    #[test]
    fn a_deadlocked_statement_runs_again_only_outside_a_transaction() {
        use diesel::connection::Connection;
        use diesel::result::{DatabaseErrorKind, Error};

        let deadlocked = || -> QueryResult<()> {
            Err(Error::DatabaseError(
                DatabaseErrorKind::SerializationFailure,
                Box::new(String::from("Deadlock found when trying to get lock")),
            ))
        };
        let mut c = diesel::SqliteConnection::establish(":memory:").expect("in-memory SQLite");
        let mut runs = 0;
        let outcome = retry_deadlocks(&mut c, |_| {
            runs += 1;
            deadlocked()
        });
        assert!(outcome.is_err());
        assert_eq!(runs, 1 + DEADLOCK_RETRIES, "alone, it runs again");

        let mut runs_inside = 0;
        let inside: QueryResult<()> = c.transaction(|c| {
            retry_deadlocks(c, |_| {
                runs_inside += 1;
                deadlocked()
            })
        });
        assert!(inside.is_err());
        assert_eq!(
            runs_inside, 1,
            "inside a transaction, its error goes back at once"
        );
    }

    /// A candidate as the shares see it: position, group, raised or not, due time.
    type Row = (i64, Option<&'static str>, bool, i64);

    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    fn shared_out(read: Vec<Row>, shares: Vec<Vec<Row>>) -> Vec<i64> {
        share_out(
            read,
            shares,
            |row| row.0,
            |row| row.1,
            |row| row.2,
            |row| (std::cmp::Reverse(row.2), row.3, row.0),
        )
        .into_iter()
        .map(|row| row.0)
        .collect()
    }

    /// Raised first; then the first of every group (ungrouped rows being one more) before the
    /// second of any; a row read in both lanes counted once, in its share; and a group's rows in
    /// the ordinary lane after its share, so that cutting the batch anywhere never takes a
    /// group's later row without its earlier ones.
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    #[test]
    fn claims_share_out_groups_in_turn_each_in_its_order() {
        let a = Some("a");
        let b = Some("b");
        let read = vec![
            (1, a, false, 1),
            (2, a, false, 2),
            (3, a, false, 3),
            (4, a, false, 4),
            (5, None, false, 5),
            (6, None, false, 6),
            (20, None, true, 20),
        ];
        let shares = vec![
            vec![(1, a, false, 1), (2, a, false, 2)],
            vec![(10, b, false, 10), (11, b, false, 11), (12, b, false, 12)],
        ];
        assert_eq!(shared_out(read, shares), [20, 1, 5, 10, 2, 6, 11, 3, 12, 4]);
    }

    fn outcome(
        token: ClaimToken,
        position: i64,
        key: Option<&str>,
        settlement: Settlement,
    ) -> Outcome {
        Outcome {
            token,
            position,
            message_id: MessageId::new(),
            ordering_key: key.map(str::to_owned),
            log: None,
            settlement,
        }
    }

    #[test]
    fn only_outcomes_that_remove_their_message_promote_their_key() {
        let t = ClaimToken::new();
        let retry = Settlement::Retry {
            delay: std::time::Duration::ZERO,
            error: String::new(),
        };
        let outcomes = [
            outcome(t, 1, Some("a"), Settlement::Done),
            outcome(t, 2, Some("b"), retry),
            outcome(
                t,
                3,
                Some("c"),
                Settlement::DeadLetter {
                    error: String::new(),
                },
            ),
            outcome(t, 4, Some("a"), Settlement::Done),
            outcome(t, 5, None, Settlement::Done),
            outcome(t, 6, Some("d"), Settlement::Release),
        ];
        assert_eq!(leaving_keys(&outcomes), ["a", "c"]);
    }

    #[test]
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    fn outcomes_group_by_claim_and_lists_get_one_placeholder_per_id() {
        let (a, b) = (ClaimToken::new(), ClaimToken::new());
        let groups = group_by_claim(&[
            outcome(a, 1, None, Settlement::Done),
            outcome(b, 2, None, Settlement::Done),
            outcome(a, 3, None, Settlement::Done),
        ]);
        assert_eq!(groups.len(), 2);
        assert_eq!(
            groups.iter().find(|(t, _)| *t == a.to_string()).unwrap().1,
            [1, 3]
        );
        assert_eq!(placeholders(3), "?, ?, ?");
        assert_eq!(placeholders(0), "");
    }
}
