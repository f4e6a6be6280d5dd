//! The acker: saves the outcomes of finished messages in batches. (The warden looks after what
//! the worker holds while it waits or runs.)
//!
//! An outcome the store does not take is never allowed to hold up the others. When a batch
//! fails, a ping tells the two causes apart: the database is unreachable (every outcome waits,
//! retried with backoff, nothing counted against them), or it answers but refuses this
//! outcome (a text it cannot encode, a conflicting row). A refused outcome is set aside and
//! tried again on its own; after a few refusals its text is reduced to short ASCII, and if even
//! that is refused it is given up: logged, counted, and its message runs again when its lease
//! ends. [`after_refusal`] is that policy.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use crate::destination::Answer;
use crate::metrics;
use crate::store::{ClaimToken, ClaimedMessage, Outcome, Settlement, SuccessorLease};

use super::backoff::{Backoff, Failures};
use super::claimer::{dispatch_chains, ClaimSignals};
use super::jobs::JobSender;
use super::shared::Shared;
use super::text::reduced;
use super::timing::{
    ACKER_TICK, REFUSALS_BEFORE_GIVING_UP, REFUSALS_BEFORE_REDUCING, REFUSED_RETRY, SETTLE_LINGER,
    SETTLE_LINGER_STEP, SETTLE_RETRY,
};
use super::vitals::Counters;

/// While at most this many held messages have yet to report, the acker's linger receives each
/// outcome as it comes (a wake-up each, affordable for so few) instead of sleeping in steps:
/// a few ordering keys' next messages wait for exactly this settlement.
const RECEIVE_EACH_AT_MOST: usize = 32;

/// The most messages of one ordering key a settlement leases at once, to run in order on one
/// handler thread. More carry more of a key a round, but a key's messages after a failure are
/// leased (an attempt counted) and given back, and a worker that dies holding them charges
/// each an attempt it never ran.
pub(crate) const CHAIN_AT_MOST: usize = 16;

/// How many claims' worth of work settling `batch` leaves to be taken: a key's next message
/// for each ordering key it settles, and a free place for each unkeyed message.
fn keys_and_unkeyed(batch: &[Outcome]) -> usize {
    let mut keys: Vec<&str> = batch
        .iter()
        .filter_map(|outcome| outcome.ordering_key.as_deref())
        .collect();
    let unkeyed = batch.len() - keys.len();
    keys.sort_unstable();
    keys.dedup();
    keys.len() + unkeyed
}

/// Leased messages, in order of position, as chains: one per ordering key, in order.
fn chains_of(leased: Vec<ClaimedMessage>) -> Vec<Vec<ClaimedMessage>> {
    let mut chains: Vec<Vec<ClaimedMessage>> = Vec::new();
    for message in leased {
        let chain = message.ordering_key.as_ref().and_then(|key| {
            chains
                .iter_mut()
                .find(|chain| chain[0].ordering_key.as_ref() == Some(key))
        });
        match chain {
            Some(chain) => chain.push(message),
            None => chains.push(vec![message]),
        }
    }
    chains
}

/// What to do with an outcome after the store refused it `refusals` times in a row while
/// answering otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterRefusal {
    /// Try it again on its own after this pause.
    TryAgain(Duration),
    /// Store a short ASCII version of its text instead, counting afresh.
    Reduce,
    /// Stop trying: its message runs again when its lease ends.
    GiveUp,
}

/// The settlement policy for refused outcomes; see the module documentation.
pub(crate) fn after_refusal(refusals: u32, reduced: bool, has_text: bool) -> AfterRefusal {
    let limit = if reduced {
        REFUSALS_BEFORE_GIVING_UP
    } else if has_text {
        REFUSALS_BEFORE_REDUCING
    } else {
        // Nothing to reduce: all the tries at once.
        REFUSALS_BEFORE_REDUCING + REFUSALS_BEFORE_GIVING_UP
    };
    if refusals < limit {
        AfterRefusal::TryAgain(Backoff::from_pair(REFUSED_RETRY).delay(refusals))
    } else if !reduced && has_text {
        AfterRefusal::Reduce
    } else {
        AfterRefusal::GiveUp
    }
}

/// An outcome the store refused, waiting for another try.
#[derive(Debug)]
struct Refused {
    outcome: Outcome,
    refusals: u32,
    reduced: bool,
    next_try: Instant,
}

/// The acker's thread: waits for outcomes and chores, and has the [`Settler`] do them.
pub(crate) struct Acker {
    shared: Arc<Shared>,
    /// The claimer's: whether it stopped for good.
    signals: Arc<ClaimSignals>,
    outcomes: Receiver<Outcome>,
    settler: Settler,
}

impl Acker {
    pub fn new(
        shared: Arc<Shared>,
        outcomes: Receiver<Outcome>,
        jobs: JobSender,
        capacity: Sender<()>,
        signals: Arc<ClaimSignals>,
    ) -> Self {
        let settler =
            Settler::new(Instant::now()).with_outlets(jobs, capacity, Arc::clone(&signals));
        Acker {
            shared,
            signals,
            outcomes,
            settler,
        }
    }

    /// The thread: settles until the worker has stopped and nothing is held.
    pub fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        let _alive = super::vitals::AliveGuard::new(&shared.vitals.acker_alive);
        loop {
            shared.survive("acker", ACKER_TICK, || self.step());
            if self.finished() {
                return;
            }
        }
    }

    /// Whether the worker has stopped and everything it held is settled (or the shutdown's
    /// deadline has passed).
    pub(super) fn finished(&self) -> bool {
        let shared = &self.shared;
        if !shared.stopping() {
            return false;
        }
        let settled_all = self.signals.is_done()
            && shared.held.count() == 0
            && self.settler.is_idle()
            && self.outcomes.is_empty();
        if settled_all {
            return true;
        }
        if shared.past_give_up() {
            log::error!(
                "outbox: giving up settling {} messages at the shutdown deadline; their leases \
                 will expire and they will be processed again",
                shared.held.count()
            );
            return true;
        }
        false
    }

    fn step(&mut self) {
        self.gather();
        let shared = Arc::clone(&self.shared);
        self.settler.settle(&shared, Instant::now());
    }

    /// Waits until an outcome arrives or a chore is due, then takes what is ready, lingering a
    /// moment while more are on their way.
    fn gather(&mut self) {
        let now = Instant::now();
        let max_batch = self.shared.config.batch_size.max(64) * 4;
        if !self.settler.has_due_fresh(now) {
            let wake = self.settler.next_chore(now);
            match self
                .outcomes
                .recv_timeout(wake.saturating_duration_since(now))
            {
                Ok(outcome) => self.settler.push(outcome),
                Err(RecvTimeoutError::Timeout) => return,
                Err(RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                    return;
                }
            }
        }
        self.take_ready(max_batch);
        // Each settlement costs the database a statement and a commit whatever its size: while
        // more outcomes are on their way, let them gather, and stop as soon as every message
        // held has reported: the messages of an ordering key wait for this settlement, and
        // lingering after the last outcome only delays them. While many are missing, in short
        // sleeps (a receive with a deadline would have handler threads wake the acker once per
        // outcome); while few are, by receiving each, so that the last is settled as it comes
        // rather than at the end of a sleep.
        let deadline = Instant::now() + SETTLE_LINGER;
        loop {
            let waiting = self.settler.fresh.len();
            let missing = self
                .shared
                .held
                .count()
                .saturating_sub(waiting + self.settler.refused.len());
            let now = Instant::now();
            if waiting >= self.shared.config.batch_size
                || missing == 0
                || self.shared.stopping()
                || now >= deadline
            {
                return;
            }
            if missing <= RECEIVE_EACH_AT_MOST {
                match self.outcomes.recv_timeout(deadline - now) {
                    Ok(outcome) => self.settler.push(outcome),
                    Err(_) => return,
                }
            } else {
                std::thread::sleep(SETTLE_LINGER_STEP.min(deadline - now));
            }
            self.take_ready(max_batch);
        }
    }

    fn take_ready(&mut self, max_batch: usize) {
        let room = max_batch.saturating_sub(self.settler.fresh.len());
        self.settler
            .fresh
            .extend(self.outcomes.try_iter().take(room));
    }
}

/// What the acker does, apart from waiting: given the time, so that the simulation drives it
/// without threads or sleeps.
pub(crate) struct Settler {
    /// Outcomes not yet tried, or waiting for the database to come back.
    fresh: Vec<Outcome>,
    refused: Vec<Refused>,
    unavailable: Failures,
    /// The database refused a text and took its ASCII reduction: reduce texts from now on.
    ascii_only: bool,
    /// While the database is unreachable: not before then.
    next_settle: Instant,
    /// Where the messages a settlement leases go (the next messages of settled keys).
    jobs: Option<JobSender>,
    /// Wakes the claimer: capacity was freed, or a key's head was settled.
    capacity: Option<Sender<()>>,
    /// The claimer's: whether its claims come back short.
    signals: Option<Arc<ClaimSignals>>,
}

impl Settler {
    pub fn new(now: Instant) -> Self {
        Settler {
            fresh: Vec::new(),
            refused: Vec::new(),
            unavailable: Failures::new(Backoff::from_pair(SETTLE_RETRY)),
            ascii_only: false,
            next_settle: now,
            jobs: None,
            capacity: None,
            signals: None,
        }
    }

    /// Lets settlements lease the next message of each settled ordering key and hand it to the
    /// handler threads through `jobs` while the claimer's `signals` say its claims come back
    /// short, and wake the claimer through `capacity` when they free room or settle a key's
    /// head.
    pub fn with_outlets(
        mut self,
        jobs: JobSender,
        capacity: Sender<()>,
        signals: Arc<ClaimSignals>,
    ) -> Self {
        self.jobs = Some(jobs);
        self.capacity = Some(capacity);
        self.signals = Some(signals);
        self
    }

    /// Wakes the claimer (a wake-up already pending is enough).
    fn wake_claimer(&self) {
        if let Some(capacity) = &self.capacity {
            let _ = capacity.try_send(());
        }
    }

    /// An outcome to settle.
    pub fn push(&mut self, outcome: Outcome) {
        self.fresh.push(outcome);
    }

    /// Whether no outcome waits.
    pub fn is_idle(&self) -> bool {
        self.fresh.is_empty() && self.refused.is_empty()
    }

    fn has_due_fresh(&self, now: Instant) -> bool {
        !self.fresh.is_empty() && now >= self.next_settle
    }

    /// When the next chore is due, if no outcome comes first.
    pub fn next_chore(&self, now: Instant) -> Instant {
        let mut wake = now + ACKER_TICK;
        if let Some(first) = self.refused.iter().map(|r| r.next_try).min() {
            wake = wake.min(first);
        }
        if !self.fresh.is_empty() {
            wake = wake.min(self.next_settle);
        }
        wake
    }

    /// Settles what is due: the fresh outcomes (unless the database is being waited for) and
    /// refused ones whose next try has come.
    pub fn settle(&mut self, shared: &Shared, now: Instant) {
        if self.has_due_fresh(now) {
            self.settle_fresh(shared, now);
        }
        let (due, waiting): (Vec<Refused>, Vec<Refused>) = std::mem::take(&mut self.refused)
            .into_iter()
            .partition(|entry| entry.next_try <= now);
        self.refused = waiting;
        for entry in due {
            self.try_alone(shared, entry, now);
        }
    }

    fn settle_fresh(&mut self, shared: &Shared, now: Instant) {
        let mut batch = std::mem::take(&mut self.fresh);
        // A store reports fenced outcomes by position: two outcomes of one message (of two
        // claims, when a lease ran out and the message was claimed again) go in separate
        // batches, so that each is told apart.
        let mut seen = std::collections::HashSet::with_capacity(batch.len());
        let (unique, repeats): (Vec<Outcome>, Vec<Outcome>) = batch
            .drain(..)
            .partition(|outcome| seen.insert(outcome.position));
        batch = unique;
        self.fresh = repeats;
        if self.ascii_only {
            for outcome in &mut batch {
                reduce(outcome);
            }
        }
        let successors = self.successor_lease(shared, &batch);
        let settled = match &successors {
            Some(lease) => shared.vitals.store_call("acker", "settle", || {
                shared.store.settle_and_lease(&batch, lease)
            }),
            None => shared
                .vitals
                .store_call("acker", "settle", || shared.store.settle(&batch))
                .map(|fenced| (fenced, Vec::new())),
        };
        let error = match settled {
            Ok((fenced, leased)) => {
                let booked = self.settled(shared, &batch, &fenced, now);
                let refilled = match successors {
                    Some(lease) => self.dispatch_successors(shared, lease.token, leased, now),
                    None => 0,
                };
                // A settled message may have been the head of its ordering key: the next one of
                // that key is claimable now, not at the next poll; unless the settlement leased
                // the key's next messages already and they went to a handler. An unkeyed one
                // left room for the claimer.
                if refilled < booked.min(keys_and_unkeyed(&batch)) {
                    self.wake_claimer();
                }
                return;
            }
            Err(error) => {
                metrics::store_error("settle");
                error
            }
        };
        if is_busy(&error) || !store_answers(shared) {
            let pause = self.unavailable.failed();
            shared.vitals.settle_errors.store(
                self.unavailable.in_a_row(),
                std::sync::atomic::Ordering::Relaxed,
            );
            log::error!(
                "outbox: settling {} messages failed and the store does not answer or is busy \
                 (retrying in {pause:?}): {error}",
                batch.len()
            );
            batch.append(&mut self.fresh);
            self.fresh = batch;
            self.next_settle = now + pause;
            return;
        }
        log::warn!(
            "outbox: the store refused a batch of {} outcomes ({error}); settling them one by one",
            batch.len()
        );
        let reduced = self.ascii_only;
        for outcome in batch {
            let entry = Refused {
                outcome,
                refusals: 0,
                reduced,
                next_try: now,
            };
            self.try_alone(shared, entry, now);
        }
    }

    /// Tries one outcome on its own; sets it aside if refused.
    fn try_alone(&mut self, shared: &Shared, mut entry: Refused, now: Instant) {
        let alone = std::slice::from_ref(&entry.outcome);
        let error = match shared
            .vitals
            .store_call("acker", "settle", || shared.store.settle(alone))
        {
            Ok(fenced) => {
                if entry.reduced && !self.ascii_only && entry.refusals == 0 {
                    log::warn!(
                        "outbox: the database refused an error text and took its ASCII \
                         reduction; error texts are stored reduced from now on (is its \
                         encoding UTF-8?)"
                    );
                    self.ascii_only = true;
                }
                if self.settled(shared, std::slice::from_ref(&entry.outcome), &fenced, now) > 0 {
                    self.wake_claimer();
                }
                return;
            }
            Err(error) => {
                metrics::store_error("settle");
                error
            }
        };
        if is_busy(&error) || !store_answers(shared) {
            // Not this outcome's fault: it waits with the others, uncounted.
            entry.next_try = now + self.unavailable.failed();
            self.refused.push(entry);
            return;
        }
        entry.refusals += 1;
        // A delivery log's answer is whatever the receiver sent: text to reduce, even on an
        // outcome that has none of its own (a delivery).
        let has_text = entry.outcome.settlement.text().is_some() || entry.outcome.log.is_some();
        match after_refusal(entry.refusals, entry.reduced, has_text) {
            AfterRefusal::TryAgain(pause) => {
                log::warn!(
                    "outbox: the store refused the outcome of message {} ({} times; trying \
                     again in {pause:?}): {error}",
                    entry.outcome.message_id,
                    entry.refusals
                );
                entry.next_try = now + pause;
                self.refused.push(entry);
            }
            AfterRefusal::Reduce => {
                log::warn!(
                    "outbox: the store keeps refusing the outcome of message {}; storing it \
                     with a short ASCII text instead: {error}",
                    entry.outcome.message_id
                );
                reduce(&mut entry.outcome);
                entry.reduced = true;
                entry.refusals = 0;
                entry.next_try = now;
                self.refused.push(entry);
            }
            AfterRefusal::GiveUp if entry.outcome.log.is_some() => {
                // An attempt's exchanges are worth less than its outcome: a delivery given up
                // would be delivered again.
                log::warn!(
                    "outbox: the store keeps refusing the outcome of message {} with its \
                     delivery log; saving the outcome without the log: {error}",
                    entry.outcome.message_id
                );
                entry.outcome.log = None;
                entry.refusals = 0;
                entry.next_try = now;
                self.refused.push(entry);
            }
            AfterRefusal::GiveUp => {
                log::error!(
                    "outbox: giving up the outcome of message {} ({:?}), which the store keeps \
                     refusing; the message runs again when its lease ends: {error}",
                    entry.outcome.message_id,
                    entry.outcome.settlement
                );
                Counters::add(&shared.counters.abandoned_outcomes, 1);
                for released in shared
                    .held
                    .release([(entry.outcome.position, entry.outcome.token)])
                    .iter()
                    .flatten()
                {
                    metrics::processed(shared.metric_type(&released.message_type), "abandoned");
                }
                metrics::in_flight(shared.held.count());
                self.wake_claimer();
            }
        }
    }

    /// Whether the settlement of `batch` may lease the next messages of the ordering keys it
    /// settles, and within what. Only while claims come back short (a few keys are all there
    /// is to claim, and each of their messages would otherwise wait for a claim: when claims
    /// are full, the claimer is the cheaper way, and a settlement leasing the rows a claim is
    /// locking would wait for it); only while the worker keeps room for the claimer's next full
    /// batch, so that older messages of other keys are claimed in their turn instead of waiting
    /// for busy keys to drain; and within the byte cap. The room and the bytes are shared out
    /// among the keys: up to [`CHAIN_AT_MOST`] messages of each, which one handler thread runs
    /// in order, so that a round of settlement carries more than one message of a key.
    fn successor_lease(&self, shared: &Shared, batch: &[Outcome]) -> Option<SuccessorLease> {
        self.jobs.as_ref()?;
        let short = self
            .signals
            .as_ref()
            .is_some_and(|signals| signals.is_short());
        if shared.stopping() || !short {
            return None;
        }
        let mut keys: Vec<&str> = batch
            .iter()
            .filter(|outcome| outcome.settlement == Settlement::Done)
            .filter_map(|outcome| outcome.ordering_key.as_deref())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let config = &shared.config;
        let held_after = shared.held.count().saturating_sub(batch.len());
        let room = config
            .max_in_flight
            .saturating_sub(config.max_batch_size)
            .saturating_sub(held_after);
        if keys.is_empty() || keys.len() > room {
            return None;
        }
        let max_bytes = config
            .max_in_flight_bytes
            .saturating_sub(shared.held.bytes())
            / keys.len();
        let per_key = (room / keys.len()).min(CHAIN_AT_MOST);
        (max_bytes > 0).then(|| SuccessorLease {
            token: ClaimToken::new(),
            lease: config.lease,
            max_bytes,
            per_key,
        })
    }

    /// Hands the messages a settlement leased to the handler threads, a chain a key; returns how
    /// many chains went to them. The jobs channel holds as many jobs as the worker may hold
    /// messages, so it is never full; if it were, the chain is given back rather than the acker
    /// waiting for a handler thread.
    fn dispatch_successors(
        &mut self,
        shared: &Shared,
        token: ClaimToken,
        leased: Vec<ClaimedMessage>,
        now: Instant,
    ) -> usize {
        let Some(jobs) = &self.jobs else {
            return 0;
        };
        if leased.is_empty() {
            return 0;
        }
        let mut not_sent = Vec::new();
        let mut still_stuck = Vec::new();
        let mut chains = 0;
        let lease_ends = now + shared.config.lease;
        dispatch_chains(
            shared,
            token,
            chains_of(leased),
            lease_ends,
            |job| match jobs.try_send(job) {
                Ok(()) => {
                    chains += 1;
                    true
                }
                Err(TrySendError::Full(job)) => {
                    not_sent.push(Outcome::of(token, &job.message, Settlement::Release));
                    not_sent.extend(
                        job.chain.iter().map(|chained| {
                            Outcome::of(token, &chained.message, Settlement::Release)
                        }),
                    );
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            },
            |outcome| {
                still_stuck.push(outcome);
                true
            },
        );
        self.fresh.append(&mut not_sent);
        self.fresh.append(&mut still_stuck);
        chains
    }

    /// Books settled outcomes: stats, metrics, held messages, health. Returns how many it booked
    /// (an outcome of a message this worker claimed again goes back to be settled under the new
    /// claim).
    pub(super) fn settled(
        &mut self,
        shared: &Shared,
        outcomes: &[Outcome],
        fenced: &[i64],
        now: Instant,
    ) -> usize {
        self.unavailable.succeeded();
        self.next_settle = now;
        shared.vitals.settled();
        // A message this worker claimed again while its outcome was on its way (its lease ran
        // out meanwhile) is held under the new claim: its outcome is settled again under that
        // claim, rather than dropped, which would leave the message to run again after the
        // new lease. Only the outcome of the attempt held: a stuck earlier attempt's outcome,
        // late, must not settle a newer attempt of the same message.
        let reclaimed_by = |outcome: &Outcome| {
            fenced
                .contains(&outcome.position)
                .then(|| shared.held.moved_to(outcome.position, outcome.token))
                .flatten()
        };
        let kept: Vec<Outcome>;
        let outcomes = if outcomes.iter().any(|o| reclaimed_by(o).is_some()) {
            let (reclaimed, rest): (Vec<Outcome>, Vec<Outcome>) = outcomes
                .iter()
                .cloned()
                .partition(|outcome| reclaimed_by(outcome).is_some());
            for mut outcome in reclaimed {
                if let Some(token) = reclaimed_by(&outcome) {
                    log::info!(
                        "outbox: message {} was claimed again by this worker while its outcome \
                         was on its way; settling it under the new claim",
                        outcome.message_id
                    );
                    outcome.token = token;
                    // The fenced settlement saved the attempt's exchanges already.
                    outcome.log = None;
                    self.fresh.push(outcome);
                }
            }
            kept = rest;
            kept.as_slice()
        } else {
            outcomes
        };
        // The other way round: the outcome was saved under its own claim and made the message
        // due (a retry without delay), and this worker claimed it again before the entry was let
        // go here. The claimer left that claim to the entry, so no one runs it: it is given back
        // at once, without counting an attempt, rather than waiting out its lease.
        for outcome in outcomes {
            if fenced.contains(&outcome.position) {
                continue;
            }
            if let Some(token) = shared.held.moved_to(outcome.position, outcome.token) {
                log::debug!(
                    "outbox: message {} was claimed again by this worker just after its outcome \
                     was saved; giving the new claim back to run it again",
                    outcome.message_id
                );
                self.fresh.push(Outcome {
                    token,
                    log: None,
                    settlement: Settlement::Release,
                    ..outcome.clone()
                });
            }
        }
        let released = shared.held.release(
            outcomes
                .iter()
                .map(|outcome| (outcome.position, outcome.token)),
        );
        metrics::settlement();
        let counters = &shared.counters;
        let settled_at = SystemTime::now();
        for (outcome, entry) in outcomes.iter().zip(&released) {
            let (counter, label) = if fenced.contains(&outcome.position) {
                log::warn!(
                    "outbox: the lease on message {} passed to another claim before its outcome \
                     ({:?}) was saved; the outcome is dropped",
                    outcome.message_id,
                    outcome.settlement
                );
                (&counters.fenced, "fenced")
            } else {
                match outcome.settlement {
                    Settlement::Done => (&counters.succeeded, "succeeded"),
                    Settlement::Retry { .. } => (&counters.retried, "retried"),
                    Settlement::DeadLetter { .. } => (&counters.dead_lettered, "dead_lettered"),
                    Settlement::Release => (&counters.released, "released"),
                    Settlement::Defer { .. } => (&counters.deferred, "deferred"),
                    Settlement::Pause { .. } => (&counters.paused, "paused"),
                }
            };
            Counters::add(counter, 1);
            if let Some(entry) = entry {
                let message_type = shared.metric_type(&entry.message_type);
                metrics::processed(message_type, label);
                if label == "succeeded" {
                    if let Ok(lag) = settled_at.duration_since(entry.enqueued_at) {
                        metrics::delivery_lag(message_type, lag);
                    }
                }
            }
        }
        metrics::in_flight(shared.held.count());
        outcomes.len()
    }
}

/// Whether the store answered "not now" (a lock held elsewhere): the outcome waits, uncounted,
/// as when the store does not answer at all. A lock wait is no refusal of the outcome: giving
/// the outcome up for it would run its message a second time without any crash.
fn is_busy(error: &crate::store::StoreError) -> bool {
    error.kind() == crate::store::StoreErrorKind::Busy
}

fn store_answers(shared: &Shared) -> bool {
    shared
        .vitals
        .store_call("acker", "ping", || shared.store.ping())
        .is_ok()
}

/// Replaces the outcome's text with its short ASCII reduction.
fn reduce(outcome: &mut Outcome) {
    if let Some(text) = outcome.settlement.text() {
        let short = reduced(text);
        outcome.settlement = outcome.settlement.with_text(short);
    }
    // The delivery log's texts too: a receiver's answer is whatever it sent.
    for exchange in outcome
        .log
        .iter_mut()
        .flat_map(|log| log.exchanges.iter_mut())
    {
        if let Some(answer) = &exchange.answer {
            exchange.answer = Some(Answer::new(answer.status(), reduced(answer.text())));
        }
        exchange.error = exchange.error.as_deref().map(reduced);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_outcome_is_tried_again_then_reduced_then_given_up() {
        let mut reduced = false;
        let mut refusals = 0;
        let mut steps = Vec::new();
        loop {
            refusals += 1;
            let step = after_refusal(refusals, reduced, true);
            steps.push(step);
            match step {
                AfterRefusal::TryAgain(pause) => assert!(pause <= Duration::from_millis(500)),
                AfterRefusal::Reduce => {
                    reduced = true;
                    refusals = 0;
                }
                AfterRefusal::GiveUp => break,
            }
            assert!(steps.len() < 20, "never ends: {steps:?}");
        }
        let reduce_at = steps
            .iter()
            .position(|s| *s == AfterRefusal::Reduce)
            .expect("reduced before giving up");
        assert_eq!(reduce_at as u32, REFUSALS_BEFORE_REDUCING - 1);
        assert_eq!(
            steps.len() as u32,
            REFUSALS_BEFORE_REDUCING + REFUSALS_BEFORE_GIVING_UP
        );
    }

    #[test]
    fn an_outcome_without_text_is_given_up_after_the_same_number_of_tries() {
        let tries = (1..)
            .find(|n| after_refusal(*n, false, false) == AfterRefusal::GiveUp)
            .unwrap();
        assert_eq!(tries, REFUSALS_BEFORE_REDUCING + REFUSALS_BEFORE_GIVING_UP);
        assert!(
            (1..tries).all(|n| matches!(after_refusal(n, false, false), AfterRefusal::TryAgain(_)))
        );
    }
}
