//! The benchmark's messages (one delivered to the receiver, one whose handler does nothing)
//! and the webhook endpoint they are delivered to.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use outbox_diesel::destination::{DeliveryError, Destination, Envelope};
use outbox_diesel::webhook::{WebhookEndpoint, WebhookSecret};
use outbox_diesel::{outbox_handler, Context, Handler, ProcessError};
use serde::{Deserialize, Serialize};

use crate::{Res, WithContext};

/// The secret deliveries are signed with.
pub const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// An endpoint to the receiver at `url`, allowed to dial 127.0.0.1.
pub fn endpoint(url: &str) -> Res<WebhookEndpoint> {
    WebhookEndpoint::builder(url)
        .secret(WebhookSecret::parse(SECRET).ctx("parsing the webhook secret")?)
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .timeout(Duration::from_secs(10))
        .build()
        .ctx("building the webhook endpoint")
}

/// The name of the webhook destination [`Hook`] goes to.
pub const HOOK: &str = "hook";

/// The name of the broker destination [`Relayed`] goes to.
pub const RELAY: &str = "relay";

/// The text every benchmark message carries, so payloads have a realistic size (~100 bytes).
pub const NOTE: &str = "Thank you for your first comment on this blog; we hope to read you again.";

/// Delivered to the worker's webhook endpoint (a signed POST), like a real notification.
#[outbox_handler("bench.hook")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hook {
    /// A sequence number.
    pub n: u64,
    /// A business key.
    pub member_id: i64,
    /// Padding to a realistic size.
    pub note: String,
}

impl Hook {
    /// Message number `n`.
    pub fn new(n: u64) -> Hook {
        Hook {
            n,
            member_id: i64::try_from(n % 1_000_000).unwrap_or(0),
            note: NOTE.to_owned(),
        }
    }
}

impl Hook {
    /// Message number `n` with a note of `bytes` bytes: a payload of about that size.
    pub fn sized(n: u64, bytes: usize) -> Hook {
        Hook {
            note: "x".repeat(bytes),
            ..Hook::new(n)
        }
    }
}

impl Handler for Hook {
    fn process(self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        ctx.destination(HOOK)?.deliver(&self)
    }
}

/// Processed by doing nothing: what is left is the worker's database work.
#[outbox_handler("bench.noop")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Noop {
    /// A sequence number.
    pub n: u64,
    /// A business key.
    pub member_id: i64,
    /// Padding to a realistic size.
    pub note: String,
}

impl Noop {
    /// Message number `n`.
    pub fn new(n: u64) -> Noop {
        let Hook { n, member_id, note } = Hook::new(n);
        Noop { n, member_id, note }
    }
}

impl Handler for Noop {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// The JSON body `WebhookEndpoint::deliver` sends for a message: the same envelope, built the
/// same way, for the baselines that POST without a worker.
pub fn envelope(message_id: &str, message_type: &str, data: &impl Serialize) -> Vec<u8> {
    #[derive(Serialize)]
    struct Envelope<'a, T> {
        id: &'a str,
        #[serde(rename = "type")]
        message_type: &'a str,
        data: &'a T,
    }
    serde_json::to_vec(&Envelope {
        id: message_id,
        message_type,
        data,
    })
    .unwrap_or_default()
}

/// The envelope around a payload that is already JSON text (as read from the outbox table).
pub fn envelope_raw(message_id: &str, message_type: &str, payload: &str) -> Vec<u8> {
    format!(r#"{{"id":"{message_id}","type":"{message_type}","data":{payload}}}"#).into_bytes()
}

/// Routed to the worker's destination [`RELAY`] as it is stored, like a domain event relayed to
/// a broker: a broker destination gets a backlog of them in batches.
#[outbox_handler("bench.relay", deliver_to = "relay")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Relayed {
    /// A sequence number.
    pub n: u64,
    /// A business key.
    pub member_id: i64,
    /// Padding to a realistic size.
    pub note: String,
}

impl Relayed {
    /// Message number `n`.
    pub fn new(n: u64) -> Relayed {
        let Hook { n, member_id, note } = Hook::new(n);
        Relayed { n, member_id, note }
    }
}

/// The destination [`Relayed`] is routed to in every scenario but `drain --destination`, which
/// gives the broker's: a routed type's destination must be there when a worker starts, and no
/// other scenario enqueues a [`Relayed`].
#[derive(Debug)]
pub struct Unrelayed;

impl Destination for Unrelayed {
    fn kind(&self) -> &'static str {
        "unrelayed"
    }

    fn deliver(&self, _: &Envelope) -> Result<(), DeliveryError> {
        Err(DeliveryError::permanent(
            "this benchmark scenario relays nothing to a broker",
        ))
    }
}

/// An event for subscribers: the `fanout` scenario's.
#[outbox_handler("bench.event", deliver_to = "subscribers")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// A sequence number.
    pub n: u64,
    /// Padding to a realistic size.
    pub note: String,
}

impl Event {
    /// Event number `n`.
    pub fn new(n: u64) -> Event {
        Event {
            n,
            note: NOTE.to_owned(),
        }
    }
}

/// How every benchmark worker delivers to subscriptions (only `fanout` makes any): signed
/// webhooks to receivers on 127.0.0.1, secrets stored as they are.
pub fn subscribers() -> outbox_diesel::SubscriptionDelivery {
    subscription_settings().delivery()
}

/// What `fanout` creates its subscriptions with, and its workers deliver them with.
pub fn subscription_settings() -> outbox_diesel::subscription::Subscriptions {
    outbox_diesel::subscription::Subscriptions::new()
        .allow_address(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
        .timeout(std::time::Duration::from_secs(10))
}
