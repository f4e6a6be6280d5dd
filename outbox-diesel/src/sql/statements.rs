//! What a backend's statements do ([`Statements`], implemented in each backend's file), what
//! they take (a claim, a listing's filter, a cursor) and the helpers every backend's statements
//! share (binds, placeholders, chunks, deadlock retries).

use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::QueryResult;
use outbox_core::store::{ClaimLimit, DestinationReport, Turns};

use super::bind::Bind;
use super::new_message::NewMessage;
use super::rows::*;

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

/// What a settlement may lease of the ordering keys it settles (see
/// [`Statements::delete_done_leasing`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Successors<'a> {
    /// The claim they are leased under, its lease, and the bytes one key's may have together.
    pub claim: Claim<'a>,
    /// The most messages of one key, from its front.
    pub per_key: usize,
}

impl Successors<'_> {
    /// The most messages of one key as SQL takes it.
    #[cfg(feature = "postgres")]
    pub fn per_key(&self) -> i64 {
        to_i64(self.per_key.max(1))
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

/// Reads rows of type `R` with one of the [`Dialect`]'s statements: each backend implements it
/// for every row its Diesel backend can load, and [`Statements`] asks for each row type its
/// provided methods read.
pub(crate) trait LoadFixed<R> {
    /// Runs `sql` with `binds`; the rows it read.
    fn load_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<Vec<R>>;
}

/// The text of the statements every backend runs the same way but for their text: each
/// backend's file gives them (`impl Dialect for PgConnection` in `postgres.rs`, and so on), with
/// what each binds, and the provided methods of [`Statements`] run them.
pub(crate) trait Dialect {
    /// The statement of [`Statements::add_destination`].
    const ADD_DESTINATION: &'static str;
    /// The statement of [`Statements::backlog`].
    const BACKLOG: &'static str;
    /// The statement of [`Statements::blocked_keys`].
    const BLOCKED_KEYS: &'static str;
    /// The statement of [`Statements::dead_by_message_id`].
    const DEAD_BY_MESSAGE_ID: &'static str;
    /// The statement of [`Statements::dead_positions`].
    const DEAD_POSITIONS: &'static str;
    /// The statement of [`Statements::destinations`].
    const DESTINATIONS: &'static str;
    /// The statement of [`Statements::disable_destination`].
    const DISABLE_DESTINATION: &'static str;
    /// The statement of [`Statements::enable_destination`].
    const ENABLE_DESTINATION: &'static str;
    /// The statement of [`Statements::expire_idempotency_keys`].
    const EXPIRE_KEYS: &'static str;
    /// The statement of [`Statements::forget_revoked_sessions`].
    const FORGET_REVOKED: &'static str;
    /// The statement of [`Statements::inbox_record`].
    const INBOX_RECORD: &'static str;
    /// The statement of [`Statements::inbox_sweep`].
    const INBOX_SWEEP: &'static str;
    /// The statement of [`Statements::idempotent_message`].
    const KEYED_MESSAGE: &'static str;
    /// The statement of [`Statements::lock_destination`].
    const LOCK_DESTINATION: &'static str;
    /// The statement of [`Statements::lock_turns`].
    const LOCK_TURNS: &'static str;
    /// The statement of [`Statements::pause`].
    const PAUSE: &'static str;
    /// The statement of [`Statements::pauses`].
    const PAUSES: &'static str;
    /// The statement of [`Statements::pause_message`].
    const PAUSE_MESSAGE: &'static str;
    /// The statement of [`Statements::pending_by_message_id`].
    const PENDING_BY_MESSAGE_ID: &'static str;
    /// The statement of [`Statements::prune_dead_letters`].
    const PRUNE_DEAD_LETTERS: &'static str;
    /// The statement of [`Statements::release_paused`].
    const RELEASE_PAUSED: &'static str;
    /// The statement of [`Statements::report_destination`].
    const REPORT_DESTINATION: &'static str;
    /// The statement of [`Statements::reserve_idempotency_key`].
    const RESERVE_KEY: &'static str;
    /// The statement of [`Statements::resume`].
    const RESUME: &'static str;
    /// The statement of [`Statements::revoke_session`].
    const REVOKE_SESSION: &'static str;
    /// The statement of [`Statements::session_revoked`].
    const SESSION_REVOKED: &'static str;
    /// The statement of [`Statements::set_idempotency_position`].
    const SET_KEY_POSITION: &'static str;
    /// The statement of [`Statements::unsettled_idempotency_keys`].
    const UNSETTLED_KEYS: &'static str;
    /// The statement of [`Statements::write_turns`].
    const WRITE_TURNS: &'static str;
    /// The statement of [`Statements::dead_letters`].
    const DEAD_LETTERS: &'static str;
    /// The statement of [`Statements::pending`].
    const PENDING: &'static str;
    /// The statement of [`Statements::pending`].
    const PENDING_BY_KEY: &'static str;
    /// The statement of [`Statements::reschedule`].
    const RESCHEDULE: &'static str;
    /// The statement of [`Statements::stats`].
    const STATS_DEAD: &'static str;
    /// The statement of [`Statements::stats`].
    const STATS_PENDING: &'static str;
}

/// What a backend's statements do; each backend implements it in its own file.
pub(crate) trait Statements:
    Dialect
    + Sized
    + diesel::Connection<TransactionManager = AnsiTransactionManager>
    + LoadFixed<MessageIdRow>
    + LoadFixed<IdRow>
    + LoadFixed<FoundRow>
    + LoadFixed<PendingRow>
    + LoadFixed<DeadLetterRow>
    + LoadFixed<BlockedKeyRow>
    + LoadFixed<StoredDestinationRow>
    + LoadFixed<TurnsRow>
    + LoadFixed<DestinationRow>
    + LoadFixed<PauseRow>
    + LoadFixed<BacklogRow>
    + LoadFixed<StatsRow>
{
    /// Runs `sql`, one of the [`Dialect`]'s statements, with `binds`; how many rows it changed.
    fn run_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize>;

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
    /// next messages, a prefix of the key of at most `successors.per_key`, where they are due
    /// and within `successors`' bytes; returns how many were deleted and the leased rows. Where
    /// the backend cannot do it in the same statement, it leases nothing (the claimer takes
    /// those messages).
    fn delete_done_leasing(
        &mut self,
        claims: &[(String, Vec<i64>)],
        keys: &[&str],
        successors: &Successors<'_>,
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
    ) -> QueryResult<bool> {
        let binds = [
            Bind::BigInt(delay_micros),
            Bind::Text(text),
            Bind::BigInt(i64::from(!count_attempt)),
            Bind::BigInt(id),
            Bind::Text(token),
        ];
        Ok(self.run_fixed(Self::RESCHEDULE, &binds)? == 1)
    }

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
    fn pending(&mut self, filter: &Filter<'_>) -> QueryResult<Vec<PendingRow>> {
        let (statement, binds) = filter.pending_query(Self::PENDING, Self::PENDING_BY_KEY);
        self.load_fixed(statement, &binds)
    }

    /// Dead letters, by position.
    fn dead_letters(&mut self, filter: &Filter<'_>) -> QueryResult<Vec<DeadLetterRow>> {
        self.load_fixed(Self::DEAD_LETTERS, &filter.dead_binds())
    }

    /// Moves the selected dead letters back into the outbox at their positions, locked first
    /// so a dead letter moves whole or not at all; returns their positions.
    fn requeue(&mut self, selection: &Selection<'_>) -> QueryResult<Vec<i64>>;

    /// Deletes the selected dead letters; returns how many.
    fn purge(&mut self, selection: &Selection<'_>) -> QueryResult<usize>;

    /// Pending and in-flight counts and the oldest enqueue time by type; dead counts by type.
    fn stats(&mut self) -> QueryResult<(Vec<StatsRow>, Vec<StatsRow>)> {
        Ok((
            self.load_fixed(Self::STATS_PENDING, &[])?,
            self.load_fixed(Self::STATS_DEAD, &[])?,
        ))
    }

    /// A server setting that would refuse the worker's statements, as a sentence saying what
    /// to change; checked once when a worker starts.
    fn refusing_setting(&mut self) -> QueryResult<Option<String>> {
        Ok(None)
    }

    /// Records `key` for the message `message_id` unless recorded; whether it was new. An
    /// enqueue in another transaction with the same key waits until this one ends.
    fn reserve_idempotency_key(&mut self, key: &str, message_id: &str) -> QueryResult<bool> {
        Ok(self.run_fixed(
            Self::RESERVE_KEY,
            &[Bind::Text(key), Bind::Text(message_id)],
        )? == 1)
    }

    /// The message id recorded with `key`, as committed (whatever snapshot the transaction
    /// holds, where the backend allows).
    fn idempotent_message(&mut self, key: &str) -> QueryResult<Option<String>> {
        let rows: Vec<MessageIdRow> = self.load_fixed(Self::KEYED_MESSAGE, &[Bind::Text(key)])?;
        Ok(rows.into_iter().next().map(|row| row.message_id))
    }

    /// Stores with `key` the position of the message this connection inserted last.
    fn set_idempotency_position(&mut self, key: &str) -> QueryResult<()> {
        self.run_fixed(Self::SET_KEY_POSITION, &[Bind::Text(key)])
            .map(drop)
    }

    /// The positions of up to `limit` keys not stamped settled, after `after`, in order.
    fn unsettled_idempotency_keys(&mut self, after: i64, limit: i64) -> QueryResult<Vec<i64>> {
        let binds = [Bind::BigInt(after), Bind::BigInt(limit)];
        let rows: Vec<IdRow> = self.load_fixed(Self::UNSETTLED_KEYS, &binds)?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    /// Stamps settled the keys at `positions` whose message has left the outbox and the dead
    /// letters (at most [`ID_CHUNK`] positions); returns how many.
    fn settle_idempotency_keys(&mut self, positions: &[i64]) -> QueryResult<usize>;

    /// Deletes up to `limit` keys stamped settled more than `window_micros` ago; returns how
    /// many.
    fn expire_idempotency_keys(&mut self, window_micros: i64, limit: i64) -> QueryResult<usize> {
        let binds = [Bind::BigInt(window_micros), Bind::BigInt(limit)];
        self.run_fixed(Self::EXPIRE_KEYS, &binds)
    }

    /// Records a received webhook id unless recorded; whether it was new.
    #[cfg_attr(not(feature = "webhook"), allow(dead_code))]
    fn inbox_record(&mut self, id: &str) -> QueryResult<bool> {
        Ok(self.run_fixed(Self::INBOX_RECORD, &[Bind::Text(id)])? == 1)
    }

    /// Records an admin session as signed out until `expires_unix`.
    fn revoke_session(&mut self, session_id: &str, expires_unix: i64) -> QueryResult<()> {
        let binds = [Bind::Text(session_id), Bind::BigInt(expires_unix)];
        self.run_fixed(Self::REVOKE_SESSION, &binds).map(drop)
    }

    /// Whether an admin session signed out.
    fn session_revoked(&mut self, session_id: &str) -> QueryResult<bool> {
        let rows: Vec<FoundRow> =
            self.load_fixed(Self::SESSION_REVOKED, &[Bind::Text(session_id)])?;
        Ok(rows.first().is_some_and(|row| row.found > 0))
    }

    /// Forgets signed-out sessions that expired before `now_unix`; returns how many.
    fn forget_revoked_sessions(&mut self, now_unix: i64) -> QueryResult<usize> {
        self.run_fixed(Self::FORGET_REVOKED, &[Bind::BigInt(now_unix)])
    }

    /// Deletes up to `limit` inbox ids received more than `older_than_micros` ago; returns
    /// how many.
    fn inbox_sweep(&mut self, older_than_micros: i64, limit: i64) -> QueryResult<usize> {
        let binds = [Bind::BigInt(older_than_micros), Bind::BigInt(limit)];
        self.run_fixed(Self::INBOX_SWEEP, &binds)
    }

    /// Deletes up to `limit` dead letters, oldest first, that failed more than
    /// `older_than_micros` ago; returns how many.
    fn prune_dead_letters(&mut self, older_than_micros: i64, limit: i64) -> QueryResult<usize> {
        let binds = [Bind::BigInt(older_than_micros), Bind::BigInt(limit)];
        self.run_fixed(Self::PRUNE_DEAD_LETTERS, &binds)
    }

    /// Messages in the outbox and how long the oldest due one has waited.
    fn backlog(&mut self) -> QueryResult<BacklogRow> {
        let rows: Vec<BacklogRow> = self.load_fixed(Self::BACKLOG, &[])?;
        rows.into_iter()
            .next()
            .ok_or(diesel::result::Error::NotFound)
    }

    /// The pending message with this message id (at most one row).
    fn pending_by_message_id(&mut self, message_id: &str) -> QueryResult<Vec<PendingRow>> {
        let binds = [Bind::BigInt(WHOLE_PAYLOAD), Bind::Text(message_id)];
        self.load_fixed(Self::PENDING_BY_MESSAGE_ID, &binds)
    }

    /// The dead letter with this message id (at most one row).
    fn dead_by_message_id(&mut self, message_id: &str) -> QueryResult<Vec<DeadLetterRow>> {
        let binds = [Bind::BigInt(WHOLE_PAYLOAD), Bind::Text(message_id)];
        self.load_fixed(Self::DEAD_BY_MESSAGE_ID, &binds)
    }

    /// The positions of the dead letters of a type (`None`: every one), in order.
    fn dead_positions(&mut self, message_type: Option<&str>) -> QueryResult<Vec<i64>> {
        let binds = [Bind::NullableText(message_type)];
        let rows: Vec<IdRow> = self.load_fixed(Self::DEAD_POSITIONS, &binds)?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    /// Heads of ordering keys waiting for a retry, at most `limit`, soonest retry first.
    fn blocked_keys(&mut self, limit: i64) -> QueryResult<Vec<BlockedKeyRow>> {
        self.load_fixed(Self::BLOCKED_KEYS, &[Bind::BigInt(limit)])
    }

    /// Records a destination as healthy unless it is known.
    fn add_destination(&mut self, name: &str, kind: &str) -> QueryResult<()> {
        self.run_fixed(Self::ADD_DESTINATION, &[Bind::Text(name), Bind::Text(kind)])
            .map(drop)
    }

    /// A destination, locked until the transaction ends (no row: unknown).
    fn lock_destination(&mut self, name: &str) -> QueryResult<Vec<StoredDestinationRow>> {
        self.load_fixed(Self::LOCK_DESTINATION, &[Bind::Text(name)])
    }

    /// A destination's turns under a rate limit across processes, locked until the
    /// transaction ends (no row: unknown).
    fn lock_turns(&mut self, name: &str) -> QueryResult<Vec<TurnsRow>> {
        self.load_fixed(Self::LOCK_TURNS, &[Bind::Text(name)])
    }

    /// Writes a destination's turns back.
    fn write_turns(&mut self, name: &str, turns: &Turns) -> QueryResult<()> {
        let binds = [
            Bind::BigInt(TurnsRow::millionths(turns.tokens)),
            Bind::BigInt(turns.refilled),
            Bind::NullableBigInt(turns.booked_until),
            Bind::BigInt(turns.last_turn),
            Bind::Text(name),
        ];
        self.run_fixed(Self::WRITE_TURNS, &binds).map(drop)
    }

    /// Writes a worker's report of a destination.
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
        self.run_fixed(Self::REPORT_DESTINATION, &binds).map(drop)
    }

    /// Every destination, by name.
    fn destinations(&mut self) -> QueryResult<Vec<DestinationRow>> {
        self.load_fixed(Self::DESTINATIONS, &[])
    }

    /// An operator's enable; how many destinations it changed (0: unknown name).
    fn enable_destination(&mut self, name: &str) -> QueryResult<usize> {
        self.run_fixed(Self::ENABLE_DESTINATION, &[Bind::Text(name)])
    }

    /// An operator's disable; how many destinations it changed (0: unknown name).
    fn disable_destination(&mut self, name: &str, reason: &str) -> QueryResult<usize> {
        self.run_fixed(
            Self::DISABLE_DESTINATION,
            &[Bind::Text(reason), Bind::Text(name)],
        )
    }

    /// A message its worker found paused, given back marked paused and due [`PAUSED_FOR`]
    /// from now, the attempt not counted; whether its claim still held it.
    fn pause_message(&mut self, token: &str, id: i64, reason: &str) -> QueryResult<bool> {
        let binds = [
            Bind::BigInt(micros(PAUSED_FOR)),
            Bind::Text(reason),
            Bind::BigInt(id),
            Bind::Text(token),
        ];
        Ok(self.run_fixed(Self::PAUSE_MESSAGE, &binds)? == 1)
    }

    /// Every paused message whose type is not paused made due now; how many.
    fn release_paused(&mut self) -> QueryResult<usize> {
        self.run_fixed(Self::RELEASE_PAUSED, &[])
    }

    /// An operator's pause of a `type` or `destination`; 0 if it was paused already.
    fn pause(&mut self, kind: &str, name: &str, reason: &str) -> QueryResult<usize> {
        self.run_fixed(
            Self::PAUSE,
            &[Bind::Text(kind), Bind::Text(name), Bind::Text(reason)],
        )
    }

    /// An operator's resume; 0 if it was not paused.
    fn resume(&mut self, kind: &str, name: &str) -> QueryResult<usize> {
        self.run_fixed(Self::RESUME, &[Bind::Text(kind), Bind::Text(name)])
    }

    /// Every pause, by kind and name.
    fn pauses(&mut self) -> QueryResult<Vec<PauseRow>> {
        self.load_fixed(Self::PAUSES, &[])
    }
}

/// How far ahead a paused message is due: out of every claim's way (claims read due rows
/// only) until a resume makes it due at once; a time every backend's arithmetic takes.
pub(crate) const PAUSED_FOR: std::time::Duration = LONGEST_AGE;

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
