//! Delivery to HTTP webhooks, signed the Standard Webhooks way, and the verifier for receivers.
//!
//! A [`WebhookEndpoint`] POSTs messages to one receiver, signed as
//! [Standard Webhooks](https://www.standardwebhooks.com) specifies (`webhook-id`,
//! `webhook-timestamp` and `webhook-signature` headers, HMAC-SHA256 with a `whsec_` secret), and
//! classifies the answer as success, retryable or permanent failure for the worker. Build it once,
//! put it in the worker's [`Resources`](crate::Resources), and call
//! [`deliver`](WebhookEndpoint::deliver) from a handler:
//!
//! ```
//! use std::time::Duration;
//!
//! use outbox_core::webhook::{WebhookEndpoint, WebhookSecret};
//! use outbox_core::{Context, Handler, Message, ProcessError, Resources};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderShipped {
//!     order_id: i64,
//! }
//!
//! impl Message for OrderShipped {
//!     const MESSAGE_TYPE: &'static str = "order.shipped";
//! }
//!
//! impl Handler for OrderShipped {
//!     fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
//!         // POSTs {"id": <message id>, "type": "order.shipped", "data": {"order_id": ..}}.
//!         ctx.resource::<WebhookEndpoint>()?.deliver(ctx, &self)
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let endpoint = WebhookEndpoint::builder("https://hooks.example.com/orders")
//!     .secret(WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?)
//!     .timeout(Duration::from_secs(5))
//!     .header("x-tenant", "acme")
//!     .build()?;
//! let resources = Resources::new().with(endpoint);
//! # assert!(resources.get::<WebhookEndpoint>().is_some());
//! # Ok(())
//! # }
//! ```
//!
//! Receivers check deliveries with [`verify`], against the raw body as received:
//!
//! ```
//! use std::time::{Duration, SystemTime};
//!
//! use outbox_core::webhook::{verify_at, WebhookSecret, DEFAULT_TOLERANCE};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?;
//! let headers = [
//!     ("webhook-id", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"),
//!     ("webhook-timestamp", "1649367553"),
//!     ("webhook-signature", "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="),
//! ];
//! let body = br#"{"email":"test@example.com","username":"test_user"}"#;
//! // `verify` uses the system clock; this example pins it to when the vector was signed.
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1649367553);
//!
//! let webhook = verify_at(&[secret], &headers, body, DEFAULT_TOLERANCE, now)?;
//! assert_eq!(webhook.id, "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk");
//! # Ok(())
//! # }
//! ```
//!
//! By default an endpoint refuses to connect to special-purpose addresses (loopback, private
//! networks, link-local cloud metadata services, ...; see [`is_special_purpose`]), checked on
//! the address actually dialled; open a trusted internal receiver with
//! [`WebhookEndpointBuilder::allow_address`].

mod endpoint;
mod error;
mod guard;
mod health;
mod secret;
mod verify;

pub use endpoint::{WebhookEndpoint, WebhookEndpointBuilder, WebhookResponse, MAX_ENDPOINT_NAME};
pub use error::WebhookError;
pub use guard::is_special_purpose;
pub use health::{EndpointState, HealthPolicy};
pub use secret::{WebhookSecret, MIN_SECRET_LEN};
pub use verify::{
    verify, verify_at, VerifiedWebhook, VerifyError, WebhookHeaders, DEFAULT_TOLERANCE,
};
