//! `fairness`: one group's few messages behind another group's flood.
//!
//! Group A's backlog of `--count` messages (default 50,000) is delivered to a receiver on
//! 127.0.0.1 by a worker at its defaults. Once a tenth of it has arrived, group B enqueues 10
//! messages in one transaction. Figure: commit → the last of B's 10 received. The control, in
//! the same run: the same backlog and 10 messages without groups, which wait for the backlog
//! in due order. Target: B's 10 all received within 1 s (the issue's "done within 1 s while A
//! drains"), with the backlog still draining.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outbox_diesel::{Batch, EnqueueOptions};
use serde_json::{json, Map};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::drain::{prefill, spawn_worker, Kind};
use crate::handlers::endpoint;
use crate::handlers::Hook;
use crate::report::Report;
use crate::stats::round;
use crate::traced_store::TraceHandle;
use crate::{Opts, Res, WithContext};
use outbox_testkit::http::Receiver;

/// How many messages the small group enqueues.
const FEW: u64 = 10;

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

/// What one round measured: seconds from the few messages' commit to the last of them
/// received, and how much of the backlog was still pending then.
struct Round {
    seconds: f64,
    backlog_left: u64,
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let backlog = opts
        .count
        .unwrap_or(if opts.quick { 5_000 } else { 50_000 });
    let mut report = Report::new(
        "fairness",
        opts,
        json!({
            "backlog": backlog,
            "few": FEW,
            "grouped": "backlog in group A, the few in group B",
            "control": "backlog and the few without groups",
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
        }),
    );
    for _ in 0..opts.runs() {
        let mut figures = Map::new();
        for grouped in [true, false] {
            let measured = round_on::<C>(opts, db, backlog, grouped, &mut report)?;
            let kind = if grouped { "grouped" } else { "control" };
            figures.insert(
                format!("{kind}_ms"),
                json!(round(measured.seconds * 1000.0, 1)),
            );
            figures.insert(format!("{kind}_backlog_left"), json!(measured.backlog_left));
        }
        report.run(figures);
    }
    let grouped = report.median("grouped_ms");
    report.target("grouped ms", grouped, 1000.0, false);
    Ok(report.finish())
}

fn round_on<C: BenchConnection>(
    opts: &Opts,
    db: &BenchDb,
    backlog: usize,
    grouped: bool,
    report: &mut Report,
) -> Res<Round> {
    db.empty::<C>()?;
    let receiver = Receiver::counting();
    let endpoint = endpoint(&receiver.url("/hook"))?;
    let kind = if grouped {
        Kind::GroupedHook("tenant-a")
    } else {
        Kind::Hook
    };
    prefill::<C>(db, backlog, kind)?;
    receiver.record_times(true);
    let worker = spawn_worker::<C>(db, opts, Some(&endpoint), &TraceHandle::default())?;
    let started = Instant::now();
    while receiver.unique() < backlog as u64 / 10 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let options = if grouped {
        EnqueueOptions::new().group("tenant-b")
    } else {
        EnqueueOptions::new()
    };
    let mut conn = db.connect::<C>()?;
    let ids = conn
        .write_tx(|c| {
            let mut batch = Batch::new();
            for n in 0..FEW {
                batch.push_with(&Hook::new(u64::MAX - n), &options)?;
            }
            batch.enqueue(c)
        })
        .ctx("enqueuing the few")?;
    let committed = Instant::now();
    let few: HashSet<u128> = ids.iter().map(|id| id.as_uuid().as_u128()).collect();
    let total = backlog as u64 + FEW;
    let all = receiver.wait_unique(total, Duration::from_secs(300));
    let stats = worker
        .shutdown(Duration::from_secs(30))
        .ctx("stopping the worker")?;
    receiver.record_times(false);
    if !all || receiver.duplicates() > 0 {
        report.problem(format!(
            "fairness: {} of {total} delivered, {} duplicates ({stats:?})",
            receiver.unique(),
            receiver.duplicates()
        ));
    }
    let mut times = receiver.take_times();
    times.sort_by_key(|(_, at)| *at);
    let last_of_few = times
        .iter()
        .rposition(|(id, _)| few.contains(id))
        .ok_or("none of the few messages arrived")?;
    let seconds = times[last_of_few]
        .1
        .checked_duration_since(committed)
        .map_or(0.0, |d| d.as_secs_f64());
    // Received before the last of the few: the backlog still pending then is the rest.
    let backlog_left = total.saturating_sub(last_of_few as u64 + 1);
    Ok(Round {
        seconds,
        backlog_left,
    })
}
