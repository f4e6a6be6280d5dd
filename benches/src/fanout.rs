//! `fanout`: events delivered to many subscriptions, against the same number of deliveries of
//! separate messages to one webhook destination, in the same run.
//!
//! Every delivery goes to one receiver on 127.0.0.1 (each subscription at a path of its own).
//! The baseline: `--count` messages (default 20,000; 1,000 with `--quick`) routed to one webhook
//! destination. Then for 1, 10, 100 and 1,000 subscriptions (up to 100 with `--quick`), as many
//! events as make the same number of deliveries, fanned out by the worker. Figures: deliveries
//! a second of each, and each as a ratio to the baseline; target: 100 subscriptions at ≥ 0.8 of
//! the baseline. And the enqueue: an event with an owner against an ordinary message, one a
//! transaction, alternated; target: within 5 %.

use std::time::{Duration, Instant};

use outbox_diesel::subscription::NewSubscription;
use outbox_diesel::{Batch, EnqueueOptions};
use serde_json::{json, Map};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::drain::{prefill, spawn_worker, Kind};
use crate::handlers::endpoint;
use crate::handlers::{subscription_settings, Event, Hook};
use crate::report::Report;
use crate::stats::round;
use crate::traced_store::TraceHandle;
use crate::{failed, Opts, Res, WithContext};
use outbox_testkit::http::Receiver;

/// Events enqueued in one transaction while the backlog is made.
const PREFILL_CHUNK: usize = 1_000;

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let deliveries = opts
        .count
        .unwrap_or(if opts.quick { 1_000 } else { 20_000 });
    let fan: &[usize] = if opts.quick {
        &[1, 10, 100]
    } else {
        &[1, 10, 100, 1_000]
    };
    let mut report = Report::new(
        "fanout",
        opts,
        json!({
            "deliveries": deliveries,
            "subscriptions": fan,
            "baseline": "as many messages to one webhook destination",
            "handler_threads": opts.handler_threads,
        }),
    );
    for _ in 0..opts.runs() {
        let mut figures = Map::new();
        let baseline = baseline::<C>(db, opts, deliveries)?;
        figures.insert("baseline_per_s".into(), json!(round(baseline, 0)));
        for &subscriptions in fan {
            let per_s = fanned_out::<C>(db, opts, deliveries, subscriptions, &mut report)?;
            figures.insert(
                format!("fanout_{subscriptions}_per_s"),
                json!(round(per_s, 0)),
            );
            figures.insert(
                format!("fanout_{subscriptions}_ratio"),
                json!(round(per_s / baseline, 3)),
            );
        }
        let (event, message) = enqueue_rates::<C>(db, opts)?;
        figures.insert("enqueue_event_tx_per_s".into(), json!(round(event, 0)));
        figures.insert("enqueue_message_tx_per_s".into(), json!(round(message, 0)));
        figures.insert("enqueue_ratio".into(), json!(round(event / message, 3)));
        report.run(figures);
    }
    let ratio = report.median("fanout_100_ratio");
    report.target("100 subscriptions ÷ one destination", ratio, 0.8, true);
    let enqueue = report.median("enqueue_ratio");
    report.target("event enqueue ÷ message enqueue", enqueue, 0.95, true);
    Ok(report.finish())
}

/// Deliveries a second of `count` messages to one webhook destination.
fn baseline<C: BenchConnection>(db: &BenchDb, opts: &Opts, count: usize) -> Res<f64> {
    db.empty::<C>()?;
    let receiver = Receiver::counting();
    let endpoint = endpoint(&receiver.url("/hook"))?;
    prefill::<C>(db, count, Kind::Hook)?;
    let started = Instant::now();
    let worker = spawn_worker::<C>(db, opts, Some(&endpoint), &TraceHandle::default())?;
    let all = receiver.wait_for(count, Duration::from_secs(600));
    let seconds = started.elapsed().as_secs_f64();
    worker
        .shutdown(Duration::from_secs(30))
        .ctx("stopping the worker")?;
    if !all {
        return Err(failed(format!(
            "the baseline delivered {} of {count}",
            receiver.count()
        )));
    }
    Ok(count as f64 / seconds)
}

/// Deliveries a second of events fanned out to `subscriptions` subscriptions, as many events
/// as make `deliveries` deliveries.
fn fanned_out<C: BenchConnection>(
    db: &BenchDb,
    opts: &Opts,
    deliveries: usize,
    subscriptions: usize,
    report: &mut Report,
) -> Res<f64> {
    db.empty::<C>()?;
    db.empty_subscriptions::<C>()?;
    let receiver = Receiver::counting();
    let settings = subscription_settings();
    let mut conn = db.connect::<C>()?;
    for i in 0..subscriptions {
        let new = NewSubscription::new(receiver.url(&format!("/s{i}")), ["bench.*"]).allow_http();
        settings
            .create(&mut conn, &new)
            .ctx("creating a subscription")?;
    }
    let events = deliveries.div_ceil(subscriptions);
    let mut n = 0;
    while n < events {
        let chunk = PREFILL_CHUNK.min(events - n);
        conn.write_tx(|c| {
            let mut batch = Batch::new();
            for i in n..n + chunk {
                batch.push(&Event::new(i as u64))?;
            }
            batch.enqueue(c)?;
            Ok::<_, outbox_diesel::Error>(())
        })
        .ctx("enqueuing the events")?;
        n += chunk;
    }
    let total = events * subscriptions;
    let started = Instant::now();
    let worker = spawn_worker::<C>(db, opts, None, &TraceHandle::default())?;
    let all = receiver.wait_for(total, Duration::from_secs(600));
    let seconds = started.elapsed().as_secs_f64();
    worker
        .shutdown(Duration::from_secs(30))
        .ctx("stopping the worker")?;
    if !all {
        report.problem(format!(
            "{subscriptions} subscriptions: {} of {total} deliveries arrived",
            receiver.count()
        ));
    }
    // Each subscription gets each event once: the receiver counts ids per path.
    if receiver.count() > total {
        report.problem(format!(
            "{subscriptions} subscriptions: {} deliveries for {total}",
            receiver.count()
        ));
    }
    Ok(total as f64 / seconds)
}

/// Transactions a second enqueuing one event with an owner, and one ordinary message,
/// alternated in slices.
fn enqueue_rates<C: BenchConnection>(db: &BenchDb, opts: &Opts) -> Res<(f64, f64)> {
    db.empty::<C>()?;
    let slice = Duration::from_secs_f64(if opts.quick { 0.2 } else { 2.0 });
    let mut conn = db.connect::<C>()?;
    let owned = EnqueueOptions::new().owner("tenant-42");
    let (mut events, mut messages) = ((0u64, 0f64), (0u64, 0f64));
    for round in 0..if opts.quick { 2 } else { 6 } {
        for event in [round % 2 == 0, round % 2 == 1] {
            let started = Instant::now();
            let mut done = 0u64;
            while started.elapsed() < slice {
                conn.write_tx(|c| {
                    let mut batch = Batch::new();
                    if event {
                        batch.push_with(&Event::new(done), &owned)?;
                    } else {
                        batch.push(&Hook::new(done))?;
                    }
                    batch.enqueue(c)?;
                    Ok::<_, outbox_diesel::Error>(())
                })
                .ctx("enqueuing")?;
                done += 1;
            }
            let seconds = started.elapsed().as_secs_f64();
            let tally = if event { &mut events } else { &mut messages };
            tally.0 += done;
            tally.1 += seconds;
        }
        db.empty::<C>()?;
    }
    Ok((events.0 as f64 / events.1, messages.0 as f64 / messages.1))
}
