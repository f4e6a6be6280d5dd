//! The contract of the `Store` trait, as tests every store must pass: the in-memory
//! `MemoryStore` the worker's own tests use, and `DieselStore` on PostgreSQL, MariaDB and
//! SQLite. A store that passes them can carry the worker.

use std::time::Duration;

use outbox_core::testing::MemoryStore;
use outbox_diesel::admin::{dead_letters, pending_messages, ListOptions};
use outbox_diesel::store::{ClaimLimit, ClaimToken, ClaimedMessage, Settlement, Store};
use outbox_diesel::{DieselStore, Enqueue, EnqueueOptions, Message, OutboxManager};
use outbox_testkit::outbox::{outcome, settle_done_and_lease};
use outbox_testkit::{TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

/// What the suite needs of a store besides the trait: putting messages in, looking at them,
/// and letting time pass.
trait Harness {
    type S: Store;
    fn store(&self) -> &Self::S;
    /// Enqueues a message with a payload of `size` bytes or more; its position.
    fn enqueue(&self, n: u32, size: usize, key: Option<&str>) -> i64;
    /// (position, attempts, leased, last error) of every pending message, by position.
    fn rows(&self) -> Vec<(i64, u32, bool, Option<String>)>;
    /// (position, error) of every dead letter.
    fn dead(&self) -> Vec<(i64, String)>;
    /// Lets `by` pass on the store's clock.
    fn pass(&self, by: Duration);
}

#[derive(Serialize, Deserialize)]
struct Conformance {
    n: u32,
    pad: String,
}

impl Message for Conformance {
    const MESSAGE_TYPE: &'static str = "conformance.message";
}

fn payload(n: u32, size: usize) -> Conformance {
    Conformance {
        n,
        pad: "x".repeat(size),
    }
}

struct Memory(MemoryStore);

impl Harness for Memory {
    type S = MemoryStore;

    fn store(&self) -> &MemoryStore {
        &self.0
    }

    fn enqueue(&self, n: u32, size: usize, key: Option<&str>) -> i64 {
        self.0.enqueue_message(&payload(n, size), key)
    }

    fn rows(&self) -> Vec<(i64, u32, bool, Option<String>)> {
        self.0
            .rows()
            .into_iter()
            .map(|r| {
                (
                    r.position,
                    r.attempts,
                    r.locked_by.is_some() && r.due > self.0.now(),
                    r.last_error,
                )
            })
            .collect()
    }

    fn dead(&self) -> Vec<(i64, String)> {
        self.0
            .dead_letters()
            .into_iter()
            .map(|d| (d.row.position, d.error))
            .collect()
    }

    fn pass(&self, by: Duration) {
        self.0.advance(by);
    }
}

struct Diesel<C: TestConnection> {
    pool: TestPool<C>,
    store: DieselStore<OutboxManager<C>>,
}

impl<C: TestConnection> Harness for Diesel<C> {
    type S = DieselStore<OutboxManager<C>>;

    fn store(&self) -> &Self::S {
        &self.store
    }

    fn enqueue(&self, n: u32, size: usize, key: Option<&str>) -> i64 {
        let mut options = EnqueueOptions::new();
        if let Some(key) = key {
            options = options.ordering_key(key);
        }
        let id = payload(n, size)
            .enqueue_with(&mut self.pool.get().unwrap(), &options)
            .unwrap();
        self.all_rows()
            .into_iter()
            .find(|m| m.message_id == id)
            .unwrap()
            .position
    }

    fn rows(&self) -> Vec<(i64, u32, bool, Option<String>)> {
        self.all_rows()
            .into_iter()
            .map(|m| (m.position, m.attempts, m.in_flight, m.last_error))
            .collect()
    }

    fn dead(&self) -> Vec<(i64, String)> {
        dead_letters(
            &mut self.pool.get().unwrap(),
            &ListOptions::new().limit(1000),
        )
        .unwrap()
        .into_iter()
        .map(|d| (d.position, d.last_error))
        .collect()
    }

    fn pass(&self, by: Duration) {
        std::thread::sleep(by);
    }
}

impl<C: TestConnection> Diesel<C> {
    fn new(db: &TestDb) -> Self {
        let pool = db.pool::<C>(5);
        Diesel {
            store: DieselStore::new(pool.clone()),
            pool,
        }
    }

    fn all_rows(&self) -> Vec<outbox_diesel::admin::PendingMessage> {
        pending_messages(
            &mut self.pool.get().unwrap(),
            &ListOptions::new().limit(1000),
        )
        .unwrap()
    }
}

const LEASE: Duration = Duration::from_secs(1);

fn claim(h: &impl Harness, token: ClaimToken, limit: ClaimLimit) -> Vec<ClaimedMessage> {
    h.store().claim(token, limit, LEASE).unwrap()
}

fn positions(claimed: &[ClaimedMessage]) -> Vec<i64> {
    claimed.iter().map(|m| m.position).collect()
}

/// Claims take due messages in order, only the head of each key, within the count.
fn claims_take_heads_in_order_within_the_count(h: &impl Harness) {
    let a1 = h.enqueue(1, 10, Some("a"));
    let a2 = h.enqueue(2, 10, Some("a"));
    let free1 = h.enqueue(3, 10, None);
    let b1 = h.enqueue(4, 10, Some("b"));
    let free2 = h.enqueue(5, 10, None);
    let token = ClaimToken::new();
    let first = claim(h, token, ClaimLimit::messages(3));
    assert_eq!(positions(&first), [a1, free1, b1]);
    assert!(first.iter().all(|m| m.attempt == 1));
    let second = claim(h, ClaimToken::new(), ClaimLimit::messages(10));
    assert_eq!(
        positions(&second),
        [free2],
        "a2 waits behind a1, leased ones are skipped"
    );
    let leased: Vec<i64> = h.rows().iter().filter(|r| r.2).map(|r| r.0).collect();
    assert_eq!(leased, [a1, free1, b1, free2]);
    let _ = a2;
}

/// The byte limit keeps a prefix; an oversized first message goes alone only when allowed.
fn claims_stay_within_the_bytes(h: &impl Harness) {
    let small = h.enqueue(1, 100, None);
    let big = h.enqueue(2, 5_000, None);
    let after = h.enqueue(3, 100, None);
    let limit = |bytes, oversized_alone| ClaimLimit {
        messages: 10,
        bytes,
        oversized_alone,
    };
    let first = claim(h, ClaimToken::new(), limit(1_000, false));
    assert_eq!(
        positions(&first),
        [small],
        "the big one would exceed 1,000 bytes"
    );
    assert!(claim(h, ClaimToken::new(), limit(1_000, false)).is_empty());
    let alone = claim(h, ClaimToken::new(), limit(1_000, true));
    assert_eq!(positions(&alone), [big], "alone, when allowed");
    assert_eq!(
        positions(&claim(h, ClaimToken::new(), limit(1_000, false))),
        [after]
    );
}

/// A lease holds its message until it ends; then another claim takes it, one attempt more.
fn an_expired_lease_returns_the_message(h: &impl Harness) {
    let p = h.enqueue(1, 10, None);
    let first = claim(h, ClaimToken::new(), ClaimLimit::messages(1));
    assert_eq!(positions(&first), [p]);
    assert!(claim(h, ClaimToken::new(), ClaimLimit::messages(1)).is_empty());
    h.pass(LEASE + Duration::from_millis(300));
    let again = claim(h, ClaimToken::new(), ClaimLimit::messages(1));
    assert_eq!(positions(&again), [p]);
    assert_eq!(again[0].attempt, 2);
}

/// Each settlement does what it says, and only under its claim.
fn settlements_apply_under_their_claim_and_fence_others(h: &impl Harness) {
    let done = h.enqueue(1, 10, None);
    let retry = h.enqueue(2, 10, None);
    let dead = h.enqueue(3, 10, None);
    let release = h.enqueue(4, 10, None);
    let defer = h.enqueue(5, 10, None);
    let token = ClaimToken::new();
    let claimed = claim(h, token, ClaimLimit::messages(10));
    assert_eq!(claimed.len(), 5);
    let stale = ClaimToken::new();
    let fenced = h
        .store()
        .settle(&[outcome(stale, &claimed[0], Settlement::Done)])
        .unwrap();
    assert_eq!(fenced, [done], "another claim's outcome is fenced");
    assert_eq!(h.rows().len(), 5, "and changes nothing");

    let long = Duration::from_secs(3600);
    let outcomes = [
        outcome(token, &claimed[0], Settlement::Done),
        outcome(
            token,
            &claimed[1],
            Settlement::Retry {
                delay: long,
                error: "503 …".into(),
            },
        ),
        outcome(
            token,
            &claimed[2],
            Settlement::DeadLetter {
                error: "410 Gone".into(),
            },
        ),
        outcome(token, &claimed[3], Settlement::Release),
        outcome(
            token,
            &claimed[4],
            Settlement::Defer {
                delay: long,
                reason: "no handler yet".into(),
            },
        ),
    ];
    assert!(h.store().settle(&outcomes).unwrap().is_empty());
    let rows = h.rows();
    let row = |p: i64| rows.iter().find(|r| r.0 == p).cloned();
    assert_eq!(row(done), None);
    assert_eq!(row(retry), Some((retry, 1, false, Some("503 …".into()))));
    assert_eq!(
        row(release).map(|r| (r.1, r.2)),
        Some((0, false)),
        "not counted"
    );
    assert_eq!(
        row(defer),
        Some((defer, 0, false, Some("no handler yet".into())))
    );
    assert_eq!(h.dead(), [(dead, "410 Gone".to_owned())]);
    // Only the released one is due now.
    assert_eq!(
        positions(&claim(h, ClaimToken::new(), ClaimLimit::messages(10))),
        [release]
    );
    // Settling again under the old claim is fenced: the rows are not its any more.
    let again = h
        .store()
        .settle(&[outcome(token, &claimed[1], Settlement::Done)])
        .unwrap();
    assert_eq!(again, [retry]);
}

/// Renewing leases keeps a running message from expiring; lost leases are reported.
fn leases_are_renewed_and_lost_ones_reported(h: &impl Harness) {
    let kept = h.enqueue(1, 10, None);
    let lost = h.enqueue(2, 10, None);
    let token = ClaimToken::new();
    let claimed = claim(h, token, ClaimLimit::messages(2));
    assert_eq!(claimed.len(), 2);
    h.pass(LEASE / 2);
    let reported = h
        .store()
        .extend_leases(&[(token, kept), (ClaimToken::new(), lost)], LEASE * 3)
        .unwrap();
    assert_eq!(reported, [lost]);
    h.pass(LEASE + Duration::from_millis(300));
    let taken = claim(h, ClaimToken::new(), ClaimLimit::messages(2));
    assert_eq!(positions(&taken), [lost], "the renewed lease still holds");
}

/// A store says when it cannot lend the worker its connections.
fn check_refuses_too_many_connections(h: &impl Harness) {
    assert!(h.store().check(2).is_ok());
    assert!(h.store().check(1_000).is_err());
    assert!(h.store().ping().is_ok());
}

/// A settlement that may lease the next messages of its keys hands each of them out exactly
/// once between its own answer and the next claim (a store may lease them or leave them to the
/// claim): never a message that is not the next of a settled key, never a delayed or oversized
/// one, and nothing when the settlement is fenced.
fn a_settlement_hands_out_the_next_message_of_its_key_once(h: &impl Harness) {
    let a1 = h.enqueue(1, 10, Some("a"));
    let a2 = h.enqueue(2, 10, Some("a"));
    let a3 = h.enqueue(3, 5_000, Some("a"));
    let b1 = h.enqueue(4, 10, Some("b"));
    let b2 = h.enqueue(5, 10, Some("b"));
    let free = h.enqueue(6, 10, None);
    let settle_and_lease = |token, settled: &[ClaimedMessage]| {
        settle_done_and_lease(h.store(), token, settled, LEASE, 1_000)
    };
    let token = ClaimToken::new();
    let heads = claim(h, token, ClaimLimit::messages(2));
    assert_eq!(positions(&heads), [a1, b1], "free stays for later");

    let (lease_token, fenced, leased) = settle_and_lease(token, &heads[..1]);
    assert!(fenced.is_empty());
    let claim_token = ClaimToken::new();
    let claimed = claim(h, claim_token, ClaimLimit::messages(10));
    let mut handed_out = positions(&leased);
    handed_out.extend(positions(&claimed));
    handed_out.sort_unstable();
    assert_eq!(
        handed_out,
        [a2, free],
        "a's next message once, b's waits for b1"
    );
    assert!(leased.iter().all(|m| m.attempt == 1 && m.position == a2));
    let (a2_token, a2_message) = match leased.first() {
        Some(m) => (lease_token, m.clone()),
        None => (claim_token, claimed[0].clone()),
    };
    assert_eq!(a2_message.position, a2);

    // b1's settlement under a claim that no longer holds it: fenced, and b2 stays behind it.
    let (_, fenced, leased) = settle_and_lease(ClaimToken::new(), &heads[1..]);
    assert_eq!(fenced, [b1]);
    assert!(leased.is_empty(), "{:?}", positions(&leased));
    assert!(claim(h, ClaimToken::new(), ClaimLimit::messages(10)).is_empty());

    // a2's settlement: a3 is larger than a successor may be, so the claim takes it.
    let (_, fenced, leased) = settle_and_lease(a2_token, std::slice::from_ref(&a2_message));
    assert!(fenced.is_empty() && leased.is_empty(), "{fenced:?}");
    assert_eq!(
        positions(&claim(h, ClaimToken::new(), ClaimLimit::messages(10))),
        [a3]
    );
    let _ = b2;
}

/// A heartbeat works from the list of what the worker held when it started; a settlement may
/// remove some of those messages before the renewal reaches them. Only a lease another claim
/// holds is lost: a message settled meanwhile is gone, not taken, and is not reported.
fn a_renewal_racing_a_settlement_reports_only_leases_other_claims_hold(h: &impl Harness) {
    let settled = h.enqueue(1, 10, None);
    let kept = h.enqueue(2, 10, None);
    let token = ClaimToken::new();
    let claimed = claim(h, token, ClaimLimit::messages(2));
    assert_eq!(positions(&claimed), [settled, kept]);
    let heartbeat = [(token, settled), (token, kept)];
    h.store()
        .settle(&[outcome(token, &claimed[0], Settlement::Done)])
        .unwrap();
    let reported = h.store().extend_leases(&heartbeat, LEASE).unwrap();
    assert!(
        reported.is_empty(),
        "a message settled before its renewal was reported lost: {reported:?}"
    );
    // The kept message's lease runs out and another claim takes it: that one is lost.
    h.pass(LEASE + Duration::from_millis(300));
    let other = claim(h, ClaimToken::new(), ClaimLimit::messages(2));
    assert_eq!(positions(&other), [kept]);
    let reported = h.store().extend_leases(&heartbeat, LEASE).unwrap();
    assert_eq!(reported, [kept]);
}

macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod memory {
            $(
                #[test]
                fn $test() {
                    let store = outbox_core::testing::MemoryStore::with_manual_clock();
                    store.set_max_connections(Some(4));
                    super::$test(&super::Memory(store));
                }
            )*
        }

        mod diesel_store {
            $(
                fn $test<C: outbox_testkit::TestConnection>(db: &outbox_testkit::TestDb) {
                    super::$test(&super::Diesel::<C>::new(db));
                }
            )*
            outbox_testkit::backend_tests!($($test),*);
        }
    };
}

conformance!(
    claims_take_heads_in_order_within_the_count,
    claims_stay_within_the_bytes,
    an_expired_lease_returns_the_message,
    settlements_apply_under_their_claim_and_fence_others,
    leases_are_renewed_and_lost_ones_reported,
    check_refuses_too_many_connections,
    a_settlement_hands_out_the_next_message_of_its_key_once,
    a_renewal_racing_a_settlement_reports_only_leases_other_claims_hold,
);
