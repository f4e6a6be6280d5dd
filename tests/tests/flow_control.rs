//! Pacing destinations, against real receivers on 127.0.0.1 on every backend: a receiver that
//! rate-limits (`429` with `Retry-After`) gets everything at about the rate it allows, with few
//! requests over it and no attempt spent; a static rate limit holds in every second; a limit of
//! nothing is refused at spawn; a paced backlog is claimed about twice, and a raised priority
//! is not put behind its turns. Operators pause and resume message types and destinations:
//! their messages stay pending without spending attempts, per-key order holds across a pause,
//! and a resume racing the workers strands nothing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_diesel::admin::{self, PauseKind};
use outbox_diesel::destination::{DestinationOptions, RateLimit};
use outbox_diesel::{
    outbox_handler, Batch, Context, DieselStore, Enqueue, EnqueueOptions, Handler, Priority,
    ProcessError, Worker, WorkerError,
};
use outbox_testkit::http::{Receiver, Reply, Request};
use outbox_testkit::outbox::{dead, endpoint, pending};
use outbox_testkit::{backend_tests, eventually, TestConnection, TestDb};
use serde::{Deserialize, Serialize};

const PATIENCE: Duration = Duration::from_secs(60);

/// Routed to the paced destination: no handler code.
#[outbox_handler("test.paced", deliver_to = "paced")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Paced {
    n: u32,
}

/// Routed to the same destination as [`Paced`]: the type an operator pauses.
#[outbox_handler("test.pausable", deliver_to = "paced")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pausable {
    n: u32,
}

/// Delivered by handler code to a destination of its own, which an operator pauses (a route
/// would make every worker of this file name that destination).
#[outbox_handler("test.elsewhere")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Elsewhere {
    n: u32,
}

impl Handler for Elsewhere {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.destination("elsewhere")?.deliver(&self)
    }
}

/// How long a worker may take to follow a pause or a resume: it reads them every 5 s.
const FOLLOWS_WITHIN: Duration = Duration::from_secs(6);

/// The `(type, n)` of each request the receiver accepted, in arrival order.
fn accepted(receiver: &Receiver) -> Vec<(String, u64)> {
    receiver
        .requests()
        .iter()
        .filter(|r| r.answered == 200)
        .map(|r| {
            let body = r.json();
            (
                body["type"].as_str().unwrap_or_default().to_owned(),
                body["data"]["n"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}

fn enqueue<C: TestConnection>(pool: &outbox_testkit::TestPool<C>, count: u32) {
    let mut batch = Batch::new();
    for n in 0..count {
        batch.push(&Paced { n }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
}

/// A receiver that accepts `per_second` requests in each second from its first request and
/// answers the others `429 Too Many Requests` with `Retry-After: 1`, as mail APIs do.
fn rate_limited(per_second: usize) -> Receiver {
    let window: Arc<Mutex<Option<(Instant, usize)>>> = Arc::default();
    Receiver::start(move |_: &Request, _| {
        let mut window = window.lock().unwrap();
        let now = Instant::now();
        let (start, taken) = window.get_or_insert((now, 0));
        if now.duration_since(*start) >= Duration::from_secs(1) {
            *start = now;
            *taken = 0;
        }
        *taken += 1;
        if *taken <= per_second {
            Reply::status(200)
        } else {
            Reply::with_header(429, "retry-after", "1")
        }
    })
}

fn a_receiver_that_rate_limits_gets_everything_without_spent_attempts<C: TestConnection>(
    db: &TestDb,
) {
    const MESSAGES: u32 = 500;
    let receiver = rate_limited(50);
    let pool = db.pool::<C>(6);
    enqueue(&pool, MESSAGES);
    // The defaults: 16 handler threads, no rate limit set, the rate learned from push-back.
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "{} still pending",
        pending(&pool).len()
    );
    let stats = worker.shutdown(PATIENCE).unwrap();
    assert!(dead(&pool).is_empty(), "{:?}", dead(&pool));
    let requests = receiver.requests();
    let accepted: std::collections::HashSet<&str> = requests
        .iter()
        .filter(|r| r.answered == 200)
        .filter_map(Request::webhook_id)
        .collect();
    assert_eq!(accepted.len(), MESSAGES as usize);
    assert_eq!(
        (stats.retried, stats.dead_lettered),
        (0, 0),
        "push-back never spends an attempt: {stats:?}"
    );

    let refused = requests.iter().filter(|r| r.answered == 429).count();
    // Without pacing, every hold's end sends all 16 threads at a spent window: a quarter of the
    // requests or more are refused. Paced, the first burst's 16 and a few at each rise remain.
    assert!(
        refused * 10 <= requests.len(),
        "{refused} of {} requests were answered 429",
        requests.len()
    );
}

/// Requests in the busiest one-second window.
fn busiest_second(requests: &[Request]) -> usize {
    let mut times: Vec<Instant> = requests.iter().map(|r| r.at).collect();
    times.sort();
    let mut busiest = 0;
    let mut first = 0;
    for (last, at) in times.iter().enumerate() {
        while at.duration_since(times[first]) >= Duration::from_secs(1) {
            first += 1;
        }
        busiest = busiest.max(last + 1 - first);
    }
    busiest
}

fn a_static_rate_limit_holds_in_every_second<C: TestConnection>(db: &TestDb) {
    const MESSAGES: u32 = 120;
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(6);
    enqueue(&pool, MESSAGES);
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination_with(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
            DestinationOptions::new().rate_limit(RateLimit::per_second(40).burst(5)),
        )
        .spawn()
        .unwrap();
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "{} still pending",
        pending(&pool).len()
    );
    let stats = worker.shutdown(PATIENCE).unwrap();
    assert_eq!(receiver.unique(), u64::from(MESSAGES));
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
    // 40 a second and a burst of 5; 16 threads unpaced send all 120 within a second.
    let busiest = busiest_second(&receiver.requests());
    assert!(busiest <= 40 + 5 + 1, "{busiest} requests in one second");
}

/// Two workers (two processes, as far as pacing knows: each has its own pacer) under one limit
/// across processes: together they keep to it in every second, as one worker would, whichever
/// of them claims the messages. With a limit of each process instead, they send twice the rate.
fn a_limit_across_processes_holds_for_two_workers_together<C: TestConnection>(db: &TestDb) {
    const MESSAGES: u32 = 80;
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(12);
    let spawn = || {
        Worker::builder(DieselStore::new(pool.clone()))
            .poll_interval(Duration::from_millis(20))
            .batch_size(4)
            .destination_with(
                "paced",
                endpoint(&receiver.url("/in"), Duration::from_secs(5)),
                DestinationOptions::new()
                    .rate_limit(RateLimit::per_second(20).burst(2).across_processes()),
            )
            .spawn()
            .unwrap()
    };
    let workers = [spawn(), spawn()];
    // Arriving faster than the limit, in small batches both workers claim from: neither lines
    // up the whole backlog at once (which would spread it over its own turns only).
    for round in 0..MESSAGES / 4 {
        let mut batch = Batch::new();
        for n in round * 4..(round + 1) * 4 {
            batch.push(&Paced { n }).unwrap();
        }
        batch.enqueue(&mut pool.get().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "{} still pending",
        pending(&pool).len()
    );
    let mut delivered = Vec::new();
    for worker in workers {
        let stats = worker.shutdown(PATIENCE).unwrap();
        assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
        delivered.push(stats.succeeded);
    }
    assert!(dead(&pool).is_empty(), "{:?}", dead(&pool));
    assert_eq!(receiver.unique(), u64::from(MESSAGES));
    // 20 a second and a burst of 2 for both together; each at 20 would send 40. The count is
    // of arrivals at the receiver: on a loaded machine a request sent at its turn can arrive
    // 100 ms late, beside the next second's, so two more are allowed for that (still far
    // from the 40 of a limit per process).
    let busiest = busiest_second(&receiver.requests());
    assert!(
        busiest <= 20 + 2 + 1 + 2,
        "{busiest} requests in one second (delivered by each worker: {delivered:?})"
    );
}

/// A limit across processes takes its turns over a connection of its own: a pool just large
/// enough for the worker without one is refused at spawn, saying so, instead of every paced
/// delivery waiting for a connection the worker's own threads hold.
fn a_limit_across_processes_asks_the_pool_for_one_more_connection<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let without = if db.backend() == outbox_testkit::Backend::Postgres {
        4
    } else {
        3
    };
    let spawn = |size: u32| {
        Worker::builder(DieselStore::new(db.pool::<C>(size)))
            .destination_with(
                "paced",
                endpoint(&receiver.url("/in"), Duration::from_secs(5)),
                DestinationOptions::new().rate_limit(RateLimit::per_second(20).across_processes()),
            )
            .spawn()
    };
    let refused = spawn(without).unwrap_err();
    assert!(
        refused.to_string().contains(&format!(
            "the worker holds {} for as long as it runs",
            without + 1
        )) && refused.to_string().contains("rate limits across processes"),
        "{refused}"
    );
    let worker = spawn(without + 1).expect("one more connection is enough");
    worker.shutdown(PATIENCE).unwrap();
}

/// A backlog of 16 for a destination that takes one delivery every 400 ms. Each message over
/// the limit is deferred to a turn of its own, so the backlog is claimed about twice (once to
/// hand out the turns, once at each turn), not again every time a deferral ends (nine times a
/// message, when every deferral ended at the next free turn). A `High`
/// message enqueued in the middle is not put behind the backlog's turns: it takes the next free
/// one.
fn a_paced_backlog_is_claimed_about_twice_and_a_raised_priority_goes_first<C: TestConnection>(
    db: &TestDb,
) {
    const MESSAGES: u32 = 16;
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(6);
    enqueue(&pool, MESSAGES);
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination_with(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
            DestinationOptions::new()
                .rate_limit(RateLimit::one_every(Duration::from_millis(400)).burst(1)),
        )
        .spawn()
        .unwrap();
    // Right after a delivery, when the next free turn is furthest (400 ms: too far to wait for
    // in the handler thread, so the message is deferred to a turn).
    assert!(eventually(PATIENCE, || accepted(&receiver).len() >= 3));
    Paced { n: 10_000 }
        .enqueue_with(
            &mut pool.get().unwrap(),
            &EnqueueOptions::new().priority(Priority::High),
        )
        .unwrap();
    let before = accepted(&receiver).len();
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "{} still pending",
        pending(&pool).len()
    );
    let stats = worker.shutdown(PATIENCE).unwrap();
    let delivered = accepted(&receiver);
    assert_eq!(receiver.unique(), u64::from(MESSAGES) + 1);
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
    // Once each, once more at each turn, and some more: the High message's own deferral to the
    // next free turn, the message whose turn it took, and messages whose returns bunched up (a
    // loaded machine: one back late takes the turn of the next, which goes to the end of the
    // line; 3.4 a message seen in CI). Every deferral ending at the next free turn, the whole
    // backlog came back for each: 152 claims here, 9 a message.
    assert!(
        stats.claimed <= 5 * u64::from(MESSAGES + 1),
        "{} claims for {} messages: {stats:?}",
        stats.claimed,
        MESSAGES + 1
    );
    let urgent_at = delivered
        .iter()
        .position(|(_, n)| *n == 10_000)
        .expect("the High message was delivered");
    assert!(
        urgent_at <= before + 2,
        "the High message went {} deliveries after its enqueue, behind the backlog ({} \
         delivered before it)",
        urgent_at - before,
        before
    );
}

fn a_rate_limit_of_nothing_is_refused_at_spawn<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(6);
    let refused = Worker::builder(DieselStore::new(pool.clone()))
        .destination_with(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
            DestinationOptions::new().rate_limit(RateLimit::per_second(0)),
        )
        .spawn()
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(&refused, WorkerError::InvalidConfig { problem, .. } if problem.contains("paced")),
        "{refused}"
    );
}

fn a_paused_type_waits_without_spending_attempts_and_keeps_its_keys_in_order<C: TestConnection>(
    db: &TestDb,
) {
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(6);
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    let mut conn = pool.get().unwrap();
    assert!(admin::pause(
        &mut conn,
        PauseKind::MessageType,
        "test.pausable",
        "incident 7"
    )
    .unwrap());
    assert!(
        !admin::pause(&mut conn, PauseKind::MessageType, "test.pausable", "again").unwrap(),
        "a second pause changes nothing"
    );
    let pauses = admin::pauses(&mut conn).unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        (pauses[0].kind, pauses[0].reason.as_str()),
        (PauseKind::MessageType, "incident 7")
    );
    // The running worker follows within a few seconds.
    std::thread::sleep(FOLLOWS_WITHIN);

    // 40 of the paused type, 40 of another type; and on one key, a paused message with one of
    // the other type behind it: the key waits for its head, so order holds.
    let mut batch = Batch::new();
    for n in 0..40 {
        batch.push(&Pausable { n }).unwrap();
        batch.push(&Paced { n }).unwrap();
    }
    let keyed = EnqueueOptions::new().ordering_key("k");
    batch.push_with(&Pausable { n: 1000 }, &keyed).unwrap();
    batch.push_with(&Paced { n: 1001 }, &keyed).unwrap();
    batch.enqueue(&mut conn).unwrap();

    assert!(
        receiver.wait_until(PATIENCE, |requests| requests.len() >= 40),
        "the type that is not paused is delivered"
    );
    // Every message of the paused type has been claimed and paused by now, or waits behind
    // its key: none is ever sent, attempted or dead-lettered.
    std::thread::sleep(Duration::from_secs(2));
    let delivered = accepted(&receiver);
    assert_eq!(delivered.len(), 40, "{delivered:?}");
    assert!(
        delivered.iter().all(|(t, n)| t == "test.paced" && *n < 40),
        "{delivered:?}"
    );
    let waiting = pending(&pool);
    assert_eq!(waiting.len(), 42, "{waiting:?}");
    assert!(waiting.iter().all(|m| m.attempts == 0), "{waiting:?}");
    assert!(
        waiting
            .iter()
            .all(|m| m.paused == (m.message_type == "test.pausable") && !m.in_flight),
        "each message of the paused type is marked paused, the one behind its key waits: \
         {waiting:?}"
    );
    assert!(dead(&pool).is_empty());
    let paused_one = waiting
        .iter()
        .find(|m| m.message_type == "test.pausable" && m.ordering_key.is_none())
        .unwrap();
    assert!(
        paused_one
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("paused by an operator (incident 7)"),
        "{paused_one:?}"
    );

    let released = admin::resume(&mut conn, PauseKind::MessageType, "test.pausable").unwrap();
    assert!(
        matches!(released, Some(n) if (40..=41).contains(&n)),
        "the paused messages are due again at once: {released:?}"
    );
    assert_eq!(
        admin::resume(&mut conn, PauseKind::MessageType, "test.pausable").unwrap(),
        None
    );
    assert!(admin::pauses(&mut conn).unwrap().is_empty());
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "{:?} still pending",
        pending(&pool)
    );
    let stats = worker.shutdown(PATIENCE).unwrap();
    assert!(dead(&pool).is_empty(), "{:?}", dead(&pool));
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
    assert!(stats.paused >= 40, "{stats:?}");
    let delivered = accepted(&receiver);
    assert_eq!(delivered.len(), 82, "each delivered once: {delivered:?}");
    let key_order: Vec<u64> = delivered
        .iter()
        .map(|(_, n)| *n)
        .filter(|n| *n >= 1000)
        .collect();
    assert_eq!(
        key_order,
        [1000, 1001],
        "the key's order held across the pause"
    );
}

fn a_paused_destination_gets_nothing_until_resumed<C: TestConnection>(db: &TestDb) {
    let receiver = Receiver::ok();
    let other = Receiver::ok();
    let pool = db.pool::<C>(6);
    let mut conn = pool.get().unwrap();
    // Paused before the worker starts: it reads the pauses before its first claim.
    assert!(admin::pause(&mut conn, PauseKind::Destination, "elsewhere", "migrating").unwrap());
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination("paced", endpoint(&other.url("/in"), Duration::from_secs(5)))
        .destination(
            "elsewhere",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    let mut batch = Batch::new();
    for n in 0..30 {
        batch.push(&Elsewhere { n }).unwrap();
        batch.push(&Paced { n }).unwrap();
    }
    batch.enqueue(&mut conn).unwrap();
    assert!(
        other.wait_unique(30, PATIENCE),
        "the other destination gets its messages"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        receiver.count(),
        0,
        "nothing is sent to a paused destination"
    );
    let waiting = pending(&pool);
    assert_eq!(waiting.len(), 30, "{waiting:?}");
    assert!(waiting
        .iter()
        .all(|m| m.attempts == 0 && m.message_type == "test.elsewhere"));

    // Resumed while the worker runs: it follows within a few seconds.
    assert!(
        admin::resume(&mut conn, PauseKind::Destination, "elsewhere")
            .unwrap()
            .is_some()
    );
    assert!(
        receiver.wait_unique(30, PATIENCE + FOLLOWS_WITHIN),
        "{} delivered",
        receiver.unique()
    );
    assert!(eventually(PATIENCE, || pending(&pool).is_empty()));
    let stats = worker.shutdown(PATIENCE).unwrap();
    assert!(dead(&pool).is_empty(), "{:?}", dead(&pool));
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
}

fn pauses_and_resumes_racing_two_workers_strand_nothing<C: TestConnection>(db: &TestDb) {
    const MESSAGES: u32 = 400;
    let receiver = Receiver::ok();
    let pool = db.pool::<C>(12);
    let spawn = || {
        Worker::builder(DieselStore::new(pool.clone()))
            .poll_interval(Duration::from_millis(20))
            .batch_size(8)
            .destination(
                "paced",
                endpoint(&receiver.url("/in"), Duration::from_secs(5)),
            )
            .spawn()
            .unwrap()
    };
    let workers = [spawn(), spawn()];
    let mut conn = pool.get().unwrap();
    // Pauses and resumes far faster than the workers read them (every 5 s), while messages
    // arrive: workers pause messages after the resume that would have released them, and
    // settle pauses while a resume commits.
    for round in 0..MESSAGES / 20 {
        let mut batch = Batch::new();
        for n in round * 20..(round + 1) * 20 {
            batch.push(&Pausable { n }).unwrap();
        }
        batch.enqueue(&mut conn).unwrap();
        if round % 2 == 0 {
            admin::pause(
                &mut conn,
                PauseKind::MessageType,
                "test.pausable",
                "flapping",
            )
            .unwrap();
        } else {
            admin::resume(&mut conn, PauseKind::MessageType, "test.pausable").unwrap();
        }
        std::thread::sleep(Duration::from_millis(if round % 7 == 0 {
            5_300
        } else {
            150
        }));
    }
    admin::resume(&mut conn, PauseKind::MessageType, "test.pausable").unwrap();
    assert!(
        eventually(PATIENCE, || pending(&pool).is_empty()),
        "stranded: {:?}",
        pending(&pool)
            .iter()
            .map(|m| (m.position, m.last_error.clone()))
            .collect::<Vec<_>>()
    );
    let mut paused = 0;
    for worker in workers {
        let stats = worker.shutdown(PATIENCE).unwrap();
        assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
        paused += stats.paused;
    }
    assert!(paused > 0, "the workers did pause messages");
    assert!(dead(&pool).is_empty());
    assert_eq!(receiver.unique(), u64::from(MESSAGES));
}

fn names_no_type_or_destination_could_have_are_refused<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(2);
    let mut conn = pool.get().unwrap();
    for name in ["", "a\nb", &"x".repeat(256)] {
        let refused = admin::pause(&mut conn, PauseKind::MessageType, name, "why").unwrap_err();
        assert!(
            matches!(refused, outbox_diesel::Error::InvalidPauseName { .. }),
            "{refused}"
        );
    }
    // 255 characters of four bytes each: the longest name a type may have.
    let longest = "\u{1F600}".repeat(255);
    assert!(admin::pause(&mut conn, PauseKind::Destination, &longest, "why").unwrap());
    assert_eq!(admin::pauses(&mut conn).unwrap()[0].name, longest);
    assert_eq!(
        admin::resume(&mut conn, PauseKind::Destination, &longest).unwrap(),
        Some(0)
    );
}

/// A receiver that accepts at most `per_second` requests in any one second (a sliding window)
/// and answers the others `429` with `Retry-After: 1`.
fn sliding_limit(per_second: usize) -> Receiver {
    let accepted: Arc<Mutex<std::collections::VecDeque<Instant>>> = Arc::default();
    Receiver::start(move |_: &Request, _| {
        let mut accepted = accepted.lock().unwrap();
        let now = Instant::now();
        while accepted
            .front()
            .is_some_and(|at| now.duration_since(*at) >= Duration::from_secs(1))
        {
            accepted.pop_front();
        }
        if accepted.len() < per_second {
            accepted.push_back(now);
            Reply::status(200)
        } else {
            Reply::with_header(429, "retry-after", "1")
        }
    })
}

/// A receiver that answers `429` with `Retry-After: 1` until `opens`, then takes everything.
fn pushing_back_until(opens: Instant) -> Receiver {
    Receiver::start(move |_: &Request, _| {
        if Instant::now() < opens {
            Reply::with_header(429, "retry-after", "1")
        } else {
            Reply::status(200)
        }
    })
}

/// A receiver that pushes back for its first three seconds (a deploy, a burst limit) and then
/// takes everything: the backlog drains at the receiver's pace once it opens, not at a rate
/// learned while it refused everything.
fn a_backlog_drains_at_full_speed_after_a_few_seconds_of_push_back<C: TestConnection>(db: &TestDb) {
    const MESSAGES: u32 = 3_000;
    let pool = db.pool::<C>(6);
    enqueue(&pool, MESSAGES);
    let opens = Instant::now() + Duration::from_secs(3);
    let receiver = pushing_back_until(opens);
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    // The receiver takes thousands a second once open: half a minute is ample, where a rate
    // learned from the refusals alone (0.9 a second) spread the backlog over hours.
    let drained = receiver.wait_until(Duration::from_secs(33), |requests| {
        requests.iter().filter(|r| r.answered == 200).count() >= MESSAGES as usize
    });
    let delivered = accepted(&receiver).len();
    let stats = worker.shutdown(PATIENCE).unwrap();
    assert!(
        drained,
        "{delivered} of {MESSAGES} delivered within 30 s of the receiver opening: {stats:?}"
    );
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
    assert!(dead(&pool).is_empty());
}

/// A receiver that takes two requests, refuses everything for two seconds and then takes
/// everything: the worker learns a rate of 1.8 a second from it and lines the backlog up on it.
/// The line speeds up as the rate rises (200 messages in about 18 s), where turns kept at the
/// spacing they were booked with took nearly two minutes.
fn a_line_booked_at_a_rate_learned_low_speeds_up_as_the_rate_rises<C: TestConnection>(db: &TestDb) {
    const MESSAGES: u32 = 200;
    let pool = db.pool::<C>(6);
    enqueue(&pool, MESSAGES);
    let refusing: Arc<Mutex<Option<Instant>>> = Arc::default();
    let receiver = Receiver::start(move |_: &Request, n| {
        let mut refusing = refusing.lock().unwrap();
        if n < 2 {
            return Reply::status(200);
        }
        let since = *refusing.get_or_insert_with(Instant::now);
        if since.elapsed() < Duration::from_secs(2) {
            Reply::with_header(429, "retry-after", "1")
        } else {
            Reply::status(200)
        }
    });
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    let drained = receiver.wait_until(Duration::from_secs(35), |requests| {
        requests.iter().filter(|r| r.answered == 200).count() >= MESSAGES as usize
    });
    let delivered = accepted(&receiver).len();
    let stats = worker.shutdown(PATIENCE).unwrap();
    assert!(
        drained,
        "{delivered} of {MESSAGES} delivered within 35 s: {stats:?}"
    );
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
}

/// A receiver that takes 100 requests a second and answers the rest `429`: 900 messages go in
/// about nine seconds, and turns booked at a rate learned low follow the rate as it rises.
fn a_receiver_limited_to_100_a_second_gets_900_in_seconds<C: TestConnection>(db: &TestDb) {
    const MESSAGES: u32 = 900;
    let receiver = sliding_limit(100);
    let pool = db.pool::<C>(6);
    enqueue(&pool, MESSAGES);
    let started = Instant::now();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .destination(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
        )
        .spawn()
        .unwrap();
    let drained = receiver.wait_until(Duration::from_secs(20), |requests| {
        requests.iter().filter(|r| r.answered == 200).count() >= MESSAGES as usize
    });
    let took = started.elapsed();
    let delivered = accepted(&receiver).len();
    let stats = worker.shutdown(PATIENCE).unwrap();
    assert!(
        drained,
        "{delivered} of {MESSAGES} delivered in {took:?} at a receiver's 100 a second: {stats:?}"
    );
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
}

/// An operator pauses a paced destination with a backlog waiting for longer than
/// `max_deferral`, and resumes it: the time paused does not count toward the bound, so nothing
/// the pause held is dead-lettered, neither by the pacing after the resume nor by a receiver
/// that then pushes back for a moment.
fn a_pause_longer_than_max_deferral_dead_letters_nothing_after_the_resume<C: TestConnection>(
    db: &TestDb,
) {
    const MESSAGES: u32 = 300;
    let pool = db.pool::<C>(6);
    let mut conn = pool.get().unwrap();
    assert!(admin::pause(
        &mut conn,
        PauseKind::Destination,
        "paced",
        "weekend incident"
    )
    .unwrap());
    enqueue(&pool, MESSAGES);
    let receiver = Receiver::ok();
    let started = Instant::now();
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .poll_interval(Duration::from_millis(50))
        .max_deferral(Duration::from_secs(2))
        .destination_with(
            "paced",
            endpoint(&receiver.url("/in"), Duration::from_secs(5)),
            DestinationOptions::new().rate_limit(RateLimit::per_second(50)),
        )
        .spawn()
        .unwrap();
    // Every message claimed and paused, then the pause outlasts the bound.
    assert!(eventually(PATIENCE, || {
        pending(&pool).iter().filter(|m| m.paused).count() == MESSAGES as usize
    }));
    // Past the worker's first chores after its start (every 5 s), which must not release the
    // messages of a destination still paused (each would be claimed and paused again), and at
    // least 3 s past the bound.
    std::thread::sleep(
        (started + Duration::from_millis(6_500))
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(3)),
    );
    assert_eq!(
        worker.stats().paused,
        u64::from(MESSAGES),
        "each message was paused once, and stayed paused"
    );
    // After the resume the receiver pushes back for a second: the destination holds its
    // messages, deferring them, and the pacing defers the rest to their turns.
    let opens = Instant::now() + Duration::from_millis(1_500);
    receiver.set_behaviour(move |_: &Request, _| {
        if Instant::now() < opens {
            Reply::with_header(429, "retry-after", "1")
        } else {
            Reply::status(200)
        }
    });
    assert_eq!(
        admin::resume(&mut conn, PauseKind::Destination, "paced").unwrap(),
        Some(MESSAGES as usize)
    );
    let drained = eventually(PATIENCE, || pending(&pool).is_empty());
    let stats = worker.shutdown(PATIENCE).unwrap();
    let dead = dead(&pool);
    assert!(
        dead.is_empty(),
        "{} of {MESSAGES} dead-lettered after the resume, the first: {:?}",
        dead.len(),
        dead.first()
    );
    assert!(drained, "{} still pending", pending(&pool).len());
    assert_eq!(accepted(&receiver).len(), MESSAGES as usize);
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0), "{stats:?}");
}

backend_tests!(
    a_paused_type_waits_without_spending_attempts_and_keeps_its_keys_in_order,
    a_paused_destination_gets_nothing_until_resumed,
    pauses_and_resumes_racing_two_workers_strand_nothing,
    names_no_type_or_destination_could_have_are_refused,
    a_receiver_that_rate_limits_gets_everything_without_spent_attempts,
    a_static_rate_limit_holds_in_every_second,
    a_limit_across_processes_holds_for_two_workers_together,
    a_limit_across_processes_asks_the_pool_for_one_more_connection,
    a_paced_backlog_is_claimed_about_twice_and_a_raised_priority_goes_first,
    a_rate_limit_of_nothing_is_refused_at_spawn,
    a_backlog_drains_at_full_speed_after_a_few_seconds_of_push_back,
    a_receiver_limited_to_100_a_second_gets_900_in_seconds,
    a_line_booked_at_a_rate_learned_low_speeds_up_as_the_rate_rises,
    a_pause_longer_than_max_deferral_dead_letters_nothing_after_the_resume,
);
