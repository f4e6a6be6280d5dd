//! The worker: claims messages with a lease, processes them on a pool of threads, and settles
//! the outcomes in batches.
//!
//! ```text
//! claimer ──jobs (bounded)──▶ handler threads ──outcomes (bounded)──▶ acker
//!    ▲  wake: LISTEN/NOTIFY, in-process enqueue, poll timer   │ capacity freed
//!    └────────────────────────────────────────────────────────┘
//! ```
//! The claimer never holds more than `2 × batch_size + handler_threads` messages, so a slow
//! receiver applies back-pressure instead of filling memory or outliving leases.

mod store;
mod wake;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::context::{Context, Delivery, Resources};
use crate::error::FailureKind;
use crate::registry::{DispatchError, Registry, RegistryError};
use crate::retry::RetryPolicy;

pub use store::{ClaimToken, ClaimedMessage, Listener, Outcome, Settlement, Store, StoreError};
pub use wake::notify_enqueued;

/// How long after an in-process wake-up that found nothing the claimer looks again: the wake
/// comes before the enqueuing transaction commits, and commits take about this long.
const FOLLOW_UPS_MS: [u64; 5] = [1, 4, 16, 64, 256];

/// The shortest a lease may outlast the handler timeout, for the claim and ack round trips.
const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// Error texts are stored in the outbox row; receivers' bodies can be large.
const MAX_ERROR_LEN: usize = 2000;

/// Builds a worker; see [`Worker::builder`].
pub struct WorkerBuilder<S> {
    store: S,
    resources: Resources,
    handler_threads: usize,
    batch_size: usize,
    lease: Option<Duration>,
    handler_timeout: Duration,
    poll_interval: Duration,
    listen: bool,
    retry_policy: RetryPolicy,
}

impl<S> std::fmt::Debug for WorkerBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("resources", &self.resources)
            .field("handler_threads", &self.handler_threads)
            .field("batch_size", &self.batch_size)
            .field("lease", &self.effective_lease())
            .field("handler_timeout", &self.handler_timeout)
            .field("poll_interval", &self.poll_interval)
            .field("listen", &self.listen)
            .field("retry_policy", &self.retry_policy)
            .finish()
    }
}

/// The worker that delivers the outbox's messages. Start one per process with
/// [`Worker::builder`]; run more processes to scale out.
#[derive(Debug)]
pub struct Worker {
    _private: (),
}

impl Worker {
    /// A worker over `store` with the defaults: 16 handler threads, batches of 64, a 30 s
    /// handler timeout, a 60 s lease, a 1 s safety-net poll, wake-ups on, and the default
    /// [`RetryPolicy`].
    pub fn builder<S: Store>(store: S) -> WorkerBuilder<S> {
        WorkerBuilder {
            store,
            resources: Resources::new(),
            handler_threads: 16,
            batch_size: 64,
            lease: None,
            handler_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            listen: true,
            retry_policy: RetryPolicy::default(),
        }
    }
}

impl<S> WorkerBuilder<S> {
    fn effective_lease(&self) -> Duration {
        self.lease
            .unwrap_or_else(|| Duration::from_secs(60).max(self.handler_timeout * 2))
    }
}

impl<S: Store> WorkerBuilder<S> {
    /// Threads running handlers at once. Webhook delivery waits on the network, so this is
    /// usually several times the core count.
    pub fn handler_threads(mut self, threads: usize) -> Self {
        self.handler_threads = threads;
        self
    }

    /// Messages claimed per database round trip.
    pub fn batch_size(mut self, size: usize) -> Self {
        self.batch_size = size;
        self
    }

    /// How long a claim holds its messages. A worker that dies loses its messages for this
    /// long; a message not finished within it may be claimed by another worker. Must exceed the
    /// handler timeout by at least 5 s. Default: the larger of 60 s and twice the handler
    /// timeout.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The longest one `process` call is expected to take (for webhooks: the endpoint's
    /// timeout). A message whose lease has less than this left is not started but given back.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// How often to look for due messages when nothing wakes the worker: the safety net behind
    /// wake-ups, and how soon retries come due.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Only poll: no `LISTEN` connection (e.g. behind PgBouncer in transaction mode) and no
    /// in-process wake-ups.
    pub fn poll_only(mut self) -> Self {
        self.listen = false;
        self
    }

    /// The retry policy of handlers that do not set their own.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policy = policy;
        self
    }

    /// Adds a shared resource handlers reach with [`Context::resource`].
    pub fn resource<T: Send + Sync + 'static>(mut self, resource: T) -> Self {
        self.resources.insert(resource);
        self
    }

    /// Replaces all resources.
    pub fn resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Adds a webhook endpoint as a resource and makes the handler timeout cover its timeout.
    #[cfg(feature = "webhook")]
    pub fn webhook(mut self, endpoint: crate::webhook::WebhookEndpoint) -> Self {
        self.handler_timeout = self.handler_timeout.max(endpoint.timeout());
        self.resources.insert(endpoint);
        self
    }

    /// Checks the configuration, builds the handler registry and starts the threads.
    pub fn spawn(self) -> Result<WorkerHandle, WorkerError> {
        let lease = self.effective_lease();
        if lease < self.handler_timeout + LEASE_MARGIN {
            return Err(WorkerError::LeaseTooShort {
                lease,
                handler_timeout: self.handler_timeout,
            });
        }
        if self.handler_threads == 0 || self.batch_size == 0 {
            return Err(WorkerError::InvalidConfig(
                "handler_threads and batch_size must be at least 1",
            ));
        }
        let registry = Registry::from_inventory()?;
        self.store.check().map_err(WorkerError::Store)?;
        log::info!(
            "outbox worker starting: {} handler threads, batches of {}, lease {:?}, handling {:?}",
            self.handler_threads,
            self.batch_size,
            lease,
            registry.message_types()
        );

        let (wake_tx, wake_rx) = bounded::<()>(1);
        let (capacity_tx, capacity_rx) = bounded::<()>(1);
        let (jobs_tx, jobs_rx) = bounded::<Job>(self.batch_size);
        let (outcomes_tx, outcomes_rx) = bounded::<Outcome>(self.batch_size + self.handler_threads);
        let (alive_tx, alive_rx) = bounded::<()>(0);

        let listener = if self.listen {
            self.store.listen().map_err(WorkerError::Store)?
        } else {
            None
        };
        let local_wakeups = (self.listen && self.store.wants_local_wakeups())
            .then(|| wake::subscribe(wake_tx.clone()));

        let shared: Arc<Shared<dyn Store>> = Arc::new(Shared {
            store: self.store,
            registry,
            resources: self.resources,
            retry_policy: self.retry_policy,
            lease,
            handler_timeout: self.handler_timeout,
            poll_interval: self.poll_interval,
            batch_size: self.batch_size,
            // Room for a full batch to be claimed while the previous one is still running.
            max_in_flight: 2 * self.batch_size + self.handler_threads,
            in_flight: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            give_up_at: Mutex::new(None),
            stats: Counters::default(),
        });

        let mut threads = Vec::new();
        let spawn = |name: String, body: Box<dyn FnOnce() + Send>| {
            let alive = alive_tx.clone();
            std::thread::Builder::new().name(name).spawn(move || {
                let _alive = alive;
                body();
            })
        };
        {
            let shared = Arc::clone(&shared);
            threads.push(spawn(
                "outbox-claimer".into(),
                Box::new(move || claimer(&shared, jobs_tx, wake_rx, capacity_rx)),
            )?);
        }
        for n in 0..self.handler_threads {
            let shared = Arc::clone(&shared);
            let jobs = jobs_rx.clone();
            let outcomes = outcomes_tx.clone();
            threads.push(spawn(
                format!("outbox-handler-{n}"),
                Box::new(move || handler(&shared, jobs, outcomes)),
            )?);
        }
        drop(outcomes_tx);
        {
            let shared = Arc::clone(&shared);
            threads.push(spawn(
                "outbox-acker".into(),
                Box::new(move || acker(&shared, outcomes_rx, capacity_tx)),
            )?);
        }
        if let Some(listener) = listener {
            let shared = Arc::clone(&shared);
            let wake = wake_tx.clone();
            threads.push(spawn(
                "outbox-listener".into(),
                Box::new(move || listen(&shared, listener, wake)),
            )?);
        }
        drop(alive_tx);

        Ok(WorkerHandle {
            shared,
            threads,
            alive: alive_rx,
            wake: wake_tx,
            _local_wakeups: local_wakeups,
        })
    }
}

/// Why a worker could not start or stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The linked handlers are inconsistent (two with one type string).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The lease would expire while a handler may still legitimately run, so another worker
    /// could process the same message at the same time.
    #[error(
        "the lease ({lease:?}) must exceed the handler timeout ({handler_timeout:?}) by at least \
         5 s; raise it with `.lease(..)` or lower the endpoint or handler timeout"
    )]
    LeaseTooShort {
        /// The configured lease.
        lease: Duration,
        /// The handler timeout it must exceed.
        handler_timeout: Duration,
    },
    /// A setting is out of range.
    #[error("invalid worker configuration: {0}")]
    InvalidConfig(&'static str),
    /// The store failed while the worker started.
    #[error("the outbox store failed while the worker started: {0}")]
    Store(#[source] StoreError),
    /// The operating system refused a thread.
    #[error("could not start a worker thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// Some threads were still busy at the shutdown deadline (a handler stuck in a call). Their
    /// messages are not lost: their leases expire and another worker takes them.
    #[error("{running} worker threads were still running at the shutdown deadline")]
    ShutdownTimedOut {
        /// Threads still running.
        running: usize,
    },
}

/// What a worker has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Messages claimed.
    pub claimed: u64,
    /// Messages processed successfully and removed.
    pub succeeded: u64,
    /// Failed attempts scheduled for a retry.
    pub retried: u64,
    /// Messages moved to the dead-letter table.
    pub dead_lettered: u64,
    /// Messages given back unprocessed.
    pub released: u64,
    /// Outcomes dropped because the lease had passed to another claim.
    pub fenced: u64,
}

#[derive(Default)]
struct Counters {
    claimed: AtomicU64,
    succeeded: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    released: AtomicU64,
    fenced: AtomicU64,
}

/// A running worker. Dropping it asks the worker to stop without waiting; call
/// [`shutdown`](WorkerHandle::shutdown) to wait.
pub struct WorkerHandle {
    shared: Arc<Shared<dyn Store>>,
    threads: Vec<JoinHandle<()>>,
    alive: Receiver<()>,
    wake: Sender<()>,
    _local_wakeups: Option<wake::Subscription>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("threads", &self.threads.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Asks a worker to stop, from anywhere (e.g. a signal handler's thread).
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared<dyn Store>>,
    wake: Sender<()>,
}

impl std::fmt::Debug for Stopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stopper").finish_non_exhaustive()
    }
}

impl Stopper {
    /// Stops claiming; in-flight messages finish, queued ones are given back.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.wake.try_send(());
    }
}

impl WorkerHandle {
    /// What the worker has done so far.
    pub fn stats(&self) -> WorkerStats {
        let c = &self.shared.stats;
        WorkerStats {
            claimed: c.claimed.load(Ordering::Relaxed),
            succeeded: c.succeeded.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            dead_lettered: c.dead_lettered.load(Ordering::Relaxed),
            released: c.released.load(Ordering::Relaxed),
            fenced: c.fenced.load(Ordering::Relaxed),
        }
    }

    /// Messages claimed and not yet settled.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// A handle that can stop the worker from another thread.
    pub fn stopper(&self) -> Stopper {
        Stopper {
            shared: Arc::clone(&self.shared),
            wake: self.wake.clone(),
        }
    }

    /// Stops claiming, lets running handlers finish, gives queued messages back, settles
    /// everything, and waits for the threads, at most until `deadline` has passed. Returns what
    /// the worker did in its lifetime.
    pub fn shutdown(mut self, deadline: Duration) -> Result<WorkerStats, WorkerError> {
        let give_up_at = Instant::now() + deadline;
        if let Ok(mut at) = self.shared.give_up_at.lock() {
            *at = Some(give_up_at);
        }
        self.stopper().stop();
        self.wait(Some(give_up_at))
    }

    /// Waits until the worker stops (after [`Stopper::stop`] from elsewhere). Returns what the
    /// worker did in its lifetime.
    pub fn join(mut self) -> Result<WorkerStats, WorkerError> {
        self.wait(None)
    }

    fn wait(&mut self, until: Option<Instant>) -> Result<WorkerStats, WorkerError> {
        loop {
            let exited = match until {
                Some(until) => self.alive.recv_deadline(until),
                None => self
                    .alive
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
            };
            match exited {
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let running = self.threads.iter().filter(|t| !t.is_finished()).count();
                    log::warn!(
                        "outbox worker shutdown deadline passed with {running} threads busy"
                    );
                    return Err(WorkerError::ShutdownTimedOut { running });
                }
                Ok(()) => {}
            }
        }
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                log::error!("an outbox worker thread panicked");
            }
        }
        let stats = self.stats();
        log::info!("outbox worker stopped: {stats:?}");
        Ok(stats)
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stopper().stop();
        }
    }
}

struct Shared<S: ?Sized> {
    registry: Registry,
    resources: Resources,
    retry_policy: RetryPolicy,
    lease: Duration,
    handler_timeout: Duration,
    poll_interval: Duration,
    batch_size: usize,
    max_in_flight: usize,
    in_flight: AtomicUsize,
    stopping: AtomicBool,
    give_up_at: Mutex<Option<Instant>>,
    stats: Counters,
    store: S,
}

impl<S: ?Sized> Shared<S> {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn past_give_up(&self) -> bool {
        self.give_up_at
            .lock()
            .map(|at| at.is_some_and(|at| Instant::now() >= at))
            .unwrap_or(true)
    }
}

struct Job {
    token: ClaimToken,
    message: ClaimedMessage,
    lease_ends: Instant,
}

fn claimer(
    shared: &Shared<dyn Store>,
    jobs: Sender<Job>,
    wake: Receiver<()>,
    capacity: Receiver<()>,
) {
    let mut follow_ups: &[u64] = &[];
    let mut failures = 0u32;
    while !shared.stopping() {
        let free = shared
            .max_in_flight
            .saturating_sub(shared.in_flight.load(Ordering::SeqCst));
        // Full batches only: a claim costs a round trip and a commit whatever its size, and
        // claiming the few slots each settlement frees made claims of a third of a batch.
        if free < shared.batch_size {
            let _ = capacity.recv_timeout(shared.poll_interval);
            continue;
        }
        let limit = shared.batch_size;
        let token = ClaimToken::new();
        let started = Instant::now();
        let claimed = match shared.store.claim(token, limit, shared.lease) {
            Ok(claimed) => {
                failures = 0;
                claimed
            }
            Err(error) => {
                failures += 1;
                let pause =
                    Duration::from_millis(100 << failures.min(6)).min(Duration::from_secs(5));
                log::error!("outbox: claiming messages failed (retrying in {pause:?}): {error}");
                let _ = wake.recv_timeout(pause);
                continue;
            }
        };
        let count = claimed.len();
        if count > 0 {
            log::debug!("outbox: claimed {count} messages under {token}");
            shared.in_flight.fetch_add(count, Ordering::SeqCst);
            shared
                .stats
                .claimed
                .fetch_add(count as u64, Ordering::Relaxed);
            // More may be due right behind these, or be locked for a moment by another
            // worker's claim: look again soon, not a whole poll interval later.
            follow_ups = &FOLLOW_UPS_MS;
        }
        let lease_ends = started + shared.lease;
        for message in claimed {
            if jobs
                .send(Job {
                    token,
                    message,
                    lease_ends,
                })
                .is_err()
            {
                return;
            }
        }
        if count == limit {
            continue;
        }
        let timeout = follow_ups
            .first()
            .map(|ms| Duration::from_millis(*ms))
            .unwrap_or(shared.poll_interval);
        crossbeam_channel::select! {
            recv(wake) -> _ => follow_ups = &FOLLOW_UPS_MS,
            // A settled message may have been the head of its ordering key: the next one of
            // that key is claimable now, not at the next poll.
            recv(capacity) -> _ => follow_ups = &[],
            default(timeout) => follow_ups = follow_ups.get(1..).unwrap_or(&[]),
        }
    }
}

fn handler(shared: &Shared<dyn Store>, jobs: Receiver<Job>, outcomes: Sender<Outcome>) {
    for job in jobs.iter() {
        let settlement = if shared.stopping() {
            Settlement::Release
        } else if Instant::now() + shared.handler_timeout > job.lease_ends {
            log::warn!(
                "outbox: message {} ({}) waited too long for a handler thread; giving it back \
                 before its lease runs out (add handler threads or lower the batch size)",
                job.message.message_id,
                job.message.message_type
            );
            Settlement::Release
        } else {
            process(shared, &job.message)
        };
        let outcome = Outcome {
            token: job.token,
            position: job.message.position,
            message_id: job.message.message_id,
            settlement,
        };
        if outcomes.send(outcome).is_err() {
            return;
        }
    }
}

fn process(shared: &Shared<dyn Store>, message: &ClaimedMessage) -> Settlement {
    let Some(registration) = shared.registry.get(&message.message_type) else {
        return dead_letter(
            message,
            format!(
                "no handler is registered for message type `{}` in this worker (it handles \
                 {:?}); deploy a handler for it, then re-queue this dead letter",
                message.message_type,
                shared.registry.message_types()
            ),
        );
    };
    let policy = registration
        .retry_policy()
        .unwrap_or_else(|| shared.retry_policy.clone());
    if message.attempt > policy.attempts() {
        // Every earlier attempt ended without an outcome: each time, the worker holding the
        // message died (an abort, a crash in native code, the OOM killer). Do not let it
        // take down one more.
        return dead_letter(
            message,
            format!(
                "gave up after {} attempts: the worker processing it was lost each time (a \
                 crash or abort in the handler?)",
                message.attempt - 1
            ),
        );
    }
    let delivery = Delivery {
        message_id: message.message_id,
        message_type: message.message_type.clone(),
        attempt: message.attempt,
    };
    let mut ctx = Context::new(&delivery, &shared.resources);
    let started = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| {
        registration.dispatch(&message.payload, &mut ctx)
    }));
    let (error, retry_after) = match result {
        Ok(Ok(())) => {
            log::debug!(
                "outbox: message {} ({}) attempt {} processed in {:?}",
                message.message_id,
                message.message_type,
                message.attempt,
                started.elapsed()
            );
            return Settlement::Done;
        }
        Ok(Err(error @ DispatchError::Deserialize { .. })) => {
            return dead_letter(message, error.to_string());
        }
        Ok(Err(DispatchError::Process(failure))) if failure.kind() == FailureKind::Permanent => {
            return dead_letter(
                message,
                format!(
                    "failed permanently on attempt {}: {}",
                    message.attempt,
                    failure.reason()
                ),
            );
        }
        Ok(Err(DispatchError::Process(failure))) => {
            (failure.reason().to_owned(), failure.retry_after())
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic payload".to_owned());
            (format!("the handler panicked: {text}"), None)
        }
    };
    if !policy.allows_retry_after(message.attempt) {
        return dead_letter(
            message,
            format!("gave up after {} attempts: {error}", message.attempt),
        );
    }
    let error = storable(error);
    let delay = policy.delay(message.attempt, retry_after);
    log::info!(
        "outbox: message {} ({}) attempt {} failed, retrying in {:?}: {error}",
        message.message_id,
        message.message_type,
        message.attempt,
        delay
    );
    Settlement::Retry { delay, error }
}

fn dead_letter(message: &ClaimedMessage, error: String) -> Settlement {
    let error = storable(error);
    log::warn!(
        "outbox: message {} ({}) dead-lettered: {error}",
        message.message_id,
        message.message_type
    );
    Settlement::DeadLetter { error }
}

/// Makes an error text storable: bounded in length, and without NUL characters, which
/// PostgreSQL's text columns refuse.
fn storable(text: String) -> String {
    let mut text = if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    };
    if text.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

fn acker(shared: &Shared<dyn Store>, outcomes: Receiver<Outcome>, capacity: Sender<()>) {
    let max_batch = shared.batch_size.max(64) * 4;
    let mut batch = Vec::with_capacity(max_batch);
    while let Ok(first) = outcomes.recv() {
        batch.push(first);
        take_ready(&outcomes, &mut batch, max_batch);
        // Each settlement costs the database a statement and a commit whatever its size: while
        // more outcomes are on their way, let them gather. A sleep, not a receive with a
        // deadline, so that handler threads do not wake the acker once per outcome.
        let more_coming = shared.in_flight.load(Ordering::SeqCst) > batch.len();
        if batch.len() < shared.batch_size && more_coming && !shared.stopping() {
            std::thread::sleep(SETTLE_LINGER);
            take_ready(&outcomes, &mut batch, max_batch);
        }
        settle(shared, &batch);
        shared.in_flight.fetch_sub(batch.len(), Ordering::SeqCst);
        batch.clear();
        let _ = capacity.try_send(());
    }
}

fn take_ready(outcomes: &Receiver<Outcome>, batch: &mut Vec<Outcome>, max_batch: usize) {
    let room = max_batch.saturating_sub(batch.len());
    batch.extend(outcomes.try_iter().take(room));
}

/// How long the acker waits for more outcomes to settle together, when more are on their way.
/// It delays only the settlement (and the claim of what waits behind it in its ordering key),
/// never a delivery.
const SETTLE_LINGER: Duration = Duration::from_millis(2);

/// Whole-batch attempts before settling outcome by outcome.
const BATCH_SETTLE_TRIES: u32 = 3;

/// Rounds in which an outcome alone keeps failing while others succeed, before it is given up.
const POISON_OUTCOME_ROUNDS: u32 = 5;

/// Saves the batch's outcomes, retrying while the store fails. After a few failed attempts it
/// saves them one by one, so an outcome the database keeps refusing cannot hold up the rest; one
/// that fails alone round after round while others succeed is given up (its message returns when
/// its lease ends). While every outcome fails (the database is down), it keeps trying.
fn settle(shared: &Shared<dyn Store>, batch: &[Outcome]) {
    let mut unsettled: Vec<Outcome> = batch.to_vec();
    let mut failures = 0u32;
    let mut poison_rounds = 0u32;
    loop {
        let one_by_one = failures >= BATCH_SETTLE_TRIES;
        let groups: Vec<Vec<Outcome>> = if one_by_one {
            unsettled.iter().map(|o| vec![o.clone()]).collect()
        } else {
            vec![std::mem::take(&mut unsettled)]
        };
        let total = groups.len();
        let mut failed = Vec::new();
        let mut last_error = None;
        for group in groups {
            match shared.store.settle(&group) {
                Ok(fenced) => count_settled(shared, &group, &fenced),
                Err(error) => {
                    failed.extend(group);
                    last_error = Some(error);
                }
            }
        }
        let Some(error) = last_error else {
            return;
        };
        if one_by_one && failed.len() < total {
            poison_rounds += 1;
        }
        if poison_rounds >= POISON_OUTCOME_ROUNDS {
            for outcome in &failed {
                log::error!(
                    "outbox: giving up saving the outcome of message {} ({:?}); it will be \
                     processed again when its lease ends: {error}",
                    outcome.message_id,
                    outcome.settlement
                );
            }
            return;
        }
        if shared.stopping() && shared.past_give_up() {
            log::error!(
                "outbox: giving up settling {} messages at the shutdown deadline; their leases \
                 will expire and they will be processed again: {error}",
                failed.len()
            );
            return;
        }
        unsettled = failed;
        failures += 1;
        let pause = Duration::from_millis(50 << failures.min(6)).min(Duration::from_secs(2));
        log::error!(
            "outbox: settling {} messages failed (retrying in {pause:?}): {error}",
            unsettled.len()
        );
        std::thread::sleep(pause);
    }
}

fn count_settled(shared: &Shared<dyn Store>, batch: &[Outcome], fenced: &[i64]) {
    let stats = &shared.stats;
    for outcome in batch {
        if fenced.contains(&outcome.position) {
            log::warn!(
                "outbox: the lease on message {} passed to another claim before its outcome \
                 ({:?}) was saved; the outcome is dropped",
                outcome.message_id,
                outcome.settlement
            );
            stats.fenced.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let counter = match outcome.settlement {
            Settlement::Done => &stats.succeeded,
            Settlement::Retry { .. } => &stats.retried,
            Settlement::DeadLetter { .. } => &stats.dead_lettered,
            Settlement::Release => &stats.released,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn listen(shared: &Shared<dyn Store>, mut listener: Box<dyn Listener>, wake: Sender<()>) {
    let mut failures = 0u32;
    while !shared.stopping() {
        match listener.wait(Duration::from_millis(200)) {
            Ok(true) => {
                failures = 0;
                let _ = wake.try_send(());
            }
            Ok(false) => failures = 0,
            Err(error) => {
                failures += 1;
                let pause =
                    Duration::from_millis(100 << failures.min(6)).min(Duration::from_secs(5));
                log::warn!(
                    "outbox: lost the notification connection (polling meanwhile, reconnecting \
                     in {pause:?}): {error}"
                );
                std::thread::sleep(pause);
                match shared.store.listen() {
                    Ok(Some(fresh)) => {
                        listener = fresh;
                        // Commits may have happened while nobody listened.
                        let _ = wake.try_send(());
                    }
                    Ok(None) => return,
                    Err(error) => log::warn!("outbox: reconnecting the listener failed: {error}"),
                }
            }
        }
    }
}
