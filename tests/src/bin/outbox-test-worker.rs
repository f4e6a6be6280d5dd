//! A worker process for tests that kill it; see `outbox_tests::worker_process`. It also fans
//! out `test.event`, an event for subscribers, and relays `test.routed` (registered here only:
//! the other test binaries' workers deliver to no subscriptions and have no relay).

/// An event for subscribers.
#[outbox_diesel::outbox_handler("test.event", deliver_to = "subscribers")]
#[derive(serde::Serialize, serde::Deserialize)]
struct Event {
    n: u32,
}

outbox_tests::declare_routed!();

fn main() {
    outbox_tests::worker_process::run_from_env()
}
