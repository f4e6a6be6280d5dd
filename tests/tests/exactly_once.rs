//! Exactly-once handlers on every backend: the handler's write and its message's removal
//! commit together. A failed attempt leaves no write; a chain's next message commits with the
//! work; a claim that lost its lease commits nothing; a handler hung inside its transaction
//! holds up neither the heartbeat nor the watchdog; and a worker process killed with SIGKILL
//! while handlers hold their transactions open leaves each effect applied exactly once (counted
//! by the delivery checker: no effect lost, none twice).

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::sql_types::{Integer, Text};
use diesel::{QueryableByName, RunQueryDsl};
use outbox_diesel::store::{ClaimLimit, ClaimToken, SettleTarget, Store, TransactionalSettlement};
use outbox_diesel::{
    enqueue_all, DieselStore, MessageId, OutboxManager, ProcessError, Worker, WorkerHandle,
};
use outbox_testkit::http::Receiver;
use outbox_testkit::outbox::{dead, pending};
use outbox_testkit::{
    backend_tests, eventually, with_connection, Backend, TestConnection, TestDb, TestPool,
};
use outbox_tests::checker::{check, Arrival, Ledger};
use outbox_tests::handlers::{insert_effect, Effect, EFFECT_TABLE};

#[derive(QueryableByName, Debug)]
struct EffectRow {
    #[diesel(sql_type = Text)]
    message_id: String,
    #[diesel(sql_type = Integer)]
    n: i32,
}

fn effects(db: &TestDb) -> Vec<EffectRow> {
    with_connection!(db.backend(), D => {
        diesel::sql_query("SELECT message_id, n FROM test_effect")
            .load(&mut db.connect::<D>())
            .unwrap()
    })
}

fn prepare<C: TestConnection>(db: &TestDb, size: u32) -> TestPool<C> {
    let pool = db.pool::<C>(size);
    pool.get().unwrap().batch_execute(EFFECT_TABLE).unwrap();
    pool
}

fn worker<C: TestConnection>(db: &TestDb, pool: &TestPool<C>, threads: usize) -> WorkerHandle {
    Worker::builder(DieselStore::new(pool.clone()))
        .resource(db.backend())
        .handler_threads(threads)
        .poll_interval(Duration::from_millis(50))
        .retry_policy(
            outbox_diesel::RetryPolicy::new()
                .initial_backoff(Duration::from_millis(50))
                .max_backoff(Duration::from_millis(200)),
        )
        .spawn()
        .unwrap()
}

fn effects_happen_once_failures_leave_nothing_and_chains_commit_together<C: TestConnection>(
    db: &TestDb,
) {
    // Four handler threads each hold a connection in their transaction, beside the worker's.
    let pool = prepare::<C>(db, 10);
    let mut messages: Vec<Effect> = (0..20).map(Effect::new).collect();
    for (i, m) in messages.iter_mut().enumerate() {
        m.fail_first = i % 3 == 0;
        if i % 4 == 0 {
            m.then = Some(1000 + m.n);
        }
    }
    let ids = enqueue_all(&mut pool.get().unwrap(), &messages).unwrap();
    let worker = worker(db, &pool, 4);
    let expected = messages.len() + messages.iter().filter(|m| m.then.is_some()).count();
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).is_empty()
            && effects(db).len() >= expected),
        "drained: {} effects of {expected}",
        effects(db).len()
    );
    let stats = worker.shutdown(Duration::from_secs(10)).unwrap();
    let rows = effects(db);
    let mut ns: Vec<i32> = rows.iter().map(|r| r.n).collect();
    ns.sort();
    let mut want: Vec<i32> = messages
        .iter()
        .flat_map(|m| std::iter::once(m.n).chain(m.then))
        .collect();
    want.sort();
    assert_eq!(
        ns, want,
        "each effect once, the failed attempts' writes rolled back"
    );
    for (id, m) in ids.iter().zip(&messages) {
        assert!(rows
            .iter()
            .any(|r| r.message_id == id.to_string() && r.n == m.n));
    }
    assert!(dead(&pool).is_empty());
    assert_eq!(stats.succeeded as usize, expected);
    let failed_first = messages.iter().filter(|m| m.fail_first).count();
    let retried = stats.retried as usize;
    if db.backend() == Backend::Mysql {
        // InnoDB may pick a deadlock victim among concurrent handler transactions (about one
        // run in twelve here): it rolls back and is retried, its effect still applied once
        // (checked above).
        assert!(
            (failed_first..=failed_first + 4).contains(&retried),
            "{retried} retries for {failed_first} failed first attempts"
        );
    } else {
        assert_eq!(retried, failed_first);
    }
}

/// Settles `target` with work that records effect `n`; the store's answer.
fn settle_recording<C: TestConnection>(
    db: &TestDb,
    store: &DieselStore<OutboxManager<C>>,
    target: &SettleTarget<'_>,
    n: i32,
    fail: bool,
) -> Result<(), ProcessError> {
    let backend = db.backend();
    store.settle_within(target, &mut |conn: &mut C| {
        with_connection!(backend, D => {
            // The store lends its pool's connection, typed; the test names the backend's own.
            let conn = (conn as &mut dyn std::any::Any)
                .downcast_mut::<D>()
                .expect("a test pool's connection is its backend's");
            diesel::sql_query(insert_effect(backend))
                .bind::<Text, _>("settle_within")
                .bind::<Integer, _>(n)
                .execute(conn)
                .map_err(ProcessError::retryable)?;
        });
        if fail {
            return Err(ProcessError::retryable("no"));
        }
        Ok(())
    })
}

fn a_claim_that_lost_its_lease_commits_nothing<C: TestConnection>(db: &TestDb) {
    let pool = prepare::<C>(db, 4);
    let store = DieselStore::new(pool.clone());
    enqueue_all(&mut pool.get().unwrap(), &[Effect::new(1)]).unwrap();
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
        .unwrap();
    let target = |token| SettleTarget {
        token,
        position: claimed[0].position,
        ordering_key: None,
    };

    let refused = settle_recording(db, &store, &target(ClaimToken::new()), 1, false).unwrap_err();
    assert!(refused.reason().contains("lease"), "{}", refused.reason());
    assert!(effects(db).is_empty(), "a fenced claim's work rolled back");
    assert_eq!(pending(&pool).len(), 1);

    let failing = settle_recording(db, &store, &target(token), 2, true).unwrap_err();
    assert_eq!(failing.reason(), "no");
    assert!(effects(db).is_empty(), "a failed work rolled back");
    assert_eq!(pending(&pool).len(), 1, "and kept its message");

    settle_recording(db, &store, &target(token), 3, false).unwrap();
    assert_eq!(effects(db).iter().map(|e| e.n).collect::<Vec<_>>(), [3]);
    assert!(pending(&pool).is_empty());
    assert!(
        settle_recording(db, &store, &target(token), 4, false).is_err(),
        "settled once"
    );
    assert_eq!(effects(db).len(), 1);
}

/// On SQLite a handler's transaction that reads first, then writes, is not made to fail by a
/// commit of the worker's in between: it begins to write (`BEGIN IMMEDIATE`), so the other
/// writer waits for it. (Begun deferred, its write failed at once with "database is locked":
/// its snapshot was stale, and the attempt was spent.)
#[test]
fn an_exactly_once_transaction_that_reads_first_is_not_failed_by_a_commit_in_between_on_sqlite() {
    let Some(db) = TestDb::new(Backend::Sqlite) else {
        return;
    };
    let pool = prepare::<diesel::SqliteConnection>(&db, 6);
    let store = DieselStore::new(pool.clone());
    enqueue_all(&mut pool.get().unwrap(), &[Effect::new(1)]).unwrap();
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
        .unwrap();
    let target = SettleTarget {
        token,
        position: claimed[0].position,
        ordering_key: None,
    };
    let (read, read_done) = std::sync::mpsc::sync_channel::<()>(1);
    let other = std::thread::spawn({
        let pool = pool.clone();
        move || {
            // Another writer commits while the handler's transaction is between its read and
            // its write (with the fix, it waits for that transaction instead).
            read_done.recv().unwrap();
            enqueue_all(&mut pool.get().unwrap(), &[Effect::new(2)]).unwrap();
        }
    });
    let settled = store.settle_within(&target, &mut |conn: &mut diesel::SqliteConnection| {
        diesel::sql_query("SELECT message_id, n FROM test_effect")
            .load::<EffectRow>(conn)
            .map_err(ProcessError::retryable)?;
        read.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        diesel::sql_query(insert_effect(Backend::Sqlite))
            .bind::<Text, _>("m")
            .bind::<Integer, _>(1)
            .execute(conn)
            .map_err(ProcessError::retryable)?;
        Ok(())
    });
    other.join().unwrap();
    assert!(settled.is_ok(), "{settled:?}");
    assert_eq!(effects(&db).len(), 1);
    assert_eq!(pending(&pool).len(), 1, "only the other writer's message");
}

/// A handler hanging inside its transaction past `handler_timeout` holds up neither the
/// heartbeat nor the watchdog's settlement of its attempt (the transaction locks the message's
/// row only at its end); its late commit finds its claim gone and rolls back, and a later
/// attempt applies the effect once.
///
/// On SQLite the hung transaction holds the one writer lock, so the worker's writes wait until
/// it ends (documented): only the exactly-once part is checked there.
fn a_hung_transaction_holds_up_nothing_and_commits_nothing<C: TestConnection>(db: &TestDb) {
    let pool = prepare::<C>(db, 12);
    let hung = Effect {
        hang_first_ms: 8_000,
        ..Effect::new(0)
    };
    let mut messages = vec![hung];
    messages.extend((1..=20).map(Effect::new));
    let ids = enqueue_all(&mut pool.get().unwrap(), &messages).unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .resource(db.backend())
        .handler_threads(4)
        .poll_interval(Duration::from_millis(50))
        .handler_timeout(Duration::from_secs(1))
        // A heartbeat every second, while the hung transaction is open.
        .lease(Duration::from_secs(3))
        .retry_policy(
            outbox_diesel::RetryPolicy::new()
                .max_attempts(100)
                .initial_backoff(Duration::from_millis(500))
                .max_backoff(Duration::from_secs(1)),
        )
        .spawn()
        .unwrap();
    let timed_out = || {
        pending(&pool)
            .iter()
            .any(|m| m.message_id == ids[0] && m.last_error.is_some())
    };
    if db.backend() != outbox_testkit::Backend::Sqlite {
        assert!(
            eventually(Duration::from_secs(6), timed_out),
            "the watchdog's settlement of the hung attempt waited for its transaction"
        );
    }
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).is_empty()),
        "drained"
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();
    let mut ns: Vec<i32> = effects(db).iter().map(|e| e.n).collect();
    ns.sort();
    assert_eq!(ns, (0..=20).collect::<Vec<_>>(), "each effect once");
    assert!(dead(&pool).is_empty());
}

const KILLED_MESSAGES: i32 = 300;

fn a_killed_worker_applies_each_effect_exactly_once<C: TestConnection>(db: &TestDb) {
    let pool = prepare::<C>(db, 16);
    let messages: Vec<Effect> = (0..KILLED_MESSAGES)
        .map(|n| Effect {
            pause_ms: 20,
            ..Effect::new(n)
        })
        .collect();
    let ids = enqueue_all(&mut pool.get().unwrap(), &messages).unwrap();
    let mut ledger = Ledger::new();
    for id in &ids {
        ledger.committed(*id, None);
    }

    // The child needs a webhook URL; no message here goes to it.
    let unused = Receiver::ok();
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-test-worker"))
        .env("OUTBOX_WORKER_DATABASE_URL", db.url())
        .env("OUTBOX_WORKER_WEBHOOK_URL", unused.url("/hook"))
        .env("OUTBOX_WORKER_LEASE_MS", "4000")
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the worker process");
    assert!(
        eventually(Duration::from_secs(60), || effects(db).len() >= 40),
        "the child applied nothing"
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaping the child");
    let in_flight = pending(&pool).iter().filter(|m| m.in_flight).count();
    let at_kill = effects(db).len();
    assert!(in_flight > 0, "the kill found nothing in flight");
    assert!(
        at_kill < KILLED_MESSAGES as usize,
        "the child finished first"
    );

    let worker = worker(db, &pool, 8);
    assert!(
        eventually(Duration::from_secs(120), || pending(&pool).is_empty()),
        "the second worker drained the rest"
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();

    let arrivals: Vec<Arrival> = effects(db)
        .iter()
        .map(|row| Arrival {
            id: row.message_id.parse::<MessageId>().unwrap(),
            delivered: true,
        })
        .collect();
    let dead_ids: HashSet<MessageId> = dead(&pool).iter().map(|d| d.message_id).collect();
    let report = check(&ledger, &arrivals, &dead_ids);
    eprintln!(
        "exactly-once kill on {:?}: {} in flight at the kill, {} effects before it, {}",
        db.backend(),
        in_flight,
        at_kill,
        report.figures()
    );
    assert!(
        report.holds(0),
        "every effect exactly once: {}",
        report.details()
    );
    assert_eq!(report.delivered, KILLED_MESSAGES as usize);
    assert!(dead_ids.is_empty());
}

backend_tests!(
    effects_happen_once_failures_leave_nothing_and_chains_commit_together,
    a_claim_that_lost_its_lease_commits_nothing,
    a_hung_transaction_holds_up_nothing_and_commits_nothing,
    a_killed_worker_applies_each_effect_exactly_once,
);
