//! The housekeeper: the store's chores that no message waits for, on a thread of their own so
//! that none of them ever delays a claim: the safety net of per-key order, pruning, the backlog
//! sample for the gauges, and sharing the destinations' health.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crate::metrics;

use super::handle::AliveGuard;
use super::shared::Shared;
use super::timing::HOUSEKEEPING_EVERY;

/// The housekeeper's thread, and when each chore is due next.
pub(crate) struct Housekeeper {
    shared: Arc<Shared>,
    /// Closed when the worker stops: wakes the thread from its wait.
    stop: Receiver<()>,
    next_chores: Instant,
    next_backlog: Instant,
    /// The operator's count of enables of each destination when this worker last read it.
    enables_seen: HashMap<String, i64>,
}

impl Housekeeper {
    pub fn new(shared: Arc<Shared>, stop: Receiver<()>) -> Self {
        let now = Instant::now();
        Housekeeper {
            shared,
            stop,
            next_chores: now + HOUSEKEEPING_EVERY,
            // The gauges are there from the start.
            next_backlog: now,
            enables_seen: HashMap::new(),
        }
    }

    /// Shares the destinations' health through the store. The worker runs this once before
    /// its first claim, so that a destination disabled before a restart gets no delivery.
    pub fn sync_destinations(&mut self) {
        let shared = &self.shared;
        let enables_seen = &mut self.enables_seen;
        let synced = shared
            .vitals
            .store_call("housekeeper", "sync_destinations", || {
                shared
                    .destinations
                    .sync(shared.store.as_ref(), enables_seen)
            });
        if let Err(error) = synced {
            metrics::store_error("housekeeping");
            log::warn!(
                "outbox: sharing the destinations' health through the store failed: {error}"
            );
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
            self.sync_destinations();
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
                "outbox: pruned {} expired idempotency keys, {} dead letters and {} received \
                 webhook ids past their retention",
                pruned.idempotency_keys,
                pruned.dead_letters,
                pruned.inbox_ids
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
