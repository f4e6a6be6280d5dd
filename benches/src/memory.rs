//! `memory`: a worker process over a large backlog and a receiver that answers slowly; its
//! resident memory, sampled over time, and its peak (VmHWM).

use std::time::{Duration, Instant};

use serde_json::{json, Map};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::drain::{prefill, Kind};
use crate::report::Report;
use crate::stats::round;
use crate::{worker_process, Opts, Res};
use outbox_testkit::http::Receiver;

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let large = opts.payload_bytes.is_some_and(|bytes| bytes >= 1 << 20);
    let count = opts.count.unwrap_or(match (large, opts.quick) {
        (true, true) => 60,
        (true, false) => 400,
        (false, true) => 20_000,
        (false, false) => 1_000_000,
    });
    let seconds = opts.seconds.unwrap_or(if opts.quick { 3.0 } else { 60.0 });
    let delay = Duration::from_millis(opts.delay_ms.unwrap_or(50));
    let receiver = Receiver::counting();
    receiver.set_delay(delay);
    let mut report = Report::new(
        "memory",
        opts,
        json!({
            "backlog": count,
            "seconds_per_run": seconds,
            "receiver_delay_ms": delay.as_millis() as u64,
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "payload_bytes": opts.payload_bytes,
            "max_in_flight_bytes": opts.max_in_flight_bytes,
            "malloc_mmap_threshold": std::env::var("OUTBOX_BENCH_MMAP_THRESHOLD").ok(),
            "worker": "separate process; RSS from /proc/<pid>/status every 250 ms",
        }),
    );
    let started = Instant::now();
    let kind = opts.payload_bytes.map_or(Kind::Hook, Kind::SizedHook);
    let prefill_rate = prefill::<C>(db, count, kind)?;
    eprintln!(
        "   prefilled {count} messages in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for _ in 0..opts.runs() {
        receiver.reset();
        let child = worker_process::spawn(
            db,
            &receiver.url("/hook"),
            opts.handler_threads,
            opts.claims,
            opts.max_in_flight_bytes,
            None,
            Duration::from_secs_f64(seconds + 120.0),
        )?;
        let begun = Instant::now();
        let run_for = Duration::from_secs_f64(seconds);
        let mut samples: Vec<(f64, f64)> = Vec::new();
        while begun.elapsed() < run_for {
            std::thread::sleep(Duration::from_millis(250));
            if let Some(kb) = child.rss_kb() {
                samples.push((begun.elapsed().as_secs_f64(), kb as f64 / 1024.0));
            }
        }
        let hwm_live = child.hwm_kb().unwrap_or(0);
        let result = child.stop(Duration::from_secs(60))?;
        let peak = hwm_live.max(result.vm_hwm_kb) as f64 / 1024.0;
        // Flat: the second half of the run does not reach above the first half.
        let half = seconds / 2.0;
        let max_in = |from: f64, to: f64| {
            samples
                .iter()
                .filter(|(t, _)| *t >= from && *t < to)
                .map(|(_, mb)| *mb)
                .fold(0.0f64, f64::max)
        };
        let first = max_in(0.0, half);
        let second = max_in(half, f64::INFINITY);
        let timeline: Vec<_> = samples
            .iter()
            .step_by((samples.len() / 12).max(1))
            .map(|(t, mb)| json!([round(*t, 1), round(*mb, 1)]))
            .collect();
        let delivered = receiver.unique();
        if receiver.duplicates() > 0 {
            report.problem(format!("memory: {} duplicates", receiver.duplicates()));
        }
        let mut figures = Map::new();
        figures.insert("peak_rss_mb".into(), json!(round(peak, 1)));
        figures.insert("rss_max_first_half_mb".into(), json!(round(first, 1)));
        figures.insert("rss_max_second_half_mb".into(), json!(round(second, 1)));
        figures.insert(
            "growth_second_over_first_mb".into(),
            json!(round(second - first, 2)),
        );
        figures.insert("delivered".into(), json!(delivered));
        figures.insert(
            "delivered_per_s".into(),
            json!(round(delivered as f64 / seconds, 1)),
        );
        figures.insert(
            "receiver_bound_per_s".into(),
            json!(round(opts.handler_threads as f64 / delay.as_secs_f64(), 1)),
        );
        figures.insert("released_at_stop".into(), json!(result.released));
        figures.insert("store".into(), result.store.clone());
        figures.insert("prefill_msgs_per_s".into(), json!(round(prefill_rate, 0)));
        figures.insert("rss_timeline_s_mb".into(), json!(timeline));
        report.run(figures);
    }
    let peak = report.median("peak_rss_mb");
    let growth = report.median("growth_second_over_first_mb");
    // With large payloads the worker holds at most max_in_flight_bytes of them, and a claim
    // reads them twice over for a moment (the driver's result, then the messages), on top of
    // the process's own ~20 MB. The allocator may keep more than that resident unless large
    // buffers go to mmap (OUTBOX_BENCH_MMAP_THRESHOLD): BENCHMARKS.md shows both.
    let cap_mb = opts.max_in_flight_bytes.unwrap_or(32 << 20) as f64 / (1 << 20) as f64;
    let bound = if large { 20.0 + 2.5 * cap_mb } else { 64.0 };
    report.target("peak RSS MB", peak, bound, false);
    report.target("RSS growth over the run MB (flat)", growth, 2.0, false);
    Ok(report.finish())
}
