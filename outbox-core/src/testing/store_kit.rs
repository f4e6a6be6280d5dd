//! The store conformance kit: the contract of [`Store`] and of each capability a worker asks
//! for ([`WorkerStore`], [`TransactionalSettlement`]), as checks a store of any kind runs
//! against a [`StoreHarness`] of its own. A store that passes them can carry the worker.
//!
//! A harness puts messages into the store, reads them back and lets time pass; the checks do
//! the rest through the store's own methods. [`store_conformance!`](crate::store_conformance)
//! writes one test per check:
//!
//! ```
//! use std::time::Duration;
//!
//! use outbox_core::testing::store_kit::{KitRow, StoreHarness};
//! use outbox_core::testing::MemoryStore;
//!
//! /// The in-memory store, on a clock the checks move.
//! struct Memory(MemoryStore);
//!
//! impl StoreHarness for Memory {
//!     type Store = MemoryStore;
//!
//!     fn store(&self) -> &MemoryStore {
//!         &self.0
//!     }
//!
//!     fn enqueue(&self, n: u32, size: usize, key: Option<&str>) -> i64 {
//!         let payload = format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(size));
//!         self.0.enqueue("kit.message", &payload, key)
//!     }
//!
//!     fn rows(&self) -> Vec<KitRow> {
//!         let now = self.0.now();
//!         let rows = self.0.rows().into_iter();
//!         rows.map(|r| KitRow {
//!             position: r.position,
//!             attempts: r.attempts,
//!             leased: r.locked_by.is_some() && r.due > now,
//!             last_error: r.last_error,
//!         })
//!         .collect()
//!     }
//!
//!     fn dead(&self) -> Vec<(i64, String)> {
//!         let dead = self.0.dead_letters().into_iter();
//!         dead.map(|d| (d.row.position, d.error)).collect()
//!     }
//!
//!     fn pass(&self, by: Duration) {
//!         self.0.advance(by);
//!     }
//!
//!     fn max_connections(&self) -> Option<usize> {
//!         Some(4)
//!     }
//! }
//!
//! fn memory() -> Memory {
//!     let store = MemoryStore::with_manual_clock();
//!     store.set_max_connections(Some(4));
//!     Memory(store)
//! }
//!
//! // In a test file: one `#[test]` per check.
//! outbox_core::store_conformance!(memory());
//! # fn main() {}
//! ```

// The checks are tests: a broken contract panics with what broke, as an assertion does.
#![allow(clippy::expect_used, clippy::panic)]

use std::any::TypeId;
use std::convert::Infallible;
use std::time::Duration;

use crate::error::{FailureKind, ProcessError};
use crate::store::{
    ClaimLimit, ClaimToken, ClaimedMessage, DestinationReport, Notifications, Outcome, Pauses,
    SettleTarget, Settlement, SharedDestinations, SharedTurns, Store, StoredDestination,
    Subscriptions, SuccessorLease, SyncedDestination, TransactionalSettlement, Turns, WorkerStore,
};

/// What the checks need of a store besides its traits: putting messages in, reading them
/// back, and letting time pass. Each check gets a harness of its own, over an empty store.
pub trait StoreHarness {
    /// The store under test.
    type Store: WorkerStore + TransactionalSettlement;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// Enqueues message `n` with a payload of `size` bytes or more, under ordering key `key`;
    /// its position.
    fn enqueue(&self, n: u32, size: usize, key: Option<&str>) -> i64;

    /// Every pending message, by position.
    fn rows(&self) -> Vec<KitRow>;

    /// Every dead letter: its position and its last error.
    fn dead(&self) -> Vec<(i64, String)>;

    /// Lets `by` pass on the store's clock (a store on the wall clock sleeps).
    fn pass(&self, by: Duration);

    /// How many connections the store can lend the worker at most, if it has a bound (a pool's
    /// size); 2 at least.
    fn max_connections(&self) -> Option<usize>;
}

/// A pending message as a harness reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KitRow {
    /// Its position.
    pub position: i64,
    /// Attempts counted.
    pub attempts: u32,
    /// Whether a claim's lease holds it now.
    pub leased: bool,
    /// The last error or reason it was settled with.
    pub last_error: Option<String>,
}

/// Writes one `#[test]` per check of the [store kit](crate::testing::store_kit), each on the
/// harness `$harness` evaluates to (once per test). With `optional`, `$harness` is an
/// `Option`: `None` skips the check (a harness that cannot reach its database says why).
#[macro_export]
macro_rules! store_conformance {
    (optional $harness:expr) => {
        $crate::store_conformance!(@checks $harness;
            claims_take_heads_in_order_within_the_count,
            claims_stay_within_the_bytes,
            an_expired_lease_returns_the_message,
            settlements_apply_under_their_claim_and_fence_others,
            leases_are_renewed_and_lost_ones_reported,
            check_refuses_too_many_connections,
            a_settlement_hands_out_the_next_message_of_its_key_once,
            a_renewal_racing_a_settlement_reports_only_leases_other_claims_hold,
            a_transactional_settlement_commits_with_its_work_or_not_at_all,
            the_backlog_counts_what_waits,
            turns_are_kept_between_takes,
            destinations_are_recorded_and_reconciled,
            paused_messages_wait_until_released,
            an_event_without_subscribers_leaves_under_its_claim_only,
            notifications_and_chores_answer,
        );
    };
    ($harness:expr) => {
        $crate::store_conformance!(optional Some($harness));
    };
    (@checks $harness:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                if let Some(harness) = $harness {
                    $crate::testing::store_kit::$check(&harness);
                }
            }
        )*
    };
}

const LEASE: Duration = Duration::from_secs(1);

fn claim(h: &impl StoreHarness, token: ClaimToken, limit: ClaimLimit) -> Vec<ClaimedMessage> {
    h.store()
        .claim(token, limit, LEASE)
        .expect("the store claims")
}

fn positions(claimed: &[ClaimedMessage]) -> Vec<i64> {
    claimed.iter().map(|m| m.position).collect()
}

fn row(h: &impl StoreHarness, position: i64) -> Option<KitRow> {
    h.rows().into_iter().find(|r| r.position == position)
}

/// Settles `settled` (leased under `token`) as done, letting the store lease the next
/// messages of their keys (each of at most `max_bytes`): the successors' token, the fenced
/// positions and the leased messages.
fn settle_done_and_lease(
    h: &impl StoreHarness,
    token: ClaimToken,
    settled: &[ClaimedMessage],
    max_bytes: usize,
) -> (ClaimToken, Vec<i64>, Vec<ClaimedMessage>) {
    let outcomes: Vec<Outcome> = settled
        .iter()
        .map(|m| Outcome::of(token, m, Settlement::Done))
        .collect();
    let successors = SuccessorLease {
        token: ClaimToken::new(),
        lease: LEASE,
        max_bytes,
        per_key: 1,
    };
    let (fenced, leased) = h
        .store()
        .settle_and_lease(&outcomes, &successors)
        .expect("the store settles");
    (successors.token, fenced, leased)
}

/// Claims take due messages in order, only the head of each key, within the count.
pub fn claims_take_heads_in_order_within_the_count(h: &impl StoreHarness) {
    let a1 = h.enqueue(1, 10, Some("a"));
    let _a2 = h.enqueue(2, 10, Some("a"));
    let free1 = h.enqueue(3, 10, None);
    let b1 = h.enqueue(4, 10, Some("b"));
    let free2 = h.enqueue(5, 10, None);
    let first = claim(h, ClaimToken::new(), ClaimLimit::messages(3));
    assert_eq!(positions(&first), [a1, free1, b1]);
    assert!(first.iter().all(|m| m.attempt == 1));
    let second = claim(h, ClaimToken::new(), ClaimLimit::messages(10));
    assert_eq!(
        positions(&second),
        [free2],
        "a2 waits behind a1, leased ones are skipped"
    );
    let leased: Vec<i64> = h
        .rows()
        .iter()
        .filter(|r| r.leased)
        .map(|r| r.position)
        .collect();
    assert_eq!(leased, [a1, free1, b1, free2]);
}

/// The byte limit keeps a prefix; an oversized first message goes alone only when allowed.
pub fn claims_stay_within_the_bytes(h: &impl StoreHarness) {
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
pub fn an_expired_lease_returns_the_message(h: &impl StoreHarness) {
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
pub fn settlements_apply_under_their_claim_and_fence_others(h: &impl StoreHarness) {
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
        .settle(&[Outcome::of(stale, &claimed[0], Settlement::Done)])
        .expect("the store settles");
    assert_eq!(fenced, [done], "another claim's outcome is fenced");
    assert_eq!(h.rows().len(), 5, "and changes nothing");

    let long = Duration::from_secs(3600);
    let outcomes = [
        Outcome::of(token, &claimed[0], Settlement::Done),
        Outcome::of(
            token,
            &claimed[1],
            Settlement::Retry {
                delay: long,
                error: "503 …".into(),
            },
        ),
        Outcome::of(
            token,
            &claimed[2],
            Settlement::DeadLetter {
                error: "410 Gone".into(),
            },
        ),
        Outcome::of(token, &claimed[3], Settlement::Release),
        Outcome::of(
            token,
            &claimed[4],
            Settlement::Defer {
                delay: long,
                reason: "no handler yet".into(),
            },
        ),
    ];
    let fenced = h.store().settle(&outcomes).expect("the store settles");
    assert!(fenced.is_empty(), "{fenced:?}");
    let kit_row = |position, attempts, last_error: Option<&str>| KitRow {
        position,
        attempts,
        leased: false,
        last_error: last_error.map(str::to_owned),
    };
    assert_eq!(row(h, done), None);
    assert_eq!(row(h, retry), Some(kit_row(retry, 1, Some("503 …"))));
    assert_eq!(
        row(h, release).map(|r| (r.attempts, r.leased)),
        Some((0, false)),
        "a release is not counted"
    );
    assert_eq!(
        row(h, defer),
        Some(kit_row(defer, 0, Some("no handler yet")))
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
        .settle(&[Outcome::of(token, &claimed[1], Settlement::Done)])
        .expect("the store settles");
    assert_eq!(again, [retry]);
}

/// Renewing leases keeps a running message from expiring; lost leases are reported.
pub fn leases_are_renewed_and_lost_ones_reported(h: &impl StoreHarness) {
    let kept = h.enqueue(1, 10, None);
    let lost = h.enqueue(2, 10, None);
    let token = ClaimToken::new();
    let claimed = claim(h, token, ClaimLimit::messages(2));
    assert_eq!(claimed.len(), 2);
    h.pass(LEASE / 2);
    let reported = h
        .store()
        .extend_leases(&[(token, kept), (ClaimToken::new(), lost)], LEASE * 3)
        .expect("the store renews leases");
    assert_eq!(reported, [lost]);
    h.pass(LEASE + Duration::from_millis(300));
    let taken = claim(h, ClaimToken::new(), ClaimLimit::messages(2));
    assert_eq!(positions(&taken), [lost], "the renewed lease still holds");
}

/// A store says when it cannot lend the worker its connections: it takes as many as it has,
/// and refuses one more.
pub fn check_refuses_too_many_connections(h: &impl StoreHarness) {
    assert!(h.store().check(2).is_ok());
    if let Some(max) = h.max_connections() {
        assert!(h.store().check(max).is_ok(), "it lends {max}");
        assert!(h.store().check(max + 1).is_err(), "it lends only {max}");
    }
    assert!(h.store().ping().is_ok());
}

/// A settlement that may lease the next messages of its keys hands each of them out exactly
/// once between its own answer and the next claim (a store may lease them or leave them to the
/// claim): never a message that is not the next of a settled key, never an oversized one, and
/// nothing when the settlement is fenced.
pub fn a_settlement_hands_out_the_next_message_of_its_key_once(h: &impl StoreHarness) {
    let a1 = h.enqueue(1, 10, Some("a"));
    let a2 = h.enqueue(2, 10, Some("a"));
    let a3 = h.enqueue(3, 5_000, Some("a"));
    let b1 = h.enqueue(4, 10, Some("b"));
    let _b2 = h.enqueue(5, 10, Some("b"));
    let free = h.enqueue(6, 10, None);
    let token = ClaimToken::new();
    let heads = claim(h, token, ClaimLimit::messages(2));
    assert_eq!(positions(&heads), [a1, b1], "free stays for later");

    let (lease_token, fenced, leased) = settle_done_and_lease(h, token, &heads[..1], 1_000);
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
    let (_, fenced, leased) = settle_done_and_lease(h, ClaimToken::new(), &heads[1..], 1_000);
    assert_eq!(fenced, [b1]);
    assert!(leased.is_empty(), "{:?}", positions(&leased));
    assert!(claim(h, ClaimToken::new(), ClaimLimit::messages(10)).is_empty());

    // a2's settlement: a3 is larger than a successor may be, so the claim takes it.
    let (_, fenced, leased) =
        settle_done_and_lease(h, a2_token, std::slice::from_ref(&a2_message), 1_000);
    assert!(fenced.is_empty() && leased.is_empty(), "{fenced:?}");
    assert_eq!(
        positions(&claim(h, ClaimToken::new(), ClaimLimit::messages(10))),
        [a3]
    );
}

/// A heartbeat works from the list of what the worker held when it started; a settlement may
/// remove some of those messages before the renewal reaches them. Only a lease another claim
/// holds is lost: a message settled meanwhile is gone, not taken, and is not reported.
pub fn a_renewal_racing_a_settlement_reports_only_leases_other_claims_hold(h: &impl StoreHarness) {
    let settled = h.enqueue(1, 10, None);
    let kept = h.enqueue(2, 10, None);
    let token = ClaimToken::new();
    let claimed = claim(h, token, ClaimLimit::messages(2));
    assert_eq!(positions(&claimed), [settled, kept]);
    let heartbeat = [(token, settled), (token, kept)];
    h.store()
        .settle(&[Outcome::of(token, &claimed[0], Settlement::Done)])
        .expect("the store settles");
    let reported = h
        .store()
        .extend_leases(&heartbeat, LEASE)
        .expect("the store renews leases");
    assert!(
        reported.is_empty(),
        "a message settled before its renewal was reported lost: {reported:?}"
    );
    // The kept message's lease runs out and another claim takes it: that one is lost.
    h.pass(LEASE + Duration::from_millis(300));
    let other = claim(h, ClaimToken::new(), ClaimLimit::messages(2));
    assert_eq!(positions(&other), [kept]);
    let reported = h
        .store()
        .extend_leases(&heartbeat, LEASE)
        .expect("the store renews leases");
    assert_eq!(reported, [kept]);
}

/// A transactional settlement removes its message with its work's commit, only under the
/// claim that holds it; a failed work or a lost claim leaves the message as it was. A store
/// without transactions names [`Infallible`] as its connection type (no other uninhabited
/// type): it refuses, permanently, and changes nothing.
pub fn a_transactional_settlement_commits_with_its_work_or_not_at_all<H: StoreHarness>(h: &H) {
    type Connection<H> = <<H as StoreHarness>::Store as TransactionalSettlement>::Connection;
    let committed = h.enqueue(1, 10, None);
    let failed = h.enqueue(2, 10, None);
    let stolen = h.enqueue(3, 10, None);
    let token = ClaimToken::new();
    let claimed = claim(h, token, ClaimLimit::messages(3));
    assert_eq!(positions(&claimed), [committed, failed, stolen]);
    let target = |position| SettleTarget {
        token,
        position,
        ordering_key: None,
    };
    let mut ran = 0;
    let mut work = |_: &mut Connection<H>| -> Result<(), ProcessError> {
        ran += 1;
        Ok(())
    };
    let settled = h.store().settle_within(&target(committed), &mut work);
    if TypeId::of::<Connection<H>>() == TypeId::of::<Infallible>() {
        let refused = settled.expect_err("a store without transactions refuses");
        assert_eq!(refused.kind(), FailureKind::Permanent);
        assert_eq!(h.rows().len(), 3, "and changes nothing");
        return;
    }
    settled.expect("the work and the removal commit");
    assert_eq!(ran, 1);
    assert_eq!(row(h, committed), None, "removed with the work's commit");

    let mut failing = |_: &mut Connection<H>| Err(ProcessError::retryable("the work failed"));
    let error = h
        .store()
        .settle_within(&target(failed), &mut failing)
        .expect_err("the work's error");
    assert_eq!(error.reason(), "the work failed");
    assert!(row(h, failed).is_some(), "a failed work leaves its message");

    let other = ClaimToken::new();
    let lost = SettleTarget {
        token: other,
        position: stolen,
        ordering_key: None,
    };
    let mut untouched = |_: &mut Connection<H>| Ok(());
    let error = h
        .store()
        .settle_within(&lost, &mut untouched)
        .expect_err("a claim that does not hold the message settles nothing");
    assert_eq!(error.kind(), FailureKind::Retryable);
    assert!(row(h, stolen).is_some(), "and its message stays");
}

/// The backlog, where the store tells it (a store that cannot tell answers `None` and passes),
/// counts every pending message.
pub fn the_backlog_counts_what_waits(h: &impl StoreHarness) {
    for n in 0..3 {
        h.enqueue(n, 10, None);
    }
    claim(h, ClaimToken::new(), ClaimLimit::messages(1));
    if let Some(backlog) = h.store().backlog().expect("the store samples its backlog") {
        assert_eq!(backlog.pending, 3, "due and leased alike");
    }
}

/// A rate limit's turns across processes are kept between takes: each take sees what the
/// last one left, with the store's clock, which does not run backwards.
pub fn turns_are_kept_between_takes(h: &impl StoreHarness) {
    let mut first_now = 0;
    h.store()
        .take_turn("kit", "webhook", &mut |kept, now| {
            assert_eq!(kept, None, "no turn was taken before");
            first_now = now;
            Turns {
                tokens: 1.5,
                refilled: now,
                booked_until: Some(now + 1_000),
                last_turn: now,
            }
        })
        .expect("the store keeps turns");
    h.store()
        .take_turn("kit", "webhook", &mut |kept, now| {
            let kept = kept.expect("the first take's turns");
            assert_eq!(
                (kept.tokens, kept.refilled, kept.booked_until),
                (1.5, first_now, Some(first_now + 1_000))
            );
            assert!(now >= first_now, "the store's clock ran backwards");
            kept
        })
        .expect("the store keeps turns");
}

/// A destination the worker reports is recorded; a disable it reports is what the next sync
/// (of any worker) reads.
pub fn destinations_are_recorded_and_reconciled(h: &impl StoreHarness) {
    let synced = [SyncedDestination::new("kit", "webhook")];
    let mut seen: Vec<StoredDestination> = Vec::new();
    h.store()
        .sync_destinations(&synced, &mut |stored| {
            seen = stored.to_vec();
            vec![DestinationReport {
                name: "kit".to_owned(),
                kind: "webhook",
                state: "disabled",
                consecutive_failures: 1,
                last_error: Some("410 Gone".to_owned()),
                probe_in: None,
                disabled_reason: Some("410 Gone".to_owned()),
            }]
        })
        .expect("the store syncs destinations");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0].name.as_str(), &seen[0].disabled), ("kit", &None));
    h.store()
        .sync_destinations(&synced, &mut |stored| {
            seen = stored.to_vec();
            Vec::new()
        })
        .expect("the store syncs destinations");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].disabled.as_deref(), Some("410 Gone"));
}

/// A message settled as paused waits out of every claim's way, with its reason and without an
/// attempt counted, until the pauses are released.
pub fn paused_messages_wait_until_released(h: &impl StoreHarness) {
    let paused = h.enqueue(1, 10, None);
    assert!(
        h.store()
            .paused()
            .expect("the store reads pauses")
            .is_empty(),
        "nothing is paused in a new store"
    );
    let token = ClaimToken::new();
    let claimed = claim(h, token, ClaimLimit::messages(1));
    let reason = "not processed: paused by an operator";
    let pause = Settlement::Pause {
        reason: reason.to_owned(),
    };
    let fenced = h
        .store()
        .settle(&[Outcome::of(token, &claimed[0], pause)])
        .expect("the store settles");
    assert!(fenced.is_empty());
    assert_eq!(
        row(h, paused).map(|r| (r.attempts, r.last_error)),
        Some((0, Some(reason.to_owned())))
    );
    assert!(claim(h, ClaimToken::new(), ClaimLimit::messages(1)).is_empty());
    let released = h
        .store()
        .release_paused()
        .expect("the store releases pauses");
    assert_eq!(released, 1);
    assert_eq!(
        positions(&claim(h, ClaimToken::new(), ClaimLimit::messages(1))),
        [paused],
        "due again at once"
    );
}

/// An event whose owner has no subscriptions leaves with no delivery, under the claim that
/// holds it only; releasing a subscription no one has releases nothing.
pub fn an_event_without_subscribers_leaves_under_its_claim_only(h: &impl StoreHarness) {
    assert!(h
        .store()
        .subscriptions()
        .expect("the store reads subscriptions")
        .is_empty());
    let event = h.enqueue(1, 10, None);
    let token = ClaimToken::new();
    claim(h, token, ClaimLimit::messages(1));
    let stale = SettleTarget {
        token: ClaimToken::new(),
        position: event,
        ordering_key: None,
    };
    let fanned = h.store().fan_out(&stale).expect("the store fans out");
    assert_eq!(
        fanned, None,
        "a claim that does not hold the event writes nothing"
    );
    assert!(row(h, event).is_some());
    let holding = SettleTarget {
        token,
        position: event,
        ordering_key: None,
    };
    let fanned = h.store().fan_out(&holding).expect("the store fans out");
    assert_eq!(fanned, Some(0));
    assert_eq!(row(h, event), None, "the event is gone");
    assert_eq!(
        h.store()
            .release_subscription("no-such-subscription")
            .expect("the store releases a subscription's deliveries"),
        0
    );
}

/// A listening store gives a listener and wants no local wake-ups (its listener reports
/// commits); a polled one gives none. The chores answer on a healthy store.
pub fn notifications_and_chores_answer(h: &impl StoreHarness) {
    let store = h.store();
    let listener = store.listen().expect("the store listens or says it cannot");
    assert_eq!(store.listens(), listener.is_some());
    if store.listens() {
        assert!(!store.wants_local_wakeups());
    }
    store.prune().expect("the store prunes");
    assert_eq!(store.promote_stranded().expect("the store promotes"), 0);
    assert_eq!(store.connection_shortage(), None);
}
