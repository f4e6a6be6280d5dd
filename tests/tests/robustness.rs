//! What must not stop a worker for good, on every backend: a database that refuses an outcome,
//! a handler that hangs or panics outside its `process`, a handler that outlives its lease,
//! payloads that would fill memory, a lost `LISTEN` connection, a message type nobody handles
//! yet. Each test fails against the worker as it was before the fix it guards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use outbox_diesel::delivery_log::AttemptFilter;
use outbox_diesel::prelude::*;
use outbox_diesel::{
    enqueue_all, outbox_handler, Context, DieselStore, EnqueueOptions, Error, Message,
    ProcessError, RetryPolicy, Worker, WorkerHandle, WorkerStats,
};
use outbox_testkit::http::{Receiver, Reply};
use outbox_testkit::outbox::{attempts, dead, endpoint, pending};
use outbox_testkit::proxy::Proxy;
use outbox_testkit::{backend_tests, eventually, Backend, TestConnection, TestDb};
use outbox_tests::handlers::{Hook, HOOK};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(30);

fn quick_retries() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(5)
        .initial_backoff(Duration::from_millis(50))
        .multiplier(2.0)
}

fn stop(worker: WorkerHandle) -> WorkerStats {
    worker
        .shutdown(Duration::from_secs(20))
        .expect("the worker stops in time")
}

/// Hangs for `hang_ms` on its first attempt; succeeds at once afterwards.
#[outbox_handler("robust.hangs")]
#[derive(Debug, Serialize, Deserialize)]
struct Hangs {
    hang_ms: u64,
}

impl Handler for Hangs {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        if ctx.attempt() == 1 {
            std::thread::sleep(Duration::from_millis(self.hang_ms));
        }
        Ok(())
    }
}

/// Counted when processed.
#[outbox_handler("robust.counted")]
#[derive(Debug, Serialize, Deserialize)]
struct Counted {
    n: u32,
}

static COUNTED: AtomicUsize = AtomicUsize::new(0);

impl Handler for Counted {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        COUNTED.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Its handler's retry policy panics: outside `process`, where no handler code is expected.
#[outbox_handler("robust.policy_panics")]
#[derive(Debug, Serialize, Deserialize)]
struct PolicyPanics {
    n: u32,
}

impl Handler for PolicyPanics {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }

    fn retry_policy() -> Option<RetryPolicy> {
        panic!("a retry policy that panics");
    }
}

/// Takes `ms` to process, and counts how many run at once.
#[outbox_handler("robust.slow")]
#[derive(Debug, Serialize, Deserialize)]
struct Slow {
    id: u32,
    ms: u64,
    pad: String,
}

static SLOW_RUNNING: AtomicUsize = AtomicUsize::new(0);
static SLOW_MOST: AtomicUsize = AtomicUsize::new(0);
static SLOW_RUNS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

impl Handler for Slow {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let now = SLOW_RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
        SLOW_MOST.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(self.ms));
        SLOW_RUNNING.fetch_sub(1, Ordering::SeqCst);
        SLOW_RUNS.lock().unwrap().push(self.id);
        Ok(())
    }
}

/// A type no handler in this program serves.
#[derive(Serialize, Deserialize)]
struct Unknown {
    x: u32,
}

impl Message for Unknown {
    const MESSAGE_TYPE: &'static str = "robust.unknown";
}

/// Tests that share the static counters above take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn a_hung_handler_is_timed_out_and_its_thread_replaced<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let hung = Hangs { hang_ms: 4_000 }
        .enqueue(&mut pool.get().unwrap())
        .unwrap();
    // Retries a second apart and doubling: the stuck thread returns (after 4 s) within the
    // message's attempts. Meanwhile its re-claims by this worker count as timed out again
    // rather than run beside the stuck one.
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(1)
        .handler_timeout(Duration::from_millis(500))
        .poll_interval(Duration::from_millis(50))
        .retry_policy(
            RetryPolicy::new()
                .max_attempts(5)
                .initial_backoff(Duration::from_secs(1))
                .multiplier(2.0),
        )
        .spawn()
        .unwrap();
    assert!(
        eventually(PATIENCE, || worker.health().stuck_handlers == 1),
        "{:?}",
        worker.health()
    );
    // With its only thread stuck, the worker still delivers: a fresh thread took its place.
    let _guard = serial();
    let before = COUNTED.load(Ordering::SeqCst);
    enqueue_all(
        &mut pool.get().unwrap(),
        &(0..5).map(|n| Counted { n }).collect::<Vec<_>>(),
    )
    .unwrap();
    assert!(eventually(PATIENCE, || COUNTED.load(Ordering::SeqCst) >= before + 5));
    // The hung message was retried as a timed-out attempt, and went through on the second.
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    let health = worker.health();
    assert!(health.handler_threads >= 1, "{health:?}");
    let stats = stop(worker);
    assert_eq!(stats.timed_out, 1, "{stats:?}");
    assert!(stats.retried >= 1, "{stats:?}");
    assert!(dead(&pool).is_empty(), "{:?}", dead(&pool));
    let _ = hung;
}

fn more_hung_handlers_than_threads_leave_the_worker_serving<C: TestConnection>(db: &TestDb) {
    // Found by the hung-handler drill: with more handlers stuck than there are threads, the
    // threads not replaced must go on serving when their handlers return.
    let pool = db.pool::<C>(5);
    enqueue_all(
        &mut pool.get().unwrap(),
        &[
            Hangs { hang_ms: 2_000 },
            Hangs { hang_ms: 2_000 },
            Hangs { hang_ms: 2_000 },
        ],
    )
    .unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(1)
        .handler_timeout(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(50))
        .retry_policy(RetryPolicy::new().initial_backoff(Duration::from_secs(5)))
        .spawn()
        .unwrap();
    assert!(eventually(PATIENCE, || worker.stats().timed_out >= 2));
    let _guard = serial();
    let before = COUNTED.load(Ordering::SeqCst);
    Counted { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    assert!(
        eventually(PATIENCE, || COUNTED.load(Ordering::SeqCst) > before),
        "no thread serves: {:?}",
        worker.health()
    );
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    assert!(worker.health().handler_threads >= 1);
    stop(worker);
}

fn a_panic_outside_the_handler_is_a_failed_attempt_not_a_lost_thread<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(5);
    PolicyPanics { n: 1 }
        .enqueue(&mut pool.get().unwrap())
        .unwrap();
    // A long backoff keeps the failed message out of the next claims, so an
    // in-flight slot can only be the leaked one.
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(1)
        .poll_interval(Duration::from_millis(50))
        .retry_policy(RetryPolicy::new().initial_backoff(Duration::from_secs(600)))
        .spawn()
        .unwrap();
    assert!(eventually(PATIENCE, || {
        pending(&pool)
            .first()
            .is_some_and(|m| m.last_error.as_deref().unwrap_or("").contains("panicked"))
    }));
    // The slot is released just after the failure is recorded.
    assert!(
        eventually(PATIENCE, || worker.in_flight() == 0),
        "the slot was leaked: {} in flight",
        worker.in_flight()
    );
    let health = worker.health();
    assert!(
        health.panics >= 1 && health.handler_threads == 1,
        "{health:?}"
    );
    assert!(health.is_healthy(), "{health:?}");
    // The thread still serves.
    let _guard = serial();
    let before = COUNTED.load(Ordering::SeqCst);
    Counted { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    assert!(eventually(PATIENCE, || COUNTED.load(Ordering::SeqCst) > before));
    stop(worker);
}

fn a_handler_longer_than_its_lease_keeps_it_and_runs_once<C: TestConnection>(db: &TestDb) {
    let _guard = serial();
    SLOW_RUNS.lock().unwrap().clear();
    let pool = db.pool::<C>(9);
    Slow {
        id: 42,
        ms: 5_000,
        pad: String::new(),
    }
    .enqueue(&mut pool.get().unwrap())
    .unwrap();
    // Two workers, a 2 s lease, a 5 s handler: without the heartbeat the second worker (or the
    // first) claims the message again while it runs.
    let start = || {
        Worker::builder(DieselStore::new(pool.clone()))
            .lease(Duration::from_secs(2))
            .handler_timeout(Duration::from_secs(20))
            .poll_interval(Duration::from_millis(50))
            .poll_only()
            .spawn()
            .unwrap()
    };
    let (first, second) = (start(), start());
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    let (a, b) = (stop(first), stop(second));
    assert_eq!(*SLOW_RUNS.lock().unwrap(), vec![42], "ran once");
    assert_eq!(a.succeeded + b.succeeded, 1, "{a:?} {b:?}");
    assert_eq!(a.fenced + b.fenced, 0, "{a:?} {b:?}");
}

fn claims_stop_at_the_byte_cap<C: TestConnection>(db: &TestDb) {
    let _guard = serial();
    SLOW_MOST.store(0, Ordering::SeqCst);
    let pool = db.pool::<C>(5);
    let messages: Vec<Slow> = (0..12)
        .map(|id| Slow {
            id,
            ms: 150,
            pad: "x".repeat(1 << 20),
        })
        .collect();
    enqueue_all(&mut pool.get().unwrap(), &messages).unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(16)
        .max_in_flight_bytes(3 << 20)
        .poll_interval(Duration::from_millis(20))
        .spawn()
        .unwrap();
    let mut most_held = 0;
    let drained = eventually(PATIENCE, || {
        most_held = most_held.max(worker.in_flight());
        pending(&pool).is_empty()
    });
    assert!(drained);
    stop(worker);
    let most = SLOW_MOST.load(Ordering::SeqCst);
    // 1 MiB and a few bytes each: two fit in 3 MiB; the first claim may take one more alone
    // only when the worker held nothing.
    assert!((1..=2).contains(&most), "{most} ran at once");
    assert!(most_held <= 2, "{most_held} held at once");
}

fn an_unknown_type_waits_out_its_grace_then_is_dead_lettered<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let id = Unknown { x: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .unknown_type_grace(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    assert!(eventually(PATIENCE, || pending(&pool)
        .first()
        .and_then(|m| m.last_error.clone())
        .is_some_and(|e| e.contains("given back"))));
    let waiting = &pending(&pool)[0];
    assert_eq!(waiting.attempts, 0, "a deferral does not count an attempt");
    assert!(dead(&pool).is_empty(), "dead-lettered during its grace");
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    let letter = &dead(&pool)[0];
    assert_eq!(letter.message_id, id);
    assert!(
        letter.last_error.contains("within 2s"),
        "{}",
        letter.last_error
    );
    let stats = stop(worker);
    assert!(stats.deferred >= 1, "{stats:?}");
}

fn a_not_before_past_year_9999_is_refused_everywhere<C: TestConnection>(db: &TestDb) {
    let mut conn = db.pool::<C>(1).get().unwrap();
    let far = std::time::UNIX_EPOCH + Duration::from_secs(253_402_300_800);
    for options in [
        EnqueueOptions::new().delay(Duration::MAX),
        EnqueueOptions::new().not_before(far),
    ] {
        let err = Counted { n: 1 }
            .enqueue_with(&mut conn, &options)
            .unwrap_err();
        assert!(matches!(err, Error::NotBeforeOutOfRange), "{err}");
    }
    let last = std::time::UNIX_EPOCH + Duration::from_secs(253_402_300_000);
    Counted { n: 2 }
        .enqueue_with(&mut conn, &EnqueueOptions::new().not_before(last))
        .unwrap();
    let stored = &outbox_diesel::admin::pending_messages(
        &mut conn,
        &outbox_diesel::admin::ListOptions::new(),
    )
    .unwrap()[0];
    assert!(
        stored.next_attempt_at
            > std::time::SystemTime::now() + Duration::from_secs(3600 * 24 * 365 * 7000),
        "stored in the far future, not due now"
    );
}

/// The worker's connections go through a proxy that stops forwarding without closing anything
/// (a peer that vanished without a word): the claim that waits for its answer shows in
/// `health()` as a store call running ever longer, where every other figure looked calm; once
/// the link is back the call returns and the worker goes on. (`is_healthy()` turns false when
/// such a call passes 30 s; the rule itself is tested in the core.)
fn a_store_call_that_never_returns_shows_in_health<C: TestConnection>(db: &TestDb) {
    if db.backend() == Backend::Sqlite {
        return; // no network
    }
    let url = db.url().to_owned();
    let server = url
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("host:port in the URL")
        .to_owned();
    let proxy = Proxy::start(server.parse().expect("an address"));
    let proxied = url.replace(&server, &proxy.addr().to_string());
    let pool = diesel::r2d2::Pool::builder()
        .max_size(5)
        .build(outbox_diesel::OutboxManager::<C>::new(&proxied).unwrap())
        .unwrap();
    let direct = db.pool::<C>(2);
    let receiver = Receiver::ok();
    let worker = Worker::builder(DieselStore::new(pool))
        .poll_only()
        .poll_interval(Duration::from_millis(50))
        .destination(
            HOOK,
            endpoint(&receiver.url("/hook"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    Hook::new(0).enqueue(&mut direct.get().unwrap()).unwrap();
    assert!(receiver.wait_for(1, PATIENCE));

    proxy.stall();
    Hook::new(1).enqueue(&mut direct.get().unwrap()).unwrap();
    assert!(
        eventually(PATIENCE, || worker
            .health()
            .longest_store_call
            .is_some_and(|(_, running)| running > Duration::from_secs(2))),
        "{:?}",
        worker.health()
    );
    let health = worker.health();
    let (operation, _) = health.longest_store_call.unwrap();
    assert!(
        ["claim", "settle", "extend_leases", "ping"].contains(&operation)
            || operation.starts_with("sync")
            || ["promote_stranded", "prune", "backlog"].contains(&operation),
        "{health:?}"
    );
    assert!(receiver.count() == 1, "nothing was delivered meanwhile");

    proxy.resume();
    assert!(receiver.wait_for(2, PATIENCE), "the worker went on");
    assert!(eventually(PATIENCE, || worker
        .health()
        .longest_store_call
        .is_none_or(|(_, running)| running < Duration::from_secs(2))));
    assert!(worker.health().is_healthy(), "{:?}", worker.health());
    stop(worker);
}

backend_tests!(
    a_store_call_that_never_returns_shows_in_health,
    a_hung_handler_is_timed_out_and_its_thread_replaced,
    more_hung_handlers_than_threads_leave_the_worker_serving,
    a_panic_outside_the_handler_is_a_failed_attempt_not_a_lost_thread,
    a_handler_longer_than_its_lease_keeps_it_and_runs_once,
    claims_stop_at_the_byte_cap,
    an_unknown_type_waits_out_its_grace_then_is_dead_lettered,
    a_not_before_past_year_9999_is_refused_everywhere,
);

/// A PostgreSQL database in `LATIN1`: it refuses texts with characters beyond Latin-1.
fn latin1_database() -> Option<TestDb> {
    TestDb::new_with(
        Backend::Postgres,
        "ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
    )
}

/// A worker delivering the hooks of `pool` to `receiver`, retrying quickly.
fn hook_worker(
    pool: &outbox_testkit::TestPool<diesel::PgConnection>,
    receiver: &Receiver,
) -> outbox_diesel::WorkerHandle {
    Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .retry_policy(quick_retries())
        .destination(
            HOOK,
            endpoint(&receiver.url("/hook"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap()
}

/// A PostgreSQL database in `LATIN1` refuses the webhook error texts (they hold `…`): the
/// outcomes are stored reduced to ASCII, and every message ends delivered or dead-lettered.
#[test]
fn a_database_that_refuses_error_texts_does_not_wedge_the_worker() {
    let Some(db) = latin1_database() else {
        return;
    };
    let pool = db.pool::<diesel::PgConnection>(6);
    // Every third request fails with a body the database cannot encode either.
    let receiver = Receiver::start(|_, n| {
        if n % 3 == 0 {
            Reply::with_body(500, "Ошибка: überlastet …")
        } else {
            Reply::status(200)
        }
    });
    let hooks: Vec<Hook> = (0..300).map(Hook::new).collect();
    enqueue_all(&mut pool.get().unwrap(), &hooks).unwrap();
    let worker = hook_worker(&pool, &receiver);
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).is_empty()),
        "wedged: {} pending, {:?}",
        pending(&pool).len(),
        worker.health()
    );
    let stats = worker
        .shutdown(Duration::from_secs(10))
        .expect("the worker stops in time");
    let delivered: HashMap<String, usize> = receiver
        .requests()
        .iter()
        .filter(|r| r.answered == 200)
        .fold(HashMap::new(), |mut seen, r| {
            *seen.entry(r.webhook_id().unwrap().to_owned()).or_default() += 1;
            seen
        });
    assert_eq!(delivered.len() + dead(&pool).len(), 300, "{stats:?}");
    assert!(stats.retried > 0, "{stats:?}");
    assert_eq!(stats.abandoned_outcomes, 0, "{stats:?}");
    eprintln!(
        "LATIN1 database: 300 messages in {:?}, {stats:?}",
        started.elapsed()
    );
}

/// The same `LATIN1` database, and a receiver that takes every delivery with an answer the
/// database cannot encode: the delivery log's texts are stored reduced to ASCII, and each
/// message is delivered once; none is given up and delivered again.
#[test]
fn a_database_that_refuses_receivers_answers_delivers_each_message_once() {
    let Some(db) = latin1_database() else {
        return;
    };
    let pool = db.pool::<diesel::PgConnection>(6);
    let receiver = Receiver::start(|_, _| Reply::with_body(200, "Принято …"));
    let hooks: Vec<Hook> = (0..100).map(Hook::new).collect();
    enqueue_all(&mut pool.get().unwrap(), &hooks).unwrap();
    let worker = hook_worker(&pool, &receiver);
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).is_empty()),
        "wedged: {} pending, {:?}",
        pending(&pool).len(),
        worker.health()
    );
    let stats = worker
        .shutdown(Duration::from_secs(10))
        .expect("the worker stops in time");
    assert_eq!(receiver.count(), 100, "each once: {stats:?}");
    assert_eq!(stats.abandoned_outcomes, 0, "{stats:?}");
    let logged = attempts(&pool, &AttemptFilter::default());
    assert_eq!(logged.len(), 100);
    assert!(
        logged
            .iter()
            .all(|a| a.status == Some(200) && a.answer.as_deref().is_some_and(|t| t.is_ascii())),
        "{:?}",
        logged.first()
    );
}

/// The `LISTEN` connection is cut (as by a PostgreSQL restart) while the pool has exactly the
/// connections the worker holds: the listener lets the broken one go before taking another, so
/// wake-ups resume long before the 30 s poll.
#[test]
fn the_listener_reconnects_within_a_pool_sized_for_the_worker() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let pool = db.pool::<diesel::PgConnection>(4);
    let receiver = Receiver::ok();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_secs(30))
        .destination(
            HOOK,
            endpoint(&receiver.url("/hook"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    let mut admin: diesel::PgConnection = db.connect();
    std::thread::sleep(Duration::from_millis(300));
    admin
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN%' \
             AND pid <> pg_backend_pid()",
        )
        .unwrap();
    // Give the listener time to notice and reconnect (its backoff starts at 100 ms).
    std::thread::sleep(Duration::from_secs(2));
    let asked = Instant::now();
    Hook::new(1).enqueue(&mut admin).unwrap();
    assert!(
        receiver.wait_for(1, Duration::from_secs(10)),
        "no wake-up after the reconnect: {:?}",
        worker.health()
    );
    let took = asked.elapsed();
    assert!(worker.health().listener_alive == Some(true));
    stop(worker);
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// How many times [`PolicyPanicsOnce::retry_policy`] was asked.
static POLICY_ASKED: AtomicUsize = AtomicUsize::new(0);

/// Its retry policy panics the first time it is asked, then says: one attempt.
#[outbox_handler("robustness.policy_panics_once")]
#[derive(Debug, Serialize, Deserialize)]
struct PolicyPanicsOnce;

impl Handler for PolicyPanicsOnce {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }

    fn retry_policy() -> Option<RetryPolicy> {
        if POLICY_ASKED.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("the policy is not ready");
        }
        Some(RetryPolicy::new().max_attempts(1))
    }
}

/// A panic outside the handler (here its `retry_policy()`, once) is judged by the handler's
/// own policy where it can be asked: one attempt, so it is dead-lettered with the panic, not
/// retried ten times by the default policy.
#[test]
fn a_panic_outside_the_handler_is_judged_by_the_handlers_own_policy() {
    let Some(db) = TestDb::new(Backend::Sqlite) else {
        return;
    };
    let pool = db.pool::<diesel::SqliteConnection>(5);
    PolicyPanicsOnce.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .spawn()
        .unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    let letter = dead(&pool).remove(0);
    assert!(
        letter.last_error.contains("gave up after 1 attempts")
            && letter.last_error.contains("the policy is not ready"),
        "{letter:?}"
    );
    stop(worker);
}
