#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs, missing_debug_implementations)]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!("outbox-diesel needs at least one backend feature: postgres, mysql or sqlite");

pub mod admin;
mod connection;
mod enqueue;
mod error;
mod migrations;
mod store;

pub use connection::{Backend, OutboxConnection, PoolCustomizer};
pub use enqueue::{enqueue_all, Batch, Enqueue, EnqueueOptions};
pub use error::{Error, Result};
pub use migrations::run_migrations;
pub use outbox_core::{
    ClaimToken, ClaimedMessage, Context, Delivery, DispatchError, FailureKind, Handler,
    HandlerRegistration, Listener, Message, MessageId, Outcome, ParseMessageIdError, ProcessError,
    Registry, RegistryError, Resources, RetryPolicy, Settlement, Stopper, Store, StoreError,
    Worker, WorkerBuilder, WorkerError, WorkerHandle, WorkerStats,
};
pub use store::DieselStore;

/// Makes a struct an outbox message and registers its handler with the worker.
///
/// `#[outbox_handler("comment.thankYou")]` on a struct that derives `Serialize` and `Deserialize`
/// implements [`Message`] with that type string and registers, at link time, how the worker turns
/// a stored payload back into the struct and calls its [`Handler::process`]. Implement
/// [`Handler`] for the struct yourself.
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

/// Webhook delivery (Standard Webhooks) and the verifier for receivers.
#[cfg(feature = "webhook")]
pub mod webhook {
    pub use outbox_core::webhook::*;
}

/// The traits that give messages their `enqueue` methods: `use outbox_diesel::prelude::*;`.
pub mod prelude {
    pub use crate::enqueue::Enqueue;
    pub use outbox_core::Handler;
}

#[doc(hidden)]
pub mod __private {
    pub use outbox_core::__private::inventory;
    pub use outbox_core::{HandlerRegistration, Message};
}
