//! `enqueue`: what the outbox adds to a business transaction.
//!
//! (a) a transaction of one business-row INSERT; (b) the same plus a hand-written raw SQL INSERT
//! of the same outbox row; (c) the same plus the library's `enqueue`, and (c2) with W3C trace
//! context headers (`EnqueueOptions::header`). And 100 messages per
//! transaction, as one `Batch` and as 100 single enqueues. Variants take turns in short slices
//! (a, b, c, batch, single, a, b, ...), each on freshly emptied tables, so that the machine's
//! noise falls on all of them alike; a run's rate of a variant is over all its slices.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use outbox_diesel::prelude::*;
use outbox_diesel::{Batch, EnqueueOptions, MessageId};
use serde_json::{json, Map, Value};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::handlers::Hook;
use crate::report::Report;
use crate::{cpu, failed, stats, Opts, Res};

/// A trace context as an instrumented web request carries it (the W3C spec's examples).
const SAMPLE_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const SAMPLE_TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// A business INSERT alone.
    A,
    /// Plus a hand-written outbox INSERT.
    B,
    /// Plus the library's own INSERT statement, bound by hand.
    B2,
    /// Plus `enqueue`.
    C,
    /// Plus `enqueue` with W3C trace context headers (`traceparent`, `tracestate`).
    CTraced,
    /// 100 messages as one Batch.
    Batch100,
    /// 100 single enqueues.
    Single100,
}

impl Variant {
    const ALL: [Variant; 7] = [
        Variant::A,
        Variant::B,
        Variant::B2,
        Variant::C,
        Variant::CTraced,
        Variant::Batch100,
        Variant::Single100,
    ];

    fn key(self) -> &'static str {
        match self {
            Variant::A => "a_business_only_tx_per_s",
            Variant::B => "b_plus_raw_insert_tx_per_s",
            Variant::B2 => "b2_plus_library_sql_by_hand_tx_per_s",
            Variant::C => "c_plus_enqueue_tx_per_s",
            Variant::CTraced => "c2_plus_enqueue_with_trace_headers_tx_per_s",
            Variant::Batch100 => "batch_of_100_msgs_per_s",
            Variant::Single100 => "single_x100_msgs_per_s",
        }
    }

    /// Messages (or business rows) per transaction, to turn tx/s into the figure.
    fn per_tx(self) -> u64 {
        match self {
            Variant::Batch100 | Variant::Single100 => 100,
            _ => 1,
        }
    }
}

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

fn serialize_error(e: serde_json::Error) -> diesel::result::Error {
    diesel::result::Error::SerializationError(Box::new(e))
}

/// One transaction of `variant`; `n` numbers the business row and message.
fn transaction<C: BenchConnection>(conn: &mut C, variant: Variant, n: u64) -> Res<()> {
    let member = i64::try_from(n).unwrap_or(0);
    let body = "Nice post! I especially liked the part about transactions.";
    match variant {
        Variant::A => conn.write_tx(|c| c.insert_business(member, body).map(drop))?,
        Variant::B => conn.write_tx(|c| {
            c.insert_business(member, body)?;
            let id = MessageId::new().to_string();
            let payload = serde_json::to_string(&Hook::new(n)).map_err(serialize_error)?;
            c.insert_outbox(&id, "bench.hook", &payload).map(drop)
        })?,
        Variant::B2 => conn.write_tx(|c| {
            c.insert_business(member, body)?;
            let id = MessageId::new().to_string();
            let payload = serde_json::to_string(&Hook::new(n)).map_err(serialize_error)?;
            c.insert_outbox_library_sql(&id, "bench.hook", &payload)
                .map(drop)
        })?,
        Variant::C => conn.write_tx(|c| {
            c.insert_business(member, body)?;
            Hook::new(n).enqueue(c)?;
            Ok::<_, outbox_diesel::Error>(())
        })?,
        Variant::CTraced => conn.write_tx(|c| {
            c.insert_business(member, body)?;
            let options = EnqueueOptions::new()
                .header("traceparent", SAMPLE_TRACEPARENT)
                .header("tracestate", SAMPLE_TRACESTATE);
            Hook::new(n).enqueue_with(c, &options)?;
            Ok::<_, outbox_diesel::Error>(())
        })?,
        Variant::Batch100 => conn.write_tx(|c| {
            let mut batch = Batch::new();
            for i in 0..100 {
                batch.push(&Hook::new(n * 100 + i))?;
            }
            batch.enqueue(c)?;
            Ok::<_, outbox_diesel::Error>(())
        })?,
        Variant::Single100 => conn.write_tx(|c| {
            for i in 0..100 {
                Hook::new(n * 100 + i).enqueue(c)?;
            }
            Ok::<_, outbox_diesel::Error>(())
        })?,
    }
    Ok(())
}

/// One slice of one variant.
struct Measured {
    /// Transactions (or messages) per second.
    rate: f64,
    cpu: Value,
    /// Transactions (or messages) done.
    units: u64,
    /// CPU seconds of this process and of the database server.
    client: f64,
    server: f64,
}

/// Transactions per second of `variant` from `clients` connections for `slice`.
fn measure<C: BenchConnection>(
    db: &BenchDb,
    variant: Variant,
    clients: usize,
    slice: Duration,
) -> Res<Measured> {
    db.empty::<C>()?;
    // Start together; stop together, keeping the connections (and their server processes,
    // whose CPU is counted) until the snapshot is taken.
    let start = Arc::new(Barrier::new(clients + 1));
    let stop = Arc::new(Barrier::new(clients + 1));
    let release = Arc::new(Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let db = db.clone();
            let (start, stop, release) =
                (Arc::clone(&start), Arc::clone(&stop), Arc::clone(&release));
            std::thread::spawn(move || -> Res<u64> {
                let conn = db.connect::<C>();
                start.wait();
                let result = conn.and_then(|mut conn| {
                    let until = Instant::now() + slice;
                    let mut done = 0u64;
                    let base = (client as u64) << 40;
                    while Instant::now() < until {
                        transaction(&mut conn, variant, base + done)?;
                        done += 1;
                    }
                    Ok((done, conn))
                });
                stop.wait();
                release.wait();
                result.map(|(done, _conn)| done)
            })
        })
        .collect();
    start.wait();
    let started = Instant::now();
    let before = cpu::snapshot(&[]);
    stop.wait();
    let elapsed = started.elapsed().as_secs_f64();
    let after = cpu::snapshot(&[]);
    release.wait();
    let mut total = 0;
    for thread in threads {
        total += thread
            .join()
            .map_err(|_| failed("an enqueue client panicked"))??;
    }
    let rate = (total * variant.per_tx()) as f64 / elapsed;
    let (client, server) = cpu::seconds_used(&before, &after);
    Ok(Measured {
        rate,
        cpu: cpu::used(&before, &after),
        units: total * variant.per_tx(),
        client,
        server,
    })
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let per_variant = opts.seconds.unwrap_or(if opts.quick { 0.3 } else { 3.0 });
    let rounds = if opts.quick { 1 } else { 6 };
    let slice = Duration::from_secs_f64(per_variant / rounds as f64);
    let clients = opts.clients.max(1);
    let mut report = Report::new(
        "enqueue",
        opts,
        json!({
            "seconds_per_variant_per_run": per_variant,
            "slices_per_variant_per_run": rounds,
            "clients": clients,
            "business_row": "INSERT INTO bench_business (member_id, body)",
            "message": "bench.hook, ~110-byte JSON payload",
            "order": "variants take turns in slices, each on emptied tables",
        }),
    );
    for run in 0..opts.runs() {
        let mut figures = Map::new();
        let mut sums = [0.0f64; Variant::ALL.len()];
        let mut cpu_sums = [(0u64, 0.0f64, 0.0f64); Variant::ALL.len()];
        for round in 0..rounds {
            for k in 0..Variant::ALL.len() {
                let index = (k + run + round) % Variant::ALL.len();
                let variant = Variant::ALL[index];
                let measured = measure::<C>(db, variant, clients, slice)?;
                sums[index] += measured.rate;
                let (units, client, server) = &mut cpu_sums[index];
                *units += measured.units;
                *client += measured.client;
                *server += measured.server;
                if variant == Variant::C {
                    figures.insert("c_cpu_cores".into(), measured.cpu);
                }
            }
        }
        for (variant, (units, client, server)) in Variant::ALL.iter().zip(cpu_sums) {
            let per = |seconds: f64| json!(stats::round(seconds * 1e6 / units.max(1) as f64, 1));
            let unit = if variant.per_tx() == 1 { "tx" } else { "msg" };
            let key = variant.key().trim_end_matches("_per_s");
            let key = key.rsplit_once('_').map(|(k, _)| k).unwrap_or(key);
            figures.insert(format!("{key}_client_cpu_us_per_{unit}"), per(client));
            figures.insert(format!("{key}_db_cpu_us_per_{unit}"), per(server));
        }
        let rates = sums.map(|sum| sum / rounds as f64);
        for (variant, rate) in Variant::ALL.iter().zip(rates) {
            figures.insert(variant.key().into(), json!(stats::round(rate, 1)));
        }
        let [a, b, b2, c, c_traced, batch, single] = rates;
        figures.insert("ratio_c_over_b".into(), json!(stats::round(c / b, 4)));
        figures.insert("ratio_c_over_a".into(), json!(stats::round(c / a, 4)));
        figures.insert("ratio_b_over_a".into(), json!(stats::round(b / a, 4)));
        figures.insert("ratio_c_over_b2".into(), json!(stats::round(c / b2, 4)));
        figures.insert(
            "ratio_c_traced_over_c".into(),
            json!(stats::round(c_traced / c, 4)),
        );
        figures.insert("ratio_b2_over_b".into(), json!(stats::round(b2 / b, 4)));
        figures.insert(
            "ratio_batch_over_single".into(),
            json!(stats::round(batch / single, 3)),
        );
        report.run(figures);
    }
    let c_over_b = report.median("ratio_c_over_b");
    report.target("c/b (enqueue vs raw INSERT)", c_over_b, 0.95, true);
    Ok(report.finish())
}
