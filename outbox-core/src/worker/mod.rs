//! The worker: claims messages with a lease, processes them on a pool of threads, and settles
//! the outcomes in batches.
//!
//! ```text
//! claimer ──jobs (bounded, raised first)──▶ handler threads ──outcomes (bounded)──▶ acker
//!    ▲  wake: LISTEN/NOTIFY, in-process enqueue, poll timer   │ capacity freed
//!    └────────────────────────────────────────────────────────┘
//! ```
//!
//! One role per file: [`config`] (the builder and the checked settings), [`handle`] (what the
//! application holds: stats, health, shutdown), [`claimer`], [`handlers`] (the pool, and what
//! a finished attempt means), [`jobs`] (the channel between them, raised priorities first),
//! [`acker`] (settlements and the refused-outcome policy), [`warden`] (the lease heartbeat and
//! the handler watchdog), [`housekeeper`] (the chores no message waits for: per-key order's
//! safety net, pruning, gauges, shared health, pauses, the subscriptions cache),
//! [`subscribers`] (deliveries to the application's subscriptions), [`listener`]; [`held`] is
//! the book of what the worker holds, [`timing`] every interval it keeps.
//!
//! While claims come back short (a few ordering keys are all there is to claim), a settlement
//! may lease the next message of each key it settles ([`Store::settle_and_lease`](crate::store::Store::settle_and_lease)); the acker
//! then puts it on the jobs channel itself, so that a key's next message does not wait for a
//! claim.
//!
//! Claims grow from `batch_size` towards `max_batch_size` while the handler threads keep up
//! with them, and shrink back when they do not, or when a raised priority was just claimed.
//! The claimer never holds more than `max_in_flight` messages (`2 × max_batch_size +
//! handler_threads`; `2 × claim size + handler_threads` except for a second after a claim that
//! takes a raised priority) nor more than `max_in_flight_bytes` of payload, so a slow receiver
//! applies back-pressure (and keeps claims at their smallest) instead of filling memory. The
//! warden renews the leases of what the worker holds, so a lease bounds how long a dead
//! worker's messages wait, not how long a handler may run; its watchdog bounds that, with the
//! handler timeout.

mod acker;
mod backoff;
mod claimer;
mod config;
mod handle;
mod handlers;
mod held;
mod housekeeper;
mod jobs;
mod listener;
mod pool;
mod shared;
#[cfg(test)]
mod simulation;
mod subscribers;
#[cfg(test)]
mod tests;
mod text;
mod timing;
mod vitals;
mod wake;
mod warden;

use std::sync::Arc;

use crossbeam_channel::bounded;

use crate::context::Settlements;
use crate::destination::Destinations;
use crate::registry::Registry;
use crate::store::{TransactionalSettlement, WorkerStore};

pub use config::{WorkerBuilder, WorkerError};
pub use handle::{Stopper, WorkerHandle};
pub use subscribers::SubscriptionDelivery;
pub use vitals::{Health, WorkerStats};
pub use wake::notify_enqueued;

use acker::Acker;
use claimer::{ClaimSignals, Claimer};
use housekeeper::Housekeeper;
use pool::{HandlerParts, HandlerPool, TypePauses};
use shared::{Parts, Shared};
use warden::Warden;

/// The worker that delivers the outbox's messages. Start one per process with
/// [`Worker::builder`]; run more processes to scale out.
#[derive(Debug)]
pub struct Worker {
    _private: (),
}

impl Worker {
    /// A worker over `store` with the defaults: 16 handler threads, claims of 64 growing to 256
    /// while the handlers keep up, at most 32 MiB of payload held, a 30 s handler timeout, a
    /// 60 s lease (renewed while a message is held), a 1 s safety-net poll, wake-ups on, unknown
    /// types retried for 15 minutes, and the default [`RetryPolicy`](crate::RetryPolicy).
    pub fn builder<S: WorkerStore + TransactionalSettlement>(store: S) -> WorkerBuilder<S> {
        WorkerBuilder::new(store)
    }
}

impl<S: WorkerStore + TransactionalSettlement> WorkerBuilder<S> {
    /// Checks the configuration, the destinations, the store and the handler registry, and
    /// starts the threads.
    ///
    /// Fails on a setting out of range, two handlers with one type string, two destinations
    /// with one name, a routed type whose destination the worker does not have, two resources
    /// of one type, or a store that is unreachable, not migrated, or cannot lend the worker the
    /// connections it holds (three, plus one for `LISTEN` and one for rate limits across
    /// processes).
    pub fn spawn(self) -> Result<WorkerHandle, WorkerError> {
        let mut config = self.config()?;
        let registry = Registry::from_inventory()?;
        for (name, _, options) in &self.destinations {
            if let Some(problem) = options.problem() {
                return Err(WorkerError::InvalidConfig {
                    setting: "destination_with",
                    problem: format!("destination {name}: {problem}"),
                });
            }
        }
        let destinations = Destinations::new(self.destinations)?;
        for route in registry.routes() {
            let Some(destination) = route.destination() else {
                continue;
            };
            if destination == crate::subscription::SUBSCRIBERS && self.subscriptions.is_some() {
                continue;
            }
            if destinations.get(destination).is_none() {
                return Err(WorkerError::UnknownDestination {
                    message_type: route.message_type(),
                    handler: route.handler_name(),
                    destination,
                    known: destinations.names().map(str::to_owned).collect(),
                });
            }
        }
        let subscribers = self.subscriptions.map(subscribers::Subscribers::new);
        // The watchdog must never abandon a delivery that its destination would still finish.
        config.handler_timeout = config
            .handler_timeout
            .max(destinations.longest_timeout())
            .max(
                subscribers
                    .as_ref()
                    .map(subscribers::Subscribers::timeout)
                    .unwrap_or_default(),
            );
        let listens = config.listen;
        // The claimer's, the acker's and the housekeeper's, the listener's, and the one that
        // takes the turns of rate limits across processes.
        let connections = 3
            + usize::from(listens && self.store.listens())
            + usize::from(destinations.any_across_processes());
        self.store.check(connections).map_err(WorkerError::Store)?;
        log::info!(
            "outbox worker starting: {} handler threads, claims of {} to {} messages, lease {:?}, \
             handler timeout {:?}, handling {:?}, destinations {:?}",
            config.handler_threads,
            config.batch_size,
            config.max_batch_size,
            config.lease,
            config.handler_timeout,
            registry.message_types(),
            destinations.names().collect::<Vec<_>>()
        );
        crate::metrics::describe();
        destinations.publish_states();
        let listener = if listens {
            self.store.listen().map_err(WorkerError::Store)?
        } else {
            None
        };
        let (wake_tx, wake_rx) = bounded::<()>(1);
        let (capacity_tx, capacity_rx) = bounded::<()>(1);
        let (stop_tx, stop_rx) = bounded::<()>(0);
        // As many jobs as the worker may hold messages: the acker hands over what a settlement
        // leases without ever waiting for a handler thread.
        let (jobs_tx, jobs_rx) = jobs::channel(config.max_in_flight);
        let (outcomes_tx, outcomes_rx) = bounded(config.max_in_flight + config.handler_threads);
        let local_wakeups =
            (listens && self.store.wants_local_wakeups()).then(|| wake::subscribe(wake_tx.clone()));

        let handler_threads = config.handler_threads;
        let store = Arc::new(self.store);
        let settlements = Settlements::of(Arc::clone(&store));
        let store: Arc<dyn WorkerStore> = store;
        let parts = Parts {
            config,
            destinations: destinations.keeping_turns_in(&store),
            store,
            registry,
            subscribers,
        };
        let type_pauses = Arc::new(TypePauses::default());
        let handler_parts = HandlerParts {
            resources: self.resources,
            settlements,
            type_pauses: Arc::clone(&type_pauses),
        };
        let shared = Arc::new(Shared::new(
            parts,
            stop_tx,
            HandlerPool::new(jobs_rx, outcomes_tx.clone(), handler_parts),
        ));
        let handle = WorkerHandle {
            shared: Arc::clone(&shared),
            wake: wake_tx.clone(),
            _local_wakeups: local_wakeups,
        };
        // A destination disabled or paused before a restart, or a paused type, gets no
        // delivery: their records are read before the first claim.
        let mut housekeeper = Housekeeper::new(Arc::clone(&shared), type_pauses, stop_rx.clone());
        housekeeper.sync_subscriptions();
        housekeeper.sync_destinations();
        housekeeper.sync_pauses();
        // From here on, a failure to start a thread stops those already started (the handle's
        // drop). The threads count as alive from their start, before they first run.
        let vitals = &shared.vitals;
        for flag in [
            &vitals.claimer_alive,
            &vitals.acker_alive,
            &vitals.warden_alive,
            &vitals.housekeeper_alive,
        ] {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let acker_jobs = jobs_tx.clone();
        let signals = Arc::new(ClaimSignals::default());
        let warden = Warden::new(Arc::clone(&shared), outcomes_tx.clone(), stop_rx);
        let claimer = Claimer::new(
            Arc::clone(&shared),
            jobs_tx,
            outcomes_tx,
            wake_rx,
            capacity_rx,
            Arc::clone(&signals),
        );
        shared
            .threads
            .spawn("outbox-claimer".into(), move || claimer.run())?;
        for _ in 0..handler_threads {
            handlers::spawn(&shared)?;
        }
        let acker = Acker::new(
            Arc::clone(&shared),
            outcomes_rx,
            acker_jobs,
            capacity_tx,
            signals,
        );
        shared
            .threads
            .spawn("outbox-acker".into(), move || acker.run())?;
        shared
            .threads
            .spawn("outbox-warden".into(), move || warden.run())?;
        shared
            .threads
            .spawn("outbox-housekeeper".into(), move || housekeeper.run())?;
        if let Some(listener) = listener {
            for flag in [&shared.vitals.has_listener, &shared.vitals.listener_alive] {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            let owned = Arc::clone(&shared);
            shared.threads.spawn("outbox-listener".into(), move || {
                listener::run(owned, listener, wake_tx)
            })?;
        }
        Ok(handle)
    }
}
