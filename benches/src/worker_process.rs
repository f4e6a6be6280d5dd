//! Worker processes for `memory` and `scale`: the benchmark re-invokes itself with the hidden
//! `worker` subcommand. The child runs the library's worker until its stdin closes (or its own
//! time limit passes), then shuts it down and prints its stats as one JSON line.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use outbox_diesel::destination::{DestinationOptions, RateLimit};
use outbox_diesel::{DieselStore, Worker};
use serde_json::{json, Value};

use crate::db::{with_connection, BenchConnection, BenchDb};
use crate::handlers::endpoint;
use crate::traced_store::{TraceHandle, TracedStore};
use crate::{failed, Backend, ClaimSizes, Res, WithContext};

/// The hidden `worker` subcommand's arguments.
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// The database.
    #[arg(long)]
    pub backend: Backend,
    /// Its URL (a file path for SQLite).
    #[arg(long)]
    pub url: String,
    /// The receiver's URL.
    #[arg(long)]
    pub receiver: String,
    /// Handler threads.
    #[arg(long, default_value_t = 16)]
    pub handler_threads: usize,
    #[command(flatten)]
    pub claims: ClaimSizes,
    /// The most payload bytes held at once.
    #[arg(long, default_value_t = 32 << 20)]
    pub max_in_flight_bytes: usize,
    /// Stop by itself after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub max_seconds: u64,
    /// A static rate limit on the receiver's destination, deliveries a second.
    #[arg(long)]
    pub rate_limit: Option<u32>,
    /// The rate limit holds for every worker process together (`RateLimit::across_processes`).
    #[arg(long)]
    pub across_processes: bool,
}

/// Runs the worker process.
pub fn run(args: &WorkerArgs) -> Res<()> {
    with_connection!(args.backend, C => run_on::<C>(args))
}

fn run_on<C: BenchConnection>(args: &WorkerArgs) -> Res<()> {
    let db = BenchDb::existing(args.backend, &args.url);
    // The worker's four, and one for the turns of a limit across processes.
    let pool = db.worker_pool::<C>(4 + u32::from(args.across_processes))?;
    let trace = TraceHandle::default();
    let builder = Worker::builder(TracedStore::new(DieselStore::new(pool), trace.clone()))
        .subscriptions(crate::handlers::subscribers())
        .destination(crate::handlers::RELAY, crate::handlers::Unrelayed)
        .handler_threads(args.handler_threads);
    let worker = args
        .claims
        .apply(builder)
        .max_in_flight_bytes(args.max_in_flight_bytes)
        .destination_with(
            crate::handlers::HOOK,
            endpoint(&args.receiver)?,
            match args.rate_limit {
                Some(per_second) if args.across_processes => DestinationOptions::new()
                    .rate_limit(RateLimit::per_second(per_second).across_processes()),
                Some(per_second) => {
                    DestinationOptions::new().rate_limit(RateLimit::per_second(per_second))
                }
                None => DestinationOptions::new(),
            },
        )
        .spawn()
        .ctx("starting the worker")?;
    let (closed_tx, closed_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = closed_tx.send(());
    });
    let _ = closed_rx.recv_timeout(Duration::from_secs(args.max_seconds));
    let stats = worker
        .shutdown(Duration::from_secs(30))
        .ctx("stopping the worker")?;
    let line = json!({
        "claimed": stats.claimed,
        "succeeded": stats.succeeded,
        "retried": stats.retried,
        "dead_lettered": stats.dead_lettered,
        "released": stats.released,
        "fenced": stats.fenced,
        "vm_hwm_kb": memory_kb("self", "VmHWM:").unwrap_or(0),
        "store": trace.summary(stats.succeeded),
    });
    println!("{line}");
    Ok(())
}

/// A `/proc/<pid>/status` field in kB (`VmRSS:`, `VmHWM:`).
pub fn memory_kb(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
}

/// A running worker process.
#[derive(Debug)]
pub struct ChildWorker {
    child: Child,
    stdin: Option<ChildStdin>,
}

/// What a worker process reported when it stopped.
#[derive(Debug, Clone)]
pub struct ChildResult {
    pub store: Value,
    pub claimed: u64,
    pub succeeded: u64,
    pub released: u64,
    pub vm_hwm_kb: u64,
}

/// Starts a worker process on `db` delivering to `receiver` (at most `rate_limit`, if given: a
/// number of deliveries a second, for this process or for all together).
pub fn spawn(
    db: &BenchDb,
    receiver: &str,
    handler_threads: usize,
    claims: ClaimSizes,
    max_in_flight_bytes: Option<usize>,
    rate_limit: Option<RateLimit>,
    max_time: Duration,
) -> Res<ChildWorker> {
    let exe = std::env::current_exe().ctx("finding the benchmark's own executable")?;
    let mut command = Command::new(exe);
    command.arg("worker");
    claims.pass_to(&mut command);
    if let Some(bytes) = max_in_flight_bytes {
        command.arg("--max-in-flight-bytes").arg(bytes.to_string());
    }
    if let Some(limit) = rate_limit {
        let per_second = (1.0 / limit.interval().as_secs_f64()).round();
        command.arg("--rate-limit").arg(per_second.to_string());
        if limit.is_across_processes() {
            command.arg("--across-processes");
        }
    }
    if let Ok(threshold) = std::env::var("OUTBOX_BENCH_MMAP_THRESHOLD") {
        // glibc keeps freed multi-MB buffers in its per-thread arenas unless large
        // allocations always go to mmap: what the worker holds, not what the allocator keeps.
        command.env("MALLOC_MMAP_THRESHOLD_", threshold);
    }
    let mut child = command
        .arg("--backend")
        .arg(db.backend.name())
        .arg("--url")
        .arg(&db.url)
        .arg("--receiver")
        .arg(receiver)
        .arg("--handler-threads")
        .arg(handler_threads.to_string())
        .arg("--max-seconds")
        .arg(max_time.as_secs().max(1).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .ctx("starting a worker process")?;
    let stdin = child.stdin.take();
    Ok(ChildWorker { child, stdin })
}

impl ChildWorker {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory now, in kB.
    pub fn rss_kb(&self) -> Option<u64> {
        memory_kb(&self.pid().to_string(), "VmRSS:")
    }

    /// Its peak resident memory so far, in kB.
    pub fn hwm_kb(&self) -> Option<u64> {
        memory_kb(&self.pid().to_string(), "VmHWM:")
    }

    /// Closes its stdin (it shuts its worker down) and waits for its report, at most
    /// `deadline`; a process that does not stop by then is killed and reported as an error.
    pub fn stop(mut self, deadline: Duration) -> Res<ChildResult> {
        drop(self.stdin.take());
        let until = Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().ctx("waiting for a worker process")? {
                if !status.success() {
                    return Err(failed(format!("a worker process failed: {status}")));
                }
                break;
            }
            if Instant::now() >= until {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(failed("a worker process did not stop in time"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let stdout = self
            .child
            .stdout
            .take()
            .ok_or_else(|| failed("a worker process has no stdout"))?;
        let line = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .last()
            .ok_or_else(|| failed("a worker process printed no report"))?;
        let value: Value = serde_json::from_str(&line).ctx("reading a worker's report")?;
        let field = |name: &str| value.get(name).and_then(Value::as_u64).unwrap_or(0);
        Ok(ChildResult {
            store: value.get("store").cloned().unwrap_or(Value::Null),
            claimed: field("claimed"),
            succeeded: field("succeeded"),
            released: field("released"),
            vm_hwm_kb: field("vm_hwm_kb"),
        })
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        // Closing stdin asks it to stop; make sure it is not left behind.
        drop(self.stdin.take());
        if matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(500));
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}
