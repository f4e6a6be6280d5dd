//! Outbox helpers the tests share: the test signing secret, an endpoint that may dial
//! 127.0.0.1, everything pending or dead in a pool's database, and outcomes and settlements for store
//! tests.

use outbox_diesel::delivery_log::{self, AttemptFilter, LoggedAttempt};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use diesel::r2d2::{ManageConnection, Pool};
use outbox_diesel::admin::{
    dead_letters, pending_messages, DeadLetter, ListOptions, PendingMessage,
};
use outbox_diesel::store::{
    ClaimLimit, ClaimToken, ClaimedMessage, Outcome, Settlement, Store, SuccessorLease,
};
use outbox_diesel::webhook::{WebhookEndpoint, WebhookSecret};
use outbox_diesel::OutboxConnection;

/// The secret every test endpoint signs with (the Standard Webhooks test vector's).
pub const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// [`SECRET`] as a value.
pub fn secret() -> WebhookSecret {
    WebhookSecret::parse(SECRET).expect("the test secret parses")
}

/// An endpoint at `url` signed with [`SECRET`] that may dial 127.0.0.1, with `timeout`.
pub fn endpoint(url: &str, timeout: Duration) -> WebhookEndpoint {
    WebhookEndpoint::builder(url)
        .secret(secret())
        .timeout(timeout)
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .build()
        .expect("building the test endpoint")
}

/// How the tests, the test worker process and the drills see subscriptions: secrets encrypted
/// with a test key, receivers on 127.0.0.1 trusted, deliveries cut at 5 s.
pub fn subscriptions() -> outbox_diesel::subscription::Subscriptions {
    outbox_diesel::subscription::Subscriptions::new()
        .secret_key("test-key", [7; 32])
        .allow_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .timeout(Duration::from_secs(5))
}

/// Every pending message in the pool's database.
pub fn pending<M>(pool: &Pool<M>) -> Vec<PendingMessage>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    pending_messages(
        &mut pool.get().expect("a connection"),
        &ListOptions::new().limit(1_000_000),
    )
    .expect("listing pending messages")
}

/// Every dead letter in the pool's database.
pub fn dead<M>(pool: &Pool<M>) -> Vec<DeadLetter>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    dead_letters(
        &mut pool.get().expect("a connection"),
        &ListOptions::new().limit(1_000_000),
    )
    .expect("listing dead letters")
}

/// The delivery log's attempts that `filter` selects, newest first, however many.
pub fn attempts<M>(pool: &Pool<M>, filter: &AttemptFilter) -> Vec<LoggedAttempt>
where
    M: ManageConnection,
    M::Connection: OutboxConnection,
{
    let filter = AttemptFilter {
        limit: u32::MAX,
        ..filter.clone()
    };
    delivery_log::attempts(&mut pool.get().expect("a connection"), &filter)
        .expect("reading the delivery log")
}

/// The outcome `settlement` of `message`, claimed under `token`.
pub fn outcome(token: ClaimToken, message: &ClaimedMessage, settlement: Settlement) -> Outcome {
    Outcome::of(token, message, settlement)
}

/// Up to `count` messages claimed from `store` under a new token, leased for `lease`.
pub fn claim(
    store: &impl Store,
    count: usize,
    lease: Duration,
) -> (ClaimToken, Vec<ClaimedMessage>) {
    let token = ClaimToken::new();
    let claimed = store
        .claim(token, ClaimLimit::messages(count), lease)
        .expect("claiming");
    (token, claimed)
}

/// Settles every message of `claimed` (leased under `token`) as `settlement`; panics if any
/// was fenced.
pub fn settle_all(
    store: &impl Store,
    token: ClaimToken,
    claimed: &[ClaimedMessage],
    settlement: &Settlement,
) {
    let outcomes: Vec<Outcome> = claimed
        .iter()
        .map(|m| outcome(token, m, settlement.clone()))
        .collect();
    let fenced = store.settle(&outcomes).expect("settling");
    assert!(fenced.is_empty(), "fenced: {fenced:?}");
}

/// Settles `settled` (leased under `token`) as done through [`Store::settle_and_lease`], letting
/// it lease the next messages of their keys for `lease`, up to `per_key` of each within
/// `max_bytes` a key: the successors' token, the fenced positions and the leased messages.
pub fn settle_done_and_lease(
    store: &impl Store,
    token: ClaimToken,
    settled: &[ClaimedMessage],
    lease: Duration,
    max_bytes: usize,
    per_key: usize,
) -> (ClaimToken, Vec<i64>, Vec<ClaimedMessage>) {
    let outcomes: Vec<Outcome> = settled
        .iter()
        .map(|m| outcome(token, m, Settlement::Done))
        .collect();
    let successors = SuccessorLease {
        token: ClaimToken::new(),
        lease,
        max_bytes,
        per_key,
    };
    let (fenced, leased) = store
        .settle_and_lease(&outcomes, &successors)
        .expect("settling");
    (successors.token, fenced, leased)
}

/// An `INSERT` of one message the way enqueues wrote it before the headers column existed
/// (only the columns of the first migration), for tests that upgrade a database with messages
/// in it. `payload` is JSON; quotes are escaped here.
pub fn insert_before_headers(
    backend: outbox_diesel::Backend,
    message_type: &str,
    payload: &str,
    ordering_key: Option<&str>,
) -> String {
    let text = |value: &str| format!("'{}'", value.replace('\'', "''"));
    let key = ordering_key.map_or_else(|| "NULL".to_owned(), text);
    let id = outbox_diesel::MessageId::new();
    let (message_type, payload) = (text(message_type), text(payload));
    match backend {
        outbox_diesel::Backend::Postgres => format!(
            "INSERT INTO outbox_message (message_id, message_type, payload, ordering_key) \
             VALUES ('{id}'::uuid, {message_type}, {payload}::jsonb, {key})"
        ),
        outbox_diesel::Backend::Mysql => format!(
            "INSERT INTO outbox_message (message_id, message_type, payload, ordering_key, \
             created_at, next_attempt_at) VALUES ('{id}', {message_type}, {payload}, {key}, \
             UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
        ),
        outbox_diesel::Backend::Sqlite => format!(
            "INSERT INTO outbox_message (message_id, message_type, payload, ordering_key) \
             VALUES ('{id}', {message_type}, {payload}, {key})"
        ),
    }
}
