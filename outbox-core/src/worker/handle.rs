//! What the application holds of a running worker: the handle, and the stopper that asks it
//! to stop.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::config::WorkerError;
use super::shared::Shared;
use super::vitals::{Health, WorkerStats};
use super::wake;
use crate::destination::DestinationState;

/// A running worker. Dropping it asks the worker to stop without waiting; call
/// [`shutdown`](WorkerHandle::shutdown) to wait.
pub struct WorkerHandle {
    pub(super) shared: Arc<Shared>,
    pub(super) wake: Sender<()>,
    pub(super) _local_wakeups: Option<wake::Subscription>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("stats", &self.stats())
            .field("health", &self.health())
            .finish()
    }
}

/// Asks a worker to stop, from anywhere (e.g. a signal handler's thread).
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
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
        self.shared.request_stop();
        let _ = self.wake.try_send(());
    }
}

impl WorkerHandle {
    /// What the worker has done so far.
    pub fn stats(&self) -> WorkerStats {
        self.shared.counters.snapshot()
    }

    /// Messages claimed and not yet settled.
    pub fn in_flight(&self) -> usize {
        self.shared.held.count()
    }

    /// How the worker's threads are doing; see [`Health`].
    pub fn health(&self) -> Health {
        let vitals = &self.shared.vitals;
        let since = |at: &Mutex<Option<Instant>>| {
            at.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map(|at| at.elapsed())
        };
        Health {
            claimer_alive: vitals.claimer_alive.load(Ordering::SeqCst),
            acker_alive: vitals.acker_alive.load(Ordering::SeqCst),
            warden_alive: vitals.warden_alive.load(Ordering::SeqCst),
            housekeeper_alive: vitals.housekeeper_alive.load(Ordering::SeqCst),
            listener_alive: vitals
                .has_listener
                .load(Ordering::SeqCst)
                .then(|| vitals.listener_alive.load(Ordering::SeqCst)),
            handler_threads: vitals.handler_threads.load(Ordering::SeqCst),
            stuck_handlers: self.shared.held.stuck(),
            since_last_claim: since(&vitals.last_claim),
            since_last_settle: since(&vitals.last_settle),
            store_errors_in_a_row: vitals
                .claim_errors
                .load(Ordering::Relaxed)
                .max(vitals.settle_errors.load(Ordering::Relaxed)),
            panics: vitals.panics.load(Ordering::Relaxed),
            connection_shortage: self.shared.store.connection_shortage(),
            longest_store_call: vitals.longest_store_call(),
            in_flight: self.shared.held.count(),
            stopping: self.shared.stopping(),
        }
    }

    /// Where destination `name` stands (healthy, held, paused, disabled) in this worker, or
    /// `None` if the worker has no destination of that name.
    pub fn destination_state(&self, name: &str) -> Option<DestinationState> {
        self.shared.destinations.get(name).map(|d| d.state())
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
    pub fn shutdown(self, deadline: Duration) -> Result<WorkerStats, WorkerError> {
        let give_up_at = Instant::now().checked_add(deadline);
        self.shared.set_give_up_at(give_up_at);
        self.stopper().stop();
        match self.shared.threads.wait(give_up_at) {
            0 => Ok(self.stats()),
            running => Err(WorkerError::ShutdownTimedOut { running }),
        }
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.stopper().stop();
    }
}
