//! The handler threads' common parts ([`HandlerPool`]): what each thread takes its jobs from
//! and sends its outcomes to, and which threads the watchdog retired.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crossbeam_channel::Sender;

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
}

impl HandlerPool {
    pub fn new(jobs: JobReceiver, outcomes: Sender<Outcome>) -> Self {
        HandlerPool {
            jobs,
            outcomes,
            next_thread: AtomicUsize::new(0),
            retired: Mutex::new(HashSet::new()),
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
