//! Where the CPU went during a phase: the whole machine (/proc/stat), this process, its worker
//! processes and the database server (the nanoseconds each thread ran, from
//! `/proc/<pid>/task/<tid>/schedstat`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use serde_json::{json, Value};

use crate::stats::round;
use crate::Backend;

/// Ticks per second of /proc/stat (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// CPU counters at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    machine_busy: u64,
    machine_total: u64,
    /// Nanoseconds on CPU of this process's threads.
    own: HashMap<u32, u64>,
    /// The names of this process's threads (as the kernel keeps them: 15 bytes at most).
    own_names: HashMap<u32, String>,
    /// ... of the worker processes' threads.
    children: HashMap<u32, u64>,
    /// ... of the database server's threads that work for the benchmark.
    database: HashMap<u32, u64>,
}

fn machine() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let Some(line) = stat.lines().next() else {
        return (0, 0);
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// A process's command name.
fn name(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    Some(stat[open + 1..close].to_owned())
}

/// Nanoseconds on CPU of each thread of a process, by thread id.
fn threads(pid: &str, into: &mut HashMap<u32, u64>) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.filter_map(|t| t.ok()) {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let ns = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()));
        if let Some(ns) = ns {
            into.insert(tid, ns);
        }
    }
}

/// The running processes whose command name starts with one of `prefixes` (a broker's
/// server, say), to count as `children` of a [`snapshot`].
pub fn pids_named(prefixes: &[&str]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter_map(|pid| {
            let pid_number = pid.parse::<u32>().ok()?;
            let name = name(&pid)?;
            prefixes
                .iter()
                .any(|prefix| name.starts_with(prefix))
                .then_some(pid_number)
        })
        .collect()
}

/// Which database server the benchmark uses (0: none yet, 1: PostgreSQL, 2: MariaDB, 3: SQLite,
/// which runs inside this process).
static SERVER: AtomicU8 = AtomicU8::new(0);

/// Counts the CPU of `backend`'s server as the database's.
pub fn watch(backend: Backend) {
    let code = match backend {
        Backend::Postgres => 1,
        Backend::Mysql => 2,
        Backend::Sqlite => 3,
    };
    SERVER.store(code, Ordering::Relaxed);
}

/// The database server's threads that work for the benchmark: PostgreSQL backends of the
/// `outbox_bench` database and the server's own processes (WAL writer, checkpointer, ...), not
/// other databases' backends; every thread of `mariadbd` (one process for all databases, so
/// other users of MariaDB count too). Nothing for SQLite: it runs in the benchmark's process.
fn database() -> HashMap<u32, u64> {
    let mut ns = HashMap::new();
    let server = SERVER.load(Ordering::Relaxed);
    if server == 0 || server == 3 {
        return ns;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return ns;
    };
    for pid in entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
    {
        let Some(name) = name(&pid) else { continue };
        let ours = if server == 1 && name.starts_with("postgres") {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let backend = cmdline.contains("127.0.0.1(") || cmdline.contains("[local]");
            !backend || cmdline.contains(&format!(" {} ", crate::db::DB_NAME))
        } else {
            server == 2 && (name.starts_with("mariadbd") || name.starts_with("mysqld"))
        };
        if ours {
            threads(&pid, &mut ns);
        }
    }
    ns
}

/// Takes a snapshot; `children` are worker processes to count separately.
pub fn snapshot(children: &[u32]) -> Snapshot {
    let (machine_busy, machine_total) = machine();
    let mut own = HashMap::new();
    threads("self", &mut own);
    let own_names = own
        .keys()
        .filter_map(|tid| {
            let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?;
            Some((*tid, comm.trim_end().to_owned()))
        })
        .collect();
    let mut child_threads = HashMap::new();
    for pid in children {
        threads(&pid.to_string(), &mut child_threads);
    }
    Snapshot {
        at: Instant::now(),
        machine_busy,
        machine_total,
        own,
        own_names,
        children: child_threads,
        database: database(),
    }
}

/// CPU seconds between two readings of a set of threads: threads that started in between
/// count whole, those that ended in between are lost (take readings while they live).
fn seconds(from: &HashMap<u32, u64>, to: &HashMap<u32, u64>) -> f64 {
    to.iter()
        .map(|(tid, ns)| ns.saturating_sub(from.get(tid).copied().unwrap_or(0)))
        .sum::<u64>() as f64
        / 1e9
}

/// CPU seconds of (this process, the database server) between two snapshots.
pub fn seconds_used(from: &Snapshot, to: &Snapshot) -> (f64, f64) {
    (
        seconds(&from.own, &to.own),
        seconds(&from.database, &to.database),
    )
}

/// CPU microseconds per message of this process between two snapshots.
pub fn process_us_per_message(from: &Snapshot, to: &Snapshot, messages: u64) -> f64 {
    us_per_message(seconds(&from.own, &to.own), messages)
}

/// CPU microseconds per message of the `children` processes between two snapshots.
pub fn children_us_per_message(from: &Snapshot, to: &Snapshot, messages: u64) -> f64 {
    us_per_message(seconds(&from.children, &to.children), messages)
}

fn us_per_message(seconds: f64, messages: u64) -> f64 {
    round(seconds * 1e6 / messages.max(1) as f64, 2)
}

/// Cores used between two snapshots: the machine, this process, the worker processes, the
/// database server and everything else (other users of the machine).
pub fn used(from: &Snapshot, to: &Snapshot) -> Value {
    let secs = to.at.duration_since(from.at).as_secs_f64().max(1e-3);
    let busy = to.machine_busy.saturating_sub(from.machine_busy);
    let total = to.machine_total.saturating_sub(from.machine_total).max(1);
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let machine = if total > 1 {
        busy as f64 / total as f64 * ncpu
    } else {
        busy as f64 / TICKS / secs
    };
    let own = seconds(&from.own, &to.own) / secs;
    let children = seconds(&from.children, &to.children) / secs;
    let database = seconds(&from.database, &to.database) / secs;
    let other = (machine - own - children - database).max(0.0);
    json!({
        "machine_cores_busy": round(machine, 2),
        "of_cores": ncpu,
        "bench_process": round(own, 2),
        "worker_processes": round(children, 2),
        "database_server": round(database, 2),
        "other": round(other, 2),
    })
}

/// The phase a thread of the worker works for, by the name the worker gives it.
fn worker_phase(thread: &str) -> &'static str {
    if thread.starts_with("outbox-claimer") {
        "claim"
    } else if thread.starts_with("outbox-acker") {
        "settle"
    } else if thread.starts_with("outbox-handler") {
        "handlers"
    } else if thread.starts_with("reqwest") {
        "http_client_runtime"
    } else if thread.starts_with("outbox-relay") {
        "relay_client_runtime"
    } else if thread.starts_with("outbox-") {
        "chores"
    } else if thread.starts_with("receiver") {
        "bench_receiver"
    } else {
        "bench_other"
    }
}

/// CPU microseconds per message between two snapshots, by phase: this process's threads by
/// the worker's thread names (`claim`: the claimer, `settle`: the acker, `handlers`: dispatch,
/// the handler and the webhook's HTTP client, which runs on the handler's thread,
/// `http_client_runtime`: the runtime threads of an HTTP client that has its own (none since
/// webhooks run on the handler threads), `relay_client_runtime`: a broker destination's,
/// `chores`: the other worker threads; the benchmark's receiver and its other threads apart),
/// and the database server's processes by `roles` (backend pid → what that connection does,
/// from `pg_stat_activity`), `server` for the rest (WAL writer, checkpointer, ...).
pub fn phases(
    from: &Snapshot,
    to: &Snapshot,
    roles: &HashMap<u32, &'static str>,
    messages: u64,
) -> Value {
    let per_message = |ns: u64| us_per_message(ns as f64 / 1e9, messages);
    let mut worker: std::collections::BTreeMap<&str, u64> = Default::default();
    for (tid, ns) in &to.own {
        let used = ns.saturating_sub(from.own.get(tid).copied().unwrap_or(0));
        let phase = to
            .own_names
            .get(tid)
            .map_or("bench_other", |n| worker_phase(n));
        *worker.entry(phase).or_default() += used;
    }
    let mut database: std::collections::BTreeMap<&str, u64> = Default::default();
    for (tid, ns) in &to.database {
        let used = ns.saturating_sub(from.database.get(tid).copied().unwrap_or(0));
        *database
            .entry(roles.get(tid).copied().unwrap_or("server"))
            .or_default() += used;
    }
    let total = |m: &std::collections::BTreeMap<&str, u64>| m.values().sum::<u64>();
    json!({
        "process_us_per_message": per_message(total(&worker)),
        "process": worker.iter().map(|(k, v)| (k.to_string(), json!(per_message(*v)))).collect::<serde_json::Map<_, _>>(),
        "database_us_per_message": per_message(total(&database)),
        "database": database.iter().map(|(k, v)| (k.to_string(), json!(per_message(*v)))).collect::<serde_json::Map<_, _>>(),
    })
}
