//! What travels with a relayed message besides its data, the same on every broker.

// Each broker uses its part of this; with one feature alone the other's part is unused.
#![cfg_attr(
    not(all(feature = "jetstream", feature = "rabbitmq")),
    allow(dead_code)
)]

use outbox_core::Context;
use serde::Serialize;

use crate::error::RelayError;

/// The header carrying the message's id, the same on every attempt: consumers drop
/// duplicates by it.
pub const MESSAGE_ID_HEADER: &str = "outbox-message-id";
/// The header carrying the message's type string.
pub const MESSAGE_TYPE_HEADER: &str = "outbox-message-type";
/// The header carrying the message's ordering key, if it has one.
pub const ORDERING_KEY_HEADER: &str = "outbox-ordering-key";

/// A message ready to publish: its body and the headers that go with it.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub id: String,
    pub message_type: String,
    pub body: Vec<u8>,
    /// The outbox headers first, then the message's own (a message cannot override the
    /// outbox's).
    pub headers: Vec<(String, String)>,
}

impl Outgoing {
    pub fn json<T: Serialize + ?Sized>(
        ctx: &Context<'_>,
        data: &T,
        destination: &str,
    ) -> Result<Outgoing, RelayError> {
        let body = serde_json::to_vec(data).map_err(|source| RelayError::Serialize {
            destination: destination.to_owned(),
            source,
        })?;
        Ok(Outgoing::bytes(ctx, body))
    }

    pub fn bytes(ctx: &Context<'_>, body: Vec<u8>) -> Outgoing {
        let id = ctx.message_id().to_string();
        let message_type = ctx.message_type().to_owned();
        let mut headers = vec![
            (MESSAGE_ID_HEADER.to_owned(), id.clone()),
            (MESSAGE_TYPE_HEADER.to_owned(), message_type.clone()),
        ];
        if let Some(key) = ctx.ordering_key() {
            headers.push((ORDERING_KEY_HEADER.to_owned(), key.to_owned()));
        }
        headers.extend(
            ctx.headers()
                .iter()
                .filter(|(name, _)| !is_set_by_the_relay(name))
                .map(|(name, value)| (name.to_owned(), value.to_owned())),
        );
        Outgoing {
            id,
            message_type,
            body,
            headers,
        }
    }
}

/// Headers the relay sets itself, which a message's own headers must not forge.
fn is_set_by_the_relay(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with("outbox-") || name.starts_with("nats-")
}

#[cfg(test)]
mod tests {
    use outbox_core::{Delivery, Headers, MessageId, Resources};

    use super::*;

    #[test]
    fn id_type_key_and_the_messages_headers_go_along_and_cannot_be_forged() {
        let mut headers = Headers::new();
        headers
            .insert(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .unwrap();
        headers.insert("Outbox-Message-Id", "forged").unwrap();
        headers.insert("Nats-Msg-Id", "forged").unwrap();
        let delivery = Delivery {
            message_id: MessageId::new(),
            message_type: "order.shipped".into(),
            attempt: 2,
            headers,
            ordering_key: Some("order-7".into()),
        };
        let resources = Resources::new();
        let ctx = Context::new(&delivery, &resources);
        let out = Outgoing::json(&ctx, &serde_json::json!({"n": 1}), "test").unwrap();
        assert_eq!(out.body, br#"{"n":1}"#);
        let id = delivery.message_id.to_string();
        let expected: Vec<(String, String)> = [
            (MESSAGE_ID_HEADER, id.as_str()),
            (MESSAGE_TYPE_HEADER, "order.shipped"),
            (ORDERING_KEY_HEADER, "order-7"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        assert_eq!(out.headers, expected);
    }
}
