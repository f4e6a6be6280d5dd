//! The handler pool: threads that take claimed messages, run their handlers, and pass the
//! outcomes to the acker; and the decision of what a finished attempt means for its message.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Sender;

use crate::context::{Context, SettleWithin, Settlements};
use crate::destination::pace::LONGEST_PACING_WAIT;
use crate::destination::{
    Delivery, Envelope, Exchanges, Registered, Sent, DESTINATION_TARGET_PREFIX,
};
use crate::error::{FailureKind, ProcessError};
use crate::registry::{is_json, DispatchError};
use crate::retry::RetryPolicy;
use crate::store::{ClaimedMessage, Exchange, Outcome, SettleTarget, Settlement};
use crate::subscription::SUBSCRIBERS;

use super::held::JobId;
use super::jobs::{Job, JobReceiver};
use super::shared::{panic_text, Shared};
use super::text::storable;
use super::timing::{
    CHAIN_SLICE, MAX_DURATION, MIN_DEFAULT_DEFERRAL, PANIC_RETRY_DELAY, START_MARGIN,
};

/// How one attempt at a message went.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// The handler succeeded.
    Succeeded,
    /// The handler failed.
    Failed(ProcessError),
    /// The payload does not deserialize into the handler's struct.
    Undeserializable(String),
    /// The handler panicked.
    Panicked(String),
    /// The handler ran past its timeout.
    TimedOut(Duration),
    /// A handler thread of this worker is still stuck in an earlier attempt.
    StillStuck,
}

/// How long a deferred message waits when its handler says nothing (or zero): it must not be
/// claimed again at once, over and over.
const DEFERRED_WITHOUT_DELAY: Duration = Duration::from_secs(1);

/// The least a deferral that names a delay waits, for the same reason. Shorter than a second:
/// a paced destination defers messages to turns a fraction of a second apart (nearer ones are
/// waited for in the handler thread), and a deferral stretched to a second would bring a
/// second's worth of them back at once, to be deferred again.
const SHORTEST_DEFERRAL: Duration = LONGEST_PACING_WAIT;

/// What a finished attempt means for its message: the settlement, given the message's retry
/// policy. Pure, so that the settlement policy is tested without threads or a store.
pub(crate) fn settle_attempt(n: u32, attempt: Attempt, policy: &RetryPolicy) -> Settlement {
    let (error, retry_after) = match attempt {
        Attempt::Succeeded => return Settlement::Done,
        Attempt::Undeserializable(reason) => {
            return Settlement::DeadLetter {
                error: storable(reason),
            }
        }
        Attempt::Failed(failure) if failure.kind() == FailureKind::Deferred => {
            return Settlement::Defer {
                delay: match failure.retry_after() {
                    Some(delay) if !delay.is_zero() => delay.clamp(SHORTEST_DEFERRAL, MAX_DURATION),
                    _ => DEFERRED_WITHOUT_DELAY,
                },
                reason: storable(failure.reason().to_owned()),
            };
        }
        Attempt::Failed(failure) if failure.kind() == FailureKind::Paused => {
            return Settlement::Pause {
                reason: storable(failure.reason().to_owned()),
            };
        }
        Attempt::Failed(failure) if failure.kind() == FailureKind::Permanent => {
            return Settlement::DeadLetter {
                error: storable(format!(
                    "failed permanently on attempt {n}: {}",
                    failure.reason()
                )),
            };
        }
        Attempt::Failed(failure) => (failure.reason().to_owned(), failure.retry_after()),
        Attempt::Panicked(text) => (format!("the handler panicked: {text}"), None),
        Attempt::TimedOut(timeout) => (
            format!(
                "the handler did not finish within its timeout of {timeout:?}; its thread was \
                 replaced (raise handler_timeout if the handler needs longer)"
            ),
            None,
        ),
        Attempt::StillStuck => (
            "a handler thread of this worker is still stuck in an earlier attempt of this \
             message; counted as timed out again"
                .to_owned(),
            None,
        ),
    };
    if !policy.allows_retry_after(n) {
        return Settlement::DeadLetter {
            error: storable(format!("gave up after {n} attempts: {error}")),
        };
    }
    Settlement::Retry {
        delay: policy.delay(n, retry_after).min(MAX_DURATION),
        error: storable(error),
    }
}

/// A deferral of a message waiting since `waiting_since` becomes a dead letter once `horizon`
/// has passed since: a destination that stays paused or holding does not keep its messages
/// forever. A message waits from its enqueue, or from the end of the last operator's pause that
/// held it ([`waiting_since`]): a pause, however long, never counts.
pub(crate) fn bound_deferral(
    settlement: Settlement,
    waiting_since: SystemTime,
    horizon: Duration,
    now: SystemTime,
) -> Settlement {
    match settlement {
        Settlement::Defer { reason, .. }
            if now.duration_since(waiting_since).unwrap_or(Duration::ZERO) >= horizon =>
        {
            Settlement::DeadLetter {
                error: storable(format!(
                    "deferred for longer than {horizon:?} since it was enqueued or last resumed \
                     (the longest a message waits without spending attempts): {reason}"
                )),
            }
        }
        other => other,
    }
}

/// Since when `message` has waited, as the deferral bound counts: its enqueue, or the end of
/// the last operator's pause that held it, whichever is later.
pub(crate) fn waiting_since(message: &ClaimedMessage) -> SystemTime {
    message.resumed_at.map_or(message.enqueued_at, |resumed| {
        resumed.max(message.enqueued_at)
    })
}

/// What to do with a message no handler of this worker serves: give it back for later while
/// it is younger than `grace` (a newer worker may know its type), then dead-letter it.
pub(crate) fn settle_unknown_type(
    message: &ClaimedMessage,
    known: &[&str],
    grace: Duration,
    now: SystemTime,
) -> Settlement {
    let age = now
        .duration_since(message.enqueued_at)
        .unwrap_or(Duration::ZERO);
    let reason = format!(
        "no handler is registered for message type `{}` in this worker (it handles {known:?})",
        message.message_type
    );
    if age >= grace {
        return Settlement::DeadLetter {
            error: storable(format!(
                "{reason}, and none took it within {grace:?} of its enqueue; deploy a handler \
                 for it, then re-queue this dead letter"
            )),
        };
    }
    // Soon at first (the deploy may be finishing), then once a minute, never past the grace.
    let delay = (age / 4)
        .clamp(Duration::from_secs(1), Duration::from_secs(60))
        .min(grace - age)
        .max(Duration::from_millis(100));
    Settlement::Defer {
        delay,
        reason: storable(format!(
            "{reason}; given back until a worker that knows it takes it"
        )),
    }
}

/// The policy of `message_type`'s handler, or the worker's: also when asking the handler's
/// panics, since those who ask (the watchdog, the claimer, a panic's settlement) hold an attempt
/// that must get its outcome.
pub(crate) fn policy_for(shared: &Shared, message_type: &str) -> RetryPolicy {
    let Some(registration) = shared.registry.get(message_type) else {
        return shared.config.retry_policy.clone();
    };
    match catch_unwind(AssertUnwindSafe(|| registration.retry_policy())) {
        Ok(policy) => policy.unwrap_or_else(|| shared.config.retry_policy.clone()),
        Err(panic) => {
            shared.vitals.panicked();
            log::error!(
                "outbox: the retry policy of message type `{message_type}` ({}) panicked: {}; \
                 the worker's policy judges this attempt",
                registration.handler_name(),
                panic_text(panic.as_ref())
            );
            shared.config.retry_policy.clone()
        }
    }
}

/// A running job's way to settle its message inside the handler's transaction, under the claim
/// that holds it at that moment.
struct JobSettle<'a> {
    shared: &'a Shared,
    position: i64,
    job: JobId,
    ordering_key: Option<&'a str>,
}

impl SettleWithin for JobSettle<'_> {
    fn target(&self) -> Result<SettleTarget<'_>, ProcessError> {
        let token = self
            .shared
            .held
            .token(self.position, self.job)
            .ok_or_else(|| {
                ProcessError::retryable(
                    "the worker gave up on this attempt (it ran past handler_timeout), so it \
                     settles nothing; a later attempt does the work",
                )
            })?;
        Ok(SettleTarget {
            token,
            position: self.position,
            ordering_key: self.ordering_key,
        })
    }

    fn settlements(&self) -> &Settlements {
        &self.shared.pool.settlements
    }
}

/// Runs one message's handler and decides its settlement. The payload is taken out of the
/// message: the handler's struct replaces it while the handler runs.
/// The exchanges with destinations it makes go to `exchanges`, for the delivery log.
pub(crate) fn process(
    shared: &Shared,
    message: &mut ClaimedMessage,
    job: JobId,
    exchanges: &Exchanges,
) -> Settlement {
    // Before anything else: an operator's pause keeps a message of any type, known or not,
    // from being handled or dead-lettered.
    if let Some(reason) = shared.pool.type_pauses.reason(&message.message_type) {
        return Settlement::Pause {
            reason: storable(format!(
                "not processed: message type `{}` is paused by an operator ({reason}); it waits \
                 until resumed (`outbox resume {}`, or the admin pages)",
                message.message_type, message.message_type
            )),
        };
    }
    if let Some(target) = message.subscription_id.clone() {
        // A delivery to a subscription, or a replay to a destination: whatever worker enqueued
        // the message, it goes to its target as it is, without the type's handler.
        let policy = policy_for(shared, &message.message_type);
        if let Some(lost) = lost_each_time(message, &policy) {
            return lost;
        }
        let attempt = match target.strip_prefix(DESTINATION_TARGET_PREFIX) {
            Some(name) => deliver_to_destination(shared, message, name, exchanges),
            None => deliver_to_subscription(shared, message, &target, exchanges),
        };
        return judge(shared, message, attempt, &policy);
    }
    let Some(registration) = shared.registry.get(&message.message_type) else {
        return settle_unknown_type(
            message,
            &shared.registry.message_types(),
            shared.config.unknown_type_grace,
            SystemTime::now(),
        );
    };
    let policy = registration
        .retry_policy()
        .unwrap_or_else(|| shared.config.retry_policy.clone());
    if let Some(lost) = lost_each_time(message, &policy) {
        return lost;
    }
    if registration.destination() == Some(SUBSCRIBERS) {
        let attempt = fan_out(shared, message, job);
        return judge(shared, message, attempt, &policy);
    }
    let delivery = delivery_of(message);
    let payload = std::mem::take(&mut message.payload);
    let settle = JobSettle {
        shared,
        position: message.position,
        job,
        ordering_key: message.ordering_key.as_deref(),
    };
    let mut ctx = Context::in_worker(
        &delivery,
        &shared.pool.resources,
        &shared.destinations,
        exchanges,
        &settle,
    );
    // Spans the handler starts are children of the one that enqueued the message.
    #[cfg(feature = "opentelemetry")]
    let _trace = message
        .headers
        .remote_trace_context()
        .map(opentelemetry::Context::attach);
    let started = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| {
        registration.dispatch(payload, &mut ctx)
    }));
    crate::metrics::attempt_duration(&message.message_type, started.elapsed());
    if ctx.was_settled_within() && !matches!(result, Ok(Ok(()))) {
        // The message left the outbox with the handler's transaction: what failed after the
        // commit cannot undo it.
        log::warn!(
            "outbox: message {} ({}) was settled in its handler's transaction, but the handler \
             then failed; the attempt counts as succeeded",
            message.message_id,
            message.message_type
        );
        return Settlement::Done;
    }
    let attempt = match result {
        Ok(Ok(())) => {
            log::debug!(
                "outbox: message {} ({}) attempt {} processed in {:?}",
                message.message_id,
                message.message_type,
                message.attempt,
                started.elapsed()
            );
            Attempt::Succeeded
        }
        Ok(Err(error @ (DispatchError::Deserialize { .. } | DispatchError::NotJson { .. }))) => {
            Attempt::Undeserializable(error.to_string())
        }
        Ok(Err(DispatchError::Process(failure))) => Attempt::Failed(failure),
        Err(panic) => Attempt::Panicked(panic_text(panic.as_ref())),
    };
    judge(shared, message, attempt, &policy)
}

/// The dead letter of a message whose every earlier attempt ended without an outcome: each
/// time, the worker holding it died (an abort, a crash in native code, the OOM killer). Do not
/// let it take down one more.
fn lost_each_time(message: &ClaimedMessage, policy: &RetryPolicy) -> Option<Settlement> {
    (message.attempt > policy.attempts()).then(|| Settlement::DeadLetter {
        error: storable(format!(
            "gave up after {} attempts: the worker processing it was lost each time (a crash or \
             abort in the handler?)",
            message.attempt - 1
        )),
    })
}

/// What `attempt` means for `message` under `policy`: its settlement, a deferral bounded by
/// `max_deferral` unless it waits for a turn of its destination's pace.
fn judge(
    shared: &Shared,
    message: &ClaimedMessage,
    attempt: Attempt,
    policy: &RetryPolicy,
) -> Settlement {
    // A turn of the destination's pace is progress at the destination's own rate, however
    // far: only waiting for a destination that takes nothing is bounded.
    let paced = matches!(&attempt, Attempt::Failed(failure) if failure.is_paced());
    let settlement = settle_attempt(message.attempt, attempt, policy);
    if paced {
        return settlement;
    }
    let horizon = shared
        .config
        .max_deferral
        .unwrap_or_else(|| policy.horizon().max(MIN_DEFAULT_DEFERRAL));
    bound_deferral(
        settlement,
        waiting_since(message),
        horizon,
        SystemTime::now(),
    )
}

/// Fans the event `message` out to its subscribers, removing it in the same transaction (see
/// [`crate::subscription`]).
fn fan_out(shared: &Shared, message: &ClaimedMessage, job: JobId) -> Attempt {
    let Some(token) = shared.held.token(message.position, job) else {
        return Attempt::Failed(ProcessError::retryable(
            "the worker gave up on this attempt (it ran past handler_timeout), so it fans out \
             nothing; a later attempt does",
        ));
    };
    let target = SettleTarget {
        token,
        position: message.position,
        ordering_key: message.ordering_key.as_deref(),
    };
    match shared.store.fan_out(&target) {
        Ok(Some(deliveries)) => {
            log::debug!(
                "outbox: event {} ({}) fanned out to {deliveries} subscriptions",
                message.message_id,
                message.message_type
            );
            Attempt::Succeeded
        }
        Ok(None) => Attempt::Failed(ProcessError::retryable(
            "the lease on this event passed to another claim before its fan-out; the claim that \
             holds it now fans it out",
        )),
        Err(error) => Attempt::Failed(ProcessError::retryable(format!(
            "fanning the event out to its subscribers failed (nothing was written): {error}"
        ))),
    }
}

/// How long a delivery waits for a subscription this worker cannot deliver to yet.
const UNKNOWN_SUBSCRIPTION_WAIT: Duration = Duration::from_secs(5);

/// Delivers `message`, a delivery for subscription `id`, through the subscription's
/// destination: its health gate, pace and metrics.
fn deliver_to_subscription(
    shared: &Shared,
    message: &mut ClaimedMessage,
    id: &str,
    exchanges: &Exchanges,
) -> Attempt {
    let Some(subscribers) = &shared.subscribers else {
        return Attempt::Failed(ProcessError::defer(
            format!(
                "not sent: a delivery for subscription {id}, and this worker delivers to no \
                 subscriptions (WorkerBuilder::subscriptions); a worker that does takes it"
            ),
            UNKNOWN_SUBSCRIPTION_WAIT,
        ));
    };
    let asked = Instant::now();
    let known = match subscribers.get_or_read(id, shared.store.as_ref()) {
        Ok(Some(known)) => known,
        Ok(None) => match subscribers.removed_since(id, shared.store.as_ref(), asked) {
            // Its subscription is gone: a delivery a worker held as it was removed (a removal
            // deletes only the deliveries no worker holds), a re-queued dead letter, or one a
            // fan-out committed as the removal ran. Dead-lettered, for the record, rather than
            // deferred for good.
            Ok(true) => {
                return Attempt::Failed(ProcessError::permanent(format!(
                    "not sent: subscription {id} no longer exists (removed)"
                )))
            }
            Ok(false) => match subscribers.get(id) {
                Some(known) => known,
                None => {
                    return Attempt::Failed(ProcessError::defer(
                        format!(
                            "not sent: subscription {id} is new to this worker; it is read again"
                        ),
                        UNKNOWN_SUBSCRIPTION_WAIT,
                    ))
                }
            },
            Err(error) => {
                return Attempt::Failed(ProcessError::defer(
                    format!("not sent: reading subscription {id} failed: {error}"),
                    UNKNOWN_SUBSCRIPTION_WAIT,
                ))
            }
        },
        Err(error) => {
            return Attempt::Failed(ProcessError::defer(
                format!("not sent: reading subscription {id} failed: {error}"),
                UNKNOWN_SUBSCRIPTION_WAIT,
            ))
        }
    };
    if !known.subscription.enabled {
        return Attempt::Failed(ProcessError::paused(format!(
            "not sent: subscription {id} is disabled; its deliveries wait until it is enabled \
             again"
        )));
    }
    let destination = match &known.destination {
        Ok(destination) => destination,
        Err(problem) => {
            return Attempt::Failed(ProcessError::defer(
                format!("not sent: subscription {id} cannot be delivered to: {problem}"),
                UNKNOWN_SUBSCRIPTION_WAIT,
            ))
        }
    };
    send_as_stored(message, destination, exchanges)
}

/// Delivers `message`, a replay or a resend to destination `name`, through that destination:
/// its health gate, pace and metrics.
fn deliver_to_destination(
    shared: &Shared,
    message: &mut ClaimedMessage,
    name: &str,
    exchanges: &Exchanges,
) -> Attempt {
    let Some(destination) = shared.destinations.get(name) else {
        let known: Vec<&str> = shared.destinations.names().collect();
        return Attempt::Failed(ProcessError::defer(
            format!(
                "not sent: a replay to destination {name}, which this worker does not have (it \
                 has {known:?}); a worker that has it takes it"
            ),
            UNKNOWN_SUBSCRIPTION_WAIT,
        ));
    };
    send_as_stored(message, destination, exchanges)
}

/// The facts of `message` a handler and a destination see.
fn delivery_of(message: &ClaimedMessage) -> Delivery {
    Delivery {
        message_id: message.message_id,
        message_type: message.message_type.clone(),
        attempt: message.attempt,
        headers: message.headers.clone(),
        ordering_key: message.ordering_key.clone(),
        priority: message.priority,
    }
}

/// The envelope of `message` with its payload as it is stored, taken out of the message.
fn stored_envelope(message: &mut ClaimedMessage) -> Envelope {
    let body = std::mem::take(&mut message.payload).into_bytes();
    delivery_of(message).envelope(body)
}

/// Sends `message`'s payload as it is stored to `destination`.
fn send_as_stored(
    message: &mut ClaimedMessage,
    destination: &Registered,
    exchanges: &Exchanges,
) -> Attempt {
    let envelope = stored_envelope(message);
    let started = Instant::now();
    let sent = destination.send(&envelope, Some(exchanges));
    crate::metrics::attempt_duration(&message.message_type, started.elapsed());
    match sent {
        Ok(()) => Attempt::Succeeded,
        Err(failure) => Attempt::Failed(failure),
    }
}

/// The settlement of a message whose processing panicked outside its handler (in its
/// handler's own `retry_policy()`, say): retried after a fixed delay, within the attempts of
/// the handler's policy (the worker's, if asking the handler's panics again).
fn panicked_outside(shared: &Shared, message: &ClaimedMessage, text: &str) -> Settlement {
    let policy = policy_for(shared, &message.message_type);
    if policy.allows_retry_after(message.attempt) {
        Settlement::Retry {
            delay: PANIC_RETRY_DELAY,
            error: storable(format!("the worker panicked while processing it: {text}")),
        }
    } else {
        Settlement::DeadLetter {
            error: storable(format!(
                "gave up after {} attempts: the worker panicked while processing it: {text}",
                message.attempt
            )),
        }
    }
}

/// Logs a settlement decided for a message, with the trace id of the request that enqueued it
/// (if it carried a `traceparent`) so the line can be joined to that trace.
pub(crate) fn log_settlement(
    message_id: &impl std::fmt::Display,
    message_type: &str,
    trace_id: Option<&str>,
    settlement: &Settlement,
) {
    let trace = trace_id
        .map(|id| format!(", trace {id}"))
        .unwrap_or_default();
    match settlement {
        Settlement::Retry { delay, error } => log::info!(
            "outbox: message {message_id} ({message_type}{trace}) failed, retrying in {delay:?}: \
             {error}"
        ),
        Settlement::DeadLetter { error } => log::warn!(
            "outbox: message {message_id} ({message_type}{trace}) dead-lettered: {error}"
        ),
        Settlement::Defer { delay, reason } => log::info!(
            "outbox: message {message_id} ({message_type}{trace}) given back for {delay:?}: \
             {reason}"
        ),
        Settlement::Pause { reason } => {
            log::debug!("outbox: message {message_id} ({message_type}{trace}) paused: {reason}")
        }
        Settlement::Done | Settlement::Release => {}
    }
}

/// Starts one handler thread. It counts as serving from here, before it first runs.
pub(crate) fn spawn(shared: &Arc<Shared>) -> std::io::Result<()> {
    let (thread, jobs, outcomes) = shared.pool.next();
    let owned = Arc::clone(shared);
    shared.vitals.handler_threads.fetch_add(1, Ordering::SeqCst);
    let spawned = shared
        .threads
        .spawn(format!("outbox-handler-{thread}"), move || {
            let _serving = Serving(&owned.vitals.handler_threads);
            run(&owned, &jobs, &outcomes, thread)
        });
    if spawned.is_err() {
        shared.vitals.handler_threads.fetch_sub(1, Ordering::SeqCst);
    }
    spawned
}

/// Counts a handler thread out of the worker's health when it ends, however it ends.
struct Serving<'a>(&'a AtomicUsize);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn run(shared: &Shared, jobs: &JobReceiver, outcomes: &Sender<Outcome>, thread: usize) {
    let exchanges = Exchanges::default();
    while let Some(first) = jobs.recv() {
        let target = batch_target(shared, &first.message)
            .filter(|_| first.chain.is_empty() && !shared.stopping());
        let going_on = match target {
            Some((target, policy)) => {
                let (batch, elsewhere) = gather(shared, jobs, (first, policy), &target);
                run_batch(shared, &target, batch, elsewhere, outcomes, thread)
            }
            None => run_chain(shared, first, jobs, &exchanges, outcomes, thread),
        };
        if !going_on {
            return;
        }
        if shared.pool.is_retired(thread) {
            log::info!("outbox: handler thread {thread} returned from its stuck handler and ends");
            return;
        }
    }
}

/// Runs a job, then the messages of its ordering key chained behind it, in order, each only
/// once the one before it succeeded: at the first that did not, the rest go back to the store,
/// the attempt not counted, and run in their turn after it; so they do when other jobs have
/// waited for a thread long enough (see [`CHAIN_SLICE`]). `false` once the acker is gone.
fn run_chain(
    shared: &Shared,
    Job {
        job,
        message,
        chain,
    }: Job,
    jobs: &JobReceiver,
    exchanges: &Exchanges,
    outcomes: &Sender<Outcome>,
    thread: usize,
) -> bool {
    let started = Instant::now();
    let mut rest = ChainRest {
        shared,
        outcomes,
        jobs: chain.into_iter(),
    };
    let mut ran = run_one(shared, job, message, exchanges, outcomes, thread);
    while ran == Ran::Succeeded && !jobs.should_yield(started.elapsed() >= CHAIN_SLICE) {
        let Some(next) = rest.jobs.next() else {
            break;
        };
        ran = run_one(shared, next.job, next.message, exchanges, outcomes, thread);
    }
    ran != Ran::AckerGone && rest.give_back()
}

/// The messages of a chain not run yet: given back to the store, the attempt not counted,
/// whatever ends the chain, also a panic (an application's logger) on its thread.
struct ChainRest<'a> {
    shared: &'a Shared,
    outcomes: &'a Sender<Outcome>,
    jobs: std::vec::IntoIter<Job>,
}

impl ChainRest<'_> {
    /// Gives the rest back; `false` once the acker is gone. A message the watchdog or the
    /// heartbeat gave back already (with the one before it) is not held any more, and nothing
    /// is sent for it.
    fn give_back(&mut self) -> bool {
        self.jobs.by_ref().all(|Job { job, message, .. }| {
            let handed = send_outcome(
                self.shared,
                job,
                &message,
                &Settlement::Release,
                Vec::new(),
                self.outcomes,
            );
            handed != Handed::AckerGone
        })
    }
}

impl Drop for ChainRest<'_> {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// How a job ran, for the chain behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ran {
    /// It succeeded and its outcome is on its way.
    Succeeded,
    /// It did not run, or did not succeed, or its outcome was dropped.
    NotSucceeded,
    /// The acker is gone: the worker is stopping.
    AckerGone,
}

/// Runs one job.
fn run_one(
    shared: &Shared,
    job: JobId,
    mut message: ClaimedMessage,
    exchanges: &Exchanges,
    outcomes: &Sender<Outcome>,
    thread: usize,
) -> Ran {
    let now = Instant::now();
    let Some(lease_ends) = shared.held.start(message.position, job, thread, now) else {
        return Ran::NotSucceeded;
    };
    // Whatever happens in here, the message gets an outcome: a panic outside the handler's
    // own (a handler's `retry_policy()`, say) is a failed attempt too.
    let settlement = match release(shared, &message, lease_ends, now) {
        Some(release) => release,
        None => catch_unwind(AssertUnwindSafe(|| {
            process(shared, &mut message, job, exchanges)
        }))
        .unwrap_or_else(|panic| {
            shared.vitals.panicked();
            let text = panic_text(panic.as_ref());
            log::error!(
                "outbox: processing message {} ({}) panicked outside its handler: {text}",
                message.message_id,
                message.message_type
            );
            panicked_outside(shared, &message, &text)
        }),
    };
    // Taken whatever becomes of the outcome: they are this attempt's alone.
    let exchanged = exchanges.take();
    let succeeded = settlement == Settlement::Done;
    let handed = send_outcome(shared, job, &message, &settlement, exchanged, outcomes);
    if !log_handed(&message, &settlement, handed) {
        Ran::AckerGone
    } else if succeeded && handed == Handed::Sent {
        Ran::Succeeded
    } else {
        Ran::NotSucceeded
    }
}

/// A message that is given back instead of run: the worker stops, or its lease ends before it
/// could run.
fn release(
    shared: &Shared,
    message: &ClaimedMessage,
    lease_ends: Instant,
    now: Instant,
) -> Option<Settlement> {
    if shared.stopping() {
        return Some(Settlement::Release);
    }
    if lease_ends < now + START_MARGIN {
        log::warn!(
            "outbox: the lease on message {} ({}) ran out before a handler thread took it; \
             giving it back",
            message.message_id,
            message.message_type
        );
        return Some(Settlement::Release);
    }
    None
}

/// Hands the outcome of `job` to the acker, then logs it; `false` once the acker is gone.
fn hand_over(
    shared: &Shared,
    job: JobId,
    message: &ClaimedMessage,
    settlement: Settlement,
    exchanged: Vec<Exchange>,
    outcomes: &Sender<Outcome>,
) -> bool {
    // The outcome is on its way before anything is logged: the application's logger may
    // panic, and a thread that ends here leaves its message held.
    let handed = send_outcome(shared, job, message, &settlement, exchanged, outcomes);
    log_handed(message, &settlement, handed)
}

/// Where an outcome went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handed {
    /// To the acker.
    Sent,
    /// Nowhere: the watchdog had counted the attempt timed out, and settled that.
    Dropped,
    /// Nowhere: the acker is gone (the worker is stopping).
    AckerGone,
}

fn send_outcome(
    shared: &Shared,
    job: JobId,
    message: &ClaimedMessage,
    settlement: &Settlement,
    mut exchanged: Vec<Exchange>,
    outcomes: &Sender<Outcome>,
) -> Handed {
    for exchange in &mut exchanged {
        exchange.error = exchange.error.take().map(storable);
    }
    let Some(token) = shared.held.finish(message.position, job) else {
        return Handed::Dropped;
    };
    let outcome = Outcome::of(token, message, settlement.clone()).logging(message, exchanged);
    match outcomes.send(outcome) {
        Ok(()) => Handed::Sent,
        Err(_) => Handed::AckerGone,
    }
}

/// Logs an outcome handed over; `false` once the acker is gone.
fn log_handed(message: &ClaimedMessage, settlement: &Settlement, handed: Handed) -> bool {
    log_settlement(
        &message.message_id,
        &message.message_type,
        message.headers.trace_id(),
        settlement,
    );
    if handed == Handed::Dropped {
        log::warn!(
            "outbox: message {} ({}) finished after the watchdog had counted it timed out; its \
             outcome ({settlement:?}) is dropped",
            message.message_id,
            message.message_type
        );
    }
    handed != Handed::AckerGone
}

/// The destination a message goes to as it is stored, when that destination takes batches.
enum Target<'a> {
    /// One of the worker's destinations: a routed type's, or a replay's.
    Named(&'a Registered),
    /// A subscription's, kept while the batch runs even if the subscription changes.
    Subscription(Arc<Registered>),
}

impl Target<'_> {
    fn registered(&self) -> &Registered {
        match self {
            Target::Named(registered) => registered,
            Target::Subscription(registered) => registered,
        }
    }

    fn is(&self, other: &Target<'_>) -> bool {
        std::ptr::eq(self.registered(), other.registered())
    }
}

/// Where `message` goes in a batch, with its retry policy: only a message sent as it is stored
/// (a routed type, a delivery to a subscription, a replay) to a destination that takes batches
/// now, and only when nothing would keep it from being sent (a paused type, a disabled
/// subscription, a payload that is not JSON); the one-message path says why for the rest.
fn batch_target<'a>(
    shared: &'a Shared,
    message: &ClaimedMessage,
) -> Option<(Target<'a>, RetryPolicy)> {
    let target = match &message.subscription_id {
        Some(target) => match target.strip_prefix(DESTINATION_TARGET_PREFIX) {
            Some(name) => Target::Named(shared.destinations.get(name)?),
            None => {
                let known = shared.subscribers.as_ref()?.get(target)?;
                if !known.subscription.enabled {
                    return None;
                }
                Target::Subscription(Arc::clone(known.destination.as_ref().ok()?))
            }
        },
        None => {
            let name = shared
                .registry
                .get(&message.message_type)?
                .destination()
                .filter(|name| *name != SUBSCRIBERS)?;
            Target::Named(shared.destinations.get(name)?)
        }
    };
    if target.registered().batch_limit() < 2
        || shared.pool.type_pauses.reason(&message.message_type).is_some()
        // A routed payload is JSON (a replay's or a delivery's was, when it was routed).
        || (message.subscription_id.is_none() && !is_json(&message.payload))
    {
        return None;
    }
    let policy = policy_for(shared, &message.message_type);
    if lost_each_time(message, &policy).is_some() {
        return None;
    }
    Some((target, policy))
}

/// `first` and the jobs waiting behind it for the same destination, up to its batch limit,
/// without waiting for more; and the first job taken that goes elsewhere, if one was.
fn gather(
    shared: &Shared,
    jobs: &JobReceiver,
    first: (Job, RetryPolicy),
    target: &Target<'_>,
) -> (Vec<(Job, RetryPolicy)>, Option<Job>) {
    let limit = target.registered().batch_limit();
    let mut batch = vec![first];
    while batch.len() < limit {
        let Some(job) = jobs.try_recv() else {
            break;
        };
        match batch_target(shared, &job.message) {
            Some((other, policy)) if other.is(target) && job.chain.is_empty() => {
                batch.push((job, policy))
            }
            _ => return (batch, Some(job)),
        }
    }
    (batch, None)
}

/// Sends a batch of messages to `target` in one call, each settled by its own outcome; a job
/// taken for the batch that goes elsewhere is given back to the store at once, without an
/// attempt, rather than wait behind the batch on this thread. `false` once the acker is gone.
fn run_batch(
    shared: &Shared,
    target: &Target<'_>,
    batch: Vec<(Job, RetryPolicy)>,
    elsewhere: Option<Job>,
    outcomes: &Sender<Outcome>,
    thread: usize,
) -> bool {
    if let Some(Job {
        job,
        message,
        chain,
    }) = elsewhere
    {
        // A chain too: it would wait behind the batch on a thread the watchdog may give up on,
        // where nothing watches the messages it holds.
        let mut rest = ChainRest {
            shared,
            outcomes,
            jobs: chain.into_iter(),
        };
        if !hand_over(
            shared,
            job,
            &message,
            Settlement::Release,
            Vec::new(),
            outcomes,
        ) || !rest.give_back()
        {
            return false;
        }
    }
    let now = Instant::now();
    let mut settled = Vec::with_capacity(batch.len());
    let mut running = Vec::with_capacity(batch.len());
    for (Job { job, message, .. }, policy) in batch {
        let Some(lease_ends) = shared.held.start(message.position, job, thread, now) else {
            continue;
        };
        if shared.stopping() || lease_ends < now + START_MARGIN {
            settled.push((job, message, Settlement::Release, Vec::new()));
        } else {
            running.push((job, message, policy));
        }
    }
    let given_back = settled.len();
    let mut took = Duration::ZERO;
    if !running.is_empty() {
        let envelopes = running
            .iter_mut()
            .map(|(_, message, _)| stored_envelope(message))
            .collect();
        let started = Instant::now();
        // The destination's own panic is contained in `send_batch`; this one is the gate's.
        let sent = catch_unwind(AssertUnwindSafe(|| {
            target.registered().send_batch(envelopes)
        }));
        took = started.elapsed();
        let (mut sent, panicked): (Vec<Option<Sent>>, Option<String>) = match sent {
            Ok(sent) => (sent.into_iter().map(Some).collect(), None),
            Err(panic) => (Vec::new(), Some(panic_text(panic.as_ref()))),
        };
        // Every message gets an outcome, also one the batch left out.
        sent.resize_with(running.len(), || None);
        for ((job, message, policy), sent) in running.into_iter().zip(sent) {
            let (attempt, exchanged) = match sent {
                Some(Sent { result, exchange }) => (
                    match result {
                        Ok(()) => Attempt::Succeeded,
                        Err(failure) => Attempt::Failed(failure),
                    },
                    exchange.into_iter().collect(),
                ),
                None => (
                    Attempt::Panicked(panicked.clone().unwrap_or_default()),
                    Vec::new(),
                ),
            };
            let settlement = judge(shared, &message, attempt, &policy);
            settled.push((job, message, settlement, exchanged));
        }
    }
    // Every outcome is on its way before anything is logged or counted (see `hand_over`).
    let handed: Vec<Handed> = settled
        .iter_mut()
        .map(|(job, message, settlement, exchanged)| {
            send_outcome(
                shared,
                *job,
                message,
                settlement,
                std::mem::take(exchanged),
                outcomes,
            )
        })
        .collect();
    let mut going_on = true;
    for (n, ((_, message, settlement, _), handed)) in settled.iter().zip(handed).enumerate() {
        if n < given_back && !shared.stopping() {
            log::warn!(
                "outbox: the lease on message {} ({}) ran out before a handler thread took it; \
                 giving it back",
                message.message_id,
                message.message_type
            );
        }
        if n >= given_back {
            crate::metrics::attempt_duration(&message.message_type, took);
        }
        going_on &= log_handed(message, settlement, handed);
    }
    going_on
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message_id::MessageId;

    fn message(attempt: u32, age: Duration) -> ClaimedMessage {
        ClaimedMessage {
            position: 1,
            message_id: MessageId::new(),
            message_type: "order.placed".into(),
            payload: "{}".into(),
            ordering_key: None,
            attempt,
            enqueued_at: SystemTime::now() - age,
            resumed_at: None,
            headers: Default::default(),
            subscription_id: None,
            priority: Default::default(),
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy::new()
            .max_attempts(3)
            .initial_backoff(Duration::from_secs(1))
            .multiplier(2.0)
    }

    #[test]
    fn failures_retry_until_the_attempts_run_out_then_dead_letter() {
        let failed = || Attempt::Failed(ProcessError::retryable("503"));
        let first = settle_attempt(1, failed(), &policy());
        assert!(
            matches!(&first, Settlement::Retry { delay, error } if *delay >= Duration::from_millis(750) && error == "503"),
            "{first:?}"
        );
        let last = settle_attempt(3, failed(), &policy());
        assert_eq!(
            last,
            Settlement::DeadLetter {
                error: "gave up after 3 attempts: 503".into()
            }
        );
    }

    #[test]
    fn a_deferral_waits_without_counting_even_on_the_last_attempt() {
        let deferred = |delay| Attempt::Failed(ProcessError::defer("endpoint paused", delay));
        let last = settle_attempt(3, deferred(Duration::from_secs(30)), &policy());
        assert_eq!(
            last,
            Settlement::Defer {
                delay: Duration::from_secs(30),
                reason: "endpoint paused".into()
            }
        );
        let eager = settle_attempt(1, deferred(Duration::ZERO), &policy());
        assert!(
            matches!(eager, Settlement::Defer { delay, .. } if delay == Duration::from_secs(1))
        );
        let endless = settle_attempt(1, deferred(Duration::MAX), &policy());
        assert!(matches!(endless, Settlement::Defer { delay, .. } if delay == MAX_DURATION));
        // A paced destination's turns, a fraction of a second apart, are kept apart.
        let turn = settle_attempt(1, deferred(Duration::from_millis(300)), &policy());
        assert!(
            matches!(turn, Settlement::Defer { delay, .. } if delay == Duration::from_millis(300))
        );
        let tiny = settle_attempt(1, deferred(Duration::from_millis(1)), &policy());
        assert!(matches!(tiny, Settlement::Defer { delay, .. } if delay == SHORTEST_DEFERRAL));
    }

    #[test]
    fn permanent_failures_and_bad_payloads_dead_letter_at_once() {
        let permanent = settle_attempt(
            1,
            Attempt::Failed(ProcessError::permanent("410 Gone")),
            &policy(),
        );
        assert_eq!(
            permanent,
            Settlement::DeadLetter {
                error: "failed permanently on attempt 1: 410 Gone".into()
            }
        );
        let garbled = settle_attempt(
            1,
            Attempt::Undeserializable("missing field".into()),
            &policy(),
        );
        assert!(matches!(garbled, Settlement::DeadLetter { .. }));
    }

    #[test]
    fn panics_and_timeouts_are_failed_attempts() {
        for attempt in [
            Attempt::Panicked("boom".into()),
            Attempt::TimedOut(Duration::from_secs(30)),
            Attempt::StillStuck,
        ] {
            let settlement = settle_attempt(1, attempt, &policy());
            assert!(
                matches!(settlement, Settlement::Retry { .. }),
                "{settlement:?}"
            );
        }
        let timed_out = settle_attempt(3, Attempt::TimedOut(Duration::from_secs(30)), &policy());
        assert!(
            matches!(&timed_out, Settlement::DeadLetter { error } if error.contains("did not finish within")),
            "{timed_out:?}"
        );
    }

    #[test]
    fn a_retry_delay_never_exceeds_what_the_store_can_hold() {
        let forever = RetryPolicy::new()
            .initial_backoff(Duration::MAX)
            .max_backoff(Duration::MAX);
        let settlement = settle_attempt(
            1,
            Attempt::Failed(ProcessError::retryable("x").with_retry_after(Duration::MAX)),
            &forever,
        );
        assert!(
            matches!(settlement, Settlement::Retry { delay, .. } if delay == MAX_DURATION),
            "{settlement:?}"
        );
    }

    #[test]
    fn a_message_deferred_past_the_horizon_is_dead_lettered_with_the_reason() {
        let enqueued = SystemTime::now();
        let defer = || Settlement::Defer {
            delay: Duration::from_secs(30),
            reason: "destination mail is paused".into(),
        };
        let horizon = Duration::from_secs(3600);
        assert_eq!(
            bound_deferral(
                defer(),
                enqueued,
                horizon,
                enqueued + Duration::from_secs(60)
            ),
            defer()
        );
        let late = bound_deferral(defer(), enqueued, horizon, enqueued + horizon);
        assert!(
            matches!(&late, Settlement::DeadLetter { error } if error.contains("deferred for longer than 3600s") && error.contains("mail is paused")),
            "{late:?}"
        );
        // Resumed from an operator's pause a minute ago: the bound counts from the resume.
        let paused_long = ClaimedMessage {
            enqueued_at: enqueued,
            resumed_at: Some(enqueued + horizon + Duration::from_secs(60)),
            ..message(1, Duration::ZERO)
        };
        let now = enqueued + horizon + Duration::from_secs(120);
        assert_eq!(
            bound_deferral(defer(), waiting_since(&paused_long), horizon, now),
            defer()
        );
        assert_eq!(
            waiting_since(&ClaimedMessage {
                resumed_at: Some(enqueued - Duration::from_secs(1)),
                ..paused_long.clone()
            }),
            enqueued,
            "a resume before the enqueue counts from the enqueue"
        );
        let retry = Settlement::Retry {
            delay: Duration::from_secs(1),
            error: "503".into(),
        };
        assert_eq!(
            bound_deferral(retry.clone(), enqueued, Duration::ZERO, enqueued + horizon),
            retry,
            "only deferrals are bounded"
        );
    }

    #[test]
    fn an_unknown_type_is_given_back_during_the_grace_then_dead_lettered() {
        let grace = Duration::from_secs(15 * 60);
        let now = SystemTime::now();
        let message = |attempt, age| ClaimedMessage {
            enqueued_at: now - age,
            ..message(attempt, Duration::ZERO)
        };
        let young = settle_unknown_type(&message(1, Duration::from_secs(2)), &["a"], grace, now);
        assert!(
            matches!(&young, Settlement::Defer { delay, reason } if *delay == Duration::from_secs(1) && reason.contains("`order.placed`")),
            "{young:?}"
        );
        let older = settle_unknown_type(&message(5, Duration::from_secs(600)), &[], grace, now);
        assert!(
            matches!(older, Settlement::Defer { delay, .. } if delay == Duration::from_secs(60)),
            "{older:?}"
        );
        let near_end =
            settle_unknown_type(&message(9, grace - Duration::from_secs(5)), &[], grace, now);
        assert!(
            matches!(near_end, Settlement::Defer { delay, .. } if delay <= Duration::from_secs(5)),
            "{near_end:?}"
        );
        let expired = settle_unknown_type(&message(9, grace), &["a"], grace, now);
        assert!(
            matches!(&expired, Settlement::DeadLetter { error } if error.contains("deploy a handler")),
            "{expired:?}"
        );
        let no_grace = settle_unknown_type(&message(1, Duration::ZERO), &[], Duration::ZERO, now);
        assert!(matches!(no_grace, Settlement::DeadLetter { .. }));
    }
}
