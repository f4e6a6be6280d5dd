//! `drain --metrics`: what recording the worker's metrics costs. The same no-op drain with
//! the metrics switched off and on, alternating which goes first in each run, so that warm-up
//! and drift fall on both sides; the figure is their ratio.
//!
//! One recorder is installed for the whole process (the facade allows one): Prometheus'
//! recorder behind a switch. Off, it hands out no-op handles, which is what the facade does
//! with no recorder installed at all, so "off" stands for an application without metrics.

use std::sync::atomic::{AtomicBool, Ordering};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use serde_json::{json, Map};

use crate::db::{BenchConnection, BenchDb};
use crate::drain::{backlog, noop_drain, Kind};
use crate::report::Report;
use crate::{failed, stats, Opts, Res};

/// Whether the switch forwards to Prometheus.
static RECORDING: AtomicBool = AtomicBool::new(false);

struct Switch(PrometheusRecorder);

impl Recorder for Switch {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if RECORDING.load(Ordering::Relaxed) {
            self.0.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if RECORDING.load(Ordering::Relaxed) {
            self.0.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if RECORDING.load(Ordering::Relaxed) {
            self.0.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

fn install() -> Res<PrometheusHandle> {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(Switch(recorder))
        .map_err(|e| failed(format!("installing the metrics recorder: {e}")))?;
    Ok(handle)
}

/// Runs `drain --metrics` on a fresh database.
pub fn run(opts: &Opts) -> Res<bool> {
    crate::db::on_fresh_database!(opts, metrics_drain_on)
}

fn metrics_drain_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let count = backlog(opts);
    let handle = install()?;
    let mut report = Report::new(
        "drain_metrics",
        opts,
        json!({
            "messages": count,
            "handler": "no-op",
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "recorder": "metrics-exporter-prometheus, no HTTP server",
        }),
    );
    for run in 0..opts.runs() {
        let mut rates = [0.0; 2];
        let order = if run % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for recording in order {
            RECORDING.store(recording, Ordering::Relaxed);
            let drained = noop_drain::<C>(db, opts, count, Kind::Noop, &mut report)?;
            rates[usize::from(recording)] = drained.per_s;
        }
        RECORDING.store(false, Ordering::Relaxed);
        let mut figures = Map::new();
        figures.insert("off_per_s".into(), json!(stats::round(rates[0], 0)));
        figures.insert("on_per_s".into(), json!(stats::round(rates[1], 0)));
        figures.insert(
            "ratio_on_over_off".into(),
            json!(stats::round(rates[1] / rates[0], 3)),
        );
        report.run(figures);
    }
    // The "on" drains must have recorded something, or the comparison compares nothing.
    let rendered = handle.render();
    if !rendered.contains("outbox_messages_processed_total") {
        report.problem("the recorder saw no outbox_messages_processed_total: nothing was recorded");
    }
    Ok(report.finish())
}
