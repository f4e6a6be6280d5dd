//! Handlers shared by the test binaries and the test worker process.

use std::time::Duration;

use diesel::sql_types::{Integer, Text};
use diesel::RunQueryDsl;
use outbox_diesel::{
    exactly_once, outbox_handler, Backend, Context, Enqueue, Handler, ProcessError,
};
use outbox_testkit::with_connection;
use serde::{Deserialize, Serialize};

/// The name of the destination [`Hook`] and [`Stall`] deliver to (a webhook endpoint, in the
/// tests).
pub const HOOK: &str = "hook";

/// The name of the destination [`Relayed`] messages go to (a broker, in the tests).
pub const RELAY: &str = "relay";

/// Delivers itself to the worker's destination [`HOOK`].
#[outbox_handler("test.hook")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hook {
    /// A number the receiver can check.
    pub n: u32,
    /// The ordering key it was enqueued with, if any.
    pub key: Option<String>,
}

impl Hook {
    /// A hook without a key.
    pub fn new(n: u32) -> Hook {
        Hook { n, key: None }
    }
}

impl Handler for Hook {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.destination(HOOK)?.deliver(&self)
    }
}

/// Publishes itself to the worker's destination [`RELAY`], to the subject, routing key or
/// topic the destination was built with.
#[outbox_handler("test.relay")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Relayed {
    /// A number the consumer can check.
    pub n: u32,
    /// The ordering key it was enqueued with, if any.
    pub key: Option<String>,
    /// Padding, to make it as large as a test needs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub padding: String,
    /// Where in the destination it goes, if not where the destination sends by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

impl Relayed {
    /// A message of `key`.
    pub fn new(n: u32, key: Option<&str>) -> Relayed {
        Relayed {
            n,
            key: key.map(str::to_owned),
            padding: String::new(),
            subject: None,
        }
    }
}

impl Handler for Relayed {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let relay = ctx.destination(RELAY)?;
        match self.subject.clone() {
            Some(subject) => relay.deliver_to(&subject, &self),
            None => relay.deliver(&self),
        }
    }
}

/// Declares `Routed` (message type `test.routed`), routed to the worker's destination [`RELAY`]
/// as it is stored, without handler code: the way an application relays most of its events,
/// and the path on which a destination that takes batches gets them. Its data is [`Relayed`]'s
/// (a number and a key), so consumers read both alike.
///
/// A route needs its destination in every worker that can see it, so only a binary whose
/// workers all have [`RELAY`] declares it: the relay tests and the test worker process (which
/// gives workers without a broker a relay that takes nothing).
#[macro_export]
macro_rules! declare_routed {
    () => {
        /// Relayed as it is stored, in batches where the destination takes them.
        #[outbox_diesel::outbox_handler("test.routed", deliver_to = "relay")]
        #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
        pub struct Routed {
            /// A number the consumer can check.
            pub n: u32,
            /// The ordering key it was enqueued with, if any.
            pub key: Option<String>,
        }
    };
}

/// Hangs on its first attempt for `hang_ms` and then fails it (the watchdog has counted it
/// timed out by then); on a later attempt delivers itself like a [`Hook`].
#[outbox_handler("test.stall")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stall {
    /// The hook it delivers on a later attempt.
    pub hook: Hook,
    /// How long its first attempt hangs.
    pub hang_ms: u64,
}

impl Handler for Stall {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        if ctx.attempt() == 1 {
            std::thread::sleep(std::time::Duration::from_millis(self.hang_ms));
            return Err(ProcessError::retryable("stalled on purpose"));
        }
        ctx.destination(HOOK)?.deliver(&self.hook)
    }
}

/// The table [`Effect`] writes to: one row per effect, with no unique key, so that an effect
/// applied twice shows as two rows.
pub const EFFECT_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS test_effect (message_id VARCHAR(64) NOT NULL, n INTEGER NOT NULL)";

/// The statement that records an effect: binds message id, n.
pub fn insert_effect(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "INSERT INTO test_effect (message_id, n) VALUES ($1, $2)",
        _ => "INSERT INTO test_effect (message_id, n) VALUES (?, ?)",
    }
}

/// Writes a row to `test_effect` inside its settlement's transaction ([`exactly_once()`]), then
/// holds the transaction open for `pause_ms` (so a kill lands inside it). Needs the worker's
/// [`Backend`] as a resource.
#[outbox_handler("test.effect")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Effect {
    /// Which effect.
    pub n: i32,
    /// How long the transaction stays open after the write.
    pub pause_ms: u64,
    /// Fail the first attempt after writing (the write must roll back).
    pub fail_first: bool,
    /// Enqueue this effect next, in the same transaction.
    pub then: Option<i32>,
    /// How long the first attempt hangs inside its transaction, after the write.
    pub hang_first_ms: u64,
}

impl Effect {
    /// An effect that succeeds at once.
    pub fn new(n: i32) -> Effect {
        Effect {
            n,
            pause_ms: 0,
            fail_first: false,
            then: None,
            hang_first_ms: 0,
        }
    }
}

impl Handler for Effect {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let backend = *ctx.resource::<Backend>()?;
        let id = ctx.message_id().to_string();
        let first = ctx.attempt() == 1;
        let fail = self.fail_first && first;
        let hang = if first { self.hang_first_ms } else { 0 };
        with_connection!(backend, C => exactly_once(ctx, |conn: &mut C| {
            diesel::sql_query(insert_effect(backend))
                .bind::<Text, _>(&id)
                .bind::<Integer, _>(self.n)
                .execute(conn)
                .map_err(ProcessError::retryable)?;
            if let Some(next) = self.then {
                Effect::new(next).enqueue(conn).map_err(ProcessError::retryable)?;
            }
            std::thread::sleep(Duration::from_millis(self.pause_ms + hang));
            if fail {
                return Err(ProcessError::retryable("failing the first attempt on purpose"));
            }
            Ok(())
        }))
    }
}
