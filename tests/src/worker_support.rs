//! What the worker tests share: pools, endpoints, handlers, and waiting.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, Pool, R2D2Connection};
use outbox_diesel::admin::{
    dead_letters, pending_messages, DeadLetter, ListOptions, PendingMessage,
};
use outbox_diesel::webhook::{WebhookEndpoint, WebhookSecret};
use outbox_diesel::{OutboxConnection, PoolCustomizer};

use crate::TestDb;

/// The secret every test endpoint signs with.
pub const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A connection type the worker tests can use on any backend.
pub trait TestConnection: OutboxConnection + R2D2Connection + Send + 'static {}
impl<C> TestConnection for C where C: OutboxConnection + R2D2Connection + Send + 'static {}

/// A migrated pool of `size` connections to the test's database.
pub fn pool<C: TestConnection>(db: &TestDb, size: u32) -> Pool<ConnectionManager<C>> {
    let pool = Pool::builder()
        .max_size(size)
        .connection_timeout(Duration::from_secs(30))
        .connection_customizer(Box::new(PoolCustomizer))
        .build(ConnectionManager::<C>::new(db.url()))
        .expect("building a pool");
    outbox_diesel::run_migrations(&mut pool.get().expect("a connection"))
        .expect("outbox migrations");
    pool
}

/// The secret as a value.
pub fn secret() -> WebhookSecret {
    WebhookSecret::parse(SECRET).expect("the test secret parses")
}

/// An endpoint at `url` that may dial 127.0.0.1, with a short timeout.
pub fn endpoint(url: &str, timeout: Duration) -> WebhookEndpoint {
    WebhookEndpoint::builder(url)
        .secret(secret())
        .timeout(timeout)
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .build()
        .expect("building the test endpoint")
}

/// Every pending message.
pub fn pending<C: TestConnection>(pool: &Pool<ConnectionManager<C>>) -> Vec<PendingMessage> {
    pending_messages(
        &mut pool.get().expect("a connection"),
        &ListOptions::new().limit(1_000_000),
    )
    .expect("listing pending messages")
}

/// Every dead letter.
pub fn dead<C: TestConnection>(pool: &Pool<ConnectionManager<C>>) -> Vec<DeadLetter> {
    dead_letters(
        &mut pool.get().expect("a connection"),
        &ListOptions::new().limit(1_000_000),
    )
    .expect("listing dead letters")
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
