//! Idempotent enqueue on every backend: a recorded key writes nothing and returns the first id,
//! inside one transaction and across several, for keys that differ only by case, trailing
//! space or Unicode normalization (distinct), in batches, when the first transaction rolls
//! back, while two transactions race for one key (the second waits, is not aborted, and even a
//! MySQL REPEATABLE READ snapshot taken before the first commit sees the first's id), and how
//! long a key is kept: while pending or dead-lettered, then for the window, after which the
//! worker forgets it.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::Connection;
use outbox_diesel::admin::{
    pending_messages, purge_dead_letters, requeue_dead_letters, stats, DeadLetterSelection,
    ListOptions,
};
use outbox_diesel::idempotency::expire_idempotency_keys;
use outbox_diesel::prelude::*;
use outbox_diesel::store::{ClaimLimit, ClaimToken, Settlement, Store};
use outbox_diesel::{
    outbox_handler, write_transaction, Batch, Context, DieselStore, EnqueueOptions, Error,
    MessageId, OutboxManager, ProcessError, Worker,
};
use outbox_testkit::outbox::{dead, outcome, pending};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

const LEASE: Duration = Duration::from_secs(60);

#[outbox_handler("idempotency.charge")]
#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    order: u32,
}

impl Handler for Charge {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

fn keyed(key: &str) -> EnqueueOptions {
    EnqueueOptions::new().idempotency_key(key)
}

fn enqueue<C: TestConnection>(pool: &TestPool<C>, order: u32, key: &str) -> MessageId {
    Charge { order }
        .enqueue_with(&mut pool.get().unwrap(), &keyed(key))
        .unwrap()
}

/// The pending messages' ids.
fn pending_ids<C: TestConnection>(pool: &TestPool<C>) -> Vec<MessageId> {
    pending(pool).iter().map(|m| m.message_id).collect()
}

/// The pending messages' orders, by position.
fn orders<C: TestConnection>(pool: &TestPool<C>) -> Vec<u32> {
    pending(pool)
        .iter()
        .map(|m| serde_json::from_str::<Charge>(&m.payload).unwrap().order)
        .collect()
}

/// Claims everything due and settles it with `settlement`.
fn settle_all<C: TestConnection>(store: &DieselStore<OutboxManager<C>>, settlement: Settlement) {
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(10_000), LEASE)
        .unwrap();
    assert!(!claimed.is_empty(), "nothing was due");
    let outcomes: Vec<_> = claimed
        .iter()
        .map(|m| outcome(token, m, settlement.clone()))
        .collect();
    assert_eq!(store.settle(&outcomes).unwrap(), Vec::<i64>::new());
}

fn a_recorded_key_writes_nothing_and_returns_the_first_id<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let first = enqueue(&pool, 1, "order-1/charge");
    // A different payload under the same key is still the same message: the key decides.
    assert_eq!(enqueue(&pool, 2, "order-1/charge"), first);
    let mut conn = pool.get().unwrap();
    let inside: Vec<MessageId> = conn
        .transaction(|conn| {
            let a = Charge { order: 3 }.enqueue_with(conn, &keyed("order-3/charge"))?;
            let b = Charge { order: 3 }.enqueue_with(conn, &keyed("order-3/charge"))?;
            let c = Charge { order: 1 }.enqueue_with(conn, &keyed("order-1/charge"))?;
            Ok::<_, Error>(vec![a, b, c])
        })
        .unwrap();
    assert_eq!(inside[0], inside[1]);
    assert_eq!(inside[2], first);
    let mut ids = pending_ids(&pool);
    ids.sort();
    let mut expected = vec![first, inside[0]];
    expected.sort();
    assert_eq!(ids, expected);
    let mut kept = orders(&pool);
    kept.sort();
    assert_eq!(kept, [1, 3], "the first payload is kept");
}

fn keys_compare_byte_for_byte_and_bad_keys_are_refused<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let keys = [
        "key".to_owned(),
        "key ".to_owned(),
        "KEY".to_owned(),
        "caf\u{e9}".to_owned(),
        "cafe\u{301}".to_owned(),
        " key".to_owned(),
        "\u{1F600}".repeat(63), // 252 bytes of 4-byte characters
        "k".repeat(255),
    ];
    let ids: Vec<MessageId> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| enqueue(&pool, i as u32, key))
        .collect();
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), keys.len(), "each key is its own: {keys:?}");
    for (key, id) in keys.iter().zip(&ids) {
        assert_eq!(enqueue(&pool, 99, key), *id, "{key:?} is recorded");
    }
    assert_eq!(pending(&pool).len(), keys.len());

    let mut conn = pool.get().unwrap();
    for (key, what) in [
        ("k".repeat(256), "too long"),
        (String::new(), "empty"),
        ("a\0b".to_owned(), "NUL"),
    ] {
        let err = Charge { order: 0 }
            .enqueue_with(&mut conn, &keyed(&key))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::TooLong {
                    what: "idempotency key",
                    ..
                } | Error::InvalidIdempotencyKey
            ),
            "{what}: {err}"
        );
    }
    assert_eq!(
        pending(&pool).len(),
        keys.len(),
        "refused keys wrote nothing"
    );
}

fn a_rolled_back_enqueue_leaves_its_key_free<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let mut conn = pool.get().unwrap();
    let mut rolled_back = None;
    let result: Result<(), Error> = conn.transaction(|conn| {
        rolled_back = Some(Charge { order: 1 }.enqueue_with(conn, &keyed("retry-me"))?);
        Err(diesel::result::Error::RollbackTransaction.into())
    });
    assert!(result.is_err());
    let again = enqueue(&pool, 1, "retry-me");
    assert_ne!(Some(again), rolled_back);
    assert_eq!(pending_ids(&pool), [again]);
}

fn batches_skip_recorded_keys_and_keep_the_order<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let earlier = enqueue(&pool, 0, "earlier");
    let mut batch = Batch::new();
    batch
        .push_with(&Charge { order: 1 }, &keyed("k1").ordering_key("o"))
        .unwrap();
    batch
        .push_with(
            &Charge { order: 2 },
            &EnqueueOptions::new().ordering_key("o"),
        )
        .unwrap();
    batch.push_with(&Charge { order: 3 }, &keyed("k1")).unwrap();
    batch
        .push_with(&Charge { order: 4 }, &keyed("earlier"))
        .unwrap();
    batch
        .push_with(
            &Charge { order: 5 },
            &EnqueueOptions::new().ordering_key("o"),
        )
        .unwrap();
    let mut conn = pool.get().unwrap();
    let ids = conn.transaction(|conn| batch.enqueue(conn)).unwrap();
    assert_eq!(ids.len(), 5);
    assert_eq!(ids[2], ids[0], "the same key twice in one batch");
    assert_eq!(ids[3], earlier);
    let rows = pending_messages(&mut conn, &ListOptions::new()).unwrap();
    let orders: Vec<String> = rows.iter().map(|m| m.payload.clone()).collect();
    let by_position: Vec<MessageId> = rows.iter().map(|m| m.message_id).collect();
    assert_eq!(
        by_position,
        [earlier, ids[0], ids[1], ids[4]],
        "positions follow the push order: {orders:?}"
    );
}

/// Transaction A enqueues with a key and holds its transaction open; transaction B reads first
/// (taking its snapshot on MySQL), then enqueues with the same key, which waits for A. B then
/// goes on working and commits. Returns (A's id, B's id, how long B's enqueue waited).
fn race<C: TestConnection>(
    pool: &TestPool<C>,
    key: &str,
    a_commits: bool,
) -> (MessageId, MessageId, Duration) {
    let (a_enqueued, b_may_start) = mpsc::channel();
    let (b_read, a_may_finish) = mpsc::channel();
    std::thread::scope(|scope| {
        let a = scope.spawn(move || {
            let mut conn = pool.get().unwrap();
            let mut id = None;
            let result: Result<(), Error> = write_transaction(&mut *conn, |conn| {
                id = Some(Charge { order: 1 }.enqueue_with(conn, &keyed(key))?);
                a_enqueued.send(()).unwrap();
                a_may_finish.recv().unwrap();
                // B is now waiting (or about to) on the key.
                std::thread::sleep(Duration::from_millis(400));
                if a_commits {
                    Ok(())
                } else {
                    Err(diesel::result::Error::RollbackTransaction.into())
                }
            });
            assert_eq!(result.is_ok(), a_commits);
            id.unwrap()
        });
        let b = scope.spawn(move || {
            b_may_start.recv().unwrap();
            let mut conn = pool.get().unwrap();
            let mut waited = Duration::ZERO;
            let id = conn
                .transaction(|conn| {
                    // A read first: on MySQL this fixes the REPEATABLE READ snapshot before A
                    // commits (SQLite's single writer runs B after A instead).
                    pending_messages(conn, &ListOptions::new())?;
                    b_read.send(()).unwrap();
                    let started = Instant::now();
                    let id = Charge { order: 2 }.enqueue_with(conn, &keyed(key))?;
                    waited = started.elapsed();
                    // The transaction is still usable: the duplicate aborted nothing.
                    Charge { order: 3 }.enqueue(conn)?;
                    Ok::<_, Error>(id)
                })
                .unwrap();
            (id, waited)
        });
        let a_id = a.join().unwrap();
        let (b_id, waited) = b.join().unwrap();
        (a_id, b_id, waited)
    })
}

fn two_transactions_racing_for_one_key_write_one_message<C: TestConnection>(db: &TestDb) {
    if db.backend() == outbox_testkit::Backend::Sqlite {
        // SQLite has one writer: B's read-then-write transaction cannot interleave with A's
        // (see transactions.rs); its sequential behaviour is the first test's.
        return sqlite_race(db);
    }
    let pool = db.pool::<C>(4);
    let (a, b, waited) = race(&pool, "raced", true);
    assert_eq!(b, a, "B got A's message");
    assert!(
        waited >= Duration::from_millis(200),
        "B waited for A's commit ({waited:?})"
    );
    let mut kept = orders(&pool);
    kept.sort();
    assert_eq!(kept, [1, 3], "A's charge and B's other message");

    let (a, b, _) = race(&pool, "raced-then-rolled-back", false);
    assert_ne!(b, a, "A rolled back, so B's message is its own");
    assert!(pending_ids(&pool).contains(&b));
    assert!(!pending_ids(&pool).contains(&a));
}

/// Two transactions enqueue batches with the same two keys in opposite orders, each holding its
/// transaction open after the enqueue: the keys are taken in one order, so the second waits for
/// the first and finds its keys, instead of the two deadlocking (which on MySQL rolled back a
/// caller's whole transaction). On SQLite the transactions take turns anyway.
fn batches_with_the_same_keys_in_opposite_orders_do_not_deadlock<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let barrier = std::sync::Barrier::new(2);
    let results: Vec<Result<Vec<MessageId>, Error>> = std::thread::scope(|scope| {
        let run = |keys: [&'static str; 2]| {
            let pool = &pool;
            let barrier = &barrier;
            scope.spawn(move || {
                let mut conn = pool.get().unwrap();
                barrier.wait();
                write_transaction(&mut *conn, |conn| {
                    let mut batch = outbox_diesel::Batch::new();
                    for (order, key) in keys.into_iter().enumerate() {
                        batch.push_with(
                            &Charge {
                                order: order as u32,
                            },
                            &keyed(key),
                        )?;
                    }
                    let ids = batch.enqueue(conn)?;
                    std::thread::sleep(Duration::from_millis(300));
                    Ok::<_, Error>(ids)
                })
            })
        };
        let first = run(["x", "y"]);
        let second = run(["y", "x"]);
        vec![first.join().unwrap(), second.join().unwrap()]
    });
    let [first, second] = [&results[0], &results[1]].map(|result| match result {
        Ok(ids) => ids.clone(),
        Err(error) => panic!("a transaction failed: {error}"),
    });
    assert_eq!(pending(&pool).len(), 2, "each key once");
    assert!(
        first[0] == second[1] && first[1] == second[0],
        "each key's first message: {first:?} {second:?}"
    );
}

/// On SQLite two connections take turns: the second, in its own write transaction, finds the
/// first's key once the first commits.
fn sqlite_race(db: &TestDb) {
    type C = diesel::SqliteConnection;
    let pool = db.pool::<C>(4);
    let (a_enqueued, b_may_start) = mpsc::channel();
    std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            let mut conn = pool.get().unwrap();
            write_transaction(&mut *conn, |conn| {
                let id = Charge { order: 1 }.enqueue_with(conn, &keyed("raced"))?;
                a_enqueued.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                Ok::<_, Error>(id)
            })
            .unwrap()
        });
        b_may_start.recv().unwrap();
        let mut conn = pool.get().unwrap();
        let b = write_transaction(&mut *conn, |conn| {
            let id = Charge { order: 2 }.enqueue_with(conn, &keyed("raced"))?;
            Charge { order: 3 }.enqueue(conn)?;
            Ok::<_, Error>(id)
        })
        .unwrap();
        assert_eq!(b, a.join().unwrap());
    });
    assert_eq!(pending(&pool).len(), 2);
}

fn a_key_lasts_while_pending_or_dead_and_for_the_window_after<C: TestConnection>(db: &TestDb) {
    // The store holds two connections, the test one, and the enqueues take one each.
    let pool = db.pool::<C>(6);
    let store = DieselStore::new(pool.clone());
    let delivered = enqueue(&pool, 1, "delivered");
    settle_all(&store, Settlement::Done);
    assert!(pending(&pool).is_empty());
    assert_eq!(
        enqueue(&pool, 1, "delivered"),
        delivered,
        "kept after it settled, within the window"
    );
    // The default window is a day: the worker's sweep forgets nothing yet.
    assert_eq!(store.prune().unwrap().idempotency_keys, 0);
    let mut conn = pool.get().unwrap();
    assert_eq!(
        expire_idempotency_keys(&mut *conn, Duration::MAX).unwrap(),
        0
    );

    let failed = enqueue(&pool, 2, "failed");
    let waiting = Charge { order: 3 }
        .enqueue_with(
            &mut *conn,
            &keyed("waiting").delay(Duration::from_secs(3600)),
        )
        .unwrap();
    settle_all(
        &store,
        Settlement::DeadLetter {
            error: "refused".into(),
        },
    );
    assert_eq!(dead(&pool).len(), 1);
    // A window of zero forgets only what has settled: not the pending nor the dead letter.
    assert_eq!(
        expire_idempotency_keys(&mut *conn, Duration::ZERO).unwrap(),
        1
    );
    assert_eq!(
        enqueue(&pool, 2, "failed"),
        failed,
        "a dead letter keeps its key"
    );
    assert_eq!(
        enqueue(&pool, 3, "waiting"),
        waiting,
        "a pending message keeps its key"
    );
    let fresh = enqueue(&pool, 1, "delivered");
    assert_ne!(fresh, delivered, "forgotten after the window");

    // Re-queued, the dead letter still holds its key; purged, it lets it go.
    requeue_dead_letters(&mut *conn, &DeadLetterSelection::All).unwrap();
    assert_eq!(
        expire_idempotency_keys(&mut *conn, Duration::ZERO).unwrap(),
        0
    );
    assert_eq!(enqueue(&pool, 2, "failed"), failed);
    settle_all(
        &store,
        Settlement::DeadLetter {
            error: "refused again".into(),
        },
    );
    purge_dead_letters(&mut *conn, &DeadLetterSelection::All).unwrap();
    assert!(expire_idempotency_keys(&mut *conn, Duration::ZERO).unwrap() >= 1);
    assert_ne!(enqueue(&pool, 2, "failed"), failed);
}

fn the_worker_forgets_keys_in_bounded_rounds<C: TestConnection>(db: &TestDb) {
    // More keys than one page of the sweep, so its cursor moves over several.
    const KEYS: u32 = 2_100;
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    let mut batch = Batch::new();
    for order in 0..KEYS {
        batch
            .push_with(&Charge { order }, &keyed(&format!("bulk-{order}")))
            .unwrap();
    }
    let first_ids = conn.transaction(|conn| batch.enqueue(conn)).unwrap();
    drop(conn);
    let store = DieselStore::new(pool.clone()).idempotency_window(Duration::ZERO);
    let worker = Worker::builder(store).spawn().unwrap();
    assert!(
        eventually(Duration::from_secs(120), || stats(&mut pool.get().unwrap())
            .unwrap()
            .is_empty()),
        "the worker drained the batch"
    );
    // The worker runs its sweep every few seconds: the keys go within a few rounds.
    assert!(
        eventually(Duration::from_secs(60), || enqueue(&pool, 0, "bulk-0")
            != first_ids[0]),
        "the worker forgot the keys"
    );
    let last = format!("bulk-{}", KEYS - 1);
    assert!(
        eventually(Duration::from_secs(60), || enqueue(&pool, 0, &last)
            != first_ids[KEYS as usize - 1]),
        "and the last page too"
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();
}

backend_tests!(
    batches_with_the_same_keys_in_opposite_orders_do_not_deadlock,
    a_recorded_key_writes_nothing_and_returns_the_first_id,
    keys_compare_byte_for_byte_and_bad_keys_are_refused,
    a_rolled_back_enqueue_leaves_its_key_free,
    batches_skip_recorded_keys_and_keep_the_order,
    two_transactions_racing_for_one_key_write_one_message,
    a_key_lasts_while_pending_or_dead_and_for_the_window_after,
    the_worker_forgets_keys_in_bounded_rounds,
);
