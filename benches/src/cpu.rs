//! Where the CPU went during a phase: the whole machine, this process, its worker processes and
//! the database server, from /proc (clock ticks of 1/100 s).

use std::time::Instant;

use serde_json::{json, Value};

/// Ticks per second of /proc/stat and /proc/<pid>/stat (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// CPU counters at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    machine_busy: u64,
    machine_total: u64,
    own: u64,
    children: u64,
    database: u64,
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

/// utime + stime of a process, and its command name.
fn process(pid: &str) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat[open + 1..close].to_owned();
    let rest: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    // After the name: state is field 3 (index 0 here); utime and stime are fields 14 and 15.
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

fn database_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|pid| process(&pid))
        .filter(|(name, _)| name.starts_with("postgres") || name.starts_with("mariadbd"))
        .map(|(_, ticks)| ticks)
        .sum()
}

/// Takes a snapshot; `children` are worker processes to count separately.
pub fn snapshot(children: &[u32]) -> Snapshot {
    let (machine_busy, machine_total) = machine();
    Snapshot {
        at: Instant::now(),
        machine_busy,
        machine_total,
        own: process("self").map(|(_, t)| t).unwrap_or(0),
        children: children
            .iter()
            .filter_map(|pid| process(&pid.to_string()))
            .map(|(_, t)| t)
            .sum(),
        database: database_ticks(),
    }
}

/// Cores used between two snapshots: the machine, this process, the worker processes, the
/// database server and everything else (other users of the machine).
pub fn used(from: &Snapshot, to: &Snapshot) -> Value {
    let secs = to.at.duration_since(from.at).as_secs_f64().max(1e-3);
    let cores = |ticks: u64| crate::stats::round(ticks as f64 / TICKS / secs, 2);
    let busy_total = to.machine_busy.saturating_sub(from.machine_busy);
    let total = to.machine_total.saturating_sub(from.machine_total).max(1);
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64;
    let machine = busy_total as f64 / total as f64 * ncpu;
    let own = to.own.saturating_sub(from.own);
    let children = to.children.saturating_sub(from.children);
    let database = to.database.saturating_sub(from.database);
    let other = (machine - cores(own) - cores(children) - cores(database)).max(0.0);
    json!({
        "machine_cores_busy": crate::stats::round(machine, 2),
        "of_cores": ncpu,
        "bench_process": cores(own),
        "worker_processes": cores(children),
        "database_server": cores(database),
        "other": crate::stats::round(other, 2),
    })
}
