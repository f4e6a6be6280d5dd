//! The storage- and transport-independent core of [`outbox`](https://docs.rs/outbox-diesel):
//! the [`Message`] and [`Handler`] traits, the [`Registry`] that `#[outbox_handler]` fills at
//! link time, the [`Context`] handlers run with, the [`Destination`](destination::Destination)
//! trait every transport implements (webhooks in `outbox-webhook`, brokers in `outbox-relay`),
//! and the [`Worker`].
//!
//! Applications use these through `outbox-diesel`, which re-exports them next to the
//! transactional enqueue; depend on this crate directly only to write a storage backend or a
//! destination.
//!
//! ```
//! use outbox_core::{Context, Delivery, Handler, Message, MessageId, ProcessError, Resources};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct ThankYou {
//!     member_id: i64,
//! }
//!
//! // `#[outbox_handler("comment.thankYou")]` writes this impl and registers the handler.
//! impl Message for ThankYou {
//!     const MESSAGE_TYPE: &'static str = "comment.thankYou";
//! }
//!
//! impl Handler for ThankYou {
//!     fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
//!         let greeting = ctx.resource::<String>()?;
//!         println!("{greeting}, member {} (message {})", self.member_id, ctx.message_id());
//!         Ok(())
//!     }
//! }
//!
//! // Handlers are plain code, so they can be tested without a worker.
//! let resources = Resources::new().with(String::from("Thank you"));
//! let delivery = Delivery {
//!     message_id: MessageId::new(),
//!     message_type: ThankYou::MESSAGE_TYPE.into(),
//!     attempt: 1,
//!     headers: Default::default(),
//!     ordering_key: None,
//!     priority: Default::default(),
//! };
//! ThankYou { member_id: 7 }
//!     .process(&mut Context::new(&delivery, &resources))
//!     .unwrap();
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs, missing_debug_implementations)]

mod answer;
mod context;
pub mod destination;
mod error;
mod headers;
mod message;
mod message_id;
pub mod metrics;
mod priority;
mod registry;
mod retry;
pub mod store;
pub mod subscription;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod worker;

pub use context::{Context, Resources};
pub use destination::Delivery;
pub use error::{FailureKind, ProcessError};
pub use headers::{
    is_reserved_header, HeaderError, Headers, MAX_HEADERS, MAX_HEADER_BYTES, TRACEPARENT,
    TRACESTATE,
};
pub use message::{Handler, Message};
pub use message_id::{MessageId, ParseMessageIdError};
pub use priority::Priority;
pub use registry::{DispatchError, HandlerRegistration, Registry, RegistryError};
pub use retry::RetryPolicy;
pub use worker::{
    Health, Stopper, SubscriptionDelivery, Worker, WorkerBuilder, WorkerError, WorkerHandle,
    WorkerStats,
};

/// What the generated code and `outbox-diesel` need; not a stable API, may change in any
/// release.
#[doc(hidden)]
pub mod __private {
    pub use crate::worker::notify_enqueued;
    pub use inventory;
}
