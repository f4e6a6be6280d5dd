//! What the worker's threads share, and how they are started and waited for.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use crate::destination::Destinations;
use crate::registry::Registry;
use crate::store::WorkerStore;

use super::config::Config;
use super::held::Held;
use super::pool::HandlerPool;
use super::subscribers::Subscribers;
use super::vitals::{Counters, Vitals};

/// The state every role of one worker reads.
pub(crate) struct Shared {
    pub config: Config,
    pub store: Arc<dyn WorkerStore>,
    pub registry: Registry,
    pub destinations: Destinations,
    /// The subscriptions, if the worker delivers to them.
    pub subscribers: Option<Subscribers>,
    pub held: Held,
    pub counters: Counters,
    pub vitals: Vitals,
    pub threads: Threads,
    pub stopping: AtomicBool,
    give_up_at: Mutex<Option<Instant>>,
    /// Dropped when the worker stops: wakes the threads that wait on it.
    stop_signal: Mutex<Option<Sender<()>>>,
    pub pool: HandlerPool,
}

/// What a worker is made of, besides its threads' channels.
pub(crate) struct Parts {
    pub config: Config,
    pub store: Arc<dyn WorkerStore>,
    pub registry: Registry,
    pub destinations: Destinations,
    pub subscribers: Option<Subscribers>,
}

impl Shared {
    pub fn new(parts: Parts, stop_signal: Sender<()>, pool: HandlerPool) -> Self {
        let Parts {
            config,
            store,
            registry,
            destinations,
            subscribers,
        } = parts;
        Shared {
            config,
            store,
            registry,
            destinations,
            subscribers,
            held: Held::default(),
            counters: Counters::default(),
            vitals: Vitals::default(),
            threads: Threads::default(),
            stopping: AtomicBool::new(false),
            give_up_at: Mutex::new(None),
            stop_signal: Mutex::new(Some(stop_signal)),
            pool,
        }
    }

    /// The `type` label of a message type in the metrics: the type if a handler of this
    /// worker serves it, a fixed placeholder otherwise (labels stay bounded).
    pub fn metric_type<'a>(&self, message_type: &'a str) -> &'a str {
        if self.registry.get(message_type).is_some() {
            message_type
        } else {
            crate::metrics::UNREGISTERED_TYPE
        }
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Asks every thread to stop.
    pub fn request_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop_signal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    pub fn set_give_up_at(&self, at: Option<Instant>) {
        *self
            .give_up_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = at;
    }

    /// Whether shutdown's deadline has passed.
    pub fn past_give_up(&self) -> bool {
        self.give_up_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| Instant::now() >= at)
    }

    /// Runs one iteration of a role's loop, surviving a panic in it: the panic is logged and
    /// counted in the worker's health, and the loop goes on after `pause`.
    pub fn survive(&self, role: &str, pause: Duration, iteration: impl FnOnce()) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(iteration)) {
            self.vitals.panicked();
            log::error!(
                "outbox: the {role} thread panicked ({}); it carries on",
                panic_text(panic.as_ref())
            );
            std::thread::sleep(pause);
        }
    }
}

pub(crate) use crate::error::panic_text;

/// The worker's threads: started with a name, counted while they run, joined at shutdown.
#[derive(Debug, Default)]
pub(crate) struct Threads {
    running: Arc<AtomicUsize>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

/// Counts a thread out when it ends, however it ends.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Threads {
    /// Starts a thread named `name` running `body`.
    pub fn spawn(&self, name: String, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        self.running.fetch_add(1, Ordering::SeqCst);
        let running = Running(Arc::clone(&self.running));
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            let _running = running;
            body();
        });
        match spawned {
            Ok(handle) => {
                let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
                handles.retain(|h| !h.is_finished());
                handles.push(handle);
                Ok(())
            }
            // The closure was dropped unrun, and with it the counter's guard.
            Err(error) => Err(error),
        }
    }

    /// Waits for every thread to end, at most until `give_up_at`; the threads still running.
    pub fn wait(&self, give_up_at: Option<Instant>) -> usize {
        loop {
            let running = self.running.load(Ordering::SeqCst);
            if running == 0 {
                break;
            }
            if give_up_at.is_some_and(|at| Instant::now() >= at) {
                return running;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let handles =
            std::mem::take(&mut *self.handles.lock().unwrap_or_else(PoisonError::into_inner));
        for handle in handles {
            let _ = handle.join();
        }
        0
    }
}
