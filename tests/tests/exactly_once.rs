//! Exactly-once handlers on every backend: the handler's write and its message's removal
//! commit together. A failed attempt leaves no write; a chain's next message commits with the
//! work; a claim that lost its lease runs nothing; and a worker process killed with SIGKILL
//! while handlers hold their transactions open leaves each effect applied exactly once (counted
//! by the delivery checker: no effect lost, none twice).

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::sql_types::{Integer, Text};
use diesel::{QueryableByName, RunQueryDsl};
use outbox_diesel::store::{ClaimLimit, ClaimToken, SettleTarget, Store};
use outbox_diesel::{enqueue_all, DieselStore, MessageId, ProcessError, Worker, WorkerHandle};
use outbox_testkit::http::Receiver;
use outbox_testkit::outbox::{dead, pending};
use outbox_testkit::{
    backend_tests, eventually, with_connection, TestConnection, TestDb, TestPool,
};
use outbox_tests::checker::{check, Arrival, Ledger};
use outbox_tests::handlers::{Effect, EFFECT_TABLE};

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
    assert_eq!(
        stats.retried as usize,
        messages.iter().filter(|m| m.fail_first).count()
    );
}

fn a_claim_that_lost_its_lease_runs_nothing<C: TestConnection>(db: &TestDb) {
    let pool = prepare::<C>(db, 4);
    let store = DieselStore::new(pool.clone());
    enqueue_all(&mut pool.get().unwrap(), &[Effect::new(1)]).unwrap();
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
        .unwrap();
    let position = claimed[0].position;
    let ran = AtomicUsize::new(0);
    let mut work = |_: &mut dyn std::any::Any| -> Result<(), ProcessError> {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    };

    let stale = SettleTarget {
        token: ClaimToken::new(),
        position,
        ordering_key: None,
    };
    let refused = store.settle_within(&stale, &mut work).unwrap_err();
    assert!(refused.reason().contains("lease"), "{}", refused.reason());
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a fenced claim ran its work");
    assert_eq!(pending(&pool).len(), 1);

    let failing = store
        .settle_within(
            &SettleTarget {
                token,
                position,
                ordering_key: None,
            },
            &mut |_| Err(ProcessError::retryable("no")),
        )
        .unwrap_err();
    assert_eq!(failing.reason(), "no");
    assert_eq!(pending(&pool).len(), 1, "a failed work keeps its message");

    let holder = SettleTarget {
        token,
        position,
        ordering_key: None,
    };
    store.settle_within(&holder, &mut work).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(pending(&pool).is_empty());
    assert!(
        store.settle_within(&holder, &mut work).is_err(),
        "settled once"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
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
    a_claim_that_lost_its_lease_runs_nothing,
    a_killed_worker_applies_each_effect_exactly_once,
);
