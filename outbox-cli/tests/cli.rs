//! The `outbox` binary against real PostgreSQL, MariaDB and SQLite databases, each test in a
//! fresh database; state is prepared through the library and checked through it afterwards.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use outbox_diesel::admin::{self, dead_letters, pending_messages, DeadLetter, ListOptions};
use outbox_diesel::destination::Answer;
use outbox_diesel::prelude::*;
use outbox_diesel::store::{
    ClaimLimit, ClaimToken, Exchange, Outcome, Settlement, SharedDestinations, Store,
    StoredDestination, SyncedDestination,
};
use outbox_diesel::{DieselStore, EnqueueOptions, Message, MessageId};
use outbox_testkit::outbox::outcome;
use outbox_testkit::{backend_tests, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Serialize, Deserialize)]
struct Alpha {
    n: u32,
}

impl Message for Alpha {
    const MESSAGE_TYPE: &'static str = "cli.alpha";
}

#[derive(Serialize, Deserialize)]
struct Beta {
    n: u32,
}

impl Message for Beta {
    const MESSAGE_TYPE: &'static str = "cli.beta";
}

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts success and returns stdout.
    fn ok(self) -> String {
        assert_eq!(self.code, 0, "{self:#?}");
        assert_eq!(self.stderr, "", "{self:#?}");
        self.stdout
    }

    /// Asserts success and parses stdout as one JSON document.
    fn json(self) -> Value {
        let stdout = self.ok();
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
    }

    /// Asserts failure with exit code 1 and exactly one `error: ` line on stderr; returns it.
    fn error(&self) -> &str {
        assert_eq!(self.code, 1, "{self:#?}");
        let line = self.stderr.strip_suffix('\n').unwrap_or("no newline");
        assert!(
            line.starts_with("error: ") && !line.contains('\n'),
            "one error line: {self:#?}"
        );
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        line
    }
}

/// Runs `outbox --database-url URL ARGS..` with `input` on stdin (none: stdin closed).
fn outbox_with_input(url: &str, args: &[&str], input: Option<&str>) -> Run {
    outbox_with(url, args, input, &[])
}

/// Runs `outbox --database-url URL ARGS..` with `input` on stdin and `vars` in its environment.
fn outbox_with(url: &str, args: &[&str], input: Option<&str>, vars: &[(&str, &str)]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .envs(vars.iter().copied())
        .arg("--database-url")
        .arg(url)
        .args(args)
        .env_remove("DATABASE_URL")
        .env("RUST_BACKTRACE", "1")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the outbox binary");
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("writing stdin");
    }
    let output = child.wait_with_output().expect("running the outbox binary");
    Run {
        code: output.status.code().expect("an exit code, not a signal"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

fn outbox(url: &str, args: &[&str]) -> Run {
    outbox_with_input(url, args, None)
}

fn dead<C: TestConnection>(pool: &TestPool<C>) -> Vec<DeadLetter> {
    dead_letters(&mut pool.get().unwrap(), &ListOptions::new().limit(1000)).unwrap()
}

fn dead_positions<C: TestConnection>(pool: &TestPool<C>) -> Vec<i64> {
    dead(pool).iter().map(|d| d.position).collect()
}

fn pending_count<C: TestConnection>(pool: &TestPool<C>) -> usize {
    pending_messages(&mut pool.get().unwrap(), &ListOptions::new().limit(1000))
        .unwrap()
        .len()
}

/// Claims every due message and dead-letters it with an error naming its type and payload;
/// the long error of `cli.alpha` {"n":2} spans two lines.
fn dead_letter_everything_due<C: TestConnection>(pool: &TestPool<C>) -> usize {
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(100), Duration::from_secs(60))
        .unwrap();
    let outcomes: Vec<Outcome> = claimed
        .iter()
        .map(|m| {
            let error = if m.message_type == "cli.alpha" && m.payload.contains('2') {
                format!("line one of a long error\n{}", "x".repeat(200))
            } else {
                format!("{} failed: {}", m.message_type, m.payload)
            };
            Outcome {
                token,
                position: m.position,
                message_id: m.message_id,
                ordering_key: m.ordering_key.clone(),
                settlement: Settlement::DeadLetter { error },
                log: None,
            }
        })
        .collect();
    assert_eq!(store.settle(&outcomes).unwrap(), Vec::<i64>::new());
    claimed.len()
}

/// The outbox every test but the first starts from:
/// dead letters: cli.beta {1}, cli.alpha {1}, cli.alpha {2} (in this order);
/// pending: cli.alpha {3} (in flight), cli.alpha {4}, cli.beta {2} (ordering key `key-1`).
fn seed<C: TestConnection>(db: &TestDb) -> TestPool<C> {
    let pool = db.pool::<C>(2);
    {
        let mut conn = pool.get().unwrap();
        Beta { n: 1 }.enqueue(&mut conn).unwrap();
        Alpha { n: 1 }.enqueue(&mut conn).unwrap();
        Alpha { n: 2 }.enqueue(&mut conn).unwrap();
    }
    assert_eq!(dead_letter_everything_due(&pool), 3);
    {
        let mut conn = pool.get().unwrap();
        Alpha { n: 3 }.enqueue(&mut conn).unwrap();
        Alpha { n: 4 }.enqueue(&mut conn).unwrap();
        Beta { n: 2 }
            .enqueue_with(&mut conn, &EnqueueOptions::new().ordering_key("key-1"))
            .unwrap();
    }
    let store = DieselStore::new(pool.clone());
    let claimed = store
        .claim(
            ClaimToken::new(),
            ClaimLimit::messages(1),
            Duration::from_secs(600),
        )
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].payload.replace(' ', ""), r#"{"n":3}"#);
    pool
}

/// The table rows (header excluded) of human output, split on whitespace.
fn table_rows(stdout: &str) -> Vec<Vec<&str>> {
    stdout
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect())
        .collect()
}

/// The column names of human output's header line.
fn headers(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect()
}

fn is_short_duration(text: &str) -> bool {
    let digits_then_unit = |part: &str| {
        let unit = part.trim_start_matches(|c: char| c.is_ascii_digit());
        unit.len() < part.len() && ["s", "m", "h", "d"].contains(&unit)
    };
    let mut rest = text;
    let mut parts = 0;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| c.is_alphabetic())
            .map_or(rest.len(), |i| i + 1);
        if !digits_then_unit(&rest[..end]) {
            return false;
        }
        rest = &rest[end..];
        parts += 1;
    }
    (1..=2).contains(&parts)
}

fn migrate_and_missing_tables<C: TestConnection>(db: &TestDb) {
    // The database exists (for SQLite: the file) but holds no outbox tables.
    drop(db.connect::<C>());
    for args in [
        &["stats"][..],
        &["dead", "list"],
        &["--json", "pending", "list"],
    ] {
        let run = outbox(db.url(), args);
        assert_eq!(run.stdout, "", "{run:#?}");
        let error = run.error();
        assert!(
            error.contains("does not exist; run `outbox migrate` first"),
            "{args:?}: {error}"
        );
    }

    // The URL may come from DATABASE_URL.
    let first = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("migrate")
        .env("DATABASE_URL", db.url())
        .output()
        .unwrap();
    assert!(first.status.success(), "{first:?}");
    let stdout = String::from_utf8(first.stdout).unwrap();
    assert!(!stdout.is_empty());
    for line in stdout.lines() {
        let version = line.strip_prefix("applied migration ").unwrap_or_else(|| {
            panic!("unexpected line `{line}` in {stdout}");
        });
        assert!(version.chars().all(|c| c.is_ascii_digit()), "{line}");
    }
    assert!(
        stdout.contains("applied migration 00000000000100\n"),
        "{stdout}"
    );

    assert_eq!(
        outbox(db.url(), &["migrate"]).ok(),
        "the outbox schema is up to date; nothing to apply\n"
    );
    assert_eq!(
        outbox(db.url(), &["--json", "migrate"]).json(),
        json!({ "applied": [] })
    );
    let stats = outbox(db.url(), &["stats"]).ok();
    assert_eq!(
        stats,
        "TYPE   PENDING  IN FLIGHT  DEAD  OLDEST PENDING\n\
         total        0          0     0               -\n"
    );
}

fn stats<C: TestConnection>(db: &TestDb) {
    let _pool = seed::<C>(db);
    let stdout = outbox(db.url(), &["stats"]).ok();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0], "TYPE       PENDING  IN FLIGHT  DEAD  OLDEST PENDING",
        "{stdout}"
    );
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 3, "{stdout}");
    assert_eq!(rows[0][..4], ["cli.alpha", "2", "1", "2"], "{stdout}");
    assert_eq!(rows[1][..4], ["cli.beta", "1", "0", "1"], "{stdout}");
    assert_eq!(rows[2][..4], ["total", "3", "1", "3"], "{stdout}");
    for row in &rows {
        assert_eq!(row.len(), 5, "{stdout}");
        assert!(is_short_duration(row[4]), "an age like 3m12s: {stdout}");
    }
    // Numbers are right-aligned under their headers.
    let dead_end = lines[0].find("DEAD").unwrap() + "DEAD".len();
    for line in &lines[1..] {
        assert!(line.as_bytes()[dead_end - 1].is_ascii_digit(), "{stdout}");
        assert_eq!(line.as_bytes()[dead_end], b' ', "{stdout}");
    }

    let json = outbox(db.url(), &["--json", "stats"]).json();
    let types = json["types"].as_array().unwrap();
    assert_eq!(types.len(), 2, "{json}");
    assert_eq!(types[0]["message_type"], "cli.alpha");
    assert_eq!(
        (
            &types[0]["pending"],
            &types[0]["in_flight"],
            &types[0]["dead"]
        ),
        (&json!(2), &json!(1), &json!(2))
    );
    assert_eq!(types[1]["message_type"], "cli.beta");
    assert_eq!(
        (
            &types[1]["pending"],
            &types[1]["in_flight"],
            &types[1]["dead"]
        ),
        (&json!(1), &json!(0), &json!(1))
    );
    let total = &json["total"];
    assert_eq!(
        (&total["pending"], &total["in_flight"], &total["dead"]),
        (&json!(3), &json!(1), &json!(3))
    );
    let oldest = total["oldest_pending"].as_str().unwrap();
    assert!(oldest.ends_with('Z') && oldest.contains('T'), "{oldest}");
    assert!(total["oldest_pending_age_secs"].as_u64().unwrap() < 300);
    // What holds the database's clean-up back: PostgreSQL and MySQL can tell, SQLite has none.
    let horizon = &json["horizon"];
    match db.backend() {
        outbox_testkit::Backend::Sqlite => assert_eq!(
            horizon,
            &json!({ "oldest_transaction_age_secs": null, "dead_rows": null })
        ),
        _ => assert!(horizon["dead_rows"].is_u64(), "{json}"),
    }
}

fn pending_list<C: TestConnection>(db: &TestDb) {
    let pool = seed::<C>(db);
    let pending =
        pending_messages(&mut pool.get().unwrap(), &ListOptions::new().limit(10)).unwrap();
    assert_eq!(pending.len(), 3);

    let stdout = outbox(db.url(), &["pending", "list"]).ok();
    assert_eq!(
        headers(&stdout),
        [
            "POSITION",
            "MESSAGE ID",
            "TYPE",
            "ATTEMPTS",
            "IN FLIGHT",
            "DUE",
            "ORDERING KEY",
            "LAST ERROR"
        ]
    );
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 3, "{stdout}");
    for (row, message) in rows.iter().zip(&pending) {
        assert_eq!(row[0], message.position.to_string());
        assert_eq!(row[1], message.message_id.to_string());
    }
    // cli.alpha {3}: leased for 600 s.
    assert_eq!(rows[0][2..5], ["cli.alpha", "1", "yes"], "{stdout}");
    assert_eq!(rows[0][5], "in", "{stdout}");
    assert!(
        rows[0][6].starts_with("9m") || rows[0][6] == "10m00s",
        "{stdout}"
    );
    assert_eq!(rows[0][7..], ["-", "-"], "{stdout}");
    assert_eq!(rows[1][2..5], ["cli.alpha", "0", "no"], "{stdout}");
    assert_eq!(rows[2][2..5], ["cli.beta", "0", "no"], "{stdout}");
    assert_eq!(rows[2][rows[2].len() - 2..], ["key-1", "-"], "{stdout}");

    let beta = outbox(db.url(), &["pending", "list", "--type", "cli.beta"]).ok();
    let beta_rows = table_rows(&beta);
    assert_eq!(beta_rows.len(), 1, "{beta}");
    assert_eq!(beta_rows[0][0], pending[2].position.to_string());

    let limited = outbox(db.url(), &["pending", "list", "--limit", "2"]).ok();
    let lines: Vec<&str> = limited.lines().collect();
    assert_eq!(lines.len(), 4, "header, two rows, the note: {limited}");
    assert_eq!(
        lines[3],
        "(only the first 2 shown; raise --limit to see more)"
    );

    assert_eq!(
        outbox(db.url(), &["pending", "list", "--type", "nope"]).ok(),
        "no pending messages of type `nope`\n"
    );

    let json = outbox(db.url(), &["--json", "pending", "list"]).json();
    assert_eq!(json["more"], false);
    let messages = json["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{json}");
    assert_eq!(messages[0]["position"], pending[0].position);
    assert_eq!(messages[0]["message_id"], pending[0].message_id.to_string());
    assert_eq!(messages[0]["in_flight"], true);
    assert_eq!(messages[0]["attempts"], 1);
    assert_eq!(messages[0]["payload"], json!({ "n": 3 }));
    assert_eq!(messages[1]["in_flight"], false);
    assert_eq!(messages[2]["message_type"], "cli.beta");
    assert_eq!(messages[2]["ordering_key"], "key-1");
    assert_eq!(messages[2]["last_error"], Value::Null);
    let due = messages[0]["next_attempt_at"].as_str().unwrap();
    assert!(due.len() == 27 && due.ends_with('Z'), "{due}");

    let json = outbox(db.url(), &["--json", "pending", "list", "--limit", "1"]).json();
    assert_eq!(json["more"], true);
    assert_eq!(json["messages"].as_array().unwrap().len(), 1);
}

fn dead_list_and_show<C: TestConnection>(db: &TestDb) {
    let pool = seed::<C>(db);
    let letters = dead(&pool);
    assert_eq!(letters.len(), 3);
    let [beta1, alpha1, alpha2] = [&letters[0], &letters[1], &letters[2]];

    let stdout = outbox(db.url(), &["dead", "list"]).ok();
    assert_eq!(
        headers(&stdout),
        [
            "POSITION",
            "MESSAGE ID",
            "TYPE",
            "ATTEMPTS",
            "FAILED AT",
            "LAST ERROR"
        ]
    );
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 3, "{stdout}");
    assert_eq!(
        rows[0][..4],
        [
            beta1.position.to_string().as_str(),
            &beta1.message_id.to_string(),
            "cli.beta",
            "1"
        ]
    );
    assert!(
        rows[0][4].ends_with('Z') && rows[0][4].len() == 20,
        "{stdout}"
    );
    assert!(beta1.last_error.starts_with("cli.beta failed: {"));
    assert_eq!(rows[0][5..].join(" "), beta1.last_error, "{stdout}");
    // The long two-line error is cut to one line of at most 60 characters.
    let long_line = stdout.lines().nth(3).unwrap();
    let cut = format!("  line one of a long error {}…", "x".repeat(34));
    assert!(long_line.ends_with(&cut), "{stdout}");

    let alpha = outbox(db.url(), &["dead", "list", "--type", "cli.alpha"]).ok();
    let alpha_rows = table_rows(&alpha);
    assert_eq!(alpha_rows.len(), 2, "{alpha}");
    assert_eq!(alpha_rows[0][0], alpha1.position.to_string());
    assert_eq!(alpha_rows[1][0], alpha2.position.to_string());
    assert_eq!(
        outbox(db.url(), &["dead", "list", "--type", "nope"]).ok(),
        "no dead letters of type `nope`\n"
    );

    let json = outbox(db.url(), &["--json", "dead", "list", "--type", "cli.beta"]).json();
    assert_eq!(json["more"], false);
    let list = json["dead_letters"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{json}");
    assert_eq!(list[0]["position"], beta1.position);
    assert_eq!(list[0]["message_type"], "cli.beta");
    assert_eq!(list[0]["attempts"], 1);
    assert_eq!(list[0]["last_error"], beta1.last_error);
    assert_eq!(list[0]["payload"], json!({ "n": 1 }));
    let json = outbox(db.url(), &["--json", "dead", "list", "--limit", "2"]).json();
    assert_eq!(json["more"], true);
    assert_eq!(json["dead_letters"].as_array().unwrap().len(), 2);

    let position = alpha2.position.to_string();
    let show = outbox(db.url(), &["dead", "show", &position]).ok();
    let expected_start = format!(
        "position      {position}\n\
         message id    {}\n\
         type          cli.alpha\n\
         attempts      1\n\
         ordering key  -\n\
         created at    ",
        alpha2.message_id
    );
    assert!(show.starts_with(&expected_start), "{show}");
    assert!(
        show.contains(&format!(
            "\nlast error    line one of a long error\n              {}\nheaders       -\npayload:\n{{\n  \"n\": 2\n}}\n",
            "x".repeat(200)
        )),
        "{show}"
    );
    assert!(
        show.contains(" ago)\nfailed at     ") || show.contains(" (now)\nfailed at     "),
        "{show}"
    );

    let json = outbox(db.url(), &["--json", "dead", "show", &position]).json();
    assert_eq!(json["position"], alpha2.position);
    assert_eq!(json["message_id"], alpha2.message_id.to_string());
    assert_eq!(json["message_type"], "cli.alpha");
    assert_eq!(json["ordering_key"], Value::Null);
    assert_eq!(json["last_error"], alpha2.last_error);
    assert_eq!(json["payload"], json!({ "n": 2 }));
    assert!(json["failed_at"].as_str().unwrap().ends_with('Z'));

    let unknown = outbox(db.url(), &["dead", "show", "999999"]);
    assert_eq!(unknown.stdout, "");
    assert_eq!(unknown.error(), "error: no dead letter at position 999999");
}

fn requeue<C: TestConnection>(db: &TestDb) {
    let pool = seed::<C>(db);
    let [beta1, alpha1, alpha2] = <[i64; 3]>::try_from(dead_positions(&pool)).unwrap();

    // Dry runs change nothing.
    let dry = outbox(db.url(), &["dead", "requeue", "--all", "--dry-run"]).ok();
    assert!(
        dry.starts_with("would requeue 3 dead letters (dry run: nothing changed)\nPOSITION"),
        "{dry}"
    );
    let listed: Vec<String> = table_rows(&dry[dry.find('\n').unwrap() + 1..])
        .iter()
        .map(|row| row[0].to_owned())
        .collect();
    assert_eq!(listed, [beta1, alpha1, alpha2].map(|p| p.to_string()));
    let dry = outbox(
        db.url(),
        &[
            "--json",
            "dead",
            "requeue",
            "--type",
            "cli.alpha",
            "--dry-run",
        ],
    )
    .json();
    assert_eq!(
        dry,
        json!({"action": "requeue", "dry_run": true, "count": 2,
               "positions": [alpha1, alpha2], "not_found": []})
    );
    assert_eq!(dead_positions(&pool), [beta1, alpha1, alpha2]);
    assert_eq!(pending_count(&pool), 3);

    // One position.
    let alpha1_id = dead(&pool)[1].message_id;
    assert_eq!(
        outbox(db.url(), &["dead", "requeue", &alpha1.to_string()]).ok(),
        format!("requeued 1 dead letter: {alpha1}\n")
    );
    assert_eq!(dead_positions(&pool), [beta1, alpha2]);
    let pending =
        pending_messages(&mut pool.get().unwrap(), &ListOptions::new().limit(10)).unwrap();
    assert_eq!(pending.len(), 4);
    let requeued = pending.iter().find(|m| m.message_id == alpha1_id).unwrap();
    assert_eq!(requeued.attempts, 0);

    // Requeueing it again: it is gone.
    let again = outbox(db.url(), &["dead", "requeue", &alpha1.to_string()]);
    assert_eq!(again.stdout, "");
    assert_eq!(
        again.error(),
        format!("error: no dead letter at position {alpha1}")
    );

    // Several positions, some unknown: the others move, the unknown are reported.
    let partial = outbox(
        db.url(),
        &[
            "--json",
            "dead",
            "requeue",
            &beta1.to_string(),
            "999998",
            "999999",
        ],
    );
    assert_eq!(
        partial.error(),
        "error: no dead letter at positions 999998, 999999"
    );
    let partial: Value = serde_json::from_str(&partial.stdout).unwrap();
    assert_eq!(
        partial,
        json!({"action": "requeue", "dry_run": false, "count": 1,
               "positions": [beta1], "not_found": [999998, 999999]})
    );
    assert_eq!(dead_positions(&pool), [alpha2]);

    // By type: nothing of another type moves.
    assert_eq!(
        outbox(db.url(), &["dead", "requeue", "--type", "cli.beta"]).ok(),
        "requeued 0 dead letters\n"
    );
    assert_eq!(
        outbox(db.url(), &["dead", "requeue", "--type", "cli.alpha"]).ok(),
        format!("requeued 1 dead letter: {alpha2}\n")
    );
    assert!(dead_positions(&pool).is_empty());
    assert_eq!(pending_count(&pool), 6);

    // Everything: the five due messages die again, then all come back.
    assert_eq!(dead_letter_everything_due(&pool), 5);
    let positions = dead_positions(&pool);
    assert_eq!(positions.len(), 5);
    let all = outbox(db.url(), &["--json", "dead", "requeue", "--all"]).json();
    assert_eq!(
        all,
        json!({"action": "requeue", "dry_run": false, "count": 5,
               "positions": positions, "not_found": []})
    );
    assert!(dead_positions(&pool).is_empty());
    assert_eq!(pending_count(&pool), 6);
}

fn purge<C: TestConnection>(db: &TestDb) {
    let pool = seed::<C>(db);
    let [beta1, alpha1, alpha2] = <[i64; 3]>::try_from(dead_positions(&pool)).unwrap();

    // Declined, or no answer at all: nothing is purged.
    for input in [Some("n\n"), Some("\n"), Some("nope\n"), None] {
        let run = outbox_with_input(db.url(), &["dead", "purge", "--all"], input);
        assert_eq!(run.code, 1, "{input:?}: {run:#?}");
        assert_eq!(run.stdout, "", "{run:#?}");
        assert_eq!(
            run.stderr, "Purge 3 dead letters? [y/N] \nerror: aborted: nothing was purged\n",
            "{input:?}"
        );
        assert_eq!(dead_positions(&pool), [beta1, alpha1, alpha2]);
    }

    let dry = outbox(
        db.url(),
        &["dead", "purge", "--type", "cli.alpha", "--dry-run"],
    )
    .ok();
    assert!(
        dry.starts_with("would purge 2 dead letters (dry run: nothing changed)\nPOSITION"),
        "{dry}"
    );
    assert_eq!(
        table_rows(&dry[dry.find('\n').unwrap() + 1..]).len(),
        2,
        "{dry}"
    );
    assert_eq!(dead_positions(&pool), [beta1, alpha1, alpha2]);

    // Confirmed on stdin.
    let run = outbox_with_input(
        db.url(),
        &["dead", "purge", &alpha1.to_string()],
        Some("yes\n"),
    );
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(run.stderr, "Purge 1 dead letter? [y/N] \n");
    assert_eq!(run.stdout, format!("purged 1 dead letter: {alpha1}\n"));
    assert_eq!(dead_positions(&pool), [beta1, alpha2]);

    assert_eq!(
        outbox(db.url(), &["dead", "purge", "--type", "cli.alpha", "--yes"]).ok(),
        format!("purged 1 dead letter: {alpha2}\n")
    );
    assert_eq!(dead_positions(&pool), [beta1]);

    let unknown = outbox(db.url(), &["dead", "purge", "999999", "--yes"]);
    assert_eq!(unknown.stdout, "");
    assert_eq!(unknown.error(), "error: no dead letter at position 999999");
    assert_eq!(dead_positions(&pool), [beta1]);

    assert_eq!(
        outbox(db.url(), &["--json", "dead", "purge", "--all", "--yes"]).json(),
        json!({"action": "purge", "dry_run": false, "count": 1,
               "positions": [beta1], "not_found": []})
    );
    assert!(dead_positions(&pool).is_empty());
    assert_eq!(pending_count(&pool), 3, "pending messages are not touched");
    assert_eq!(
        outbox(db.url(), &["dead", "purge", "--all"]).ok(),
        "purged 0 dead letters\n",
        "nothing to purge asks nothing"
    );
}

/// A dead letter's error text is a receiver's answer: whatever it holds must not drive the
/// operator's terminal (retitle it, clear it, reorder text) when shown.
fn dead_show_escapes_terminal_controls<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(2);
    Alpha { n: 1 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let hostile =
        "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{1b}[31mred\u{1b}[0m \u{9b}31m \u{202e}evil\r\nsecond line";
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
        .unwrap();
    let error = hostile.to_owned();
    let dead_letter = outcome(token, &claimed[0], Settlement::DeadLetter { error });
    assert_eq!(store.settle(&[dead_letter]).unwrap(), Vec::<i64>::new());
    let position = claimed[0].position.to_string();

    for args in [vec!["dead", "show", &position], vec!["dead", "list"]] {
        let stdout = outbox(db.url(), &args).ok();
        for control in ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\r'] {
            assert!(
                !stdout.contains(control),
                "{args:?} printed {control:?} raw: {stdout:?}"
            );
        }
        assert!(stdout.contains("red"), "{stdout}");
    }
    let shown = outbox(db.url(), &["dead", "show", &position]).ok();
    assert!(shown.contains("\\u{1b}[31mred"), "escaped visibly: {shown}");
    assert!(
        shown.lines().any(|line| line.trim() == "second line"),
        "newlines still break lines: {shown}"
    );
    // JSON keeps the text exactly (escaped the JSON way).
    let json = outbox(db.url(), &["--json", "dead", "show", &position]).json();
    assert_eq!(json["last_error"], hostile);
}

/// `outbox show` finds a message by id wherever it is, with its headers; an unknown id is one
/// error line.
fn show_by_message_id<C: TestConnection>(db: &TestDb) {
    let pool = seed::<C>(db);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = Alpha { n: 9 }
        .enqueue_with(
            &mut pool.get().unwrap(),
            &EnqueueOptions::new()
                .ordering_key("key-9")
                .header("traceparent", traceparent),
        )
        .unwrap();
    let shown = outbox(db.url(), &["show", &traced.to_string()]).ok();
    assert!(shown.starts_with("pending in the outbox\n"), "{shown}");
    for line in [
        format!("message id    {traced}"),
        "state         waiting".to_owned(),
        "ordering key  key-9".to_owned(),
        format!("headers       traceparent: {traceparent}"),
    ] {
        assert!(shown.lines().any(|l| l == line), "{line:?} in {shown}");
    }
    let json = outbox(db.url(), &["--json", "show", &traced.to_string()]).json();
    assert_eq!(json["state"], "pending");
    assert_eq!(
        json["message"]["headers"],
        json!({"traceparent": traceparent})
    );
    assert_eq!(json["message"]["payload"], json!({"n": 9}));

    let letter = &dead(&pool)[0];
    let json = outbox(
        db.url(),
        &["--json", "show", &letter.message_id.to_string()],
    )
    .json();
    assert_eq!(json["state"], "dead");
    assert_eq!(json["message"]["position"], letter.position);
    assert_eq!(json["message"]["headers"], json!({}));
    // One serialized form: what the admin pages' JSON API answers (issue 25, item 17).
    assert_eq!(json["message"], serde_json::to_value(letter).unwrap());
    let shown = outbox(db.url(), &["show", &letter.message_id.to_string()]).ok();
    assert!(shown.starts_with("dead-lettered\n"), "{shown}");

    let unknown = outbox_diesel::MessageId::new();
    let run = outbox(db.url(), &["show", &unknown.to_string()]);
    assert_eq!(
        run.error(),
        format!(
            "error: no message {unknown} in the outbox or the dead letters (delivered, purged, \
             or never enqueued)"
        )
    );
    assert_eq!(outbox(db.url(), &["show", "not-a-uuid"]).code, 2);
}

/// `outbox blocked` lists the keys whose head failed and waits, with how many wait behind it;
/// a key whose head never failed, and a failed message without a key, are not blocked.
fn blocked_keys<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(2);
    assert_eq!(
        outbox(db.url(), &["blocked"]).ok(),
        "no blocked ordering keys\n"
    );
    {
        let mut conn = pool.get().unwrap();
        for n in 0..4 {
            Alpha { n }
                .enqueue_with(&mut conn, &EnqueueOptions::new().ordering_key("stuck"))
                .unwrap();
        }
        Alpha { n: 10 }
            .enqueue_with(&mut conn, &EnqueueOptions::new().ordering_key("fine"))
            .unwrap();
        Beta { n: 11 }.enqueue(&mut conn).unwrap();
    }
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(100), Duration::from_secs(60))
        .unwrap();
    let outcomes: Vec<Outcome> = claimed
        .iter()
        .filter(|m| m.ordering_key.as_deref() != Some("fine"))
        .map(|m| {
            let settlement = Settlement::Retry {
                delay: Duration::from_secs(3600),
                error: format!("receiver said no to {}", m.payload),
            };
            outcome(token, m, settlement)
        })
        .collect();
    assert_eq!(outcomes.len(), 2, "the head of `stuck` and the keyless one");
    store.settle(&outcomes).unwrap();

    let json = outbox(db.url(), &["--json", "blocked"]).json();
    let keys = json["blocked_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{json}");
    assert_eq!(keys[0]["ordering_key"], "stuck");
    assert_eq!(keys[0]["waiting"], 3);
    assert_eq!(keys[0]["attempts"], 1);
    assert!(keys[0]["last_error"]
        .as_str()
        .unwrap()
        .starts_with("receiver said no"));
    assert_eq!(json["more"], false);
    let table = outbox(db.url(), &["blocked"]).ok();
    assert_eq!(
        headers(&table),
        [
            "ORDERING KEY",
            "WAITING",
            "HEAD",
            "TYPE",
            "ATTEMPTS",
            "NEXT ATTEMPT",
            "LAST ERROR"
        ]
    );
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 1, "{table}");
    assert_eq!(rows[0][..2], ["stuck", "3"]);
}

/// A bulk purge's dry run reads positions, shows the first 50 and counts the rest.
fn a_large_dry_run_shows_the_first_dead_letters_and_counts_the_rest<C: TestConnection>(
    db: &TestDb,
) {
    let pool = db.pool::<C>(2);
    {
        let mut conn = pool.get().unwrap();
        let mut batch = outbox_diesel::Batch::new();
        for n in 0..80 {
            batch.push(&Alpha { n }).unwrap();
        }
        batch.enqueue(&mut conn).unwrap();
    }
    assert_eq!(dead_letter_everything_due(&pool), 80);
    let dry = outbox(db.url(), &["dead", "purge", "--all", "--dry-run"]).ok();
    assert!(
        dry.starts_with("would purge 80 dead letters (dry run: nothing changed)\n"),
        "{dry}"
    );
    assert!(dry.ends_with("… and 30 more dead letters\n"), "{dry}");
    assert_eq!(dry.lines().filter(|l| l.contains("cli.alpha")).count(), 50);
    let json = outbox(
        db.url(),
        &["--json", "dead", "requeue", "--all", "--dry-run"],
    )
    .json();
    assert_eq!(json["count"], 80);
    assert_eq!(json["positions"].as_array().unwrap().len(), 80);
    assert_eq!(dead(&pool).len(), 80, "a dry run changes nothing");
}

/// `outbox destinations` shows what the workers recorded; `destination disable|enable` changes
/// it in the store, where the workers' next sync reads it (the disable with its reason, the
/// enable as one more enable to follow); an unknown name is one clear error; reasons are shown
/// escaped.
fn destinations<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(2);
    assert!(outbox(db.url(), &["destinations"])
        .ok()
        .starts_with("no destinations reported"));
    let store = DieselStore::new(pool.clone());
    // What a worker's sync does with destinations it has not recorded yet: records them
    // healthy, with their kind.
    let mut seen = Vec::new();
    let sync = |seen: &mut Vec<StoredDestination>| {
        let synced = [
            SyncedDestination::new("mail", "webhook"),
            SyncedDestination::new("billing", "rabbitmq"),
        ];
        store
            .sync_destinations(&synced, &mut |stored| {
                *seen = stored.to_vec();
                Vec::new()
            })
            .unwrap();
    };
    sync(&mut seen);
    assert_eq!(
        seen,
        [
            StoredDestination::new("billing", None, 0),
            StoredDestination::new("mail", None, 0)
        ]
    );
    let table = outbox(db.url(), &["destinations"]).ok();
    assert_eq!(
        headers(&table),
        [
            "DESTINATION",
            "KIND",
            "STATE",
            "FAILURES",
            "NEXT PROBE",
            "REPORTED",
            "DETAIL"
        ]
    );
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 2, "{table}");
    assert_eq!(rows[0][..5], ["billing", "rabbitmq", "healthy", "0", "-"]);
    assert_eq!(rows[1][..5], ["mail", "webhook", "healthy", "0", "-"]);

    let reason = "partner maintenance \u{1b}[31still red";
    let disabled = outbox(
        db.url(),
        &["destination", "disable", "mail", "--reason", reason],
    )
    .ok();
    assert!(
        disabled.starts_with("disabled destination mail"),
        "{disabled}"
    );
    let table = outbox(db.url(), &["destinations"]).ok();
    assert!(!table.contains('\u{1b}'), "{table:?}");
    let json = outbox(db.url(), &["--json", "destinations"]).json();
    assert_eq!(json["destinations"][1]["name"], "mail");
    assert_eq!(json["destinations"][1]["kind"], "webhook");
    assert_eq!(json["destinations"][1]["state"], "disabled");
    assert_eq!(json["destinations"][1]["disabled_reason"], reason);
    assert_eq!(json["destinations"][0]["state"], "healthy");
    assert!(json["destinations"][1]["reported_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    sync(&mut seen);
    assert_eq!(
        seen[1],
        StoredDestination::new("mail", Some(reason.into()), 0)
    );
    // Disabling twice changes nothing but is no error (a row that matched, on MySQL too).
    outbox(
        db.url(),
        &["destination", "disable", "mail", "--reason", reason],
    )
    .ok();

    let enabled = outbox(db.url(), &["destination", "enable", "mail"]).ok();
    assert!(enabled.starts_with("enabled destination mail"), "{enabled}");
    sync(&mut seen);
    assert_eq!(seen[1], StoredDestination::new("mail", None, 1));
    let json = outbox(db.url(), &["--json", "destination", "enable", "mail"]).json();
    assert_eq!(json, json!({ "enabled": "mail" }));
    sync(&mut seen);
    assert_eq!(seen[1].enables, 2, "each enable counts");
    assert_eq!(
        admin::destinations(&mut pool.get().unwrap()).unwrap()[1].state,
        "healthy"
    );

    let unknown = outbox(db.url(), &["destination", "enable", "nobody"]);
    assert_eq!(
        unknown.error(),
        "error: no destination named `nobody` has been reported by a worker (`outbox \
         destinations` lists those that have)"
    );
    assert_eq!(
        outbox(db.url(), &["destination", "disable", "nobody"]).code,
        1
    );

    // The longest name a destination may have fits the store whole, on every backend.
    let longest = "é".repeat(outbox_diesel::destination::MAX_DESTINATION_NAME);
    store
        .sync_destinations(&[SyncedDestination::new(&longest, "webhook")], &mut |_| {
            Vec::new()
        })
        .unwrap();
    let names: Vec<String> = admin::destinations(&mut pool.get().unwrap())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&longest), "{names:?}");
}

/// `outbox pause`, `resume` and `paused`, on a database where a worker paused cli.alpha {4}.
fn pauses<C: TestConnection>(db: &TestDb) {
    let pool = seed::<C>(db);
    assert_eq!(outbox(db.url(), &["paused"]).ok(), "nothing is paused\n");
    let reason = "incident \u{1b}[31m7";
    let paused = outbox(db.url(), &["pause", "cli.alpha", "--reason", reason]).ok();
    assert!(
        paused.starts_with("paused message type cli.alpha: within a few seconds")
            && paused.contains("`outbox resume cli.alpha`"),
        "{paused}"
    );
    let again = outbox(db.url(), &["pause", "cli.alpha"]).ok();
    assert!(again.contains("was paused already"), "{again}");
    let json = outbox(db.url(), &["--json", "pause", "--destination", "mail"]).json();
    assert_eq!(
        json,
        json!({ "paused": { "kind": "destination", "name": "mail" }, "already_paused": false })
    );
    // What a worker does with a claimed message of a paused type.
    let store = DieselStore::new(pool.clone());
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(10), Duration::from_secs(60))
        .unwrap();
    let alpha = claimed
        .iter()
        .find(|m| m.message_type == "cli.alpha")
        .unwrap();
    let settled = store
        .settle(&[outcome(
            token,
            alpha,
            Settlement::Pause {
                reason: "paused".into(),
            },
        )])
        .unwrap();
    assert!(settled.is_empty());
    // It holds connections of the pool's two.
    drop(store);

    let table = outbox(db.url(), &["paused"]).ok();
    assert_eq!(headers(&table), ["KIND", "NAME", "SINCE", "REASON"]);
    assert!(!table.contains('\u{1b}'), "{table:?}");
    let rows = table_rows(&table);
    assert_eq!((rows[0][0], rows[0][1]), ("destination", "mail"));
    assert_eq!((rows[1][0], rows[1][1]), ("type", "cli.alpha"));
    let json = outbox(db.url(), &["--json", "paused"]).json();
    assert_eq!(
        json["paused"],
        serde_json::to_value(admin::pauses(&mut pool.get().unwrap()).unwrap()).unwrap()
    );
    assert_eq!(json["paused"][1]["reason"], reason);
    assert!(json["paused"][1]["paused_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    let resumed = outbox(db.url(), &["resume", "cli.alpha"]).ok();
    assert!(
        resumed.starts_with("resumed message type cli.alpha: 1 paused messages are due again"),
        "{resumed}"
    );
    let not_paused = outbox(db.url(), &["resume", "cli.alpha"]);
    assert_eq!(
        (not_paused.code, not_paused.error()),
        (
            1,
            "error: message type cli.alpha is not paused (`outbox paused` lists what is)"
        )
    );
    let json = outbox(db.url(), &["--json", "resume", "--destination", "mail"]).json();
    assert_eq!(
        json,
        json!({ "resumed": { "kind": "destination", "name": "mail" }, "released": 0 })
    );
    // One target, exactly: a usage error otherwise; a name no type could have is an error.
    assert_eq!(outbox(db.url(), &["pause"]).code, 2);
    assert_eq!(
        outbox(db.url(), &["pause", "a", "--destination", "b"]).code,
        2
    );
    let bad = outbox(db.url(), &["pause", "a\nb"]);
    assert_eq!(bad.code, 1);
    assert!(
        bad.error().contains("without control characters"),
        "{}",
        bad.error()
    );
}

/// The key the tests encrypt subscriptions' secrets with, as `OUTBOX_SECRET_KEYS` gives it.
const SECRET_KEYS: &str = "test-key:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";

fn subscriptions<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(3);
    let url = db.url();
    let run = |args: &[&str]| outbox_with(url, args, None, &[("OUTBOX_SECRET_KEYS", SECRET_KEYS)]);
    let added = run(&[
        "subscription",
        "add",
        "https://127.0.0.1/hooks",
        "--event-type",
        "invoice.*,order.paid",
        "--owner",
        "42",
        "--rate-limit",
        "5",
        "--metadata",
        r#"{"plan":"pro"}"#,
        "--allow-address",
        "127.0.0.1",
        "--json",
    ])
    .json();
    let id = added["subscription"]["id"].as_str().unwrap().to_owned();
    let secret = added["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{added}");
    assert_eq!(
        added["subscription"]["event_types"],
        json!(["invoice.*", "order.paid"])
    );
    assert_eq!(added["subscription"]["metadata"], json!({"plan": "pro"}));

    let listed = run(&["subscription", "list"]).ok();
    assert!(
        listed.contains(&id) && listed.contains("enabled"),
        "{listed}"
    );
    assert!(!listed.contains(&secret[6..]), "{listed}");
    let of = |owner: &str| {
        run(&["subscription", "list", "--owner", owner, "--json"]).json()["subscriptions"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!((of("42"), of("43")), (1, 0));
    let shown = run(&["subscription", "show", &id]).ok();
    assert!(
        shown.contains("5/s") && shown.contains("invoice.*"),
        "{shown}"
    );
    assert!(!shown.contains(&secret[6..]), "{shown}");

    run(&["subscription", "disable", &id]).ok();
    let get = || {
        outbox_diesel::subscription::get(&mut pool.get().unwrap(), &id)
            .unwrap()
            .unwrap()
    };
    assert!(!get().enabled);
    run(&["subscription", "enable", &id]).ok();
    assert!(get().enabled);

    let rotated = run(&[
        "subscription",
        "rotate-secret",
        &id,
        "--overlap",
        "1h",
        "--json",
    ])
    .json();
    let new = rotated["secret"].as_str().unwrap();
    assert!(new.starts_with("whsec_") && new != secret);
    assert!(get().previous_secret_until.is_some());

    let refused = run(&[
        "subscription",
        "add",
        "http://example.com/h",
        "--event-type",
        "*",
    ]);
    assert!(refused.error().contains("http://"), "{}", refused.error());
    let refused = run(&[
        "subscription",
        "add",
        "https://10.0.0.1/h",
        "--event-type",
        "*",
    ]);
    assert!(
        refused.error().contains("special-purpose"),
        "{}",
        refused.error()
    );

    run(&["subscription", "remove", &id]).ok();
    assert!(
        outbox_diesel::subscription::get(&mut pool.get().unwrap(), &id)
            .unwrap()
            .is_none()
    );
    let missing = run(&["subscription", "remove", &id]);
    assert!(
        missing.error().contains("no subscription"),
        "{}",
        missing.error()
    );
}

/// `outbox cancel`: removes the pending messages named, never one being delivered (it is
/// counted), never a dead letter; says how many; refuses a cancel without a reason.
fn cancel<C: TestConnection>(db: &TestDb) {
    let pool = seed::<C>(db);
    let json = outbox(
        db.url(),
        &[
            "--json",
            "cancel",
            "--type",
            "cli.alpha",
            "--reason",
            "wrong run",
        ],
    )
    .json();
    assert_eq!(
        json,
        json!({ "cancelled": 1, "in_flight": 1, "reason": "wrong run" }),
        "alpha 4 cancelled, alpha 3 (claimed) left alone"
    );
    assert_eq!(pending_count(&pool), 2);
    assert_eq!(dead(&pool).len(), 3, "no dead letter was made or taken");
    let text = outbox(
        db.url(),
        &["cancel", "--type", "cli.beta", "--reason", "wrong run"],
    )
    .ok();
    assert_eq!(text, "cancelled 1 messages\n");
    let again = outbox(
        db.url(),
        &["cancel", "--type", "cli.alpha", "--reason", "again"],
    )
    .ok();
    assert!(
        again.starts_with("cancelled 0 messages\n1 more are being delivered right now"),
        "{again}"
    );
    let refused = outbox(
        db.url(),
        &["cancel", "--type", "cli.alpha", "--reason", " "],
    );
    assert!(refused.error().contains("give a reason"), "{refused:?}");
    assert_eq!(outbox(db.url(), &["cancel", "--reason", "r"]).code, 2);
    assert_eq!(pending_count(&pool), 1);
}

/// `outbox attempts`: a message's exchanges from the delivery log, newest first, as a table and
/// as JSON; filters by destination and failures; an unknown message has none.
fn attempts<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(2);
    let id = Alpha { n: 7 }.enqueue(&mut pool.get().unwrap()).unwrap();
    let store = DieselStore::new(pool.clone());
    let exchange =
        |outcome: &'static str, status: u16, answer: &str, error: Option<&str>| Exchange {
            destination: "crm".to_owned(),
            outcome,
            answer: Some(Answer::new(Some(status), answer)),
            error: error.map(str::to_owned),
            started_at: SystemTime::now(),
            latency: Duration::from_millis(12),
        };
    for (attempt, settlement, exchanged) in [
        (
            1,
            Settlement::Retry {
                delay: Duration::ZERO,
                error: "503".into(),
            },
            exchange("failed", 503, "busy", Some("webhook answered 503")),
        ),
        (2, Settlement::Done, exchange("delivered", 200, "ok", None)),
    ] {
        let token = ClaimToken::new();
        let claimed = store
            .claim(token, ClaimLimit::messages(1), Duration::from_secs(60))
            .unwrap();
        assert_eq!(claimed.len(), 1, "attempt {attempt}");
        assert_eq!(claimed[0].attempt, attempt);
        let done = outcome(token, &claimed[0], settlement).logging(&claimed[0], vec![exchanged]);
        assert_eq!(store.settle(&[done]).unwrap(), Vec::<i64>::new());
    }

    let json = outbox(db.url(), &["--json", "attempts", &id.to_string()]).json();
    let attempts = json["attempts"].as_array().expect("a list");
    let seen: Vec<(u64, &str, u64, &str)> = attempts
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["status"].as_u64().unwrap(),
                a["answer"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [(2, "delivered", 200, "ok"), (1, "failed", 503, "busy")]
    );
    assert_eq!(attempts[1]["error"], "webhook answered 503");
    assert_eq!(attempts[0]["message_id"], id.to_string());
    assert_eq!(attempts[0]["destination"], "crm");
    assert_eq!(attempts[0]["latency_ms"], 12.0);
    assert!(attempts[0]["started_at"].as_str().unwrap().ends_with('Z'));

    let text = outbox(
        db.url(),
        &["attempts", "--destination", "crm", "--failures"],
    )
    .ok();
    let rows = table_rows(&text);
    assert_eq!(rows.len(), 1, "{text}");
    assert!(text.contains("webhook answered 503"), "{text}");
    let none = outbox(db.url(), &["attempts", "--destination", "billing"]).ok();
    assert!(none.starts_with("no attempts logged"), "{none}");
    let since = outbox(db.url(), &["--json", "attempts", "--since", "1h"]).json();
    assert_eq!(since["attempts"].as_array().unwrap().len(), 2);
    let later = outbox(db.url(), &["--json", "attempts", "--until", "1h"]).json();
    assert_eq!(later["attempts"], json!([]));
    assert_eq!(
        outbox(db.url(), &["attempts", "--since", "yesterday-ish"]).code,
        2
    );
}

/// `outbox replay` and `outbox resend`: archived messages enqueued again, with their ids, to
/// the destination named; what cannot be replayed is one error line; a target is required.
fn replay_and_resend<C: TestConnection>(db: &TestDb) {
    let pool = db.pool::<C>(4);
    let ids: Vec<MessageId> = (0..2)
        .map(|n| Alpha { n }.enqueue(&mut pool.get().unwrap()).unwrap())
        .collect();
    let store = DieselStore::new(pool.clone()).archive(Duration::from_secs(3600));
    store
        .sync_destinations(&[SyncedDestination::new("crm", "webhook")], &mut |_| {
            Vec::new()
        })
        .unwrap();
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(10), Duration::from_secs(60))
        .unwrap();
    let done: Vec<Outcome> = claimed
        .iter()
        .map(|m| outcome(token, m, Settlement::Done))
        .collect();
    assert_eq!(store.settle(&done).unwrap(), Vec::<i64>::new());
    // The store holds its connections per role until dropped.
    drop(store);
    assert_eq!(pending_count(&pool), 0);

    let json = outbox(
        db.url(),
        &["--json", "replay", "--destination", "crm", "--since", "1h"],
    )
    .json();
    assert_eq!(json, json!({ "enqueued": 2, "skipped": 0 }));
    let replayed: Vec<MessageId> = pending_messages(&mut pool.get().unwrap(), &ListOptions::new())
        .unwrap()
        .iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(replayed, ids, "with their ids, in order");
    let text = outbox(
        db.url(),
        &["resend", &ids[0].to_string(), "--destination", "crm"],
    )
    .ok();
    assert_eq!(
        text,
        "enqueued 1 deliveries to destination crm, with their original ids\n"
    );
    assert_eq!(pending_count(&pool), 3);
    let unknown = outbox(
        db.url(),
        &[
            "resend",
            &MessageId::new().to_string(),
            "--destination",
            "crm",
        ],
    );
    assert!(
        unknown.error().contains("not in the archive"),
        "{unknown:?}"
    );
    let nowhere = outbox(
        db.url(),
        &["replay", "--destination", "billing", "--since", "1h"],
    );
    assert!(nowhere.error().contains("`billing`"), "{nowhere:?}");
    assert_eq!(outbox(db.url(), &["replay", "--since", "1h"]).code, 2);
    assert_eq!(pending_count(&pool), 3, "nothing refused was enqueued");
}

backend_tests!(
    attempts,
    replay_and_resend,
    cancel,
    subscriptions,
    pauses,
    destinations,
    show_by_message_id,
    blocked_keys,
    a_large_dry_run_shows_the_first_dead_letters_and_counts_the_rest,
    dead_show_escapes_terminal_controls,
    migrate_and_missing_tables,
    stats,
    pending_list,
    dead_list_and_show,
    requeue,
    purge,
);

#[test]
fn a_url_with_an_unknown_scheme_is_refused() {
    let run = outbox("redis://user:secret@localhost/0", &["stats"]);
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.error(),
        "error: unsupported database URL `redis://user:***@localhost/0`: use postgres://, \
         postgresql://, mysql://, sqlite://PATH, file:PATH or a plain SQLite path"
    );
}

#[test]
fn an_unreachable_server_is_one_error_line() {
    for url in [
        "postgres://postgres:hunter2@127.0.0.1:1/x",
        "mysql://root:hunter2@127.0.0.1:1/x",
    ] {
        let run = outbox(url, &["stats"]);
        assert_eq!(run.stdout, "");
        let error = run.error();
        let shown = url.replace("hunter2", "***");
        assert!(
            error.starts_with(&format!("error: cannot connect to {shown}: ")),
            "{run:#?}"
        );
        assert!(!error.contains("hunter2"), "{run:#?}");
    }
}

#[test]
fn a_missing_sqlite_file_is_not_created_by_a_read() {
    let path = std::env::temp_dir().join(format!("outbox-cli-missing-{}.db", std::process::id()));
    let path = path.to_str().unwrap();
    let run = outbox(path, &["dead", "list"]);
    assert_eq!(
        run.error(),
        format!("error: no SQLite database at `{path}` (`outbox migrate` creates it)")
    );
    assert!(!std::path::Path::new(path).exists());
}

#[test]
fn usage_errors_exit_with_2() {
    let missing_url = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("stats")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(missing_url.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing_url.stderr)
        .starts_with("error: no database: pass --database-url URL or set DATABASE_URL"));
    for args in [
        &["dead", "requeue"][..],
        &["dead", "requeue", "1", "--all"],
        &["dead", "purge", "--type", "a", "--all", "--yes"],
        &["dead", "show"],
        &["pending", "list", "--limit", "-1"],
    ] {
        let run = outbox("x.db", args);
        assert_eq!(run.code, 2, "{args:?}: {run:#?}");
        assert_eq!(run.stdout, "");
        assert!(run.stderr.starts_with("error: "), "{run:#?}");
    }
}
