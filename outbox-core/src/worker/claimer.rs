//! The claimer: leases due messages when the worker has room for a full batch, and hands them
//! to the handler threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::metrics;
use crate::priority::Priority;
use crate::store::{ClaimLimit, ClaimToken, ClaimedMessage, Outcome, Settlement};

use super::backoff::{Backoff, Failures};
use super::config::Config;
use super::handlers::{log_settlement, policy_for, settle_attempt, Attempt};
use super::held::{Admission, JobId};
use super::jobs::Job;
use super::jobs::JobSender;
use super::shared::Shared;
use super::timing::{CLAIM_RETRY, FOLLOW_UPS_MS, SMALL_CLAIMS_AFTER_RAISED};
use super::vitals::{AliveGuard, Counters};

/// How many messages the next claim asks for: `batch_size` to start with, doubled up to
/// `max_batch_size` while the handler threads have run out of messages by the time a full claim
/// comes back after a full one (claims are what they wait for), and halved back towards
/// `batch_size` when a claim comes back short (the backlog is drained) or finds a whole claim's
/// worth still waiting for a handler (they are what the claims wait for). The first full claim
/// after a short one never grows: the handlers had nothing to run out of. A claim that takes a
/// message of a raised priority sets the size back to `batch_size`, where it stays for
/// [`SMALL_CLAIMS_AFTER_RAISED`]: the next raised message waits for the next claim, and small
/// claims come soonest.
///
/// A claim costs a round trip and a commit whatever its size, so a fast drain wants large
/// claims; a slow receiver, a worker beside others, and a backlog of ordering keys want small
/// ones (a claim's messages wait in this worker, unseen by the others).
#[derive(Debug, Clone)]
pub(crate) struct ClaimSize {
    size: usize,
    smallest: usize,
    largest: usize,
    /// The last claim took all it asked for.
    last_full: bool,
    /// Claims stay at `smallest` until then: a raised message was claimed shortly before.
    small_until: Option<Instant>,
}

impl ClaimSize {
    pub fn new(config: &Config) -> Self {
        ClaimSize {
            size: config.batch_size,
            smallest: config.batch_size,
            largest: config.max_batch_size,
            last_full: false,
            small_until: None,
        }
    }

    /// The size of the next claim.
    pub fn get(&self) -> usize {
        self.size
    }

    fn kept_small(&self, now: Instant) -> bool {
        self.small_until.is_some_and(|until| now < until)
    }

    /// How many messages the worker may hold when it claims next: two claims' worth and one
    /// per handler thread. While claims are kept small after a raised message, two of the
    /// largest claims' worth: a claim of `batch_size` then comes as soon as that many slots
    /// are free, instead of waiting for the worker to hold two small claims' worth.
    /// ([`plan_claim`] keeps it within `max_in_flight`.)
    pub fn held_at_most(&self, config: &Config, now: Instant) -> usize {
        let claims = if self.kept_small(now) {
            self.largest
        } else {
            self.size
        };
        2 * claims + config.handler_threads
    }

    /// A claim that asked for `asked` messages took `taken`, `raised` among them of a raised
    /// priority, and found `queued` messages still waiting for a handler thread when it came
    /// back at `now`.
    pub fn claimed(&mut self, claim: Claimed, now: Instant) {
        let Claimed {
            asked,
            taken,
            raised,
            queued,
        } = claim;
        let full = taken >= asked;
        let kept_small = self.kept_small(now);
        if raised > 0 {
            self.size = self.smallest;
            self.small_until = Some(now + SMALL_CLAIMS_AFTER_RAISED);
        } else if full && self.last_full && queued == 0 && !kept_small {
            self.size = (self.size * 2).min(self.largest);
        } else if !full || queued >= self.size {
            self.size = (self.size / 2).max(self.smallest);
        }
        self.last_full = full;
    }
}

/// What a claim took, as [`ClaimSize`] reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claimed {
    pub asked: usize,
    pub taken: usize,
    /// Of those taken, how many of a raised priority.
    pub raised: usize,
    /// Messages still waiting for a handler thread when the claim came back.
    pub queued: usize,
}

impl Claimed {
    pub fn of(asked: usize, claimed: &[ClaimedMessage], queued: usize) -> Self {
        Claimed {
            asked,
            taken: claimed.len(),
            raised: claimed
                .iter()
                .filter(|message| message.priority > Priority::Normal)
                .count(),
            queued,
        }
    }
}

/// How much the next claim of `size` messages may take, or `None` while the worker holds too
/// much to claim that many (a claim costs a round trip and a commit whatever its size, and
/// claiming the few slots each settlement frees made claims of a third of a batch): it holds
/// at most `held_at_most` messages ([`ClaimSize::held_at_most`]), never more than
/// `max_in_flight`.
pub(crate) fn plan_claim(
    config: &Config,
    size: usize,
    held_at_most: usize,
    held: usize,
    held_bytes: usize,
) -> Option<ClaimLimit> {
    let held_at_most = held_at_most.min(config.max_in_flight);
    let free = held_at_most.saturating_sub(held);
    if free < size || held_bytes >= config.max_in_flight_bytes {
        return None;
    }
    Some(ClaimLimit {
        messages: size,
        bytes: config.max_in_flight_bytes - held_bytes,
        oversized_alone: held == 0,
    })
}

/// Takes claimed messages in and hands them to the handler threads with `send_job`; a message
/// a stuck handler thread still runs is counted as timed out again, its outcome handed to
/// `send_outcome`. Returns how many went to the handlers, or `None` once a channel is closed
/// (the worker is stopping).
pub(crate) fn dispatch(
    shared: &Shared,
    token: ClaimToken,
    claimed: Vec<ClaimedMessage>,
    lease_ends: Instant,
    send_job: impl FnMut(Job) -> bool,
    send_outcome: impl FnMut(Outcome) -> bool,
) -> Option<u64> {
    let chains = claimed.into_iter().map(std::iter::once);
    dispatch_chains(shared, token, chains, lease_ends, send_job, send_outcome)
}

/// [`dispatch`] for chains: the messages of one ordering key, in order, each chain one job
/// that a handler thread runs in order. A chain is cut at a message that is not dispatched (see
/// [`Admission`]); the messages after it are given back, the attempt not counted, to run in
/// their turn.
pub(crate) fn dispatch_chains<C: IntoIterator<Item = ClaimedMessage>>(
    shared: &Shared,
    token: ClaimToken,
    chains: impl IntoIterator<Item = C>,
    lease_ends: Instant,
    mut send_job: impl FnMut(Job) -> bool,
    mut send_outcome: impl FnMut(Outcome) -> bool,
) -> Option<u64> {
    let mut dispatched = 0u64;
    for chain in chains {
        let mut messages = chain.into_iter();
        let mut head: Option<Job> = None;
        // Allocated only for a chain of more than one message: a claim's messages come alone.
        let mut tail: Vec<Job> = Vec::new();
        for message in messages.by_ref() {
            match shared.held.admit(token, &message, lease_ends) {
                Admission::Dispatch(job) => {
                    let job = Job::single(job, message);
                    match head {
                        None => head = Some(job),
                        Some(_) => tail.push(job),
                    }
                    continue;
                }
                Admission::AlreadyHeld => log::info!(
                    "outbox: claimed message {} again while this worker still holds it (its \
                     lease had run out); it stays with the running attempt",
                    message.message_id
                ),
                Admission::StillStuck => {
                    let settlement = settle_attempt(
                        message.attempt,
                        Attempt::StillStuck,
                        &policy_for(shared, &message.message_type),
                    );
                    // Sent before it is logged: the application's logger may panic.
                    if !send_outcome(Outcome::of(token, &message, settlement.clone())) {
                        return None;
                    }
                    log_settlement(
                        &message.message_id,
                        &message.message_type,
                        message.headers.trace_id(),
                        &settlement,
                    );
                }
            }
            break;
        }
        for rest in messages {
            if !send_outcome(Outcome::of(token, &rest, Settlement::Release)) {
                return None;
            }
        }
        let Some(head) = head else {
            continue;
        };
        dispatched += 1 + tail.len() as u64;
        if !tail.is_empty() {
            let order: Vec<(i64, JobId)> = std::iter::once(&head)
                .chain(&tail)
                .map(|job| (job.message.position, job.job))
                .collect();
            shared.held.chain(&order);
        }
        if !send_job(head.chained(tail)) {
            return None;
        }
    }
    metrics::claimed(dispatched);
    metrics::in_flight(shared.held.count());
    Counters::add(&shared.counters.claimed, dispatched);
    Some(dispatched)
}

/// The claimer's thread.
pub(crate) struct Claimer {
    /// What the claimer tells the acker: it stopped for good; claims come back short.
    signals: Arc<ClaimSignals>,
    shared: Arc<Shared>,
    jobs: JobSender,
    outcomes: Sender<Outcome>,
    wake: Receiver<()>,
    capacity: Receiver<()>,
    failures: Failures,
    /// Early looks still to take after a claim or a wake-up, in milliseconds.
    follow_ups: &'static [u64],
    size: ClaimSize,
}

impl Claimer {
    pub fn new(
        shared: Arc<Shared>,
        jobs: JobSender,
        outcomes: Sender<Outcome>,
        wake: Receiver<()>,
        capacity: Receiver<()>,
        signals: Arc<ClaimSignals>,
    ) -> Self {
        Claimer {
            size: ClaimSize::new(&shared.config),
            shared,
            signals,
            jobs,
            outcomes,
            wake,
            capacity,
            failures: Failures::new(Backoff::from_pair(CLAIM_RETRY)),
            follow_ups: &[],
        }
    }

    pub fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        let _alive = AliveGuard::new(&shared.vitals.claimer_alive);
        while !shared.stopping() {
            shared.survive("claimer", Duration::from_millis(100), || self.step());
        }
        self.signals.finish();
        // Dropping the jobs sender (with self) lets the handler threads finish the queue.
    }

    fn step(&mut self) {
        let shared = &self.shared;
        let config = &shared.config;
        let size = self.size.get();
        let Some(limit) = plan_claim(
            config,
            size,
            self.size.held_at_most(config, Instant::now()),
            shared.held.count(),
            shared.held.bytes(),
        ) else {
            let _ = self.capacity.recv_timeout(config.poll_interval);
            return;
        };
        let token = ClaimToken::new();
        let started = Instant::now();
        let claimed = match shared.vitals.store_call("claimer", "claim", || {
            shared.store.claim(token, limit, config.lease)
        }) {
            Ok(claimed) => {
                metrics::claim_duration(started.elapsed());
                self.failures.succeeded();
                shared.vitals.claimed();
                claimed
            }
            Err(error) => {
                metrics::store_error("claim");
                let pause = self.failures.failed();
                shared
                    .vitals
                    .claim_errors
                    .store(self.failures.in_a_row(), Ordering::Relaxed);
                log::error!("outbox: claiming messages failed (retrying in {pause:?}): {error}");
                let _ = self.wake.recv_timeout(pause);
                return;
            }
        };
        let count = claimed.len();
        self.size.claimed(
            Claimed::of(limit.messages, &claimed, self.jobs.len()),
            Instant::now(),
        );
        let lease_ends = started + config.lease;
        let jobs = &self.jobs;
        let outcomes = &self.outcomes;
        let sent = dispatch(
            shared,
            token,
            claimed,
            lease_ends,
            |job| jobs.send(job).is_ok(),
            |outcome| outcomes.send(outcome).is_ok(),
        );
        if sent.is_none() {
            return;
        }
        self.signals.set_short(count < limit.messages);
        if count > 0 {
            log::debug!("outbox: claimed {count} messages under {token}");
            // More may be due right behind these, or be locked for a moment by another
            // worker's claim: look again soon, not a whole poll interval later.
            self.follow_ups = &FOLLOW_UPS_MS;
        }
        if count == limit.messages {
            return;
        }
        let timeout = self
            .follow_ups
            .first()
            .map(|ms| Duration::from_millis(*ms))
            .unwrap_or(config.poll_interval);
        crossbeam_channel::select! {
            recv(self.wake) -> _ => self.follow_ups = &FOLLOW_UPS_MS,
            // A settled message may have been the head of its ordering key: the next one of
            // that key is claimable now, not at the next poll.
            recv(self.capacity) -> _ => self.follow_ups = &[],
            default(timeout) => self.follow_ups = self.follow_ups.get(1..).unwrap_or(&[]),
        }
    }
}

/// What the claimer tells the acker: that it stopped claiming for good (the worker is
/// stopping), and whether its last claim found fewer messages than it could take (what is
/// claimable is scarce: a few ordering keys, each behind its head, so settlements lease the
/// next message of their keys themselves instead of leaving it to the next claim).
#[derive(Debug, Default)]
pub(crate) struct ClaimSignals {
    done: AtomicBool,
    short: AtomicBool,
}

impl ClaimSignals {
    /// The claimer stopped claiming for good.
    pub fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
    }

    /// Whether the claimer stopped claiming for good.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Records whether the last claim came back short.
    pub fn set_short(&self, short: bool) {
        self.short.store(short, Ordering::Relaxed);
    }

    /// Whether the last claim came back short.
    pub fn is_short(&self) -> bool {
        self.short.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::RetryPolicy;

    fn config(batch_size: usize, handler_threads: usize, max_bytes: usize) -> Config {
        Config {
            handler_threads,
            batch_size,
            max_batch_size: batch_size,
            lease: Duration::from_secs(60),
            heartbeat: Duration::from_secs(20),
            handler_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            listen: true,
            retry_policy: RetryPolicy::default(),
            unknown_type_grace: Duration::from_secs(900),
            max_in_flight: 2 * batch_size + handler_threads,
            max_in_flight_bytes: max_bytes,
            backlog_interval: Duration::from_secs(15),
            max_deferral: None,
        }
    }

    #[test]
    fn claims_only_full_batches_within_the_message_cap() {
        let config = config(64, 16, usize::MAX);
        assert_eq!(
            plan_claim(&config, 64, two_claims(&config, 64), 0, 0).map(|l| l.messages),
            Some(64)
        );
        assert!(
            plan_claim(&config, 64, two_claims(&config, 64), 80, 0).is_some(),
            "144 - 80 = 64 free"
        );
        assert!(
            plan_claim(&config, 64, two_claims(&config, 64), 81, 0).is_none(),
            "63 free: wait"
        );
        assert!(plan_claim(&config, 64, two_claims(&config, 64), 1000, 0).is_none());
    }

    /// What the worker may hold at claims of `size`, outside a raised message's while.
    fn two_claims(config: &Config, size: usize) -> usize {
        2 * size + config.handler_threads
    }

    /// A claim of `taken` ordinary messages out of `asked`, `queued` still waiting.
    fn ordinary(asked: usize, taken: usize, queued: usize) -> Claimed {
        Claimed {
            asked,
            taken,
            raised: 0,
            queued,
        }
    }

    #[test]
    fn claims_grow_while_the_handlers_keep_up_and_shrink_when_they_do_not() {
        let now = Instant::now();
        let mut config = config(64, 16, usize::MAX);
        config.max_batch_size = 256;
        config.max_in_flight = 2 * 256 + 16;
        let mut size = ClaimSize::new(&config);
        assert_eq!(size.get(), 64);
        // The first full claim: the handlers were idle because nothing had been claimed yet.
        size.claimed(ordinary(64, 64, 0), now);
        assert_eq!(size.get(), 64);
        // Full claims after full ones that find the handlers idle: 128, 256, and no further.
        for expected in [128, 256, 256] {
            size.claimed(ordinary(size.get(), size.get(), 0), now);
            assert_eq!(size.get(), expected);
        }
        // Full, some still queued but less than a claim: kept.
        size.claimed(ordinary(256, 256, 100), now);
        assert_eq!(size.get(), 256);
        // A whole claim still waiting for the handlers: halved.
        size.claimed(ordinary(256, 256, 256), now);
        assert_eq!(size.get(), 128);
        // A short claim (the backlog is drained): halved, never below batch_size.
        for expected in [64, 64] {
            size.claimed(ordinary(size.get(), 3, 0), now);
            assert_eq!(size.get(), expected);
        }
        // A burst after a quiet spell starts again from the first full claim.
        size.claimed(ordinary(64, 64, 0), now);
        assert_eq!(size.get(), 64);
        size.claimed(ordinary(64, 64, 0), now);
        assert_eq!(size.get(), 128);
        // What the worker may hold follows the claim size, not the largest one.
        assert!(
            plan_claim(&config, 64, two_claims(&config, 64), 80, 0).is_some(),
            "144 - 80 = 64 free"
        );
        assert!(
            plan_claim(&config, 64, two_claims(&config, 64), 81, 0).is_none(),
            "63 free: wait"
        );
        assert!(
            plan_claim(&config, 256, two_claims(&config, 256), 272, 0).is_some(),
            "528 - 272 = 256"
        );
        assert!(plan_claim(&config, 256, two_claims(&config, 256), 273, 0).is_none());
    }

    #[test]
    fn a_raised_message_keeps_claims_small_for_a_while() {
        let mut config = config(64, 16, usize::MAX);
        config.max_batch_size = 256;
        config.max_in_flight = 2 * 256 + 16;
        let start = Instant::now();
        let mut size = ClaimSize::new(&config);
        for _ in 0..3 {
            size.claimed(ordinary(size.get(), size.get(), 0), start);
        }
        assert_eq!(size.get(), 256);
        let with_raised = Claimed {
            raised: 1,
            ..ordinary(256, 256, 0)
        };
        assert_eq!(size.held_at_most(&config, start), 528);
        size.claimed(with_raised, start);
        assert_eq!(size.get(), 64, "back to batch_size at once");
        // A claim of 64 as soon as 64 slots are free, not once the worker holds 144.
        let held_at_most = size.held_at_most(&config, start);
        assert_eq!(held_at_most, 528);
        assert!(plan_claim(&config, 64, held_at_most, 464, 0).is_some());
        assert!(plan_claim(&config, 64, held_at_most, 465, 0).is_none());
        let within = start + SMALL_CLAIMS_AFTER_RAISED - Duration::from_millis(1);
        for _ in 0..4 {
            size.claimed(ordinary(64, 64, 0), within);
        }
        assert_eq!(size.get(), 64, "kept small however the handlers keep up");
        let after = start + SMALL_CLAIMS_AFTER_RAISED;
        assert_eq!(
            size.held_at_most(&config, after),
            144,
            "two claims of 64 again"
        );
        size.claimed(ordinary(64, 64, 0), after);
        assert_eq!(size.get(), 128, "growing again once it has passed");
        // Each raised message starts the while again.
        size.claimed(with_raised, after);
        size.claimed(ordinary(64, 64, 0), after + Duration::from_millis(500));
        assert_eq!(size.get(), 64);
    }

    #[test]
    fn a_fixed_size_never_grows() {
        let now = Instant::now();
        let config = config(64, 16, usize::MAX);
        let mut size = ClaimSize::new(&config);
        for _ in 0..5 {
            size.claimed(ordinary(64, 64, 0), now);
        }
        assert_eq!(size.get(), 64);
    }

    #[test]
    fn claims_stop_at_the_byte_cap_and_an_empty_worker_may_take_one_oversized_message() {
        let config = config(64, 16, 32 << 20);
        let empty = plan_claim(&config, 64, two_claims(&config, 64), 0, 0).unwrap();
        assert_eq!((empty.bytes, empty.oversized_alone), (32 << 20, true));
        let busy = plan_claim(&config, 64, two_claims(&config, 64), 3, 12 << 20).unwrap();
        assert_eq!((busy.bytes, busy.oversized_alone), (20 << 20, false));
        assert!(plan_claim(&config, 64, two_claims(&config, 64), 8, 32 << 20).is_none());
        assert!(
            plan_claim(&config, 64, two_claims(&config, 64), 8, 40 << 20).is_none(),
            "one oversized message held"
        );
        // Held at most: the cap, or one message larger than it alone.
        let mut held_bytes = 0usize;
        let mut held = 0;
        while let Some(limit) = plan_claim(&config, 64, two_claims(&config, 64), held, held_bytes) {
            let taken = limit.take(std::iter::repeat(4 << 20));
            assert!(taken > 0, "{limit:?}");
            held += taken;
            held_bytes += taken * (4 << 20);
        }
        assert!(held_bytes <= 32 << 20, "{held_bytes}");
    }
}
