//! Every statement the outbox runs, one file per backend ([`postgres`], [`mysql`],
//! [`sqlite`]), each a whole statement with a comment; what they share is in files of its own:
//! the rows they read ([`rows`]), what each statement does ([`statements::Statements`], with
//! the statements every backend runs alike given as each backend's [`statements::Dialect`]),
//! and the transactions of several statements ([`transactions`]). Ids, tokens and texts are
//! always bound, never written into the text.
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

pub(crate) mod bind;
pub(crate) mod cancel;
pub(crate) mod codec;
pub(crate) mod delivery_log;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
pub(crate) mod new_message;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod rows;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
pub(crate) mod statements;
pub(crate) mod subscription;
pub(crate) mod transactions;

// The rest of the crate names the SQL layer's parts as `sql::…`; the parts import each other,
// never this facade, which has no code of its own.
pub(crate) use rows::*;
pub(crate) use statements::*;
pub(crate) use transactions::*;

#[cfg(test)]
mod tests {
    use diesel::QueryResult;
    use outbox_core::store::{ClaimToken, Outcome, Settlement};
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
