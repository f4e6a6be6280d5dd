//! `ratelimit`: a receiver that rate-limits, and a static limit.
//!
//! 1. **Push-back.** A receiver that accepts `--rate` requests (default 100) in each second and
//!    answers the others `429` with `Retry-After: 1`, as mail APIs do; a backlog of `--count`
//!    messages (default 1,000) and a worker at its defaults (no limit set: the rate is learned
//!    from the push-back). Figures: the time to deliver them all, the share of requests
//!    answered 429, dead letters, and attempts spent (retries).
//! 2. **Static limit.** A receiver that accepts everything and a worker whose destination has
//!    `RateLimit::per_second(14)` (Amazon SES's default), for `--seconds` (default 60): the
//!    rate delivered, the busiest second, and the claims per delivery (messages over the limit
//!    are claimed, deferred to their turns and claimed again).
//! 3. **Two processes, half each.** The same backlog and receiver, two worker processes each
//!    limited to half (7 a second, a limit of each process): the rate they deliver together.
//! 4. **Two processes, one limit.** The same, with one limit of 14 a second
//!    `across_processes` (the store keeps its turns): the rate they deliver together, the
//!    busiest second, and the claims per delivery.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_diesel::destination::{DestinationOptions, RateLimit};
use outbox_diesel::{DieselStore, Worker};
use serde_json::{json, Map};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::drain::{prefill, Kind};
use crate::handlers::endpoint;
use crate::handlers::HOOK;
use crate::report::Report;
use crate::stats::round;
use crate::worker_process::{self, ChildWorker};
use crate::{Opts, Res, WithContext};
use outbox_testkit::http::{Receiver, Reply, Request};

/// The static limit of the second part: Amazon SES's default sending rate.
const STATIC_LIMIT: u32 = 14;

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

/// A receiver that accepts `per_second` requests in each second from the first request of the
/// second and answers the others `429 Too Many Requests` with `Retry-After: 1`.
fn rate_limited(per_second: usize) -> Receiver {
    let window: Arc<Mutex<Option<(Instant, usize)>>> = Arc::default();
    Receiver::start(move |_: &Request, _| {
        let mut window = window.lock().unwrap_or_else(|p| p.into_inner());
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

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let allowed = opts.rate.unwrap_or(100.0).max(1.0) as usize;
    let count = opts.count.unwrap_or(if opts.quick { 200 } else { 1_000 });
    let seconds = opts.seconds.unwrap_or(if opts.quick { 3.0 } else { 60.0 });
    let mut report = Report::new(
        "ratelimit",
        opts,
        json!({
            "push_back": {
                "receiver": format!("{allowed} requests a second, then 429 with Retry-After: 1"),
                "messages": count,
                "worker": "defaults (16 handler threads, no limit set)",
            },
            "static": {
                "limit_per_s": STATIC_LIMIT,
                "seconds": seconds,
                "handler_threads": opts.handler_threads,
            },
        }),
    );
    for _ in 0..opts.runs() {
        let mut figures = Map::new();

        db.empty::<C>()?;
        let receiver = rate_limited(allowed);
        prefill::<C>(db, count, Kind::Hook)?;
        let worker = Worker::builder(DieselStore::new(db.worker_pool::<C>(4)?))
            .subscriptions(crate::handlers::subscribers())
            .destination(crate::handlers::RELAY, crate::handlers::Unrelayed)
            .handler_threads(opts.handler_threads)
            .destination(HOOK, endpoint(&receiver.url("/hook"))?)
            .spawn()
            .ctx("starting the worker")?;
        let started = Instant::now();
        let all = outbox_testkit::eventually_every(
            Duration::from_millis(20),
            Duration::from_secs(300),
            || accepted(&receiver.requests()) >= count,
        );
        let took = started.elapsed();
        let stats = worker
            .shutdown(Duration::from_secs(30))
            .ctx("stopping the worker")?;
        let requests = receiver.requests();
        let refused = requests.iter().filter(|r| r.answered == 429).count();
        if !all || stats.dead_lettered > 0 {
            report.problem(format!(
                "push-back: {} of {count} delivered ({stats:?})",
                accepted(&requests)
            ));
        }
        figures.insert(
            "push_back_seconds".into(),
            json!(round(took.as_secs_f64(), 2)),
        );
        figures.insert(
            "push_back_delivered_per_s".into(),
            json!(round(count as f64 / took.as_secs_f64(), 1)),
        );
        figures.insert("push_back_requests".into(), json!(requests.len()));
        figures.insert(
            "push_back_refused_pct".into(),
            json!(round(
                100.0 * refused as f64 / requests.len().max(1) as f64,
                1
            )),
        );
        figures.insert("push_back_dead_letters".into(), json!(stats.dead_lettered));
        figures.insert("push_back_attempts_spent".into(), json!(stats.retried));
        figures.insert("push_back_deferrals".into(), json!(stats.deferred));

        db.empty::<C>()?;
        let receiver = Receiver::counting();
        receiver.record_times(true);
        let backlog = (f64::from(STATIC_LIMIT) * seconds * 1.5) as usize + 100;
        prefill::<C>(db, backlog, Kind::Hook)?;
        let worker = Worker::builder(DieselStore::new(db.worker_pool::<C>(4)?))
            .subscriptions(crate::handlers::subscribers())
            .destination(crate::handlers::RELAY, crate::handlers::Unrelayed)
            .handler_threads(opts.handler_threads)
            .destination_with(
                HOOK,
                endpoint(&receiver.url("/hook"))?,
                DestinationOptions::new().rate_limit(RateLimit::per_second(STATIC_LIMIT)),
            )
            .spawn()
            .ctx("starting the worker")?;
        let started = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        let delivered = receiver.unique();
        let elapsed = started.elapsed().as_secs_f64();
        let stats = worker
            .shutdown(Duration::from_secs(30))
            .ctx("stopping the worker")?;
        let times = arrival_times(&receiver);
        figures.insert(
            "static_delivered_per_s".into(),
            json!(round(delivered as f64 / elapsed, 2)),
        );
        figures.insert(
            "static_busiest_second".into(),
            json!(busiest_second(&times)),
        );
        // A claim and a settlement each: what pacing costs the database beyond the deliveries.
        figures.insert(
            "static_claims_per_delivery".into(),
            json!(round(stats.claimed as f64 / delivered.max(1) as f64, 2)),
        );
        figures.insert("static_claims".into(), json!(stats.claimed));

        // The same limit over two worker processes: each given half (a limit of each
        // process), then one limit across processes.
        let halves = Some(RateLimit::per_second(STATIC_LIMIT / 2));
        let shared = Some(RateLimit::per_second(STATIC_LIMIT).across_processes());
        for (part, limit) in [("two_processes", halves), ("across_processes", shared)] {
            db.empty::<C>()?;
            receiver.reset();
            prefill::<C>(db, backlog, Kind::Hook)?;
            let children: Vec<ChildWorker> = (0..2)
                .map(|_| {
                    worker_process::spawn(
                        db,
                        &receiver.url("/hook"),
                        opts.handler_threads,
                        opts.claims,
                        None,
                        limit,
                        Duration::from_secs_f64(seconds + 120.0),
                    )
                })
                .collect::<Res<_>>()?;
            let started = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(seconds));
            let delivered = receiver.unique();
            let elapsed = started.elapsed().as_secs_f64();
            let mut each = Vec::new();
            let mut claimed = 0;
            for child in children {
                let result = child.stop(Duration::from_secs(60))?;
                each.push(result.succeeded);
                claimed += result.claimed;
            }
            let times = arrival_times(&receiver);
            figures.insert(
                format!("{part}_delivered_per_s"),
                json!(round(delivered as f64 / elapsed, 2)),
            );
            figures.insert(
                format!("{part}_busiest_second"),
                json!(busiest_second(&times)),
            );
            // How the deliveries split between the two.
            figures.insert(format!("{part}_each_delivered"), json!(each));
            figures.insert(
                format!("{part}_claims_per_delivery"),
                json!(round(claimed as f64 / delivered.max(1) as f64, 2)),
            );
        }
        report.run(figures);
    }
    if !opts.quick {
        let took = report.median("push_back_seconds");
        let refused = report.median("push_back_refused_pct");
        let rate = report.median("static_delivered_per_s");
        let limit = f64::from(STATIC_LIMIT);
        report.target("push-back: seconds for the backlog", took, 12.0, false);
        report.target("push-back: % of requests refused", refused, 10.0, false);
        report.target(
            "static: rate at least 90 % of the limit",
            rate,
            limit * 0.9,
            true,
        );
        report.target(
            "static: rate at most 110 % of the limit",
            rate,
            limit * 1.1,
            false,
        );
        // Half each: a limit of each process, never above the limit together; how close to it
        // they come depends on which claims the backlog (a figure, not a target: the README
        // says why). One limit across processes: the target.
        let halves = report.median("two_processes_delivered_per_s");
        report.target(
            "two processes, half each: rate at most 110 % of the limit",
            halves,
            limit * 1.1,
            false,
        );
        let shared = report.median("across_processes_delivered_per_s");
        report.target(
            "two processes, one limit across processes: rate at least 90 % of the limit",
            shared,
            limit * 0.9,
            true,
        );
        report.target(
            "two processes, one limit across processes: rate at most 110 % of the limit",
            shared,
            limit * 1.1,
            false,
        );
    }
    Ok(report.finish())
}

/// When the receiver's requests arrived, earliest first (and forgotten by the receiver).
fn arrival_times(receiver: &Receiver) -> Vec<Instant> {
    let mut times: Vec<Instant> = receiver
        .take_times()
        .into_iter()
        .map(|(_, at)| at)
        .collect();
    times.sort();
    times
}

/// Distinct messages the receiver accepted (answered 200).
fn accepted(requests: &[Request]) -> usize {
    let ids: std::collections::HashSet<&str> = requests
        .iter()
        .filter(|r| r.answered == 200)
        .filter_map(Request::webhook_id)
        .collect();
    ids.len()
}

/// Deliveries in the busiest one-second window.
fn busiest_second(sorted: &[Instant]) -> usize {
    let mut busiest = 0;
    let mut first = 0;
    for (last, at) in sorted.iter().enumerate() {
        while at.duration_since(sorted[first]) >= Duration::from_secs(1) {
            first += 1;
        }
        busiest = busiest.max(last + 1 - first);
    }
    busiest
}
