//! Where a store's claims start reading the due index.
//!
//! Every claimed or settled message leaves a dead entry where it was due in the due index,
//! until vacuum (PostgreSQL) or purge (InnoDB) removes it; a transaction held open anywhere in
//! the database (a report, a `pg_dump`, a session left idle in a transaction) keeps them from
//! removing any, and keeps index scans from marking them dead for the next scan. A claim that
//! reads the index from its start walks every one of those entries before the first live
//! message, so its cost grows with the length of the open transaction until the worker falls
//! behind. Claims here read from a cursor instead: where the last claim found its first
//! candidate. Claims stay cheap however many dead entries lie in front.
//!
//! A message can become due behind the cursor: its transaction's clock (its due time) is
//! earlier than its commit, and a claim may pass that place in between. What finds it:
//! - on PostgreSQL, the notification its commit sends: it carries the transaction's clock, and
//!   the listener steps the cursor back to it ([`ClaimCursor::rewind`]);
//! - without a listener (MySQL, or PostgreSQL before the worker listens), claims read from
//!   [`COMMIT_ALLOWANCE`] behind the cursor, which finds a message whose transaction committed
//!   within it at once;
//! - on both, the backlog sample (the housekeeper's, on its own connection, every
//!   `backlog_interval`: 15 s by default) reads the oldest due message and steps the cursor back
//!   to it if the cursor passed it. It finds the rest (a transaction slower than the allowance
//!   on MySQL, a notification lost with its connection, a row edited by hand), walking the dead
//!   entries off the claims' path;
//! - a claim reads from the start once per [`SWEEP`], for a store used without a worker.
//!
//! Claims do not read from the start more often: under a held transaction such a claim walks
//! every dead entry (on InnoDB with a lookup of the clustered row for each), and the deliveries
//! behind it wait for it. Measured: one such claim a second made MariaDB's claims 3.5 times as
//! slow within two minutes of a held snapshot, until the worker fell behind.
//!
//! A settlement makes messages due at its transaction's clock too (a key's next message
//! promoted, a message given back, a retry or a deferral due before the settlement commits),
//! and claims may pass that time before it commits. The store notes where the cursor stood when
//! such a settlement began, which is no later than the settlement's clock, and steps the cursor
//! back there once it ends ([`ClaimCursor::position`], then [`ClaimCursor::rewind`]): a claim
//! that ran meanwhile, or runs across the end, cannot leave the cursor past what the settlement
//! made due. A retry due after its settlement committed needs none of this: the cursor never
//! passes a time before claims reach it. A lease running out is the same on MySQL and SQLite, where the lease is
//! the due time. On PostgreSQL the lease is a column of its own (so that leasing rewrites no
//! index entry) and a leased message keeps its place in the due index, which the cursor passes:
//! a crashed worker's messages are found by the first backlog sample after their lease runs
//! out (within `backlog_interval`), or at once by a worker that starts after it ran out, whose
//! first claim reads from the start.
//!
//! SQLite deletes index entries at once (a long reader costs WAL size, not claims) and reads
//! from the start.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::sql::{micros, Cursor};

/// How far behind the cursor a claim starts reading when no listener rewinds it: a message
/// whose transaction committed within this of its clock is found at once.
pub(crate) const COMMIT_ALLOWANCE: Duration = Duration::from_secs(1);

/// How far behind the cursor a claim starts reading while a listener rewinds it: the rewinds
/// are exact, and this covers a time's rounding.
const ROUNDING_ALLOWANCE: Duration = Duration::from_micros(1);

/// How often a claim reads from the start (the backlog samples step the cursor back far more
/// often).
pub(crate) const SWEEP: Duration = Duration::from_secs(600);

/// A store's claim cursor, shared with its notification listener.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClaimCursor(Arc<Mutex<State>>);

#[derive(Debug)]
struct State {
    at: Cursor,
    last_sweep: Option<Instant>,
    /// The lowest place a rewind stepped back to since the running claim read the cursor: that
    /// claim's result must not move the cursor past it.
    rewound: Option<Cursor>,
    listeners: usize,
}

impl Default for State {
    fn default() -> Self {
        State {
            at: Cursor::START,
            last_sweep: None,
            rewound: None,
            listeners: 0,
        }
    }
}

impl ClaimCursor {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state whole: a panic elsewhere while it was locked left
        // nothing half-done.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Where the next claim reads from: the start when a sweep is due, else the cursor.
    pub(crate) fn start(&self, now: Instant) -> Cursor {
        let mut state = self.state();
        state.rewound = None;
        if state
            .last_sweep
            .is_none_or(|at| now.saturating_duration_since(at) >= SWEEP)
        {
            state.last_sweep = Some(now);
            return Cursor::START;
        }
        let allowance = if state.listeners > 0 {
            ROUNDING_ALLOWANCE
        } else {
            COMMIT_ALLOWANCE
        };
        Cursor {
            due_micros: state.at.due_micros.saturating_sub(micros(allowance)),
            id: 0,
        }
    }

    /// Moves the cursor to where a claim found its first candidate, but not past a rewind that
    /// came while the claim ran.
    pub(crate) fn advance(&self, first: Cursor) {
        let mut state = self.state();
        state.at = state.rewound.map_or(first, |rewound| rewound.min(first));
    }

    /// Where the cursor stands, µs since the epoch: never later than the database's clock, since
    /// claims only find messages already due. A settlement that makes messages due at its clock
    /// reads it before it begins and [`rewind`](Self::rewind)s to it after.
    pub(crate) fn position(&self) -> i64 {
        self.state().at.due_micros
    }

    /// Steps the cursor back to `due_micros` (µs since the epoch), where a message may be due
    /// that claims passed.
    pub(crate) fn rewind(&self, due_micros: i64) {
        let to = Cursor { due_micros, id: 0 };
        let mut state = self.state();
        state.at = state.at.min(to);
        state.rewound = Some(state.rewound.map_or(to, |rewound| rewound.min(to)));
    }

    /// Marks a listener rewinding the cursor until the guard drops.
    pub(crate) fn listening(&self) -> Listening {
        self.state().listeners += 1;
        Listening(self.clone())
    }
}

/// A listener's mark on its store's cursor: claims read from it exactly while one is held.
#[derive(Debug)]
pub(crate) struct Listening(ClaimCursor);

impl Listening {
    /// The cursor the listener rewinds.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn cursor(&self) -> &ClaimCursor {
        &self.0
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.listeners = state.listeners.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000;

    fn at(seconds: i64) -> Cursor {
        Cursor {
            due_micros: seconds * SECOND,
            id: 7,
        }
    }

    /// Where a claim reads from, `allowance` behind `seconds`.
    fn behind(seconds: i64, allowance: Duration) -> Cursor {
        Cursor {
            due_micros: seconds * SECOND - micros(allowance),
            id: 0,
        }
    }

    #[test]
    fn the_first_claim_reads_from_the_start_then_a_second_behind_the_cursor_until_a_sweep() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        assert_eq!(cursor.start(t0), Cursor::START);
        cursor.advance(at(1_000));
        assert_eq!(
            cursor.start(t0 + Duration::from_secs(1)),
            behind(1_000, COMMIT_ALLOWANCE)
        );
        assert_eq!(cursor.start(t0 + SWEEP), Cursor::START);
    }

    #[test]
    fn a_listener_narrows_the_allowance_while_it_lives() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.advance(at(1_000));
        let listening = cursor.listening();
        assert_eq!(cursor.start(t0), behind(1_000, ROUNDING_ALLOWANCE));
        drop(listening);
        assert_eq!(cursor.start(t0), behind(1_000, COMMIT_ALLOWANCE));
    }

    #[test]
    fn a_rewind_during_a_claim_is_not_undone_by_its_result() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.advance(at(5));
        assert_eq!(cursor.start(t0), behind(5, COMMIT_ALLOWANCE));
        cursor.rewind(3 * SECOND);
        // The running claim read from 4 s and found its first candidate at 6 s.
        cursor.advance(at(6));
        assert_eq!(cursor.start(t0), behind(3, COMMIT_ALLOWANCE));
        // A later claim's result moves on again.
        cursor.advance(at(6));
        assert_eq!(cursor.start(t0), behind(6, COMMIT_ALLOWANCE));
    }

    #[test]
    fn a_settlement_steps_back_past_claims_that_ran_while_it_did() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.advance(at(5));
        let before = cursor.position();
        // A claim finishes during the settlement, another starts during it and ends after.
        cursor.start(t0);
        cursor.advance(at(8));
        cursor.start(t0);
        cursor.rewind(before);
        cursor.advance(at(9));
        assert_eq!(cursor.start(t0), behind(5, COMMIT_ALLOWANCE));
    }

    #[test]
    fn a_rewind_to_a_later_time_keeps_the_cursor() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        cursor.start(t0);
        cursor.advance(at(5));
        cursor.rewind(9 * SECOND);
        assert_eq!(cursor.start(t0), behind(5, COMMIT_ALLOWANCE));
    }
}
