//! The delivery checker: what was committed against what arrived.
//!
//! It takes the enqueuer's ledger (every message whose transaction committed, with its ordering
//! key and place in that key's order, and every one rolled back), the receiver's log (each
//! request's message id and whether it was answered 2xx) and the dead-letter table, and reports
//! lost messages (committed, neither delivered nor dead-lettered), ghosts (rolled back, yet
//! delivered or dead-lettered), duplicates (delivered more than once), and order violations
//! (a message of a key first delivered after a later message of that key).

use std::collections::{HashMap, HashSet};

use outbox_diesel::MessageId;

/// What the enqueuer did.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    committed: HashMap<MessageId, Option<String>>,
    order: HashMap<MessageId, u64>,
    rolled_back: HashSet<MessageId>,
    poison: HashSet<MessageId>,
    next_in_order: u64,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// A message of a transaction that committed, in enqueue order.
    pub fn committed(&mut self, id: MessageId, key: Option<String>) {
        self.order.insert(id, self.next_in_order);
        self.next_in_order += 1;
        self.committed.insert(id, key);
    }

    /// A committed message no handler can process: it must end as a dead letter.
    pub fn committed_poison(&mut self, id: MessageId) {
        self.committed(id, None);
        self.poison.insert(id);
    }

    /// A message of a transaction that rolled back.
    pub fn rolled_back(&mut self, id: MessageId) {
        self.rolled_back.insert(id);
    }

    /// Messages committed.
    pub fn committed_count(&self) -> usize {
        self.committed.len()
    }
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The `webhook-id`.
    pub id: MessageId,
    /// Whether it was answered 2xx in full, i.e. delivered.
    pub delivered: bool,
}

/// The checker's findings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Messages committed.
    pub committed: usize,
    /// Messages rolled back.
    pub rolled_back: usize,
    /// Distinct messages delivered.
    pub delivered: usize,
    /// Messages in the dead-letter table.
    pub dead_lettered: usize,
    /// Committed, but neither delivered nor dead-lettered.
    pub lost: Vec<MessageId>,
    /// Rolled back, yet delivered or dead-lettered.
    pub ghosts: Vec<MessageId>,
    /// Deliveries beyond the first, summed over messages.
    pub duplicates: usize,
    /// Messages delivered more than once.
    pub duplicated: Vec<MessageId>,
    /// Messages first delivered after a later message of their key.
    pub order_violations: Vec<MessageId>,
    /// Poison messages that did not end in the dead-letter table.
    pub poison_not_dead: Vec<MessageId>,
    /// Messages delivered that nobody enqueued.
    pub unknown: Vec<MessageId>,
}

impl Report {
    /// Whether nothing was lost, invented, reordered or left undead, and duplicates stay within
    /// `allowed_duplicates`.
    pub fn holds(&self, allowed_duplicates: usize) -> bool {
        self.lost.is_empty()
            && self.ghosts.is_empty()
            && self.order_violations.is_empty()
            && self.poison_not_dead.is_empty()
            && self.unknown.is_empty()
            && self.duplicates <= allowed_duplicates
    }

    /// The figures as one JSON line's fields.
    pub fn figures(&self) -> serde_json::Value {
        serde_json::json!({
            "committed": self.committed,
            "rolled_back": self.rolled_back,
            "delivered": self.delivered,
            "dead_lettered": self.dead_lettered,
            "lost": self.lost.len(),
            "ghosts": self.ghosts.len(),
            "duplicates": self.duplicates,
            "order_violations": self.order_violations.len(),
            "poison_not_dead": self.poison_not_dead.len(),
            "unknown": self.unknown.len(),
        })
    }

    /// The ids behind every violation, for the details line.
    pub fn details(&self) -> serde_json::Value {
        let ids = |ids: &[MessageId]| -> Vec<String> {
            ids.iter().take(20).map(ToString::to_string).collect()
        };
        serde_json::json!({
            "lost": ids(&self.lost),
            "ghosts": ids(&self.ghosts),
            "duplicated": ids(&self.duplicated),
            "order_violations": ids(&self.order_violations),
            "poison_not_dead": ids(&self.poison_not_dead),
            "unknown": ids(&self.unknown),
        })
    }
}

/// Compares the ledger with the receiver's log and the dead letters.
pub fn check(ledger: &Ledger, arrivals: &[Arrival], dead: &HashSet<MessageId>) -> Report {
    let mut deliveries: HashMap<MessageId, usize> = HashMap::new();
    let mut report = Report {
        committed: ledger.committed.len(),
        rolled_back: ledger.rolled_back.len(),
        dead_lettered: dead.len(),
        ..Report::default()
    };
    // Per key: the highest place in order whose first delivery has been seen.
    let mut latest_first: HashMap<&str, u64> = HashMap::new();
    for arrival in arrivals.iter().filter(|a| a.delivered) {
        let count = deliveries.entry(arrival.id).or_default();
        *count += 1;
        if *count > 1 {
            continue;
        }
        if ledger.rolled_back.contains(&arrival.id) {
            report.ghosts.push(arrival.id);
            continue;
        }
        let Some(key) = ledger.committed.get(&arrival.id) else {
            report.unknown.push(arrival.id);
            continue;
        };
        if let Some(key) = key {
            let place = ledger.order[&arrival.id];
            let latest = latest_first.entry(key.as_str()).or_insert(place);
            if place < *latest {
                report.order_violations.push(arrival.id);
            }
            *latest = (*latest).max(place);
        }
    }
    report.delivered = deliveries.len();
    for (id, count) in &deliveries {
        if *count > 1 {
            report.duplicates += count - 1;
            report.duplicated.push(*id);
        }
    }
    for id in ledger.committed.keys() {
        if !deliveries.contains_key(id) && !dead.contains(id) {
            report.lost.push(*id);
        }
    }
    for id in dead {
        if ledger.rolled_back.contains(id) {
            report.ghosts.push(*id);
        }
    }
    for id in &ledger.poison {
        if !dead.contains(id) {
            report.poison_not_dead.push(*id);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(id: MessageId) -> Arrival {
        Arrival {
            id,
            delivered: true,
        }
    }

    #[test]
    fn a_clean_run_holds() {
        let mut ledger = Ledger::new();
        let ids: Vec<MessageId> = (0..4).map(|_| MessageId::new()).collect();
        ledger.committed(ids[0], Some("k".into()));
        ledger.committed(ids[1], Some("k".into()));
        ledger.committed(ids[2], None);
        ledger.committed_poison(ids[3]);
        let arrivals = [
            Arrival {
                id: ids[2],
                delivered: false,
            },
            delivered(ids[0]),
            delivered(ids[2]),
            delivered(ids[1]),
        ];
        let report = check(&ledger, &arrivals, &HashSet::from([ids[3]]));
        assert!(report.holds(0), "{report:?}");
        assert_eq!(
            (report.committed, report.delivered, report.dead_lettered),
            (4, 3, 1)
        );
    }

    #[test]
    fn every_kind_of_violation_is_found() {
        let mut ledger = Ledger::new();
        let ids: Vec<MessageId> = (0..7).map(|_| MessageId::new()).collect();
        ledger.committed(ids[0], Some("k".into()));
        ledger.committed(ids[1], Some("k".into()));
        ledger.committed(ids[2], None); // lost
        ledger.rolled_back(ids[3]); // ghost
        ledger.committed_poison(ids[4]); // delivered instead of dead
        ledger.committed(ids[5], None); // duplicated
        let arrivals = [
            delivered(ids[1]),
            delivered(ids[0]), // out of order
            delivered(ids[3]),
            delivered(ids[4]),
            delivered(ids[5]),
            delivered(ids[5]),
            delivered(ids[6]), // unknown
        ];
        let report = check(&ledger, &arrivals, &HashSet::new());
        assert_eq!(report.lost, [ids[2]]);
        assert_eq!(report.ghosts, [ids[3]]);
        assert_eq!(report.order_violations, [ids[0]]);
        assert_eq!(report.duplicates, 1);
        assert_eq!(report.duplicated, [ids[5]]);
        assert_eq!(report.poison_not_dead, [ids[4]]);
        assert_eq!(report.unknown, [ids[6]]);
        assert!(!report.holds(10));
        assert_eq!(report.figures()["lost"], 1);
    }

    #[test]
    fn a_redelivery_after_a_crash_is_a_duplicate_not_an_order_violation() {
        let mut ledger = Ledger::new();
        let ids: Vec<MessageId> = (0..2).map(|_| MessageId::new()).collect();
        ledger.committed(ids[0], Some("k".into()));
        ledger.committed(ids[1], Some("k".into()));
        let arrivals = [delivered(ids[0]), delivered(ids[0]), delivered(ids[1])];
        let report = check(&ledger, &arrivals, &HashSet::new());
        assert!(report.order_violations.is_empty());
        assert_eq!(report.duplicates, 1);
        assert!(report.holds(1));
        assert!(!report.holds(0));
    }
}
