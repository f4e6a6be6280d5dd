//! Priorities, on every backend: claims take the raised priorities first, each priority in due
//! order, however long the ordinary backlog and wherever the claim cursor stands; a claimed
//! batch hands its raised messages out first; per-key order comes before priority; a retried
//! message and a re-queued dead letter keep their priority; a worker's handler threads take a
//! raised message before the ordinary ones already waiting for them.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;

use outbox_diesel::admin::{
    pending_messages, requeue_dead_letters, DeadLetterSelection, ListOptions,
};
use outbox_diesel::prelude::*;
use outbox_diesel::store::{ClaimToken, ClaimedMessage, Settlement};
use outbox_diesel::{
    outbox_handler, Batch, Context, DieselStore, EnqueueOptions, OutboxManager, Priority,
    ProcessError, Worker,
};
use outbox_testkit::outbox::{claim, settle_all};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

const LEASE: Duration = Duration::from_secs(30);

#[outbox_handler("priority.step")]
#[derive(Debug, Serialize, Deserialize)]
struct Step {
    n: u32,
}

impl Handler for Step {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// A handler that waits for its run's gate, then takes a while: the worker's claims pile up
/// behind its only thread. `run` keeps the backends' tests, which run at once, apart.
#[outbox_handler("priority.queued")]
#[derive(Debug, Serialize, Deserialize)]
struct Queued {
    run: String,
    n: u32,
}

static OPEN_GATES: Mutex<Option<HashSet<String>>> = Mutex::new(None);
static HANDLED: Mutex<Option<HashMap<String, Vec<u32>>>> = Mutex::new(None);

fn gate_is_open(run: &str) -> bool {
    let gates = OPEN_GATES.lock().unwrap_or_else(PoisonError::into_inner);
    gates.as_ref().is_some_and(|gates| gates.contains(run))
}

fn handled(run: &str) -> Vec<u32> {
    let handled = HANDLED.lock().unwrap_or_else(PoisonError::into_inner);
    handled
        .as_ref()
        .and_then(|handled| handled.get(run).cloned())
        .unwrap_or_default()
}

impl Handler for Queued {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let until = Instant::now() + Duration::from_secs(30);
        while !gate_is_open(&self.run) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(60));
        HANDLED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .entry(self.run)
            .or_default()
            .push(self.n);
        Ok(())
    }
}

struct Fixture<C: TestConnection> {
    pool: TestPool<C>,
    store: DieselStore<OutboxManager<C>>,
}

impl<C: TestConnection> Fixture<C> {
    fn new(db: &TestDb) -> Self {
        let pool = db.pool::<C>(5);
        Fixture {
            store: DieselStore::new(pool.clone()),
            pool,
        }
    }

    /// Enqueues one message and returns its position.
    fn enqueue(&self, n: u32, options: EnqueueOptions) -> i64 {
        let mut conn = self.pool.get().unwrap();
        let id = Step { n }.enqueue_with(&mut conn, &options).unwrap();
        pending_messages(&mut conn, &ListOptions::new().limit(100_000))
            .unwrap()
            .into_iter()
            .find(|m| m.message_id == id)
            .unwrap()
            .position
    }

    /// Enqueues `count` ordinary messages in one batch and returns their positions in order.
    fn backlog(&self, count: u32) -> Vec<i64> {
        let mut batch = Batch::new();
        for n in 0..count {
            batch.push(&Step { n }).unwrap();
        }
        let mut conn = self.pool.get().unwrap();
        let ids = batch.enqueue(&mut conn).unwrap();
        let listed = pending_messages(&mut conn, &ListOptions::new().limit(100_000)).unwrap();
        ids.iter()
            .map(|id| {
                listed
                    .iter()
                    .find(|m| m.message_id == *id)
                    .unwrap()
                    .position
            })
            .collect()
    }

    fn claim(&self, count: usize) -> (ClaimToken, Vec<ClaimedMessage>) {
        claim(&self.store, count, LEASE)
    }

    fn settle(&self, token: ClaimToken, claimed: &[ClaimedMessage], settlement: Settlement) {
        settle_all(&self.store, token, claimed, &settlement);
    }

    /// Claims `count` and settles them done; returns their positions in the claim's order.
    fn take(&self, count: usize) -> Vec<i64> {
        let (token, claimed) = self.claim(count);
        self.settle(token, &claimed, Settlement::Done);
        positions(&claimed)
    }
}

fn positions(claimed: &[ClaimedMessage]) -> Vec<i64> {
    claimed.iter().map(|m| m.position).collect()
}

fn with(priority: Priority) -> EnqueueOptions {
    EnqueueOptions::new().priority(priority)
}

/// Raised priorities enqueued after an ordinary backlog come out first, the highest first, each
/// priority in enqueue order, and a claimed batch hands them out before its ordinary messages.
fn raised_priorities_are_claimed_first_each_in_due_order<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let ordinary = f.backlog(40);
    let h0 = f.enqueue(0, with(Priority::High));
    let u0 = f.enqueue(1, with(Priority::Urgent));
    let h1 = f.enqueue(2, with(Priority::High));
    let h2 = f.enqueue(3, with(Priority::High));
    let u1 = f.enqueue(4, with(Priority::Urgent));
    let n = f.enqueue(5, with(Priority::Normal));

    assert_eq!(f.take(3), [u0, u1, h0], "the urgent first, then high");
    assert_eq!(
        f.take(4),
        [h1, h2, ordinary[0], ordinary[1]],
        "the rest of high, then the ordinary backlog in order"
    );
    let rest = f.take(100);
    assert_eq!(rest.len(), 39);
    assert_eq!(&rest[..38], &ordinary[2..], "the backlog in enqueue order");
    assert_eq!(rest[38], n, "an explicit Normal is ordinary");
}

/// Wherever the claim cursor stands (past a drained backlog, in the middle of one), a raised
/// message enqueued later is in the very next claim.
fn a_raised_message_is_found_wherever_the_cursor_stands<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let first = f.backlog(30);
    assert_eq!(f.take(10), &first[..10]);
    // The cursor stands in the middle of the backlog now.
    let high = f.enqueue(0, with(Priority::High));
    let next = f.take(5);
    assert_eq!(next[0], high, "{next:?}");
    assert_eq!(&next[1..], &first[10..14]);
    assert_eq!(f.take(100), &first[14..]);
    // And past the end of it.
    let urgent = f.enqueue(1, with(Priority::Urgent));
    assert_eq!(f.take(5), [urgent]);
}

/// Order within an ordering key comes before priority: an urgent message waits for the earlier
/// ordinary messages of its key, and goes ahead of the later ones.
fn a_raised_message_waits_for_the_earlier_messages_of_its_key<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let keyed = |n, priority| f.enqueue(n, with(priority).ordering_key("member-7"));
    let k0 = keyed(0, Priority::Normal);
    let k1 = keyed(1, Priority::Urgent);
    let k2 = keyed(2, Priority::Normal);
    let k3 = keyed(3, Priority::High);
    let free = f.enqueue(4, with(Priority::Urgent));

    let (token, claimed) = f.claim(10);
    assert_eq!(
        positions(&claimed),
        [free, k0],
        "the urgent one of the key waits behind its head"
    );
    f.settle(token, &claimed, Settlement::Done);
    assert_eq!(f.take(10), [k1]);
    assert_eq!(f.take(10), [k2]);
    assert_eq!(f.take(10), [k3]);
    assert!(f.take(10).is_empty());
}

/// A retried message and a re-queued dead letter keep their priority: each is claimed before
/// an ordinary backlog that was due before it.
fn retries_and_requeued_dead_letters_keep_their_priority<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let urgent = f.enqueue(0, with(Priority::Urgent));
    let (token, claimed) = f.claim(1);
    assert_eq!(positions(&claimed), [urgent]);
    let ordinary = f.backlog(20);
    f.settle(
        token,
        &claimed,
        Settlement::Retry {
            delay: Duration::ZERO,
            error: "receiver said 500".into(),
        },
    );
    let (token, claimed) = f.claim(1);
    assert_eq!(positions(&claimed), [urgent], "the retry is claimed first");
    f.settle(
        token,
        &claimed,
        Settlement::DeadLetter {
            error: "receiver said 400".into(),
        },
    );
    let mut conn = f.pool.get().unwrap();
    let requeued =
        requeue_dead_letters(&mut conn, &DeadLetterSelection::Positions(vec![urgent])).unwrap();
    assert_eq!(requeued, [urgent]);
    assert_eq!(
        f.take(3),
        [urgent, ordinary[0], ordinary[1]],
        "the re-queued dead letter is claimed first"
    );
}

/// A batch larger than PostgreSQL's written-in candidate limits (the claim with a bound limit)
/// takes the raised priorities first too.
fn a_batch_beyond_the_written_in_limits_takes_priorities_first<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let ordinary = f.backlog(1_500);
    let high = f.enqueue(0, with(Priority::High));
    let urgent = f.enqueue(1, with(Priority::Urgent));
    let taken = f.take(1_100);
    assert_eq!(taken.len(), 1_100);
    assert_eq!(&taken[..2], [urgent, high]);
    assert_eq!(&taken[2..], &ordinary[..1_098]);
}

/// Listings show each message's priority; a level written by hand above the highest lists as
/// `Urgent` and is claimed before it, one below zero as `Normal` and is claimed last.
fn listings_show_priorities_and_odd_levels_are_claimed_in_order<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let normal = f.enqueue(0, with(Priority::Normal));
    let high = f.enqueue(1, with(Priority::High));
    let urgent = f.enqueue(2, with(Priority::Urgent));
    let odd_high = f.enqueue(3, with(Priority::Normal));
    let odd_low = f.enqueue(4, with(Priority::Normal));
    let mut conn = f.pool.get().unwrap();
    conn.batch_execute(&format!(
        "UPDATE outbox_message SET priority = 7 WHERE id = {odd_high}"
    ))
    .unwrap();
    conn.batch_execute(&format!(
        "UPDATE outbox_message SET priority = -3 WHERE id = {odd_low}"
    ))
    .unwrap();
    let listed: Vec<(i64, Priority)> = pending_messages(&mut conn, &ListOptions::new().limit(10))
        .unwrap()
        .into_iter()
        .map(|m| (m.position, m.priority))
        .collect();
    assert_eq!(
        listed,
        [
            (normal, Priority::Normal),
            (high, Priority::High),
            (urgent, Priority::Urgent),
            (odd_high, Priority::Urgent),
            (odd_low, Priority::Normal),
        ]
    );
    assert_eq!(f.take(2), [odd_high, urgent]);
    assert_eq!(f.take(1), [high]);
    assert_eq!(f.take(1), [normal]);
    assert_eq!(
        f.take(1),
        [odd_low],
        "a level below zero is in neither lane's index range, yet claimed"
    );
}

/// Claims hand their raised messages out first, but a claim's ordinary messages may still be
/// waiting for a handler thread when the next claim brings a raised one: it must not wait
/// behind them. One handler thread, claims of 8 (so the worker holds 17 at most): 16 ordinary
/// messages are claimed behind a held-up first one, then a `High` one is enqueued; it comes
/// in the claim made once 8 slots are free, and must be handled before most of the 8 ordinary
/// messages the earlier claims left waiting (with one queue, after all 16).
fn a_raised_message_overtakes_the_ordinary_ones_waiting_for_a_handler_thread<C: TestConnection>(
    db: &TestDb,
) {
    let run = format!("{:?}", db.backend());
    let pool = db.pool::<C>(8);
    let mut batch = Batch::new();
    for n in 0..24 {
        batch
            .push(&Queued {
                run: run.clone(),
                n,
            })
            .unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(1)
        .batch_size(8)
        .poll_interval(Duration::from_millis(20))
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || worker.in_flight() == 16),
        "two claims held: {}",
        worker.in_flight()
    );
    let raised = 1_000;
    Queued {
        run: run.clone(),
        n: raised,
    }
    .enqueue_with(&mut pool.get().unwrap(), &with(Priority::High))
    .unwrap();
    OPEN_GATES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashSet::new)
        .insert(run.clone());
    assert!(
        eventually(Duration::from_secs(30), || handled(&run).len() == 25),
        "all handled: {:?}",
        handled(&run)
    );
    let stats = worker.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(stats.succeeded, 25, "{stats:?}");
    let order = handled(&run);
    let raised_at = order.iter().position(|&n| n == raised).unwrap();
    let overtaken = order[raised_at..].iter().filter(|&&n| n < 16).count();
    // With one queue it overtakes none; with the lanes about 7 (those left waiting when its
    // claim came), fewer by one for each 60 ms the settlements and the claim took.
    assert!(
        overtaken >= 3,
        "the raised message was handled after {raised_at} others and overtook only {overtaken} \
         of those claimed before it: {order:?}"
    );
}

backend_tests!(
    a_raised_message_overtakes_the_ordinary_ones_waiting_for_a_handler_thread,
    listings_show_priorities_and_odd_levels_are_claimed_in_order,
    a_batch_beyond_the_written_in_limits_takes_priorities_first,
    raised_priorities_are_claimed_first_each_in_due_order,
    a_raised_message_is_found_wherever_the_cursor_stands,
    a_raised_message_waits_for_the_earlier_messages_of_its_key,
    retries_and_requeued_dead_letters_keep_their_priority,
);
