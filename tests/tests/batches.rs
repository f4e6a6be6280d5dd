//! A destination that takes batches, on every backend: the worker hands it runs of routed
//! messages, never two of one ordering key at once, and settles each message by its own
//! outcome. A permanent failure dead-letters that message alone, a retryable one retries it
//! alone, a batch that panics or leaves an envelope without an outcome loses nothing, and each
//! key's messages are delivered in the order they were enqueued. A batch that hangs past the
//! handler timeout times out each of its messages and replaces its one thread once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_diesel::destination::{Answer, DeliveryError, Destination, Envelope};
use outbox_diesel::{outbox_handler, Batch, DieselStore, EnqueueOptions, RetryPolicy, Worker};
use outbox_testkit::outbox::{dead, pending};
use outbox_testkit::{backend_tests, eventually, Backend, TestConnection, TestDb};
use serde::{Deserialize, Serialize};

const BATCHED: &str = "batched";

/// Routed to [`BATCHED`] without handler code.
#[outbox_handler("test.batched", deliver_to = "batched")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Numbered {
    n: u32,
}

/// What the destination was handed, batch by batch.
#[derive(Debug, Default)]
struct Seen {
    /// Each batch: its messages' numbers, keys and attempts.
    batches: Vec<Vec<(u32, Option<String>, u32)>>,
    /// The numbers it took, in the order it took them.
    delivered: Vec<u32>,
}

/// Takes up to 16 at once. Refuses for good every message whose number ends in 3; fails every
/// number ending in 7 on its first attempt; panics on the first batch holding number 55; gives
/// no outcome for the last envelope of the first batch holding number 66.
#[derive(Clone, Default)]
struct Judging {
    seen: Arc<Mutex<Seen>>,
}

fn number(envelope: &Envelope) -> u32 {
    let data: Numbered = serde_json::from_slice(&envelope.body).expect("the stored data");
    data.n
}

impl Destination for Judging {
    fn kind(&self) -> &'static str {
        "judging"
    }

    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        self.deliver_batch(std::slice::from_ref(envelope))
            .pop()
            .expect("one outcome")
            .map(drop)
    }

    fn batch_limit(&self) -> usize {
        16
    }

    fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
        let mut seen = self.seen.lock().unwrap();
        let batch: Vec<_> = envelopes
            .iter()
            .map(|e| (number(e), e.ordering_key.clone(), e.attempt))
            .collect();
        let first_time = |n: u32| {
            !seen
                .batches
                .iter()
                .flatten()
                .any(|(seen_n, _, _)| *seen_n == n)
        };
        let panics = batch.iter().any(|(n, _, _)| *n == 55) && first_time(55);
        let short = batch.iter().any(|(n, _, _)| *n == 66) && first_time(66);
        seen.batches.push(batch.clone());
        if panics {
            drop(seen);
            panic!("a destination's bug, met in the middle of a batch");
        }
        let mut outcomes: Vec<_> = batch
            .iter()
            .map(|(n, _, attempt)| match n % 10 {
                3 => Err(DeliveryError::permanent(format!("{n} is refused for good"))),
                7 if *attempt == 1 => Err(DeliveryError::retryable(format!(
                    "{n} fails its first attempt"
                ))),
                _ => Ok(Answer::default()),
            })
            .collect();
        if short {
            outcomes.pop();
        }
        for ((n, _, _), outcome) in batch.iter().zip(&outcomes) {
            if outcome.is_ok() {
                seen.delivered.push(*n);
            }
        }
        outcomes
    }
}

fn every_message_is_settled_by_its_own_outcome_in_batches<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(8);
    let mut batch = Batch::new();
    let mut keys = HashMap::new();
    for n in 0..400 {
        let key = (n % 4 != 0).then(|| format!("key-{}", n % 5));
        let mut options = EnqueueOptions::new();
        if let Some(key) = &key {
            options = options.ordering_key(key.clone());
        }
        batch.push_with(&Numbered { n }, &options).unwrap();
        keys.insert(n, key);
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let judging = Judging::default();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .destination(BATCHED, judging.clone())
        .handler_threads(4)
        .poll_interval(Duration::from_millis(50))
        .retry_policy(
            RetryPolicy::new()
                .max_attempts(5)
                .initial_backoff(Duration::from_millis(50))
                .max_backoff(Duration::from_millis(200)),
        )
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(60), || pending(&pool).is_empty()),
        "{} left",
        pending(&pool).len()
    );
    let stats = worker.shutdown(Duration::from_secs(10)).unwrap();
    let seen = judging.seen.lock().unwrap();

    // Batches, each of distinct keys.
    let largest = seen.batches.iter().map(Vec::len).max().unwrap_or(0);
    assert!(
        largest > 1,
        "the backlog went out one at a time: {:?}",
        seen.batches
    );
    assert!(largest <= 16, "a batch over the destination's limit");
    for batch in &seen.batches {
        let keyed: Vec<&String> = batch.iter().filter_map(|(_, k, _)| k.as_ref()).collect();
        let distinct: HashSet<&&String> = keyed.iter().collect();
        assert_eq!(
            keyed.len(),
            distinct.len(),
            "two messages of one key in a batch: {batch:?}"
        );
    }

    // Each refused message is dead, with its reason, and nothing else.
    let dead = dead(&pool);
    let dead_numbers: BTreeMap<u32, String> = dead
        .iter()
        .map(|letter| {
            let data: Numbered = serde_json::from_str(&letter.payload).unwrap();
            (data.n, letter.last_error.clone())
        })
        .collect();
    let refused: Vec<u32> = (0..400).filter(|n| n % 10 == 3).collect();
    assert_eq!(
        dead_numbers.keys().copied().collect::<Vec<_>>(),
        refused,
        "{dead_numbers:?}"
    );
    for (n, reason) in &dead_numbers {
        assert!(
            reason.contains(&format!("{n} is refused for good")),
            "{n}: {reason}"
        );
    }

    // Every other message was delivered, also those of the batch that panicked and the
    // envelope left without an outcome; each key's in the order enqueued.
    let delivered: HashSet<u32> = seen.delivered.iter().copied().collect();
    let expected: HashSet<u32> = (0..400).filter(|n| n % 10 != 3).collect();
    assert_eq!(delivered, expected);
    let mut last_of_key: HashMap<&String, u32> = HashMap::new();
    let mut first_delivery = HashSet::new();
    for n in &seen.delivered {
        if !first_delivery.insert(*n) {
            continue;
        }
        if let Some(key) = &keys[n] {
            if let Some(before) = last_of_key.insert(key, *n) {
                assert!(before < *n, "{key}: {n} delivered after {before}");
            }
        }
    }
    assert!(
        stats.retried >= 40,
        "every number ending in 7 was retried once: {stats:?}"
    );
}

backend_tests!(every_message_is_settled_by_its_own_outcome_in_batches);

/// Takes 8 at once; its first batch hangs for 4 s.
#[derive(Clone, Default)]
struct Hanging {
    calls: Arc<AtomicUsize>,
    first_batch: Arc<AtomicUsize>,
}

impl Destination for Hanging {
    fn kind(&self) -> &'static str {
        "hanging"
    }

    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        self.deliver_batch(std::slice::from_ref(envelope))
            .pop()
            .expect("one outcome")
            .map(drop)
    }

    fn batch_limit(&self) -> usize {
        8
    }

    fn deliver_batch(&self, envelopes: &[Envelope]) -> Vec<Result<Answer, DeliveryError>> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.first_batch.store(envelopes.len(), Ordering::SeqCst);
            std::thread::sleep(Duration::from_secs(4));
        }
        envelopes.iter().map(|_| Ok(Answer::default())).collect()
    }
}

#[test]
fn a_batch_past_the_handler_timeout_times_out_each_message_and_one_thread() {
    let Some(db) = TestDb::new(Backend::Sqlite) else {
        return;
    };
    let pool = db.pool::<diesel::SqliteConnection>(4);
    let mut batch = Batch::new();
    for n in 0..8 {
        batch.push(&Numbered { n }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let hanging = Hanging::default();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .destination(BATCHED, hanging.clone())
        .handler_threads(2)
        .handler_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(50))
        .retry_policy(RetryPolicy::new().initial_backoff(Duration::from_millis(50)))
        .spawn()
        .unwrap();
    // The watchdog gives up on the batch after the timeout and its grace of a second, then
    // starts a replacement.
    let mut during = None;
    assert!(
        eventually(Duration::from_secs(4), || {
            let health = worker.health();
            during = Some((health.stuck_handlers, health.handler_threads));
            health.stuck_handlers > 0 && health.handler_threads > 2
        }),
        "the watchdog never replaced the thread stuck in the hanging batch: {during:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let health = worker.health();
    assert_eq!(
        (health.stuck_handlers, health.handler_threads),
        (1, 3),
        "one thread is stuck, however many messages its batch held, and is replaced once"
    );
    assert!(
        eventually(Duration::from_secs(30), || pending(&pool).is_empty()),
        "{} left",
        pending(&pool).len()
    );
    let stats = worker.shutdown(Duration::from_secs(10)).unwrap();
    let first = hanging.first_batch.load(Ordering::SeqCst);
    assert!(first > 1, "the backlog went out one at a time");
    assert_eq!(
        stats.timed_out, first as u64,
        "each message of the hanging batch timed out: {stats:?}"
    );
    assert!(dead(&pool).is_empty(), "a timeout is retried");
}
