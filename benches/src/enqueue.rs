//! `enqueue`: what the outbox adds to a business transaction.
//!
//! (a) a transaction of one business-row INSERT; (b) the same plus a hand-written raw SQL INSERT
//! of the same outbox row; (c) the same plus the library's `enqueue`. And 100 messages per
//! transaction, as one `Batch` and as 100 single enqueues. Variants run in slices, in a rotated
//! order per run, each on a freshly emptied table.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use outbox_diesel::prelude::*;
use outbox_diesel::{Batch, MessageId};
use serde_json::{json, Map, Value};

use crate::db::{with_connection, BenchConnection, BenchDb};
use crate::handlers::Hook;
use crate::report::Report;
use crate::{cpu, failed, stats, Opts, Res};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// A business INSERT alone.
    A,
    /// Plus a hand-written outbox INSERT.
    B,
    /// Plus `enqueue`.
    C,
    /// 100 messages as one Batch.
    Batch100,
    /// 100 single enqueues.
    Single100,
}

impl Variant {
    const ALL: [Variant; 5] = [
        Variant::A,
        Variant::B,
        Variant::C,
        Variant::Batch100,
        Variant::Single100,
    ];

    fn key(self) -> &'static str {
        match self {
            Variant::A => "a_business_only_tx_per_s",
            Variant::B => "b_plus_raw_insert_tx_per_s",
            Variant::C => "c_plus_enqueue_tx_per_s",
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
    let db = BenchDb::recreate(opts.backend)?;
    let result = with_connection!(opts.backend, C => run_on::<C>(opts, &db));
    if !opts.keep {
        db.drop_database()?;
    }
    result
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
        Variant::C => conn.write_tx(|c| {
            c.insert_business(member, body)?;
            Hook::new(n).enqueue(c)?;
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

/// Transactions per second of `variant` from `clients` connections for `slice`.
fn measure<C: BenchConnection>(
    db: &BenchDb,
    variant: Variant,
    clients: usize,
    slice: Duration,
) -> Res<(f64, Value)> {
    db.empty::<C>()?;
    let barrier = Arc::new(Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let db = db.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || -> Res<u64> {
                let conn = db.connect::<C>();
                barrier.wait();
                let mut conn = conn?;
                let until = Instant::now() + slice;
                let mut done = 0u64;
                let base = (client as u64) << 40;
                while Instant::now() < until {
                    transaction(&mut conn, variant, base + done)?;
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let before = cpu::snapshot(&[]);
    let mut total = 0;
    for thread in threads {
        total += thread
            .join()
            .map_err(|_| failed("an enqueue client panicked"))??;
    }
    let after = cpu::snapshot(&[]);
    let rate = (total * variant.per_tx()) as f64 / started.elapsed().as_secs_f64();
    Ok((rate, cpu::used(&before, &after)))
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let slice = Duration::from_secs_f64(opts.seconds.unwrap_or(if opts.quick { 0.3 } else { 3.0 }));
    let clients = opts.clients.max(1);
    let mut report = Report::new(
        "enqueue",
        opts,
        json!({
            "slice_seconds": slice.as_secs_f64(),
            "clients": clients,
            "business_row": "INSERT INTO bench_business (member_id, body)",
            "message": "bench.hook, ~110-byte JSON payload",
            "order": "variants rotated per run, each on emptied tables",
        }),
    );
    for run in 0..opts.runs() {
        let mut figures = Map::new();
        let mut rates = [0.0f64; 5];
        for k in 0..Variant::ALL.len() {
            let index = (k + run) % Variant::ALL.len();
            let variant = Variant::ALL[index];
            let (rate, cpu_used) = measure::<C>(db, variant, clients, slice)?;
            rates[index] = rate;
            if variant == Variant::C {
                figures.insert("c_cpu_cores".into(), cpu_used);
            }
        }
        for (variant, rate) in Variant::ALL.iter().zip(rates) {
            figures.insert(variant.key().into(), json!(stats::round(rate, 1)));
        }
        let [a, b, c, batch, single] = rates;
        figures.insert("ratio_c_over_b".into(), json!(stats::round(c / b, 4)));
        figures.insert("ratio_c_over_a".into(), json!(stats::round(c / a, 4)));
        figures.insert("ratio_b_over_a".into(), json!(stats::round(b / a, 4)));
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
