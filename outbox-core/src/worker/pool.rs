//! The handler threads' common parts ([`HandlerPool`]): what each thread takes its jobs from
//! and sends its outcomes to, which threads the watchdog retired, and what only handlers use
//! (the application's resources, the store's transactional settlement, the paused types).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crossbeam_channel::Sender;

use crate::context::{Resources, Settlements};
use crate::store::Outcome;

use super::jobs::JobReceiver;

/// The handler threads' common parts: the jobs they take, where their outcomes go, the
/// number of the next one, and which are retired. Starting one is
/// [`handlers::spawn`](super::handlers::spawn).
pub(crate) struct HandlerPool {
    jobs: JobReceiver,
    outcomes: Sender<Outcome>,
    next_thread: AtomicUsize,
    /// Threads the watchdog gave up on: each ends once its stuck handler returns.
    retired: Mutex<HashSet<usize>>,
    /// The application's resources, for handlers' contexts.
    pub resources: Resources,
    /// The store's transactional settlement, for exactly-once handlers.
    pub settlements: Settlements,
    /// The message types an operator paused, as the housekeeper last read them.
    pub type_pauses: Arc<TypePauses>,
}

/// What the handlers need of the worker beyond their channels.
pub(crate) struct HandlerParts {
    pub resources: Resources,
    pub settlements: Settlements,
    pub type_pauses: Arc<TypePauses>,
}

impl HandlerPool {
    pub fn new(jobs: JobReceiver, outcomes: Sender<Outcome>, parts: HandlerParts) -> Self {
        let HandlerParts {
            resources,
            settlements,
            type_pauses,
        } = parts;
        HandlerPool {
            jobs,
            outcomes,
            next_thread: AtomicUsize::new(0),
            retired: Mutex::new(HashSet::new()),
            resources,
            settlements,
            type_pauses,
        }
    }

    /// The watchdog gave up on `thread`: it ends after its stuck handler returns.
    pub fn retire(&self, thread: usize) {
        self.retired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(thread);
    }

    /// Whether the watchdog gave up on `thread` (asked once: the answer is taken).
    pub fn is_retired(&self, thread: usize) -> bool {
        self.retired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&thread)
    }

    /// For a new thread: its number, the jobs to take and where to send outcomes.
    pub fn next(&self) -> (usize, JobReceiver, Sender<Outcome>) {
        let thread = self.next_thread.fetch_add(1, Ordering::Relaxed);
        (thread, self.jobs.clone(), self.outcomes.clone())
    }
}

/// The message types an operator paused, with the reasons: written by the housekeeper as it
/// reads the store, read by the handlers before they run a message.
#[derive(Debug, Default)]
pub(crate) struct TypePauses(RwLock<BTreeMap<String, String>>);

impl TypePauses {
    /// Replaces the paused types with `paused`.
    pub fn follow(&self, paused: BTreeMap<String, String>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = paused;
    }

    /// Why an operator paused `message_type`, if one did.
    pub fn reason(&self, message_type: &str) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(message_type)
            .cloned()
    }
}
