//! The worker's metrics as an application sees them: a Prometheus recorder installed for the
//! process, its text rendered and read back. One test drives the three backends in turn,
//! because the recorder is global to the test binary and each step reads its deltas.

use std::collections::HashMap;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox_diesel::admin::{self, PauseKind};
use outbox_diesel::metrics::{
    ATTEMPT_DURATION, CLAIMED, DELIVERY_LAG, IN_FLIGHT, MESSAGES_PROCESSED, OLDEST_DUE_AGE,
    OPERATOR_PAUSED, PENDING, SETTLEMENTS,
};
use outbox_diesel::prelude::*;
use outbox_diesel::{
    outbox_handler, Batch, Context, DieselStore, EnqueueOptions, Message, ProcessError, Worker,
};
use outbox_testkit::{eventually, with_connection, Backend, TestConnection, TestDb};
use serde::{Deserialize, Serialize};

const TYPE: &str = "metrics.job";

/// A type no handler of the worker serves: its string must never become a label value.
#[derive(Serialize, Deserialize)]
struct Stray;

impl Message for Stray {
    const MESSAGE_TYPE: &'static str = "metrics.stray.b7c1";
}

#[outbox_handler("metrics.job")]
#[derive(Debug, Serialize, Deserialize)]
struct Job {
    fail: bool,
}

impl Handler for Job {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        if self.fail {
            return Err(ProcessError::permanent("this one fails"));
        }
        std::thread::sleep(Duration::from_millis(5));
        Ok(())
    }
}

/// The samples of a Prometheus text rendering, by name and labels as written
/// (`name{a="1",b="2"}`).
fn samples(handle: &PrometheusHandle) -> HashMap<String, f64> {
    handle
        .render()
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn sample(samples: &HashMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

fn processed(outcome: &str) -> String {
    format!("{MESSAGES_PROCESSED}{{type=\"{TYPE}\",outcome=\"{outcome}\"}}")
}

fn run<C: TestConnection>(db: &TestDb, handle: &PrometheusHandle) {
    let pool = db.pool::<C>(9);
    let mut batch = Batch::new();
    for i in 0..7 {
        batch.push(&Job { fail: i >= 5 }).unwrap();
    }
    batch.enqueue(&mut pool.get().unwrap()).unwrap();
    Stray.enqueue(&mut pool.get().unwrap()).unwrap();
    Job { fail: false }
        .enqueue_with(
            &mut pool.get().unwrap(),
            &EnqueueOptions::new().delay(Duration::from_secs(3600)),
        )
        .unwrap();
    let before = samples(handle);

    // The first sample of the backlog is taken at start, before the first claim: all nine.
    // The stray type is dead-lettered at once (no grace).
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(2)
        .backlog_interval(Duration::from_secs(3600))
        .unknown_type_grace(Duration::ZERO)
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || worker.stats().succeeded
            + worker.stats().dead_lettered
            == 8),
        "{:?}",
        worker.stats()
    );
    let after = samples(handle);
    assert_eq!(sample(&after, PENDING), 9.0, "sampled at start");
    let delta = |series: &str| sample(&after, series) - sample(&before, series);
    assert_eq!(delta(&processed("succeeded")), 5.0, "{:?}", db.backend());
    assert_eq!(delta(&processed("dead_lettered")), 2.0);
    assert_eq!(delta(&processed("retried")), 0.0);
    let stray = format!("{MESSAGES_PROCESSED}{{type=\"unregistered\",outcome=\"dead_lettered\"}}");
    assert_eq!(
        delta(&stray),
        1.0,
        "an unserved type is counted under a fixed label"
    );
    assert!(
        !handle.render().contains(Stray::MESSAGE_TYPE),
        "a type string from the database never becomes a label value"
    );
    let attempts = format!("{ATTEMPT_DURATION}_count{{type=\"{TYPE}\"}}");
    assert_eq!(delta(&attempts), 7.0, "every attempt is timed");
    let attempt_seconds = delta(&format!("{ATTEMPT_DURATION}_sum{{type=\"{TYPE}\"}}"));
    assert!(
        (0.025..60.0).contains(&attempt_seconds),
        "five handlers slept 5 ms each: {attempt_seconds}"
    );
    let lags = format!("{DELIVERY_LAG}_count{{type=\"{TYPE}\"}}");
    assert_eq!(delta(&lags), 5.0, "a lag per success");
    assert!(delta(CLAIMED) >= 7.0);
    assert!(delta(SETTLEMENTS) >= 1.0);
    assert!(
        eventually(Duration::from_secs(5), || sample(
            &samples(handle),
            IN_FLIGHT
        ) == 0.0),
        "nothing in flight once settled"
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();

    // A worker sampling every second sees the drained outbox: the delayed message, not due.
    let worker = Worker::builder(DieselStore::new(pool.clone()))
        .handler_threads(1)
        .backlog_interval(Duration::from_secs(1))
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            let now = samples(handle);
            sample(&now, PENDING) == 1.0 && now.contains_key(OLDEST_DUE_AGE)
        }),
        "{}",
        handle.render()
    );
    assert_eq!(sample(&samples(handle), OLDEST_DUE_AGE), 0.0);

    // An operator's pause of a type the worker handles: 1 within a few seconds, 0 once resumed.
    let paused = format!("{OPERATOR_PAUSED}{{kind=\"type\",name=\"{TYPE}\"}}");
    let mut conn = pool.get().unwrap();
    assert!(admin::pause(&mut conn, PauseKind::MessageType, TYPE, "metrics test").unwrap());
    assert!(
        eventually(Duration::from_secs(10), || sample(
            &samples(handle),
            &paused
        ) == 1.0),
        "{}",
        handle.render()
    );
    assert!(admin::resume(&mut conn, PauseKind::MessageType, TYPE)
        .unwrap()
        .is_some());
    assert!(
        eventually(Duration::from_secs(10), || {
            let now = samples(handle);
            now.contains_key(&paused) && sample(&now, &paused) == 0.0
        }),
        "{}",
        handle.render()
    );
    worker.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn the_worker_reports_outcomes_durations_and_the_backlog() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    for backend in [Backend::Postgres, Backend::Mysql, Backend::Sqlite] {
        let Some(db) = TestDb::new(backend) else {
            continue;
        };
        with_connection!(backend, C => run::<C>(&db, &handle));
    }
    let text = handle.render();
    for described in [
        MESSAGES_PROCESSED,
        ATTEMPT_DURATION,
        PENDING,
        OLDEST_DUE_AGE,
    ] {
        assert!(
            text.contains(&format!("# HELP {described} ")),
            "{described} is described: {text}"
        );
    }
}
