//! The typed side of a message: [`Message`] (what is enqueued, serialized with serde) and
//! [`Handler`] (what the worker runs for it).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::context::Context;
use crate::error::ProcessError;
use crate::retry::RetryPolicy;

/// A message that can be written to the outbox.
///
/// Implemented by [`#[outbox_handler("type.name")]`](https://docs.rs/outbox-diesel), which also
/// registers the message's [`Handler`] with the worker. The type string is what is stored in the
/// outbox row and what the worker looks up to find the handler, so it must stay stable for as
/// long as messages of that type may sit in the table.
pub trait Message: Serialize + DeserializeOwned + Send + 'static {
    /// The stable type string stored with every message of this type, e.g. `"comment.thankYou"`.
    const MESSAGE_TYPE: &'static str;
}

/// The work the worker does for a message, outside the transaction that enqueued it.
///
/// Implement it on the same struct that carries `#[outbox_handler(..)]`. `process` runs on a
/// worker thread; return `Ok(())` when the outside world has the message, or a [`ProcessError`]
/// saying whether a later attempt may succeed. Delivery is at least once, so `process` must be
/// safe to run again for the same message: pass [`Context::message_id`] on to the receiver so it
/// can drop duplicates.
pub trait Handler: Message {
    /// Delivers or acts on the message.
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError>;

    /// This handler's own retry policy, instead of the worker's.
    fn retry_policy() -> Option<RetryPolicy> {
        None
    }
}
