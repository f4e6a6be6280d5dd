//! A [`Store`] in memory, with faults on demand, for testing the worker (and handlers that use
//! it) without a database: claim or settle errors, a database that is down, an outcome refused
//! forever, texts refused the way a `LATIN1` database refuses them, slow calls, and a clock the
//! test moves by hand so that leases and retries come due when it says; and the conformance
//! kits a store ([`store_kit`]) or a destination ([`destination_kit`]) of any kind runs on
//! itself.
//!
//! Behind the `testing` feature: not in the default build.
//!
//! ```
//! use std::time::Duration;
//! use outbox_core::store::{ClaimLimit, ClaimToken, Outcome, Settlement, Store};
//! use outbox_core::testing::MemoryStore;
//!
//! let store = MemoryStore::with_manual_clock();
//! let position = store.enqueue("order.placed", r#"{"id":7}"#, None);
//! let token = ClaimToken::new();
//! let claimed = store.claim(token, ClaimLimit::messages(10), Duration::from_secs(30))?;
//! assert_eq!(claimed[0].position, position);
//!
//! store.set_down(true); // the database goes away
//! let done = Outcome {
//!     token,
//!     position,
//!     message_id: claimed[0].message_id,
//!     ordering_key: None,
//!     settlement: Settlement::Done,
//!     log: None,
//! };
//! assert!(store.settle(&[done.clone()]).is_err());
//! store.set_down(false);
//! store.settle(&[done])?;
//! assert!(store.rows().is_empty());
//! # Ok::<(), outbox_core::store::StoreError>(())
//! ```

pub mod destination_kit;
pub mod store_kit;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::error::ProcessError;
use crate::message::Message;
use crate::message_id::MessageId;
use crate::priority::Priority;
use crate::store::{
    Backlog, ClaimLimit, ClaimToken, ClaimedMessage, DestinationReport, Exchange, Listener,
    Notifications, Outcome, Paused, Pauses, Pruned, SettleTarget, Settlement, SharedDestinations,
    SharedTurns, Store, StoreError, StoredDestination, Subscriptions, SuccessorLease,
    SyncedDestination, TransactionalSettlement, Turns,
};

/// A message in a [`MemoryStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRow {
    /// Its position (enqueue order).
    pub position: i64,
    /// Its id.
    pub message_id: MessageId,
    /// Its type.
    pub message_type: String,
    /// Its payload.
    pub payload: String,
    /// Its ordering key.
    pub ordering_key: Option<String>,
    /// Attempts started.
    pub attempts: u32,
    /// When it is due (while leased: the end of the lease), on the store's clock.
    pub due: Duration,
    /// The claim holding it.
    pub locked_by: Option<ClaimToken>,
    /// The last failure.
    pub last_error: Option<String>,
    /// When it was enqueued.
    pub enqueued_at: SystemTime,
    /// When an operator's pause that held it last ended.
    pub resumed_at: Option<SystemTime>,
    /// Its priority: claims take the raised ones first.
    pub priority: Priority,
}

/// A dead letter in a [`MemoryStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryDeadLetter {
    /// The message as it was.
    pub row: MemoryRow,
    /// Why it failed.
    pub error: String,
}

#[derive(Debug)]
enum Clock {
    Real(Instant),
    Manual(Duration),
}

#[derive(Debug, Default)]
struct Faults {
    down: bool,
    failing_claims: u32,
    failing_settles: u32,
    refused: HashSet<i64>,
    /// Messages whose settlements are answered "busy" (a lock held elsewhere).
    locked: HashSet<i64>,
    refuse_non_latin1: bool,
    max_connections: Option<usize>,
    delay: Duration,
}

#[derive(Debug)]
struct State {
    clock: Clock,
    system_base: SystemTime,
    rows: BTreeMap<i64, MemoryRow>,
    dead: BTreeMap<i64, MemoryDeadLetter>,
    destinations: BTreeMap<String, (StoredDestination, Option<DestinationReport>)>,
    /// The turns of rate limits across processes, by destination.
    turns: BTreeMap<String, Turns>,
    /// What an operator paused, and the rows settled as paused.
    paused: Paused,
    paused_rows: BTreeSet<i64>,
    next_position: i64,
    faults: Faults,
    calls: u64,
    /// The delivery log: the exchanges of every settlement saved, fenced outcomes' too (as a
    /// database store writes them in the settlement's transaction).
    logged: Vec<Exchange>,
}

/// Makes due the rows settled as paused whose type is not paused; how many.
fn release_paused(state: &mut State) -> usize {
    let now = state.now();
    let resumed_at = state.system_now();
    let positions: Vec<i64> = state.paused_rows.iter().copied().collect();
    let mut released = 0;
    for position in positions {
        let Some(row) = state.rows.get_mut(&position) else {
            state.paused_rows.remove(&position);
            continue;
        };
        if state.paused.message_types.contains_key(&row.message_type) {
            continue;
        }
        row.due = now;
        row.resumed_at = Some(resumed_at);
        state.paused_rows.remove(&position);
        released += 1;
    }
    released
}

/// The store in memory; clones share it. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

fn failure(context: &'static str, why: &str) -> StoreError {
    StoreError::new(context, why.to_owned())
}

impl MemoryStore {
    fn with_clock(clock: Clock) -> Self {
        MemoryStore {
            state: Arc::new(Mutex::new(State {
                clock,
                system_base: SystemTime::now(),
                rows: BTreeMap::new(),
                dead: BTreeMap::new(),
                destinations: BTreeMap::new(),
                turns: BTreeMap::new(),
                paused: Paused::default(),
                paused_rows: BTreeSet::new(),
                next_position: 1,
                faults: Faults::default(),
                calls: 0,
                logged: Vec::new(),
            })),
        }
    }

    /// A store whose clock is the real one (for a real worker's threads).
    pub fn new() -> Self {
        Self::with_clock(Clock::Real(Instant::now()))
    }

    /// A store whose clock moves only by [`advance`](MemoryStore::advance).
    pub fn with_manual_clock() -> Self {
        Self::with_clock(Clock::Manual(Duration::ZERO))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store's time: since its creation.
    pub fn now(&self) -> Duration {
        self.state().now()
    }

    /// The wall-clock time on the store's clock (what it stamps enqueues with).
    pub fn system_now(&self) -> SystemTime {
        self.state().system_now()
    }

    /// Moves a manual clock forward (a real one ignores it).
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(now) = &mut self.state().clock {
            *now = now.saturating_add(by);
        }
    }

    /// Enqueues a message; its position.
    pub fn enqueue(&self, message_type: &str, payload: &str, ordering_key: Option<&str>) -> i64 {
        self.enqueue_with_priority(message_type, payload, ordering_key, Priority::Normal)
    }

    /// Enqueues a message of `priority`; its position.
    pub fn enqueue_with_priority(
        &self,
        message_type: &str,
        payload: &str,
        ordering_key: Option<&str>,
        priority: Priority,
    ) -> i64 {
        let mut state = self.state();
        let position = state.next_position;
        state.next_position += 1;
        let due = state.now();
        let enqueued_at = state.system_now();
        state.rows.insert(
            position,
            MemoryRow {
                position,
                message_id: MessageId::new(),
                message_type: message_type.to_owned(),
                payload: payload.to_owned(),
                ordering_key: ordering_key.map(str::to_owned),
                attempts: 0,
                due,
                locked_by: None,
                last_error: None,
                enqueued_at,
                resumed_at: None,
                priority,
            },
        );
        position
    }

    /// Enqueues `message` as its JSON; its position.
    pub fn enqueue_message<M: Message>(&self, message: &M, ordering_key: Option<&str>) -> i64 {
        let payload = serde_json::to_string(message).unwrap_or_else(|_| "null".to_owned());
        self.enqueue(M::MESSAGE_TYPE, &payload, ordering_key)
    }

    /// The messages in the store, by position.
    pub fn rows(&self) -> Vec<MemoryRow> {
        self.state().rows.values().cloned().collect()
    }

    /// The dead letters, by position.
    pub fn dead_letters(&self) -> Vec<MemoryDeadLetter> {
        self.state().dead.values().cloned().collect()
    }

    /// The delivery log's exchanges saved so far, in order.
    pub fn logged(&self) -> Vec<Exchange> {
        self.state().logged.clone()
    }

    /// Store calls so far.
    pub fn calls(&self) -> u64 {
        self.state().calls
    }

    /// Every call fails, [`ping`](Store::ping) included, until set back.
    pub fn set_down(&self, down: bool) {
        self.state().faults.down = down;
    }

    /// The next `n` claims fail.
    pub fn fail_claims(&self, n: u32) {
        self.state().faults.failing_claims = n;
    }

    /// The next `n` settlements fail (as a whole; the database answers pings).
    pub fn fail_settles(&self, n: u32) {
        self.state().faults.failing_settles = n;
    }

    /// Every settlement that holds this message's outcome is refused, forever (until
    /// [`accept`](MemoryStore::accept)).
    pub fn refuse_outcomes_of(&self, position: i64) {
        self.state().faults.refused.insert(position);
    }

    /// Takes the outcomes of `position` again.
    pub fn accept(&self, position: i64) {
        self.state().faults.refused.remove(&position);
    }

    /// Every settlement that holds this message's outcome is answered "busy"
    /// ([`StoreErrorKind::Busy`](crate::store::StoreErrorKind::Busy)), as when a lock held
    /// elsewhere outlasts the database's lock timeout, until [`unlock`](MemoryStore::unlock).
    pub fn lock(&self, position: i64) {
        self.state().faults.locked.insert(position);
    }

    /// Releases [`lock`](MemoryStore::lock).
    pub fn unlock(&self, position: i64) {
        self.state().faults.locked.remove(&position);
    }

    /// Refuses texts with characters outside Latin-1, as a `LATIN1` PostgreSQL database does.
    pub fn refuse_non_latin1(&self, on: bool) {
        self.state().faults.refuse_non_latin1 = on;
    }

    /// Only this many connections can be lent ([`check`](Store::check) fails beyond).
    pub fn set_max_connections(&self, max: Option<usize>) {
        self.state().faults.max_connections = max;
    }

    /// What an operator paused, as [`Pauses::paused`] reports it from now on. Resuming (pausing
    /// less) also makes due the paused messages that may run now, as the database stores' resume
    /// does.
    pub fn set_paused(&self, paused: Paused) {
        let mut state = self.state();
        state.paused = paused;
        release_paused(&mut state);
    }

    /// Every call takes this long (real time).
    pub fn set_delay(&self, delay: Duration) {
        self.state().faults.delay = delay;
    }

    /// Enters a call: counts it, applies the delay, fails when down.
    fn call(&self, context: &'static str) -> Result<MutexGuard<'_, State>, StoreError> {
        let delay = {
            let mut state = self.state();
            state.calls += 1;
            state.faults.delay
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let state = self.state();
        if state.faults.down {
            return Err(failure(context, "the store is down"));
        }
        Ok(state)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    fn now(&self) -> Duration {
        match self.clock {
            Clock::Real(start) => start.elapsed(),
            Clock::Manual(now) => now,
        }
    }

    fn system_now(&self) -> SystemTime {
        self.system_base + self.now()
    }

    /// Leases the row at `position` under `token` until `lease_end`, an attempt more.
    fn lease(
        &mut self,
        position: i64,
        token: ClaimToken,
        lease_end: Duration,
    ) -> Option<ClaimedMessage> {
        let row = self.rows.get_mut(&position)?;
        row.locked_by = Some(token);
        row.attempts += 1;
        row.due = lease_end;
        Some(ClaimedMessage {
            position,
            message_id: row.message_id,
            message_type: row.message_type.clone(),
            payload: row.payload.clone(),
            ordering_key: row.ordering_key.clone(),
            attempt: row.attempts,
            enqueued_at: row.enqueued_at,
            resumed_at: row.resumed_at,
            headers: Default::default(),
            subscription_id: None,
            priority: row.priority,
        })
    }

    /// Whether `row` is the first pending message of its key.
    fn heads_its_key(&self, row: &MemoryRow) -> bool {
        let Some(key) = &row.ordering_key else {
            return true;
        };
        !self
            .rows
            .range(..row.position)
            .any(|(_, earlier)| earlier.ordering_key.as_ref() == Some(key))
    }

    fn refuses(&self, outcome: &Outcome) -> bool {
        let beyond_latin1 = |text: &str| text.chars().any(|c| u32::from(c) > 0xFF);
        let logged = outcome
            .log
            .iter()
            .flat_map(|log| log.exchanges.iter())
            .flat_map(|exchange| {
                let answer = exchange.answer.as_ref().map(|answer| answer.text());
                answer.into_iter().chain(exchange.error.as_deref())
            });
        self.faults.refused.contains(&outcome.position)
            || (self.faults.refuse_non_latin1
                && (outcome.settlement.text().is_some_and(beyond_latin1)
                    || logged.into_iter().any(beyond_latin1)))
    }
}

impl Store for MemoryStore {
    fn check(&self, connections: usize) -> Result<(), StoreError> {
        let state = self.call("checking the store")?;
        match state.faults.max_connections {
            Some(max) if max < connections => Err(failure(
                "checking the store",
                &format!("it lends {max} connections; the worker holds {connections}"),
            )),
            _ => Ok(()),
        }
    }

    fn claim(
        &self,
        token: ClaimToken,
        limit: ClaimLimit,
        lease: Duration,
    ) -> Result<Vec<ClaimedMessage>, StoreError> {
        let mut state = self.call("claiming messages")?;
        if state.faults.failing_claims > 0 {
            state.faults.failing_claims -= 1;
            return Err(failure("claiming messages", "injected claim failure"));
        }
        let now = state.now();
        let mut due: Vec<&MemoryRow> = state
            .rows
            .values()
            .filter(|row| row.due <= now && state.heads_its_key(row))
            .collect();
        due.sort_by_key(|row| (std::cmp::Reverse(row.priority), row.due, row.position));
        let take = limit.take(due.iter().map(|row| row.payload.len()));
        let positions: Vec<i64> = due.iter().take(take).map(|row| row.position).collect();
        let lease_end = now.saturating_add(lease);
        Ok(positions
            .into_iter()
            .filter_map(|position| state.lease(position, token, lease_end))
            .collect())
    }

    fn settle(&self, outcomes: &[Outcome]) -> Result<Vec<i64>, StoreError> {
        let mut state = self.call("settling processed messages")?;
        if state.faults.failing_settles > 0 {
            state.faults.failing_settles -= 1;
            return Err(failure(
                "settling processed messages",
                "injected settle failure",
            ));
        }
        if let Some(locked) = outcomes
            .iter()
            .find(|outcome| state.faults.locked.contains(&outcome.position))
        {
            return Err(failure(
                "settling processed messages",
                &format!("lock wait timeout on position {}", locked.position),
            )
            .with_kind(crate::store::StoreErrorKind::Busy));
        }
        if let Some(refused) = outcomes.iter().find(|outcome| state.refuses(outcome)) {
            return Err(failure(
                "settling processed messages",
                &format!("the outcome of position {} is refused", refused.position),
            ));
        }
        let now = state.now();
        let exchanges = outcomes
            .iter()
            .filter_map(|outcome| outcome.log.as_deref())
            .flat_map(|log| log.exchanges.iter().cloned());
        state.logged.extend(exchanges);
        let mut fenced = Vec::new();
        for outcome in outcomes {
            let owned = state
                .rows
                .get(&outcome.position)
                .is_some_and(|row| row.locked_by == Some(outcome.token));
            if !owned {
                fenced.push(outcome.position);
                continue;
            }
            let Some(mut row) = state.rows.remove(&outcome.position) else {
                continue;
            };
            match &outcome.settlement {
                Settlement::Done => continue,
                Settlement::DeadLetter { error } => {
                    state.dead.insert(
                        row.position,
                        MemoryDeadLetter {
                            row,
                            error: error.clone(),
                        },
                    );
                    continue;
                }
                Settlement::Retry { delay, error } => {
                    row.due = now.saturating_add(*delay);
                    row.last_error = Some(error.clone());
                }
                Settlement::Release => {
                    row.due = now;
                    row.attempts = row.attempts.saturating_sub(1);
                }
                Settlement::Defer { delay, reason } => {
                    row.due = now.saturating_add(*delay);
                    row.attempts = row.attempts.saturating_sub(1);
                    row.last_error = Some(reason.clone());
                }
                Settlement::Pause { reason } => {
                    row.due = Duration::MAX;
                    row.attempts = row.attempts.saturating_sub(1);
                    row.last_error = Some(reason.clone());
                    state.paused_rows.insert(row.position);
                }
            }
            row.locked_by = None;
            state.rows.insert(row.position, row);
        }
        Ok(fenced)
    }

    fn settle_and_lease(
        &self,
        outcomes: &[Outcome],
        successors: &SuccessorLease,
    ) -> Result<(Vec<i64>, Vec<ClaimedMessage>), StoreError> {
        let fenced = self.settle(outcomes)?;
        // Not in the settlement's own step, as a database does; the store's one lock makes it
        // as good as one here, but for the faults `call` injects, which fail only whole calls.
        let mut state = self.state();
        let now = state.now();
        let lease_end = now.saturating_add(successors.lease);
        let mut keys: Vec<&str> = outcomes
            .iter()
            .filter(|outcome| outcome.settlement == Settlement::Done)
            .filter(|outcome| !fenced.contains(&outcome.position))
            .filter_map(|outcome| outcome.ordering_key.as_deref())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut leased = Vec::new();
        for key in keys {
            // The key's prefix of due, unleased messages, within the count and the bytes.
            let mut bytes = 0;
            let chain: Vec<i64> = state
                .rows
                .values()
                .filter(|row| row.ordering_key.as_deref() == Some(key))
                .take(successors.per_key.max(1))
                .take_while(|row| {
                    bytes += row.payload.len();
                    row.due <= now && bytes <= successors.max_bytes
                })
                .map(|row| row.position)
                .collect();
            leased.extend(
                chain
                    .into_iter()
                    .filter_map(|position| state.lease(position, successors.token, lease_end)),
            );
        }
        leased.sort_by_key(|message| message.position);
        Ok((fenced, leased))
    }

    fn extend_leases(
        &self,
        leases: &[(ClaimToken, i64)],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        let mut state = self.call("renewing leases")?;
        let lease_end = state.now().saturating_add(lease);
        let mut lost = Vec::new();
        for (token, position) in leases {
            match state.rows.get_mut(position) {
                Some(row) if row.locked_by == Some(*token) => row.due = lease_end,
                Some(row) if row.locked_by.is_some() => lost.push(*position),
                _ => {}
            }
        }
        Ok(lost)
    }

    fn ping(&self) -> Result<(), StoreError> {
        self.call("checking the store").map(|_| ())
    }

    fn promote_stranded(&self) -> Result<usize, StoreError> {
        // Claims find each key's head by looking: nothing is ever parked.
        self.call("promoting stranded keys").map(|_| 0)
    }

    fn prune(&self) -> Result<Pruned, StoreError> {
        // Nothing here is kept for a while: no idempotency keys, dead letters or log.
        self.call("pruning").map(|_| Pruned::default())
    }

    fn backlog(&self) -> Result<Option<Backlog>, StoreError> {
        let state = self.call("reading the backlog")?;
        let now = state.now();
        let oldest_due = state
            .rows
            .values()
            .map(|row| row.due)
            .filter(|due| *due <= now)
            .min();
        Ok(Some(Backlog::new(
            u64::try_from(state.rows.len()).unwrap_or(u64::MAX),
            oldest_due.map_or(Duration::ZERO, |due| now.saturating_sub(due)),
        )))
    }

    fn connection_shortage(&self) -> Option<String> {
        None
    }
}

impl SharedDestinations for MemoryStore {
    fn sync_destinations(
        &self,
        destinations: &[SyncedDestination<'_>],
        reconcile: &mut dyn FnMut(&[StoredDestination]) -> Vec<DestinationReport>,
    ) -> Result<(), StoreError> {
        let mut state = self.call("sharing destinations' health")?;
        for synced in destinations {
            state
                .destinations
                .entry(synced.name.to_owned())
                .or_insert_with(|| (StoredDestination::new(synced.name, None, 0), None));
        }
        let stored: Vec<StoredDestination> = destinations
            .iter()
            .filter_map(|d| state.destinations.get(d.name).map(|(s, _)| s.clone()))
            .collect();
        for report in reconcile(&stored) {
            if let Some((record, last)) = state.destinations.get_mut(&report.name) {
                if report.disabled_reason.is_some() && record.disabled.is_none() {
                    record.disabled = report.disabled_reason.clone();
                }
                *last = Some(report);
            }
        }
        Ok(())
    }
}

impl SharedTurns for MemoryStore {
    fn take_turn(
        &self,
        name: &str,
        _kind: &str,
        take: &mut dyn FnMut(Option<Turns>, i64) -> Turns,
    ) -> Result<(), StoreError> {
        let mut state = self.call("taking a turn of a rate limit across processes")?;
        let now = i64::try_from(state.now().as_micros()).unwrap_or(i64::MAX);
        let turns = take(state.turns.get(name).copied(), now);
        state.turns.insert(name.to_owned(), turns);
        Ok(())
    }
}

impl Pauses for MemoryStore {
    fn paused(&self) -> Result<Paused, StoreError> {
        Ok(self.call("reading pauses")?.paused.clone())
    }

    fn release_paused(&self) -> Result<usize, StoreError> {
        let mut state = self.call("releasing paused messages")?;
        Ok(release_paused(&mut state))
    }
}

impl Subscriptions for MemoryStore {
    fn subscriptions(&self) -> Result<Vec<crate::subscription::Subscription>, StoreError> {
        self.call("reading subscriptions").map(|_| Vec::new())
    }

    fn fan_out(
        &self,
        target: &crate::store::SettleTarget<'_>,
    ) -> Result<Option<usize>, StoreError> {
        // No subscriptions here: the event leaves with no delivery, if its claim holds it.
        let mut state = self.call("fanning an event out")?;
        match state.rows.get(&target.position) {
            Some(row) if row.locked_by == Some(target.token) => {
                state.rows.remove(&target.position);
                Ok(Some(0))
            }
            _ => Ok(None),
        }
    }

    fn release_subscription(&self, _id: &str) -> Result<usize, StoreError> {
        self.call("releasing a subscription's deliveries")
            .map(|_| 0)
    }
}

impl Notifications for MemoryStore {
    fn listens(&self) -> bool {
        false
    }

    fn listen(&self) -> Result<Option<Box<dyn Listener>>, StoreError> {
        Ok(None)
    }

    fn wants_local_wakeups(&self) -> bool {
        // Only polled: an enqueue in this process wakes the worker at once.
        true
    }
}

impl TransactionalSettlement for MemoryStore {
    type Connection = Infallible;

    fn settle_within(
        &self,
        _message: &SettleTarget<'_>,
        _work: &mut dyn FnMut(&mut Infallible) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessError> {
        Err(ProcessError::permanent(
            "the in-memory store has no transactions, so it cannot settle a message inside one; \
             exactly-once handlers need outbox-diesel's DieselStore",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_take_the_heads_of_keys_in_due_order_and_fence_stale_outcomes() {
        let store = MemoryStore::with_manual_clock();
        let a1 = store.enqueue("t", "{}", Some("a"));
        let a2 = store.enqueue("t", "{}", Some("a"));
        let free = store.enqueue("t", "{}", None);
        let first = ClaimToken::new();
        let claimed = store
            .claim(first, ClaimLimit::messages(10), Duration::from_secs(5))
            .unwrap();
        let positions: Vec<i64> = claimed.iter().map(|m| m.position).collect();
        assert_eq!(positions, [a1, free], "a2 waits behind a1");

        store.advance(Duration::from_secs(6));
        let second = ClaimToken::new();
        let again = store
            .claim(second, ClaimLimit::messages(10), Duration::from_secs(5))
            .unwrap();
        assert_eq!(again.len(), 2, "the lease ran out");
        assert_eq!(again[0].attempt, 2);
        let stale = Outcome {
            token: first,
            position: a1,
            message_id: claimed[0].message_id,
            ordering_key: Some("a".into()),
            log: None,
            settlement: Settlement::Done,
        };
        assert_eq!(store.settle(&[stale]).unwrap(), vec![a1]);
        assert_eq!(store.rows().len(), 3, "the fenced outcome changed nothing");
        assert_eq!(store.rows()[0].locked_by, Some(second));
        let _ = a2;
    }

    #[test]
    fn faults_fail_what_they_say() {
        let store = MemoryStore::with_manual_clock();
        let position = store.enqueue("t", "{}", None);
        store.fail_claims(1);
        assert!(store
            .claim(
                ClaimToken::new(),
                ClaimLimit::messages(1),
                Duration::from_secs(5)
            )
            .is_err());
        let token = ClaimToken::new();
        let claimed = store
            .claim(token, ClaimLimit::messages(1), Duration::from_secs(5))
            .unwrap();
        store.refuse_non_latin1(true);
        let outcome = |error: &str| Outcome {
            token,
            position,
            message_id: claimed[0].message_id,
            ordering_key: None,
            log: None,
            settlement: Settlement::Retry {
                delay: Duration::ZERO,
                error: error.into(),
            },
        };
        assert!(store.settle(&[outcome("webhook answered 500 …")]).is_err());
        assert!(store.ping().is_ok(), "refusing is not being down");
        store
            .settle(&[outcome("caf\u{e9} answered 500 ...")])
            .unwrap();
        assert_eq!(store.rows()[0].attempts, 1);
        store.set_max_connections(Some(2));
        assert!(store.check(3).is_err());
        assert!(store.check(2).is_ok());
    }
}
