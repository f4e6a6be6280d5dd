//! The housekeeper: the store's chores that no message waits for, on a thread of their own so
//! that none of them ever delays a claim: the safety net of per-key order, pruning, the backlog
//! sample for the gauges, sharing the destinations' health, and following operators' pauses.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::metrics;
use crate::store::Paused;

use super::pool::TypePauses;
use super::shared::Shared;
use super::timing::HOUSEKEEPING_EVERY;
use super::vitals::AliveGuard;

/// The housekeeper's thread, and when each chore is due next.
pub(crate) struct Housekeeper {
    shared: Arc<Shared>,
    /// The paused types the handlers read: this role alone writes them.
    type_pauses: Arc<TypePauses>,
    /// Closed when the worker stops: wakes the thread from its wait.
    stop: Receiver<()>,
    next_chores: Instant,
    next_backlog: Instant,
    /// The operator's count of enables of each destination when this worker last read it.
    enables_seen: HashMap<String, i64>,
    /// What operators had paused when this worker last read it (`None` before the first read).
    pauses_seen: Option<Paused>,
    /// How many more chores release paused messages: a pause ended (see [`Self::sync_pauses`]).
    releases_due: u32,
    /// Subscriptions enabled again whose paused deliveries the last chores released: the next
    /// release them again (see [`Self::sync_subscriptions`]).
    released_once: BTreeSet<String>,
}

/// How many chores in a row release paused messages after a pause ended: the one that sees it
/// end, and the next, which catches a pause this worker's handlers settled as the resume
/// committed (before they saw it).
const RELEASES_AFTER_RESUME: u32 = 2;

impl Housekeeper {
    pub fn new(shared: Arc<Shared>, type_pauses: Arc<TypePauses>, stop: Receiver<()>) -> Self {
        let now = Instant::now();
        Housekeeper {
            shared,
            type_pauses,
            stop,
            next_chores: now + HOUSEKEEPING_EVERY,
            // The gauges are there from the start.
            next_backlog: now,
            enables_seen: HashMap::new(),
            pauses_seen: None,
            releases_due: 0,
            released_once: BTreeSet::new(),
        }
    }

    /// Follows the subscriptions the store keeps, if the worker delivers to them: builds the
    /// destination of each new or changed one, and makes the paused deliveries of one enabled
    /// again due, at these chores and the next: the second release catches a delivery this
    /// worker's handlers paused (reading the subscription as still disabled) as it was enabled.
    /// The worker runs this once before its first claim.
    pub fn sync_subscriptions(&mut self) {
        let shared = &self.shared;
        let Some(subscribers) = &shared.subscribers else {
            return;
        };
        let read = shared
            .vitals
            .store_call("housekeeper", "subscriptions", || {
                shared.store.subscriptions()
            });
        match read {
            Ok(subscriptions) => subscribers.follow(subscriptions),
            Err(error) => {
                metrics::store_error("housekeeping");
                log::warn!("outbox: reading the subscriptions from the store failed: {error}");
            }
        }
        let enabled = subscribers.take_enabled();
        let again = std::mem::take(&mut self.released_once);
        let failed: BTreeSet<String> = enabled
            .union(&again)
            .filter(|id| !release_subscription(shared, id))
            .cloned()
            .collect();
        self.released_once = enabled.difference(&failed).cloned().collect();
        subscribers.release_later(failed);
    }

    /// Shares the destinations' health through the store, the subscriptions' among them. The
    /// worker runs this once before its first claim, so that a destination disabled before a
    /// restart gets no delivery.
    pub fn sync_destinations(&mut self) {
        let shared = &self.shared;
        let enables_seen = &mut self.enables_seen;
        let known = shared
            .subscribers
            .as_ref()
            .map(|subscribers| subscribers.all())
            .unwrap_or_default();
        let synced = shared
            .vitals
            .store_call("housekeeper", "sync_destinations", || {
                let mut registered: Vec<&crate::destination::Registered> =
                    shared.destinations.iter().collect();
                registered.extend(known.iter().filter_map(|k| k.destination.as_deref().ok()));
                crate::destination::sync_health(&registered, shared.store.as_ref(), enables_seen)
            });
        if let Err(error) = synced {
            metrics::store_error("housekeeping");
            log::warn!(
                "outbox: sharing the destinations' health through the store failed: {error}"
            );
        }
    }

    /// Follows operators' pauses of message types and destinations, which the store keeps:
    /// handler threads pause a claimed message of a paused type, destinations refuse
    /// deliveries while paused. When a pause ends, paused messages are made due again (the
    /// resume did so already; this catches one paused as it committed); and once when the
    /// worker starts, in case a resume's release was lost. The worker runs this once before its
    /// first claim.
    pub fn sync_pauses(&mut self) {
        let shared = &self.shared;
        let paused = match shared
            .vitals
            .store_call("housekeeper", "paused", || shared.store.paused())
        {
            Ok(paused) => paused,
            Err(error) => {
                metrics::store_error("housekeeping");
                log::warn!("outbox: reading operators' pauses from the store failed: {error}");
                return;
            }
        };
        self.releases_due = match &self.pauses_seen {
            // Once at the start, before any claim: none of this worker's handlers has paused
            // a message yet, so there is no race for a second release to catch. A second one
            // would release the messages of a destination still paused, only for them to be
            // claimed and paused again.
            None => 1,
            Some(seen) if log_changes(seen, &paused) => RELEASES_AFTER_RESUME,
            Some(_) => self.releases_due,
        };
        self.type_pauses.follow(paused.message_types.clone());
        shared.destinations.follow_pauses(&paused.destinations);
        if let Some(subscribers) = &shared.subscribers {
            subscribers.follow_pauses(&paused.destinations);
        }
        for message_type in shared.registry.message_types() {
            metrics::operator_paused(
                "type",
                message_type,
                paused.message_types.contains_key(message_type),
            );
        }
        for destination in shared.destinations.iter() {
            let name = destination.name();
            metrics::operator_paused("destination", name, paused.destinations.contains_key(name));
        }
        self.pauses_seen = Some(paused);
        if self.releases_due > 0 {
            self.releases_due -= 1;
            match shared
                .vitals
                .store_call("housekeeper", "release_paused", || {
                    shared.store.release_paused()
                }) {
                Ok(0) => {}
                Ok(n) => log::info!("outbox: {n} paused messages made due again (a pause ended)"),
                Err(error) => {
                    // Tried again at the next chore.
                    self.releases_due += 1;
                    metrics::store_error("housekeeping");
                    log::warn!("outbox: making resumed messages due again failed: {error}");
                }
            }
        }
    }

    pub fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        let _alive = AliveGuard::new(&shared.vitals.housekeeper_alive);
        while !shared.stopping() {
            shared.survive("housekeeper", Duration::from_millis(100), || {
                self.step(Instant::now())
            });
            let next = self.next_chores.min(self.next_backlog);
            let _ = self
                .stop
                .recv_timeout(next.saturating_duration_since(Instant::now()));
        }
    }

    /// Does the chores due at `now`.
    pub fn step(&mut self, now: Instant) {
        if now >= self.next_backlog {
            self.next_backlog = now + self.shared.config.backlog_interval;
            self.sample_backlog();
        }
        if now >= self.next_chores {
            self.next_chores = now + HOUSEKEEPING_EVERY;
            self.sync_subscriptions();
            self.sync_destinations();
            self.sync_pauses();
            self.promote_stranded();
            self.prune();
        }
    }

    fn promote_stranded(&self) {
        let shared = &self.shared;
        match shared
            .vitals
            .store_call("housekeeper", "promote_stranded", || {
                shared.store.promote_stranded()
            }) {
            Ok(0) => {}
            Ok(n) => log::info!(
                "outbox: {n} ordering keys had no claimable head (concurrent transactions left \
                 it parked); promoted"
            ),
            Err(error) => {
                metrics::store_error("housekeeping");
                log::warn!("outbox: promoting stranded ordering keys failed: {error}");
            }
        }
    }

    fn prune(&self) {
        let shared = &self.shared;
        match shared
            .vitals
            .store_call("housekeeper", "prune", || shared.store.prune())
        {
            Ok(pruned) if pruned.total() == 0 => {}
            Ok(pruned) => log::debug!(
                "outbox: pruned {} expired idempotency keys, {} dead letters, {} received \
                 webhook ids, {} logged attempts and {} archived messages past their retention, \
                 and {} groups left empty",
                pruned.idempotency_keys,
                pruned.dead_letters,
                pruned.inbox_ids,
                pruned.logged_attempts,
                pruned.archived,
                pruned.empty_groups
            ),
            Err(error) => {
                metrics::store_error("housekeeping");
                log::warn!("outbox: pruning expired rows failed: {error}");
            }
        }
    }

    fn sample_backlog(&self) {
        let shared = &self.shared;
        match shared
            .vitals
            .store_call("housekeeper", "backlog", || shared.store.backlog())
        {
            Ok(Some(backlog)) => metrics::backlog(&backlog),
            Ok(None) => {}
            Err(error) => {
                metrics::store_error("backlog");
                log::warn!("outbox: sampling the backlog for the metrics failed: {error}");
            }
        }
    }
}

/// Logs the pauses that began and ended between `seen` and `now`; whether any ended.
fn log_changes(seen: &Paused, now: &Paused) -> bool {
    let mut ended = false;
    for (kind, before, after) in [
        ("message type", &seen.message_types, &now.message_types),
        ("destination", &seen.destinations, &now.destinations),
    ] {
        for (name, reason) in after {
            if !before.contains_key(name) {
                log::warn!("outbox: {kind} {name} paused by an operator ({reason})");
            }
        }
        for name in before.keys() {
            if !after.contains_key(name) {
                log::warn!("outbox: {kind} {name} resumed by an operator");
                ended = true;
            }
        }
    }
    ended
}

/// Makes the paused deliveries of subscription `id` due again, as it was enabled; whether the
/// store took it (if not, the next chore tries again).
fn release_subscription(shared: &Shared, id: &str) -> bool {
    match shared
        .vitals
        .store_call("housekeeper", "release_subscription", || {
            shared.store.release_subscription(id)
        }) {
        Ok(n) => {
            if n > 0 {
                log::info!("outbox: subscription {id} was enabled; {n} deliveries made due again");
            }
            true
        }
        Err(error) => {
            metrics::store_error("housekeeping");
            log::warn!(
                "outbox: making the paused deliveries of subscription {id}, enabled again, due \
                 failed (trying again at the next chore): {error}"
            );
            false
        }
    }
}
