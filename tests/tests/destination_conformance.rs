//! The destination conformance kit (`outbox_core::testing::destination_kit`) run on the
//! workspace's destinations, each against a real receiver on 127.0.0.1.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::testing::destination_kit::{DestinationHarness, Received};
use outbox_diesel::webhook::WebhookEndpoint;
use outbox_testkit::http::{Receiver, Reply};
use outbox_testkit::outbox::endpoint;

/// A loopback address nothing listens on.
fn closed_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let address = listener.local_addr().expect("the bound address");
    drop(listener);
    address.to_string()
}

/// A signed webhook endpoint and a receiver that answers 200 unless told otherwise.
struct Webhook {
    receiver: Receiver,
}

impl DestinationHarness for Webhook {
    type Destination = WebhookEndpoint;

    fn destination(&self) -> WebhookEndpoint {
        endpoint(&self.receiver.url("/hook"), Duration::from_secs(2))
    }

    fn unreachable(&self) -> WebhookEndpoint {
        endpoint(
            &format!("http://{}/hook", closed_address()),
            Duration::from_secs(2),
        )
    }

    fn received(&self) -> Vec<Received> {
        self.receiver
            .requests()
            .into_iter()
            .filter(|request| (200..300).contains(&request.answered))
            .map(|request| {
                let body = request.json();
                Received {
                    message_id: request.webhook_id().unwrap_or_default().to_owned(),
                    message_type: body["type"].as_str().unwrap_or_default().to_owned(),
                    body: serde_json::to_vec(&body["data"]).unwrap(),
                    headers: request.headers.clone(),
                }
            })
            .collect()
    }

    fn push_back(&self, wait: Duration) -> bool {
        let pushed = Arc::new(AtomicBool::new(false));
        let seconds = wait.as_secs().to_string();
        self.receiver.set_behaviour(move |_, _| {
            if pushed.swap(true, Ordering::SeqCst) {
                Reply::status(200)
            } else {
                Reply::with_header(429, "retry-after", &seconds)
            }
        });
        true
    }

    fn restart(&self) {
        self.receiver.restart();
    }
}

mod webhook {
    outbox_core::destination_conformance!(super::Webhook {
        receiver: outbox_testkit::http::Receiver::ok(),
    });
}
