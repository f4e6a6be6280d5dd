//! How the worker is doing: what it has done ([`WorkerStats`]) and whether its threads can
//! deliver ([`Health`]), counted by the roles as they run and read by the handle.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::timing::{STUCK_STORE_CALL, UNHEALTHY_STORE_ERRORS};

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
    /// Messages given back unprocessed (the worker stopping, a lease too short to start).
    pub released: u64,
    /// Messages given back for later without counting an attempt (no handler for their type
    /// yet).
    pub deferred: u64,
    /// Messages given back without counting an attempt because an operator paused their type
    /// or destination: each waits until resumed.
    pub paused: u64,
    /// Outcomes dropped because the lease had passed to another claim.
    pub fenced: u64,
    /// Attempts the watchdog counted as timed out (the handler ran past its timeout).
    pub timed_out: u64,
    /// Outcomes the database kept refusing, given up: their messages run again when their
    /// leases end.
    pub abandoned_outcomes: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub claimed: AtomicU64,
    pub succeeded: AtomicU64,
    pub retried: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub released: AtomicU64,
    pub deferred: AtomicU64,
    pub paused: AtomicU64,
    pub fenced: AtomicU64,
    pub timed_out: AtomicU64,
    pub abandoned_outcomes: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> WorkerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerStats {
            claimed: get(&self.claimed),
            succeeded: get(&self.succeeded),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            released: get(&self.released),
            deferred: get(&self.deferred),
            paused: get(&self.paused),
            fenced: get(&self.fenced),
            timed_out: get(&self.timed_out),
            abandoned_outcomes: get(&self.abandoned_outcomes),
        }
    }
}

/// How the worker's threads are doing, for liveness probes:
/// [`WorkerHandle::health`](crate::WorkerHandle::health).
///
/// ```no_run
/// # fn probe(worker: &outbox_core::WorkerHandle) -> u16 {
/// // In the application's health endpoint: 200 while the worker can deliver, 503 otherwise.
/// let health = worker.health();
/// if health.is_healthy() {
///     200
/// } else {
///     log::error!("outbox worker unhealthy: {health:?}");
///     503
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Whether the claimer thread runs.
    pub claimer_alive: bool,
    /// Whether the acker thread (settlements) runs.
    pub acker_alive: bool,
    /// Whether the warden thread (the lease heartbeat, the handler watchdog) runs.
    pub warden_alive: bool,
    /// Whether the housekeeper thread (the store's chores, sharing destinations' health) runs.
    pub housekeeper_alive: bool,
    /// Whether the listener thread runs (`None`: the worker has none).
    pub listener_alive: Option<bool>,
    /// Handler threads serving messages.
    pub handler_threads: usize,
    /// Handler threads stuck in a message past its timeout (replaced, but still held).
    pub stuck_handlers: usize,
    /// Since the last claim that reached the store (empty or not).
    pub since_last_claim: Option<Duration>,
    /// Since the last settlement the store took.
    pub since_last_settle: Option<Duration>,
    /// Store calls that failed in a row, across the claimer and the acker.
    pub store_errors_in_a_row: u32,
    /// The store call that has been running longest right now (`claim`, `settle`,
    /// `extend_leases`, ...) and for how long; `None` when none runs. A call that does not
    /// return (a connection whose peer vanished without a word) shows here while every other
    /// figure looks calm.
    pub longest_store_call: Option<(&'static str, Duration)>,
    /// Panics caught in the worker's own threads (not in handlers, whose panics are failed
    /// attempts).
    pub panics: u64,
    /// What keeps the worker short of the connections it holds, if anything has for a while
    /// ([`Store::connection_shortage`](crate::store::Store::connection_shortage)): the pool
    /// it shares with the application lends none, and the worker's roles share the connections
    /// it has, more slowly. It names the pool's size and what the worker and the application
    /// hold.
    pub connection_shortage: Option<String>,
    /// Messages held (claimed, not yet settled).
    pub in_flight: usize,
    /// Whether the worker was asked to stop.
    pub stopping: bool,
}

impl Health {
    /// Whether the worker can deliver: its threads run, at least one handler thread is free of
    /// a stuck message, the store answers and lends the worker its connections, and no store
    /// call has been running for 30 s or longer.
    pub fn is_healthy(&self) -> bool {
        self.claimer_alive
            && self.acker_alive
            && self.warden_alive
            && self.housekeeper_alive
            && self.listener_alive != Some(false)
            && self.handler_threads > self.stuck_handlers
            && self.store_errors_in_a_row < UNHEALTHY_STORE_ERRORS
            && self.connection_shortage.is_none()
            && self
                .longest_store_call
                .is_none_or(|(_, running)| running < STUCK_STORE_CALL)
    }
}

/// The threads' report of themselves.
#[derive(Debug, Default)]
pub(crate) struct Vitals {
    pub claimer_alive: AtomicBool,
    pub acker_alive: AtomicBool,
    pub warden_alive: AtomicBool,
    pub housekeeper_alive: AtomicBool,
    pub listener_alive: AtomicBool,
    pub has_listener: AtomicBool,
    pub handler_threads: AtomicUsize,
    pub last_claim: Mutex<Option<Instant>>,
    pub last_settle: Mutex<Option<Instant>>,
    pub claim_errors: AtomicU32,
    pub settle_errors: AtomicU32,
    pub panics: AtomicU64,
    /// The store calls running now, by role: since when, and which.
    calls: Mutex<Vec<(&'static str, Instant, &'static str)>>,
}

impl Vitals {
    pub fn claimed(&self) {
        *self
            .last_claim
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.claim_errors.store(0, Ordering::Relaxed);
    }

    pub fn settled(&self) {
        *self
            .last_settle
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.settle_errors.store(0, Ordering::Relaxed);
    }

    pub fn panicked(&self) {
        self.panics.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `call`, a store call of `operation` by `role`, recording it as running meanwhile.
    pub fn store_call<T>(
        &self,
        role: &'static str,
        operation: &'static str,
        call: impl FnOnce() -> T,
    ) -> T {
        struct Running<'a>(&'a Vitals, &'static str);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                let mut calls = self.0.calls.lock().unwrap_or_else(PoisonError::into_inner);
                calls.retain(|(role, _, _)| *role != self.1);
            }
        }
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((role, Instant::now(), operation));
        let _running = Running(self, role);
        call()
    }

    /// The store call running longest now, and for how long.
    pub(super) fn longest_store_call(&self) -> Option<(&'static str, Duration)> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .min_by_key(|(_, since, _)| *since)
            .map(|(_, since, operation)| (*operation, since.elapsed()))
    }
}

/// Sets a thread's alive flag while it lives, and clears it when the thread ends, however it
/// ends (a panic that escaped included).
pub(crate) struct AliveGuard<'a>(&'a AtomicBool);

impl<'a> AliveGuard<'a> {
    pub fn new(flag: &'a AtomicBool) -> Self {
        flag.store(true, Ordering::SeqCst);
        AliveGuard(flag)
    }
}

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Health {
        Health {
            claimer_alive: true,
            acker_alive: true,
            warden_alive: true,
            housekeeper_alive: true,
            listener_alive: None,
            handler_threads: 4,
            stuck_handlers: 0,
            since_last_claim: Some(Duration::from_millis(5)),
            since_last_settle: Some(Duration::from_millis(5)),
            store_errors_in_a_row: 0,
            longest_store_call: None,
            panics: 0,
            connection_shortage: None,
            in_flight: 0,
            stopping: false,
        }
    }

    #[test]
    fn a_store_call_running_past_the_bound_makes_the_worker_unhealthy() {
        assert!(healthy().is_healthy());
        let running = |secs| Health {
            longest_store_call: Some(("claim", Duration::from_secs(secs))),
            ..healthy()
        };
        assert!(running(1).is_healthy(), "a call under way is normal");
        assert!(!running(STUCK_STORE_CALL.as_secs()).is_healthy());
        assert!(!Health {
            warden_alive: false,
            ..healthy()
        }
        .is_healthy());
        assert!(!Health {
            connection_shortage: Some("the pool lends none".into()),
            ..healthy()
        }
        .is_healthy());
    }

    #[test]
    fn store_calls_are_tracked_per_role_while_they_run() {
        let vitals = Vitals::default();
        let seen = vitals.store_call("claimer", "claim", || {
            vitals.store_call("warden", "extend_leases", || vitals.longest_store_call())
        });
        assert_eq!(seen.map(|(operation, _)| operation), Some("claim"));
        assert_eq!(vitals.longest_store_call(), None, "both ended");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            vitals.store_call("acker", "settle", || panic!("boom"))
        }));
        assert!(panicked.is_err());
        assert_eq!(
            vitals.longest_store_call(),
            None,
            "a panic ends the call too"
        );
    }
}
