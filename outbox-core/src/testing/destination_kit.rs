//! The destination conformance kit: what the worker counts on from every [`Destination`], as
//! checks a destination of any kind runs against a [`DestinationHarness`] of its own (a real
//! receiver it can read back, stop answering and restart). A destination that passes them
//! classifies its failures the way the worker's health, retries and push-back expect.
//!
//! [`destination_conformance!`](crate::destination_conformance) writes one test per check;
//! `examples/redis-destination` runs it on a destination that depends on `outbox-core` only, as
//! a third party's would.

// The checks are tests: a broken contract panics with what broke, as an assertion does.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use crate::destination::{Destination, Envelope, Scope};
use crate::error::FailureKind;
use crate::headers::Headers;
use crate::message_id::MessageId;

/// What the checks need besides the destination: a receiver to deliver to and read back,
/// and ways to make it misbehave. Each check gets a harness of its own.
pub trait DestinationHarness {
    /// The destination under test.
    type Destination: Destination;

    /// A destination that delivers to the harness's receiver.
    fn destination(&self) -> Self::Destination;

    /// A destination of the same kind whose other side nothing answers (a loopback port
    /// nothing listens on).
    fn unreachable(&self) -> Self::Destination;

    /// What the receiver got so far, in order of arrival, decoded from the transport.
    fn received(&self) -> Vec<Received>;

    /// Makes the receiver ask the next delivery to wait `wait` (an HTTP `429` with
    /// `Retry-After`, a broker's flow control); `false` if the transport has no way to.
    fn push_back(&self, wait: Duration) -> bool;

    /// Restarts the receiver: every connection a destination holds to it goes stale, and it
    /// answers again once this returns.
    fn restart(&self);
}

/// A delivery as the receiver got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The message id the transport carried.
    pub message_id: String,
    /// The message type the transport carried.
    pub message_type: String,
    /// The message's body, as the envelope had it.
    pub body: Vec<u8>,
    /// The message's own headers the transport carried (names lowercased).
    pub headers: Vec<(String, String)>,
}

/// Writes one `#[test]` per check of the [destination kit](crate::testing::destination_kit),
/// each on the harness `$harness` evaluates to (once per test). With `optional`, `$harness` is
/// an `Option`: `None` skips the check (a harness whose receiver cannot be reached says why).
#[macro_export]
macro_rules! destination_conformance {
    (optional $harness:expr) => {
        $crate::destination_conformance!(@checks $harness;
            the_kind_names_the_transport,
            a_delivery_arrives_whole_with_its_metadata,
            an_unreachable_receiver_fails_the_destination_within_its_timeout,
            a_receiver_that_pushes_back_defers_without_an_attempt,
            deliveries_go_on_after_the_receiver_restarts,
            a_batch_says_what_became_of_each_envelope,
            a_batch_to_an_unreachable_receiver_fails_within_the_timeout,
        );
    };
    ($harness:expr) => {
        $crate::destination_conformance!(optional Some($harness));
    };
    (@checks $harness:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                if let Some(harness) = $harness {
                    $crate::testing::destination_kit::$check(&harness);
                }
            }
        )*
    };
}

/// How long a receiver may take to show a delivery it acknowledged.
const ARRIVAL: Duration = Duration::from_secs(10);

/// The longest an unreachable receiver's failure may take beyond the destination's timeout.
const SLACK: Duration = Duration::from_secs(2);

/// Message `n`: JSON body `{"n":n}` and one header of the message's own.
fn envelope(n: u32) -> Envelope {
    let mut headers = Headers::new();
    headers
        .insert("kit-trace", &format!("trace-{n}"))
        .expect("a valid header");
    let mut envelope = Envelope::new(
        MessageId::new(),
        "kit.message",
        format!(r#"{{"n":{n}}}"#).into_bytes(),
    );
    envelope.headers = headers;
    envelope
}

/// Waits until what the receiver got is `enough`; what it got by then.
fn wait_received(
    h: &impl DestinationHarness,
    enough: impl Fn(&[Received]) -> bool,
) -> Vec<Received> {
    let deadline = Instant::now() + ARRIVAL;
    loop {
        let received = h.received();
        if enough(&received) || Instant::now() >= deadline {
            return received;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A destination names its kind: what operators see beside its name, and the delivery log's
/// and the metrics' label.
pub fn the_kind_names_the_transport(h: &impl DestinationHarness) {
    let kind = h.destination().kind();
    assert!(
        !kind.is_empty()
            && kind
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'),
        "a kind is a short lowercase word, not `{kind}`"
    );
}

/// A delivery the destination acknowledges has arrived, with the message's id, type, body
/// and own headers: receivers drop duplicates by the id.
pub fn a_delivery_arrives_whole_with_its_metadata(h: &impl DestinationHarness) {
    let destination = h.destination();
    let sent = envelope(1);
    destination
        .deliver_answered(&sent)
        .expect("a receiver that answers takes the delivery");
    let received = wait_received(h, |received| !received.is_empty());
    assert_eq!(
        received.len(),
        1,
        "exactly one delivery arrived: {received:?}"
    );
    let got = &received[0];
    assert_eq!(got.message_id, sent.message_id.to_string());
    assert_eq!(got.message_type, sent.message_type);
    assert_eq!(got.body, sent.body, "the body arrives byte for byte");
    assert!(
        got.headers
            .iter()
            .any(|(name, value)| name == "kit-trace" && value == "trace-1"),
        "the message's own header travels with it: {:?}",
        got.headers
    );
}

/// A receiver nothing answers for is the destination's failure (retryable, so that enough in a
/// row pause it), and the attempt ends within the destination's own timeout: the worker's
/// watchdog is set from it.
pub fn an_unreachable_receiver_fails_the_destination_within_its_timeout(
    h: &impl DestinationHarness,
) {
    let destination = h.unreachable();
    let bound = match destination.timeout() {
        Duration::ZERO => Duration::from_secs(30),
        timeout => timeout + SLACK,
    };
    let started = Instant::now();
    let error = destination
        .deliver(&envelope(1))
        .expect_err("nothing answers");
    let took = started.elapsed();
    assert_eq!(error.kind(), FailureKind::Retryable, "{}", error.reason());
    assert_eq!(error.scope(), Scope::Destination, "{}", error.reason());
    assert!(
        took <= bound,
        "the attempt took {took:?}, more than its destination's timeout allows ({bound:?})"
    );
    assert!(h.received().is_empty());
}

/// A receiver that asks for time holds the whole destination for that time, and the attempt is
/// not counted (a deferral, not a failure); the next delivery goes through.
pub fn a_receiver_that_pushes_back_defers_without_an_attempt(h: &impl DestinationHarness) {
    let wait = Duration::from_secs(3);
    if !h.push_back(wait) {
        return;
    }
    let destination = h.destination();
    let error = destination
        .deliver(&envelope(1))
        .expect_err("the receiver pushed back");
    assert_eq!(error.kind(), FailureKind::Deferred, "{}", error.reason());
    assert_eq!(error.scope(), Scope::Destination, "{}", error.reason());
    let delay = error.delay().expect("a push-back says how long");
    assert!(
        delay >= Duration::from_secs(1) && delay <= wait,
        "asked to wait {wait:?}, the destination says {delay:?}"
    );
    destination
        .deliver(&envelope(2))
        .expect("the receiver answers again");
}

/// After the receiver restarts, deliveries go on through the same destination: a connection
/// that went stale is reconnected, and a failure meanwhile is retryable, never the message's
/// end.
pub fn deliveries_go_on_after_the_receiver_restarts(h: &impl DestinationHarness) {
    let destination = h.destination();
    destination
        .deliver(&envelope(1))
        .expect("the receiver answers");
    h.restart();
    let deadline = Instant::now() + ARRIVAL;
    let mut failures = Vec::new();
    let after = envelope(2);
    loop {
        match destination.deliver(&after) {
            Ok(()) => break,
            Err(error) => {
                assert_ne!(
                    error.kind(),
                    FailureKind::Permanent,
                    "a restart is no reason to give a message up: {}",
                    error.reason()
                );
                failures.push(error.reason().to_owned());
            }
        }
        assert!(
            Instant::now() < deadline,
            "no delivery went through after the restart: {failures:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A receiver may forget what it had before its restart (a broker keeping it in memory).
    let id = after.message_id.to_string();
    let received = wait_received(h, |received| received.iter().any(|r| r.message_id == id));
    assert!(
        received.iter().any(|r| r.message_id == id),
        "the delivery after the restart did not arrive: {received:?}"
    );
}

/// How many envelopes the batch checks send: as many as the destination takes at once, up to
/// a handful.
fn batch_size(destination: &impl Destination) -> u32 {
    u32::try_from(destination.batch_limit().clamp(1, 8)).unwrap_or(8)
}

/// A batch gives one outcome per envelope, and each envelope it says it delivered has arrived,
/// once, whole.
pub fn a_batch_says_what_became_of_each_envelope(h: &impl DestinationHarness) {
    let destination = h.destination();
    let sent: Vec<Envelope> = (1..=batch_size(&destination)).map(envelope).collect();
    let outcomes = destination.deliver_batch(&sent);
    assert_eq!(
        outcomes.len(),
        sent.len(),
        "one outcome per envelope: {outcomes:?}"
    );
    for (envelope, outcome) in sent.iter().zip(&outcomes) {
        if let Err(error) = outcome {
            panic!(
                "a receiver that answers takes every envelope of a batch; {} failed: {}",
                envelope.message_id,
                error.reason()
            );
        }
    }
    let received = wait_received(h, |received| received.len() >= sent.len());
    for envelope in &sent {
        let id = envelope.message_id.to_string();
        let arrived: Vec<&Received> = received.iter().filter(|r| r.message_id == id).collect();
        assert_eq!(arrived.len(), 1, "{id} arrived once: {received:?}");
        assert_eq!(
            arrived[0].body, envelope.body,
            "the body arrives byte for byte"
        );
    }
    assert_eq!(
        received.len(),
        sent.len(),
        "nothing else arrived: {received:?}"
    );
}

/// A batch to a receiver nothing answers for fails each envelope as the destination's failure,
/// and the whole call ends within the destination's timeout, as one delivery does: the worker's
/// watchdog allows a batch no longer.
pub fn a_batch_to_an_unreachable_receiver_fails_within_the_timeout(h: &impl DestinationHarness) {
    let destination = h.unreachable();
    let bound = match destination.timeout() {
        Duration::ZERO => Duration::from_secs(30),
        timeout => timeout + SLACK,
    };
    let sent: Vec<Envelope> = (1..=batch_size(&destination)).map(envelope).collect();
    let started = Instant::now();
    let outcomes = destination.deliver_batch(&sent);
    let took = started.elapsed();
    assert_eq!(outcomes.len(), sent.len(), "one outcome per envelope");
    for outcome in outcomes {
        let error = outcome.expect_err("nothing answers");
        assert_eq!(error.kind(), FailureKind::Retryable, "{}", error.reason());
        assert_eq!(error.scope(), Scope::Destination, "{}", error.reason());
    }
    assert!(
        took <= bound,
        "the batch took {took:?}, more than its destination's timeout allows ({bound:?})"
    );
    assert!(h.received().is_empty());
}
