//! The destinations of one worker, by name, each behind the same health gate and metrics.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use super::health::{adopt, Adopt, Gate, Health, Observed, Transition};
use super::pace::{Pace, Pacer, RateLimit, TurnsInStore};
use super::{
    Answer, Delivery, DeliveryError, Destination, DestinationState, Envelope, HealthPolicy, Scope,
};
use crate::error::{panic_text, FailureKind, ProcessError};
use crate::metrics;
use crate::priority::Priority;
use crate::store::{
    DestinationReport, Exchange, SharedDestinations, SharedTurns, StoredDestination,
    SyncedDestination, WorkerStore,
};

/// How long a message waits when its turn under a rate limit across processes could not be
/// taken from the store.
const UNSHARED_TURN_WAIT: Duration = Duration::from_secs(1);

/// The longest destination name, in characters: the store's key column holds 255.
pub const MAX_DESTINATION_NAME: usize = 255;

/// How the worker wraps one destination: [`WorkerBuilder::destination_with`](crate::WorkerBuilder::destination_with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationOptions {
    health_policy: HealthPolicy,
    rate_limit: Option<RateLimit>,
    learn_rate: bool,
}

impl Default for DestinationOptions {
    fn default() -> Self {
        DestinationOptions {
            health_policy: HealthPolicy::default(),
            rate_limit: None,
            learn_rate: true,
        }
    }
}

impl DestinationOptions {
    /// The defaults: the default [`HealthPolicy`], no rate limit, and a rate learned from
    /// push-back.
    pub fn new() -> Self {
        Self::default()
    }

    /// When the destination is paused after failures, and for how long.
    pub fn health_policy(mut self, policy: HealthPolicy) -> Self {
        self.health_policy = policy;
        self
    }

    /// At most this many deliveries a second from this process, shared by its handler
    /// threads; deliveries over it wait for their turn without counting an attempt
    /// ([`pace`](super::pace)).
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Whether a push-back (a webhook's `429`, or `503` with `Retry-After`) also lowers
    /// the destination's rate, which then rises again with each second of deliveries (default:
    /// yes; [`pace`](super::pace)).
    pub fn learn_rate(mut self, learn: bool) -> Self {
        self.learn_rate = learn;
        self
    }

    /// Why the worker refuses these options, if it does.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        self.rate_limit.as_ref().and_then(RateLimit::problem)
    }
}

/// One named destination of a worker, with its health.
pub(crate) struct Registered {
    name: String,
    destination: Arc<dyn Destination>,
    health: Health,
    pacer: Pacer,
    /// The store, which keeps the turns of a rate limit across processes (the worker's; none
    /// in a destination's own tests).
    turns: Option<Arc<dyn SharedTurns>>,
    /// Why an operator paused it, while paused (read from the store every few seconds).
    operator_pause: Mutex<Option<String>>,
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Destination")
            .field("name", &self.name)
            .field("kind", &self.destination.kind())
            .finish()
    }
}

impl Registered {
    pub fn new(
        name: String,
        destination: Arc<dyn Destination>,
        options: DestinationOptions,
    ) -> Self {
        Registered {
            name,
            destination,
            health: Health::new(options.health_policy),
            pacer: Pacer::new(options.rate_limit, options.learn_rate, Instant::now()),
            turns: None,
            operator_pause: Mutex::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> &'static str {
        self.destination.kind()
    }

    pub fn timeout(&self) -> Duration {
        self.destination.timeout()
    }

    pub fn state(&self) -> DestinationState {
        self.health.state(Instant::now())
    }

    /// Why an operator paused this destination, if one did.
    pub fn operator_pause(&self) -> Option<String> {
        self.operator_pause
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Follows an operator's pause (`Some(reason)`) or resume (`None`).
    pub fn set_operator_pause(&self, reason: Option<String>) {
        *self
            .operator_pause
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = reason;
    }

    /// Delivers `envelope` through the gate: a destination an operator paused, or one that is
    /// paused, held or disabled is not called; what the destination answers is counted, timed,
    /// and told to its health.
    pub fn send(&self, envelope: &Envelope, log: Option<&Exchanges>) -> Result<(), ProcessError> {
        let probe = self.admit(envelope)?;
        let sent = self.exchange(envelope, probe);
        if let (Some(log), Some(exchange)) = (log, sent.exchange) {
            log.push(exchange);
        }
        sent.result
    }

    /// How many envelopes [`send_batch`](Registered::send_batch) sends in one call: the
    /// destination's batch limit, or one under a rate limit the application set (a batch's
    /// envelopes reach the receiver together, where the limit spaces them out). Under a rate
    /// learned from push-back a batch still takes a turn for each envelope, and waits at most
    /// the longest pacing wait for them.
    pub fn batch_limit(&self) -> usize {
        if self.pacer.has_limit() {
            return 1;
        }
        self.destination.batch_limit().max(1)
    }

    /// Sends `envelopes` through the gate as [`send`](Registered::send) sends one, those the
    /// gate lets through in one call of the destination's
    /// [`deliver_batch`](Destination::deliver_batch) (a probe goes alone): what became of each,
    /// in their order.
    pub fn send_batch(&self, envelopes: Vec<Envelope>) -> Vec<Sent> {
        let mut sent: Vec<Option<Sent>> = Vec::with_capacity(envelopes.len());
        let mut admitted = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            match self.admit(&envelope) {
                Ok(false) => {
                    admitted.push((sent.len(), envelope));
                    sent.push(None);
                }
                Ok(true) => sent.push(Some(self.exchange(&envelope, true))),
                Err(refused) => sent.push(Some(Sent {
                    result: Err(refused),
                    exchange: None,
                })),
            }
        }
        if !admitted.is_empty() {
            let (at, batch): (Vec<usize>, Vec<Envelope>) = admitted.into_iter().unzip();
            let started_at = SystemTime::now();
            let started = Instant::now();
            let mut answers =
                catch_unwind(AssertUnwindSafe(|| self.destination.deliver_batch(&batch)))
                    .unwrap_or_else(|panic| {
                        let text = panic_text(panic.as_ref());
                        log::error!(
                            "outbox destination {}: its deliver_batch panicked: {text}",
                            self.name
                        );
                        batch
                            .iter()
                            .map(|_| {
                                Err(DeliveryError::retryable(format!(
                            "destination {} ({}) panicked delivering the batch it was in: {text}",
                            self.name,
                            self.kind()
                        ))
                                .unsent())
                            })
                            .collect()
                    });
            let latency = started.elapsed();
            if answers.len() != batch.len() {
                log::error!(
                    "outbox destination {}: its deliver_batch gave {} outcomes for {} envelopes; \
                     those without one are retried",
                    self.name,
                    answers.len(),
                    batch.len()
                );
            }
            answers.resize_with(batch.len(), || {
                Err(DeliveryError::retryable(format!(
                    "destination {} ({}) gave no outcome for this envelope of a batch",
                    self.name,
                    self.kind()
                ))
                .unsent())
            });
            for ((index, envelope), answered) in at.into_iter().zip(&batch).zip(answers) {
                let outage = matches!(&answered, Err(error)
                    if error.scope() == Scope::Destination && error.kind() == FailureKind::Retryable);
                let paused = self.state();
                let mut recorded = self.record(envelope, answered, started_at, latency, false);
                // The failures that paused the destination count as attempts; the rest of its
                // batch, in flight with them, waits for the probe as later messages do.
                if let (true, Err(error), DestinationState::Paused { probe_in, .. }) =
                    (outage, &recorded.result, paused)
                {
                    recorded.result = Err(ProcessError::defer(
                        format!(
                            "not delivered: destination {} was paused while this message's batch \
                             was in flight ({})",
                            self.name,
                            error.reason()
                        ),
                        probe_in.max(Duration::from_secs(1)),
                    ));
                }
                sent[index] = Some(recorded);
            }
        }
        sent.into_iter()
            .map(|sent| {
                sent.unwrap_or_else(|| Sent {
                    result: Err(ProcessError::retryable("not sent: no outcome was recorded")),
                    exchange: None,
                })
            })
            .collect()
    }

    /// Whether the gate lets `envelope` through (`Ok(true)`: as the probe of a paused
    /// destination), having waited for its turn under the pace; or why not.
    fn admit(&self, envelope: &Envelope) -> Result<bool, ProcessError> {
        let name = &self.name;
        if let Some(reason) = self.operator_pause() {
            metrics::destination_attempt(name, "paused");
            return Err(ProcessError::paused(format!(
                "not sent: destination {name} is paused by an operator ({reason}); it waits \
                 until resumed (`outbox resume --destination {name}`, or the admin pages)"
            )));
        }
        match self.health.gate(Instant::now()) {
            Gate::Send => {
                self.take_turn(envelope.priority)?;
                Ok(false)
            }
            Gate::Probe => {
                log::info!(
                    "outbox destination {name}: probing with message {}",
                    envelope.message_id
                );
                Ok(true)
            }
            Gate::Wait { delay, why } => {
                metrics::destination_attempt(name, "waited");
                Err(ProcessError::defer(
                    format!("not sent: destination {name} is {why}"),
                    delay,
                ))
            }
            Gate::Refuse(reason) => {
                metrics::destination_attempt(name, "refused");
                Err(ProcessError::permanent(format!(
                    "not sent: destination {name} is disabled ({reason}); enable it again \
                     (`outbox destination enable {name}`, or the admin pages) and re-queue"
                )))
            }
        }
    }

    /// Calls the destination with one admitted `envelope` and records what it answered.
    fn exchange(&self, envelope: &Envelope, probe: bool) -> Sent {
        let started_at = SystemTime::now();
        let started = Instant::now();
        let answered = self.destination.deliver_answered(envelope);
        self.record(envelope, answered, started_at, started.elapsed(), probe)
    }

    /// What the destination answered for `envelope`, counted, timed, told to its pace and
    /// health, and judged.
    fn record(
        &self,
        envelope: &Envelope,
        answered: Result<Answer, DeliveryError>,
        started_at: SystemTime,
        latency: Duration,
        probe: bool,
    ) -> Sent {
        let name = &self.name;
        let (result, answer) = match answered {
            Ok(answer) => (Ok(()), answer),
            Err(error) => {
                let answer = error.answer().cloned().unwrap_or_default();
                (Err(error), answer)
            }
        };
        metrics::destination_duration(name, latency);
        metrics::destination_attempt(name, outcome_label(&result));
        let exchange = Some(Exchange {
            destination: name.clone(),
            outcome: outcome_label(&result),
            answer: (answer != Answer::default()).then_some(answer),
            error: result.as_ref().err().map(|error| error.reason().to_owned()),
            started_at,
            latency,
        });
        let observed = match &result {
            Ok(()) => Observed::Answered,
            Err(error) => observed(error),
        };
        match observed {
            _ if result.is_ok() => self.pacer.accepted(Instant::now()),
            Observed::PushedBack(..) => {
                let before = self.pacer.rate();
                self.pacer.pushed_back(Instant::now());
                if let Some(rate) = self.pacer.rate().filter(|rate| Some(*rate) != before) {
                    log::info!(
                        "outbox destination {name}: pushed back; pacing it to {rate:.1} \
                         deliveries a second"
                    );
                }
            }
            _ => {}
        }
        let transition = self.health.record(observed, probe, Instant::now());
        if let Some(transition) = &transition {
            self.report(transition);
        }
        let error = match result {
            Ok(()) => {
                return Sent {
                    result: Ok(()),
                    exchange,
                }
            }
            Err(error) => error,
        };
        let attempt = envelope.attempt;
        let id = envelope.message_id;
        let result = match transition {
            // A failed probe is the outage's, not the message's: it waits for the next probe
            // without spending an attempt, so no outage, however long, uses up its retries.
            Some(Transition::Paused(length)) if probe => Err(ProcessError::defer(
                format!(
                    "not delivered: the probe of paused destination {name} failed ({}); next \
                     probe in {length:?}",
                    error.reason()
                ),
                length,
            )),
            _ => {
                match error.kind() {
                    FailureKind::Retryable | FailureKind::Deferred => log::info!(
                        "outbox destination {name}: message {id} (attempt {attempt}) not \
                         delivered, will be retried: {error}"
                    ),
                    _ => log::warn!(
                        "outbox destination {name}: message {id} (attempt {attempt}) refused for \
                         good: {error}"
                    ),
                }
                Err(error.into_process_error())
            }
        };
        Sent { result, exchange }
    }

    /// Waits for this delivery's turn under the destination's pace, or defers its message to
    /// the turn when it is far (without counting an attempt).
    fn take_turn(&self, priority: Priority) -> Result<(), ProcessError> {
        let name = &self.name;
        let shared = TurnsInStore {
            store: self.turns.as_deref(),
            name,
            kind: self.kind(),
        };
        match self.pacer.pace(Instant::now(), priority, &shared) {
            Ok(Pace::Go) => Ok(()),
            Ok(Pace::GoAfter(wait)) => {
                std::thread::sleep(wait);
                Ok(())
            }
            Ok(Pace::Defer(wait)) => {
                metrics::destination_attempt(name, "paced");
                Err(ProcessError::paced(
                    format!(
                        "not sent: destination {name} is paced to {:.1} deliveries a second; its \
                         turn comes in {wait:?}",
                        self.pacer.rate().unwrap_or_default()
                    ),
                    wait,
                ))
            }
            Err(error) => {
                metrics::destination_attempt(name, "paced");
                log::warn!(
                    "outbox destination {name}: no turn of its rate limit across processes could \
                     be taken from the store ({error}); its message waits a second"
                );
                Err(ProcessError::paced(
                    format!(
                        "not sent: the turn of destination {name}'s rate limit across processes \
                         could not be taken from the store: {error}"
                    ),
                    UNSHARED_TURN_WAIT,
                ))
            }
        }
    }

    fn report(&self, transition: &Transition) {
        let name = &self.name;
        match transition {
            Transition::Paused(length) => log::warn!(
                "outbox destination {name} paused for {length:?} after consecutive failures: its \
                 messages wait without counting attempts until a probe gets an answer"
            ),
            Transition::Held(length) => log::info!(
                "outbox destination {name} asked for no deliveries for {length:?}: its messages \
                 wait without counting attempts"
            ),
            Transition::Resumed => {
                log::warn!("outbox destination {name} answered a probe: deliveries resume")
            }
            Transition::Disabled => log::error!(
                "outbox destination {name} says it is gone for good and is disabled: its \
                 messages are dead-lettered until an operator enables it again"
            ),
        }
        self.publish_state();
    }

    /// Sets this destination's state gauge.
    fn publish_state(&self) {
        metrics::destination_state(
            self.name(),
            self.kind(),
            self.state().name(),
            &DestinationState::NAMES,
        );
    }

    /// Applies what the store says about this destination, given the operator's count of
    /// enables this worker saw last.
    fn adopt(&self, stored: &StoredDestination, enables_seen: Option<i64>) {
        let disabled_here = matches!(self.state(), DestinationState::Disabled { .. });
        match adopt(stored, enables_seen, disabled_here) {
            Adopt::Enable => {
                self.health.enable();
                log::warn!("outbox destination {} enabled by an operator", self.name);
            }
            Adopt::Disable(reason) => {
                self.health.disable(&reason);
                log::warn!(
                    "outbox destination {} is disabled, as the store records: {reason}",
                    self.name
                );
            }
            Adopt::Nothing => {}
        }
    }

    /// The destination's health as the worker reports it to the store.
    fn store_report(&self) -> DestinationReport {
        let state = self.state();
        let name = state.name();
        let (consecutive_failures, last_error, probe_in, disabled_reason) = match state {
            DestinationState::Healthy {
                consecutive_failures,
            } => (consecutive_failures, None, None, None),
            DestinationState::Held { resume_in, reason } => {
                (0, Some(reason), Some(resume_in), None)
            }
            DestinationState::Paused {
                consecutive_failures,
                probe_in,
                last_error,
            } => (consecutive_failures, Some(last_error), Some(probe_in), None),
            DestinationState::Disabled { reason } => (0, None, None, Some(reason)),
        };
        DestinationReport {
            name: self.name.clone(),
            kind: self.kind(),
            state: name,
            consecutive_failures,
            last_error,
            probe_in,
            disabled_reason,
        }
    }
}

fn observed(error: &DeliveryError) -> Observed<'_> {
    match (error.scope(), error.kind()) {
        (Scope::Destination, FailureKind::Permanent) => Observed::Gone(error.reason()),
        (Scope::Destination, FailureKind::Deferred) => Observed::PushedBack(
            error.delay().unwrap_or(Duration::from_secs(1)),
            error.reason(),
        ),
        (Scope::Destination, _) => Observed::Failed(error.reason()),
        (Scope::Message, _) => Observed::Answered,
        _ => Observed::Nothing,
    }
}

fn outcome_label(result: &Result<(), DeliveryError>) -> &'static str {
    match result {
        Ok(()) => "delivered",
        Err(error) => match error.kind() {
            FailureKind::Permanent => "rejected",
            FailureKind::Deferred => "pushed_back",
            _ => "failed",
        },
    }
}

/// A worker's destinations by name, fixed when it starts.
#[derive(Debug, Default)]
pub(crate) struct Destinations {
    by_name: BTreeMap<String, Registered>,
}

impl Destinations {
    /// The destinations, failing on a name given twice or not valid.
    pub fn new(
        destinations: Vec<(String, Arc<dyn Destination>, DestinationOptions)>,
    ) -> Result<Self, NameError> {
        let mut by_name = BTreeMap::new();
        for (name, destination, options) in destinations {
            check_name(&name)?;
            if by_name.contains_key(&name) {
                return Err(NameError::Duplicate(name));
            }
            let registered = Registered::new(name.clone(), destination, options);
            by_name.insert(name, registered);
        }
        Ok(Destinations { by_name })
    }

    /// Whether any destination has a rate limit across processes (whose turns the store keeps).
    pub fn any_across_processes(&self) -> bool {
        self.iter().any(|d| d.pacer.across_processes())
    }

    /// The same destinations, taking the turns of their rate limits across processes from
    /// `store`.
    pub fn keeping_turns_in(mut self, store: &Arc<dyn WorkerStore>) -> Self {
        for registered in self.by_name.values_mut() {
            registered.turns = Some(Arc::clone(store) as Arc<dyn SharedTurns>);
        }
        self
    }

    pub fn get(&self, name: &str) -> Option<&Registered> {
        self.by_name.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Registered> {
        self.by_name.values()
    }

    /// The longest time one delivery may take, over all destinations.
    pub fn longest_timeout(&self) -> Duration {
        self.iter()
            .map(Registered::timeout)
            .max()
            .unwrap_or_default()
    }

    /// Sets every destination's state gauge: they are there from the start, and a hold that
    /// ran out shows as healthy again.
    pub fn publish_states(&self) {
        for registered in self.iter() {
            registered.publish_state();
        }
    }

    /// Follows the operator's pauses of destinations (by name, with the reason): each of this
    /// worker's destinations is paused or resumed to match.
    pub fn follow_pauses(&self, paused: &BTreeMap<String, String>) {
        for destination in self.iter() {
            destination.set_operator_pause(paused.get(destination.name()).cloned());
        }
    }
}

/// Shares the health of `destinations` through the store (see [`SharedDestinations::sync_destinations`](crate::store::SharedDestinations::sync_destinations));
/// `enables_seen` is the operator's count of enables of each destination when this worker last
/// read it.
pub(crate) fn sync_health(
    destinations: &[&Registered],
    store: &dyn SharedDestinations,
    enables_seen: &mut HashMap<String, i64>,
) -> Result<(), crate::store::StoreError> {
    if destinations.is_empty() {
        return Ok(());
    }
    let synced: Vec<SyncedDestination<'_>> = destinations
        .iter()
        .map(|d| SyncedDestination {
            name: d.name(),
            kind: d.kind(),
        })
        .collect();
    let by_name: HashMap<&str, &Registered> = destinations.iter().map(|d| (d.name(), *d)).collect();
    store.sync_destinations(&synced, &mut |stored| {
        for record in stored {
            if let Some(registered) = by_name.get(record.name.as_str()) {
                registered.adopt(record, enables_seen.get(&record.name).copied());
                enables_seen.insert(record.name.clone(), record.enables);
            }
        }
        destinations.iter().map(|d| d.store_report()).collect()
    })?;
    for registered in destinations {
        registered.publish_state();
    }
    Ok(())
}

/// A destination name that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// Two destinations were given one name.
    #[error(
        "two destinations are named `{0}`: each destination of a worker needs a name of its own \
         (messages and handlers pick destinations by name)"
    )]
    Duplicate(String),
    /// The name is empty, too long or has control characters.
    #[error(
        "destination name {name:?} is {problem}: a name is 1 to {MAX_DESTINATION_NAME} characters \
         without control characters (it keys the destination's health in the store)"
    )]
    Invalid {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

fn check_name(name: &str) -> Result<(), NameError> {
    let problem = if name.is_empty() {
        "empty"
    } else if name == crate::subscription::SUBSCRIBERS
        || name.starts_with(crate::subscription::SUBSCRIPTION_DESTINATION_PREFIX)
    {
        "reserved for subscriptions (`subscribers`, `subscription:<id>`)"
    } else if name.chars().count() > MAX_DESTINATION_NAME {
        "too long"
    } else if name.chars().any(char::is_control) {
        "not printable"
    } else {
        return Ok(());
    };
    Err(NameError::Invalid {
        name: name.to_owned(),
        problem,
    })
}

/// The exchanges with destinations of one attempt, in order: what the delivery log keeps of
/// it. An attempt runs on one handler thread; the lock is never contended.
#[derive(Debug, Default)]
pub(crate) struct Exchanges(Mutex<Vec<Exchange>>);

impl Exchanges {
    fn push(&self, exchange: Exchange) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(exchange);
    }

    /// The exchanges made, leaving none.
    pub fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What became of one envelope sent through a destination's gate.
#[derive(Debug)]
pub(crate) struct Sent {
    /// Delivered, or why not.
    pub result: Result<(), ProcessError>,
    /// The exchange with the destination, for the delivery log: none when the gate kept the
    /// envelope from it.
    pub exchange: Option<Exchange>,
}

/// One of the worker's destinations, reached by name from a handler:
/// [`Context::destination`](crate::Context::destination). Deliveries through it pass the
/// destination's health gate and are counted in its metrics, as routed messages are.
pub struct DestinationRef<'a> {
    pub(crate) registered: &'a Registered,
    pub(crate) delivery: &'a Delivery,
    pub(crate) exchanges: Option<&'a Exchanges>,
}

impl fmt::Debug for DestinationRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.registered.fmt(f)
    }
}

impl DestinationRef<'_> {
    /// The destination's name.
    pub fn name(&self) -> &str {
        self.registered.name()
    }

    /// What kind of destination it is (`webhook`, `jetstream`, ...).
    pub fn kind(&self) -> &'static str {
        self.registered.kind()
    }

    /// Delivers `data`, as JSON, as the message being processed; see [`send`](Self::send).
    pub fn deliver<T: Serialize + ?Sized>(&self, data: &T) -> Result<(), ProcessError> {
        self.send(self.json(data)?)
    }

    /// Delivers `data`, as JSON, to `subject` within the destination (a NATS subject, a
    /// RabbitMQ routing key, a Kafka topic).
    pub fn deliver_to<T: Serialize + ?Sized>(
        &self,
        subject: &str,
        data: &T,
    ) -> Result<(), ProcessError> {
        self.send(self.json(data)?.with_subject(subject))
    }

    /// Delivers `envelope` (made with [`Context::envelope`](crate::Context::envelope)). A
    /// paused, held or disabled destination is not called: the message is deferred without
    /// spending an attempt, or dead-lettered while the destination is disabled.
    pub fn send(&self, envelope: Envelope) -> Result<(), ProcessError> {
        self.registered.send(&envelope, self.exchanges)
    }

    fn json<T: Serialize + ?Sized>(&self, data: &T) -> Result<Envelope, ProcessError> {
        let body = serde_json::to_vec(data).map_err(|error| {
            ProcessError::permanent(format!(
                "the message's data could not be written as JSON for destination {}: {error}",
                self.name()
            ))
        })?;
        Ok(self.delivery.envelope(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Answers with what it is told to, and counts its calls.
    #[derive(Default)]
    struct Scripted {
        answers: Mutex<Vec<Result<(), DeliveryError>>>,
        calls: Mutex<u32>,
    }

    impl Destination for Scripted {
        fn kind(&self) -> &'static str {
            "scripted"
        }

        fn deliver(&self, _: &Envelope) -> Result<(), DeliveryError> {
            *self.calls.lock().unwrap() += 1;
            self.answers.lock().unwrap().pop().unwrap_or(Ok(()))
        }
    }

    fn registered(
        answers: Vec<Result<(), DeliveryError>>,
        failures: u32,
    ) -> (Registered, Arc<Scripted>) {
        let scripted = Arc::new(Scripted {
            answers: Mutex::new(answers.into_iter().rev().collect()),
            calls: Mutex::new(0),
        });
        let options = DestinationOptions::new().health_policy(
            HealthPolicy::new()
                .failures_to_pause(failures)
                .first_pause(Duration::from_secs(60)),
        );
        (
            Registered::new("mail".into(), scripted.clone(), options),
            scripted,
        )
    }

    fn envelope() -> Envelope {
        Envelope::new(crate::MessageId::new(), "t", b"{}".to_vec())
    }

    #[test]
    fn failures_about_the_destination_pause_it_and_then_messages_wait_without_calling_it() {
        let (mail, scripted) = registered(
            vec![
                Err(DeliveryError::unavailable("503")),
                Err(DeliveryError::unavailable("503")),
            ],
            2,
        );
        for _ in 0..2 {
            let error = mail.send(&envelope(), None).unwrap_err();
            assert_eq!(error.kind(), FailureKind::Retryable);
        }
        assert_eq!(mail.state().name(), "paused");
        let waited = mail.send(&envelope(), None).unwrap_err();
        assert_eq!(waited.kind(), FailureKind::Deferred);
        assert!(
            waited.reason().contains("destination mail is paused"),
            "{waited:?}"
        );
        assert_eq!(
            *scripted.calls.lock().unwrap(),
            2,
            "not called while paused"
        );
    }

    #[test]
    fn failures_about_one_message_never_pause_and_a_push_back_holds_everyone() {
        let (mail, scripted) = registered(
            vec![
                Err(DeliveryError::permanent("400")),
                Err(DeliveryError::permanent("400")),
                Err(DeliveryError::push_back("429", Duration::from_secs(30))),
            ],
            1,
        );
        for _ in 0..2 {
            let error = mail.send(&envelope(), None).unwrap_err();
            assert_eq!(error.kind(), FailureKind::Permanent);
        }
        assert_eq!(mail.state().name(), "healthy");
        let pushed = mail.send(&envelope(), None).unwrap_err();
        assert_eq!(pushed.kind(), FailureKind::Deferred);
        assert_eq!(mail.state().name(), "held");
        let waited = mail.send(&envelope(), None).unwrap_err();
        assert_eq!(waited.kind(), FailureKind::Deferred);
        assert!(waited.retry_after().unwrap() > Duration::from_secs(25));
        assert_eq!(*scripted.calls.lock().unwrap(), 3);
    }

    /// Takes 8 at once, and gives no outcome for the last envelope of a batch.
    struct Forgetful;

    impl Destination for Forgetful {
        fn kind(&self) -> &'static str {
            "forgetful"
        }

        fn deliver(&self, _: &Envelope) -> Result<(), DeliveryError> {
            Ok(())
        }

        fn batch_limit(&self) -> usize {
            8
        }

        fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
            let mut outcomes: Vec<_> = envelopes.iter().map(|_| Ok(Answer::default())).collect();
            outcomes.pop();
            outcomes
        }
    }

    /// What became of each envelope of a batch: delivered (`None`), or the kind of its failure.
    fn kinds(sent: &[Sent]) -> Vec<Option<FailureKind>> {
        sent.iter()
            .map(|sent| sent.result.as_ref().err().map(ProcessError::kind))
            .collect()
    }

    #[test]
    fn a_batch_is_judged_and_logged_envelope_by_envelope() {
        let (mail, scripted) = registered(
            vec![
                Ok(()),
                Err(DeliveryError::permanent("400")),
                Err(DeliveryError::retryable("a nack")),
            ],
            5,
        );
        let sent = mail.send_batch(vec![envelope(), envelope(), envelope()]);
        let kinds = kinds(&sent);
        assert_eq!(
            kinds,
            [
                None,
                Some(FailureKind::Permanent),
                Some(FailureKind::Retryable)
            ]
        );
        let logged: Vec<&str> = sent
            .iter()
            .map(|sent| sent.exchange.as_ref().expect("each was sent").outcome)
            .collect();
        assert_eq!(logged.len(), 3);
        assert_eq!(logged[0], "delivered");
        assert_eq!(*scripted.calls.lock().unwrap(), 3);
    }

    #[test]
    fn a_paused_destination_holds_a_whole_batch_without_calling_it() {
        let (mail, scripted) = registered(
            vec![
                Err(DeliveryError::unavailable("503")),
                Err(DeliveryError::unavailable("503")),
                Err(DeliveryError::unavailable("503")),
            ],
            2,
        );
        let sent = mail.send_batch(vec![envelope(), envelope(), envelope()]);
        let kinds = kinds(&sent);
        assert_eq!(
            kinds,
            [
                Some(FailureKind::Retryable),
                Some(FailureKind::Retryable),
                Some(FailureKind::Deferred)
            ],
            "the failures that paused it count; the rest of the batch waits for the probe"
        );
        assert_eq!(mail.state().name(), "paused", "a batch's failures count");
        let held = mail.send_batch(vec![envelope(), envelope(), envelope()]);
        for sent in &held {
            let error = sent.result.as_ref().unwrap_err();
            assert_eq!(error.kind(), FailureKind::Deferred, "{error:?}");
            assert!(sent.exchange.is_none(), "nothing was sent");
        }
        assert_eq!(*scripted.calls.lock().unwrap(), 3);
    }

    #[test]
    fn an_envelope_a_batch_left_without_an_outcome_is_retried_and_not_held_against_it() {
        let forgetful =
            Registered::new("forgetful".into(), Arc::new(Forgetful), Default::default());
        let sent = forgetful.send_batch(vec![envelope(), envelope(), envelope()]);
        assert!(sent[0].result.is_ok() && sent[1].result.is_ok());
        let error = sent[2].result.as_ref().unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
        assert!(error.reason().contains("gave no outcome"), "{error:?}");
        assert_eq!(forgetful.state().name(), "healthy");
    }

    #[test]
    fn a_paced_destination_is_sent_one_envelope_at_a_time() {
        let batching = Registered::new("batching".into(), Arc::new(Forgetful), Default::default());
        assert_eq!(batching.batch_limit(), 8);
        let paced = Registered::new(
            "paced".into(),
            Arc::new(Forgetful),
            DestinationOptions::new().rate_limit(RateLimit::per_second(100)),
        );
        assert_eq!(paced.batch_limit(), 1, "a batch would arrive all at once");
        let (single, _) = registered(Vec::new(), 5);
        assert_eq!(single.batch_limit(), 1);
    }

    #[test]
    fn a_destination_that_is_gone_refuses_until_enabled() {
        let (mail, _) = registered(vec![Err(DeliveryError::gone("410 Gone"))], 5);
        assert_eq!(
            mail.send(&envelope(), None).unwrap_err().kind(),
            FailureKind::Permanent
        );
        let refused = mail.send(&envelope(), None).unwrap_err();
        assert!(
            refused.reason().contains("is disabled (410 Gone)"),
            "{refused:?}"
        );
        mail.health.enable();
        assert!(mail.send(&envelope(), None).is_ok());
    }

    /// A limit across processes whose turns the store cannot give (down, or a store that keeps
    /// none): the message waits a second without spending an attempt, the destination is not
    /// called, and the next turn is asked for again.
    #[test]
    fn a_turn_the_store_cannot_give_defers_the_message_and_calls_nothing() {
        let memory = crate::testing::MemoryStore::new();
        let store: Arc<dyn WorkerStore> = Arc::new(memory.clone());
        let scripted = Arc::new(Scripted::default());
        let limit = RateLimit::per_second(100).across_processes();
        let destinations = Destinations::new(vec![(
            "mail".to_owned(),
            scripted.clone() as Arc<dyn Destination>,
            DestinationOptions::new().rate_limit(limit),
        )])
        .unwrap()
        .keeping_turns_in(&store);
        assert!(destinations.any_across_processes());
        assert!(
            destinations
                .get("mail")
                .unwrap()
                .send(&envelope(), None)
                .is_ok(),
            "the store gives turns"
        );
        memory.set_down(true);
        let waited = destinations
            .get("mail")
            .unwrap()
            .send(&envelope(), None)
            .unwrap_err();
        assert_eq!(waited.kind(), FailureKind::Deferred);
        assert_eq!(waited.retry_after(), Some(UNSHARED_TURN_WAIT));
        assert!(
            waited
                .reason()
                .contains("could not be taken from the store"),
            "{waited:?}"
        );
        assert_eq!(
            *scripted.calls.lock().unwrap(),
            1,
            "not called without a turn"
        );
        memory.set_down(false);
        assert!(destinations
            .get("mail")
            .unwrap()
            .send(&envelope(), None)
            .is_ok());
    }

    #[test]
    fn names_are_unique_printable_and_bounded() {
        let any = || Arc::new(Scripted::default()) as Arc<dyn Destination>;
        let named = |name: &str| (name.to_owned(), any(), DestinationOptions::new());
        assert!(Destinations::new(vec![named("mail"), named("crm")]).is_ok());
        assert_eq!(
            Destinations::new(vec![named("mail"), named("mail")]).unwrap_err(),
            NameError::Duplicate("mail".into())
        );
        for bad in ["", "a\nb", &"x".repeat(256)] {
            assert!(
                matches!(
                    Destinations::new(vec![named(bad)]),
                    Err(NameError::Invalid { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(Destinations::new(vec![named(&"é".repeat(255))]).is_ok());
    }
}
