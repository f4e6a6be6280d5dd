//! The worker's settings: the builder applications configure, and the checked configuration
//! the threads run with.

use std::sync::Arc;
use std::time::Duration;

use crate::context::Resources;
use crate::destination::{Destination, DestinationOptions, NameError};
use crate::registry::RegistryError;
use crate::retry::RetryPolicy;
use crate::store::{Store, StoreError};

use super::timing::{HEARTBEATS_PER_LEASE, MAX_DURATION, MIN_LEASE};

/// The defaults, documented on [`Worker::builder`](super::Worker::builder).
const DEFAULT_HANDLER_THREADS: usize = 16;
const DEFAULT_BATCH_SIZE: usize = 64;
const DEFAULT_MAX_BATCH_SIZE: usize = 256;
const MAX_BATCH_SIZE: usize = 10_000;
const DEFAULT_LEASE: Duration = Duration::from_secs(60);
const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
const DEFAULT_UNKNOWN_TYPE_GRACE: Duration = Duration::from_secs(15 * 60);
const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 32 << 20;
const DEFAULT_BACKLOG_INTERVAL: Duration = Duration::from_secs(15);

/// Builds a worker; see [`Worker::builder`](super::Worker::builder).
pub struct WorkerBuilder<S> {
    pub(super) store: S,
    pub(super) resources: Resources,
    pub(super) destinations: Vec<(String, Arc<dyn Destination>, DestinationOptions)>,
    pub(super) subscriptions: Option<super::subscribers::SubscriptionDelivery>,
    /// A resource type given twice: the second would replace the first unseen.
    duplicate_resource: Option<&'static str>,
    settings: Settings,
}

/// The settings as given, before they are checked.
#[derive(Debug, Clone)]
struct Settings {
    handler_threads: usize,
    /// `None`: claims start at the default and grow up to the default largest.
    batch_size: Option<usize>,
    /// `None`: as large as `batch_size` when that is given (a fixed size), else the default.
    max_batch_size: Option<usize>,
    lease: Duration,
    handler_timeout: Duration,
    poll_interval: Duration,
    listen: bool,
    retry_policy: RetryPolicy,
    unknown_type_grace: Duration,
    max_in_flight_bytes: usize,
    backlog_interval: Duration,
    max_deferral: Option<Duration>,
}

/// The checked configuration the worker's threads run with.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub handler_threads: usize,
    /// The first and smallest claim size (see `claimer::ClaimSize`).
    pub batch_size: usize,
    /// The largest claim size.
    pub max_batch_size: usize,
    pub lease: Duration,
    pub heartbeat: Duration,
    pub handler_timeout: Duration,
    pub poll_interval: Duration,
    pub listen: bool,
    pub retry_policy: RetryPolicy,
    pub unknown_type_grace: Duration,
    /// Messages held at most: room for a full batch of the largest size to be claimed while
    /// the previous one runs.
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    /// How often the housekeeper samples the store's backlog for the metrics gauges.
    pub backlog_interval: Duration,
    /// How long after its enqueue a message may still be deferred; `None`: its retry policy's
    /// horizon.
    pub max_deferral: Option<Duration>,
}

impl<S> std::fmt::Debug for WorkerBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let destinations: Vec<&str> = self.destinations.iter().map(|d| d.0.as_str()).collect();
        f.debug_struct("WorkerBuilder")
            .field("resources", &self.resources)
            .field("destinations", &destinations)
            .field("settings", &self.settings)
            .finish()
    }
}

impl<S: Store> WorkerBuilder<S> {
    pub(super) fn new(store: S) -> Self {
        WorkerBuilder {
            store,
            resources: Resources::new(),
            destinations: Vec::new(),
            subscriptions: None,
            duplicate_resource: None,
            settings: Settings {
                handler_threads: DEFAULT_HANDLER_THREADS,
                batch_size: None,
                max_batch_size: None,
                lease: DEFAULT_LEASE,
                handler_timeout: DEFAULT_HANDLER_TIMEOUT,
                poll_interval: DEFAULT_POLL_INTERVAL,
                listen: true,
                retry_policy: RetryPolicy::default(),
                unknown_type_grace: DEFAULT_UNKNOWN_TYPE_GRACE,
                max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
                backlog_interval: DEFAULT_BACKLOG_INTERVAL,
                max_deferral: None,
            },
        }
    }

    /// Threads running handlers at once (default 16). Webhook delivery waits on the network,
    /// so this is usually several times the core count.
    pub fn handler_threads(mut self, threads: usize) -> Self {
        self.settings.handler_threads = threads;
        self
    }

    /// Messages claimed per database round trip, at most 10,000. By default claims start at 64
    /// and double up to 256 while the handler threads keep up with them (they found nothing
    /// left to run when a full claim came back), and halve back when a claim comes back short
    /// or a claim's worth still waits for a handler: large claims for a fast drain, small ones
    /// for a slow receiver and for workers that share a backlog. For a second after a claim
    /// takes a message of a raised [`Priority`](crate::Priority), claims stay at 64: the next
    /// raised message waits for the next claim, and small claims come soonest. Giving a size
    /// fixes it (unless [`max_batch_size`](Self::max_batch_size) lets it grow). The worker
    /// holds at most `2 × claim size + handler_threads` messages (`2 × max_batch_size +
    /// handler_threads` for a second after each claim that takes a raised priority).
    pub fn batch_size(mut self, size: usize) -> Self {
        self.settings.batch_size = Some(size);
        self
    }

    /// The largest claim (default 256, or `batch_size` when that is given): claims grow up to it
    /// from [`batch_size`](Self::batch_size) while the handler threads keep up with them. At
    /// least `batch_size`, at most 10,000. On 2 cores, claims growing to 256 drained a no-op
    /// backlog 1.6 × as fast as claims of 64 on PostgreSQL, 1.4 × on MariaDB and SQLite.
    pub fn max_batch_size(mut self, size: usize) -> Self {
        self.settings.max_batch_size = Some(size);
        self
    }

    /// How long a claim holds its messages before another worker may take them (default 60 s,
    /// at least 2 s). The worker renews the leases of the messages it holds three times per
    /// lease (a heartbeat), so a long handler keeps its message; the lease is how long the
    /// messages of a worker that died wait before another worker delivers them.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// The longest one `process` call may take (default 30 s, and at least the longest
    /// timeout of the worker's destinations, whatever the order of the builder's calls). A handler still running after it (plus a second of grace) counts
    /// as a timed-out attempt: the message is retried with backoff, the stuck thread is
    /// replaced so the worker keeps its capacity, and its late outcome is dropped.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.settings.handler_timeout = timeout;
        self
    }

    /// How often to look for due messages when nothing wakes the worker (default 1 s): the
    /// safety net behind wake-ups, and how soon retries come due.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.settings.poll_interval = interval;
        self
    }

    /// Only poll: no `LISTEN` connection (e.g. behind PgBouncer in transaction mode) and no
    /// in-process wake-ups.
    pub fn poll_only(mut self) -> Self {
        self.settings.listen = false;
        self
    }

    /// The retry policy of handlers that do not set their own.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.settings.retry_policy = policy;
        self
    }

    /// How long a message whose type no handler in this worker serves is retried before it is
    /// dead-lettered (default 15 minutes). During a rolling deploy an old worker meets the
    /// types only new workers know: it gives them back, without counting an attempt, until a
    /// new worker takes them.
    pub fn unknown_type_grace(mut self, grace: Duration) -> Self {
        self.settings.unknown_type_grace = grace;
        self
    }

    /// The most payload bytes held at once (default 32 MiB), besides the message count: claims
    /// stop while that much waits or runs. A single message larger than this is still
    /// delivered, alone.
    pub fn max_in_flight_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_in_flight_bytes = bytes;
        self
    }

    /// How often the worker samples the store's backlog (messages pending, age of the oldest
    /// due one) for the [metrics](crate::metrics) gauges (default 15 s, at least 1 s): one
    /// query that counts the outbox table, so keep it modest with a large backlog. The first
    /// sample is taken when the worker starts. On PostgreSQL the sample also finds a crashed
    /// worker's messages once their lease has run out (they keep their place behind the claims'
    /// cursor), so it bounds how much longer than the lease they wait.
    pub fn backlog_interval(mut self, interval: Duration) -> Self {
        self.settings.backlog_interval = interval;
        self
    }

    /// How long after its enqueue a message may still be deferred without spending an attempt
    /// (its destination paused or holding, its handler deferring it) before it is
    /// dead-lettered with the reason (default: its retry policy's
    /// [`horizon`](crate::RetryPolicy::horizon), about 15 hours, and at least an hour): a
    /// destination gone for good without saying so does not keep its messages forever, and
    /// receivers that keep message ids for the retry horizon still drop every duplicate.
    ///
    /// An operator's pause of the message's type or destination restarts the count when it
    /// ends (a weekend's pause dead-letters nothing after the resume), and a turn under the
    /// destination's rate limit, set or learned, never counts: the destination takes its
    /// messages at that rate, however long the line.
    pub fn max_deferral(mut self, horizon: Duration) -> Self {
        self.settings.max_deferral = Some(horizon);
        self
    }

    /// Adds a shared resource handlers reach with
    /// [`Context::resource`](crate::Context::resource): one per type (`spawn` refuses a type
    /// given twice). Destinations, of which there may be several of one type, are given with
    /// [`destination`](Self::destination) instead.
    pub fn resource<T: Send + Sync + 'static>(mut self, resource: T) -> Self {
        if self.resources.contains::<T>() {
            self.duplicate_resource = Some(std::any::type_name::<T>());
        }
        self.resources.insert(resource);
        self
    }

    /// Replaces all resources.
    pub fn resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Adds `destination` (a webhook endpoint, a broker) under `name`, with the default
    /// [`DestinationOptions`]. Messages reach it by that name: routed types
    /// (`#[outbox_handler("type", deliver_to = "name")]`) and handlers
    /// ([`Context::destination`](crate::Context::destination)).
    ///
    /// Every destination is wrapped the same way: its health is kept (paused after failures,
    /// probed, disabled when it says it is gone) and shared through the store, when the worker
    /// starts and every few seconds, and its deliveries are counted in the
    /// [metrics](crate::metrics). `spawn` refuses two destinations with one name, and a routed
    /// type whose destination is missing.
    pub fn destination(self, name: impl Into<String>, destination: impl Destination) -> Self {
        self.destination_with(name, destination, DestinationOptions::new())
    }

    /// Adds `destination` under `name`, wrapped as `options` say.
    pub fn destination_with(
        mut self,
        name: impl Into<String>,
        destination: impl Destination,
        options: DestinationOptions,
    ) -> Self {
        self.destinations
            .push((name.into(), Arc::new(destination), options));
        self
    }

    /// Delivers the events of message types routed to
    /// [`SUBSCRIBERS`](crate::subscription::SUBSCRIBERS) to the subscriptions the store keeps,
    /// each as its own destination built by `delivery`'s transport (see
    /// [`crate::subscription`]). Without it, `spawn` refuses a type routed to them.
    pub fn subscriptions(mut self, delivery: super::subscribers::SubscriptionDelivery) -> Self {
        self.subscriptions = Some(delivery);
        self
    }

    /// The checked configuration, or which setting is out of range.
    pub(super) fn config(&self) -> Result<Config, WorkerError> {
        let s = &self.settings;
        let invalid = |setting: &'static str, problem: String| {
            Err(WorkerError::InvalidConfig { setting, problem })
        };
        if let Some(resource) = self.duplicate_resource {
            return invalid(
                "resource",
                format!(
                    "two resources of type `{resource}` were given; a worker keeps one per type, \
                     so the second would replace the first (give destinations, of which there \
                     may be several of one type, with `destination(name, ..)`)"
                ),
            );
        }
        if s.handler_threads == 0 || s.handler_threads > 4096 {
            return invalid(
                "handler_threads",
                format!("{} is not within 1..=4096", s.handler_threads),
            );
        }
        let batch_size = s.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
        if batch_size == 0 || batch_size > MAX_BATCH_SIZE {
            return invalid(
                "batch_size",
                format!("{batch_size} is not within 1..={MAX_BATCH_SIZE}"),
            );
        }
        let max_batch_size = match (s.max_batch_size, s.batch_size) {
            (Some(largest), _) => largest,
            (None, Some(fixed)) => fixed,
            (None, None) => DEFAULT_MAX_BATCH_SIZE,
        };
        if max_batch_size < batch_size || max_batch_size > MAX_BATCH_SIZE {
            return invalid(
                "max_batch_size",
                format!(
                    "{max_batch_size} is not within batch_size ({batch_size})..={MAX_BATCH_SIZE}"
                ),
            );
        }
        if s.max_in_flight_bytes == 0 {
            return invalid("max_in_flight_bytes", "must be at least 1".into());
        }
        for (setting, value, min) in [
            ("lease", s.lease, MIN_LEASE),
            (
                "handler_timeout",
                s.handler_timeout,
                Duration::from_millis(1),
            ),
            ("poll_interval", s.poll_interval, Duration::from_millis(1)),
            ("unknown_type_grace", s.unknown_type_grace, Duration::ZERO),
            (
                "backlog_interval",
                s.backlog_interval,
                Duration::from_secs(1),
            ),
        ] {
            if value < min || value > MAX_DURATION {
                return invalid(
                    setting,
                    format!(
                        "{value:?} is not within {min:?}..={} days",
                        MAX_DURATION.as_secs() / 86_400
                    ),
                );
            }
        }
        Ok(Config {
            handler_threads: s.handler_threads,
            batch_size,
            max_batch_size,
            lease: s.lease,
            heartbeat: s.lease / HEARTBEATS_PER_LEASE,
            handler_timeout: s.handler_timeout,
            poll_interval: s.poll_interval,
            listen: s.listen,
            retry_policy: s.retry_policy.clone(),
            unknown_type_grace: s.unknown_type_grace,
            max_in_flight: 2 * max_batch_size + s.handler_threads,
            max_in_flight_bytes: s.max_in_flight_bytes,
            backlog_interval: s.backlog_interval,
            max_deferral: s.max_deferral,
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
    /// A setting is out of range.
    #[error("invalid worker setting `{setting}`: {problem}")]
    InvalidConfig {
        /// The builder method of the setting.
        setting: &'static str,
        /// What is wrong with its value.
        problem: String,
    },
    /// The store failed while the worker started: unreachable, not migrated, or its pool too
    /// small for the worker.
    #[error("the outbox store failed while the worker started: {0}")]
    Store(#[source] StoreError),
    /// A destination's name is invalid or given twice.
    #[error(transparent)]
    Destination(#[from] NameError),
    /// A routed message type names a destination the worker does not have.
    #[error(
        "message type `{message_type}` is routed to destination `{destination}` (by \
         `{handler}`), but this worker has no destination of that name (it has {known:?}); add \
         it with `WorkerBuilder::destination(\"{destination}\", ..)`"
    )]
    UnknownDestination {
        /// The routed type.
        message_type: &'static str,
        /// The struct that routes it.
        handler: &'static str,
        /// The destination it names.
        destination: &'static str,
        /// The destinations the worker has.
        known: Vec<String>,
    },
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
