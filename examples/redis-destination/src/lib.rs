//! A destination written outside the outbox's crates, as a third party would write one: each
//! message appended to a Redis stream (`XADD`), its id, type and headers as fields beside its
//! body. It is one file; `tests/conformance.rs` runs the destination conformance kit on it
//! against a `redis-server` of its own, in one line.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use outbox_example_redis_destination::RedisStreamDestination;
//!
//! let events = RedisStreamDestination::new("redis://127.0.0.1:6379", "events", Duration::from_secs(5))?;
//! // Give it to the worker by name: `Worker::builder(store).destination("events", events)`.
//! # Ok::<(), redis::RedisError>(())
//! ```
//!
//! What a destination owes the worker, and how this one pays it:
//! - **Classify every failure.** A connection refused, dropped or timed out, and a server that
//!   is loading or busy, are the destination's failures (`unavailable`: enough in a row pause
//!   it); a key that holds something other than a stream is a misconfiguration no retry
//!   fixes (`gone`: disabled until an operator enables it); anything else fails the message
//!   alone (`retryable`).
//! - **Bound each attempt** by its timeout (connect, write and read), and say so in
//!   [`timeout`](Destination::timeout): the worker's watchdog is set from it.
//! - **Survive a restart of the other side.** A connection that went stale is dropped and the
//!   command sent once more on a fresh one (only when the connection was found closed, which
//!   fails at once; never after a timeout, which has used the attempt's time): `XADD` with an id chosen by the server may then add
//!   a second entry, which consumers drop by the message id every entry carries (delivery is
//!   at least once anyway).
//! - **Answer something worth logging**: the entry's id, kept in the delivery log.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use outbox_core::destination::{Answer, DeliveryError, Destination, Envelope};
use redis::{Client, Connection, RedisError, RedisResult};

/// The field that holds a message's body in its stream entry.
pub const BODY_FIELD: &str = "body";

/// Appends each message to one Redis stream. Deliveries share one connection, one at a time.
pub struct RedisStreamDestination {
    client: Client,
    stream: String,
    timeout: Duration,
    connection: Mutex<Option<Connection>>,
}

impl std::fmt::Debug for RedisStreamDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client's URL may hold a password: only the stream and the timeout are shown.
        f.debug_struct("RedisStreamDestination")
            .field("stream", &self.stream)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStreamDestination {
    /// A destination appending to stream `stream` of the server at `url`
    /// (`redis://host:port/db`), each attempt bounded by `timeout`. Connects on the first
    /// delivery; fails only on a URL it cannot read.
    pub fn new(url: &str, stream: impl Into<String>, timeout: Duration) -> RedisResult<Self> {
        Ok(RedisStreamDestination {
            client: Client::open(url)?,
            stream: stream.into(),
            timeout,
            connection: Mutex::new(None),
        })
    }

    fn connect(&self) -> RedisResult<Connection> {
        let connection = self.client.get_connection_with_timeout(self.timeout)?;
        connection.set_read_timeout(Some(self.timeout))?;
        connection.set_write_timeout(Some(self.timeout))?;
        Ok(connection)
    }
}

impl Destination for RedisStreamDestination {
    fn kind(&self) -> &'static str {
        "redis-stream"
    }

    fn deliver(&self, envelope: &Envelope) -> Result<(), DeliveryError> {
        self.deliver_answered(envelope).map(drop)
    }

    fn deliver_answered(&self, envelope: &Envelope) -> Result<Answer, DeliveryError> {
        let mut command = redis::cmd("XADD");
        command.arg(&self.stream).arg("*");
        // The message's id and type first, then its own headers; none may pose as the body.
        for (name, value) in
            envelope.transport_headers(|name| name.eq_ignore_ascii_case(BODY_FIELD))
        {
            command.arg(name).arg(value);
        }
        command.arg(BODY_FIELD).arg(&envelope.body);

        let mut held = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let reused = held.is_some();
        let mut connection = match held.take() {
            Some(connection) => connection,
            None => self.connect().map_err(classify)?,
        };
        let mut added: RedisResult<String> = command.query(&mut connection);
        if reused && added.as_ref().is_err_and(|e| stale(e) && !e.is_timeout()) {
            // The server closed the connection while it sat idle (a restart): once more on a
            // fresh one. Not after a timeout: the attempt has used its time.
            connection = self.connect().map_err(classify)?;
            added = command.query(&mut connection);
        }
        match added {
            Ok(entry) => {
                *held = Some(connection);
                Ok(Answer::new(None, format!("entry {entry}")))
            }
            Err(error) => {
                if !stale(&error) {
                    *held = Some(connection);
                }
                Err(classify(error))
            }
        }
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Whether the connection is unusable: it broke, or the server dropped it.
fn stale(error: &RedisError) -> bool {
    error.is_io_error() || error.is_connection_dropped()
}

/// What a failure says of the message and of the destination.
fn classify(error: RedisError) -> DeliveryError {
    let reason = format!("redis: {error}");
    if stale(&error) || error.is_timeout() || error.is_connection_refusal() {
        return DeliveryError::unavailable(reason);
    }
    match error.code() {
        Some(
            "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "NOAUTH" | "WRONGPASS" | "NOPERM",
        ) => DeliveryError::unavailable(reason),
        Some("WRONGTYPE") => DeliveryError::gone(format!(
            "{reason}: the stream's key holds another type; point the destination at a stream"
        )),
        _ => DeliveryError::retryable(reason),
    }
}
