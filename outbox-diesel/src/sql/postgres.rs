//! PostgreSQL's statements. Times are `timestamptz`, ids `uuid`, payloads `jsonb`; lists of ids
//! and keys are bound as arrays, so every text here is fixed and kept prepared. The worker's own
//! writes (claims, settlements) commit without waiting for the WAL flush, for that statement or
//! transaction only: the relation [`ASYNC_COMMIT`] joined into a statement turns
//! `synchronous_commit` off for its transaction. A database crash can then undo the last of
//! them, which runs those messages again but loses none.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel::{Connection, QueryResult, QueryableByName, RunQueryDsl};

use super::bind::{dynamic, Bind, PgBind, Placeholders, Prepared, PreparedPg};
use super::cancel::{CancelRows, CancelStatements, KeyedRow};
use super::delivery_log::{
    ArchivedRow, AttemptRow, DeliveryLogStatements, LastIdRow, LoggedRow, LAST_ATTEMPT_ID,
};
use super::subscription::{SubscriptionDialect, SubscriptionStatements};
use super::{
    Claim, ClaimRow, Claimed, CountRow, Cursor, Dialect, HorizonRow, IdRow, LoadFixed, MessageRow,
    Selection, Statements, Successors,
};
use crate::sql::new_message::NewMessage;

const STYLE: Placeholders = Placeholders::Numbered;

/// Bind parameters one statement may carry.
pub(crate) const MAX_BINDS: usize = 65_535;

/// A one-row relation whose reading turns off `synchronous_commit` for the current
/// transaction (`set_config(.., true)`), which for a single statement is the statement's own.
macro_rules! async_commit {
    () => {
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
    };
}

/// The same, as a statement inside a settlement's transaction.
pub(crate) const ASYNC_COMMIT: &str = "SET LOCAL synchronous_commit = off";

/// Back to the setting the session would have had without any SET (the server's, database's or
/// role's), undoing [`ASYNC_COMMIT`] for a transaction that holds an application's writes.
pub(crate) const DURABLE_COMMIT: &str = "SET LOCAL synchronous_commit TO DEFAULT";

/// One message, as `enqueue` writes it: binds message id, type, payload, its size in bytes,
/// ordering key, not-before in µs since the epoch (NULL: now plus the delay), delay in µs
/// (NULL: none), headers (JSON, NULL: none), priority level, group, whether an earlier row of
/// the insert has its key, and the ordering key again. No message is due before its transaction's
/// clock (a not-before in the past means now), the time the transaction's notification carries.
/// A keyed message is parked from the start when its key has a pending message already (an
/// index probe, a plain read that locks nothing): a burst behind a head that is not due never
/// comes before a claim.
pub(crate) const INSERT_MESSAGE: &str = "INSERT INTO outbox_message \
     (message_id, message_type, payload, payload_bytes, ordering_key, next_attempt_at, headers, \
      priority, group_name, owner, parked) \
     VALUES ($1::uuid, $2, $3::jsonb, $4, $5, \
     GREATEST(COALESCE(TIMESTAMPTZ 'epoch' + $6 * INTERVAL '1 microsecond', \
         now() + COALESCE($7, 0) * INTERVAL '1 microsecond'), now()), $8, $9, $10, $11, \
     $12 OR EXISTS (SELECT 1 FROM outbox_message e WHERE e.ordering_key = $13))";

/// Attempts into the delivery log, each column an array (an empty text or -1: none). Binds:
/// message ids, types, destinations, subscriptions, attempts, outcomes, statuses, answers,
/// errors, latencies in µs, starts in µs since the epoch.
pub(crate) const INSERT_ATTEMPTS: &str = "INSERT INTO outbox_attempt \
     (message_id, message_type, destination, subscription_id, attempt, outcome, status, answer, \
      error, latency_micros, started_at) \
     SELECT m::uuid, t, d, NULLIF(s, ''), a, o, NULLIF(st, -1), NULLIF(an, ''), NULLIF(e, ''), l, \
     TIMESTAMPTZ 'epoch' + b * INTERVAL '1 microsecond' \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], \
     $7::bigint[], $8::text[], $9::text[], $10::bigint[], $11::bigint[]) \
     AS r(m, t, d, s, a, o, st, an, e, l, b)";

/// The VALUES tuple of one row of a batch insert, from its first placeholder's number.
fn insert_values(first: usize) -> String {
    let p = |i: usize| first + i;
    format!(
        "(${}::uuid, ${}, ${}::jsonb, ${}, ${}, \
         GREATEST(COALESCE(TIMESTAMPTZ 'epoch' + ${} * INTERVAL '1 microsecond', \
             now() + COALESCE(${}, 0) * INTERVAL '1 microsecond'), now()), ${}, ${}, ${}, ${}, \
         ${} OR EXISTS (SELECT 1 FROM outbox_message e WHERE e.ordering_key = ${}))",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8),
        p(9),
        p(10),
        p(11),
        p(12)
    )
}

/// The claim, in one statement: read a batch of due, unparked rows (locking them, skipping
/// those another claim locks) in three lanes: the raised priorities by their own index; a share
/// of each of up to [`GROUPS_PER_CLAIM`] groups (`outbox_group`, from the group after the last
/// claim's last one, wrapping), each by the grouped index from the claim cursor on; and the
/// ordinary messages, grouped or not, in due order from the claim cursor on. Then judge each a
/// head of its key or not, park the others, keep the heads within the count and bytes (priority
/// first, then the groups in turn: the first of each before the second of any, messages
/// without a group being one more group, and a group's rows of the ordinary lane after its
/// share, so that none is taken out of its order), and lease them; each leased row also says
/// where the claim's first ordinary candidate stood, the next claim's cursor (none without
/// one: the cursor stays), and the last group it visited.
/// Binds: the last claim's last group (twice), the cursor (due time in µs since the epoch, id:
/// twice), count, bytes, whether an oversized first message may go alone, token, lease µs.
///
/// The lease is `leased_until`, a column outside every index: a leased message keeps its place
/// in the due index, and claims skip it on the heap while its lease runs. Leasing so rewrites no
/// index entry, and with the table's pages filled to 45 % on insert the new row version stays on
/// its page (a HOT update): a claim of 256 costs the database about 40 % fewer buffer accesses
/// than when the lease moved the indexed due time (BENCHMARKS.md, "A lease outside every
/// index"). The price: a claim walks past the rows the claims before it still hold (at most a
/// worker's in-flight messages), and the table takes about twice the pages.
///
/// The cursor keeps the claim's cost from growing with dead rows: every settled message leaves
/// a dead entry in the due index until a vacuum removes it, and a transaction
/// held open anywhere in the database (a report, a `pg_dump`) keeps vacuum from removing any.
/// Without a cursor each claim walked every dead entry in front of the first live one; with it
/// a claim starts where the last one found its first candidate. Messages that become due behind
/// the cursor (a crashed worker's lease running out behind it, an enqueue from a transaction
/// older than the cursor) are found through the store's rewinds (see `claim_cursor`). The raised
/// priorities are read from the start of their index, cursor or not: they are few. The groups
/// are listed from their own small table, never from the grouped index, whose entries of a
/// drained group a held transaction would keep; each group's share is read from the cursor on,
/// as the ordinary lane is. The cursor comes from the grouped and ordinary rows read, whether
/// kept or not (a grouped row read and left is not in the ordinary lane, and must not be passed).
///
/// Rows are updated by `id = ANY(ARRAY(…))`, never by a join: a vacuum that ran while the
/// outbox was empty records no rows for the table, and for an "empty" table the planner joins
/// by reading all of it, dead tuples included. Behind a held transaction that made each claim
/// read 321,000 buffers (1.36 s; 16 ms this way). The settlements do the same.
macro_rules! claim {
    ($candidates:literal, $per_group:literal) => {
        claim!($candidates, $candidates, $per_group, $candidates)
    };
    ($prioritized:literal, $ordinary:literal, $per_group:literal, $candidates:literal) => {
        concat!(
    "WITH prioritized AS (\
        SELECT id, next_attempt_at, ordering_key, priority, group_name, \
            COALESCE(payload_bytes, octet_length(payload::text)) AS size \
        FROM outbox_message \
        WHERE priority > 0 AND NOT parked AND next_attempt_at <= now() \
            AND (leased_until IS NULL OR leased_until <= now()) \
        ORDER BY priority DESC, next_attempt_at, id LIMIT ", $prioritized, " \
        FOR UPDATE SKIP LOCKED), \
     groups AS (\
        SELECT name, pass FROM (\
            (SELECT name, 0 AS pass FROM outbox_group WHERE name > $1 ORDER BY name LIMIT 8) \
            UNION ALL \
            (SELECT name, 1 AS pass FROM outbox_group WHERE name <= $2 ORDER BY name LIMIT 8)) g \
        LIMIT 8), \
     last_group AS (SELECT name FROM groups ORDER BY pass DESC, name DESC LIMIT 1), \
     grouped AS (\
        SELECT m.* FROM groups g CROSS JOIN LATERAL (\
            SELECT id, next_attempt_at, ordering_key, priority, group_name, \
                COALESCE(payload_bytes, octet_length(payload::text)) AS size \
            FROM outbox_message \
            WHERE group_name = g.name AND priority <= 0 AND NOT parked \
                AND next_attempt_at <= now() AND (leased_until IS NULL OR leased_until <= now()) \
                AND (next_attempt_at, id) >= \
                    (TIMESTAMPTZ 'epoch' + $3 * INTERVAL '1 microsecond', $4) \
            ORDER BY next_attempt_at, id LIMIT ", $per_group, " \
            FOR UPDATE SKIP LOCKED) m), \
     ordinary AS (\
        SELECT id, next_attempt_at, ordering_key, priority, group_name, \
            COALESCE(payload_bytes, octet_length(payload::text)) AS size \
        FROM outbox_message \
        WHERE priority <= 0 AND NOT parked AND next_attempt_at <= now() \
            AND (leased_until IS NULL OR leased_until <= now()) \
            AND (next_attempt_at, id) >= (TIMESTAMPTZ 'epoch' + $5 * INTERVAL '1 microsecond', $6) \
            AND id <> ALL(ARRAY(SELECT id FROM grouped)) \
        ORDER BY next_attempt_at, id LIMIT ", $ordinary, " \
        FOR UPDATE SKIP LOCKED), \
     shares AS (SELECT group_name, count(*) AS n FROM grouped GROUP BY group_name), \
     lanes AS (\
        SELECT p.*, 0::BIGINT AS turn FROM prioritized p \
        UNION ALL SELECT g.*, row_number() OVER (\
            PARTITION BY g.group_name ORDER BY g.next_attempt_at, g.id) FROM grouped g \
        UNION ALL SELECT o.*, COALESCE(s.n, 0) + row_number() OVER (\
            PARTITION BY o.group_name ORDER BY o.next_attempt_at, o.id) \
        FROM ordinary o LEFT JOIN shares s ON s.group_name = o.group_name), \
     candidates AS (\
        SELECT * FROM lanes ORDER BY priority DESC, turn, next_attempt_at, id \
        LIMIT ", $candidates, "), \
     first AS (\
        SELECT (EXTRACT(EPOCH FROM next_attempt_at) * 1000000)::BIGINT AS due, id \
        FROM lanes WHERE priority <= 0 ORDER BY next_attempt_at, id LIMIT 1), \
     judged AS (\
        SELECT c.*, (c.ordering_key IS NULL OR NOT EXISTS (\
            SELECT 1 FROM outbox_message e \
            WHERE e.ordering_key = c.ordering_key AND e.id < c.id)) AS head \
        FROM candidates c), \
     parked AS (\
        UPDATE outbox_message o SET parked = TRUE \
        WHERE o.id = ANY(ARRAY(SELECT id FROM judged WHERE NOT head)) RETURNING o.id), \
     sized AS (\
        SELECT id, row_number() OVER w AS n, sum(size) OVER w AS upto \
        FROM judged WHERE head \
        WINDOW w AS (ORDER BY priority DESC, turn, next_attempt_at, id)), \
     chosen AS (\
        SELECT id FROM sized WHERE n <= $8 AND (upto <= $9 OR (n = 1 AND $10))) \
     UPDATE outbox_message o \
     SET locked_by = $11::uuid, attempts = o.attempts + 1, \
         leased_until = now() + $12 * INTERVAL '1 microsecond' \
     FROM ",
    async_commit!(),
    " LEFT JOIN first ON TRUE LEFT JOIN last_group ON TRUE \
     WHERE o.id = ANY(ARRAY(SELECT id FROM chosen)) \
     RETURNING o.id, o.message_id::text AS message_id, o.message_type, \
         o.payload::text AS payload, o.ordering_key, o.attempts, o.headers, \
         (EXTRACT(EPOCH FROM o.created_at) * 1000000)::BIGINT AS created_micros, \
         (EXTRACT(EPOCH FROM o.resumed_at) * 1000000)::BIGINT AS resumed_micros, \
         o.subscription_id, o.priority::bigint AS priority, first.due AS first_due, \
         first.id AS first_id, \
         last_group.name AS last_group"
        )
    };
}

/// The claim with its ordinary lane's `LIMIT` bound (`$7`): for batches larger than any of
/// `CLAIMS_BY_CANDIDATES`, and for `EXPLAIN`. (A placeholder is bound once: the raised
/// priorities' limit and the groups' shares are the largest written in, and the lanes together
/// unlimited.)
pub const CLAIM: &str = claim!("1024", "$7", "128", "ALL");

/// The claim with its candidates' `LIMIT` written in, by that limit, smallest first (and each
/// group's share of it, an eighth); a claim uses the first that reads at least the candidates
/// it needs, and binds no limit.
///
/// With a bound `LIMIT` PostgreSQL's generic plan assumes a tenth of the table passes it, costs
/// itself above the plans made for each call, and so planned every claim anew: about 0.3 ms
/// of the server's CPU a claim, 18 % of its samples in a profile of the no-op drain. With the
/// limit written in, the generic plan costs what the others do and is kept after five calls.
/// Reading up to twice the candidates a claim needs costs less than that planning (the extra
/// ones are locked for the statement only, and never leased).
pub(crate) const CLAIMS_BY_CANDIDATES: [(i64, &str); 7] = [
    (16, claim!("16", "2")),
    (32, claim!("32", "4")),
    (64, claim!("64", "8")),
    (128, claim!("128", "16")),
    (256, claim!("256", "32")),
    (512, claim!("512", "64")),
    (1024, claim!("1024", "128")),
];

/// Groups listed for claims (a group listed already is left alone). Binds: names.
pub(crate) const REGISTER_GROUPS: &str =
    "INSERT INTO outbox_group (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING";

/// Groups without a pending unparked message removed (one probe of the grouped index each).
pub(crate) const REMOVE_EMPTY_GROUPS: &str = "DELETE FROM outbox_group g WHERE NOT EXISTS (\
     SELECT 1 FROM outbox_message m WHERE m.group_name = g.name AND NOT m.parked)";

/// Done messages removed (each only while its claim holds it), and the next message of each
/// key promoted, in one statement, whatever the claims the messages were leased under: the
/// promotion looks past every row the DELETE removes (every part of the statement sees the table
/// as it was before), one probe of the ordering index per key. Binds: the claims' tokens and the
/// ids, as two arrays of one length (the n-th id leased under the n-th token), keys.
pub(crate) const DELETE_DONE: &str = concat!(
    "WITH done AS (SELECT * FROM unnest($1::text[], $2::bigint[]) AS t(token, id)), \
     gone AS (\
        DELETE FROM outbox_message o USING done t, ",
    async_commit!(),
    " WHERE o.id = ANY(ARRAY(SELECT id FROM done)) AND o.id = t.id \
            AND o.locked_by = t.token::uuid RETURNING o.id), \
     promoted AS (\
        UPDATE outbox_message SET parked = FALSE, \
            next_attempt_at = GREATEST(next_attempt_at, now()) \
        WHERE parked AND id = ANY(ARRAY(\
            SELECT next.id FROM unnest($3::text[]) AS k(ordering_key), LATERAL (\
                SELECT id FROM outbox_message m \
                WHERE m.ordering_key = k.ordering_key AND m.id NOT IN (SELECT id FROM gone) \
                ORDER BY m.id LIMIT 1) next))) \
     SELECT count(*) AS n FROM gone"
);

/// Whether a key's next message, as the UPDATE finds it, is leased with its promotion: due
/// now (so not leased to anyone) and within the payload size a successor may have (`s`: the
/// statement's `successor` parameters).
macro_rules! successor_leasable {
    () => {
        "(o.next_attempt_at <= now() \
         AND (o.leased_until IS NULL OR o.leased_until <= now()) \
         AND COALESCE(o.payload_bytes, octet_length(o.payload::text)) <= s.largest)"
    };
}

/// [`DELETE_DONE`], and the next message of each key leased to the worker with its promotion
/// where it is due and small enough, so that it goes to a handler without waiting for a claim.
/// The lease is decided on the row as the UPDATE finds it: where a concurrent claim locked it,
/// PostgreSQL waits for that claim and judges the row as it committed, so a message another
/// worker just leased is left alone. Every claim of the settlement in one statement: a key's
/// next message is judged after every done message is gone, so a done message leased under
/// another claim of the same settlement is never taken for its key's next one. One row always:
/// how many were deleted, and a leased message's columns (all NULL when none was leased).
///
/// Where a key's next message is leased, the messages after it are leased too (`chain`), up to
/// the last bind in all: the key's prefix of messages that are due and parked, up to the first
/// that is not, within the byte cap together; they stay parked (no claim takes one, and a
/// release leaves it waiting behind the messages before it), and the worker runs them in order
/// on one handler thread. Only parked rows behind a head the same statement leased: no claim
/// locks them, and a key's messages are settled by the one worker that holds its head.
///
/// Binds: tokens, ids (as [`DELETE_DONE`]), keys, the successors' token, lease µs, largest
/// payload in bytes for one key, most messages a key, each once and in order (the `successor`
/// row names three), so that the statement is kept prepared: parsed and planned anew on every
/// call it cost a settlement of 16 keys about 1.2 ms, which with keys bounds the drain.
pub(crate) const DELETE_DONE_LEASING: &str = concat!(
    "WITH done AS (SELECT * FROM unnest($1::text[], $2::bigint[]) AS t(token, id)), \
     keys AS (SELECT unnest($3::text[]) AS ordering_key), \
     successor AS (SELECT $4::uuid AS token, $5::bigint AS lease_micros, $6::bigint AS largest), \
     gone AS (\
        DELETE FROM outbox_message o USING done t, ",
    async_commit!(),
    " WHERE o.id = ANY(ARRAY(SELECT id FROM done)) AND o.id = t.id \
            AND o.locked_by = t.token::uuid RETURNING o.id), \
     next AS (\
        SELECT n.id FROM keys k, LATERAL (\
            SELECT id FROM outbox_message m \
            WHERE m.ordering_key = k.ordering_key AND m.id NOT IN (SELECT id FROM gone) \
            ORDER BY m.id LIMIT 1) n), \
     moved AS (\
        UPDATE outbox_message o SET parked = FALSE, \
            locked_by = CASE WHEN ",
    successor_leasable!(),
    " THEN s.token ELSE o.locked_by END, \
            attempts = CASE WHEN ",
    successor_leasable!(),
    " THEN o.attempts + 1 ELSE o.attempts END, \
            leased_until = CASE WHEN ",
    successor_leasable!(),
    " THEN now() + s.lease_micros * INTERVAL '1 microsecond' \
                ELSE o.leased_until END, \
            next_attempt_at = GREATEST(o.next_attempt_at, now()) \
        FROM successor s \
        WHERE o.id = ANY(ARRAY(SELECT id FROM next)) AND (o.parked OR ",
    successor_leasable!(),
    ") \
        RETURNING o.id, o.message_id::text AS message_id, o.message_type, \
            o.payload::text AS payload, o.ordering_key, o.attempts, o.headers, \
            (EXTRACT(EPOCH FROM o.created_at) * 1000000)::BIGINT AS created_micros, \
            (EXTRACT(EPOCH FROM o.resumed_at) * 1000000)::BIGINT AS resumed_micros, \
            o.subscription_id, o.priority::bigint AS priority, \
            COALESCE(o.payload_bytes, octet_length(o.payload::text)) AS bytes, \
            o.locked_by IS NOT DISTINCT FROM s.token AS leased), \
     chain AS (\
        SELECT c.id FROM moved h, successor s, LATERAL (\
            SELECT r.id, bool_and(r.ready) OVER w AS ready, \
                h.bytes + sum(r.bytes) OVER w AS bytes \
            FROM (\
                SELECT m.id, (m.parked AND m.next_attempt_at <= now() \
                        AND (m.leased_until IS NULL OR m.leased_until <= now())) AS ready, \
                    COALESCE(m.payload_bytes, octet_length(m.payload::text)) AS bytes \
                FROM outbox_message m \
                WHERE m.ordering_key = h.ordering_key AND m.id > h.id \
                    AND m.id NOT IN (SELECT id FROM gone) \
                ORDER BY m.id LIMIT ($7::bigint - 1)) r \
            WINDOW w AS (ORDER BY r.id)) c \
        WHERE h.leased AND c.ready AND c.bytes <= s.largest), \
     chained AS (\
        UPDATE outbox_message o SET locked_by = s.token, attempts = o.attempts + 1, \
            leased_until = now() + s.lease_micros * INTERVAL '1 microsecond' \
        FROM successor s \
        WHERE o.id = ANY(ARRAY(SELECT id FROM chain)) AND o.parked \
            AND (o.leased_until IS NULL OR o.leased_until <= now()) \
        RETURNING o.id, o.message_id::text AS message_id, o.message_type, \
            o.payload::text AS payload, o.ordering_key, o.attempts, o.headers, \
            (EXTRACT(EPOCH FROM o.created_at) * 1000000)::BIGINT AS created_micros, \
            (EXTRACT(EPOCH FROM o.resumed_at) * 1000000)::BIGINT AS resumed_micros, \
            o.subscription_id, o.priority::bigint AS priority), \
     leased AS (\
        SELECT id, message_id, message_type, payload, ordering_key, attempts, headers, \
            created_micros, resumed_micros, subscription_id, priority \
        FROM moved WHERE leased \
        UNION ALL SELECT * FROM chained) \
     SELECT (SELECT count(*) FROM gone) AS n, m.id, m.message_id, m.message_type, m.payload, \
         m.ordering_key, m.attempts, m.headers, m.created_micros, m.resumed_micros, \
         m.subscription_id, m.priority \
     FROM (SELECT 1) AS one LEFT JOIN leased m ON TRUE"
);

/// Messages given back undone, the attempt not counted. Binds: token, ids.
pub(crate) const RELEASE: &str = "UPDATE outbox_message \
     SET locked_by = NULL, leased_until = NULL, next_attempt_at = now(), \
         attempts = attempts - 1 \
     WHERE locked_by = $1::uuid AND id = ANY($2)";

/// One message moved to the dead letters in one statement: removed only if its claim holds
/// it, so it is either moved whole or left alone (fenced). A dead letter already at its
/// position (it cannot be, as re-queueing removes it; but a row edited by hand could) is
/// replaced. Binds: id, token, error.
pub(crate) const DEAD_LETTER: &str = "WITH moved AS (\
        DELETE FROM outbox_message WHERE id = $1 AND locked_by = $2::uuid \
        RETURNING id, message_id, message_type, payload, ordering_key, attempts, created_at, \
            headers, priority, group_name, owner, subscription_id) \
     INSERT INTO outbox_failure (id, message_id, message_type, payload, ordering_key, attempts, \
         last_error, created_at, failed_at, headers, priority, group_name, owner, subscription_id) \
     SELECT id, message_id, message_type, payload, ordering_key, attempts, $3, created_at, now(), \
         headers, priority, group_name, owner, subscription_id \
     FROM moved \
     ON CONFLICT (id) DO UPDATE SET message_id = EXCLUDED.message_id, \
         message_type = EXCLUDED.message_type, payload = EXCLUDED.payload, \
         ordering_key = EXCLUDED.ordering_key, attempts = EXCLUDED.attempts, \
         headers = EXCLUDED.headers, priority = EXCLUDED.priority, group_name = EXCLUDED.group_name, \
         owner = EXCLUDED.owner, subscription_id = EXCLUDED.subscription_id, \
         last_error = EXCLUDED.last_error, created_at = EXCLUDED.created_at, \
         failed_at = EXCLUDED.failed_at";

/// The lowest pending message of each key unparked, if parked: one probe of the ordering
/// index per key (`min(..) GROUP BY` would read every pending row of the keys). Binds: keys.
pub(crate) const PROMOTE_HEADS: &str = "UPDATE outbox_message \
     SET parked = FALSE, next_attempt_at = GREATEST(next_attempt_at, now()) \
     WHERE parked AND id = ANY(ARRAY(\
        SELECT next.id FROM unnest($1::text[]) AS k(ordering_key), LATERAL (\
            SELECT id FROM outbox_message m WHERE m.ordering_key = k.ordering_key \
            ORDER BY m.id LIMIT 1) next))";

/// Of some ids, those still in the outbox. Binds: ids.
pub(crate) const PRESENT: &str = "SELECT id FROM outbox_message WHERE id = ANY($1)";

/// Of some ids, those leased to another claim. Binds: ids, token.
pub(crate) const HELD_BY_OTHERS: &str = "SELECT id FROM outbox_message \
     WHERE id = ANY($1) AND locked_by IS NOT NULL AND locked_by <> $2::uuid";

/// Leases renewed while the claim holds them. Binds: lease µs, token, ids.
pub(crate) const EXTEND_LEASES: &str = "UPDATE outbox_message \
     SET leased_until = now() + $1 * INTERVAL '1 microsecond' \
     WHERE locked_by = $2::uuid AND id = ANY($3) RETURNING id";

/// The safety net of parking: the lowest parked message of each key with parked messages
/// (found by a skip scan of the parked index: one probe per such key, not a read of every
/// parked row), unparked if no lower position of its key is pending.
pub(crate) const PROMOTE_STRANDED: &str = "WITH RECURSIVE parked_keys AS (\
        (SELECT ordering_key, id FROM outbox_message WHERE parked \
         ORDER BY ordering_key, id LIMIT 1) \
        UNION ALL \
        SELECT next.ordering_key, next.id FROM parked_keys p, LATERAL (\
            SELECT ordering_key, id FROM outbox_message \
            WHERE parked AND ordering_key > p.ordering_key \
            ORDER BY ordering_key, id LIMIT 1) next) \
     UPDATE outbox_message o \
     SET parked = FALSE, next_attempt_at = GREATEST(o.next_attempt_at, now()) FROM parked_keys k \
     WHERE o.id = k.id AND NOT EXISTS (\
        SELECT 1 FROM outbox_message e WHERE e.ordering_key = k.ordering_key AND e.id < k.id)";

/// The columns of a pending message as listed, from the outbox table.
macro_rules! pending_columns {
    () => {
        "SELECT id, message_id::text AS message_id, message_type, \
         left(payload::text, $1::int) AS payload, ordering_key, attempts, headers, \
         (EXTRACT(EPOCH FROM created_at) * 1000000)::BIGINT AS created_at, \
         (EXTRACT(EPOCH FROM GREATEST(next_attempt_at, leased_until)) * 1000000)::BIGINT \
             AS next_attempt_at, \
         CASE WHEN locked_by IS NOT NULL AND leased_until > now() THEN 1 ELSE 0 END \
             AS in_flight, \
         CASE WHEN parked THEN 1 ELSE 0 END AS parked, \
         CASE WHEN paused THEN 1 ELSE 0 END AS paused, priority::bigint AS priority, \
         group_name, last_error \
         FROM outbox_message "
    };
}

/// The columns of a dead letter as listed.
macro_rules! dead_letter_columns {
    () => {
        "SELECT id, message_id::text AS message_id, message_type, \
         left(payload::text, $1::int) AS payload, ordering_key, attempts, headers, last_error, \
         (EXTRACT(EPOCH FROM created_at) * 1000000)::BIGINT AS created_at, \
         (EXTRACT(EPOCH FROM failed_at) * 1000000)::BIGINT AS failed_at \
         FROM outbox_failure "
    };
}

/// The dead letters of a selection, locked for the move. Binds: type (NULL: every one).
pub(crate) const SELECT_DEAD_FOR_UPDATE: &str = "SELECT id FROM outbox_failure \
     WHERE message_type = COALESCE($1::text, message_type) ORDER BY id FOR UPDATE";

/// Dead letters at some positions, locked for the move. Binds: ids.
pub(crate) const SELECT_DEAD_AT_FOR_UPDATE: &str =
    "SELECT id FROM outbox_failure WHERE id = ANY($1) ORDER BY id FOR UPDATE";

/// Dead letters moved back into the outbox at their positions, as first attempts, keeping
/// their ids, and their groups listed again (the housekeeper removes a group once empty).
/// Binds: ids.
pub(crate) const REQUEUE: &str = "WITH moved AS (\
        DELETE FROM outbox_failure WHERE id = ANY($1) \
        RETURNING id, message_id, message_type, payload, ordering_key, created_at, last_error, \
            headers, priority, group_name, owner, subscription_id), \
     listed AS (\
        INSERT INTO outbox_group (name) \
        SELECT DISTINCT group_name FROM moved WHERE group_name IS NOT NULL \
        ON CONFLICT DO NOTHING) \
     INSERT INTO outbox_message (id, message_id, message_type, payload, payload_bytes, \
         ordering_key, attempts, created_at, next_attempt_at, last_error, headers, priority, \
         group_name, owner, subscription_id) \
     SELECT id, message_id, message_type, payload, octet_length(payload::text), ordering_key, \
         0, created_at, now(), last_error, headers, priority, group_name, owner, subscription_id \
     FROM moved";

/// Dead letters deleted. Binds: ids.
pub(crate) const PURGE_AT: &str = "DELETE FROM outbox_failure WHERE id = ANY($1)";

/// Dead letters of a type deleted (NULL: every one). Binds: type.
pub(crate) const PURGE: &str =
    "DELETE FROM outbox_failure WHERE message_type = COALESCE($1::text, message_type)";

/// The oldest transaction in this database that holds back the xmin horizon (and so vacuum),
/// other than this session, and the dead tuples of the outbox table as the statistics count
/// them. Sessions of other roles show no start time without `pg_read_all_stats`.
pub(crate) const HORIZON: &str = "SELECT \
     (SELECT (EXTRACT(EPOCH FROM now() - MIN(xact_start)) * 1000000)::BIGINT \
      FROM pg_stat_activity \
      WHERE datname = current_database() AND backend_xmin IS NOT NULL \
        AND pid <> pg_backend_pid()) AS oldest_transaction_micros, \
     (SELECT n_dead_tup FROM pg_stat_user_tables \
      WHERE relid = 'outbox_message'::regclass) AS dead_rows";

/// Keys stamped settled whose message has left the outbox and the dead letters (a dead letter
/// may still be re-queued). Binds: positions.
pub(crate) const SETTLE_KEYS: &str = "UPDATE outbox_idempotency k SET settled_at = now() \
     WHERE settled_at IS NULL AND message_position = ANY($1) \
     AND NOT EXISTS (SELECT 1 FROM outbox_message m WHERE m.id = k.message_position) \
     AND NOT EXISTS (SELECT 1 FROM outbox_failure f WHERE f.id = k.message_position)";

/// Claims' ids as two arrays of one length: the n-th id was leased under the n-th token.
fn pairs(claims: &[(String, Vec<i64>)]) -> (Vec<&str>, Vec<i64>) {
    claims
        .iter()
        .flat_map(|(token, ids)| ids.iter().map(move |id| (token.as_str(), *id)))
        .unzip()
}

/// The columns of a subscription as read ([`SubscriptionRow`]).
macro_rules! subscription_columns {
    () => {
        "SELECT id, owner, url, event_types, secret, \
             CASE WHEN previous_secret_until > now() THEN previous_secret END AS previous_secret, \
             rate_limit::bigint AS rate_limit, \
             CASE WHEN allow_http THEN 1 ELSE 0 END::bigint AS allow_http, description, \
             metadata, CASE WHEN enabled THEN 1 ELSE 0 END::bigint AS enabled, \
             (EXTRACT(EPOCH FROM created_at) * 1000000)::BIGINT AS created_micros, \
             (EXTRACT(EPOCH FROM updated_at) * 1000000)::BIGINT AS updated_micros, \
             (EXTRACT(EPOCH FROM previous_secret_until) * 1000000)::BIGINT \
                 AS previous_until_micros \
         FROM outbox_subscription "
    };
}

/// One delivery per subscription of an event, in the order given: the event's id, type,
/// payload, headers, priority, group, owner and enqueue time, due now. Binds: subscription ids
/// and their ordering keys (arrays of one length; an empty key is none), the event's position.
pub(crate) const INSERT_DELIVERIES: &str = "INSERT INTO outbox_message \
     (message_id, message_type, payload, payload_bytes, ordering_key, created_at, \
      next_attempt_at, headers, priority, group_name, owner, subscription_id) \
     SELECT e.message_id, e.message_type, e.payload, e.payload_bytes, \
         NULLIF(d.ordering_key, ''), e.created_at, now(), e.headers, e.priority, e.group_name, \
         e.owner, d.subscription \
     FROM outbox_message e, \
         unnest($1::text[], $2::text[]) WITH ORDINALITY AS d(subscription, ordering_key, n) \
     WHERE e.id = $3 ORDER BY d.n";

/// The filters of a cancel, in its binds' order: message id, type, subscription, age in µs.
/// A filter not given (NULL) takes every row.
macro_rules! cancel_filters {
    () => {
        "message_id = COALESCE($1::uuid, message_id) \
         AND message_type = COALESCE($2, message_type) \
         AND COALESCE($3, subscription_id) IS NOT DISTINCT FROM subscription_id \
         AND created_at <= now() - COALESCE($4, 0) * INTERVAL '1 microsecond'"
    };
}

/// The rows a cancel takes: no claim holds them, nor another transaction. Binds: the filters,
/// limit.
pub(crate) const CANCELLABLE: &str = concat!(
    "SELECT id, ordering_key FROM outbox_message WHERE ",
    cancel_filters!(),
    " AND (locked_by IS NULL OR leased_until <= now()) \
     ORDER BY id LIMIT $5 FOR UPDATE SKIP LOCKED"
);

/// How many rows of a cancel a claim holds. Binds: the filters.
pub(crate) const CANCEL_IN_FLIGHT: &str = concat!(
    "SELECT count(*) AS n FROM outbox_message WHERE ",
    cancel_filters!(),
    " AND locked_by IS NOT NULL AND leased_until > now()"
);

/// Moves rows to `outbox_cancelled`. Binds: ids, reason.
pub(crate) const MOVE_TO_CANCELLED: &str = "WITH moved AS (\
        DELETE FROM outbox_message WHERE id = ANY($1) \
        RETURNING id, message_id, message_type, payload, ordering_key, attempts, created_at, \
            headers, priority, group_name, owner, subscription_id) \
     INSERT INTO outbox_cancelled (id, message_id, message_type, payload, ordering_key, \
         attempts, created_at, headers, priority, group_name, owner, subscription_id, reason) \
     SELECT id, message_id, message_type, payload, ordering_key, attempts, created_at, headers, \
         priority, group_name, owner, subscription_id, $2 \
     FROM moved";

impl CancelStatements for PgConnection {
    fn cancellable(&mut self, rows: &CancelRows<'_>) -> QueryResult<Vec<KeyedRow>> {
        Prepared::new(CANCELLABLE, STYLE, &rows.cancellable_binds()).load(self)
    }

    fn cancel_in_flight(&mut self, rows: &CancelRows<'_>) -> QueryResult<i64> {
        let counted: Vec<CountRow> =
            Prepared::new(CANCEL_IN_FLIGHT, STYLE, &rows.filter_binds()).load(self)?;
        Ok(counted.first().map_or(0, |row| row.n))
    }

    fn move_to_cancelled(&mut self, ids: &[i64], reason: &str) -> QueryResult<usize> {
        diesel::sql_query(MOVE_TO_CANCELLED)
            .bind::<Array<BigInt>, _>(ids)
            .bind::<Text, _>(reason)
            .execute(self)
    }

    fn cancel_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T> {
        self.transaction(body)
    }
}

fn run(c: &mut PgConnection, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize> {
    Prepared::new(sql, STYLE, binds).execute(c)
}

/// A row of [`CLAIM`]: a leased message, and where the claim's first candidate stood.
#[derive(QueryableByName, Debug)]
struct CursoredClaimRow {
    #[diesel(embed)]
    claimed: ClaimRow,
    #[diesel(sql_type = Nullable<BigInt>)]
    first_due: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    first_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    last_group: Option<String>,
}

/// A row of [`DELETE_DONE_LEASING`]: how many were deleted, and a leased message, if any.
#[derive(QueryableByName, Debug)]
struct SettledRow {
    #[diesel(sql_type = BigInt, column_name = n)]
    deleted: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    message_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    message_type: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    payload: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    ordering_key: Option<String>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Integer>)]
    attempts: Option<i32>,
    #[diesel(sql_type = Nullable<Text>)]
    headers: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    created_micros: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    resumed_micros: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    subscription_id: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    priority: Option<i64>,
}

impl SettledRow {
    /// The leased message, as a claim returns it.
    fn leased(self) -> Option<ClaimRow> {
        Some(ClaimRow {
            message: MessageRow {
                id: self.id?,
                message_id: self.message_id?,
                message_type: self.message_type?,
                payload: self.payload?,
                ordering_key: self.ordering_key,
                attempts: self.attempts?,
                headers: self.headers,
            },
            created_micros: self.created_micros?,
            resumed_micros: self.resumed_micros,
            subscription_id: self.subscription_id,
            priority: self.priority?,
        })
    }
}

impl SubscriptionDialect for PgConnection {
    /// A subscription removed. Binds: id.
    const DELETE_SUBSCRIPTION: &'static str = "DELETE FROM outbox_subscription WHERE id = $1";

    /// A removed subscription's pending deliveries that no claim holds, removed. Binds: id.
    const DELETE_SUBSCRIPTION_DELIVERIES: &'static str = "DELETE FROM outbox_message \
         WHERE subscription_id = $1 AND (locked_by IS NULL OR leased_until <= now())";

    /// The enabled subscriptions of an event's owner created no later than the event (a
    /// subscription added later gets only later events). Binds: the event's position.
    const FAN_OUT_CANDIDATES: &'static str = "SELECT s.id, s.event_types \
         FROM outbox_message e JOIN outbox_subscription s \
             ON s.owner IS NOT DISTINCT FROM e.owner AND s.created_at <= e.created_at \
         WHERE e.id = $1 AND s.enabled ORDER BY s.created_at, s.id";

    /// A new subscription. Binds: id, owner, URL, filters (JSON), secret, rate limit, whether
    /// `http` is allowed, description, metadata (JSON), enabled.
    const INSERT_SUBSCRIPTION: &'static str = "INSERT INTO outbox_subscription \
         (id, owner, url, event_types, secret, rate_limit, allow_http, description, metadata, \
          enabled) \
         VALUES ($1, $2, $3, $4, $5, $6::integer, $7, $8, $9, $10)";

    /// The event a fan-out holds, locked, if its claim holds it. Binds: position, token.
    const LOCK_EVENT: &'static str = "SELECT message_type, ordering_key FROM outbox_message \
         WHERE id = $1 AND locked_by = $2::uuid FOR UPDATE";

    /// The paused deliveries of a subscription enabled again, due now. Binds: id.
    const RELEASE_SUBSCRIPTION: &'static str = "UPDATE outbox_message \
         SET paused = FALSE, next_attempt_at = now(), resumed_at = now() \
         WHERE subscription_id = $1 AND paused AND locked_by IS NULL";

    /// A subscription's stored secrets rewritten. Binds: secret, previous secret, id.
    const RESEAL_SUBSCRIPTION_SECRETS: &'static str =
        "UPDATE outbox_subscription SET secret = $1, previous_secret = $2 WHERE id = $3";

    /// A subscription's new secret; the old one stays the previous secret for the overlap. Binds:
    /// secret, overlap µs, id.
    const ROTATE_SUBSCRIPTION_SECRET: &'static str = "UPDATE outbox_subscription \
         SET previous_secret = secret, secret = $1, \
             previous_secret_until = now() + $2 * INTERVAL '1 microsecond', \
             updated_at = clock_timestamp() \
         WHERE id = $3";

    /// A subscription enabled or disabled. Binds: enabled, id.
    const SET_SUBSCRIPTION_ENABLED: &'static str =
        "UPDATE outbox_subscription SET enabled = $1, updated_at = clock_timestamp() WHERE id = $2";

    /// One subscription. Binds: id.
    const SUBSCRIPTION: &'static str = concat!(subscription_columns!(), "WHERE id = $1");

    /// Every subscription, oldest first.
    const SUBSCRIPTIONS: &'static str = concat!(subscription_columns!(), "ORDER BY created_at, id");

    /// One owner's subscriptions, oldest first. Binds: owner (NULL: those without an owner).
    const SUBSCRIPTIONS_OF: &'static str = concat!(
        subscription_columns!(),
        "WHERE owner IS NOT DISTINCT FROM $1 ORDER BY created_at, id"
    );
}

impl SubscriptionStatements for PgConnection {
    fn insert_deliveries(
        &mut self,
        id: i64,
        deliveries: &[(&str, Option<String>)],
    ) -> QueryResult<()> {
        if deliveries.is_empty() {
            return Ok(());
        }
        let subscriptions: Vec<&str> = deliveries.iter().map(|(id, _)| *id).collect();
        // An array of text cannot carry a NULL here: an event without a key gives keys of ''
        // that the statement turns back into NULL.
        let keys: Vec<&str> = deliveries
            .iter()
            .map(|(_, key)| key.as_deref().unwrap_or(""))
            .collect();
        PreparedPg::new(
            INSERT_DELIVERIES,
            &[
                PgBind::TextArray(&subscriptions),
                PgBind::TextArray(&keys),
                PgBind::BigInt(id),
            ],
        )
        .execute(self)
        .map(drop)
    }
}

impl Dialect for PgConnection {
    /// A destination recorded as healthy unless it is known. Binds: name, kind.
    const ADD_DESTINATION: &'static str = "INSERT INTO outbox_destination (name, kind, state) \
         VALUES ($1, $2, 'healthy') ON CONFLICT (name) DO NOTHING";

    /// The backlog for the worker's gauges: messages in the outbox, and the microseconds the oldest
    /// due, unheld message has waited (NULL: none waits; a message whose lease runs is not due, and
    /// one whose lease ran out counts from its due time, which a claim does not move). The second is
    /// the first entry of the due index, past the messages whose leases run.
    const BACKLOG: &'static str = "SELECT (SELECT COUNT(*) FROM outbox_message) AS pending, \
         (EXTRACT(EPOCH FROM now() - d.due) * 1000000)::BIGINT AS oldest_due_micros, \
         (EXTRACT(EPOCH FROM d.due) * 1000000)::BIGINT AS oldest_due_at \
         FROM (SELECT MIN(next_attempt_at) AS due FROM outbox_message \
               WHERE NOT parked AND next_attempt_at <= now() \
                   AND (leased_until IS NULL OR leased_until <= now())) d";

    /// Heads of ordering keys that failed and wait for a retry, holding up the messages behind
    /// them, soonest retry first; with how many wait behind each (one probe of the ordering index
    /// per key). Binds: limit.
    const BLOCKED_KEYS: &'static str = "SELECT h.ordering_key, h.id, \
             h.message_id::text AS message_id, h.message_type, h.attempts, h.last_error, \
             (EXTRACT(EPOCH FROM GREATEST(h.next_attempt_at, h.leased_until)) * 1000000)::BIGINT \
                 AS next_attempt_at, \
             (SELECT COUNT(*) FROM outbox_message w \
              WHERE w.ordering_key = h.ordering_key AND w.id > h.id) AS waiting \
         FROM outbox_message h \
         WHERE NOT h.parked AND h.ordering_key IS NOT NULL AND h.last_error IS NOT NULL \
         ORDER BY GREATEST(h.next_attempt_at, h.leased_until), h.id LIMIT $1";

    /// A dead letter by its message id (indexed). Binds: characters of its payload to read, id.
    const DEAD_BY_MESSAGE_ID: &'static str =
        concat!(dead_letter_columns!(), "WHERE message_id = $2::uuid");

    /// The positions of the dead letters of a type (NULL: every one), without their payloads.
    /// Binds: type.
    const DEAD_POSITIONS: &'static str = "SELECT id FROM outbox_failure \
         WHERE message_type = COALESCE($1::text, message_type) ORDER BY id";

    /// Every destination, by name.
    const DESTINATIONS: &'static str =
        "SELECT name, kind, state, consecutive_failures, last_error, \
             (EXTRACT(EPOCH FROM next_probe_at) * 1000000)::BIGINT AS next_probe_at, \
             disabled_reason, \
             (EXTRACT(EPOCH FROM reported_at) * 1000000)::BIGINT AS reported_at \
         FROM outbox_destination ORDER BY name";

    /// An operator's disable, which the workers adopt. Binds: reason, name.
    const DISABLE_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET state = 'disabled', next_probe_at = NULL, disabled_reason = $1 WHERE name = $2";

    /// An operator's enable: healthy again, and one more enable for the workers to follow. Binds:
    /// name.
    const ENABLE_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET state = 'healthy', consecutive_failures = 0, last_error = NULL, next_probe_at = NULL, \
             disabled_reason = NULL, enables = enables + 1 \
         WHERE name = $1";

    /// Keys settled longer ago than the window deleted, at most a batch. Binds: window µs, limit.
    const EXPIRE_KEYS: &'static str = "DELETE FROM outbox_idempotency WHERE idempotency_key IN (\
         SELECT idempotency_key FROM outbox_idempotency \
         WHERE settled_at <= now() - $1 * INTERVAL '1 microsecond' LIMIT $2)";

    /// Revoked admin sessions that have expired anyway, forgotten. Binds: now (Unix seconds).
    const FORGET_REVOKED: &'static str = "DELETE FROM outbox_admin_revoked WHERE expires_at < $1";

    /// A received webhook id recorded unless recorded. Binds: id.
    const INBOX_RECORD: &'static str =
        "INSERT INTO outbox_inbox (webhook_id) VALUES ($1) ON CONFLICT DO NOTHING";

    /// Inbox ids older than some age deleted, a batch at a time. Binds: age µs, limit.
    const INBOX_SWEEP: &'static str = "DELETE FROM outbox_inbox WHERE webhook_id IN (\
         SELECT webhook_id FROM outbox_inbox \
         WHERE received_at < now() - $1 * INTERVAL '1 microsecond' LIMIT $2)";

    /// The message an idempotency key was recorded for: READ COMMITTED takes a new snapshot per
    /// statement, so the row the reservation waited for is seen (REPEATABLE READ and SERIALIZABLE
    /// fail the reservation with a serialization error instead). Binds: key.
    const KEYED_MESSAGE: &'static str = "SELECT message_id::text AS message_id \
         FROM outbox_idempotency WHERE idempotency_key = $1";

    /// A destination as the store keeps it, locked until the transaction ends. Binds: name.
    const LOCK_DESTINATION: &'static str = "SELECT name, state, disabled_reason, enables \
         FROM outbox_destination WHERE name = $1 FOR UPDATE";

    /// A destination's turns under a rate limit across processes, with the database's clock in
    /// µs, locked until the transaction ends. Binds: name.
    const LOCK_TURNS: &'static str = concat!(
        "SELECT turn_tokens, turns_refilled, turns_booked_until, last_turn, ",
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT",
        " AS now FROM outbox_destination WHERE name = $1 FOR UPDATE"
    );

    /// An operator's pause, unless that one is paused already. Binds: kind, name, reason.
    const PAUSE: &'static str = "INSERT INTO outbox_pause (kind, name, reason) \
         VALUES ($1, $2, $3) ON CONFLICT (kind, name) DO NOTHING";

    /// Every pause, by kind and name.
    const PAUSES: &'static str = "SELECT kind, name, reason, \
             (EXTRACT(EPOCH FROM paused_at) * 1000000)::BIGINT AS paused_at \
         FROM outbox_pause ORDER BY kind, name";

    /// One message found paused by its worker: given back without counting the attempt, marked
    /// paused, and due too far ahead for any claim until a resume releases it. Binds: delay µs,
    /// reason, id, token.
    const PAUSE_MESSAGE: &'static str = "UPDATE outbox_message \
         SET locked_by = NULL, leased_until = NULL, paused = TRUE, next_attempt_at = now() + $1 * INTERVAL '1 microsecond', \
             last_error = $2, attempts = attempts - 1 \
         WHERE id = $3 AND locked_by = $4::uuid";

    /// A pending message by its message id: the outbox table has no index on it (every enqueue
    /// would pay for one), so this reads the table, as only an operator's lookup does. Binds:
    /// characters of its payload to read, id.
    const PENDING_BY_MESSAGE_ID: &'static str =
        concat!(pending_columns!(), "WHERE message_id = $2::uuid");

    /// Dead letters that failed longer ago than some age deleted, oldest first, a batch at a time
    /// (the `failed_at` index bounds the read). Binds: age µs, limit.
    const PRUNE_DEAD_LETTERS: &'static str = "DELETE FROM outbox_failure WHERE id IN (\
         SELECT id FROM outbox_failure \
         WHERE failed_at < now() - $1 * INTERVAL '1 microsecond' ORDER BY failed_at LIMIT $2)";

    /// Every paused message whose type is not paused (any more) due at once, from the paused rows'
    /// own index.
    const RELEASE_PAUSED: &'static str = "UPDATE outbox_message \
         SET paused = FALSE, next_attempt_at = now(), resumed_at = now() \
         WHERE paused AND locked_by IS NULL \
           AND message_type NOT IN (SELECT name FROM outbox_pause WHERE kind = 'type')";

    /// A worker's report of a destination's health. Binds: kind, state, consecutive failures,
    /// last error, µs until the next probe (NULL: none), why it is disabled, name.
    const REPORT_DESTINATION: &'static str = "UPDATE outbox_destination \
         SET kind = $1, state = $2, consecutive_failures = $3, last_error = $4, \
             next_probe_at = now() + $5 * INTERVAL '1 microsecond', disabled_reason = $6, \
             reported_at = now() \
         WHERE name = $7";

    /// An idempotency key recorded for a message unless recorded: an enqueue in another
    /// transaction with the same key waits on the primary key until the first one ends. Binds:
    /// key, message id.
    const RESERVE_KEY: &'static str =
        "INSERT INTO outbox_idempotency (idempotency_key, message_id) \
         VALUES ($1, $2::uuid) ON CONFLICT DO NOTHING";

    /// An operator's resume. Binds: kind, name.
    const RESUME: &'static str = "DELETE FROM outbox_pause WHERE kind = $1 AND name = $2";

    /// An admin session ended by a sign-out, until it would have expired. Binds: session id,
    /// expiry (Unix seconds).
    const REVOKE_SESSION: &'static str =
        "INSERT INTO outbox_admin_revoked (session_id, expires_at) \
         VALUES ($1, $2) ON CONFLICT DO NOTHING";

    /// Whether an admin session signed out (1) or not (0). Binds: session id.
    const SESSION_REVOKED: &'static str =
        "SELECT COUNT(*) AS found FROM outbox_admin_revoked WHERE session_id = $1";

    /// The position of the message this session inserted last, stored with its key. Binds: key.
    const SET_KEY_POSITION: &'static str = "UPDATE outbox_idempotency \
         SET message_position = currval(pg_get_serial_sequence('outbox_message', 'id')) \
         WHERE idempotency_key = $1";

    /// Keys not stamped settled, by their message's position, from a position on. Binds: after,
    /// limit.
    const UNSETTLED_KEYS: &'static str = "SELECT message_position AS id FROM outbox_idempotency \
         WHERE settled_at IS NULL AND message_position > $1 ORDER BY message_position LIMIT $2";

    /// A destination's turns written back. Binds: tokens in millionths, refilled µs, booked-until
    /// µs (NULL: nobody in line), last turn µs, name.
    const WRITE_TURNS: &'static str = "UPDATE outbox_destination \
         SET turn_tokens = $1, turns_refilled = $2, turns_booked_until = $3, \
             last_turn = $4 \
         WHERE name = $5";

    /// Dead letters, by position. Binds: characters of each payload to read, type (NULL: any), key
    /// twice (NULL: any), from position, limit.
    const DEAD_LETTERS: &'static str = concat!(
        dead_letter_columns!(),
        "WHERE message_type = COALESCE($2::text, message_type) \
         AND ($3::text IS NULL OR ordering_key = $4::text) AND id >= $5 ORDER BY id LIMIT $6"
    );

    /// Pending messages, by position: a page reads the primary key from its first position on,
    /// however deep it is (a type or attempts filter walks it until the page is full). Binds:
    /// characters of each payload to read, type (NULL: any), least attempts, due only (0/1), from
    /// position, limit.
    const PENDING: &'static str = concat!(
        pending_columns!(),
        "WHERE message_type = COALESCE($2::text, message_type) AND attempts >= $3 \
         AND ($4 = 0 OR (NOT parked AND next_attempt_at <= now() \
             AND (leased_until IS NULL OR leased_until <= now()))) \
         AND id >= $5 ORDER BY id LIMIT $6"
    );

    /// The pending messages of one ordering key, by position: the ordering index gives them in
    /// order. Binds: characters of each payload to read, key, then as [`PENDING`](Self::PENDING).
    const PENDING_BY_KEY: &'static str = concat!(
        pending_columns!(),
        "WHERE ordering_key = $2 AND message_type = COALESCE($3::text, message_type) \
         AND attempts >= $4 AND ($5 = 0 OR (NOT parked AND next_attempt_at <= now() \
             AND (leased_until IS NULL OR leased_until <= now()))) \
         AND id >= $6 ORDER BY ordering_key, id LIMIT $7"
    );

    /// One message scheduled for later with its last error. Binds: delay µs, text, attempts to
    /// take back (0 or 1), id, token.
    const RESCHEDULE: &'static str = "UPDATE outbox_message \
         SET locked_by = NULL, leased_until = NULL, \
             next_attempt_at = now() + $1 * INTERVAL '1 microsecond', \
             last_error = $2, attempts = attempts - $3 \
         WHERE id = $4 AND locked_by = $5::uuid";

    /// Dead-letter counts by type (COUNT of nothing is a BIGINT zero, as the row type wants).
    const STATS_DEAD: &'static str = "SELECT message_type, COUNT(*) AS total, \
             COUNT(CASE WHEN 1 = 0 THEN 1 END) AS in_flight, NULL::bigint AS oldest \
         FROM outbox_failure GROUP BY message_type";

    /// Pending and in-flight counts and the oldest enqueue time, by type.
    const STATS_PENDING: &'static str = "SELECT message_type, COUNT(*) AS total, \
             COUNT(CASE WHEN locked_by IS NOT NULL AND leased_until > now() THEN 1 END) \
                 AS in_flight, \
             (EXTRACT(EPOCH FROM MIN(created_at)) * 1000000)::BIGINT AS oldest \
         FROM outbox_message GROUP BY message_type";
}

impl<R: QueryableByName<Pg> + 'static> LoadFixed<R> for PgConnection {
    fn load_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<Vec<R>> {
        Prepared::new(sql, STYLE, binds).load(self)
    }
}

impl Statements for PgConnection {
    fn insert_messages(&mut self, rows: &[NewMessage]) -> QueryResult<()> {
        const BINDS: usize = NewMessage::BINDS + 1;
        for chunk in NewMessage::chunks(rows, MAX_BINDS / BINDS) {
            if let [row] = chunk {
                // The common case has one text: prepared once per connection.
                run(self, INSERT_MESSAGE, &row.binds_with_key())?;
                continue;
            }
            let values: Vec<String> = (0..chunk.len())
                .map(|i| insert_values(i * BINDS + 1))
                .collect();
            let sql = format!(
                "INSERT INTO outbox_message (message_id, message_type, payload, payload_bytes, \
                 ordering_key, next_attempt_at, headers, priority, group_name, owner, parked) \
                 VALUES {}",
                values.join(", ")
            );
            let binds: Vec<Bind<'_>> = chunk.iter().flat_map(NewMessage::binds_with_key).collect();
            dynamic::<Pg>(&sql, &binds).execute(self)?;
        }
        Ok(())
    }

    fn horizon(&mut self) -> QueryResult<HorizonRow> {
        Prepared::new(HORIZON, STYLE, &[]).get_result(self)
    }

    fn claim(&mut self, claim: &Claim<'_>, from: Cursor) -> QueryResult<Claimed> {
        let candidates = claim.candidates();
        let written_in = CLAIMS_BY_CANDIDATES
            .iter()
            .find(|(limit, _)| *limit >= candidates);
        let mut binds = vec![
            Bind::Text(claim.groups_after),
            Bind::Text(claim.groups_after),
            Bind::BigInt(from.due_micros),
            Bind::BigInt(from.id),
            Bind::BigInt(from.due_micros),
            Bind::BigInt(from.id),
        ];
        if written_in.is_none() {
            binds.push(Bind::BigInt(candidates));
        }
        binds.extend([
            Bind::BigInt(super::to_i64(claim.limit.messages)),
            Bind::BigInt(claim.bytes()),
            Bind::Bool(claim.limit.oversized_alone),
            Bind::Text(claim.token),
            Bind::BigInt(claim.lease_micros),
        ]);
        let sql = written_in.map_or(CLAIM, |(_, sql)| sql);
        let mut rows: Vec<CursoredClaimRow> = Prepared::new(sql, STYLE, &binds).load(self)?;
        // Handed to the handlers in this order: a raised priority first in its batch too
        // (RETURNING promises no order).
        rows.sort_by_key(|row| {
            (
                std::cmp::Reverse(row.claimed.priority),
                row.claimed.message.id,
            )
        });
        let first = rows.first().and_then(|row| {
            Some(Cursor {
                due_micros: row.first_due?,
                id: row.first_id?,
            })
        });
        let last_group = rows.first().and_then(|row| row.last_group.clone());
        Ok(Claimed {
            rows: rows.into_iter().map(|row| row.claimed).collect(),
            first,
            last_group,
        })
    }

    fn register_groups(&mut self, groups: &[&str]) -> QueryResult<()> {
        PreparedPg::new(REGISTER_GROUPS, &[PgBind::TextArray(groups)])
            .execute(self)
            .map(drop)
    }

    fn remove_empty_groups(&mut self) -> QueryResult<usize> {
        run(self, REMOVE_EMPTY_GROUPS, &[])
    }

    fn delete_done(&mut self, claims: &[(String, Vec<i64>)], keys: &[&str]) -> QueryResult<usize> {
        let (tokens, ids) = pairs(claims);
        let rows: Vec<CountRow> = PreparedPg::new(
            DELETE_DONE,
            &[
                PgBind::TextArray(&tokens),
                PgBind::BigIntArray(&ids),
                PgBind::TextArray(keys),
            ],
        )
        .load(self)?;
        Ok(rows
            .first()
            .map_or(0, |row| row.n.max(0).unsigned_abs() as usize))
    }

    fn delete_done_leasing(
        &mut self,
        claims: &[(String, Vec<i64>)],
        keys: &[&str],
        successors: &Successors<'_>,
    ) -> QueryResult<(usize, Vec<ClaimRow>)> {
        let (per_key, successors) = (successors.per_key(), &successors.claim);
        let (tokens, ids) = pairs(claims);
        let rows: Vec<SettledRow> = PreparedPg::new(
            DELETE_DONE_LEASING,
            &[
                PgBind::TextArray(&tokens),
                PgBind::BigIntArray(&ids),
                PgBind::TextArray(keys),
                PgBind::Text(successors.token),
                PgBind::BigInt(successors.lease_micros),
                PgBind::BigInt(successors.bytes()),
                PgBind::BigInt(per_key),
            ],
        )
        .load(self)?;
        let deleted = rows
            .first()
            .map_or(0, |row| row.deleted.max(0).unsigned_abs() as usize);
        let leased = rows.into_iter().filter_map(SettledRow::leased).collect();
        Ok((deleted, leased))
    }

    fn release(&mut self, token: &str, ids: &[i64]) -> QueryResult<usize> {
        diesel::sql_query(RELEASE)
            .bind::<Text, _>(token)
            .bind::<Array<BigInt>, _>(ids)
            .execute(self)
    }

    fn dead_letter(&mut self, token: &str, id: i64, error: &str) -> QueryResult<bool> {
        let binds = [Bind::BigInt(id), Bind::Text(token), Bind::Text(error)];
        Ok(run(self, DEAD_LETTER, &binds)? == 1)
    }

    fn promote_heads(&mut self, keys: &[&str]) -> QueryResult<()> {
        diesel::sql_query(PROMOTE_HEADS)
            .bind::<Array<Text>, _>(keys)
            .execute(self)
            .map(drop)
    }

    fn present(&mut self, ids: &[i64]) -> QueryResult<Vec<i64>> {
        let rows: Vec<IdRow> = diesel::sql_query(PRESENT)
            .bind::<Array<BigInt>, _>(ids)
            .load(self)?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    fn held_by_others(&mut self, token: &str, ids: &[i64]) -> QueryResult<Vec<i64>> {
        let rows: Vec<IdRow> = diesel::sql_query(HELD_BY_OTHERS)
            .bind::<Array<BigInt>, _>(ids)
            .bind::<Text, _>(token)
            .load(self)?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    fn extend_leases(
        &mut self,
        token: &str,
        ids: &[i64],
        lease_micros: i64,
    ) -> QueryResult<Vec<i64>> {
        let rows: Vec<IdRow> = diesel::sql_query(EXTEND_LEASES)
            .bind::<BigInt, _>(lease_micros)
            .bind::<Text, _>(token)
            .bind::<Array<BigInt>, _>(ids)
            .load(self)?;
        Ok(rows.into_iter().map(|row| row.id).collect())
    }

    fn promote_stranded(&mut self) -> QueryResult<usize> {
        run(self, PROMOTE_STRANDED, &[])
    }

    fn settle_transaction<T>(
        &mut self,
        body: impl FnOnce(&mut Self) -> QueryResult<T>,
    ) -> QueryResult<T> {
        self.transaction(|c| {
            run(c, ASYNC_COMMIT, &[])?;
            body(c)
        })
    }

    fn requeue(&mut self, selection: &Selection<'_>) -> QueryResult<Vec<i64>> {
        self.transaction(|c| {
            let rows: Vec<IdRow> = match selection {
                Selection::Positions(ids) => diesel::sql_query(SELECT_DEAD_AT_FOR_UPDATE)
                    .bind::<Array<BigInt>, _>(*ids)
                    .load(c)?,
                Selection::MessageType(t) => diesel::sql_query(SELECT_DEAD_FOR_UPDATE)
                    .bind::<Nullable<Text>, _>(Some(*t))
                    .load(c)?,
                Selection::All => diesel::sql_query(SELECT_DEAD_FOR_UPDATE)
                    .bind::<Nullable<Text>, _>(None::<&str>)
                    .load(c)?,
            };
            let ids: Vec<i64> = rows.into_iter().map(|row| row.id).collect();
            if !ids.is_empty() {
                diesel::sql_query(REQUEUE)
                    .bind::<Array<BigInt>, _>(&ids)
                    .execute(c)?;
            }
            Ok(ids)
        })
    }

    fn purge(&mut self, selection: &Selection<'_>) -> QueryResult<usize> {
        match selection {
            Selection::Positions(ids) => diesel::sql_query(PURGE_AT)
                .bind::<Array<BigInt>, _>(*ids)
                .execute(self),
            Selection::MessageType(t) => run(self, PURGE, &[Bind::NullableText(Some(t))]),
            Selection::All => run(self, PURGE, &[Bind::NullableText(None)]),
        }
    }

    fn keep_commit_durable(&mut self) -> QueryResult<()> {
        diesel::connection::SimpleConnection::batch_execute(self, DURABLE_COMMIT)
    }

    fn settle_idempotency_keys(&mut self, positions: &[i64]) -> QueryResult<usize> {
        diesel::sql_query(SETTLE_KEYS)
            .bind::<Array<BigInt>, _>(positions)
            .execute(self)
    }

    fn run_fixed(&mut self, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize> {
        run(self, sql, binds)
    }
}

impl DeliveryLogStatements for PgConnection {
    const PLACEHOLDERS: Placeholders = STYLE;

    const SELECT: &'static str = "SELECT id, message_id::text AS message_id, message_type, \
         destination, subscription_id, attempt, outcome, status, answer, error, latency_micros, \
         (EXTRACT(EPOCH FROM started_at) * 1000000)::BIGINT AS started_at FROM outbox_attempt";

    fn uuid_param(n: usize) -> String {
        format!("${n}::uuid")
    }

    fn time_param(n: usize) -> String {
        format!("(TIMESTAMPTZ 'epoch' + ${n} * INTERVAL '1 microsecond')")
    }

    fn micros_of(column: &str) -> String {
        format!("(EXTRACT(EPOCH FROM {column}) * 1000000)::BIGINT")
    }

    fn execute_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize> {
        dynamic::<Pg>(sql, binds).execute(self)
    }

    fn load_built(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<AttemptRow>> {
        dynamic::<Pg>(sql, binds).load(self)
    }

    fn last_attempt_id(&mut self) -> QueryResult<Option<i64>> {
        Prepared::new(LAST_ATTEMPT_ID, STYLE, &[])
            .get_result::<LastIdRow>(self)
            .map(|row| row.id)
    }

    const NOW: &'static str = "now()";
    const INSERT_IGNORING: (&'static str, &'static str) =
        ("INSERT INTO", " ON CONFLICT DO NOTHING");

    fn load_archived(&mut self, sql: &str, binds: &[Bind<'_>]) -> QueryResult<Vec<ArchivedRow>> {
        dynamic::<Pg>(sql, binds).load(self)
    }

    /// One statement of fixed text, kept prepared, whatever the number of rows: the columns as
    /// arrays.
    fn insert_attempts(&mut self, rows: &[LoggedRow<'_>]) -> QueryResult<()> {
        let n = rows.len();
        let (mut message_ids, mut types, mut destinations, mut subscriptions, mut outcomes) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut answers, mut errors) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut attempts, mut statuses, mut latencies, mut started) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for row in rows {
            message_ids.push(row.message_id.as_str());
            types.push(row.message_type);
            destinations.push(row.destination);
            subscriptions.push(row.subscription_id.unwrap_or(""));
            outcomes.push(row.outcome);
            answers.push(row.answer.unwrap_or(""));
            errors.push(row.error.unwrap_or(""));
            attempts.push(row.attempt);
            statuses.push(row.status.unwrap_or(-1));
            latencies.push(row.latency_micros);
            started.push(row.started_micros);
        }
        PreparedPg::new(
            INSERT_ATTEMPTS,
            &[
                PgBind::TextArray(&message_ids),
                PgBind::TextArray(&types),
                PgBind::TextArray(&destinations),
                PgBind::TextArray(&subscriptions),
                PgBind::BigIntArray(&attempts),
                PgBind::TextArray(&outcomes),
                PgBind::BigIntArray(&statuses),
                PgBind::TextArray(&answers),
                PgBind::TextArray(&errors),
                PgBind::BigIntArray(&latencies),
                PgBind::BigIntArray(&started),
            ],
        )
        .execute(self)
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use diesel::debug_query;

    use super::super::bind::{pieces, Placeholders};
    use super::*;

    /// Every fixed statement numbers its placeholders 1, 2, … in order, each once: how
    /// `Prepared` binds them.
    #[test]
    fn placeholders_are_numbered_in_order() {
        for sql in [
            INSERT_MESSAGE,
            CANCELLABLE,
            CANCEL_IN_FLIGHT,
            MOVE_TO_CANCELLED,
            CLAIM,
            REGISTER_GROUPS,
            REMOVE_EMPTY_GROUPS,
            DELETE_DONE,
            DELETE_DONE_LEASING,
            RELEASE,
            <PgConnection as Dialect>::RESCHEDULE,
            DEAD_LETTER,
            PROMOTE_HEADS,
            PRESENT,
            HELD_BY_OTHERS,
            EXTEND_LEASES,
            PROMOTE_STRANDED,
            <PgConnection as Dialect>::PENDING,
            <PgConnection as Dialect>::PENDING_BY_KEY,
            <PgConnection as Dialect>::DEAD_LETTERS,
            REQUEUE,
            PURGE,
            <PgConnection as Dialect>::INBOX_RECORD,
            <PgConnection as Dialect>::REVOKE_SESSION,
            <PgConnection as Dialect>::SESSION_REVOKED,
            <PgConnection as Dialect>::FORGET_REVOKED,
            <PgConnection as Dialect>::INBOX_SWEEP,
            <PgConnection as Dialect>::PRUNE_DEAD_LETTERS,
            <PgConnection as Dialect>::BACKLOG,
            HORIZON,
            <PgConnection as Dialect>::PENDING_BY_MESSAGE_ID,
            <PgConnection as Dialect>::DEAD_BY_MESSAGE_ID,
            <PgConnection as Dialect>::DEAD_POSITIONS,
            <PgConnection as Dialect>::BLOCKED_KEYS,
            <PgConnection as Dialect>::RESERVE_KEY,
            <PgConnection as Dialect>::KEYED_MESSAGE,
            <PgConnection as Dialect>::SET_KEY_POSITION,
            <PgConnection as Dialect>::UNSETTLED_KEYS,
            SETTLE_KEYS,
            <PgConnection as Dialect>::EXPIRE_KEYS,
            <PgConnection as Dialect>::ADD_DESTINATION,
            <PgConnection as Dialect>::LOCK_DESTINATION,
            <PgConnection as Dialect>::LOCK_TURNS,
            <PgConnection as Dialect>::WRITE_TURNS,
            <PgConnection as Dialect>::REPORT_DESTINATION,
            <PgConnection as Dialect>::DESTINATIONS,
            <PgConnection as Dialect>::ENABLE_DESTINATION,
            <PgConnection as Dialect>::DISABLE_DESTINATION,
            <PgConnection as Dialect>::PAUSE_MESSAGE,
            <PgConnection as Dialect>::RELEASE_PAUSED,
            <PgConnection as Dialect>::PAUSE,
            <PgConnection as Dialect>::RESUME,
            <PgConnection as Dialect>::PAUSES,
        ] {
            let mut expected = 1;
            let mut rest = sql;
            while let Some(at) = rest.find('$') {
                let digits: String = rest[at + 1..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                let n: usize = digits.parse().unwrap();
                assert_eq!(n, expected, "${n} out of order in {sql}");
                expected += 1;
                rest = &rest[at + 1..];
            }
            assert_eq!(pieces(sql, Placeholders::Numbered).len(), expected);
        }
    }

    /// The settlement that leases a key's next message decides on the row as the UPDATE finds
    /// it (PostgreSQL re-checks it after waiting for a concurrent claim's lock), never on what
    /// an earlier part of the statement read; it removes only rows its claim still holds, and
    /// always answers one row.
    #[test]
    fn a_settlement_leases_successors_judged_on_the_row_it_updates() {
        let sql = DELETE_DONE_LEASING;
        let update = &sql[sql.find("UPDATE outbox_message o").unwrap()..];
        assert_eq!(
            update.matches("(o.next_attempt_at <= now() AND ").count(),
            4,
            "{sql}"
        );
        assert!(!sql[..sql.find("moved AS").unwrap()].contains("next_attempt_at"));
        assert!(
            sql.starts_with(
                "WITH done AS (SELECT * FROM unnest($1::text[], $2::bigint[]) AS t(token, id))"
            ) && sql.contains(
                "WHERE o.id = ANY(ARRAY(SELECT id FROM done)) AND o.id = t.id \
                     AND o.locked_by = t.token::uuid RETURNING o.id"
            ),
            "every claim's done messages in one statement, looked up by id: {sql}"
        );
        assert!(
            sql.contains("<= s.largest)")
                && sql.contains("FROM successor s WHERE")
                && sql.contains("LIMIT ($7::bigint - 1)")
                && !sql.contains("$8"),
            "{sql}"
        );
        // The rest of a chain: only behind a head this statement leased, and each row judged
        // again as the UPDATE finds it (parked, its lease free).
        assert!(
            sql.contains("WHERE h.leased AND c.ready AND c.bytes <= s.largest")
                && sql.contains(
                    "WHERE o.id = ANY(ARRAY(SELECT id FROM chain)) AND o.parked \
                     AND (o.leased_until IS NULL OR o.leased_until <= now())"
                ),
            "{sql}"
        );
        assert!(sql.ends_with("FROM (SELECT 1) AS one LEFT JOIN leased m ON TRUE"));
    }

    #[test]
    fn the_claim_binds_everything_and_reads_only_unparked_due_rows() {
        let claim = Claim {
            token: "0192f0c4-8d2e-7c4a-9b1e-3f5d6a7b8c9d",
            limit: outbox_core::store::ClaimLimit {
                messages: 64,
                bytes: 1 << 20,
                oversized_alone: true,
            },
            lease_micros: 60_000_000,
            groups_after: "tenant-7",
        };
        let binds = [
            Bind::Text(claim.groups_after),
            Bind::Text(claim.groups_after),
            Bind::BigInt(1_700_000_000_000_000),
            Bind::BigInt(42),
            Bind::BigInt(1_700_000_000_000_000),
            Bind::BigInt(42),
            Bind::BigInt(claim.candidates()),
            Bind::BigInt(64),
            Bind::BigInt(claim.bytes()),
            Bind::Bool(true),
            Bind::Text(claim.token),
            Bind::BigInt(claim.lease_micros),
        ];
        let shown = debug_query::<Pg, _>(&Prepared::new(CLAIM, STYLE, &binds)).to_string();
        assert!(
            shown.contains(
                "WHERE priority > 0 AND NOT parked AND next_attempt_at <= now() \
                 AND (leased_until IS NULL OR leased_until <= now()) \
                 ORDER BY priority DESC, next_attempt_at, id LIMIT 1024 FOR UPDATE SKIP LOCKED"
            ),
            "the raised priorities, by their partial index: {shown}"
        );
        assert!(
            shown.contains(
                "WHERE priority <= 0 AND NOT parked AND next_attempt_at <= now() \
                 AND (leased_until IS NULL OR leased_until <= now())"
            ),
            "a leased message is skipped, found on the heap: {shown}"
        );
        assert!(
            shown.contains(
                "SET locked_by = $11::uuid, attempts = o.attempts + 1, \
                 leased_until = now() + $12 * INTERVAL '1 microsecond'"
            ) && !shown[shown.rfind("UPDATE outbox_message o").unwrap()..]
                .contains("next_attempt_at ="),
            "the lease rewrites no indexed column, so the update can be HOT: {shown}"
        );
        assert!(
            shown.contains("WHERE priority <= 0 AND NOT parked AND next_attempt_at <= now()"),
            "{shown}"
        );
        assert!(
            shown.contains(
                "AND (next_attempt_at, id) >= (TIMESTAMPTZ 'epoch' + $5 * INTERVAL '1 microsecond', $6)"
            ),
            "the scan starts at the cursor: {shown}"
        );
        assert!(
            shown.contains(
                "WHERE group_name = g.name AND priority <= 0 AND NOT parked \
                 AND next_attempt_at <= now() AND (leased_until IS NULL OR leased_until <= now()) \
                 AND (next_attempt_at, id) >= \
                 (TIMESTAMPTZ 'epoch' + $3 * INTERVAL '1 microsecond', $4) \
                 ORDER BY next_attempt_at, id LIMIT 128 FOR UPDATE SKIP LOCKED"
            ),
            "each group's share starts at the cursor too: {shown}"
        );
        assert!(shown.contains("LIMIT $7 FOR UPDATE SKIP LOCKED"), "{shown}");
        assert!(shown.contains("SET locked_by = $11::uuid"), "{shown}");
        assert!(
            shown.ends_with(
                "-- binds: [\"tenant-7\", \"tenant-7\", 1700000000000000, 42, 1700000000000000, 42, 64, 64, 1048576, true, \"0192f0c4-8d2e-7c4a-9b1e-3f5d6a7b8c9d\", 60000000]"
            ),
            "{shown}"
        );
        assert!(
            !shown.contains("'0192f0c4"),
            "the token is bound, not inlined"
        );
    }

    #[test]
    fn a_batch_insert_numbers_thirteen_binds_per_row() {
        assert_eq!(
            insert_values(14),
            "($14::uuid, $15, $16::jsonb, $17, $18, \
             GREATEST(COALESCE(TIMESTAMPTZ 'epoch' + $19 * INTERVAL '1 microsecond', \
                 now() + COALESCE($20, 0) * INTERVAL '1 microsecond'), now()), $21, $22, $23, \
             $24, $25 OR EXISTS (SELECT 1 FROM outbox_message e WHERE e.ordering_key = $26))"
        );
    }
}
