use std::collections::HashMap;
use std::fmt;

use crate::context::Context;
use crate::error::ProcessError;
use crate::message::Handler;
use crate::retry::RetryPolicy;

/// One handler as registered at link time by `#[outbox_handler]`: the type string, the Rust type
/// that handles it, and how to deserialize and process a payload of that type.
pub struct HandlerRegistration {
    message_type: &'static str,
    handler_name: &'static str,
    dispatch: fn(String, &mut Context<'_>) -> Result<(), DispatchError>,
    retry_policy: fn() -> Option<RetryPolicy>,
}

impl HandlerRegistration {
    #[doc(hidden)]
    pub const fn new<H: Handler>(handler_name: &'static str) -> Self {
        HandlerRegistration {
            message_type: H::MESSAGE_TYPE,
            handler_name,
            dispatch: dispatch::<H>,
            retry_policy: H::retry_policy,
        }
    }

    /// The type string this handler serves.
    pub fn message_type(&self) -> &'static str {
        self.message_type
    }

    /// The path of the Rust type that handles it, e.g. `blog::mail::ThankYou`.
    pub fn handler_name(&self) -> &'static str {
        self.handler_name
    }

    /// The handler's own retry policy, if it has one.
    pub fn retry_policy(&self) -> Option<RetryPolicy> {
        (self.retry_policy)()
    }

    /// Deserializes `payload` into the handler's struct and runs its `process`. The payload
    /// is dropped once deserialized, so that a large message is not held twice while its
    /// handler runs.
    pub fn dispatch(&self, payload: String, ctx: &mut Context<'_>) -> Result<(), DispatchError> {
        (self.dispatch)(payload, ctx)
    }
}

impl fmt::Debug for HandlerRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerRegistration")
            .field("message_type", &self.message_type)
            .field("handler_name", &self.handler_name)
            .finish()
    }
}

fn dispatch<H: Handler>(payload: String, ctx: &mut Context<'_>) -> Result<(), DispatchError> {
    let message: H =
        serde_json::from_str(&payload).map_err(|source| DispatchError::Deserialize {
            message_type: H::MESSAGE_TYPE,
            handler_name: std::any::type_name::<H>(),
            source,
        })?;
    drop(payload);
    message.process(ctx).map_err(DispatchError::Process)
}

inventory::collect!(HandlerRegistration);

/// Why a stored message could not be handed to its handler, or what the handler reported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The stored payload does not deserialize into the handler's struct, typically because the
    /// struct changed incompatibly while messages of the old shape were still queued. Retrying
    /// cannot help; the message is dead-lettered with this reason.
    #[error("payload of message type `{message_type}` does not deserialize into `{handler_name}`: {source}")]
    Deserialize {
        /// The type string of the message.
        message_type: &'static str,
        /// The Rust type the payload was meant for.
        handler_name: &'static str,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The handler ran and failed.
    #[error("{0}")]
    Process(ProcessError),
}

/// Every handler linked into the program, by type string.
///
/// Built from the registrations that `#[outbox_handler]` submits at link time. A handler defined
/// in a library crate of yours is only linked if the final binary refers to that crate: if
/// nothing else names it, add `use my_handlers as _;` to the binary (and to each integration test
/// file that needs the handlers), or its handlers are silently missing.
#[derive(Debug)]
pub struct Registry {
    by_type: HashMap<&'static str, &'static HandlerRegistration>,
}

impl Registry {
    /// Collects every registered handler, failing if two share a type string.
    pub fn from_inventory() -> Result<Self, RegistryError> {
        Self::from_registrations(inventory::iter::<HandlerRegistration>)
    }

    fn from_registrations(
        registrations: impl IntoIterator<Item = &'static HandlerRegistration>,
    ) -> Result<Self, RegistryError> {
        let mut by_type = HashMap::new();
        for registration in registrations {
            if let Some(first) = by_type.insert(registration.message_type, registration) {
                let mut names = [first.handler_name, registration.handler_name];
                names.sort_unstable();
                return Err(RegistryError::DuplicateType {
                    message_type: registration.message_type,
                    first: names[0],
                    second: names[1],
                });
            }
        }
        Ok(Registry { by_type })
    }

    /// A registry without handlers.
    #[cfg(test)]
    pub(crate) fn empty() -> Self {
        Registry {
            by_type: HashMap::new(),
        }
    }

    /// The handler for `message_type`, if one is linked in.
    pub fn get(&self, message_type: &str) -> Option<&'static HandlerRegistration> {
        self.by_type.get(message_type).copied()
    }

    /// All registered type strings, sorted.
    pub fn message_types(&self) -> Vec<&'static str> {
        let mut types: Vec<_> = self.by_type.keys().copied().collect();
        types.sort_unstable();
        types
    }

    /// How many handlers are registered.
    pub fn len(&self) -> usize {
        self.by_type.len()
    }

    /// Whether no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}

/// The handlers linked into the program do not form a valid registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two handler structs declare the same type string, so the worker could not tell which one
    /// a stored message belongs to.
    #[error(
        "message type `{message_type}` is registered twice, by `{first}` and by `{second}`; \
         give one of them another type string in its #[outbox_handler(..)]"
    )]
    DuplicateType {
        /// The contested type string.
        message_type: &'static str,
        /// One of the two handler types.
        first: &'static str,
        /// The other one.
        second: &'static str,
    },
}
