//! The worker's metrics, recorded through the [`metrics`](https://docs.rs/metrics) facade:
//! nothing is recorded until the application installs a recorder (for example
//! `metrics-exporter-prometheus`), and then every worker of the process reports to it.
//!
//! Names and units follow Prometheus conventions; labels stay bounded: `type` is a message type
//! this worker has a handler for (any other is reported as `unregistered`), `destination` one
//! of its destinations' names, `outcome` and `operation` take the few values listed here.
//!
//! | Name | Kind | Labels | What |
//! |---|---|---|---|
//! | [`MESSAGES_PROCESSED`] | counter | `type`, `outcome` | messages settled, by outcome: `succeeded`, `retried`, `dead_lettered`, `released`, `deferred`, `paused`, `fenced`, `abandoned` |
//! | [`ATTEMPT_DURATION`] | histogram (s) | `type` | how long handlers ran |
//! | [`DELIVERY_LAG`] | histogram (s) | `type` | from enqueue to the settlement of a success (a delayed message counts its delay) |
//! | [`HANDLER_TIMEOUTS`] | counter | `type` | attempts the watchdog counted as timed out |
//! | [`IN_FLIGHT`] | gauge | | messages claimed and not yet settled |
//! | [`CLAIMS`] | counter | | claims that reached the store |
//! | [`CLAIMED`] | counter | | messages claimed |
//! | [`SETTLEMENTS`] | counter | | settlements (batches of outcomes) the store took |
//! | [`STORE_ERRORS`] | counter | `operation` | failed store calls: `claim`, `settle`, `extend_leases`, `housekeeping`, `backlog` |
//! | [`PENDING`] | gauge | | messages in the outbox (due, delayed, held or parked), sampled |
//! | [`OLDEST_DUE_AGE`] | gauge (s) | | how long the oldest due, unclaimed message has waited (0 when none waits), sampled |
//! | [`CLAIM_DURATION`] | histogram (s) | | how long claims took (one round trip and its statement: it grows with what the claim must walk past) |
//! | [`OLDEST_TRANSACTION_AGE`] | gauge (s) | | how long the oldest transaction keeping the database from cleaning up has been open, sampled with the backlog (PostgreSQL, MySQL) |
//! | [`DEAD_ROWS`] | gauge | | rows the database cannot clean up yet: PostgreSQL's dead tuples in the outbox table, MySQL's undo history list; sampled with the backlog |
//! | [`DESTINATION_ATTEMPTS`] | counter | `destination`, `outcome` | deliveries to a destination: `delivered`, `failed` (retryable), `rejected` (permanent), `pushed_back`, and those not sent: `waited` (paused or held), `paced` (over its rate: deferred to its turn), `refused` (disabled), `paused` (an operator paused it) |
//! | [`DESTINATION_DURATION`] | histogram (s) | `destination` | how long deliveries took |
//! | [`DESTINATION_STATE`] | gauge | `destination`, `kind`, `state` | 1 for the state a destination is in (`healthy`, `held`, `paused`, `disabled`), 0 for the others; set for every destination when the worker starts |
//! | [`OPERATOR_PAUSED`] | gauge | `kind`, `name` | 1 while an operator has paused the message type (`kind="type"`) or destination (`kind="destination"`) `name`, 0 otherwise; set for each of the worker's types and destinations every few seconds |
//!
//! The two sampled gauges come from one query the worker runs at start and then every
//! [`WorkerBuilder::backlog_interval`](crate::WorkerBuilder::backlog_interval) (15 s by
//! default). [`OLDEST_DUE_AGE`] answers "is it keeping up": it stays near zero while workers
//! claim what is due; alert when it stays above what a message may wait (e.g. above 60 s for
//! 5 minutes). Histograms are rendered as summaries by the Prometheus exporter unless the
//! application gives it buckets (as the example does).

use std::time::Duration;

/// Messages settled, by `type` and `outcome` (counter).
pub const MESSAGES_PROCESSED: &str = "outbox_messages_processed_total";
/// How long handlers ran, by `type` (histogram, seconds).
pub const ATTEMPT_DURATION: &str = "outbox_attempt_duration_seconds";
/// From enqueue to the settlement of a success, by `type` (histogram, seconds).
pub const DELIVERY_LAG: &str = "outbox_delivery_lag_seconds";
/// Attempts the watchdog counted as timed out, by `type` (counter).
pub const HANDLER_TIMEOUTS: &str = "outbox_handler_timeouts_total";
/// Messages claimed and not yet settled (gauge).
pub const IN_FLIGHT: &str = "outbox_in_flight_messages";
/// Claims that reached the store, empty or not (counter).
pub const CLAIMS: &str = "outbox_claims_total";
/// Messages claimed (counter).
pub const CLAIMED: &str = "outbox_claimed_messages_total";
/// Settlements (batches of outcomes) the store took (counter).
pub const SETTLEMENTS: &str = "outbox_settlements_total";
/// Failed store calls, by `operation` (counter).
pub const STORE_ERRORS: &str = "outbox_store_errors_total";
/// Messages in the outbox, sampled (gauge).
pub const PENDING: &str = "outbox_pending_messages";
/// How long the oldest due, unclaimed message has waited, sampled (gauge, seconds).
pub const OLDEST_DUE_AGE: &str = "outbox_oldest_due_age_seconds";
/// How long claims took (histogram, seconds).
pub const CLAIM_DURATION: &str = "outbox_claim_duration_seconds";
/// How long the oldest transaction holding the database's clean-up back has been open, sampled
/// (gauge, seconds). Alert when it stays above a few minutes.
pub const OLDEST_TRANSACTION_AGE: &str = "outbox_oldest_transaction_age_seconds";
/// Rows the database cannot clean up yet, sampled (gauge).
pub const DEAD_ROWS: &str = "outbox_dead_rows";
/// Deliveries to a destination, by `destination` and `outcome` (counter).
pub const DESTINATION_ATTEMPTS: &str = "outbox_destination_attempts_total";
/// How long deliveries to a destination took, by `destination` (histogram, seconds).
pub const DESTINATION_DURATION: &str = "outbox_destination_duration_seconds";
/// 1 for the state each destination is in, 0 for the others, by `destination`, `kind` and
/// `state` (gauge). Alert on `outbox_destination_state{state=~"paused|disabled"} == 1`.
pub const DESTINATION_STATE: &str = "outbox_destination_state";

/// 1 while an operator has paused a message type or destination, 0 otherwise, by `kind`
/// (`type` or `destination`) and `name` (gauge). Alert when one stays paused longer than
/// planned: `outbox_paused == 1` for an hour.
pub const OPERATOR_PAUSED: &str = "outbox_paused";

/// The `type` label of messages no handler of this worker serves: unbounded strings from the
/// database never become label values.
pub(crate) const UNREGISTERED_TYPE: &str = "unregistered";

/// Gives every metric its unit and description, for recorders that show them (Prometheus'
/// `# HELP`). Describing twice is harmless.
pub(crate) fn describe() {
    record(describe_each);
}

fn describe_each() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        MESSAGES_PROCESSED,
        Unit::Count,
        "Messages settled by the outbox worker, by type and outcome"
    );
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "How long outbox handlers ran, by type"
    );
    describe_histogram!(
        DELIVERY_LAG,
        Unit::Seconds,
        "From enqueue to the successful settlement of an outbox message, by type"
    );
    describe_counter!(
        HANDLER_TIMEOUTS,
        Unit::Count,
        "Outbox handler attempts counted as timed out, by type"
    );
    describe_gauge!(
        IN_FLIGHT,
        Unit::Count,
        "Outbox messages claimed by this worker and not yet settled"
    );
    describe_counter!(CLAIMS, Unit::Count, "Outbox claims that reached the store");
    describe_counter!(CLAIMED, Unit::Count, "Outbox messages claimed");
    describe_counter!(
        SETTLEMENTS,
        Unit::Count,
        "Settlements (batches of outcomes) the outbox store took"
    );
    describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Failed outbox store calls, by operation"
    );
    describe_gauge!(
        PENDING,
        Unit::Count,
        "Messages in the outbox (due, delayed, held or parked), sampled"
    );
    describe_gauge!(
        OLDEST_DUE_AGE,
        Unit::Seconds,
        "How long the oldest due, unclaimed outbox message has waited, sampled"
    );
    describe_histogram!(
        CLAIM_DURATION,
        Unit::Seconds,
        "How long the outbox worker's claims took"
    );
    describe_gauge!(
        OLDEST_TRANSACTION_AGE,
        Unit::Seconds,
        "How long the oldest transaction holding back the database's clean-up has been open"
    );
    describe_gauge!(
        DEAD_ROWS,
        Unit::Count,
        "Rows the database cannot clean up yet (dead tuples of the outbox table, or the undo history)"
    );
    describe_counter!(
        DESTINATION_ATTEMPTS,
        Unit::Count,
        "Deliveries to an outbox destination, by destination and outcome"
    );
    describe_histogram!(
        DESTINATION_DURATION,
        Unit::Seconds,
        "How long deliveries to an outbox destination took, by destination"
    );
    describe_gauge!(
        DESTINATION_STATE,
        Unit::Count,
        "1 for the state an outbox destination is in (healthy, held, paused, disabled), 0 for the others"
    );
    describe_gauge!(
        OPERATOR_PAUSED,
        Unit::Count,
        "1 while an operator has paused an outbox message type or destination, 0 otherwise"
    );
}

/// Records through the application's recorder, which may panic: the panic stays here (the
/// worker logs the first; the process's panic hook still reports each). Recordings are made
/// while the worker books what it holds (a settlement, a timed-out attempt, a handler's or a
/// delivery's success); a panic there would leave a message held for good or run a handler
/// that succeeded once more.
fn record(recording: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(recording)).is_err()
        && !RECORDER_PANICKED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        log::error!(
            "outbox: the application's metrics recorder panicked; the worker goes on without \
             the metric (logged once)"
        );
    }
}

static RECORDER_PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn processed(message_type: &str, outcome: &'static str) {
    record(|| {
        ::metrics::counter!(MESSAGES_PROCESSED, "type" => message_type.to_owned(), "outcome" => outcome)
            .increment(1);
    });
}

pub(crate) fn attempt_duration(message_type: &str, duration: Duration) {
    record(|| {
        ::metrics::histogram!(ATTEMPT_DURATION, "type" => message_type.to_owned())
            .record(duration.as_secs_f64());
    });
}

pub(crate) fn delivery_lag(message_type: &str, lag: Duration) {
    record(|| {
        ::metrics::histogram!(DELIVERY_LAG, "type" => message_type.to_owned())
            .record(lag.as_secs_f64());
    });
}

pub(crate) fn handler_timeout(message_type: &str) {
    record(|| {
        ::metrics::counter!(HANDLER_TIMEOUTS, "type" => message_type.to_owned()).increment(1);
    });
}

pub(crate) fn in_flight(count: usize) {
    record(|| {
        ::metrics::gauge!(IN_FLIGHT).set(count as f64);
    });
}

pub(crate) fn claimed(count: u64) {
    record(|| {
        ::metrics::counter!(CLAIMS).increment(1);
        ::metrics::counter!(CLAIMED).increment(count);
    });
}

pub(crate) fn settlement() {
    record(|| {
        ::metrics::counter!(SETTLEMENTS).increment(1);
    });
}

pub(crate) fn store_error(operation: &'static str) {
    record(|| {
        ::metrics::counter!(STORE_ERRORS, "operation" => operation).increment(1);
    });
}

pub(crate) fn destination_attempt(destination: &str, outcome: &'static str) {
    record(|| {
        ::metrics::counter!(DESTINATION_ATTEMPTS, "destination" => destination.to_owned(), "outcome" => outcome)
            .increment(1);
    });
}

pub(crate) fn destination_duration(destination: &str, duration: Duration) {
    record(|| {
        ::metrics::histogram!(DESTINATION_DURATION, "destination" => destination.to_owned())
            .record(duration.as_secs_f64());
    });
}

/// Records that destination `destination` is in `state` and in none of the other `states`.
pub(crate) fn destination_state(
    destination: &str,
    kind: &'static str,
    state: &'static str,
    states: &[&'static str],
) {
    record(|| {
        for &each in states {
            let value = if each == state { 1.0 } else { 0.0 };
            ::metrics::gauge!(
                DESTINATION_STATE,
                "destination" => destination.to_owned(),
                "kind" => kind,
                "state" => each
            )
            .set(value);
        }
    });
}

/// Records whether an operator paused message type (`kind` `type`) or destination `name`.
pub(crate) fn operator_paused(kind: &'static str, name: &str, paused: bool) {
    record(|| {
        ::metrics::gauge!(OPERATOR_PAUSED, "kind" => kind, "name" => name.to_owned())
            .set(if paused { 1.0 } else { 0.0 });
    });
}

pub(crate) fn backlog(backlog: &crate::store::Backlog) {
    record(|| {
        ::metrics::gauge!(PENDING).set(backlog.pending as f64);
        ::metrics::gauge!(OLDEST_DUE_AGE).set(backlog.oldest_due_age.as_secs_f64());
        if let Some(age) = backlog.oldest_transaction_age {
            ::metrics::gauge!(OLDEST_TRANSACTION_AGE).set(age.as_secs_f64());
        }
        if let Some(dead) = backlog.dead_rows {
            ::metrics::gauge!(DEAD_ROWS).set(dead as f64);
        }
    });
}

pub(crate) fn claim_duration(duration: Duration) {
    record(|| {
        ::metrics::histogram!(CLAIM_DURATION).record(duration.as_secs_f64());
    });
}
