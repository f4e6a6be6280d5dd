//! The worker on every backend, delivering to a real HTTP receiver on 127.0.0.1.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, Pool};
use diesel::Connection;
use outbox_diesel::admin::{purge_dead_letters, requeue_dead_letters, DeadLetterSelection};
use outbox_diesel::prelude::*;
use outbox_diesel::store::{ClaimLimit, ClaimToken, ClaimedMessage, Outcome, Settlement, Store};
use outbox_diesel::webhook::verify;
use outbox_diesel::{
    enqueue_all, outbox_handler, Batch, Context, DieselStore, EnqueueOptions, Error, Message,
    MessageId, OutboxManager, ProcessError, RetryPolicy, Worker, WorkerBuilder, WorkerHandle,
    WorkerStats,
};
use outbox_testkit::http::{Receiver, Reply, Request};
use outbox_testkit::outbox::{dead, endpoint, pending, secret};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb, TestPool};
use outbox_tests::handlers::{Hook, HOOK};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(30);

/// Panics on `n == 0`, once and for all: its own retry policy allows one attempt.
#[outbox_handler("test.panics")]
#[derive(Debug, Serialize, Deserialize)]
struct Panics {
    n: u32,
}

impl Handler for Panics {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        assert!(self.n != 0, "boom on message {}", self.n);
        Ok(())
    }

    fn retry_policy() -> Option<RetryPolicy> {
        Some(RetryPolicy::new().max_attempts(1))
    }
}

/// A type no handler in this program serves.
#[derive(Serialize, Deserialize)]
struct Nobody {
    x: u32,
}

impl Message for Nobody {
    const MESSAGE_TYPE: &'static str = "test.nobody";
}

/// Stored under `test.hook` but shaped otherwise: it no longer deserializes into `Hook`.
#[derive(Serialize, Deserialize)]
struct OldHook {
    wrong: bool,
}

impl Message for OldHook {
    const MESSAGE_TYPE: &'static str = "test.hook";
}

/// Short retries so tests see them happen.
fn quick_retries() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(50))
        .multiplier(2.0)
}

fn builder<C: TestConnection>(pool: &TestPool<C>, receiver: &Receiver) -> TestBuilder<C> {
    builder_timing_out(pool, receiver, Duration::from_secs(5))
}

/// [`builder`] whose webhook gives up after `timeout`.
fn builder_timing_out<C: TestConnection>(
    pool: &TestPool<C>,
    receiver: &Receiver,
    timeout: Duration,
) -> TestBuilder<C> {
    Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(4)
        .batch_size(16)
        .poll_interval(Duration::from_millis(100))
        .retry_policy(quick_retries())
        .destination(HOOK, endpoint(&receiver.url("/hook"), timeout))
}

fn n_of(request: &Request) -> u32 {
    request.json()["data"]["n"].as_u64().expect("data.n") as u32
}

fn key_of(request: &Request) -> Option<String> {
    request.json()["data"]["key"].as_str().map(str::to_owned)
}

fn webhook_id(request: &Request) -> MessageId {
    request
        .header("webhook-id")
        .expect("webhook-id header")
        .parse()
        .expect("webhook-id is the message id")
}

fn stop(worker: WorkerHandle) -> WorkerStats {
    worker
        .shutdown(Duration::from_secs(10))
        .expect("the worker stops in time")
}

fn delivers_each_committed_message_once_signed<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(9);
    let hooks: Vec<Hook> = (0..50).map(Hook::new).collect();
    let ids = pool
        .get()
        .unwrap()
        .transaction(|conn| enqueue_all(conn, &hooks))
        .unwrap();
    let rolled_back: Result<(), Error> = pool.get().unwrap().transaction(|conn| {
        Hook::new(1000).enqueue(conn)?;
        Err(Error::Database(diesel::result::Error::RollbackTransaction))
    });
    assert!(rolled_back.is_err());

    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(
        receiver.wait_for(50, PATIENCE),
        "got {}",
        receiver.requests().len()
    );
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    let stats = stop(worker);
    std::thread::sleep(Duration::from_millis(200));

    let requests = receiver.requests();
    assert_eq!(
        requests.len(),
        50,
        "each message exactly once, the rolled back one never"
    );
    let delivered: HashSet<MessageId> = requests.iter().map(webhook_id).collect();
    assert_eq!(delivered, ids.iter().copied().collect());
    for request in &requests {
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/hook");
        let verified = verify(
            &[secret()],
            &request.headers,
            &request.body,
            Duration::from_secs(300),
        )
        .expect("a valid Standard Webhooks signature");
        assert_eq!(verified.id, webhook_id(request).to_string());
        let body = request.json();
        assert_eq!(body["type"], "test.hook");
        assert_eq!(body["id"], verified.id);
        assert!(n_of(request) < 50);
    }
    assert_eq!(stats.succeeded, 50);
    assert_eq!(stats.claimed, 50);
    assert!(dead(&pool).is_empty());
}

fn a_500_is_retried_until_the_receiver_recovers<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, n| Reply::status(if n < 2 { 500 } else { 200 }));
    let pool = db.pool::<C>(9);
    let id = Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &receiver)
        .retry_policy(quick_retries().initial_backoff(Duration::from_millis(400)))
        .spawn()
        .unwrap();

    assert!(eventually(PATIENCE, || pending(&pool).first().is_some_and(
        |m| m.last_error.as_deref().is_some_and(|e| e.contains("500"))
    )));
    let retrying = &pending(&pool)[0];
    assert!(
        retrying.attempts >= 1,
        "the attempt count is visible: {retrying:?}"
    );
    let shown = format!("http://{}/…", receiver.addr());
    assert!(
        retrying.last_error.as_ref().unwrap().contains(&shown),
        "the error names the endpoint, without its path: {retrying:?}"
    );

    assert!(receiver.wait_for(3, PATIENCE));
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    let stats = stop(worker);
    let requests = receiver.requests();
    assert_eq!(requests.len(), 3, "delivered on the third attempt");
    assert!(
        requests.iter().all(|r| webhook_id(r) == id),
        "one id on every attempt"
    );
    assert_eq!((stats.retried, stats.succeeded), (2, 1));
    assert!(dead(&pool).is_empty());
}

fn a_receiver_that_always_fails_leads_to_a_dead_letter<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| Reply::Status(503, Vec::new(), b"maintenance".to_vec()));
    let pool = db.pool::<C>(9);
    let id = Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    stop(worker);

    let letter = &dead(&pool)[0];
    assert_eq!(letter.message_id, id);
    assert_eq!(letter.attempts, 3);
    assert!(
        letter.last_error.contains("gave up after 3 attempts"),
        "{}",
        letter.last_error
    );
    assert!(letter.last_error.contains("503"), "{}", letter.last_error);
    assert!(
        letter.last_error.contains("maintenance"),
        "{}",
        letter.last_error
    );
    assert_eq!(receiver.requests().len(), 3);
    assert!(pending(&pool).is_empty());
}

fn client_errors_are_dead_lettered_after_one_attempt<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|request, _| match n_of(request) {
        // Not 410: that one disables the endpoint (endpoint_health.rs).
        1 => Reply::status(404),
        _ => Reply::status(400),
    });
    let pool = db.pool::<C>(9);
    enqueue_all(&mut pool.get().unwrap(), &[Hook::new(1), Hook::new(2)]).unwrap();
    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 2));
    stop(worker);

    assert_eq!(
        receiver.requests().len(),
        2,
        "no retry of a permanent failure"
    );
    let letters = dead(&pool);
    assert!(letters.iter().all(|l| l.attempts == 1));
    assert!(letters.iter().any(|l| l.last_error.contains("404")));
    assert!(letters.iter().any(|l| l.last_error.contains("400")));
}

fn retry_after_is_honoured<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, n| {
        if n == 0 {
            Reply::with_header(429, "retry-after", "2")
        } else {
            Reply::status(200)
        }
    });
    let pool = db.pool::<C>(9);
    Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(receiver.wait_for(2, PATIENCE));
    stop(worker);
    let requests = receiver.requests();
    let gap = requests[1].at - requests[0].at;
    assert!(
        gap >= Duration::from_secs(2),
        "retried after {gap:?}, before Retry-After"
    );
    assert!(gap < Duration::from_secs(10), "retried after {gap:?}");
}

fn a_hanging_receiver_times_out_and_is_retried<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, n| {
        if n == 0 {
            Reply::Hang(Duration::from_secs(3))
        } else {
            Reply::status(200)
        }
    });
    let pool = db.pool::<C>(9);
    Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder_timing_out(&pool, &receiver, Duration::from_millis(300))
        .spawn()
        .unwrap();
    assert!(receiver.wait_for(2, PATIENCE));
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    let stats = stop(worker);
    let requests = receiver.requests();
    assert!(
        requests[1].at - requests[0].at < Duration::from_secs(3),
        "the retry did not wait for the hung request"
    );
    assert_eq!((stats.retried, stats.succeeded), (1, 1));
}

fn redirects_are_not_followed<C: TestConnection>(db: &TestDb) {
    let elsewhere = Receiver::ok();
    let target = elsewhere.url("/other");
    let receiver = Receiver::start(move |_, _| Reply::with_header(308, "location", &target));
    let pool = db.pool::<C>(9);
    Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    stop(worker);
    assert_eq!(receiver.requests().len(), 1);
    assert!(elsewhere.requests().is_empty(), "the redirect was followed");
    let error = &dead(&pool)[0].last_error;
    assert!(error.contains("308"), "{error}");
    assert!(error.contains("redirect"), "{error}");
}

fn poison_messages_are_dead_lettered_while_the_rest_flows<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(9);
    let mut batch = Batch::new();
    batch.push(&Hook::new(0)).unwrap();
    let nobody = batch.push(&Nobody { x: 1 }).unwrap();
    let old = batch.push(&OldHook { wrong: true }).unwrap();
    let panics = batch.push(&Panics { n: 0 }).unwrap();
    batch.push(&Panics { n: 1 }).unwrap();
    for n in 1..10 {
        batch.push(&Hook::new(n)).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();

    let worker = builder(&pool, &receiver)
        .unknown_type_grace(Duration::ZERO)
        .spawn()
        .unwrap();
    assert!(receiver.wait_for(10, PATIENCE));
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    stop(worker);

    let letters: HashMap<MessageId, String> = dead(&pool)
        .into_iter()
        .map(|l| (l.message_id, l.last_error))
        .collect();
    assert_eq!(letters.len(), 3, "{letters:?}");
    let unknown = &letters[&nobody];
    assert!(
        unknown.contains("no handler is registered for message type `test.nobody`"),
        "{unknown}"
    );
    let shape = &letters[&old];
    assert!(
        shape.contains("`test.hook`") && shape.contains("missing field `n`"),
        "{shape}"
    );
    let panic = &letters[&panics];
    assert!(
        panic.contains("the handler panicked: boom on message 0"),
        "{panic}"
    );
    assert_eq!(
        receiver.requests().len(),
        10,
        "every good message was delivered"
    );
}

fn dead_letters_can_be_requeued_and_purged<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| Reply::status(400));
    let pool = db.pool::<C>(9);
    let ids = enqueue_all(
        &mut pool.get().unwrap(),
        &[Hook::new(0), Hook::new(1), Hook::new(2)],
    )
    .unwrap();
    Nobody { x: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &receiver)
        .unknown_type_grace(Duration::ZERO)
        .spawn()
        .unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 4));
    receiver.set_behaviour(|_, _| Reply::status(200));
    let already = receiver.requests().len();

    let letters = dead(&pool);
    let first = letters.iter().find(|l| l.message_id == ids[0]).unwrap();
    let mut conn = pool.get().unwrap();
    let moved = requeue_dead_letters(
        &mut conn,
        &DeadLetterSelection::Positions(vec![first.position]),
    )
    .unwrap();
    assert_eq!(moved, [first.position]);
    assert!(receiver.wait_for(already + 1, PATIENCE));
    assert_eq!(
        webhook_id(&receiver.requests()[already]),
        ids[0],
        "re-queued with its id"
    );

    let purged = purge_dead_letters(
        &mut conn,
        &DeadLetterSelection::MessageType("test.nobody".into()),
    )
    .unwrap();
    assert_eq!(purged, 1);
    let moved = requeue_dead_letters(&mut conn, &DeadLetterSelection::All).unwrap();
    assert_eq!(moved.len(), 2);
    assert!(receiver.wait_for(already + 3, PATIENCE));
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    stop(worker);
    assert!(dead(&pool).is_empty());
    let redelivered: HashSet<MessageId> = receiver.requests()[already..]
        .iter()
        .map(webhook_id)
        .collect();
    assert_eq!(redelivered, ids.iter().copied().collect());
}

fn three_workers_deliver_ten_thousand_messages_exactly_once<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(5);
    let hooks: Vec<Hook> = (0..10_000).map(Hook::new).collect();
    pool.get()
        .unwrap()
        .transaction(|conn| enqueue_all(conn, &hooks))
        .unwrap();
    let workers: Vec<WorkerHandle> = (0..3)
        .map(|_| {
            let own_pool = db.pool::<C>(5);
            builder(&own_pool, &receiver)
                .batch_size(64)
                .handler_threads(8)
                .spawn()
                .unwrap()
        })
        .collect();
    assert!(
        receiver.wait_for(10_000, Duration::from_secs(120)),
        "got {}",
        receiver.requests().len()
    );
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    let per_worker: Vec<u64> = workers.into_iter().map(|w| stop(w).succeeded).collect();
    let requests = receiver.requests();
    let mut seen = HashSet::new();
    let duplicates: Vec<_> = requests
        .iter()
        .map(webhook_id)
        .filter(|id| !seen.insert(*id))
        .collect();
    assert!(duplicates.is_empty(), "{} duplicates", duplicates.len());
    assert_eq!(seen.len(), 10_000);
    assert_eq!(per_worker.iter().sum::<u64>(), 10_000);
    eprintln!("{:?}: deliveries per worker {per_worker:?}", db.backend());
}

fn a_late_outcome_from_an_expired_lease_is_fenced<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let store = DieselStore::new(pool.clone());
    let id = Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();

    let first = ClaimToken::new();
    let claimed = store
        .claim(first, ClaimLimit::messages(10), Duration::from_millis(300))
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].attempt, 1);
    assert!(
        store
            .claim(
                ClaimToken::new(),
                ClaimLimit::messages(10),
                Duration::from_secs(60)
            )
            .unwrap()
            .is_empty(),
        "a leased message is not claimed twice"
    );
    std::thread::sleep(Duration::from_millis(600));
    let second = ClaimToken::new();
    let reclaimed = store
        .claim(second, ClaimLimit::messages(10), Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        reclaimed.len(),
        1,
        "an expired lease makes the message claimable"
    );
    assert_eq!(reclaimed[0].message_id, id);
    assert_eq!(reclaimed[0].attempt, 2);

    let position = claimed[0].position;
    let late = |settlement| Outcome {
        token: first,
        position,
        message_id: id,
        ordering_key: None,
        log: None,
        settlement,
    };
    for settlement in [
        Settlement::Done,
        Settlement::Retry {
            delay: Duration::ZERO,
            error: "late".into(),
        },
        Settlement::DeadLetter {
            error: "late".into(),
        },
        Settlement::Release,
    ] {
        let fenced = store.settle(&[late(settlement.clone())]).unwrap();
        assert_eq!(
            fenced,
            [position],
            "{settlement:?} from the old claim is fenced"
        );
    }
    let rows = pending(&pool);
    assert_eq!(rows.len(), 1);
    assert!(rows[0].in_flight, "still leased to the second claim");
    assert_eq!(rows[0].attempts, 2);
    assert_eq!(rows[0].last_error, None);
    assert!(dead(&pool).is_empty());

    let fenced = store
        .settle(&[Outcome {
            token: second,
            position,
            message_id: id,
            ordering_key: None,
            log: None,
            settlement: Settlement::Done,
        }])
        .unwrap();
    assert!(fenced.is_empty());
    assert!(pending(&pool).is_empty());
}

/// Finished messages of several claims are deleted in one statement; the one whose lease passed
/// to another claim is fenced and kept, and the others go.
fn done_outcomes_of_several_claims_settle_together_and_are_fenced_apart<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(5);
    let store = DieselStore::new(pool.clone());
    let hooks: Vec<Hook> = (0..5).map(Hook::new).collect();
    enqueue_all(&mut pool.get().unwrap(), &hooks).unwrap();

    let expired = ClaimToken::new();
    let lost = store
        .claim(expired, ClaimLimit::messages(1), Duration::from_millis(200))
        .unwrap();
    let (current, kept) = (ClaimToken::new(), ClaimToken::new());
    let first = store
        .claim(current, ClaimLimit::messages(2), Duration::from_secs(60))
        .unwrap();
    let second = store
        .claim(kept, ClaimLimit::messages(2), Duration::from_secs(60))
        .unwrap();
    assert_eq!((lost.len(), first.len(), second.len()), (1, 2, 2));
    std::thread::sleep(Duration::from_millis(400));
    let thief = ClaimToken::new();
    let stolen = store
        .claim(thief, ClaimLimit::messages(10), Duration::from_secs(60))
        .unwrap();
    assert_eq!(stolen.len(), 1, "only the expired lease is claimable again");
    assert_eq!(stolen[0].position, lost[0].position);

    let done = |token, message: &ClaimedMessage| Outcome {
        token,
        position: message.position,
        message_id: message.message_id,
        ordering_key: message.ordering_key.clone(),
        log: None,
        settlement: Settlement::Done,
    };
    let mut outcomes = vec![done(expired, &lost[0])];
    outcomes.extend(first.iter().map(|m| done(current, m)));
    outcomes.push(done(kept, &second[0]));
    let fenced = store.settle(&outcomes).unwrap();
    assert_eq!(
        fenced,
        [lost[0].position],
        "only the stolen message is fenced"
    );

    let left: Vec<i64> = pending(&pool).iter().map(|m| m.position).collect();
    let mut expected = vec![lost[0].position, second[1].position];
    expected.sort_unstable();
    assert_eq!(left, expected, "the stolen one and the unsettled one stay");
}

fn messages_of_one_key_arrive_in_order_without_holding_back_others<C: TestConnection>(db: &TestDb) {
    let failures_left = std::sync::atomic::AtomicU32::new(5);
    let receiver = Receiver::start(move |request, _| {
        let failing = key_of(request).as_deref() == Some("a")
            && failures_left
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |left| left.checked_sub(1),
                )
                .is_ok();
        Reply::status(if failing { 503 } else { 200 })
    });
    let pool = db.pool::<C>(9);
    let mut batch = Batch::new();
    for n in 0..200 {
        for key in ["a", "b", "c"] {
            let hook = Hook {
                n,
                key: Some(key.into()),
            };
            batch
                .push_with(&hook, &EnqueueOptions::new().ordering_key(key))
                .unwrap();
        }
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &receiver)
        .retry_policy(
            RetryPolicy::new()
                .max_attempts(10)
                .initial_backoff(Duration::from_millis(100))
                .multiplier(1.0),
        )
        .spawn()
        .unwrap();
    assert!(
        receiver.wait_for(605, Duration::from_secs(90)),
        "got {}",
        receiver.requests().len()
    );
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    stop(worker);

    let requests = receiver.requests();
    let mut delivered: HashMap<String, Vec<u32>> = HashMap::new();
    let mut others_before_a_started = 0;
    let mut a_started = false;
    for (i, request) in requests.iter().enumerate() {
        let key = key_of(request).unwrap();
        let succeeded = !(key == "a" && is_failure(&requests, i));
        if key == "a" && succeeded {
            a_started = true;
        }
        if key != "a" && !a_started {
            others_before_a_started += 1;
        }
        if succeeded {
            delivered.entry(key).or_default().push(n_of(request));
        }
    }
    for key in ["a", "b", "c"] {
        let order = &delivered[key];
        assert_eq!(
            order,
            &(0..200).collect::<Vec<_>>(),
            "key {key} out of order"
        );
    }
    assert!(
        others_before_a_started > 10,
        "keys b and c progressed while a was retrying ({others_before_a_started} deliveries)"
    );
}

/// Requests of key `a` are answered 503 until five have been; index `i` is one of those.
fn is_failure(requests: &[Request], i: usize) -> bool {
    requests[..=i]
        .iter()
        .filter(|r| key_of(r).as_deref() == Some("a"))
        .count()
        <= 5
}

fn a_commit_wakes_the_worker_long_before_the_poll<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(9);
    let worker = builder(&pool, &receiver)
        .poll_interval(Duration::from_secs(10))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut latencies = Vec::new();
    for n in 0..5 {
        let committed = pool
            .get()
            .unwrap()
            .transaction(|conn| Hook::new(n).enqueue(conn))
            .map(|_| Instant::now())
            .unwrap();
        assert!(receiver.wait_for(n as usize + 1, Duration::from_secs(5)));
        latencies.push(
            receiver.requests()[n as usize]
                .at
                .saturating_duration_since(committed),
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop(worker);
    eprintln!("{:?}: commit -> delivery {latencies:?}", db.backend());
    for latency in &latencies {
        assert!(
            *latency < Duration::from_secs(1),
            "woke after {latency:?}, not at the commit"
        );
    }
}

fn shutdown_during_a_backlog_loses_nothing_and_holds_no_lease<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::start(|_, _| {
        std::thread::sleep(Duration::from_millis(20));
        Reply::status(200)
    });
    let pool = db.pool::<C>(9);
    let hooks: Vec<Hook> = (0..300).map(Hook::new).collect();
    let ids = enqueue_all(&mut pool.get().unwrap(), &hooks).unwrap();
    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(receiver.wait_for(20, PATIENCE));
    let asked = Instant::now();
    worker.shutdown(Duration::from_secs(5)).unwrap();
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");

    let delivered = receiver.requests().len();
    let left = pending(&pool);
    assert!(left.iter().all(|m| !m.in_flight), "a lease was left held");
    assert_eq!(
        delivered + left.len(),
        300,
        "nothing lost, nothing delivered and kept"
    );
    assert!(!left.is_empty(), "the backlog was not simply drained");

    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(receiver.wait_for(300, PATIENCE));
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    stop(worker);
    let all: HashSet<MessageId> = receiver.requests().iter().map(webhook_id).collect();
    assert_eq!(all, ids.into_iter().collect());
    assert_eq!(receiver.requests().len(), 300);
    eprintln!(
        "{:?}: shutdown took {took:?} with {delivered} of 300 delivered",
        db.backend()
    );
}

type TestBuilder<C> = WorkerBuilder<DieselStore<OutboxManager<C>>>;

fn settings_out_of_range_are_refused_with_their_name<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let refused = |configure: &dyn Fn(TestBuilder<C>) -> TestBuilder<C>, setting: &str| {
        let builder = configure(Worker::builder(DieselStore::new(pool.clone())));
        // Showing a builder with extreme settings must not panic either.
        let _ = format!("{builder:?}");
        let err = builder.spawn().unwrap_err();
        assert!(
            err.to_string().contains(&format!("`{setting}`")),
            "{setting}: {err}"
        );
    };
    refused(&|b| b.lease(Duration::from_secs(1)), "lease");
    refused(&|b| b.lease(Duration::MAX), "lease");
    refused(&|b| b.handler_timeout(Duration::MAX), "handler_timeout");
    refused(&|b| b.handler_timeout(Duration::ZERO), "handler_timeout");
    refused(&|b| b.poll_interval(Duration::ZERO), "poll_interval");
    refused(
        &|b| b.unknown_type_grace(Duration::MAX),
        "unknown_type_grace",
    );
    refused(&|b| b.batch_size(0), "batch_size");
    refused(&|b| b.batch_size(10_001), "batch_size");
    refused(&|b| b.max_batch_size(63), "max_batch_size");
    refused(&|b| b.batch_size(100).max_batch_size(99), "max_batch_size");
    refused(&|b| b.max_batch_size(10_001), "max_batch_size");
    refused(&|b| b.handler_threads(0), "handler_threads");
    refused(&|b| b.max_in_flight_bytes(0), "max_in_flight_bytes");
    // A lease shorter than the handler timeout is fine now: the heartbeat renews it.
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_timeout(Duration::from_secs(600))
        .lease(Duration::from_secs(3))
        .retry_policy(
            RetryPolicy::new()
                .initial_backoff(Duration::MAX)
                .max_backoff(Duration::MAX),
        )
        .spawn()
        .unwrap();
    stop(worker);
}

fn a_pool_too_small_for_the_worker_is_refused_at_spawn<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(1);
    let err = Worker::builder(DieselStore::new(pool.clone()))
        .spawn()
        .unwrap_err();
    let needed = if db.backend() == outbox_testkit::Backend::Postgres {
        4
    } else {
        3
    };
    assert!(
        err.to_string()
            .contains(&format!("the worker holds {needed} for as long as it runs")),
        "{err}"
    );
    let polling = Worker::builder(DieselStore::new(db.pool::<C>(3)))
        .poll_only()
        .spawn()
        .expect("three connections are enough without LISTEN");
    stop(polling);
}

/// A PostgreSQL schema from before the lease had its own column: every claim would fail on it,
/// so the worker says so when it starts.
#[test]
fn a_worker_on_a_postgres_schema_without_the_lease_column_is_refused() {
    let Some(db) = TestDb::new(outbox_testkit::Backend::Postgres) else {
        return;
    };
    let pool = db.pool::<diesel::PgConnection>(5);
    diesel::connection::SimpleConnection::batch_execute(
        &mut *pool.get().unwrap(),
        "ALTER TABLE outbox_message DROP COLUMN leased_until",
    )
    .unwrap();
    let err = Worker::builder(DieselStore::new(pool)).spawn().unwrap_err();
    assert!(
        err.to_string()
            .contains("run outbox_diesel::run_migrations"),
        "{err}"
    );
}

fn a_worker_on_a_wrong_database_fails_to_start_with_the_reason<C: TestConnection>(db: &TestDb) {
    let unmigrated = Pool::builder()
        .max_size(4)
        .build(ConnectionManager::<C>::new(db.url()))
        .unwrap();
    let err = Worker::builder(DieselStore::new(unmigrated))
        .spawn()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("run outbox_diesel::run_migrations"),
        "{err}"
    );

    let unreachable = match db.backend() {
        outbox_testkit::Backend::Postgres => "postgres://postgres@127.0.0.1:1/nowhere",
        outbox_testkit::Backend::Mysql => "mysql://root@127.0.0.1:1/nowhere",
        outbox_testkit::Backend::Sqlite => "/nonexistent-directory/outbox.db",
    };
    let pool = Pool::builder()
        .max_size(4)
        .connection_timeout(Duration::from_secs(2))
        .build_unchecked(ConnectionManager::<C>::new(unreachable));
    let err = Worker::builder(DieselStore::new(pool)).spawn().unwrap_err();
    assert!(
        err.to_string()
            .contains("getting a connection from the pool"),
        "{err}"
    );
}

fn stats_count_pending_in_flight_and_dead_by_type<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let store = DieselStore::new(pool.clone());
    enqueue_all(
        &mut pool.get().unwrap(),
        &[Hook::new(1), Hook::new(2), Hook::new(3)],
    )
    .unwrap();
    Nobody { x: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(2), Duration::from_secs(60))
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let dead = Outcome {
        token,
        position: claimed[0].position,
        message_id: claimed[0].message_id,
        ordering_key: None,
        log: None,
        settlement: Settlement::DeadLetter {
            error: "gone".into(),
        },
    };
    assert!(store.settle(&[dead]).unwrap().is_empty());

    let stats = outbox_diesel::admin::stats(&mut pool.get().unwrap()).unwrap();
    let hook = stats
        .iter()
        .find(|s| s.message_type == "test.hook")
        .unwrap();
    let nobody = stats
        .iter()
        .find(|s| s.message_type == "test.nobody")
        .unwrap();
    assert_eq!(
        (hook.pending, hook.in_flight, hook.dead),
        (2, 1, 1),
        "{hook:?}"
    );
    assert_eq!(
        (nobody.pending, nobody.in_flight, nobody.dead),
        (1, 0, 0),
        "{nobody:?}"
    );
    assert!(hook.oldest_pending.is_some());
    assert_eq!(stats.len(), 2);
}

/// Fails permanently with a NUL in its reason, which PostgreSQL text cannot hold.
#[outbox_handler("test.nul")]
#[derive(Debug, Serialize, Deserialize)]
struct NulReason;

impl Handler for NulReason {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Err(ProcessError::permanent("bad\0byte"))
    }
}

fn a_position_is_never_reused_and_dead_letters_do_not_collide<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(5);
    let store = DieselStore::new(pool.clone());
    let mut positions = Vec::new();
    for _ in 0..2 {
        let id = Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
        let token = ClaimToken::new();
        let claimed = store
            .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
            .unwrap();
        assert_eq!(claimed[0].message_id, id);
        positions.push(claimed[0].position);
        let dead = Outcome {
            token,
            position: claimed[0].position,
            message_id: id,
            ordering_key: None,
            log: None,
            settlement: Settlement::DeadLetter {
                error: "gone".into(),
            },
        };
        assert!(store.settle(&[dead]).unwrap().is_empty());
        assert!(pending(&pool).is_empty(), "the outbox is empty again");
    }
    assert_ne!(
        positions[0], positions[1],
        "an emptied table handed out a position again"
    );
    assert_eq!(dead(&pool).len(), 2);
}

fn an_error_text_with_a_nul_is_stored<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(9);
    NulReason.enqueue(&mut pool.get().unwrap()).unwrap();
    Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1
        && pending(&pool).is_empty()));
    stop(worker);
    let error = &dead(&pool)[0].last_error;
    assert_eq!(error, "failed permanently on attempt 1: bad\u{FFFD}byte");
    assert_eq!(receiver.requests().len(), 1, "the worker went on");
}

fn a_message_whose_worker_keeps_dying_is_dead_lettered<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(9);
    let store = DieselStore::new(pool.clone());
    let id = Hook::new(1).enqueue(&mut pool.get().unwrap()).unwrap();
    // Three claims that end without an outcome: each time, the worker died.
    for _ in 0..3 {
        let claimed = store
            .claim(
                ClaimToken::new(),
                ClaimLimit::messages(1),
                Duration::from_millis(200),
            )
            .unwrap();
        assert_eq!(claimed.len(), 1);
        std::thread::sleep(Duration::from_millis(300));
    }
    let worker = builder(&pool, &receiver).spawn().unwrap();
    assert!(eventually(PATIENCE, || dead(&pool).len() == 1));
    stop(worker);
    let letter = &dead(&pool)[0];
    assert_eq!(letter.message_id, id);
    assert!(
        letter.last_error.contains("was lost each time"),
        "{}",
        letter.last_error
    );
    assert!(
        receiver.requests().is_empty(),
        "not attempted a fourth time"
    );
}

fn the_next_message_of_a_key_does_not_wait_for_the_poll<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(9);
    let mut batch = Batch::new();
    for n in 0..30 {
        let hook = Hook {
            n,
            key: Some("k".into()),
        };
        batch
            .push_with(&hook, &EnqueueOptions::new().ordering_key("k"))
            .unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    let started = Instant::now();
    let worker = builder(&pool, &receiver)
        .poll_interval(Duration::from_secs(10))
        .spawn()
        .unwrap();
    assert!(
        receiver.wait_for(30, Duration::from_secs(9)),
        "a key's messages waited for the 10 s poll: {} delivered",
        receiver.requests().len()
    );
    let took = started.elapsed();
    stop(worker);
    let order: Vec<u32> = receiver.requests().iter().map(n_of).collect();
    assert_eq!(order, (0..30).collect::<Vec<_>>());
    eprintln!("{:?}: 30 messages of one key in {took:?}", db.backend());
}

backend_tests!(
    delivers_each_committed_message_once_signed,
    a_500_is_retried_until_the_receiver_recovers,
    a_receiver_that_always_fails_leads_to_a_dead_letter,
    client_errors_are_dead_lettered_after_one_attempt,
    retry_after_is_honoured,
    a_hanging_receiver_times_out_and_is_retried,
    redirects_are_not_followed,
    poison_messages_are_dead_lettered_while_the_rest_flows,
    dead_letters_can_be_requeued_and_purged,
    three_workers_deliver_ten_thousand_messages_exactly_once,
    a_late_outcome_from_an_expired_lease_is_fenced,
    done_outcomes_of_several_claims_settle_together_and_are_fenced_apart,
    messages_of_one_key_arrive_in_order_without_holding_back_others,
    a_commit_wakes_the_worker_long_before_the_poll,
    shutdown_during_a_backlog_loses_nothing_and_holds_no_lease,
    settings_out_of_range_are_refused_with_their_name,
    a_pool_too_small_for_the_worker_is_refused_at_spawn,
    stats_count_pending_in_flight_and_dead_by_type,
    a_worker_on_a_wrong_database_fails_to_start_with_the_reason,
    a_position_is_never_reused_and_dead_letters_do_not_collide,
    an_error_text_with_a_nul_is_stored,
    a_message_whose_worker_keeps_dying_is_dead_lettered,
    the_next_message_of_a_key_does_not_wait_for_the_poll,
    a_worker_short_of_connections_keeps_delivering_and_says_so,
);

/// An application that sizes the pool for the worker alone and takes one connection of it after
/// the worker started: the worker keeps delivering on the connections it has, says in its health
/// what the pool lends and who holds it, and is healthy again once the application lets go.
/// Taken before the worker starts, the connection makes `spawn` refuse, saying so.
fn a_worker_short_of_connections_keeps_delivering_and_says_so<C: TestConnection>(db: &TestDb) {
    outbox_testkit::log_to_stderr_from_env("OUTBOX_TEST_LOG");
    let receiver = Receiver::ok();
    let needed = if db.backend() == outbox_testkit::Backend::Postgres {
        4
    } else {
        3
    };
    let pool = db.pool::<C>(needed);
    let held_before = pool.get().unwrap();
    let refused = builder(&pool, &receiver).spawn().unwrap_err().to_string();
    assert!(
        refused.contains("the application holds 1")
            && refused.contains(&format!("max_size({})", needed + 1)),
        "{refused}"
    );
    drop(held_before);

    let worker = builder(&pool, &receiver).spawn().unwrap();
    let mut held_by_application = pool.get().unwrap();
    let hooks: Vec<Hook> = (0..600).map(Hook::new).collect();
    held_by_application
        .transaction(|conn| enqueue_all(conn, &hooks))
        .unwrap();
    assert!(
        receiver.wait_unique(600, PATIENCE),
        "delivered {} of 600 with one connection of the pool held by the application",
        receiver.unique()
    );
    assert!(
        eventually(PATIENCE, || !worker.health().is_healthy()),
        "{:?}",
        worker.health()
    );
    let shortage = worker.health().connection_shortage.unwrap_or_default();
    assert!(
        shortage.contains(&format!("lends at most {needed}"))
            && shortage.contains("the application (or exactly-once handlers) 1")
            && shortage.contains(&format!("max_size({})", needed + 1)),
        "{shortage}"
    );

    // The acker settled the last deliveries on another role's connection and needs none until
    // the next message comes: the pool lending again ends the shortage all the same.
    drop(held_by_application);
    assert!(
        eventually(PATIENCE, || worker.health().is_healthy()),
        "{:?}",
        worker.health()
    );
    Hook::new(600).enqueue(&mut pool.get().unwrap()).unwrap();
    assert!(receiver.wait_unique(601, PATIENCE));
    assert!(worker.health().is_healthy(), "{:?}", worker.health());
    let stats = stop(worker);
    assert_eq!(stats.succeeded, 601);
    assert!(dead(&pool).is_empty());
}
