//! `explain`: the plan of the worker's claim query on a large outbox table (1,000,000 rows by
//! default), fresh, after half the rows were claimed and deleted without a vacuum (autovacuum
//! may be off or behind), and after `VACUUM`. With `--keys K` the rows are spread over K
//! ordering keys and the half-deleted stages give way to the steady state, every message behind
//! its key's head parked. The claim must not scan the table. On PostgreSQL the claim is planned
//! as the worker's claimer plans it (its session without bitmap scans), and the fresh stage also
//! as a session with the server's settings would, for contrast: there a claim larger than the
//! due rows the statistics promise reads every due row and sorts them.

use diesel::mysql::MysqlConnection;
use diesel::pg::PgConnection;
use diesel::sql_types::Text;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryableByName, RunQueryDsl};
use serde_json::{json, Map, Value};

use crate::db::{on_fresh_database, BenchConnection, BenchDb};
use crate::drain::{prefill, Kind};
use crate::library_sql::{
    mysql_candidates_sql, pg_claim_sql, sqlite_candidates_sql, POSTGRES_CLAIMER_SESSION,
};
use crate::report::Report;
use crate::{Backend, Opts, Res, WithContext};

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

#[derive(QueryableByName)]
struct MysqlPlan {
    #[diesel(sql_type = Text, column_name = "ANALYZE")]
    json: String,
}

#[derive(QueryableByName)]
struct SqlitePlan {
    #[diesel(sql_type = Text)]
    detail: String,
}

/// Runs the scenario; returns whether it completed.
pub fn run(opts: &Opts) -> Res<bool> {
    on_fresh_database!(opts, run_on)
}

/// How a PostgreSQL claim is planned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Session {
    /// As the worker's claimer plans it.
    Claimer,
    /// With the server's settings.
    Server,
}

/// The claim's plan, executed and rolled back (PostgreSQL: the whole CTE + UPDATE).
fn plan(db: &BenchDb, limit: usize, session: Session) -> Res<Vec<String>> {
    match db.backend {
        Backend::Postgres => {
            let mut conn = db.connect::<PgConnection>()?;
            let sql = format!("EXPLAIN (ANALYZE, BUFFERS) {}", pg_claim_sql(limit));
            let mut lines = Vec::new();
            let _ = conn.transaction::<(), diesel::result::Error, _>(|c| {
                if session == Session::Claimer {
                    // Set inside the transaction: undone with it.
                    diesel::sql_query(POSTGRES_CLAIMER_SESSION).execute(c)?;
                }
                let rows: Vec<PlanLine> = diesel::sql_query(&sql).load(c)?;
                lines = rows.into_iter().map(|r| r.line).collect();
                Err(diesel::result::Error::RollbackTransaction)
            });
            if lines.is_empty() {
                return Err(crate::failed("EXPLAIN of the claim returned nothing"));
            }
            Ok(lines)
        }
        Backend::Mysql => {
            let mut conn = db.connect::<MysqlConnection>()?;
            let rows: Vec<MysqlPlan> = diesel::sql_query(format!(
                "ANALYZE FORMAT=JSON {}",
                mysql_candidates_sql(limit)
            ))
            .load(&mut conn)
            .ctx("ANALYZE of the claim's candidate query")?;
            Ok(rows
                .into_iter()
                .flat_map(|r| r.json.lines().map(str::to_owned).collect::<Vec<_>>())
                .collect())
        }
        Backend::Sqlite => {
            let mut conn = db.connect::<SqliteConnection>()?;
            let rows: Vec<SqlitePlan> = diesel::sql_query(format!(
                "EXPLAIN QUERY PLAN {}",
                sqlite_candidates_sql(limit)
            ))
            .load(&mut conn)
            .ctx("EXPLAIN QUERY PLAN of the claim")?;
            Ok(rows.into_iter().map(|r| r.detail).collect())
        }
    }
}

/// Whether a PostgreSQL plan reads every due row of a lane, whatever its limit, then sorts them.
fn reads_every_due_row(lines: &[String]) -> bool {
    lines
        .iter()
        .any(|line| line.contains("Bitmap Heap Scan on outbox_message"))
}

/// Whether a plan reads the whole outbox table.
fn scans(backend: Backend, lines: &[String]) -> bool {
    let text = lines.join("\n");
    match backend {
        Backend::Postgres => text.contains("Seq Scan on outbox_message"),
        Backend::Mysql => text.contains("\"access_type\": \"ALL\""),
        Backend::Sqlite => lines
            .iter()
            .any(|l| l.starts_with("SCAN m") || l.starts_with("SCAN outbox_message")),
    }
}

fn run_on<C: BenchConnection>(opts: &Opts, db: &BenchDb) -> Res<bool> {
    let count = opts
        .count
        .unwrap_or(if opts.quick { 20_000 } else { 1_000_000 });
    let limit = opts.claims.largest();
    let keys = opts.keys.first().copied();
    let mut report = Report::new(
        "explain",
        opts,
        json!({
            "rows": count,
            "ordering_keys": keys,
            "claim_limit": limit,
            "query": "the worker's claim (outbox-diesel/src/sql)",
        }),
    );
    let started = std::time::Instant::now();
    prefill::<C>(db, count, keys.map_or(Kind::Hook, Kind::KeyedNoop))?;
    eprintln!(
        "   prefilled {count} rows in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut figures = Map::new();
    let mut any_scan = false;
    let mut any_full_read = false;
    let mut show = |name: &str, session: Session, figures: &mut Map<String, Value>| -> Res<()> {
        let lines = plan(db, limit, session)?;
        let scan = scans(db.backend, &lines);
        let full_read = reads_every_due_row(&lines);
        if session == Session::Claimer {
            any_scan |= scan;
            any_full_read |= full_read;
        }
        eprintln!(
            "   -- {name}{}{}",
            if scan { " (SCANS THE TABLE)" } else { "" },
            if full_read {
                " (READS EVERY DUE ROW)"
            } else {
                ""
            }
        );
        for line in &lines {
            eprintln!("      {line}");
        }
        figures.insert(format!("{name}_scans_table"), json!(scan));
        figures.insert(format!("{name}_reads_every_due_row"), json!(full_read));
        figures.insert(format!("{name}_plan"), json!(lines));
        Ok(())
    };
    if db.backend == Backend::Postgres {
        show("fresh_server_settings", Session::Server, &mut figures)?;
    }
    let mut stage =
        |name: &str, figures: &mut Map<String, Value>| show(name, Session::Claimer, figures);
    stage("fresh", &mut figures)?;
    let mut conn = db.connect::<C>()?;
    if keys.is_some() {
        // Every message behind the head of its key parked, as the first claims leave them.
        let park = match db.backend {
            Backend::Postgres => {
                "UPDATE outbox_message SET parked = TRUE WHERE id NOT IN \
                 (SELECT min(id) FROM outbox_message GROUP BY ordering_key)"
            }
            Backend::Mysql | Backend::Sqlite => {
                "UPDATE outbox_message SET parked = 1 WHERE id NOT IN \
                 (SELECT head FROM (SELECT min(id) AS head FROM outbox_message \
                  GROUP BY ordering_key) AS heads)"
            }
        };
        conn.exec(park)
            .ctx("parking the messages behind the heads")?;
        stage("parked_first_claim", &mut figures)?;
        stage("parked_second_claim", &mut figures)?;
    } else {
        // Half the backlog claimed (leased as a claim does: on PostgreSQL in its own column, on
        // MySQL and SQLite by moving the due time past now) and deleted, as the worker leaves
        // it, without a vacuum.
        let half = count / 2;
        let (claim_half, delete_half) = match db.backend {
            Backend::Postgres => (
                format!(
                    "UPDATE outbox_message SET locked_by = gen_random_uuid(), \
                     attempts = attempts + 1, leased_until = now() + INTERVAL '60 seconds' \
                     WHERE id <= {half}"
                ),
                format!("DELETE FROM outbox_message WHERE id <= {half}"),
            ),
            Backend::Mysql => (
                format!(
                    "UPDATE outbox_message SET locked_by = UUID(), attempts = attempts + 1, \
                     next_attempt_at = TIMESTAMPADD(SECOND, 60, UTC_TIMESTAMP(6)) WHERE id <= {half}"
                ),
                format!("DELETE FROM outbox_message WHERE id <= {half}"),
            ),
            Backend::Sqlite => (
                format!(
                    "UPDATE outbox_message SET locked_by = 'x', attempts = attempts + 1, \
                     next_attempt_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+60 seconds') \
                     WHERE id <= {half}"
                ),
                format!("DELETE FROM outbox_message WHERE id <= {half}"),
            ),
        };
        conn.exec(&claim_half).ctx("leasing half the rows")?;
        conn.exec(&delete_half).ctx("deleting half the rows")?;
        stage("half_deleted_first_claim", &mut figures)?;
        stage("half_deleted_second_claim", &mut figures)?;
    }
    let vacuum = match db.backend {
        Backend::Postgres => "VACUUM ANALYZE outbox_message",
        Backend::Mysql => "ANALYZE TABLE outbox_message",
        Backend::Sqlite => "ANALYZE",
    };
    conn.batch_execute(vacuum).ctx("vacuuming")?;
    stage("after_vacuum", &mut figures)?;
    report.run(figures);
    report.target(
        "claim plans that scan the table",
        if any_scan { 1.0 } else { 0.0 },
        0.0,
        false,
    );
    report.target(
        "claim plans that read every due row",
        if any_full_read { 1.0 } else { 0.0 },
        0.0,
        false,
    );
    Ok(report.finish())
}
