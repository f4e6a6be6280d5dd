//! `priority`: a raised message under an ordinary backlog.
//!
//! A backlog of `--count` ordinary messages (default 100,000) is delivered to a receiver on
//! 127.0.0.1 by a worker at its defaults. While it drains, probes are enqueued at `--rate`
//! (default 50/s), alternately `Priority::High` and `Normal`, each in a transaction of its own,
//! until four fifths of the backlog has arrived. Figures: commit → received percentiles of each
//! kind of probe (the `Normal` ones are the control: they wait behind the backlog), and the
//! backlog still pending when the last probe was enqueued. Target: the high probes' p99 ≤ 50 ms.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_diesel::prelude::*;
use outbox_diesel::{EnqueueOptions, Priority};
use serde_json::{json, Map, Value};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::drain::{prefill, spawn_worker, Kind};
use crate::handlers::endpoint;
use crate::handlers::Hook;
use crate::report::Report;
use crate::stats::{percentile, round};
use crate::traced_store::TraceHandle;
use crate::{Opts, Res, WithContext};
use outbox_testkit::http::Receiver;

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

/// `{kind}_count`, `{kind}_p50_ms`, `{kind}_p99_ms` and `{kind}_max_ms` of some latencies.
fn insert_percentiles(figures: &mut Map<String, Value>, kind: &str, mut values: Vec<f64>) {
    values.sort_by(f64::total_cmp);
    figures.insert(format!("{kind}_count"), json!(values.len()));
    for (name, p) in [("p50", 50.0), ("p99", 99.0), ("max", 100.0)] {
        figures.insert(
            format!("{kind}_{name}_ms"),
            json!(round(percentile(&values, p), 2)),
        );
    }
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let backlog = opts
        .count
        .unwrap_or(if opts.quick { 5_000 } else { 100_000 });
    let rate = opts.rate.unwrap_or(50.0).max(1.0);
    let mut report = Report::new(
        "priority",
        opts,
        json!({
            "backlog": backlog,
            "probes_per_s": rate,
            "probes": "alternately Priority::High and Normal, one transaction each",
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
        }),
    );
    for _ in 0..opts.runs() {
        db.empty::<C>()?;
        let receiver = Receiver::counting();
        let endpoint = endpoint(&receiver.url("/hook"))?;
        prefill::<C>(db, backlog, Kind::Hook)?;
        receiver.record_times(true);
        let worker = spawn_worker::<C>(db, opts, Some(&endpoint), &TraceHandle::default())?;

        let mut conn = db.connect::<C>()?;
        let interval = Duration::from_secs_f64(1.0 / rate);
        let started = Instant::now();
        let mut probes: HashMap<u128, (Priority, Instant)> = HashMap::new();
        let mut n = 0u64;
        while receiver.unique() < (backlog as u64) * 4 / 5 {
            let due = started + interval.mul_f64(n as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let priority = if n.is_multiple_of(2) {
                Priority::High
            } else {
                Priority::Normal
            };
            let options = EnqueueOptions::new().priority(priority);
            let id = conn
                .write_tx(|c| Hook::new(u64::MAX - n).enqueue_with(c, &options))
                .ctx("enqueuing a probe")?;
            probes.insert(id.as_uuid().as_u128(), (priority, Instant::now()));
            n += 1;
            if started.elapsed() > Duration::from_secs(600) {
                break;
            }
        }
        let left = (backlog as u64).saturating_sub(receiver.unique());
        let seconds_probed = started.elapsed().as_secs_f64();
        let total = backlog as u64 + n;
        let all = receiver.wait_unique(total, Duration::from_secs(120));
        let stats = worker
            .shutdown(Duration::from_secs(30))
            .ctx("stopping the worker")?;
        receiver.record_times(false);
        if !all || receiver.duplicates() > 0 {
            report.problem(format!(
                "priority: {} of {total} delivered, {} duplicates ({stats:?})",
                receiver.unique(),
                receiver.duplicates()
            ));
        }
        let (mut high, mut normal) = (Vec::new(), Vec::new());
        for (id, at) in receiver.take_times() {
            if let Some((priority, committed)) = probes.get(&id) {
                let latency = at
                    .checked_duration_since(*committed)
                    .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
                match priority {
                    Priority::Normal => normal.push(latency),
                    _ => high.push(latency),
                }
            }
        }
        let mut figures = Map::new();
        insert_percentiles(&mut figures, "high", high);
        insert_percentiles(&mut figures, "normal", normal);
        figures.insert("backlog_left_at_last_probe".into(), json!(left));
        figures.insert("seconds_probed".into(), json!(round(seconds_probed, 2)));
        report.run(figures);
    }
    let p99 = report.median("high_p99_ms");
    report.target("high p99 ms", p99, 50.0, false);
    Ok(report.finish())
}
