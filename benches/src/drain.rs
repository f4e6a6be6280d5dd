//! `drain` and `scale`: how fast the worker empties a prefilled backlog into the receiver,
//! against baselines measured in the same run.
//!
//! Baselines: (i) HTTP capacity: the library's own webhook client POSTing the same signed
//! envelopes from as many threads as the worker has handler threads, keep-alive, no database
//! (and, below it, the receiver's capacity with a minimal client); (ii) the worker with a no-op
//! handler (no HTTP), and the library's claim + settle SQL in a plain loop; (iii) a
//! one-at-a-time loop: select one, POST, delete.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::pg::PgConnection;
use diesel::sql_types::BigInt;
use diesel::{QueryableByName, RunQueryDsl};
use outbox_diesel::delivery_log::DeliveryLog;
use outbox_diesel::store::{ClaimLimit, ClaimToken, Outcome, Settlement, Store};
use outbox_diesel::webhook::WebhookEndpoint;
use outbox_diesel::{Batch, DieselStore, MessageId, Worker, WorkerHandle};
use outbox_testkit::http::Receiver;
use serde_json::{json, Map, Value};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::handlers::{endpoint, envelope, envelope_raw, Hook, Noop, Relayed};
use crate::raw_client::raw_capacity;
use crate::report::Report;
use crate::traced_store::{TraceHandle, TracedStore};
use crate::worker_process::{self, ChildWorker};
use crate::{cpu, failed, stats, Backend, Opts, Res, WithContext};

/// Messages per prefill transaction.
const PREFILL_CHUNK: usize = 5_000;

/// Which message the backlog holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Delivered to the receiver.
    Hook,
    /// Delivered to the receiver, with a payload of about this many bytes.
    SizedHook(usize),
    /// Processed by doing nothing.
    Noop,
    /// Processed by doing nothing, message `n` under ordering key `n % keys`.
    KeyedNoop(usize),
    /// Published to a broker.
    Relay,
    /// Delivered to the receiver, every message in this group.
    GroupedHook(&'static str),
}

/// Enqueues `count` messages in transactions of `Batch`es; returns messages per second.
pub fn prefill<C: BenchConnection>(db: &BenchDb, count: usize, kind: Kind) -> Res<f64> {
    let mut conn = db.connect::<C>()?;
    let started = Instant::now();
    let mut n = 0u64;
    while (n as usize) < count {
        let per_chunk = match kind {
            // Large payloads in transactions of about 64 MiB.
            Kind::SizedHook(bytes) => (64 << 20) / bytes.max(1),
            _ => PREFILL_CHUNK,
        };
        let chunk = per_chunk.clamp(1, PREFILL_CHUNK).min(count - n as usize);
        conn.write_tx(|c| {
            let mut batch = Batch::new();
            for i in 0..chunk as u64 {
                match kind {
                    Kind::Hook => batch.push(&Hook::new(n + i))?,
                    Kind::SizedHook(bytes) => batch.push_with(
                        &Hook::sized(n + i, bytes),
                        &outbox_diesel::EnqueueOptions::new().max_payload_bytes(bytes + 1024),
                    )?,
                    Kind::GroupedHook(group) => batch.push_with(
                        &Hook::new(n + i),
                        &outbox_diesel::EnqueueOptions::new().group(group),
                    )?,
                    Kind::Noop => batch.push(&Noop::new(n + i))?,
                    Kind::Relay => batch.push(&Relayed::new(n + i))?,
                    Kind::KeyedNoop(keys) => batch.push_with(
                        &Noop::new(n + i),
                        &outbox_diesel::EnqueueOptions::new()
                            .ordering_key(format!("key-{}", (n + i) % keys.max(1) as u64)),
                    )?,
                };
            }
            batch.enqueue(c)?;
            Ok::<_, outbox_diesel::Error>(())
        })
        .ctx("prefilling the outbox")?;
        n += chunk as u64;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// (i) POSTs `total` signed envelopes from `threads` threads through one endpoint (the
/// library's HTTP client, shared and keep-alive, as the worker's handler threads use it).
pub fn http_capacity(endpoint: &WebhookEndpoint, threads: usize, total: u64) -> Res<f64> {
    let threads = threads.max(1);
    let per_thread = total / threads as u64;
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let endpoint = endpoint.clone();
            std::thread::spawn(move || -> Res<()> {
                for i in 0..per_thread {
                    let id = MessageId::new().to_string();
                    let body = envelope(&id, "bench.hook", &Hook::new(t as u64 * per_thread + i));
                    endpoint
                        .post(&id, &body)
                        .and_then(|response| response.error_for_status())
                        .ctx("posting to the receiver")?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| failed("an HTTP client thread panicked"))??;
    }
    Ok((per_thread * threads as u64) as f64 / started.elapsed().as_secs_f64())
}

/// Counters of the PostgreSQL database: transactions, buffer accesses, the claim's scans of its
/// index, and the outbox table's row updates, with those made HOT (in place on their page, no
/// new index entry).
#[derive(QueryableByName, Debug, Clone, Copy, Default)]
pub struct PgCounters {
    #[diesel(sql_type = BigInt)]
    xact_commit: i64,
    #[diesel(sql_type = BigInt)]
    blocks: i64,
    #[diesel(sql_type = BigInt)]
    claim_scans: i64,
    #[diesel(sql_type = BigInt)]
    due_index_entries_read: i64,
    #[diesel(sql_type = BigInt)]
    updates: i64,
    #[diesel(sql_type = BigInt)]
    hot_updates: i64,
}

/// The PostgreSQL counters now (zeros on other backends). Read after the worker's
/// connections closed: backends report their counters when they end.
pub fn pg_counters(db: &BenchDb) -> Res<PgCounters> {
    if db.backend != Backend::Postgres {
        return Ok(PgCounters::default());
    }
    let mut conn = db.connect::<PgConnection>()?;
    let rows: Vec<PgCounters> = diesel::sql_query(
        "SELECT d.xact_commit::bigint AS xact_commit, \
             (d.blks_hit + d.blks_read)::bigint AS blocks, \
             COALESCE((SELECT idx_scan FROM pg_stat_user_indexes \
                 WHERE indexrelname = 'outbox_message_due'), 0)::bigint AS claim_scans, \
             COALESCE((SELECT idx_tup_read FROM pg_stat_user_indexes \
                 WHERE indexrelname = 'outbox_message_due'), 0)::bigint AS due_index_entries_read, \
             COALESCE((SELECT n_tup_upd FROM pg_stat_user_tables \
                 WHERE relname = 'outbox_message'), 0)::bigint AS updates, \
             COALESCE((SELECT n_tup_hot_upd FROM pg_stat_user_tables \
                 WHERE relname = 'outbox_message'), 0)::bigint AS hot_updates \
         FROM pg_stat_database d WHERE d.datname = current_database()",
    )
    .load(&mut conn)
    .ctx("reading pg_stat_database")?;
    rows.first()
        .copied()
        .ok_or_else(|| failed("pg_stat_database has no row for outbox_bench"))
}

/// What each PostgreSQL backend of the benchmark's database works for, by its last statement:
/// the claimer's connection, the acker's, the LISTEN connection and the rest (the worker's
/// chores, the benchmark's own). Read while the worker runs. Empty on the other backends.
pub(crate) fn pg_backend_roles(db: &BenchDb) -> Res<HashMap<u32, &'static str>> {
    #[derive(QueryableByName)]
    struct ActiveBackend {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
        #[diesel(sql_type = diesel::sql_types::Text)]
        query: String,
    }
    if db.backend != Backend::Postgres {
        return Ok(HashMap::new());
    }
    let mut conn = db.connect::<PgConnection>()?;
    let backends: Vec<ActiveBackend> = diesel::sql_query(
        "SELECT pid, left(query, 40) AS query FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .load(&mut conn)
    .ctx("reading pg_stat_activity")?;
    Ok(backends
        .into_iter()
        .filter_map(|b| {
            let role = if b.query.starts_with("WITH prioritized") {
                "claim"
            } else if b.query.starts_with("WITH done") {
                "settle"
            } else if b.query.starts_with("LISTEN") {
                "listen"
            } else {
                "other_connections"
            };
            Some((u32::try_from(b.pid).ok()?, role))
        })
        .collect())
}

/// Per-message database work between two counter readings.
fn pg_work(before: &PgCounters, after: &PgCounters, messages: u64) -> Value {
    let per = |a: i64, b: i64| stats::round((b - a) as f64 / messages.max(1) as f64, 3);
    let claims = after.claim_scans - before.claim_scans;
    let updates = after.updates - before.updates;
    let hot_share = (updates > 0).then(|| {
        stats::round(
            (after.hot_updates - before.hot_updates) as f64 / updates as f64,
            3,
        )
    });
    json!({
        "transactions_per_msg": per(before.xact_commit, after.xact_commit),
        "claims": claims,
        "msgs_per_claim": stats::round(messages as f64 / claims.max(1) as f64, 2),
        "buffer_accesses_per_msg": per(before.blocks, after.blocks),
        "due_index_entries_read_per_msg":
            per(before.due_index_entries_read, after.due_index_entries_read),
        "updates_per_msg": per(before.updates, after.updates),
        "hot_update_share": hot_share,
    })
}

/// Waits for `done()` or until `timeout`, checking every 2 ms (the drain's end is measured by
/// it); returns whether it held.
pub fn wait_for(timeout: Duration, done: impl FnMut() -> bool) -> bool {
    outbox_testkit::eventually_every(Duration::from_millis(2), timeout, done)
}

/// How long a backlog of `count` may take at the very slowest.
pub fn drain_timeout(count: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(5 * count as u64)
}

/// Starts the library's worker in this process.
pub fn spawn_worker<C: BenchConnection>(
    db: &BenchDb,
    opts: &Opts,
    endpoint: Option<&WebhookEndpoint>,
    trace: &TraceHandle,
) -> Res<WorkerHandle> {
    let pool = db.worker_pool::<C>(4)?;
    let mut store = DieselStore::new(pool).delivery_log(opts.log_mode);
    if opts.archive {
        store = store.archive(Duration::from_secs(3600));
    }
    let store = TracedStore::new(store, trace.clone());
    let mut builder = opts.claims.apply(
        Worker::builder(store)
            .subscriptions(crate::handlers::subscribers())
            .destination(crate::handlers::RELAY, crate::handlers::Unrelayed)
            .handler_threads(opts.handler_threads),
    );
    if let Some(endpoint) = endpoint {
        builder = builder.destination(crate::handlers::HOOK, endpoint.clone());
    }
    builder.spawn().ctx("starting the worker")
}

/// What one timed drain found.
pub(crate) struct Drained {
    pub per_s: f64,
    seconds: f64,
    cpu: Value,
    /// CPU per message by phase, of this process and of the database server.
    phases: Value,
    pg: Value,
    store: Value,
}

/// (ii) The worker with a no-op handler drains `count` messages of `kind`: no HTTP.
pub(crate) fn noop_drain<C: BenchConnection>(
    db: &BenchDb,
    opts: &Opts,
    count: usize,
    kind: Kind,
    report: &mut Report,
) -> Res<Drained> {
    noop_drain_prepared::<C>(db, opts, count, kind, report, || Ok(()))
}

/// [`noop_drain`], with `prepare` run (untimed) between the fill and the drain.
pub(crate) fn noop_drain_prepared<C: BenchConnection>(
    db: &BenchDb,
    opts: &Opts,
    count: usize,
    kind: Kind,
    report: &mut Report,
    prepare: impl FnOnce() -> Res<()>,
) -> Res<Drained> {
    db.empty::<C>()?;
    prefill::<C>(db, count, kind)?;
    prepare()?;
    let trace = TraceHandle::default();
    let pg_before = pg_counters(db)?;
    let started = Instant::now();
    let cpu_before = cpu::snapshot(&[]);
    trace.reset();
    let worker = spawn_worker::<C>(db, opts, None, &trace)?;
    let done = wait_for(drain_timeout(count), || {
        worker.stats().succeeded >= count as u64
    });
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = cpu::snapshot(&[]);
    let roles = pg_backend_roles(db)?;
    let claims = trace.summary(count as u64);
    let worker_stats = worker
        .shutdown(Duration::from_secs(30))
        .ctx("stopping the no-op worker")?;
    if !done || worker_stats.succeeded != count as u64 {
        report.problem(format!(
            "no-op drain: {} of {count} messages processed ({worker_stats:?})",
            worker_stats.succeeded
        ));
    }
    std::thread::sleep(Duration::from_millis(200));
    let pg_after = pg_counters(db)?;
    Ok(Drained {
        per_s: count as f64 / seconds,
        seconds,
        cpu: cpu::used(&cpu_before, &cpu_after),
        phases: cpu::phases(&cpu_before, &cpu_after, &roles, count as u64),
        pg: pg_work(&pg_before, &pg_after, count as u64),
        store: claims,
    })
}

/// (ii, SQL) The library's store (`DieselStore::claim`, then `settle` of `Done` outcomes) in one
/// thread, batches of `batch_size`, without the worker's threads and channels around it.
fn sql_drain<C: BenchConnection>(db: &BenchDb, opts: &Opts, count: usize) -> Res<f64> {
    db.empty::<C>()?;
    prefill::<C>(db, count, Kind::Noop)?;
    let store = DieselStore::new(db.worker_pool::<C>(2)?);
    let started = Instant::now();
    let mut drained = 0;
    let until = started + drain_timeout(count);
    while drained < count && Instant::now() < until {
        let token = ClaimToken::new();
        let claimed = store
            .claim(
                token,
                ClaimLimit::messages(opts.claims.first()),
                Duration::from_secs(60),
            )
            .ctx("claiming with the library's store")?;
        if claimed.is_empty() {
            break;
        }
        let outcomes: Vec<Outcome> = claimed
            .into_iter()
            .map(|message| Outcome {
                token,
                position: message.position,
                message_id: message.message_id,
                ordering_key: message.ordering_key.clone(),
                log: None,
                settlement: Settlement::Done,
            })
            .collect();
        let fenced = store
            .settle(&outcomes)
            .ctx("settling with the library's store")?;
        drained += outcomes.len() - fenced.len();
    }
    Ok(drained as f64 / started.elapsed().as_secs_f64())
}

/// The worker delivers `count` messages to the receiver: the figure itself.
fn worker_drain<C: BenchConnection>(
    db: &BenchDb,
    opts: &Opts,
    receiver: &Receiver,
    endpoint: &WebhookEndpoint,
    count: usize,
    report: &mut Report,
) -> Res<(Drained, f64)> {
    db.empty::<C>()?;
    let prefill_rate = prefill::<C>(db, count, Kind::Hook)?;
    receiver.reset();
    let trace = TraceHandle::default();
    let pg_before = pg_counters(db)?;
    let started = Instant::now();
    let cpu_before = cpu::snapshot(&[]);
    trace.reset();
    let worker = spawn_worker::<C>(db, opts, Some(endpoint), &trace)?;
    let delivered = receiver.wait_unique(count as u64, drain_timeout(count));
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = cpu::snapshot(&[]);
    let roles = pg_backend_roles(db)?;
    let settled = wait_for(Duration::from_secs(30), || {
        worker.stats().succeeded >= count as u64
    });
    let claims = trace.summary(count as u64);
    let worker_stats = worker
        .shutdown(Duration::from_secs(30))
        .ctx("stopping the worker")?;
    let left = db.connect::<C>()?.count(C::SQL.count_outbox)?;
    if !delivered || !settled || receiver.unique() != count as u64 || left != 0 {
        report.problem(format!(
            "drain: {} of {count} delivered, {left} left in the outbox ({worker_stats:?})",
            receiver.unique()
        ));
    }
    if receiver.duplicates() > 0 || receiver.without_id() > 0 {
        report.problem(format!(
            "drain: {} duplicate deliveries, {} without a webhook id",
            receiver.duplicates(),
            receiver.without_id()
        ));
    }
    std::thread::sleep(Duration::from_millis(200));
    let pg_after = pg_counters(db)?;
    Ok((
        Drained {
            per_s: count as f64 / seconds,
            seconds,
            cpu: cpu::used(&cpu_before, &cpu_after),
            phases: cpu::phases(&cpu_before, &cpu_after, &roles, count as u64),
            pg: pg_work(&pg_before, &pg_after, count as u64),
            store: claims,
        },
        prefill_rate,
    ))
}

#[derive(Debug)]
enum LoopError {
    Db(diesel::result::Error),
    Http(String),
}

impl std::fmt::Display for LoopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoopError::Db(e) => write!(f, "database: {e}"),
            LoopError::Http(e) => write!(f, "POST: {e}"),
        }
    }
}

impl From<diesel::result::Error> for LoopError {
    fn from(e: diesel::result::Error) -> Self {
        LoopError::Db(e)
    }
}

/// (iii) The simplest outbox: in one transaction, select the oldest message (locked), POST
/// it, delete it. One thread; at most `count` messages or `limit` of time.
fn one_at_a_time<C: BenchConnection>(
    db: &BenchDb,
    endpoint: &WebhookEndpoint,
    count: usize,
    limit: Duration,
) -> Res<f64> {
    db.empty::<C>()?;
    prefill::<C>(db, count, Kind::Hook)?;
    let mut conn = db.connect::<C>()?;
    let started = Instant::now();
    let mut done = 0usize;
    while done < count && started.elapsed() < limit {
        let sent = conn.write_tx(|c| {
            let Some(row) = c.select_one()? else {
                return Ok(false);
            };
            let body = envelope_raw(&row.message_id, &row.message_type, &row.payload);
            endpoint
                .post(&row.message_id, &body)
                .and_then(|response| response.error_for_status())
                .map_err(|e| LoopError::Http(e.to_string()))?;
            c.delete_one(row.id)?;
            Ok::<_, LoopError>(true)
        });
        match sent {
            Ok(true) => done += 1,
            Ok(false) => break,
            Err(e) => return Err(failed(format!("the one-at-a-time loop failed: {e}"))),
        }
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

/// The backlog: `--count`, else 100,000 (2,000 with --quick).
pub(crate) fn backlog(opts: &Opts) -> usize {
    opts.count
        .unwrap_or(if opts.quick { 2_000 } else { 100_000 })
        .max(1)
}

/// Runs `drain` (its `--keys` form included; `--metrics` and `--destination` are
/// `metrics_cost`'s and `relay`'s); returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, drain_on)
}

fn drain_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    if !opts.keys.is_empty() {
        return keyed_drain_on::<C>(opts, db);
    }
    let count = backlog(opts);
    // Rates of the baselines need seconds, not the whole backlog.
    let http_count = count.min(50_000) as u64;
    let loop_count = count.min(20_000);
    let loop_limit = Duration::from_secs(if opts.quick { 2 } else { 10 });
    let receiver = Receiver::counting();
    let endpoint = endpoint(&receiver.url("/hook"))?;
    let mut report = Report::new(
        "drain",
        opts,
        json!({
            "messages": count,
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "http_baseline_requests": http_count,
            "one_at_a_time_max": { "messages": loop_count, "seconds": loop_limit.as_secs() },
            "pool": "r2d2, 4 connections",
        }),
    );
    for _ in 0..opts.runs() {
        let mut figures = Map::new();
        // (i) receiver alone, then the library's client against it.
        let body = envelope(&MessageId::new().to_string(), "bench.hook", &Hook::new(1));
        receiver.reset();
        let raw = raw_capacity(receiver.addr(), opts.handler_threads, http_count, &body)?;
        receiver.reset();
        let cpu_before = cpu::snapshot(&[]);
        let http = http_capacity(&endpoint, opts.handler_threads, http_count)?;
        let http_cpu = cpu::used(&cpu_before, &cpu::snapshot(&[]));
        let threads = opts.handler_threads.max(1) as u64;
        if receiver.count() as u64 != http_count / threads * threads {
            report.problem("the HTTP baseline lost requests");
        }
        // (ii) the database without HTTP.
        let sql = sql_drain::<C>(db, opts, count)?;
        let noop = noop_drain::<C>(db, opts, count, Kind::Noop, &mut report)?;
        // The worker itself.
        let (worker, prefill_rate) =
            worker_drain::<C>(db, opts, &receiver, &endpoint, count, &mut report)?;
        // (iii) the simplest outbox.
        let naive = one_at_a_time::<C>(db, &endpoint, loop_count, loop_limit)?;

        let ceiling = http.min(noop.per_s);
        figures.insert(
            "receiver_capacity_raw_client_per_s".into(),
            json!(stats::round(raw, 0)),
        );
        figures.insert("i_http_capacity_per_s".into(), json!(stats::round(http, 0)));
        figures.insert(
            "ii_noop_worker_per_s".into(),
            json!(stats::round(noop.per_s, 0)),
        );
        figures.insert(
            "ii_sql_claim_delete_loop_per_s".into(),
            json!(stats::round(sql, 0)),
        );
        figures.insert(
            "iii_one_at_a_time_per_s".into(),
            json!(stats::round(naive, 1)),
        );
        figures.insert("worker_per_s".into(), json!(stats::round(worker.per_s, 0)));
        figures.insert(
            "worker_seconds".into(),
            json!(stats::round(worker.seconds, 2)),
        );
        figures.insert("noop_seconds".into(), json!(stats::round(noop.seconds, 2)));
        figures.insert(
            "ratio_worker_over_min_i_ii".into(),
            json!(stats::round(worker.per_s / ceiling, 3)),
        );
        figures.insert(
            "ratio_worker_over_i".into(),
            json!(stats::round(worker.per_s / http, 3)),
        );
        figures.insert(
            "ratio_worker_over_ii".into(),
            json!(stats::round(worker.per_s / noop.per_s, 3)),
        );
        figures.insert(
            "ratio_worker_over_iii".into(),
            json!(stats::round(worker.per_s / naive, 2)),
        );
        figures.insert(
            "prefill_msgs_per_s".into(),
            json!(stats::round(prefill_rate, 0)),
        );
        figures.insert("cpu_http_baseline".into(), http_cpu);
        figures.insert("cpu_noop_worker".into(), noop.cpu);
        figures.insert("cpu_worker".into(), worker.cpu);
        figures.insert("cpu_by_phase_noop_worker".into(), noop.phases);
        figures.insert("cpu_by_phase_worker".into(), worker.phases);
        figures.insert("store_noop_worker".into(), noop.store);
        figures.insert("store_worker".into(), worker.store);
        if db.backend == Backend::Postgres {
            figures.insert("pg_noop_worker".into(), noop.pg);
            figures.insert("pg_worker".into(), worker.pg);
        }
        report.run(figures);
    }
    let ratio = report.median("ratio_worker_over_min_i_ii");
    let vs_naive = report.median("ratio_worker_over_iii");
    if db.backend == Backend::Postgres {
        report.target("worker / min(i, ii)", ratio, 0.80, true);
        report.target("worker / iii", vs_naive, 10.0, true);
    }
    Ok(report.finish())
}

/// `drain --delivery-log`: what keeping the delivery log, and the archive, costs the webhook
/// drain. The worker delivers the same backlog with the log off, on (every exchange kept), and
/// on with the archive, in an order that turns with each run; the figures are the ratios and
/// the time each adds per message.
pub fn run_delivery_log_cost(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, delivery_log_cost_on)
}

/// One of the drains `drain --delivery-log` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Keeping {
    Nothing,
    Log,
    LogAndArchive,
}

fn delivery_log_cost_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let count = backlog(opts);
    let receiver = Receiver::counting();
    let endpoint = endpoint(&receiver.url("/hook"))?;
    let mut report = Report::new(
        "drain_delivery_log",
        opts,
        json!({
            "messages": count,
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "pool": "r2d2, 4 connections",
            "archive_window_s": 3600,
        }),
    );
    for run in 0..opts.runs() {
        let mut order = [Keeping::Nothing, Keeping::Log, Keeping::LogAndArchive];
        let turn = run % order.len();
        order.rotate_left(turn);
        let mut rates = HashMap::new();
        for keeping in order {
            let opts = Opts {
                log_mode: if keeping == Keeping::Nothing {
                    DeliveryLog::Off
                } else {
                    DeliveryLog::All
                },
                archive: keeping == Keeping::LogAndArchive,
                ..opts.clone()
            };
            let (drained, _) =
                worker_drain::<C>(db, &opts, &receiver, &endpoint, count, &mut report)?;
            let mut conn = db.connect::<C>()?;
            let logged = conn.count("SELECT COUNT(*) AS n FROM outbox_attempt")?;
            let archived = conn.count("SELECT COUNT(*) AS n FROM outbox_archive")?;
            conn.batch_execute("DELETE FROM outbox_archive")
                .ctx("emptying the archive")?;
            let expected = match keeping {
                Keeping::Nothing => (0, 0),
                Keeping::Log => (count as i64, 0),
                Keeping::LogAndArchive => (count as i64, count as i64),
            };
            if (logged, archived) != expected {
                report.problem(format!(
                    "{keeping:?}: {logged} attempts logged and {archived} archived for {count} \
                     deliveries"
                ));
            }
            rates.insert(keeping, drained.per_s);
        }
        let (off, log, archive) = (
            rates[&Keeping::Nothing],
            rates[&Keeping::Log],
            rates[&Keeping::LogAndArchive],
        );
        let mut figures = Map::new();
        figures.insert("log_off_per_s".into(), json!(stats::round(off, 0)));
        figures.insert("log_all_per_s".into(), json!(stats::round(log, 0)));
        figures.insert(
            "log_all_archive_per_s".into(),
            json!(stats::round(archive, 0)),
        );
        figures.insert(
            "ratio_log_all_over_off".into(),
            json!(stats::round(log / off, 3)),
        );
        figures.insert(
            "ratio_archive_over_log_all".into(),
            json!(stats::round(archive / log, 3)),
        );
        figures.insert(
            "log_cost_us_per_message".into(),
            json!(stats::round((1.0 / log - 1.0 / off) * 1e6, 2)),
        );
        figures.insert(
            "archive_cost_us_per_message".into(),
            json!(stats::round((1.0 / archive - 1.0 / log) * 1e6, 2)),
        );
        report.run(figures);
    }
    Ok(report.finish())
}

/// `drain --keys K,..`: the no-op worker drains the backlog without ordering keys, then spread
/// over K keys, then K keys at a tenth of the backlog: per-key order must cost a small factor
/// of the unkeyed rate, and no more per message as the backlog grows.
fn keyed_drain_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let count = backlog(opts);
    let small = (count / 10).max(1);
    let mut report = Report::new(
        "drain_keyed",
        opts,
        json!({
            "messages": count,
            "small_backlog": small,
            "keys": opts.keys,
            "handler": "no-op",
            "handler_threads": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "pool": "r2d2, 4 connections",
        }),
    );
    for _ in 0..opts.runs() {
        let mut figures = Map::new();
        let unkeyed = noop_drain::<C>(db, opts, count, Kind::Noop, &mut report)?;
        figures.insert(
            "unkeyed_per_s".into(),
            json!(stats::round(unkeyed.per_s, 0)),
        );
        for &keys in &opts.keys {
            let keyed = noop_drain::<C>(db, opts, count, Kind::KeyedNoop(keys), &mut report)?;
            let keyed_small = noop_drain::<C>(db, opts, small, Kind::KeyedNoop(keys), &mut report)?;
            let per_message = keyed.seconds / count as f64;
            let per_message_small = keyed_small.seconds / small as f64;
            figures.insert(
                format!("keys_{keys}_per_s"),
                json!(stats::round(keyed.per_s, 0)),
            );
            figures.insert(
                format!("keys_{keys}_small_backlog_per_s"),
                json!(stats::round(keyed_small.per_s, 0)),
            );
            figures.insert(
                format!("ratio_keys_{keys}_over_unkeyed"),
                json!(stats::round(keyed.per_s / unkeyed.per_s, 3)),
            );
            figures.insert(
                format!("keys_{keys}_time_per_message_large_over_small"),
                json!(stats::round(per_message / per_message_small, 3)),
            );
            figures.insert(format!("store_keys_{keys}"), keyed.store);
        }
        report.run(figures);
    }
    if db.backend == Backend::Postgres {
        for &keys in &opts.keys {
            // Issue 26's floors (issue 11's were 0.25 and 0.8).
            let floor = match keys {
                0..=16 => Some(0.5),
                1000.. => Some(0.9),
                _ => None,
            };
            if let Some(floor) = floor {
                let ratio = report.median(&format!("ratio_keys_{keys}_over_unkeyed"));
                report.target(&format!("{keys} keys / unkeyed"), ratio, floor, true);
            }
            let growth = report.median(&format!("keys_{keys}_time_per_message_large_over_small"));
            report.target(
                &format!("{keys} keys: time per message, {count} over {small}"),
                growth,
                1.3,
                false,
            );
        }
    }
    Ok(report.finish())
}

/// Runs `scale`: the drain with 1 and 2 worker processes; returns whether it completed.
pub fn run_scale(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, scale_on)
}

/// One scaled drain: `processes` worker processes deliver `count` messages.
fn scaled_drain<C: BenchConnection>(
    db: &BenchDb,
    opts: &Opts,
    receiver: &Receiver,
    count: usize,
    processes: usize,
    report: &mut Report,
) -> Res<Map<String, Value>> {
    db.empty::<C>()?;
    prefill::<C>(db, count, Kind::Hook)?;
    receiver.reset();
    let started = Instant::now();
    let children: Vec<ChildWorker> = (0..processes)
        .map(|_| {
            worker_process::spawn(
                db,
                &receiver.url("/hook"),
                opts.handler_threads,
                opts.claims,
                None,
                None,
                drain_timeout(count),
            )
        })
        .collect::<Res<_>>()?;
    let pids: Vec<u32> = children.iter().map(ChildWorker::pid).collect();
    let cpu_before = cpu::snapshot(&pids);
    let delivered = receiver.wait_unique(count as u64, drain_timeout(count));
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = cpu::snapshot(&pids);
    // Let the last settlements land before stopping.
    std::thread::sleep(Duration::from_millis(300));
    let mut succeeded = 0;
    let mut peak_rss_kb = 0;
    let mut per_process = Vec::new();
    let mut stores = Vec::new();
    for child in children {
        let result = child.stop(Duration::from_secs(60))?;
        succeeded += result.succeeded;
        peak_rss_kb = peak_rss_kb.max(result.vm_hwm_kb);
        per_process.push(result.succeeded);
        stores.push(result.store);
    }
    let left = db.connect::<C>()?.count(C::SQL.count_outbox)?;
    let duplicates = receiver.duplicates();
    if !delivered || receiver.unique() != count as u64 || left != 0 || succeeded != count as u64 {
        report.problem(format!(
            "scale with {processes} process(es): {} of {count} delivered, {succeeded} settled, \
             {left} left in the outbox",
            receiver.unique()
        ));
    }
    if duplicates > 0 {
        report.problem(format!(
            "scale with {processes} process(es): {duplicates} duplicate deliveries"
        ));
    }
    let mut figures = Map::new();
    figures.insert(
        "per_s".into(),
        json!(stats::round(count as f64 / seconds, 0)),
    );
    figures.insert("duplicates".into(), json!(duplicates));
    figures.insert("per_process_succeeded".into(), json!(per_process));
    figures.insert(
        "peak_rss_mb".into(),
        json!(stats::round(peak_rss_kb as f64 / 1024.0, 1)),
    );
    figures.insert("cpu".into(), cpu::used(&cpu_before, &cpu_after));
    figures.insert("store".into(), json!(stores));
    Ok(figures)
}

fn scale_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let count = backlog(opts);
    let http_count = count.min(50_000) as u64;
    let receiver = Arc::new(Receiver::counting());
    let endpoint = endpoint(&receiver.url("/hook"))?;
    let mut report = Report::new(
        "scale",
        opts,
        json!({
            "messages": count,
            "handler_threads_per_process": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "processes": [1, 2],
        }),
    );
    for _ in 0..opts.runs() {
        let mut figures = Map::new();
        let mut rates = BTreeMap::new();
        for processes in [1usize, 2] {
            receiver.reset();
            let http = http_capacity(&endpoint, opts.handler_threads * processes, http_count)?;
            figures.insert(
                format!(
                    "i_http_capacity_{}_threads_per_s",
                    opts.handler_threads * processes
                ),
                json!(stats::round(http, 0)),
            );
            let result = scaled_drain::<C>(db, opts, &receiver, count, processes, &mut report)?;
            let rate = result.get("per_s").and_then(Value::as_f64).unwrap_or(0.0);
            rates.insert(processes, rate);
            for (key, value) in result {
                figures.insert(format!("p{processes}_{key}"), value);
            }
        }
        let one = rates.get(&1).copied().unwrap_or(0.0);
        let two = rates.get(&2).copied().unwrap_or(0.0);
        figures.insert("ratio_2_over_1".into(), json!(stats::round(two / one, 3)));
        report.run(figures);
    }
    let dups = report.median("p2_duplicates") + report.median("p1_duplicates");
    report.target("duplicates", dups, 0.0, false);
    Ok(report.finish())
}
