//! Delivery of [outbox](https://docs.rs/outbox-diesel) messages to HTTP webhooks, signed the
//! Standard Webhooks way, and the verifier for receivers.
//!
//! A [`WebhookEndpoint`] POSTs messages to one receiver, signed as
//! [Standard Webhooks](https://www.standardwebhooks.com) specifies (`webhook-id`,
//! `webhook-timestamp` and `webhook-signature` headers, HMAC-SHA256 with a `whsec_` secret), and
//! classifies the answer for the worker (see [`WebhookError::into_delivery_error`]). It is a
//! [`Destination`](outbox_core::destination::Destination): build it once, give it to the worker
//! under a name, and route message types to that name; the worker wraps it with the health
//! gate (pause, probe, disable) and metrics every destination gets. Applications use this
//! crate through `outbox-diesel`'s `webhook` feature (`outbox_diesel::webhook`).
//!
//! ```
//! use std::time::Duration;
//!
//! use outbox_webhook::{WebhookEndpoint, WebhookSecret};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mail = WebhookEndpoint::builder("https://mail.example.com/hooks")
//!     .secret(WebhookSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")?)
//!     .timeout(Duration::from_secs(5))
//!     .header("x-tenant", "acme")
//!     .build()?;
//! // Worker::builder(store).destination("mail", mail), and on the message's struct:
//! // #[outbox_handler("comment.thankYou", deliver_to = "mail")]
//! # drop(mail);
//! # Ok(())
//! # }
//! ```
//!
//! Receivers check deliveries with [`verify`], against the raw body as received:
//!
//! ```
//! use std::time::{Duration, SystemTime};
//!
//! use outbox_webhook::{verify_at, WebhookSecret, DEFAULT_TOLERANCE};
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
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs, missing_debug_implementations)]

mod client;
mod endpoint;
mod error;
mod guard;
mod secret;
mod verify;

pub use endpoint::{
    check_receiver_url, WebhookEndpoint, WebhookEndpointBuilder, WebhookResponse, DEFAULT_TIMEOUT,
};
pub use error::WebhookError;
pub use guard::is_special_purpose;
pub use secret::{WebhookSecret, MIN_SECRET_LEN};
pub use verify::{
    verify, verify_at, VerifiedWebhook, VerifyError, WebhookHeaders, DEFAULT_TOLERANCE,
};
