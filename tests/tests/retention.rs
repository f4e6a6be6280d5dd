//! What the outbox keeps for a while, on every backend: the backlog the worker's gauges sample
//! (what it counts, how it ages a due message, that held and delayed messages are not "waiting"),
//! and retention: old dead letters and inbox ids pruned in bounded batches, young ones kept,
//! nothing pruned without a retention, and a worker that prunes by itself.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::connection::SimpleConnection;
use outbox_diesel::admin::backlog;
use outbox_diesel::inbox::{sweep_inbox, Inbox, Received};
use outbox_diesel::prelude::*;
use outbox_diesel::retention::prune_dead_letters;
use outbox_diesel::store::{ClaimLimit, ClaimToken, Settlement, Store};
use outbox_diesel::{
    outbox_handler, Batch, Context, DieselStore, EnqueueOptions, OutboxManager, ProcessError,
    Worker,
};
use outbox_testkit::outbox::{dead, outcome, secret};
use outbox_testkit::{backend_tests, eventually, Backend, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

const LEASE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

#[outbox_handler("retention.doomed")]
#[derive(Debug, Serialize, Deserialize)]
struct Doomed {
    n: u32,
}

impl Handler for Doomed {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Err(ProcessError::permanent("doomed"))
    }
}

fn enqueue_many<C: TestConnection>(pool: &TestPool<C>, n: u32) {
    let mut batch = Batch::new();
    for i in 0..n {
        batch.push(&Doomed { n: i }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
}

/// Claims everything due and dead-letters it; how many.
fn dead_letter_all<C: TestConnection>(store: &DieselStore<OutboxManager<C>>) -> usize {
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(100_000), LEASE)
        .unwrap();
    let outcomes: Vec<_> = claimed
        .iter()
        .map(|m| {
            let error = "kept for the retention test".to_owned();
            outcome(token, m, Settlement::DeadLetter { error })
        })
        .collect();
    assert_eq!(store.settle(&outcomes).unwrap(), Vec::<i64>::new());
    outcomes.len()
}

fn the_backlog_counts_every_message_and_ages_only_the_due_unheld_ones<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(5);
    let mut conn = pool.get().unwrap();
    let empty = backlog(&mut conn).unwrap();
    assert_eq!((empty.pending, empty.oldest_due_age), (0, Duration::ZERO));

    // Due an hour ago (an outage's backlog), due now, and due in an hour. An enqueue is never
    // due before its transaction's clock, so the first is moved back by hand.
    Doomed { n: 1 }.enqueue(&mut conn).unwrap();
    let an_hour_back = match db.backend() {
        Backend::Postgres => {
            "UPDATE outbox_message SET next_attempt_at = next_attempt_at - INTERVAL '1 hour'"
        }
        Backend::Mysql => {
            "UPDATE outbox_message SET next_attempt_at = TIMESTAMPADD(HOUR, -1, next_attempt_at)"
        }
        Backend::Sqlite => {
            "UPDATE outbox_message \
             SET next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', next_attempt_at, '-1 hour')"
        }
    };
    conn.batch_execute(an_hour_back).unwrap();
    Doomed { n: 2 }.enqueue(&mut conn).unwrap();
    Doomed { n: 3 }
        .enqueue_with(&mut conn, &EnqueueOptions::new().delay(HOUR))
        .unwrap();
    let waiting = backlog(&mut conn).unwrap();
    assert_eq!(waiting.pending, 3);
    let age = waiting.oldest_due_age;
    assert!(
        age >= HOUR - Duration::from_secs(1) && age < HOUR + Duration::from_secs(120),
        "the message due an hour ago has waited about an hour: {age:?}"
    );

    // Held messages are not waiting: their due time is the end of their lease.
    let store = DieselStore::new(pool.clone());
    let claimed = store
        .claim(ClaimToken::new(), ClaimLimit::messages(100), LEASE)
        .unwrap();
    assert_eq!(claimed.len(), 2, "the two due ones");
    let held = backlog(&mut conn).unwrap();
    assert_eq!(
        held.pending, 3,
        "held and delayed messages are still in the outbox"
    );
    assert_eq!(held.oldest_due_age, Duration::ZERO, "none waits: {held:?}");
    // The horizon is left out: on MySQL it is the server's, where other tests open
    // transactions between the two samples.
    let sampled = store
        .backlog()
        .unwrap()
        .expect("the store samples a backlog");
    assert_eq!(
        (sampled.pending, sampled.oldest_due_age),
        (held.pending, held.oldest_due_age),
        "the store samples the same"
    );
}

fn without_a_retention_nothing_is_pruned<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let store = DieselStore::new(pool.clone());
    enqueue_many(&pool, 5);
    assert_eq!(dead_letter_all(&store), 5);
    let pruned = store.prune().unwrap();
    assert_eq!(pruned.total(), 0, "{pruned:?}");
    assert_eq!(dead(&pool).len(), 5);
}

fn old_dead_letters_go_in_bounded_batches_and_young_ones_stay<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let retention = Duration::from_secs(2);
    let store = DieselStore::new(pool.clone()).dead_letter_retention(retention);
    // More than one pass takes (10 batches of 1,000): the rest goes at the next pass.
    enqueue_many(&pool, 10_500);
    assert_eq!(dead_letter_all(&store), 10_500);
    std::thread::sleep(retention + Duration::from_millis(500));
    enqueue_many(&pool, 7);
    assert_eq!(dead_letter_all(&store), 7);

    let first = store.prune().unwrap();
    assert_eq!(first.dead_letters, 10_000, "one pass is bounded: {first:?}");
    let second = store.prune().unwrap();
    assert_eq!(second.dead_letters, 500, "{second:?}");
    assert_eq!(store.prune().unwrap().dead_letters, 0);
    let kept = dead(&pool);
    assert_eq!(kept.len(), 7, "the young ones stay");
    assert!(kept
        .iter()
        .all(|d| d.failed_at > SystemTime::now() - retention - Duration::from_secs(1)));

    // The pass for a scheduled job, without a worker: everything older than the age.
    let mut conn = pool.get().unwrap();
    assert_eq!(prune_dead_letters(&mut conn, HOUR).unwrap(), 0);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(prune_dead_letters(&mut conn, Duration::ZERO).unwrap(), 7);
    // An age no backend's arithmetic takes is cut to a hundred years, not an error.
    assert_eq!(prune_dead_letters(&mut conn, Duration::MAX).unwrap(), 0);
}

/// Two workers prune the same dead letters at once: between them each row goes once, and
/// neither fails (on MySQL both `DELETE … ORDER BY failed_at LIMIT` lock the same index range).
fn two_workers_pruning_at_once_delete_each_row_once<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(9);
    enqueue_many(&pool, 6_000);
    assert_eq!(dead_letter_all(&DieselStore::new(pool.clone())), 6_000);
    std::thread::sleep(Duration::from_millis(20));
    let stores: Vec<_> = (0..2)
        .map(|_| DieselStore::new(pool.clone()).dead_letter_retention(Duration::ZERO))
        .collect();
    let barrier = std::sync::Barrier::new(2);
    let deleted: usize = std::thread::scope(|scope| {
        let passes: Vec<_> = stores
            .iter()
            .map(|store| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let mut deleted = 0;
                    loop {
                        let pruned = store.prune().expect("a pass never fails on a race");
                        if pruned.dead_letters == 0 {
                            return deleted;
                        }
                        deleted += pruned.dead_letters;
                    }
                })
            })
            .collect();
        passes.into_iter().map(|pass| pass.join().unwrap()).sum()
    });
    assert_eq!(deleted, 6_000, "each row counted once between the two");
    assert!(dead(&pool).is_empty());
}

/// Receives a webhook with id `id` as a receiver would.
fn receive<C: TestConnection>(conn: &mut C, inbox: &Inbox, id: &str) -> Received<()> {
    let body = br#"{"type":"retention.ping"}"#;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let headers = [
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", now.to_string()),
        ("webhook-signature", secret().sign(id, now, body)),
    ];
    inbox
        .receive(conn, &headers, body, |_, _| {
            Ok::<_, diesel::result::Error>(())
        })
        .unwrap()
}

fn old_inbox_ids_go_and_young_ones_stay<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let retention = Duration::from_secs(2);
    let store = DieselStore::new(pool.clone()).inbox_retention(retention);
    let inbox = Inbox::new([secret()]);
    let mut conn = pool.get().unwrap();
    for i in 0..1_200 {
        assert_eq!(
            receive(&mut *conn, &inbox, &format!("old-{i}")),
            Received::Processed(())
        );
    }
    std::thread::sleep(retention + Duration::from_millis(500));
    assert_eq!(
        receive(&mut *conn, &inbox, "young"),
        Received::Processed(())
    );

    let pruned = store.prune().unwrap();
    assert_eq!((pruned.inbox_ids, pruned.dead_letters), (1_200, 0));
    // A pruned id counts as new again; the young one is still a duplicate.
    assert_eq!(
        receive(&mut *conn, &inbox, "old-0"),
        Received::Processed(())
    );
    let again = receive(&mut *conn, &inbox, "young");
    assert!(matches!(again, Received::Duplicate { .. }), "{again:?}");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(sweep_inbox(&mut *conn, Duration::ZERO).unwrap(), 2);
}

fn the_worker_prunes_by_itself<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(7);
    enqueue_many(&pool, 30);
    let store = DieselStore::new(pool.clone()).dead_letter_retention(Duration::ZERO);
    let worker = Worker::builder(store).handler_threads(2).spawn().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || worker.stats().dead_lettered
            == 30),
        "{:?}",
        worker.stats()
    );
    // Housekeeping runs every 5 s.
    assert!(
        eventually(Duration::from_secs(15), || dead(&pool).is_empty()),
        "the worker pruned the dead letters: {} left",
        dead(&pool).len()
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();
}

backend_tests!(
    the_backlog_counts_every_message_and_ages_only_the_due_unheld_ones,
    without_a_retention_nothing_is_pruned,
    old_dead_letters_go_in_bounded_batches_and_young_ones_stay,
    old_inbox_ids_go_and_young_ones_stay,
    the_worker_prunes_by_itself,
    two_workers_pruning_at_once_delete_each_row_once,
);
