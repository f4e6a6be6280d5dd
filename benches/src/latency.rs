//! `latency`: enqueue at a steady rate while the worker runs; commit → received percentiles.
//!
//! The enqueuer records the instant each transaction's commit returned, the receiver the
//! instant each delivery arrived (same process, same clock). Baselines in the same run: the
//! HTTP round trip alone (the library's client, one request at a time) and the commit itself.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_diesel::prelude::*;
use outbox_diesel::{DieselStore, Worker};
use serde_json::{json, Map, Value};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::drain::wait_for;
use crate::handlers::endpoint;
use crate::handlers::{envelope, Hook};
use crate::report::Report;
use crate::stats::{percentile, round};
use crate::traced_store::{TraceHandle, TracedStore};
use crate::{cpu, Backend, Opts, Res, WithContext};
use outbox_testkit::http::Receiver;

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// p50, p95, p99 and max of durations in milliseconds.
fn percentiles(mut values: Vec<f64>) -> Value {
    values.sort_by(f64::total_cmp);
    json!({
        "p50": round(percentile(&values, 50.0), 3),
        "p95": round(percentile(&values, 95.0), 3),
        "p99": round(percentile(&values, 99.0), 3),
        "max": round(values.last().copied().unwrap_or(0.0), 3),
    })
}

/// The length of the intervals a run reports, in seconds: a minute, or ten seconds for runs
/// shorter than four minutes.
fn interval_s(seconds: f64) -> f64 {
    if seconds >= 240.0 {
        60.0
    } else {
        10.0
    }
}

/// `VACUUM` of the outbox table on a schedule, from a session of its own, until dropped;
/// throttled as autovacuum is by default (a manual `VACUUM` is not: unthrottled over a million
/// tuples a held transaction keeps, it took the 2-core machine for most of each minute and the
/// worker fell 55,000 messages behind).
struct Vacuums {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Vacuums {
    fn start<C: BenchConnection>(db: &BenchDb, every: f64) -> Res<Vacuums> {
        let mut conn = db.connect::<C>()?;
        // autovacuum_vacuum_cost_delay and vacuum_cost_limit at their defaults.
        conn.exec("SET vacuum_cost_delay = '2ms'")?;
        conn.exec("SET vacuum_cost_limit = 200")?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut runs = 0;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(Duration::from_secs_f64(every))
            {
                if conn.exec("VACUUM outbox_message").is_ok() {
                    runs += 1;
                }
            }
            runs
        });
        Ok(Vacuums {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops them; how many ran.
    fn stop(mut self) -> u64 {
        drop(self.stop.take());
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or(0)
    }
}

/// A transaction another session holds open, until dropped or its time is up.
struct HeldTransaction {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HeldTransaction {
    fn open<C: BenchConnection>(db: &BenchDb, seconds: f64) -> Res<HeldTransaction> {
        let mut conn = db.connect::<C>()?;
        let begin: &[&str] = match db.backend {
            Backend::Postgres => &[
                "BEGIN ISOLATION LEVEL REPEATABLE READ",
                "SELECT txid_current() AS n",
            ],
            Backend::Mysql => &[
                "START TRANSACTION WITH CONSISTENT SNAPSHOT",
                "SELECT COUNT(*) AS n FROM outbox_message",
            ],
            Backend::Sqlite => &["BEGIN", "SELECT COUNT(*) AS n FROM outbox_message"],
        };
        conn.exec(begin[0]).ctx("opening the held transaction")?;
        conn.count(begin[1])
            .ctx("reading in the held transaction")?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _ = stopped.recv_timeout(Duration::from_secs_f64(seconds));
            let _ = conn.exec("ROLLBACK");
        });
        Ok(HeldTransaction {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for HeldTransaction {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every [`interval_s`] from `started` for `seconds`: the claims' time per message claimed in
/// the interval, and what piles up behind the held transaction (PostgreSQL: dead tuples in the
/// outbox table; MySQL: the history list; SQLite: the WAL's size in pages).
fn sample_intervals<C: BenchConnection>(
    db: &BenchDb,
    trace: &TraceHandle,
    started: Instant,
    seconds: f64,
) -> std::thread::JoinHandle<Vec<Value>> {
    let (trace, backend) = (trace.clone(), db.backend);
    let wal = format!("{}-wal", db.url.trim_start_matches("sqlite://"));
    let conn = db.connect::<C>();
    std::thread::spawn(move || {
        let Ok(mut conn) = conn else {
            return Vec::new();
        };
        let piled_up = match backend {
            Backend::Postgres => {
                "SELECT COALESCE(SUM(n_dead_tup), 0)::BIGINT AS n FROM pg_stat_user_tables                  WHERE relname = 'outbox_message'"
            }
            Backend::Mysql => {
                "SELECT CAST(COUNT AS SIGNED) AS n FROM information_schema.INNODB_METRICS                  WHERE NAME = 'trx_rseg_history_len'"
            }
            // The WAL's size in bytes, read from the file: no query may checkpoint it.
            Backend::Sqlite => "",
        };
        let mut samples = Vec::new();
        let mut before = trace.totals();
        let every = interval_s(seconds);
        let intervals = (seconds / every).ceil() as u32;
        for i in 1..=intervals {
            let at = started + Duration::from_secs_f64(every * f64::from(i));
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let now = trace.totals();
            let (claims, claimed, claim_time) = (
                now.0 - before.0,
                now.1 - before.1,
                now.2.saturating_sub(before.2),
            );
            before = now;
            samples.push(json!({
                "interval_end_s": every * f64::from(i),
                "pending": conn.count("SELECT COUNT(*) AS n FROM outbox_message").unwrap_or(-1),
                "claims": claims,
                "claimed": claimed,
                "claim_us_per_message":
                    round(claim_time.as_secs_f64() * 1e6 / claimed.max(1) as f64, 1),
                "claim_ms_mean": round(claim_time.as_secs_f64() * 1e3 / claims.max(1) as f64, 3),
                "piled_up": if backend == Backend::Sqlite {
                    std::fs::metadata(&wal).map_or(-1, |m| m.len() as i64)
                } else {
                    conn.count(piled_up).unwrap_or(-1)
                },
            }));
        }
        samples
    })
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let rate = opts
        .rate
        .unwrap_or(if opts.quick { 200.0 } else { 1_000.0 });
    let seconds = opts.seconds.unwrap_or(if opts.quick { 2.0 } else { 20.0 });
    let total = (rate * seconds).round().max(1.0) as usize;
    let enqueuers = if opts.clients > 1 { opts.clients } else { 4 };
    let receiver = Receiver::counting();
    let endpoint = endpoint(&receiver.url("/hook"))?;
    let mut report = Report::new(
        "latency",
        opts,
        json!({
            "rate_per_s": rate,
            "seconds": seconds,
            "messages": total,
            "transaction": "business INSERT + enqueue",
            "enqueuing_connections": enqueuers,
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "worker": "in the enqueuing process (default wake-ups)",
        }),
    );
    for _ in 0..opts.runs() {
        db.empty::<C>()?;
        receiver.reset();
        // Baseline: the HTTP round trip alone, one request at a time.
        let mut http = Vec::new();
        for n in 0..500u64.min(total as u64 * 2) {
            let id = outbox_diesel::MessageId::new().to_string();
            let body = envelope(&id, "bench.hook", &Hook::new(n));
            let started = Instant::now();
            endpoint
                .post(&id, &body)
                .and_then(|r| r.error_for_status())
                .ctx("posting the HTTP baseline")?;
            http.push(ms(started.elapsed()));
        }
        receiver.reset();
        receiver.record_times(true);

        let vacuums = match opts.vacuum_every {
            Some(every) if db.backend == Backend::Postgres => Some(Vacuums::start::<C>(db, every)?),
            _ => None,
        };
        let holder = match opts.hold_transaction {
            Some(seconds) => Some(HeldTransaction::open::<C>(db, seconds)?),
            None => None,
        };
        let pool = db.worker_pool::<C>(4)?;
        let trace = TraceHandle::default();
        let builder = Worker::builder(TracedStore::new(DieselStore::new(pool), trace.clone()))
            .subscriptions(crate::handlers::subscribers())
            .destination(crate::handlers::RELAY, crate::handlers::Unrelayed)
            .handler_threads(opts.handler_threads);
        let worker = opts
            .claims
            .apply(builder)
            .destination(crate::handlers::HOOK, endpoint.clone())
            .spawn()
            .ctx("starting the worker")?;
        std::thread::sleep(Duration::from_millis(500));

        // Enqueuers share the schedule (message n is due at n / rate), so that one slow commit
        // does not delay the next ones.
        let interval = Duration::from_secs_f64(1.0 / rate);
        let conns = (0..enqueuers)
            .map(|_| db.connect::<C>())
            .collect::<Res<Vec<C>>>()?;
        let cpu_before = cpu::snapshot(&[]);
        let started = Instant::now();
        let threads: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(k, mut conn)| {
                std::thread::spawn(move || -> Res<Vec<(u128, Instant, f64)>> {
                    let mut done = Vec::with_capacity(total / enqueuers + 1);
                    for n in (k..total).step_by(enqueuers) {
                        let due = started + interval.mul_f64(n as f64);
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                        let began = Instant::now();
                        let id = conn
                            .write_tx(|c| {
                                c.insert_business(n as i64, "Nice post!")?;
                                let id = Hook::new(n as u64).enqueue(c)?;
                                Ok::<_, outbox_diesel::Error>(id)
                            })
                            .ctx("enqueuing")?;
                        let committed = Instant::now();
                        done.push((id.as_uuid().as_u128(), committed, ms(committed - began)));
                    }
                    Ok(done)
                })
            })
            .collect();
        let samples = sample_intervals::<C>(db, &trace, started, seconds);
        let mut commits: HashMap<u128, Instant> = HashMap::with_capacity(total);
        let mut commit_ms = Vec::with_capacity(total);
        for thread in threads {
            let done = thread
                .join()
                .map_err(|_| crate::failed("an enqueuer panicked"))??;
            for (id, committed, took) in done {
                commits.insert(id, committed);
                commit_ms.push(took);
            }
        }
        let achieved = total as f64 / started.elapsed().as_secs_f64();
        let all = receiver.wait_unique(total as u64, Duration::from_secs(30));
        let cpu_after = cpu::snapshot(&[]);
        let settled = wait_for(Duration::from_secs(10), || {
            worker.stats().succeeded >= total as u64
        });
        let store = trace.summary(total as u64);
        let stats = worker
            .shutdown(Duration::from_secs(30))
            .ctx("stopping the worker")?;
        receiver.record_times(false);
        if !all || !settled || receiver.duplicates() > 0 {
            report.problem(format!(
                "latency: {} of {total} delivered, {} duplicates ({stats:?})",
                receiver.unique(),
                receiver.duplicates()
            ));
        }

        let mut latencies = Vec::with_capacity(total);
        let mut by_interval: Vec<Vec<f64>> = Vec::new();
        let mut before_commit_returned = 0u64;
        for (id, at) in receiver.take_times() {
            if let Some(committed) = commits.get(&id) {
                let latency = match at.checked_duration_since(*committed) {
                    Some(d) => ms(d),
                    None => {
                        // Delivered before our client saw the commit's answer.
                        before_commit_returned += 1;
                        0.0
                    }
                };
                latencies.push(latency);
                let interval = (committed.saturating_duration_since(started).as_secs_f64()
                    / interval_s(seconds)) as usize;
                if by_interval.len() <= interval {
                    by_interval.resize(interval + 1, Vec::new());
                }
                by_interval[interval].push(latency);
            }
        }
        let lat = percentiles(latencies);
        let mut figures = Map::new();
        for key in ["p50", "p95", "p99", "max"] {
            figures.insert(format!("latency_{key}_ms"), lat[key].clone());
        }
        let http_p = percentiles(http);
        let commit_p = percentiles(commit_ms);
        figures.insert("http_round_trip_p50_ms".into(), http_p["p50"].clone());
        figures.insert("http_round_trip_p99_ms".into(), http_p["p99"].clone());
        figures.insert("commit_p50_ms".into(), commit_p["p50"].clone());
        figures.insert("commit_p99_ms".into(), commit_p["p99"].clone());
        let p50 = lat["p50"].as_f64().unwrap_or(0.0);
        let http50 = http_p["p50"].as_f64().unwrap_or(0.0);
        figures.insert(
            "ratio_p50_over_http_p50".into(),
            json!(round(p50 / http50.max(1e-6), 2)),
        );
        figures.insert("achieved_rate_per_s".into(), json!(round(achieved, 1)));
        figures.insert(
            "delivered_before_commit_returned".into(),
            json!(before_commit_returned),
        );
        figures.insert("cpu".into(), cpu::used(&cpu_before, &cpu_after));
        figures.insert("store".into(), store);
        {
            let samples = samples
                .join()
                .map_err(|_| crate::failed("the sampler panicked"))?;
            let intervals: Vec<Value> = samples
                .into_iter()
                .zip(by_interval.into_iter().chain(std::iter::repeat(Vec::new())))
                .map(|(mut sample, latencies)| {
                    let lat = percentiles(latencies);
                    sample["latency_p50_ms"] = lat["p50"].clone();
                    sample["latency_p99_ms"] = lat["p99"].clone();
                    sample
                })
                .collect();
            figures.insert("held_transaction_s".into(), json!(opts.hold_transaction));
            figures.insert("vacuum_every_s".into(), json!(opts.vacuum_every));
            figures.insert("intervals".into(), json!(intervals));
        }
        drop(holder);
        if let Some(vacuums) = vacuums {
            figures.insert("vacuums".into(), json!(vacuums.stop()));
        }
        report.run(figures);
    }
    if db.backend == Backend::Postgres {
        let p50 = report.median("latency_p50_ms");
        let p99 = report.median("latency_p99_ms");
        report.target("p50 ms", p50, 3.0, false);
        report.target("p99 ms", p99, 30.0, false);
    }
    Ok(report.finish())
}
