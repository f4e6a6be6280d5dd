//! The handlers `#[outbox_handler]` registers at link time ([`HandlerRegistration`], collected
//! with `inventory`), and the [`Registry`] the worker looks a message's type up in.

use std::collections::HashMap;
use std::fmt;

use crate::context::Context;
use crate::error::ProcessError;
use crate::message::{Handler, Message};
use crate::retry::RetryPolicy;

/// One handler as registered at link time by `#[outbox_handler]`: the type string, the Rust type
/// that handles it, and how to process a payload of that type: deserialize it and run the
/// type's [`Handler`], or deliver it as it is to a named destination (a route,
/// `#[outbox_handler("type", deliver_to = "name")]`).
pub struct HandlerRegistration {
    message_type: &'static str,
    handler_name: &'static str,
    destination: Option<&'static str>,
    dispatch: fn(String, &mut Context<'_>) -> Result<(), DispatchError>,
    retry_policy: fn() -> Option<RetryPolicy>,
}

impl HandlerRegistration {
    #[doc(hidden)]
    pub const fn new<H: Handler>(handler_name: &'static str) -> Self {
        HandlerRegistration {
            message_type: H::MESSAGE_TYPE,
            handler_name,
            destination: None,
            dispatch: dispatch::<H>,
            retry_policy: H::retry_policy,
        }
    }

    #[doc(hidden)]
    pub const fn routed<M: Message>(handler_name: &'static str, destination: &'static str) -> Self {
        HandlerRegistration {
            message_type: M::MESSAGE_TYPE,
            handler_name,
            destination: Some(destination),
            dispatch: unrouted,
            retry_policy: no_policy,
        }
    }

    /// The destination messages of this type are delivered to without handler code, if the
    /// type is routed (`deliver_to`).
    pub fn destination(&self) -> Option<&'static str> {
        self.destination
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
        match self.destination {
            Some(name) => route(name, payload, ctx),
            None => (self.dispatch)(payload, ctx),
        }
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

fn no_policy() -> Option<RetryPolicy> {
    None
}

/// A routed registration's handler: never called, its route is.
fn unrouted(_: String, _: &mut Context<'_>) -> Result<(), DispatchError> {
    Err(DispatchError::Process(ProcessError::permanent(
        "a routed message type has no handler of its own",
    )))
}

/// Why a stored payload is not JSON, as a routed message's must be to be sent as it is (a row
/// edited by hand may hold anything).
fn not_json(payload: &str) -> Option<serde_json::Error> {
    serde_json::from_str::<serde::de::IgnoredAny>(payload).err()
}

/// Whether a stored payload is JSON: see [`not_json`].
pub(crate) fn is_json(payload: &str) -> bool {
    not_json(payload).is_none()
}

/// A routed message's delivery: its stored payload goes to its destination as it is, after a
/// check that it is JSON.
fn route(name: &str, payload: String, ctx: &mut Context<'_>) -> Result<(), DispatchError> {
    if let Some(source) = not_json(&payload) {
        return Err(DispatchError::NotJson {
            message_type: ctx.message_type().to_owned(),
            source,
        });
    }
    let destination = ctx.destination(name).map_err(DispatchError::Process)?;
    destination
        .send(ctx.envelope(payload.into_bytes()))
        .map_err(DispatchError::Process)
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
    /// The stored payload of a routed message is not JSON (a row edited by hand): it is
    /// dead-lettered with this reason.
    #[error("payload of routed message type `{message_type}` is not JSON: {source}")]
    NotJson {
        /// The type string of the message.
        message_type: String,
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

    pub(crate) fn from_registrations(
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

    /// The routed registrations (`deliver_to`), sorted by type.
    pub fn routes(&self) -> Vec<&'static HandlerRegistration> {
        let mut routes: Vec<_> = self
            .by_type
            .values()
            .copied()
            .filter(|r| r.destination.is_some())
            .collect();
        routes.sort_unstable_by_key(|r| r.message_type);
        routes
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
