//! The worker's threads against a `MemoryStore` with faults.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::testing::MemoryStore;
use crate::{Context, Handler, HandlerRegistration, Message, ProcessError, Worker, WorkerError};

#[derive(Serialize, Deserialize)]
struct Counted {
    n: u32,
}

static COUNTED: AtomicUsize = AtomicUsize::new(0);

impl Message for Counted {
    const MESSAGE_TYPE: &'static str = "core.counted";
}

impl Handler for Counted {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        COUNTED.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

inventory::submit! {
    HandlerRegistration::new::<Counted>("outbox_core::worker::tests::Counted")
}

fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    condition()
}

fn worker(store: &MemoryStore) -> crate::WorkerHandle {
    Worker::builder(store.clone())
        .handler_threads(2)
        .batch_size(4)
        .lease(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(20))
        .poll_only()
        .spawn()
        .unwrap()
}

#[test]
fn an_outcome_refused_forever_never_holds_up_the_others() {
    let store = MemoryStore::new();
    let positions: Vec<i64> = (0..20)
        .map(|n| store.enqueue_message(&Counted { n }, None))
        .collect();
    store.refuse_outcomes_of(positions[0]);
    let worker = worker(&store);
    assert!(
        eventually(Duration::from_secs(10), || store.rows().len() == 1),
        "the others waited: {} left",
        store.rows().len()
    );
    assert!(eventually(Duration::from_secs(10), || worker
        .stats()
        .abandoned_outcomes
        >= 1));
    assert_eq!(worker.in_flight(), 0, "the given-up outcome freed its slot");
    // Once the store takes it, the message runs again when its lease ends, and settles.
    store.accept(positions[0]);
    assert!(eventually(Duration::from_secs(10), || store
        .rows()
        .is_empty()));
    let stats = worker.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(stats.succeeded, 20, "{stats:?}");
}

#[test]
fn a_store_that_goes_down_is_reported_and_waited_for() {
    let store = MemoryStore::new();
    let worker = worker(&store);
    assert!(worker.health().is_healthy(), "{:?}", worker.health());
    store.set_down(true);
    for n in 0..10 {
        store.enqueue_message(&Counted { n }, None);
    }
    assert!(
        eventually(Duration::from_secs(10), || !worker.health().is_healthy()),
        "{:?}",
        worker.health()
    );
    let health = worker.health();
    assert!(health.claimer_alive && health.acker_alive, "{health:?}");
    store.set_down(false);
    assert!(eventually(Duration::from_secs(10), || store
        .rows()
        .is_empty()));
    assert!(eventually(Duration::from_secs(10), || worker
        .health()
        .is_healthy()));
    worker.shutdown(Duration::from_secs(5)).unwrap();
}

#[test]
fn spawn_refuses_a_store_that_cannot_lend_the_connections() {
    let store = MemoryStore::new();
    store.set_max_connections(Some(1));
    let err = Worker::builder(store).spawn().unwrap_err();
    assert!(matches!(err, WorkerError::Store(_)), "{err}");
    assert!(err.to_string().contains("the worker holds 3"), "{err}");
}

#[test]
fn spawn_refuses_two_destinations_with_one_name_and_two_resources_of_one_type() {
    use crate::destination::{DeliveryError, Destination, Envelope};

    struct Nowhere;
    impl Destination for Nowhere {
        fn kind(&self) -> &'static str {
            "nowhere"
        }
        fn deliver(&self, _: &Envelope) -> Result<(), DeliveryError> {
            Ok(())
        }
    }

    let store = MemoryStore::new();
    let err = Worker::builder(store.clone())
        .destination("mail", Nowhere)
        .destination("mail", Nowhere)
        .spawn()
        .unwrap_err();
    assert!(matches!(err, WorkerError::Destination(_)), "{err}");
    assert!(
        err.to_string()
            .contains("two destinations are named `mail`"),
        "{err}"
    );

    let err = Worker::builder(store)
        .resource(String::from("first"))
        .resource(String::from("second"))
        .spawn()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("two resources of type `alloc::string::String`"),
        "{err}"
    );
}

#[test]
fn an_outcome_that_waits_on_a_lock_is_waited_for_never_given_up() {
    let store = MemoryStore::new();
    let position = store.enqueue_message(&Counted { n: 1 }, None);
    store.lock(position);
    let worker = worker(&store);
    // Long past what the refused-outcome policy allows (it gives up after about 2 s).
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(store.rows().len(), 1, "not settled while locked");
    store.unlock(position);
    assert!(eventually(Duration::from_secs(10), || store
        .rows()
        .is_empty()));
    let stats = worker.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(
        (stats.abandoned_outcomes, stats.succeeded),
        (0, 1),
        "a lock wait is no refusal: {stats:?}"
    );
}

/// Delivered to the worker's destination `slow`, which takes 2.5 s.
#[derive(Serialize, Deserialize)]
struct ToSlow;

impl Message for ToSlow {
    const MESSAGE_TYPE: &'static str = "core.to_slow";
}

impl Handler for ToSlow {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.destination("slow")?.deliver(&self)
    }
}

inventory::submit! {
    HandlerRegistration::new::<ToSlow>("outbox_core::worker::tests::ToSlow")
}

/// Answers after 2.5 s, and says a delivery may take 3 s.
/// A destination whose delivery takes 2.5 s; it raises its flag as a delivery starts.
struct Slow(Arc<AtomicBool>);

impl crate::destination::Destination for Slow {
    fn kind(&self) -> &'static str {
        "slow"
    }

    fn deliver(
        &self,
        _: &crate::destination::Envelope,
    ) -> Result<(), crate::destination::DeliveryError> {
        self.0.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2_500));
        Ok(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(3)
    }
}

#[test]
fn a_handler_timeout_set_after_a_destination_still_covers_its_timeout() {
    let store = MemoryStore::new();
    store.enqueue_message(&ToSlow, None);
    let worker = Worker::builder(store.clone())
        .poll_interval(Duration::from_millis(20))
        .poll_only()
        .destination("slow", Slow(Arc::default()))
        .handler_timeout(Duration::from_secs(1))
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(15), || store
        .rows()
        .is_empty()));
    let stats = worker.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(
        (stats.timed_out, stats.succeeded, stats.retried),
        (0, 1, 0),
        "the watchdog must not abandon a delivery its destination would finish: {stats:?}"
    );
}

/// The threads of this process named `name`, by id.
#[cfg(target_os = "linux")]
fn threads_named(name: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| {
            let id = task.ok()?.file_name().into_string().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/self/task/{id}/comm")).ok()?;
            (comm.trim_end() == name).then_some(id)
        })
        .collect()
}

/// The CPU time each of the threads `ids` still running has used, in clock ticks of 10 ms
/// (user and system).
#[cfg(target_os = "linux")]
fn cpu_ticks(ids: &[String]) -> std::collections::HashMap<String, u64> {
    ids.iter()
        .filter_map(|id| {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{id}/stat")).ok()?;
            // The fields after the command's closing parenthesis start at the state (field 3);
            // utime and stime are fields 14 and 15.
            let after = &stat[stat.rfind(')').unwrap() + 2..];
            let fields: Vec<&str> = after.split_whitespace().collect();
            let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
            Some((id.clone(), ticks))
        })
        .collect()
}

#[cfg(target_os = "linux")]
#[test]
fn a_stopping_worker_waits_for_its_handlers_without_spinning() {
    let store = MemoryStore::new();
    let others = threads_named("outbox-warden");
    let started = Arc::new(AtomicBool::new(false));
    let worker = Worker::builder(store.clone())
        .poll_interval(Duration::from_millis(20))
        .poll_only()
        .destination("slow", Slow(Arc::clone(&started)))
        .spawn()
        .unwrap();
    store.enqueue_message(&ToSlow, None);
    // Running, not only claimed: a stop before a handler takes the message releases it at once.
    assert!(eventually(Duration::from_secs(10), || started.load(Ordering::SeqCst)));
    // Every warden started since (other tests' too: none may spin). A thread takes its name
    // once it runs, a moment after `spawn` returned.
    let mut wardens = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            wardens = threads_named("outbox-warden");
            wardens.retain(|id| !others.contains(id));
            !wardens.is_empty()
        }),
        "no warden thread found"
    );
    // The delivery takes 2.5 s: the worker stops while it runs, and waits for it.
    let before = cpu_ticks(&wardens);
    let stopping = std::thread::spawn(move || worker.shutdown(Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(1_000));
    let after = cpu_ticks(&wardens);
    assert!(
        !stopping.is_finished(),
        "the shutdown ended before the second reading (the delivery takes 2.5 s): the machine stalled"
    );
    let spent: u64 = after
        .iter()
        .map(|(id, ticks)| ticks.saturating_sub(before.get(id).copied().unwrap_or(*ticks)))
        .sum();
    let stats = stopping.join().unwrap().unwrap();
    assert_eq!(
        stats.succeeded, 1,
        "the running delivery was waited for: {stats:?}"
    );
    assert!(
        spent <= 10,
        "the wardens used {spent} ticks of 10 ms of CPU in 1 s of waiting for one handler"
    );
}
