//! Relays [outbox](https://docs.rs/outbox-diesel) messages to brokers, with the guarantees the
//! outbox gives webhooks: a message leaves the outbox only once the broker has acknowledged
//! it, a retry carries the same message id, and what the broker will never take is
//! dead-lettered with the reason while the rest is retried.
//!
//! Each broker is a [`Destination`](outbox_core::destination::Destination) behind a feature,
//! so an application builds only the client it uses:
//!
//! | feature     | destination              | acknowledged by                | duplicates                          |
//! |-------------|--------------------------|--------------------------------|-------------------------------------|
//! | `jetstream` | [`JetStreamDestination`] | the stream's publish ack       | dropped by the stream (`Nats-Msg-Id`) within its duplicate window |
//! | `rabbitmq`  | [`RabbitMqDestination`]  | a publisher confirm (mandatory, persistent) | consumers drop them by `message_id` |
//! | `kafka`     | [`KafkaDestination`]     | the delivery report of an idempotent producer with `acks=all` | consumers drop them by the id header |
//!
//! Build one at start-up, give it to the worker under a name, and route message types to it
//! (`#[outbox_handler("order.shipped", deliver_to = "orders")]`) or deliver to it from a
//! handler (`ctx.destination("orders")?.deliver_to("orders.shipped", &self)`). The worker wraps
//! it as it wraps webhooks: a broker that keeps failing is paused and probed, its messages wait
//! without spending attempts; a broker that pushes back (a full stream or queue, a blocked
//! connection: [`RelayError::Refused`]) is held as a webhook answering `429` is, without
//! spending attempts or pausing it, and its rate is learned; its deliveries are counted in the
//! metrics. A publish blocks
//! the handler thread until the broker acknowledges. The async clients (JetStream, RabbitMQ)
//! run on one small runtime the destination owns for its lifetime, built and dropped safely
//! even inside another async runtime (e.g. a web framework's start-up); librdkafka runs on its
//! own threads.
//!
//! Every published message carries its outbox id ([`MESSAGE_ID_HEADER`]), its type
//! ([`MESSAGE_TYPE_HEADER`]), its ordering key if it has one ([`ORDERING_KEY_HEADER`]) and
//! the headers it was enqueued with (`traceparent` among them). The body is the message's data,
//! as JSON. The worker processes one message of an ordering key at a time and only after the
//! previous one was acknowledged, so per-key order carries into the stream or queue.
//!
//! ```no_run
//! # #[cfg(feature = "jetstream")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_relay::JetStreamDestination;
//!
//! let comments = JetStreamDestination::builder("nats://127.0.0.1:4222")
//!     .subject("blog.comments")
//!     .build()?;
//! // Worker::builder(store).destination("comments", comments), and on the message's struct:
//! // #[outbox_handler("comment.posted", deliver_to = "comments")]
//! # drop(comments);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "jetstream"))]
//! # fn main() {}
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs, missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
#[cfg(feature = "jetstream")]
mod jetstream;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
#[cfg(any(feature = "jetstream", feature = "rabbitmq"))]
mod runtime;

pub use error::{RelayError, PUSH_BACK_WAIT};
#[cfg(feature = "jetstream")]
pub use jetstream::{JetStreamDestination, JetStreamDestinationBuilder};
#[cfg(feature = "kafka")]
pub use kafka::{KafkaDestination, KafkaDestinationBuilder};
pub use outbox_core::destination::{MESSAGE_ID_HEADER, MESSAGE_TYPE_HEADER, ORDERING_KEY_HEADER};
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::{RabbitMqDestination, RabbitMqDestinationBuilder};

/// A broker URL without its password, for errors and logs.
#[cfg_attr(
    not(any(feature = "jetstream", feature = "rabbitmq")),
    allow(dead_code)
)]
fn shown_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::shown_url;

    #[test]
    fn passwords_stay_out_of_names() {
        assert_eq!(
            shown_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://***@127.0.0.1:5672/%2f"
        );
        assert_eq!(shown_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }
}
