//! MySQL's and MariaDB's statements. Times are `DATETIME(6)` in UTC, written with
//! `UTC_TIMESTAMP(6)` whatever the session's time zone. Lists of ids take one bind each
//! (`IN (?, ?, …)`), so texts with lists are built per call, in chunks of [`ID_CHUNK`]. MySQL
//! has no `UPDATE … RETURNING` and cannot read a table in a subquery of a statement changing
//! it, so the claim and the moves are a few statements in a transaction.

use std::cmp::Reverse;

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::{Connection, QueryResult, QueryableByName, RunQueryDsl};

use super::bind::{dynamic, Bind, Placeholders, Prepared};
use super::cancel::{CancelRows, CancelStatements, KeyedRow};
use super::delivery_log::{
    ArchivedRow, AttemptRow, DeliveryLogStatements, LastIdRow, LAST_ATTEMPT_ID,
};
use super::subscription::{SubscriptionDialect, SubscriptionStatements};
use super::{
    placeholders, Claim, Claimed, CountRow, Cursor, Dialect, HorizonRow, IdRow, LoadFixed,
    Selection, Statements, ID_CHUNK,
};
use crate::sql::new_message::NewMessage;

const STYLE: Placeholders = Placeholders::Question;

/// Bind parameters one statement may carry.
pub(crate) const MAX_BINDS: usize = 65_535;

/// One message, as `enqueue` writes it: binds message id, type, payload, its size in bytes,
/// ordering key, not-before in µs since the epoch (NULL: now plus the delay), delay in µs
/// (NULL: none), headers (JSON, NULL: none), priority level, group, whether an earlier row of
/// the insert has its key (parked from the start). Nothing is read: under REPEATABLE READ a read
/// inside an `INSERT` takes shared gap locks that block other keys' inserts (measured: 3 s).
pub(crate) const INSERT_MESSAGE: &str = "INSERT INTO outbox_message \
     (message_id, message_type, payload, payload_bytes, ordering_key, created_at, \
      next_attempt_at, headers, priority, group_name, owner, parked) \
     VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6), \
     GREATEST(COALESCE(TIMESTAMPADD(MICROSECOND, ?, '1970-01-01'), \
         TIMESTAMPADD(MICROSECOND, COALESCE(?, 0), UTC_TIMESTAMP(6))), UTC_TIMESTAMP(6)), \
     ?, ?, ?, ?, ?)";

/// The VALUES tuple of each further row of a batch insert.
const INSERT_VALUES: &str = "(?, ?, ?, ?, ?, UTC_TIMESTAMP(6), \
     GREATEST(COALESCE(TIMESTAMPADD(MICROSECOND, ?, '1970-01-01'), \
         TIMESTAMPADD(MICROSECOND, COALESCE(?, 0), UTC_TIMESTAMP(6))), UTC_TIMESTAMP(6)), \
     ?, ?, ?, ?, ?)";

/// The claim's transactions see what others committed, and lock no gaps (REPEATABLE READ
/// would lock the empty range past the last row and block the application's inserts).
pub(crate) const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Whether the server writes a binary log, and in which format (this session's, which the
/// claims would use).
const BINARY_LOGGING: &str =
    "SELECT CAST(@@GLOBAL.log_bin AS SIGNED) AS log_bin, @@SESSION.binlog_format AS binlog_format";

#[derive(QueryableByName)]
struct BinaryLogging {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    log_bin: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    binlog_format: String,
}

/// A binary log in STATEMENT format refuses every write of a READ COMMITTED transaction
/// (error 1665), so it would refuse every claim: what to change, if so.
fn statement_logging_refuses_claims(log_bin: bool, binlog_format: &str) -> Option<String> {
    (log_bin && binlog_format.eq_ignore_ascii_case("STATEMENT")).then(|| {
        "the server writes its binary log with binlog_format=STATEMENT, which refuses the \
         worker's READ COMMITTED claims: set binlog_format=ROW (or MIXED) in the server's \
         configuration, or run SET GLOBAL binlog_format = 'ROW'"
            .to_owned()
    })
}

/// What a claim reads of each candidate: its position, key, the head of its key, due time (µs
/// since the epoch), priority and group.
macro_rules! candidate_columns {
    () => {
        "id, ordering_key, CASE WHEN ordering_key IS NULL THEN id ELSE (\
             SELECT e.id FROM outbox_message e WHERE e.ordering_key = m.ordering_key \
             ORDER BY e.ordering_key, e.id LIMIT 1) END AS head_id, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01', next_attempt_at) AS due, priority, group_name"
    };
}

/// The claim's candidates, read without locks in due order: a batch of due, unparked rows
/// ([`candidates`](super::candidates)), each with the head of its key (itself if it is the head or has no key). The
/// head is read as `ORDER BY … LIMIT 1`, one index entry: MariaDB runs `NOT EXISTS (… e.id <
/// m.id)` as a lookup of the whole key, every pending message of it. The `CASE` is needed, not
/// style: with a large table MariaDB may run the probe null-safe (`<=>`), which would make every
/// message without a key "behind" the lowest one. A locking read would also
/// lock (and, skipping locked rows, skip) the rows the probe looks at. The read starts at the
/// claim cursor (see PostgreSQL's `CLAIM`: a transaction held open keeps purge from removing the
/// entries claimed and settled messages leave behind, and every claim would walk them). The
/// cursor is given twice: MariaDB does not bound an index range by a row comparison
/// (`(a, b) >= (x, y)` scanned from the index's start, 57 pages against 2 behind 40,000
/// purge-blocked entries), so a plain `next_attempt_at >=` bounds the range and the row
/// comparison the order within one due time. The index is named outright: statistics taken
/// while the table was nearly empty make MariaDB scan instead (145 pages a claim behind 80,000
/// purge-blocked rows, against 2 by the range).
///
/// The raised priorities come first, read by their own index from its start (they are few; the
/// cursor is the ordinary messages'). Binds: candidates, then the cursor's due time (µs since the
/// epoch), its due time and id, candidates.
pub const CANDIDATES: &str = concat!(
    "(SELECT ",
    candidate_columns!(),
    " FROM outbox_message m FORCE INDEX (outbox_message_prioritized) \
     WHERE priority > 0 AND parked = 0 AND next_attempt_at <= UTC_TIMESTAMP(6) \
     ORDER BY priority DESC, next_attempt_at, id LIMIT ?) \
     UNION ALL (SELECT ",
    candidate_columns!(),
    " FROM outbox_message m FORCE INDEX (outbox_message_due) \
     WHERE priority <= 0 AND parked = 0 AND next_attempt_at <= UTC_TIMESTAMP(6) \
         AND next_attempt_at >= TIMESTAMPADD(MICROSECOND, ?, '1970-01-01') \
         AND (next_attempt_at, id) >= (TIMESTAMPADD(MICROSECOND, ?, '1970-01-01'), ?) \
     ORDER BY next_attempt_at, id LIMIT ?)"
);

/// Candidates found behind the head of their key, parked, if that head is still pending (a
/// self-join: MySQL updates a table it also reads only that way; the heads by position, so
/// the join reads one row per head). Binds: candidate ids, head ids.
fn park(behind: usize, heads: usize) -> String {
    format!(
        "UPDATE outbox_message o JOIN outbox_message e \
             ON e.ordering_key = o.ordering_key AND e.id < o.id \
         SET o.parked = 1 WHERE o.parked = 0 AND o.id IN ({}) AND e.id IN ({})",
        placeholders(behind),
        placeholders(heads)
    )
}

/// The oldest InnoDB transaction other than this session's (it holds back purge, which removes
/// what deleted and updated rows leave in the indexes; `PROCESS` privilege needed to see it),
/// and the undo history waiting for purge.
pub(crate) const HORIZON: &str = "SELECT \
     (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(trx_started), NOW(6)) \
      FROM information_schema.INNODB_TRX \
      WHERE trx_mysql_thread_id <> CONNECTION_ID()) AS oldest_transaction_micros, \
     (SELECT CAST(COUNT AS SIGNED) FROM information_schema.INNODB_METRICS \
      WHERE NAME = 'trx_rseg_history_len') AS dead_rows";

/// How many more messages of a key a claim parks when it finds one behind that key's head: a
/// burst behind a head that is not due is parked in a few claims instead of one window of
/// candidates per claim (enqueues cannot park on MySQL without locking reads).
pub(crate) const PARK_IN_BULK: i64 = 20_000;

/// Messages of a key behind its head parked in bulk, in position order, at most a limit of
/// them, read from the parked index's unparked part (not the ordering index, which would walk
/// the key's parked messages too). The head may settle meanwhile: a message left parked without
/// a head is promoted by the worker's safety net. Binds: key, head id, limit.
pub(crate) const PARK_BEHIND: &str = "UPDATE outbox_message FORCE INDEX (outbox_message_parked) \
     SET parked = 1 WHERE parked = 0 AND ordering_key = ? AND id > ? \
     ORDER BY parked, ordering_key, id LIMIT ?";

/// How many times one claim looks again at once after it parked messages and leased none.
const CLAIM_ROUNDS: usize = 8;

/// The heads among the candidates still due, locked (skipping those another claim locks), with
/// their payload sizes. By primary key: for an `ORDER BY … LIMIT` MariaDB prefers the due
/// index, which it then walks from its start (126,000 pages a claim of 500 behind 80,000
/// entries a held transaction keeps from purge, measured). Binds: ids, limit.
fn lock_heads(n: usize) -> String {
    format!(
        "SELECT id, COALESCE(payload_bytes, LENGTH(payload)) AS size \
         FROM outbox_message FORCE INDEX (PRIMARY) \
         WHERE id IN ({}) AND parked = 0 AND next_attempt_at <= UTC_TIMESTAMP(6) \
         ORDER BY priority DESC, next_attempt_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
        placeholders(n)
    )
}

/// The chosen heads leased. By primary key, said outright: statistics taken while the table
/// was nearly empty make MariaDB scan the whole table for a list of ids, and behind a held
/// transaction the "empty" table still holds every purge-blocked row (1,282 pages for ten ids
/// behind 80,000, measured). Binds: token, lease µs, ids.
fn lease(n: usize) -> String {
    format!(
        "UPDATE outbox_message FORCE INDEX (PRIMARY) \
         SET locked_by = ?, attempts = attempts + 1, \
             next_attempt_at = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)) \
         WHERE id IN ({})",
        placeholders(n)
    )
}

/// The leased messages, read. Binds: ids.
fn leased(n: usize) -> String {
    format!(
        "SELECT id, message_id, message_type, CAST(payload AS CHAR) AS payload, ordering_key, \
             attempts, headers, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) AS created_micros, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', resumed_at) AS resumed_micros, \
             subscription_id, CAST(priority AS SIGNED) AS priority \
         FROM outbox_message FORCE INDEX (PRIMARY) WHERE id IN ({}) \
         ORDER BY priority DESC, id",
        placeholders(n)
    )
}

/// Done messages removed if still leased under their claims, one `(token, ids)` group per
/// claim (the multi-table form: MariaDB takes an index hint only there; see [`lease`] for why
/// the hint). Binds: per group, token and ids.
fn delete_done(groups: &[(String, Vec<i64>)]) -> String {
    let owned: Vec<String> = groups
        .iter()
        .map(|(_, ids)| format!("(locked_by = ? AND id IN ({}))", placeholders(ids.len())))
        .collect();
    format!(
        "DELETE outbox_message FROM outbox_message FORCE INDEX (PRIMARY) WHERE {}",
        owned.join(" OR ")
    )
}

/// Messages given back undone, the attempt not counted. Binds: token, ids.
fn release(n: usize) -> String {
    format!(
        "UPDATE outbox_message FORCE INDEX (PRIMARY) \
         SET locked_by = NULL, next_attempt_at = UTC_TIMESTAMP(6), attempts = attempts - 1 \
         WHERE locked_by = ? AND id IN ({})",
        placeholders(n)
    )
}

/// A message about to be dead-lettered, locked if its claim still holds it: the copy and the
/// delete that follow then move it whole. Binds: id, token.
pub(crate) const LOCK_OWNED: &str =
    "SELECT id FROM outbox_message WHERE id = ? AND locked_by = ? FOR UPDATE";

/// The locked message copied to the dead letters (replacing a dead letter at its position, which
/// only a row edited by hand could leave). Binds: error, id.
pub(crate) const COPY_TO_DEAD: &str = "INSERT INTO outbox_failure (id, message_id, \
         message_type, payload, ordering_key, attempts, last_error, created_at, failed_at, \
         headers, priority, group_name, owner, subscription_id) \
     SELECT id, message_id, message_type, payload, ordering_key, attempts, ?, created_at, \
         UTC_TIMESTAMP(6), headers, priority, group_name, owner, subscription_id \
     FROM outbox_message WHERE id = ? \
     ON DUPLICATE KEY UPDATE message_id = VALUES(message_id), \
         message_type = VALUES(message_type), payload = VALUES(payload), \
         ordering_key = VALUES(ordering_key), attempts = VALUES(attempts), \
         headers = VALUES(headers), priority = VALUES(priority), \
         group_name = VALUES(group_name), owner = VALUES(owner), \
         subscription_id = VALUES(subscription_id), last_error = VALUES(last_error), \
         created_at = VALUES(created_at), failed_at = VALUES(failed_at)";

/// The locked message removed. Binds: id.
pub(crate) const DELETE_ONE: &str = "DELETE FROM outbox_message WHERE id = ?";

/// The lowest pending message of each key. Binds: keys.
fn heads_of(n: usize) -> String {
    format!(
        "SELECT MIN(id) AS id FROM outbox_message WHERE ordering_key IN ({}) \
         GROUP BY ordering_key",
        placeholders(n)
    )
}

/// Messages unparked. Binds: ids.
fn unpark(n: usize) -> String {
    format!(
        "UPDATE outbox_message \
         SET parked = 0, next_attempt_at = GREATEST(next_attempt_at, UTC_TIMESTAMP(6)) \
         WHERE parked = 1 AND id IN ({})",
        placeholders(n)
    )
}

/// Of some ids, those still in the outbox. Binds: ids.
fn present(n: usize) -> String {
    format!(
        "SELECT id FROM outbox_message WHERE id IN ({})",
        placeholders(n)
    )
}

/// Of some ids, those leased to another claim. Binds: token, ids.
fn held_by_others(n: usize) -> String {
    format!(
        "SELECT id FROM outbox_message \
         WHERE locked_by IS NOT NULL AND locked_by <> ? AND id IN ({})",
        placeholders(n)
    )
}

/// Leases renewed while the claim holds them. Binds: lease µs, token, ids.
fn extend_leases(n: usize) -> String {
    format!(
        "UPDATE outbox_message \
         SET next_attempt_at = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)) \
         WHERE locked_by = ? AND id IN ({})",
        placeholders(n)
    )
}

/// Of some ids, those held by a claim. Binds: token, ids.
fn held_by(n: usize) -> String {
    format!(
        "SELECT id FROM outbox_message WHERE locked_by = ? AND id IN ({})",
        placeholders(n)
    )
}

/// The lowest parked message of each key with parked messages: a loose scan of the index
/// `(parked, ordering_key, id)`, one entry per such key.
pub(crate) const LOWEST_PARKED: &str = "SELECT MIN(id) AS id FROM outbox_message \
     WHERE parked = 1 GROUP BY ordering_key";

/// Of those, the ones with no lower position of their key pending, unparked. Binds: ids.
fn unpark_stranded(n: usize) -> String {
    format!(
        "UPDATE outbox_message o LEFT JOIN outbox_message e \
             ON e.ordering_key = o.ordering_key AND e.id < o.id \
         SET o.parked = 0, o.next_attempt_at = GREATEST(o.next_attempt_at, UTC_TIMESTAMP(6)) \
         WHERE e.id IS NULL AND o.parked = 1 AND o.id IN ({})",
        placeholders(n)
    )
}

/// The columns of a pending message as listed, from the outbox table.
macro_rules! pending_columns {
    () => {
        "SELECT id, message_id, message_type, \
         LEFT(CAST(payload AS CHAR), ?) AS payload, ordering_key, attempts, headers, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) AS created_at, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01', next_attempt_at) AS next_attempt_at, \
         CASE WHEN locked_by IS NOT NULL AND next_attempt_at > UTC_TIMESTAMP(6) THEN 1 ELSE 0 END \
             AS in_flight, \
         CASE WHEN parked THEN 1 ELSE 0 END AS parked, \
         CASE WHEN paused THEN 1 ELSE 0 END AS paused, CAST(priority AS SIGNED) AS priority, \
         group_name, last_error \
         FROM outbox_message "
    };
}

/// The columns of a dead letter as listed.
macro_rules! dead_letter_columns {
    () => {
        "SELECT id, message_id, message_type, \
         LEFT(CAST(payload AS CHAR), ?) AS payload, ordering_key, attempts, headers, \
         last_error, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) AS created_at, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01', failed_at) AS failed_at \
         FROM outbox_failure "
    };
}

/// The dead letters of a selection, locked for the move. Binds: type (NULL: every one).
pub(crate) const SELECT_DEAD_FOR_UPDATE: &str = "SELECT id FROM outbox_failure \
     WHERE message_type = COALESCE(?, message_type) ORDER BY id FOR UPDATE";

/// Dead letters at some positions, locked for the move. Binds: ids.
fn select_dead_at_for_update(n: usize) -> String {
    format!(
        "SELECT id FROM outbox_failure WHERE id IN ({}) ORDER BY id FOR UPDATE",
        placeholders(n)
    )
}

/// Dead letters copied back into the outbox at their positions, as first attempts. Binds: ids.
fn requeue(n: usize) -> String {
    format!(
        "INSERT INTO outbox_message (id, message_id, message_type, payload, payload_bytes, \
             ordering_key, attempts, created_at, next_attempt_at, last_error, headers, \
             priority, group_name, owner, subscription_id) \
         SELECT id, message_id, message_type, payload, LENGTH(payload), ordering_key, 0, \
             created_at, UTC_TIMESTAMP(6), last_error, headers, priority, group_name, owner, \
             subscription_id \
         FROM outbox_failure WHERE id IN ({}) ORDER BY id",
        placeholders(n)
    )
}

/// The groups of dead letters about to be re-queued, listed again (the housekeeper removes a
/// group once empty). Binds: ids.
fn list_groups_of_dead(n: usize) -> String {
    format!(
        "INSERT IGNORE INTO outbox_group (name) \
         SELECT DISTINCT group_name FROM outbox_failure \
         WHERE id IN ({}) AND group_name IS NOT NULL",
        placeholders(n)
    )
}

/// Groups listed for claims (`INSERT IGNORE`: a group listed already is left alone, under a
/// shared lock that other enqueues of it share). Binds: names.
fn register_groups(n: usize) -> String {
    format!(
        "INSERT IGNORE INTO outbox_group (name) VALUES {}",
        vec!["(?)"; n].join(", ")
    )
}

/// Groups without a pending unparked message removed (one probe of the grouped index each).
pub(crate) const REMOVE_EMPTY_GROUPS: &str = "DELETE FROM outbox_group WHERE NOT EXISTS (\
     SELECT 1 FROM outbox_message m FORCE INDEX (outbox_message_grouped) \
     WHERE m.group_name = outbox_group.name AND m.parked = 0)";

/// The groups a claim visits: up to eight after the last claim's last group, and up to eight
/// from the first (the claim keeps eight in all). Binds: the last group, twice.
pub(crate) const GROUPS: &str = "(SELECT name, CAST(0 AS SIGNED) AS pass FROM outbox_group \
         WHERE name > ? ORDER BY name LIMIT 8) \
     UNION ALL (SELECT name, CAST(1 AS SIGNED) AS pass FROM outbox_group \
         WHERE name <= ? ORDER BY name LIMIT 8)";

/// A group's share of a claim's candidates: its first due, unparked, ordinary messages from the
/// claim cursor on (see [`CANDIDATES`] for the cursor given twice and the index named), by
/// `group_due` (the due time of a grouped message, which the index holds).
/// Binds: group, the cursor's due time, its due time and id, the share.
pub const GROUP_SHARE: &str = concat!(
    "SELECT ",
    candidate_columns!(),
    " FROM outbox_message m FORCE INDEX (outbox_message_grouped) \
     WHERE group_name = ? AND parked = 0 AND priority <= 0 \
         AND group_due <= UTC_TIMESTAMP(6) \
         AND group_due >= TIMESTAMPADD(MICROSECOND, ?, '1970-01-01') \
         AND (group_due, id) >= (TIMESTAMPADD(MICROSECOND, ?, '1970-01-01'), ?) \
     ORDER BY group_due, id LIMIT ?"
);

/// Dead letters deleted. Binds: ids.
fn purge_at(n: usize) -> String {
    format!(
        "DELETE FROM outbox_failure WHERE id IN ({})",
        placeholders(n)
    )
}

/// Dead letters of a type deleted (NULL: every one). Binds: type.
pub(crate) const PURGE: &str =
    "DELETE FROM outbox_failure WHERE message_type = COALESCE(?, message_type)";

/// Keys stamped settled whose message has left the outbox and the dead letters (a dead letter
/// may still be re-queued). Binds: positions.
fn settle_keys(n: usize) -> String {
    format!(
        "UPDATE outbox_idempotency k SET settled_at = UTC_TIMESTAMP(6) \
         WHERE settled_at IS NULL AND message_position IN ({}) \
         AND NOT EXISTS (SELECT 1 FROM outbox_message m WHERE m.id = k.message_position) \
         AND NOT EXISTS (SELECT 1 FROM outbox_failure f WHERE f.id = k.message_position)",
        placeholders(n)
    )
}

/// One claim in its own transaction, reading from `from`: what it leased, how many messages it
/// parked, and where its first candidate stood.
fn claim_once(
    conn: &mut MysqlConnection,
    claim: &Claim<'_>,
    from: Cursor,
) -> QueryResult<(Claimed, usize)> {
    let limit = claim.limit.messages;
    run(conn, READ_COMMITTED, &[])?;
    conn.transaction(|c| {
        let binds = [
            Bind::BigInt(claim.candidates()),
            Bind::BigInt(from.due_micros),
            Bind::BigInt(from.due_micros),
            Bind::BigInt(from.id),
            Bind::BigInt(claim.candidates()),
        ];
        let read: Vec<Candidate> = Prepared::new(CANDIDATES, STYLE, &binds).load(c)?;
        let groups = groups_to_visit(c, claim)?;
        let mut shares = Vec::with_capacity(groups.len());
        for group in &groups {
            let binds = [
                Bind::Text(group),
                Bind::BigInt(from.due_micros),
                Bind::BigInt(from.due_micros),
                Bind::BigInt(from.id),
                Bind::BigInt(claim.per_group()),
            ];
            shares.push(Prepared::new(GROUP_SHARE, STYLE, &binds).load::<Candidate>(c)?);
        }
        // Where the first ordinary row read stood, kept or not: a row read and left lies
        // after it.
        let first = read
            .iter()
            .chain(shares.iter().flatten())
            .filter(|cand| cand.priority <= 0)
            .map(|cand| Cursor {
                due_micros: cand.due,
                id: cand.id,
            })
            .min();
        let mut candidates = super::share_out(
            read,
            shares,
            |cand| cand.id,
            |cand| cand.group_name.as_deref(),
            |cand| cand.priority > 0,
            |cand| (Reverse(cand.priority), cand.due, cand.id),
        );
        candidates.truncate(usize::try_from(claim.candidates()).unwrap_or(usize::MAX));
        let last_group = groups.last().cloned();
        let (heads, behind): (Vec<&Candidate>, Vec<&Candidate>) =
            candidates.iter().partition(|cand| cand.head_id == cand.id);
        let mut parked = 0;
        for chunk in behind.chunks(ID_CHUNK / 2) {
            let ids: Vec<i64> = chunk.iter().map(|cand| cand.id).collect();
            let mut their_heads: Vec<i64> = chunk.iter().map(|cand| cand.head_id).collect();
            their_heads.sort_unstable();
            their_heads.dedup();
            let binds: Vec<Bind<'_>> = ids
                .iter()
                .chain(&their_heads)
                .map(|id| Bind::BigInt(*id))
                .collect();
            parked += dynamic::<Mysql>(&park(ids.len(), their_heads.len()), &binds).execute(c)?;
        }
        // Whatever else waits behind those heads, in bulk: a burst is parked in a few
        // claims, not a window per claim.
        let mut blocked: Vec<(&str, i64)> = behind
            .iter()
            .filter_map(|cand| Some((cand.ordering_key.as_deref()?, cand.head_id)))
            .collect();
        blocked.sort_unstable();
        blocked.dedup();
        for (key, head) in blocked {
            let binds = [
                Bind::Text(key),
                Bind::BigInt(head),
                Bind::BigInt(PARK_IN_BULK),
            ];
            parked += run(c, PARK_BEHIND, &binds)?;
        }
        let heads: Vec<i64> = heads.iter().map(|cand| cand.id).collect();
        // Locked a limit at a time: a worker claiming at the same moment reads the same
        // oldest heads and locks the first of them (a locking read locks every row of its
        // IN list); this claim then takes the next ones instead of coming back empty.
        let mut locked: Vec<Sized> = Vec::new();
        for chunk in heads.chunks(limit.max(1)) {
            let wanted = super::to_i64(limit - locked.len());
            let binds = with_ids(&[], chunk)
                .into_iter()
                .chain([Bind::BigInt(wanted)])
                .collect::<Vec<_>>();
            locked.extend(dynamic::<Mysql>(&lock_heads(chunk.len()), &binds).load::<Sized>(c)?);
            if locked.len() >= limit {
                break;
            }
        }
        let take = claim.limit.take(
            locked
                .iter()
                .map(|row| usize::try_from(row.size).unwrap_or(usize::MAX)),
        );
        let chosen: Vec<i64> = locked.iter().take(take).map(|row| row.id).collect();
        if chosen.is_empty() {
            let claimed = Claimed {
                rows: Vec::new(),
                first,
                last_group,
            };
            return Ok((claimed, parked));
        }
        let binds = with_ids(
            &[Bind::Text(claim.token), Bind::BigInt(claim.lease_micros)],
            &chosen,
        );
        dynamic::<Mysql>(&lease(chosen.len()), &binds).execute(c)?;
        let rows = dynamic::<Mysql>(&leased(chosen.len()), &ids_bound(&chosen)).load(c)?;
        let claimed = Claimed {
            rows,
            first,
            last_group,
        };
        Ok((claimed, parked))
    })
}

/// The groups a claim visits, in turn.
fn groups_to_visit(c: &mut MysqlConnection, claim: &Claim<'_>) -> QueryResult<Vec<String>> {
    let after = Bind::Text(claim.groups_after);
    Ok(super::groups_in_turn(
        Prepared::new(GROUPS, STYLE, &[after, after]).load(c)?,
    ))
}

/// The columns of a subscription as read ([`SubscriptionRow`]).
macro_rules! subscription_columns {
    () => {
        "SELECT id, owner, url, event_types, secret, \
             CASE WHEN previous_secret_until > UTC_TIMESTAMP(6) THEN previous_secret END \
                 AS previous_secret, \
             CAST(rate_limit AS SIGNED) AS rate_limit, CAST(allow_http AS SIGNED) AS allow_http, \
             description, metadata, CAST(enabled AS SIGNED) AS enabled, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) AS created_micros, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', updated_at) AS updated_micros, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', previous_secret_until) \
                 AS previous_until_micros \
         FROM outbox_subscription "
    };
}

/// One delivery per subscription of an event, in the order given: the event's id, type,
/// payload, headers, priority, group, owner and enqueue time, due now. Binds: per delivery its
/// subscription id and ordering key, then the event's position.
fn insert_deliveries(n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| format!("SELECT ? AS subscription, ? AS ordering_key, {i} AS n"))
        .collect();
    format!(
        "INSERT INTO outbox_message (message_id, message_type, payload, payload_bytes, \
             ordering_key, created_at, next_attempt_at, headers, priority, group_name, owner, \
             subscription_id) \
         SELECT e.message_id, e.message_type, e.payload, e.payload_bytes, d.ordering_key, \
             e.created_at, UTC_TIMESTAMP(6), e.headers, e.priority, e.group_name, e.owner, \
             d.subscription \
         FROM outbox_message e JOIN ({}) d \
         WHERE e.id = ? ORDER BY d.n",
        rows.join(" UNION ALL ")
    )
}

/// The filters of a cancel, in its binds' order: message id, type, subscription, age in µs.
/// A filter not given (NULL) takes every row.
macro_rules! cancel_filters {
    () => {
        "message_id = COALESCE(?, message_id) \
         AND message_type = COALESCE(?, message_type) \
         AND COALESCE(?, subscription_id) <=> subscription_id \
         AND created_at <= TIMESTAMPADD(MICROSECOND, -COALESCE(?, 0), UTC_TIMESTAMP(6))"
    };
}

/// The rows a cancel takes: no claim holds them, nor another transaction. Binds: the filters,
/// limit.
pub(crate) const CANCELLABLE: &str = concat!(
    "SELECT id, ordering_key FROM outbox_message WHERE ",
    cancel_filters!(),
    " AND (locked_by IS NULL OR next_attempt_at <= UTC_TIMESTAMP(6)) \
     ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
);

/// How many rows of a cancel a claim holds. Binds: the filters.
pub(crate) const CANCEL_IN_FLIGHT: &str = concat!(
    "SELECT count(*) AS n FROM outbox_message WHERE ",
    cancel_filters!(),
    " AND locked_by IS NOT NULL AND next_attempt_at > UTC_TIMESTAMP(6)"
);

/// Deletes rows. Binds: ids.
fn delete_at(n: usize) -> String {
    format!(
        "DELETE FROM outbox_message WHERE id IN ({})",
        placeholders(n)
    )
}

/// Copies rows to `outbox_cancelled`. Binds: reason, ids.
fn copy_to_cancelled(n: usize) -> String {
    format!(
        "INSERT INTO outbox_cancelled (id, message_id, message_type, payload, ordering_key, \
             attempts, created_at, headers, priority, group_name, owner, subscription_id, \
             reason, cancelled_at) \
         SELECT id, message_id, message_type, payload, ordering_key, attempts, created_at, \
             headers, priority, group_name, owner, subscription_id, ?, UTC_TIMESTAMP(6) \
         FROM outbox_message WHERE id IN ({})",
        placeholders(n)
    )
}

impl CancelStatements for MysqlConnection {
    fn cancellable(&mut self, rows: &CancelRows<'_>) -> QueryResult<Vec<KeyedRow>> {
        Prepared::new(CANCELLABLE, STYLE, &rows.cancellable_binds()).load(self)
    }

    fn cancel_in_flight(&mut self, rows: &CancelRows<'_>) -> QueryResult<i64> {
        let counted: Vec<CountRow> =
            Prepared::new(CANCEL_IN_FLIGHT, STYLE, &rows.filter_binds()).load(self)?;
        Ok(counted.first().map_or(0, |row| row.n))
    }

    fn move_to_cancelled(&mut self, ids: &[i64], reason: &str) -> QueryResult<usize> {
        let mut moved = 0;
        for chunk in ids.chunks(ID_CHUNK) {
            moved += dynamic::<Mysql>(
                &copy_to_cancelled(chunk.len()),
                &with_ids(&[Bind::Text(reason)], chunk),
            )
            .execute(self)?;
            dynamic::<Mysql>(&delete_at(chunk.len()), &ids_bound(chunk)).execute(self)?;
        }
        Ok(moved)
    }

    fn cancel_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T> {
        // Its row locks only, as the claims': REPEATABLE READ would lock every row it reads.
        if !super::transaction_open(self)? {
            run(self, READ_COMMITTED, &[])?;
        }
        self.transaction(body)
    }
}

fn run(c: &mut MysqlConnection, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize> {
    Prepared::new(sql, STYLE, binds).execute(c)
}

fn ids_bound(ids: &[i64]) -> Vec<Bind<'_>> {
    ids.iter().map(|id| Bind::BigInt(*id)).collect()
}

/// `binds` followed by one bind per id.
fn with_ids<'a>(binds: &[Bind<'a>], ids: &[i64]) -> Vec<Bind<'a>> {
    let mut all = binds.to_vec();
    all.extend(ids.iter().map(|id| Bind::BigInt(*id)));
    all
}

fn load_ids(c: &mut MysqlConnection, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<i64>> {
    let rows: Vec<IdRow> = dynamic::<Mysql>(sql, binds).load(c)?;
    Ok(rows.into_iter().map(|row| row.id).collect())
}

/// A claim candidate: its position and whether it heads its key.
#[derive(diesel::QueryableByName)]
struct Candidate {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    ordering_key: Option<String>,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    head_id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    due: i64,
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    priority: i16,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    group_name: Option<String>,
}

/// A locked head: its position and payload size.
#[derive(diesel::QueryableByName)]
struct Sized {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    size: i64,
}

impl SubscriptionDialect for MysqlConnection {
    /// A subscription removed. Binds: id.
    const DELETE_SUBSCRIPTION: &'static str = "DELETE FROM outbox_subscription WHERE id = ?";

    /// A removed subscription's pending deliveries that no claim holds, removed. Binds: id.
    const DELETE_SUBSCRIPTION_DELIVERIES: &'static str = "DELETE FROM outbox_message \
         WHERE subscription_id = ? AND (locked_by IS NULL OR next_attempt_at <= UTC_TIMESTAMP(6))";

    /// The enabled subscriptions of an event's owner created no later than the event (a
    /// subscription added later gets only later events). Binds: the event's position.
    const FAN_OUT_CANDIDATES: &'static str = "SELECT s.id, s.event_types \
         FROM outbox_message e JOIN outbox_subscription s \
             ON s.owner <=> e.owner AND s.created_at <= e.created_at \
         WHERE e.id = ? AND s.enabled = TRUE ORDER BY s.created_at, s.id";

    /// A new subscription. Binds: id, owner, URL, filters (JSON), secret, rate limit, whether
    /// `http` is allowed, description, metadata (JSON), enabled.
    const INSERT_SUBSCRIPTION: &'static str = "INSERT INTO outbox_subscription \
         (id, owner, url, event_types, secret, rate_limit, allow_http, description, metadata, \
          enabled, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))";

    /// The event a fan-out holds, locked, if its claim holds it. Binds: position, token.
    const LOCK_EVENT: &'static str = "SELECT message_type, ordering_key FROM outbox_message \
         WHERE id = ? AND locked_by = ? FOR UPDATE";

    /// The paused deliveries of a subscription enabled again, due now. Binds: id.
    const RELEASE_SUBSCRIPTION: &'static str = "UPDATE outbox_message \
         SET paused = FALSE, next_attempt_at = UTC_TIMESTAMP(6), resumed_at = UTC_TIMESTAMP(6) \
         WHERE subscription_id = ? AND paused = TRUE AND locked_by IS NULL";

    /// A subscription's stored secrets rewritten. Binds: secret, previous secret, id.
    const RESEAL_SUBSCRIPTION_SECRETS: &'static str =
        "UPDATE outbox_subscription SET secret = ?, previous_secret = ? WHERE id = ?";

    /// A subscription's new secret; the old one stays the previous secret for the overlap. Binds:
    /// secret, overlap µs, id.
    const ROTATE_SUBSCRIPTION_SECRET: &'static str = "UPDATE outbox_subscription \
         SET previous_secret = secret, secret = ?, \
             previous_secret_until = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)), \
             updated_at = UTC_TIMESTAMP(6) \
         WHERE id = ?";

    /// A subscription enabled or disabled. Binds: enabled, id.
    const SET_SUBSCRIPTION_ENABLED: &'static str =
        "UPDATE outbox_subscription SET enabled = ?, updated_at = UTC_TIMESTAMP(6) WHERE id = ?";

    /// One subscription. Binds: id.
    const SUBSCRIPTION: &'static str = concat!(subscription_columns!(), "WHERE id = ?");

    /// Every subscription, oldest first.
    const SUBSCRIPTIONS: &'static str = concat!(subscription_columns!(), "ORDER BY created_at, id");

    /// One owner's subscriptions, oldest first. Binds: owner (NULL: those without an owner).
    const SUBSCRIPTIONS_OF: &'static str = concat!(
        subscription_columns!(),
        "WHERE owner <=> ? ORDER BY created_at, id"
    );
}

impl SubscriptionStatements for MysqlConnection {
    fn insert_deliveries(
        &mut self,
        id: i64,
        deliveries: &[(&str, Option<String>)],
    ) -> QueryResult<()> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let sql = insert_deliveries(deliveries.len());
        let mut binds: Vec<Bind<'_>> = deliveries
            .iter()
            .flat_map(|(subscription, key)| {
                [Bind::Text(subscription), Bind::NullableText(key.as_deref())]
            })
            .collect();
        binds.push(Bind::BigInt(id));
        dynamic::<Mysql>(&sql, &binds).execute(self).map(drop)
    }
}

impl Dialect for MysqlConnection {
    /// A destination recorded as healthy unless it is known (not `INSERT IGNORE`, which would
    /// store a name too long for the column cut short). Binds: name.
    const ADD_DESTINATION: &'static str = "INSERT INTO outbox_destination \
             (name, kind, state, reported_at) \
         VALUES (?, ?, 'healthy', UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE name = name";

    /// The backlog for the worker's gauges: messages in the outbox, and the microseconds the oldest
    /// due, unheld message has waited (NULL: none waits; held messages are due at their lease's
    /// end, so they are not due). The second is the first entry of the due index's unparked part.
    const BACKLOG: &'static str = "SELECT (SELECT COUNT(*) FROM outbox_message) AS pending, \
         TIMESTAMPDIFF(MICROSECOND, d.due, UTC_TIMESTAMP(6)) AS oldest_due_micros, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01', d.due) AS oldest_due_at \
         FROM (SELECT MIN(next_attempt_at) AS due FROM outbox_message \
               WHERE parked = FALSE AND next_attempt_at <= UTC_TIMESTAMP(6)) d";

    /// Heads of ordering keys that failed and wait for a retry, holding up the messages behind
    /// them, soonest retry first; with how many wait behind each (one probe of the ordering index
    /// per key). Binds: limit.
    const BLOCKED_KEYS: &'static str = "SELECT h.ordering_key, h.id, h.message_id, \
             h.message_type, h.attempts, h.last_error, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', h.next_attempt_at) AS next_attempt_at, \
             (SELECT COUNT(*) FROM outbox_message w \
              WHERE w.ordering_key = h.ordering_key AND w.id > h.id) AS waiting \
         FROM outbox_message h \
         WHERE h.parked = 0 AND h.ordering_key IS NOT NULL AND h.last_error IS NOT NULL \
         ORDER BY h.next_attempt_at, h.id LIMIT ?";

    /// A dead letter by its message id (indexed). Binds: characters of its payload to read, id.
    const DEAD_BY_MESSAGE_ID: &'static str =
        concat!(dead_letter_columns!(), "WHERE message_id = ?");

    /// The positions of the dead letters of a type (NULL: every one), without their payloads.
    /// Binds: type.
    const DEAD_POSITIONS: &'static str = "SELECT id FROM outbox_failure \
         WHERE message_type = COALESCE(?, message_type) ORDER BY id";

    /// Every destination, by name.
    const DESTINATIONS: &'static str =
        "SELECT name, kind, state, consecutive_failures, last_error, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', next_probe_at) AS next_probe_at, \
             disabled_reason, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', reported_at) AS reported_at \
         FROM outbox_destination ORDER BY name";

    /// An operator's disable, which the workers adopt. Binds: reason, name.
    const DISABLE_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET state = 'disabled', next_probe_at = NULL, disabled_reason = ? WHERE name = ?";

    /// An operator's enable: healthy again, and one more enable for the workers to follow. Binds:
    /// name.
    const ENABLE_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET state = 'healthy', consecutive_failures = 0, last_error = NULL, next_probe_at = NULL, \
             disabled_reason = NULL, enables = enables + 1 \
         WHERE name = ?";

    /// Keys settled longer ago than the window deleted, at most a batch. Binds: window µs, limit.
    const EXPIRE_KEYS: &'static str = "DELETE FROM outbox_idempotency \
         WHERE settled_at <= TIMESTAMPADD(MICROSECOND, -?, UTC_TIMESTAMP(6)) LIMIT ?";

    /// Revoked admin sessions that have expired anyway, forgotten. Binds: now (Unix seconds).
    const FORGET_REVOKED: &'static str = "DELETE FROM outbox_admin_revoked WHERE expires_at < ?";

    /// A received webhook id recorded unless recorded. Binds: id.
    const INBOX_RECORD: &'static str =
        "INSERT IGNORE INTO outbox_inbox (webhook_id, received_at) VALUES (?, UTC_TIMESTAMP(6))";

    /// Inbox ids older than some age deleted, a batch at a time. Binds: age µs, limit.
    const INBOX_SWEEP: &'static str = "DELETE FROM outbox_inbox \
         WHERE received_at < TIMESTAMPADD(MICROSECOND, -?, UTC_TIMESTAMP(6)) LIMIT ?";

    /// The message an idempotency key was recorded for, read as committed: a locking read, since
    /// under REPEATABLE READ a plain one would read the transaction's older snapshot, where the
    /// key the reservation waited for is missing. Binds: key.
    const KEYED_MESSAGE: &'static str = "SELECT message_id FROM outbox_idempotency \
         WHERE idempotency_key = ? LOCK IN SHARE MODE";

    /// A destination as the store keeps it, locked until the transaction ends. Binds: name.
    const LOCK_DESTINATION: &'static str = "SELECT name, state, disabled_reason, enables \
         FROM outbox_destination WHERE name = ? FOR UPDATE";

    /// A destination's turns under a rate limit across processes, with the database's clock in
    /// µs, locked until the transaction ends. Binds: name.
    const LOCK_TURNS: &'static str = concat!(
        "SELECT turn_tokens, turns_refilled, turns_booked_until, last_turn, ",
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))",
        " AS now FROM outbox_destination WHERE name = ? FOR UPDATE"
    );

    /// An operator's pause, unless that one is paused already (names are checked before, so
    /// `IGNORE` only skips the duplicate). Binds: kind, name, reason.
    const PAUSE: &'static str = "INSERT IGNORE INTO outbox_pause (kind, name, reason, paused_at) \
         VALUES (?, ?, ?, UTC_TIMESTAMP(6))";

    /// Every pause, by kind and name.
    const PAUSES: &'static str = "SELECT kind, name, reason, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', paused_at) AS paused_at \
         FROM outbox_pause ORDER BY kind, name";

    /// One message found paused by its worker: given back without counting the attempt, marked
    /// paused, and due too far ahead for any claim until a resume releases it. Binds: delay µs,
    /// reason, id, token.
    const PAUSE_MESSAGE: &'static str = "UPDATE outbox_message \
         SET locked_by = NULL, paused = TRUE, \
             next_attempt_at = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)), \
             last_error = ?, attempts = attempts - 1 \
         WHERE id = ? AND locked_by = ?";

    /// A pending message by its message id: the outbox table has no index on it (every enqueue
    /// would pay for one), so this reads the table, as only an operator's lookup does. Binds:
    /// characters of its payload to read, id.
    const PENDING_BY_MESSAGE_ID: &'static str = concat!(pending_columns!(), "WHERE message_id = ?");

    /// Dead letters that failed longer ago than some age deleted, oldest first, a batch at a time
    /// (the `failed_at` index bounds the read). Binds: age µs, limit.
    const PRUNE_DEAD_LETTERS: &'static str = "DELETE FROM outbox_failure \
         WHERE failed_at < TIMESTAMPADD(MICROSECOND, -?, UTC_TIMESTAMP(6)) ORDER BY failed_at LIMIT ?";

    /// Every paused message whose type is not paused (any more) due at once, from the paused rows'
    /// own index.
    const RELEASE_PAUSED: &'static str = "UPDATE outbox_message \
         FORCE INDEX (outbox_message_paused) \
         SET paused = FALSE, next_attempt_at = UTC_TIMESTAMP(6), resumed_at = UTC_TIMESTAMP(6) \
         WHERE paused = TRUE AND locked_by IS NULL \
           AND message_type NOT IN (SELECT name FROM outbox_pause WHERE kind = 'type')";

    /// A worker's report of a destination's health. Binds: kind, state, consecutive failures,
    /// last error, µs until the next probe (NULL: none), why it is disabled, name.
    const REPORT_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET kind = ?, state = ?, consecutive_failures = ?, last_error = ?, \
             next_probe_at = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)), disabled_reason = ?, \
             reported_at = UTC_TIMESTAMP(6) \
         WHERE name = ?";

    /// An idempotency key recorded for a message unless recorded: an enqueue in another
    /// transaction with the same key waits on the primary key until the first one ends. (IGNORE
    /// would also turn a too-long key into a warning; the enqueue checks lengths first.) Binds:
    /// key, message id.
    const RESERVE_KEY: &'static str = "INSERT IGNORE INTO outbox_idempotency \
         (idempotency_key, message_id, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))";

    /// An operator's resume. Binds: kind, name.
    const RESUME: &'static str = "DELETE FROM outbox_pause WHERE kind = ? AND name = ?";

    /// An admin session ended by a sign-out, until it would have expired. Binds: session id,
    /// expiry (Unix seconds).
    const REVOKE_SESSION: &'static str =
        "INSERT IGNORE INTO outbox_admin_revoked (session_id, expires_at) VALUES (?, ?)";

    /// Whether an admin session signed out (1) or not (0). Binds: session id.
    const SESSION_REVOKED: &'static str =
        "SELECT COUNT(*) AS found FROM outbox_admin_revoked WHERE session_id = ?";

    /// The position of the message this session inserted last, stored with its key. Binds: key.
    const SET_KEY_POSITION: &'static str = "UPDATE outbox_idempotency \
         SET message_position = LAST_INSERT_ID() WHERE idempotency_key = ?";

    /// Keys not stamped settled, by their message's position, from a position on. Binds: after,
    /// limit.
    const UNSETTLED_KEYS: &'static str = "SELECT message_position AS id FROM outbox_idempotency \
         WHERE settled_at IS NULL AND message_position > ? ORDER BY message_position LIMIT ?";

    /// A destination's turns written back. Binds: tokens in millionths, refilled µs, booked-until
    /// µs (NULL: nobody in line), last turn µs, name.
    const WRITE_TURNS: &'static str = "UPDATE outbox_destination \
         SET turn_tokens = ?, turns_refilled = ?, turns_booked_until = ?, \
             last_turn = ? \
         WHERE name = ?";

    /// Dead letters, by position. Binds: characters of each payload to read, type (NULL: any), key
    /// twice (NULL: any), from position, limit.
    const DEAD_LETTERS: &'static str = concat!(
        dead_letter_columns!(),
        "WHERE message_type = COALESCE(?, message_type) \
         AND (? IS NULL OR ordering_key = ?) AND id >= ? ORDER BY id LIMIT ?"
    );

    /// Pending messages, by position: a page reads the primary key from its first position on,
    /// however deep it is (a type or attempts filter walks it until the page is full). Binds:
    /// characters of each payload to read, type (NULL: any), least attempts, due only (0/1), from
    /// position, limit.
    const PENDING: &'static str = concat!(
        pending_columns!(),
        "WHERE message_type = COALESCE(?, message_type) AND attempts >= ? \
         AND (? = 0 OR (NOT parked AND next_attempt_at <= UTC_TIMESTAMP(6))) \
         AND id >= ? ORDER BY id LIMIT ?"
    );

    /// The pending messages of one ordering key, by position: the ordering index gives them in
    /// order. Binds: characters of each payload to read, key, then as [`PENDING`](Self::PENDING).
    const PENDING_BY_KEY: &'static str = concat!(
        pending_columns!(),
        "WHERE ordering_key = ? AND message_type = COALESCE(?, message_type) AND attempts >= ? \
         AND (? = 0 OR (NOT parked AND next_attempt_at <= UTC_TIMESTAMP(6))) \
         AND id >= ? ORDER BY ordering_key, id LIMIT ?"
    );

    /// One message scheduled for later with its last error. Binds: delay µs, text, attempts to
    /// take back (0 or 1), id, token.
    const RESCHEDULE: &'static str = "UPDATE outbox_message \
         SET locked_by = NULL, next_attempt_at = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6)), \
             last_error = ?, attempts = attempts - ? \
         WHERE id = ? AND locked_by = ?";

    /// Dead-letter counts by type (COUNT of nothing is the BIGINT zero the row type wants; MySQL
    /// cannot CAST to BIGINT).
    const STATS_DEAD: &'static str = "SELECT message_type, COUNT(*) AS total, \
             COUNT(CASE WHEN 1 = 0 THEN 1 END) AS in_flight, NULL AS oldest \
         FROM outbox_failure GROUP BY message_type";

    /// Pending and in-flight counts and the oldest enqueue time, by type.
    const STATS_PENDING: &'static str = "SELECT message_type, COUNT(*) AS total, \
             COUNT(CASE WHEN locked_by IS NOT NULL AND next_attempt_at > UTC_TIMESTAMP(6) THEN 1 END) \
                 AS in_flight, \
             TIMESTAMPDIFF(MICROSECOND, '1970-01-01', MIN(created_at)) AS oldest \
         FROM outbox_message GROUP BY message_type";
}

impl<R: QueryableByName<Mysql> + 'static> LoadFixed<R> for MysqlConnection {
    fn load_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<Vec<R>> {
        Prepared::new(sql, STYLE, binds).load(self)
    }
}

impl Statements for MysqlConnection {
    fn insert_messages(&mut self, rows: &[NewMessage]) -> QueryResult<()> {
        const BINDS: usize = NewMessage::BINDS;
        for chunk in NewMessage::chunks(rows, MAX_BINDS / BINDS) {
            if let [row] = chunk {
                run(self, INSERT_MESSAGE, &row.binds())?;
                continue;
            }
            let sql = format!(
                "{INSERT_MESSAGE}{}",
                format!(", {INSERT_VALUES}").repeat(chunk.len() - 1)
            );
            let binds: Vec<Bind<'_>> = chunk.iter().flat_map(NewMessage::binds).collect();
            dynamic::<Mysql>(&sql, &binds).execute(self)?;
        }
        Ok(())
    }

    fn horizon(&mut self) -> QueryResult<HorizonRow> {
        Prepared::new(HORIZON, STYLE, &[]).get_result(self)
    }

    fn claim(&mut self, claim: &Claim<'_>, from: Cursor) -> QueryResult<Claimed> {
        // A claim that parked a burst and leased nothing looks again at once, rather than the
        // worker sleeping a poll interval before the next window of the burst; each round
        // reads on from where the one before found its first candidate.
        let mut from = from;
        let mut cursor = None;
        for round in 1..=CLAIM_ROUNDS {
            let (mut claimed, parked) = claim_once(self, claim, from)?;
            if let Some(first) = claimed.first {
                from = first;
                cursor = Some(first);
            }
            if !claimed.rows.is_empty() || parked == 0 || round == CLAIM_ROUNDS {
                claimed.first = cursor;
                return Ok(claimed);
            }
        }
        Ok(Claimed {
            first: cursor,
            ..Claimed::default()
        })
    }

    fn register_groups(&mut self, groups: &[&str]) -> QueryResult<()> {
        let binds: Vec<Bind<'_>> = groups.iter().map(|group| Bind::Text(group)).collect();
        dynamic::<Mysql>(&register_groups(groups.len()), &binds)
            .execute(self)
            .map(drop)
    }

    fn remove_empty_groups(&mut self) -> QueryResult<usize> {
        // Read without locks (REPEATABLE READ would lock the grouped index's ranges it
        // probes, and the gaps between them, holding up enqueues).
        run(self, READ_COMMITTED, &[])?;
        run(self, REMOVE_EMPTY_GROUPS, &[])
    }

    fn delete_done(&mut self, claims: &[(String, Vec<i64>)], keys: &[&str]) -> QueryResult<usize> {
        let mut binds = Vec::new();
        for (token, ids) in claims {
            binds.push(Bind::Text(token));
            binds.extend(ids.iter().map(|id| Bind::BigInt(*id)));
        }
        let sql = delete_done(claims);
        if keys.is_empty() {
            // The common case, in one statement and one round trip.
            return dynamic::<Mysql>(&sql, &binds).execute(self);
        }
        self.transaction(|c| {
            let deleted = dynamic::<Mysql>(&sql, &binds).execute(c)?;
            c.promote_heads(keys)?;
            Ok(deleted)
        })
    }

    fn release(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize> {
        dynamic::<Mysql>(&release(ids.len()), &with_ids(&[Bind::Text(token)], ids)).execute(self)
    }

    fn dead_letter(&mut self, token: &str, id: i64, error: &str) -> QueryResult<bool> {
        self.transaction(|c| {
            let owned: Vec<IdRow> =
                Prepared::new(LOCK_OWNED, STYLE, &[Bind::BigInt(id), Bind::Text(token)]).load(c)?;
            if owned.is_empty() {
                return Ok(false);
            }
            run(c, COPY_TO_DEAD, &[Bind::Text(error), Bind::BigInt(id)])?;
            run(c, DELETE_ONE, &[Bind::BigInt(id)])?;
            Ok(true)
        })
    }

    fn promote_heads(&mut self, keys: &[&str]) -> QueryResult<()> {
        for chunk in keys.chunks(ID_CHUNK) {
            let binds: Vec<Bind<'_>> = chunk.iter().map(|key| Bind::Text(key)).collect();
            let heads = load_ids(self, &heads_of(chunk.len()), &binds)?;
            if !heads.is_empty() {
                dynamic::<Mysql>(&unpark(heads.len()), &ids_bound(&heads)).execute(self)?;
            }
        }
        Ok(())
    }

    fn present(&mut self, ids: &[i64]) -> QueryResult<Vec<i64>> {
        let mut found = Vec::new();
        for chunk in ids.chunks(ID_CHUNK) {
            found.extend(load_ids(self, &present(chunk.len()), &ids_bound(chunk))?);
        }
        Ok(found)
    }

    fn held_by_others(&mut self, token: &str, ids: &[i64]) -> QueryResult<Vec<i64>> {
        load_ids(
            self,
            &held_by_others(ids.len()),
            &with_ids(&[Bind::Text(token)], ids),
        )
    }

    fn extend_leases(
        &mut self,
        token: &str,
        ids: &[i64],
        lease_micros: i64,
    ) -> QueryResult<Vec<i64>> {
        let binds = with_ids(&[Bind::BigInt(lease_micros), Bind::Text(token)], ids);
        let renewed = dynamic::<Mysql>(&extend_leases(ids.len()), &binds).execute(self)?;
        if renewed == ids.len() {
            return Ok(ids.to_vec());
        }
        load_ids(
            self,
            &held_by(ids.len()),
            &with_ids(&[Bind::Text(token)], ids),
        )
    }

    fn promote_stranded(&mut self) -> QueryResult<usize> {
        let lowest: Vec<IdRow> = Prepared::new(LOWEST_PARKED, STYLE, &[]).load(self)?;
        let ids: Vec<i64> = lowest.into_iter().map(|row| row.id).collect();
        let mut promoted = 0;
        for chunk in ids.chunks(ID_CHUNK) {
            promoted +=
                dynamic::<Mysql>(&unpark_stranded(chunk.len()), &ids_bound(chunk)).execute(self)?;
        }
        Ok(promoted)
    }

    fn refusing_setting(&mut self) -> QueryResult<Option<String>> {
        let logging: BinaryLogging = Prepared::new(BINARY_LOGGING, STYLE, &[]).get_result(self)?;
        Ok(statement_logging_refuses_claims(
            logging.log_bin != 0,
            &logging.binlog_format,
        ))
    }

    fn settle_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T> {
        self.transaction(body)
    }

    fn requeue(&mut self, selection: &Selection<'_>) -> QueryResult<Vec<i64>> {
        self.transaction(|c| {
            let ids = match selection {
                Selection::Positions(ids) => {
                    let mut locked = Vec::new();
                    for chunk in ids.chunks(ID_CHUNK) {
                        locked.extend(load_ids(
                            c,
                            &select_dead_at_for_update(chunk.len()),
                            &ids_bound(chunk),
                        )?);
                    }
                    locked
                }
                Selection::MessageType(t) => {
                    load_ids(c, SELECT_DEAD_FOR_UPDATE, &[Bind::NullableText(Some(t))])?
                }
                Selection::All => load_ids(c, SELECT_DEAD_FOR_UPDATE, &[Bind::NullableText(None)])?,
            };
            for chunk in ids.chunks(ID_CHUNK) {
                dynamic::<Mysql>(&list_groups_of_dead(chunk.len()), &ids_bound(chunk))
                    .execute(c)?;
                dynamic::<Mysql>(&requeue(chunk.len()), &ids_bound(chunk)).execute(c)?;
                dynamic::<Mysql>(&purge_at(chunk.len()), &ids_bound(chunk)).execute(c)?;
            }
            Ok(ids)
        })
    }

    fn purge(&mut self, selection: &Selection<'_>) -> QueryResult<usize> {
        match selection {
            Selection::Positions(ids) => self.transaction(|c| {
                let mut purged = 0;
                for chunk in ids.chunks(ID_CHUNK) {
                    purged +=
                        dynamic::<Mysql>(&purge_at(chunk.len()), &ids_bound(chunk)).execute(c)?;
                }
                Ok(purged)
            }),
            Selection::MessageType(t) => run(self, PURGE, &[Bind::NullableText(Some(t))]),
            Selection::All => run(self, PURGE, &[Bind::NullableText(None)]),
        }
    }

    fn settle_idempotency_keys(&mut self, positions: &[i64]) -> QueryResult<usize> {
        dynamic::<Mysql>(&settle_keys(positions.len()), &ids_bound(positions)).execute(self)
    }

    fn run_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize> {
        run(self, sql, binds)
    }
}

impl DeliveryLogStatements for MysqlConnection {
    const PLACEHOLDERS: Placeholders = STYLE;

    const SELECT: &'static str = "SELECT id, message_id, message_type, destination, \
         subscription_id, attempt, outcome, status, answer, error, latency_micros, \
         TIMESTAMPDIFF(MICROSECOND, '1970-01-01', started_at) AS started_at FROM outbox_attempt";

    fn uuid_param(_: usize) -> String {
        "?".to_owned()
    }

    fn time_param(_: usize) -> String {
        "TIMESTAMPADD(MICROSECOND, ?, '1970-01-01')".to_owned()
    }

    fn micros_of(column: &str) -> String {
        format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {column})")
    }

    fn execute_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize> {
        dynamic::<Mysql>(sql, binds).execute(self)
    }

    fn load_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<AttemptRow>> {
        dynamic::<Mysql>(sql, binds).load(self)
    }

    fn last_attempt_id(&mut self) -> QueryResult<Option<i64>> {
        Prepared::new(LAST_ATTEMPT_ID, STYLE, &[])
            .get_result::<LastIdRow>(self)
            .map(|row| row.id)
    }

    const NOW: &'static str = "UTC_TIMESTAMP(6)";
    const INSERT_IGNORING: (&'static str, &'static str) = ("INSERT IGNORE INTO", "");

    fn load_archived(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<ArchivedRow>> {
        dynamic::<Mysql>(sql, binds).load(self)
    }
}

#[cfg(test)]
mod tests {
    use diesel::debug_query;

    use super::*;

    #[test]
    fn a_statement_binary_log_is_named_with_the_fix() {
        let refusal = statement_logging_refuses_claims(true, "STATEMENT").unwrap();
        assert!(refusal.contains("binlog_format=ROW"), "{refusal}");
        assert!(statement_logging_refuses_claims(true, "statement").is_some());
        assert_eq!(statement_logging_refuses_claims(true, "ROW"), None);
        assert_eq!(statement_logging_refuses_claims(true, "MIXED"), None);
        assert_eq!(
            statement_logging_refuses_claims(false, "STATEMENT"),
            None,
            "no binary log, nothing refused"
        );
    }

    #[test]
    fn lists_take_one_bind_per_id_and_nothing_is_inlined() {
        let ids = [11_i64, 12, 13];
        let binds = with_ids(&[Bind::Text("token"), Bind::BigInt(5)], &ids);
        let sql = lease(ids.len());
        let query = dynamic::<Mysql>(&sql, &binds);
        let shown = debug_query::<Mysql, _>(&query).to_string();
        assert!(shown.contains("WHERE id IN (?, ?, ?)"), "{shown}");
        assert!(
            shown.ends_with("-- binds: [\"token\", 5, 11, 12, 13]"),
            "{shown}"
        );
        let (sql, _) = shown.split_once(" -- binds").unwrap();
        assert!(!sql.contains("11"), "ids are bound, not inlined: {sql}");
    }

    #[test]
    fn done_messages_of_several_claims_are_deleted_in_one_statement() {
        let groups = vec![("a".to_owned(), vec![1, 2]), ("b".to_owned(), vec![3])];
        assert_eq!(
            delete_done(&groups),
            "DELETE outbox_message FROM outbox_message FORCE INDEX (PRIMARY) \
             WHERE (locked_by = ? AND id IN (?, ?)) OR (locked_by = ? AND id IN (?))"
        );
    }

    #[test]
    fn fixed_statements_take_as_many_binds_as_they_say() {
        for (sql, binds) in [
            (INSERT_MESSAGE, NewMessage::BINDS),
            (CANDIDATES, 5),
            (GROUPS, 2),
            (GROUP_SHARE, 5),
            (REMOVE_EMPTY_GROUPS, 0),
            (HORIZON, 0),
            (<MysqlConnection as Dialect>::RESCHEDULE, 5),
            (LOCK_OWNED, 2),
            (COPY_TO_DEAD, 2),
            (DELETE_ONE, 1),
            (<MysqlConnection as Dialect>::PENDING, 6),
            (<MysqlConnection as Dialect>::PENDING_BY_KEY, 7),
            (<MysqlConnection as Dialect>::PENDING_BY_MESSAGE_ID, 2),
            (<MysqlConnection as Dialect>::DEAD_BY_MESSAGE_ID, 2),
            (<MysqlConnection as Dialect>::DEAD_POSITIONS, 1),
            (<MysqlConnection as Dialect>::BLOCKED_KEYS, 1),
            (<MysqlConnection as Dialect>::DEAD_LETTERS, 6),
            (PURGE, 1),
            (<MysqlConnection as Dialect>::INBOX_RECORD, 1),
            (<MysqlConnection as Dialect>::REVOKE_SESSION, 2),
            (<MysqlConnection as Dialect>::SESSION_REVOKED, 1),
            (<MysqlConnection as Dialect>::FORGET_REVOKED, 1),
            (<MysqlConnection as Dialect>::INBOX_SWEEP, 2),
            (<MysqlConnection as Dialect>::PRUNE_DEAD_LETTERS, 2),
            (<MysqlConnection as Dialect>::BACKLOG, 0),
            (<MysqlConnection as Dialect>::RESERVE_KEY, 2),
            (<MysqlConnection as Dialect>::KEYED_MESSAGE, 1),
            (<MysqlConnection as Dialect>::SET_KEY_POSITION, 1),
            (<MysqlConnection as Dialect>::UNSETTLED_KEYS, 2),
            (<MysqlConnection as Dialect>::EXPIRE_KEYS, 2),
            (<MysqlConnection as Dialect>::ADD_DESTINATION, 2),
            (<MysqlConnection as Dialect>::LOCK_DESTINATION, 1),
            (<MysqlConnection as Dialect>::LOCK_TURNS, 1),
            (<MysqlConnection as Dialect>::WRITE_TURNS, 5),
            (<MysqlConnection as Dialect>::REPORT_DESTINATION, 7),
            (<MysqlConnection as Dialect>::DESTINATIONS, 0),
            (<MysqlConnection as Dialect>::ENABLE_DESTINATION, 1),
            (<MysqlConnection as Dialect>::DISABLE_DESTINATION, 2),
            (<MysqlConnection as Dialect>::PAUSE_MESSAGE, 4),
            (<MysqlConnection as Dialect>::RELEASE_PAUSED, 0),
            (<MysqlConnection as Dialect>::PAUSE, 3),
            (<MysqlConnection as Dialect>::RESUME, 2),
            (<MysqlConnection as Dialect>::PAUSES, 0),
        ] {
            assert_eq!(sql.matches('?').count(), binds, "{sql}");
        }
    }
}
