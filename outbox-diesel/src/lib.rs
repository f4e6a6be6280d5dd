//! The transactional outbox for Diesel: enqueue messages through your own connection, inside
//! your own transaction, and let a worker deliver them at least once.
//!
//! A message is a struct marked with [`#[outbox_handler("type")]`](outbox_handler); its
//! [`Handler::process`] is what the worker does with it after the commit (often: deliver it to
//! a [`webhook`]). [`Enqueue::enqueue`] writes it with one `INSERT` through the caller's
//! connection, so it exists exactly when the caller's transaction commits.
//!
//! ```
//! use std::sync::Mutex;
//! use std::time::Duration;
//!
//! use diesel::prelude::*;
//! use diesel::r2d2::Pool;
//! use outbox_diesel::prelude::*;
//! use outbox_diesel::{outbox_handler, Context, DieselStore, OutboxManager, ProcessError, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_handler("comment.thankYou")]
//! #[derive(Serialize, Deserialize)]
//! struct ThankYou {
//!     member_id: i64,
//! }
//!
//! /// Where this example's handler "sends" its mail.
//! struct Outbox(Mutex<Vec<i64>>);
//!
//! impl Handler for ThankYou {
//!     fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
//!         ctx.resource::<Outbox>()?.0.lock().unwrap().push(self.member_id);
//!         Ok(())
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = std::env::temp_dir().join(format!("outbox-doc-{}.db", std::process::id()));
//! let pool = Pool::builder().build(OutboxManager::<SqliteConnection>::new(&file.to_string_lossy())?)?;
//! let mut conn = pool.get()?;
//! outbox_diesel::run_migrations(&mut conn)?;
//! diesel::sql_query("CREATE TABLE IF NOT EXISTS comments (member_id BIGINT, body TEXT)")
//!     .execute(&mut conn)?;
//!
//! // A comment and its thank-you commit together...
//! conn.transaction(|conn| {
//!     diesel::sql_query("INSERT INTO comments VALUES (7, 'Nice post!')").execute(conn)?;
//!     ThankYou { member_id: 7 }.enqueue(conn)?;
//!     Ok::<_, outbox_diesel::Error>(())
//! })?;
//! // ...and a rolled-back one leaves no message behind.
//! let rolled_back: Result<(), outbox_diesel::Error> = conn.transaction(|conn| {
//!     ThankYou { member_id: 8 }.enqueue(conn)?;
//!     Err(diesel::result::Error::RollbackTransaction.into())
//! });
//! assert!(rolled_back.is_err());
//!
//! let worker = Worker::builder(DieselStore::new(pool.clone()))
//!     .resource(Outbox(Mutex::new(Vec::new())))
//!     .spawn()?;
//! while !outbox_diesel::admin::stats(&mut conn)?.is_empty() {
//!     std::thread::sleep(Duration::from_millis(10));
//! }
//! let stats = worker.shutdown(Duration::from_secs(5))?;
//! assert_eq!(stats.succeeded, 1);
//! # drop(conn);
//! # drop(pool);
//! # for suffix in ["", "-wal", "-shm"] {
//! #     let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
//! # }
//! # Ok(())
//! # }
//! ```
//!
//! # Crate features
//!
//! - `sqlite` (default): SQLite, built from source, nothing to install.
//! - `postgres`: PostgreSQL through libpq.
//! - `mysql`: MySQL 8 and MariaDB 10.6+ through the MySQL client library.
//! - `webhook` (default): [`webhook::WebhookEndpoint`], a [`destination`] that delivers Standard
//!   Webhooks, and [`webhook::verify`] for receivers.
//! - `opentelemetry`: each enqueue carries the current OpenTelemetry span as `traceparent` and
//!   `tracestate` headers, and handlers run inside it as their remote parent.
//!
//! # Guarantees
//!
//! At-least-once delivery: every committed message is processed successfully or moved to the
//! dead-letter table (`outbox_failure`) with the reason. Without faults, each message is
//! processed once even with many workers; after a crash only messages that were in flight may
//! run again, so receivers should drop duplicates by [`Context::message_id`], and handlers whose
//! effect is a write to the same database can make it happen exactly once with [`exactly_once()`].
//! A message enqueued with an [idempotency key](idempotency) is written once. Messages sharing an
//! [ordering key](EnqueueOptions::ordering_key) are processed one at a time, in order. See the
//! README for the full statement and the worker's defaults.
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs, missing_debug_implementations)]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!("outbox-diesel needs at least one backend feature: postgres, mysql or sqlite");

pub mod admin;
mod claim_cursor;
mod connection;
mod database;
pub mod delivery_log;
mod diesel_store;
mod enqueue;
mod error;
pub mod exactly_once;
mod fan_outs;
mod held;
pub mod idempotency;
#[cfg(feature = "webhook")]
pub mod inbox;
mod migrations;
pub mod retention;
mod sql;
pub mod subscription;
mod transaction;

pub use connection::{Backend, OutboxConnection};
pub use database::{
    configure_connection, establish, DatabaseUrl, Establish, OutboxManager, PoolCustomizer,
};
pub use diesel_store::DieselStore;
pub use enqueue::{enqueue_all, Batch, Enqueue, EnqueueOptions, DEFAULT_MAX_PAYLOAD_BYTES};
pub use error::{Error, Result};
pub use exactly_once::exactly_once;
pub use migrations::run_migrations;
pub use outbox_core::destination;
pub use outbox_core::metrics;
pub use outbox_core::{
    Context, Delivery, DispatchError, FailureKind, Handler, HandlerRegistration, HeaderError,
    Headers, Message, MessageId, ParseMessageIdError, Priority, ProcessError, Registry,
    RegistryError, Resources, RetryPolicy, Stopper, SubscriptionDelivery, Worker, WorkerBuilder,
    WorkerError, WorkerHandle, WorkerStats, MAX_HEADERS, MAX_HEADER_BYTES,
};
pub use transaction::write_transaction;

/// What a storage backend implements for the worker ([`DieselStore`] is this crate's): the
/// [`Store`](store::Store) trait and the types it exchanges with the worker. Applications need
/// these only to drive a store by hand or to write their own.
pub mod store {
    pub use outbox_core::store::*;
}

/// Makes a struct an outbox message and registers its handler with the worker.
///
/// `#[outbox_handler("comment.thankYou")]` on a struct that derives `Serialize` and `Deserialize`
/// implements [`Message`] with that type string and registers, at link time, how the worker turns
/// a stored payload back into the struct and calls its [`Handler::process`]. Implement
/// [`Handler`] for the struct yourself, or name a destination with `deliver_to = "name"`
/// (`#[outbox_handler("comment.thankYou", deliver_to = "mail")]`): the message then goes, as it
/// is, to the worker's destination of that name, with no `Handler` to write.
///
/// The type string is stored with every message: keep it stable while messages of that type may
/// be queued. It must be a non-empty string literal of at most 255 bytes, without whitespace or
/// control characters. Two structs with the same type string make [`Registry::from_inventory`]
/// fail at start-up, naming both.
///
/// **Handlers in another crate.** The linker drops a library crate that nothing in the final
/// binary refers to, and its handlers with it. If your handlers live in a crate the binary does
/// not otherwise use, write `use my_handlers as _;` in the binary (and in each integration test
/// that needs them).
pub use outbox_macros::outbox_handler;

/// Webhook delivery (Standard Webhooks) and the verifier for receivers: the `outbox-webhook`
/// crate.
#[cfg(feature = "webhook")]
pub mod webhook {
    pub use outbox_webhook::*;
}

/// The traits that give messages their `enqueue` methods: `use outbox_diesel::prelude::*;`.
pub mod prelude {
    pub use crate::enqueue::Enqueue;
    pub use outbox_core::Handler;
}

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// What `#[outbox_handler]` and `impl_outbox_connection!` expand to, and the claim's SQL for
/// the benchmarks; not a stable API, may change in any release.
#[doc(hidden)]
pub mod __private {
    /// The claim's statements, for the benchmarks' `EXPLAIN`: read, never copied.
    pub mod claim_sql {
        pub use crate::held::CLAIMS_IN_ORDER as POSTGRES_CLAIMER_SESSION;
        #[cfg(feature = "mysql")]
        pub use crate::sql::mysql::CANDIDATES as MYSQL_CANDIDATES;
        #[cfg(feature = "postgres")]
        pub use crate::sql::postgres::CLAIM as POSTGRES_CLAIM;
        #[cfg(feature = "sqlite")]
        pub use crate::sql::sqlite::CANDIDATES as SQLITE_CANDIDATES;
        pub use crate::sql::statements::candidates;
    }
    pub use crate::connection::sealed::Sealed;
    pub use crate::connection::BackendConnection;
    pub use crate::database::establish_variant;
    pub use diesel::ConnectionResult;
    pub use outbox_core::__private::inventory;
    pub use outbox_core::{HandlerRegistration, Message};
    pub use serde;
}
