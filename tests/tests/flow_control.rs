//! Pacing destinations, against real receivers on 127.0.0.1 on every backend: a receiver that
//! rate-limits (`429` with `Retry-After`) gets everything at about the rate it allows, with few
//! requests over it and no attempt spent; a static rate limit holds in every second; a limit of
//! nothing is refused at spawn.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_diesel::destination::{DestinationOptions, RateLimit};
use outbox_diesel::{outbox_handler, Batch, DieselStore, Worker, WorkerError};
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

backend_tests!(
    a_receiver_that_rate_limits_gets_everything_without_spent_attempts,
    a_static_rate_limit_holds_in_every_second,
    a_rate_limit_of_nothing_is_refused_at_spawn,
);
