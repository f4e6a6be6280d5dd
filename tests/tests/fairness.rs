//! Fairness across groups, on every backend: one group's flood does not hold up another
//! group's few messages (every claim gives each group with due messages a share), every group
//! gets its turn however many there are, order within a key and within a group holds, a group
//! missing from the list is still delivered in due order, the housekeeper removes only empty
//! groups, and a retried or re-queued message keeps its group.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::sql_types::Text;
use diesel::{QueryableByName, RunQueryDsl};

use outbox_diesel::admin::{
    pending_messages, requeue_dead_letters, DeadLetterSelection, ListOptions,
};
use outbox_diesel::prelude::*;
use outbox_diesel::store::{ClaimToken, ClaimedMessage, Settlement, Store};
use outbox_diesel::{
    outbox_handler, Batch, Context, DieselStore, EnqueueOptions, OutboxManager, ProcessError,
};
use outbox_testkit::outbox::{claim, settle_all};
use outbox_testkit::{backend_tests, with_connection, TestConnection, TestDb, TestPool};
use serde::{Deserialize, Serialize};

const LEASE: Duration = Duration::from_secs(30);

#[outbox_handler("fairness.step")]
#[derive(Debug, Serialize, Deserialize)]
struct Step {
    n: u32,
}

impl Handler for Step {
    fn process(self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

struct Fixture<C: TestConnection> {
    pool: TestPool<C>,
    store: DieselStore<OutboxManager<C>>,
}

#[derive(QueryableByName)]
struct GroupName {
    #[diesel(sql_type = Text)]
    name: String,
}

impl<C: TestConnection> Fixture<C> {
    fn new(db: &TestDb) -> Self {
        let pool = db.pool::<C>(5);
        Fixture {
            store: DieselStore::new(pool.clone()),
            pool,
        }
    }

    /// Enqueues `count` messages with `options` in one batch and returns their positions in
    /// enqueue order.
    fn enqueue(&self, count: u32, options: &EnqueueOptions) -> Vec<i64> {
        let mut batch = Batch::new();
        for n in 0..count {
            batch.push_with(&Step { n }, options).unwrap();
        }
        let mut conn = self.pool.get().unwrap();
        let ids = batch.enqueue(&mut conn).unwrap();
        let listed = pending_messages(&mut conn, &ListOptions::new().limit(100_000)).unwrap();
        ids.iter()
            .map(|id| {
                listed
                    .iter()
                    .find(|m| m.message_id == *id)
                    .unwrap()
                    .position
            })
            .collect()
    }

    fn claim(&self, count: usize) -> (ClaimToken, Vec<ClaimedMessage>) {
        claim(&self.store, count, LEASE)
    }

    /// Claims `count` and settles them done; returns their positions in the claim's order.
    fn take(&self, count: usize) -> Vec<i64> {
        let (token, claimed) = self.claim(count);
        settle_all(&self.store, token, &claimed, &Settlement::Done);
        claimed.iter().map(|m| m.position).collect()
    }
}

/// The groups listed for claims, by name.
fn listed_groups(db: &TestDb) -> Vec<String> {
    let rows: Vec<GroupName> = with_connection!(db.backend(), D => {
        diesel::sql_query("SELECT name FROM outbox_group ORDER BY name")
            .load(&mut db.connect::<D>())
            .unwrap()
    });
    rows.into_iter().map(|row| row.name).collect()
}

fn in_group(group: &str) -> EnqueueOptions {
    EnqueueOptions::new().group(group)
}

/// Group A enqueues 2,000 and then group B 10: B's 10 are all claimed within the first five
/// claims of 16 (without groups they would wait for A's 2,000), each group's messages come in
/// their enqueue order, and everything is claimed exactly once.
fn a_flooding_group_leaves_a_share_to_another<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let a = f.enqueue(2_000, &in_group("tenant-a"));
    let b = f.enqueue(10, &in_group("tenant-b"));
    let b_set: HashSet<i64> = b.iter().copied().collect();

    let mut taken = Vec::new();
    for _ in 0..5 {
        taken.extend(f.take(16));
    }
    let b_taken: Vec<i64> = taken
        .iter()
        .copied()
        .filter(|p| b_set.contains(p))
        .collect();
    assert_eq!(b_taken, b, "B's 10, in order, within five claims");
    loop {
        let next = f.take(64);
        if next.is_empty() {
            break;
        }
        taken.extend(next);
    }
    let a_taken: Vec<i64> = taken
        .iter()
        .copied()
        .filter(|p| !b_set.contains(p))
        .collect();
    assert_eq!(a_taken, a, "A's 2,000, each once, in enqueue order");
}

/// With more groups than one claim visits, every group gets its turn: 20 small groups behind a
/// flood of 1,000 in a 21st each have a message claimed within three claims of 16 (eight groups
/// a claim, in turn), and each group's messages are claimed in their enqueue order.
fn every_group_gets_its_turn_however_many<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    f.enqueue(1_000, &in_group("z-flood"));
    let mut groups = BTreeMap::new();
    for g in 0..20 {
        let name = format!("g{g:02}");
        for position in f.enqueue(3, &in_group(&name)) {
            groups.insert(position, name.clone());
        }
    }
    let mut seen = HashSet::new();
    let mut taken = Vec::new();
    for _ in 0..3 {
        for position in f.take(16) {
            if let Some(name) = groups.get(&position) {
                seen.insert(name.clone());
            }
            taken.push(position);
        }
    }
    assert_eq!(seen.len(), 20, "groups with a message claimed: {seen:?}");
    // And no claim takes a group's messages out of their order, however its turns fall.
    let mut claimed: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    loop {
        let next = f.take(16);
        if next.is_empty() {
            break;
        }
        taken.extend(next);
    }
    for position in taken {
        let name = groups.get(&position).map_or("z-flood", String::as_str);
        claimed.entry(name.to_owned()).or_default().push(position);
    }
    for (name, positions) in &claimed {
        let mut sorted = positions.clone();
        sorted.sort_unstable();
        assert_eq!(positions, &sorted, "group {name} in enqueue order");
    }
}

/// Order within an ordering key holds under groups, a key spread over two groups included:
/// drained in claims of 3, each key's messages are claimed one at a time in enqueue order, and
/// every message exactly once.
fn per_key_order_holds_under_groups<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let mut keys: BTreeMap<i64, String> = BTreeMap::new();
    let mut all = Vec::new();
    for round in 0..6 {
        for (key, group) in [
            ("k1", "tenant-a"),
            ("k2", "tenant-b"),
            (
                "both",
                if round % 2 == 0 {
                    "tenant-a"
                } else {
                    "tenant-b"
                },
            ),
        ] {
            let options = in_group(group).ordering_key(key);
            let positions = f.enqueue(2, &options);
            for position in positions {
                keys.insert(position, key.to_owned());
                all.push(position);
            }
        }
        all.extend(f.enqueue(2, &in_group("tenant-c")));
    }
    let mut claimed_order = Vec::new();
    loop {
        let (token, claimed) = f.claim(3);
        if claimed.is_empty() {
            break;
        }
        let in_claim: Vec<&String> = claimed
            .iter()
            .filter_map(|m| keys.get(&m.position))
            .collect();
        let distinct: HashSet<&&String> = in_claim.iter().collect();
        assert_eq!(
            distinct.len(),
            in_claim.len(),
            "one message of a key at a time"
        );
        claimed_order.extend(claimed.iter().map(|m| m.position));
        settle_all(&f.store, token, &claimed, &Settlement::Done);
    }
    let mut sorted = claimed_order.clone();
    sorted.sort_unstable();
    all.sort_unstable();
    assert_eq!(sorted, all, "every message exactly once");
    for key in ["k1", "k2", "both"] {
        let order: Vec<i64> = claimed_order
            .iter()
            .copied()
            .filter(|p| keys.get(p).is_some_and(|k| k == key))
            .collect();
        let mut expected = order.clone();
        expected.sort_unstable();
        assert_eq!(order, expected, "key {key} in enqueue order");
    }
}

/// A group missing from the list (removed by hand, or by the housekeeper while an enqueue into
/// it was still open) costs its fairness, never its messages: they are claimed in due order.
/// The housekeeper removes the groups without a pending message and keeps the others;
/// listings show each message's group.
fn groups_are_listed_and_removed_once_empty_and_a_missing_one_is_still_delivered<
    C: TestConnection,
>(
    db: &TestDb,
) {
    let f = Fixture::<C>::new(db);
    let x = f.enqueue(5, &in_group("tenant-x"));
    let y = f.enqueue(5, &in_group("tenant-y"));
    assert_eq!(listed_groups(db), ["tenant-x", "tenant-y"]);
    assert_eq!(
        f.store.prune().unwrap().empty_groups,
        0,
        "both have messages"
    );

    f.pool
        .get()
        .unwrap()
        .batch_execute("DELETE FROM outbox_group WHERE name = 'tenant-x'")
        .unwrap();
    let mut taken = f.take(100);
    taken.sort_unstable();
    let mut expected: Vec<i64> = x.iter().chain(&y).copied().collect();
    expected.sort_unstable();
    assert_eq!(taken, expected, "the unlisted group's messages too");

    f.enqueue(1, &in_group("tenant-z"));
    assert_eq!(listed_groups(db), ["tenant-y", "tenant-z"]);
    assert_eq!(
        f.store.prune().unwrap().empty_groups,
        1,
        "tenant-y is empty"
    );
    assert_eq!(listed_groups(db), ["tenant-z"]);
}

/// A retried message keeps its group, and a dead letter keeps it through a re-queue, which
/// lists the group again after the housekeeper removed it: the re-queued message gets its
/// group's share ahead of a flood enqueued before the re-queue.
fn retries_and_requeued_dead_letters_keep_their_group<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let [lone] = f.enqueue(1, &in_group("tenant-lone"))[..] else {
        panic!("one message")
    };
    let (token, claimed) = f.claim(1);
    settle_all(
        &f.store,
        token,
        &claimed,
        &Settlement::Retry {
            delay: Duration::ZERO,
            error: "receiver said 500".into(),
        },
    );
    let (token, claimed) = f.claim(1);
    assert_eq!(claimed[0].position, lone, "the retry");
    settle_all(
        &f.store,
        token,
        &claimed,
        &Settlement::DeadLetter {
            error: "receiver said 400".into(),
        },
    );
    assert_eq!(f.store.prune().unwrap().empty_groups, 1);
    assert!(listed_groups(db).is_empty());

    let flood = f.enqueue(500, &in_group("tenant-flood"));
    let mut conn = f.pool.get().unwrap();
    let requeued =
        requeue_dead_letters(&mut conn, &DeadLetterSelection::Positions(vec![lone])).unwrap();
    assert_eq!(requeued, [lone]);
    assert_eq!(listed_groups(db), ["tenant-flood", "tenant-lone"]);
    let taken = f.take(16);
    assert!(
        taken.contains(&lone),
        "the re-queued message has its group's share: {taken:?}"
    );
    assert!(taken.contains(&flood[0]), "{taken:?}");
}

/// A batch larger than PostgreSQL's written-in candidate limits (the claim with a bound limit)
/// shares out too: of a claim of 1,100 behind a flood of 1,500 in group A, group B's 200 have
/// more than a hundred in it, in order.
fn a_batch_beyond_the_written_in_limits_shares_out<C: TestConnection>(db: &TestDb) {
    let f = Fixture::<C>::new(db);
    let a = f.enqueue(1_500, &in_group("tenant-a"));
    let b = f.enqueue(200, &in_group("tenant-b"));
    let taken = f.take(1_100);
    assert_eq!(taken.len(), 1_100);
    let b_set: HashSet<i64> = b.iter().copied().collect();
    let b_taken: Vec<i64> = taken
        .iter()
        .copied()
        .filter(|p| b_set.contains(p))
        .collect();
    assert!(b_taken.len() > 100, "B's share: {}", b_taken.len());
    assert_eq!(b_taken, &b[..b_taken.len()], "B's first, in order");
    let a_taken: Vec<i64> = taken
        .iter()
        .copied()
        .filter(|p| !b_set.contains(p))
        .collect();
    assert_eq!(a_taken, &a[..a_taken.len()], "A's first, in order");
}

backend_tests!(
    a_flooding_group_leaves_a_share_to_another,
    every_group_gets_its_turn_however_many,
    per_key_order_holds_under_groups,
    groups_are_listed_and_removed_once_empty_and_a_missing_one_is_still_delivered,
    retries_and_requeued_dead_letters_keep_their_group,
    a_batch_beyond_the_written_in_limits_shares_out,
);
