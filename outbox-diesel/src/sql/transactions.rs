//! What runs several statements in one transaction, the same on every backend: a settlement
//! (with the delivery log and the archive), a turn of a shared rate limit, a sync of the
//! destinations' health.

use std::collections::BTreeMap;

use diesel::QueryResult;
use outbox_core::store::{
    DestinationReport, Outcome, Settlement, StoredDestination, SyncedDestination, Turns,
};

use super::delivery_log::{self, DeliveryLog, DeliveryLogStatements};
use super::rows::*;
use super::statements::*;

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
    successors: Option<&Successors<'_>>,
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
    successors: Option<&Successors<'_>>,
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
pub(crate) fn leaving_keys(outcomes: &[Outcome]) -> Vec<&str> {
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
pub(crate) fn group_by_claim<'a>(
    outcomes: impl IntoIterator<Item = &'a Outcome>,
) -> Vec<(String, Vec<i64>)> {
    let mut by_claim: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for outcome in outcomes {
        by_claim
            .entry(outcome.token.to_string())
            .or_default()
            .push(outcome.position);
    }
    by_claim.into_iter().collect()
}
