//! `outbox-bench`: how fast the outbox is on this machine, as ratios against baselines measured
//! in the same run.
//!
//! ```text
//! cargo run --release -p outbox-bench -- <scenario> --backend postgres|mysql|sqlite [--quick]
//! ```
//!
//! Scenarios: `enqueue`, `drain` (with `--keys K,…` the keyed drains, with `--metrics` the cost
//! of recording metrics, with `--destination jetstream|rabbitmq` the relay to a broker), `latency`, `memory`, `scale`, `ratelimit`, `priority`, `fairness`, `fanout`, `peers` (the no-op drain against graphile-worker and pg-boss, PostgreSQL) (and `explain`, the claim query's plan). Each prints one JSON object per line on stdout (one per run, then a summary with
//! medians and spread) and a short human summary on stderr. `chart --input F --output F.svg`
//! draws a `peers` or `latency --hold-transaction` file of those lines. A scenario that loses or duplicates
//! messages exits non-zero; a missed speed target only prints `"target_met": false`.

mod chart;
mod cpu;
mod db;
mod drain;
mod enqueue;
mod explain;
mod fairness;
mod fanout;
mod handlers;
mod latency;
mod library_sql;
mod memory;
mod metrics_cost;
mod peers;
mod priority;
mod ratelimit;
mod raw_client;
mod relay;
mod report;
mod stats;
mod traced_store;
mod worker_process;

use std::error::Error;
use std::fmt;

use clap::{Args, Parser, Subcommand};

/// Every fallible step of the benchmark returns this: an error with what was being done.
pub type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// An error that says what failed, around the error that made it fail.
#[derive(Debug)]
pub struct Failed {
    what: String,
    source: Option<Box<dyn Error + Send + Sync>>,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {source}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl Error for Failed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// A failure without an underlying error.
pub fn failed(what: impl Into<String>) -> Box<dyn Error + Send + Sync> {
    Box::new(Failed {
        what: what.into(),
        source: None,
    })
}

/// `.ctx("what was being done")` on any result.
pub trait WithContext<T> {
    /// Wraps the error with what was being done.
    fn ctx(self, what: impl Into<String>) -> Res<T>;
}

impl<T, E: Into<Box<dyn Error + Send + Sync>>> WithContext<T> for Result<T, E> {
    fn ctx(self, what: impl Into<String>) -> Res<T> {
        self.map_err(|e| {
            Box::new(Failed {
                what: what.into(),
                source: Some(e.into()),
            }) as Box<dyn Error + Send + Sync>
        })
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "outbox-bench",
    about = "Benchmarks of the outbox against baselines measured in the same run",
    long_about = "Benchmarks of the outbox against baselines measured in the same run.\n\n\
        Databases: a database named outbox_bench is dropped and created on the servers of \
        OUTBOX_TEST_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/outbox_test) and \
        OUTBOX_TEST_MYSQL_URL (default mysql://root@127.0.0.1:3306/outbox_test); SQLite uses a \
        temporary file. Results: one JSON object per line on stdout, a summary on stderr."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Transactions/s of a business INSERT alone, plus a raw outbox INSERT, plus `enqueue`;
    /// and a Batch of 100 against 100 single enqueues.
    Enqueue(Opts),
    /// Time to deliver a prefilled backlog, against the receiver's capacity, the no-op drain
    /// rate and a one-at-a-time loop.
    Drain(Opts),
    /// Commit-to-received latency at a steady enqueue rate.
    Latency(Opts),
    /// Peak RSS of a worker process over a large backlog and a slow receiver.
    Memory(Opts),
    /// The drain with 1 and 2 worker processes: ratio, and duplicates (must be 0).
    Scale(Opts),
    /// The claim query's plan on a large table (must not scan the table).
    Explain(Opts),
    /// A receiver that rate-limits with 429 and Retry-After, and a static rate limit.
    Ratelimit(Opts),
    /// A raised priority under an ordinary backlog: its commit → received latency, against
    /// ordinary messages enqueued at the same moments.
    Priority(Opts),
    /// One group's few messages behind another group's flood: their commit → received time,
    /// against the same messages without groups.
    Fairness(Opts),
    /// Events fanned out to 1, 10, 100 and 1,000 subscriptions, against as many deliveries of
    /// separate messages to one webhook destination; and an event's enqueue against a message's.
    Fanout(Opts),
    /// The no-op drain against graphile-worker and pg-boss (Node.js, installed from npm into
    /// a cache) on the same PostgreSQL backlog, alternated, every system's table analyzed and
    /// checkpointed after its fill (`--stale-statistics`: none); their ratios.
    Peers(Opts),
    /// An SVG chart from the JSON lines a `peers` or `latency --hold-transaction` run printed.
    Chart(chart::ChartArgs),
    /// A worker process for `memory` and `scale` (started by the benchmark itself).
    #[command(hide = true)]
    Worker(worker_process::WorkerArgs),
}

pub use outbox_diesel::Backend;

/// Options shared by the scenarios; each uses those that apply to it.
#[derive(Args, Debug, Clone)]
pub struct Opts {
    /// The database: postgres, mysql or sqlite.
    #[arg(long, default_value = "postgres")]
    pub backend: Backend,
    /// A few seconds, small counts and one run: proves the benchmark works, measures nothing.
    #[arg(long)]
    pub quick: bool,
    /// Runs per scenario (default 3, 1 with --quick); figures are medians over runs.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Messages: the backlog of drain/scale/memory/explain.
    #[arg(long)]
    pub count: Option<usize>,
    /// Seconds: each enqueue variant's slice, the latency test's length, a memory run's length.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Messages per second the latency scenario enqueues.
    #[arg(long)]
    pub rate: Option<f64>,
    /// The worker's handler threads (the library's default is 16).
    #[arg(long, default_value_t = 16)]
    pub handler_threads: usize,
    #[command(flatten)]
    pub claims: ClaimSizes,
    /// How long the memory scenario's slow receiver takes to answer, in milliseconds.
    #[arg(long)]
    pub delay_ms: Option<u64>,
    /// Concurrent enqueuing connections: in `enqueue` (default 1) and `latency` (where the
    /// default is 4, so that the schedule holds even when one commit is slow).
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// The size of each message's payload in bytes, for `memory` (default: about 100 bytes).
    #[arg(long)]
    pub payload_bytes: Option<usize>,
    /// The worker's `max_in_flight_bytes`, for `memory` (the library's default is 32 MiB).
    #[arg(long)]
    pub max_in_flight_bytes: Option<usize>,
    /// Ordering keys: `drain` compares no-op drains spread over each of these many keys with
    /// the unkeyed drain (e.g. `--keys 16,1000`); `explain` prefills over the first.
    #[arg(long, value_delimiter = ',')]
    pub keys: Vec<usize>,
    /// `drain` only: the no-op drain with the worker's metrics recorded (a Prometheus
    /// recorder) and not, side by side; the figure is their ratio.
    #[arg(long)]
    pub metrics: bool,
    /// `drain` only: the webhook drain with the delivery log kept and not, and with the archive
    /// kept as well, side by side; the figures are their ratios and the cost per message.
    #[arg(long)]
    pub delivery_log: bool,
    /// What the worker's store keeps in the delivery log (set by `--delivery-log`'s runs).
    #[arg(skip)]
    pub log_mode: outbox_diesel::delivery_log::DeliveryLog,
    /// Whether the worker's store keeps an archive (set by `--delivery-log`'s runs).
    #[arg(skip)]
    pub archive: bool,
    /// `drain` only: relay the backlog to this broker (jetstream or rabbitmq on 127.0.0.1)
    /// instead of a webhook, against the broker's own client publishing with the same
    /// acknowledgements from as many tasks as the worker has handler threads.
    #[arg(long)]
    pub destination: Option<relay::Destination>,
    /// `latency` only: another session holds a transaction open in the outbox's database for
    /// this many seconds from the start of the run (a report, a `pg_dump`, a stuck request):
    /// on PostgreSQL a REPEATABLE READ transaction with an xid, which holds vacuum back; on
    /// MySQL a consistent snapshot, which holds purge back; on SQLite a reader, which keeps
    /// checkpoints from finishing. The run reports its figures per interval.
    #[arg(long)]
    pub hold_transaction: Option<f64>,
    /// `latency` on PostgreSQL only: run `VACUUM` on the outbox table every this many seconds,
    /// throttled as autovacuum is (`vacuum_cost_delay` 2 ms), as autovacuum does where it is on
    /// (this machine's server runs with `autovacuum = off`; the migrations ask for a vacuum
    /// every 1,000 changed rows).
    #[arg(long)]
    pub vacuum_every: Option<f64>,
    /// `peers` only: run every system on the statistics of its empty tables, as a server with
    /// autovacuum off or behind leaves them, instead of analyzing each after its fill.
    #[arg(long)]
    pub stale_statistics: bool,
    /// Keep the outbox_bench database afterwards (e.g. to EXPLAIN by hand).
    #[arg(long)]
    pub keep: bool,
}

/// The worker's claim sizes as asked for: either left out, the library's default (claims of 64
/// that grow to 256 while the handlers keep up).
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct ClaimSizes {
    /// The worker's `batch_size`: the first and smallest claim (fixed unless
    /// `--max-batch-size` lets it grow).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// The worker's `max_batch_size`: the largest claim.
    #[arg(long)]
    pub max_batch_size: Option<usize>,
}

impl ClaimSizes {
    /// The library's defaults, which these mirror for the benches' own claims and reports.
    const DEFAULT_BATCH: usize = 64;
    const DEFAULT_MAX: usize = 256;

    /// The first claim's size.
    pub fn first(self) -> usize {
        self.batch_size.unwrap_or(Self::DEFAULT_BATCH)
    }

    /// The largest claim's size.
    pub fn largest(self) -> usize {
        match (self.max_batch_size, self.batch_size) {
            (Some(largest), _) => largest,
            (None, Some(fixed)) => fixed,
            (None, None) => Self::DEFAULT_MAX,
        }
    }

    /// As reports print it: `64` for a fixed size, `64-256` for claims that grow.
    pub fn label(self) -> String {
        let (first, largest) = (self.first(), self.largest());
        if first == largest {
            first.to_string()
        } else {
            format!("{first}-{largest}")
        }
    }

    /// The worker builder with these sizes.
    pub fn apply<S: outbox_diesel::store::Store>(
        self,
        mut builder: outbox_diesel::WorkerBuilder<S>,
    ) -> outbox_diesel::WorkerBuilder<S> {
        if let Some(size) = self.batch_size {
            builder = builder.batch_size(size);
        }
        if let Some(size) = self.max_batch_size {
            builder = builder.max_batch_size(size);
        }
        builder
    }

    /// The same for a worker process's command line.
    pub fn pass_to(self, command: &mut std::process::Command) {
        if let Some(size) = self.batch_size {
            command.arg("--batch-size").arg(size.to_string());
        }
        if let Some(size) = self.max_batch_size {
            command.arg("--max-batch-size").arg(size.to_string());
        }
    }
}

impl Opts {
    /// Runs to make: `--runs`, else 1 quick or 3 full.
    pub fn runs(&self) -> usize {
        self.runs.unwrap_or(if self.quick { 1 } else { 3 }).max(1)
    }

    /// "quick" or "full", as printed in the JSON.
    pub fn mode(&self) -> &'static str {
        if self.quick {
            "quick"
        } else {
            "full"
        }
    }
}

/// Holds an exclusive lock on a backend for the life of a scenario: every scenario drops and
/// recreates that backend's `outbox_bench` database, which would cut a second invocation's
/// connections mid-run. Scenarios on different backends run side by side.
fn one_benchmark_at_a_time(backend: Backend) -> Res<std::fs::File> {
    let path = std::env::temp_dir().join(format!("outbox-bench-{backend}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .ctx(format!("opening the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(failed(format!(
            "another outbox-bench is running on {backend} (it holds {}): run one at a time \
             per backend, as each recreates that backend's outbox_bench database",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).ctx(format!("locking {}", path.display()))
        }
    }
}

impl Command {
    /// The options of a scenario; `None` for the commands that touch no database of their own.
    fn scenario(&self) -> Option<&Opts> {
        match self {
            Command::Enqueue(opts)
            | Command::Drain(opts)
            | Command::Latency(opts)
            | Command::Memory(opts)
            | Command::Scale(opts)
            | Command::Explain(opts)
            | Command::Ratelimit(opts)
            | Command::Priority(opts)
            | Command::Fairness(opts)
            | Command::Fanout(opts)
            | Command::Peers(opts) => Some(opts),
            Command::Chart(_) | Command::Worker(_) => None,
        }
    }
}

fn main() {
    outbox_testkit::log_to_stderr_from_env("OUTBOX_BENCH_LOG");
    let cli = Cli::parse();
    // Worker processes are the scenario's own children: only the scenario takes the lock.
    let _lock = match cli.command.scenario() {
        None => None,
        Some(opts) => match one_benchmark_at_a_time(opts.backend) {
            Ok(lock) => Some(lock),
            Err(error) => {
                eprintln!("outbox-bench: {error}");
                std::process::exit(2);
            }
        },
    };
    let result = match cli.command {
        Command::Enqueue(opts) => enqueue::run(&opts),
        Command::Drain(opts) if opts.metrics => metrics_cost::run(&opts),
        Command::Drain(opts) if opts.delivery_log => drain::run_delivery_log_cost(&opts),
        Command::Drain(opts) if opts.keys.is_empty() && opts.destination.is_some() => {
            relay::run(&opts)
        }
        Command::Drain(opts) => drain::run(&opts),
        Command::Latency(opts) => latency::run(&opts),
        Command::Memory(opts) => memory::run(&opts),
        Command::Scale(opts) => drain::run_scale(&opts),
        Command::Explain(opts) => explain::run(&opts),
        Command::Ratelimit(opts) => ratelimit::run(&opts),
        Command::Priority(opts) => priority::run(&opts),
        Command::Fairness(opts) => fairness::run(&opts),
        Command::Fanout(opts) => fanout::run(&opts),
        Command::Peers(opts) => peers::run(&opts),
        Command::Chart(args) => chart::run(&args).map(|()| true),
        Command::Worker(args) => worker_process::run(&args).map(|()| true),
    };
    match result {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("outbox-bench: the scenario did not complete correctly (see above)");
            std::process::exit(1);
        }
        Err(error) => {
            eprintln!("outbox-bench: {error}");
            std::process::exit(2);
        }
    }
}
