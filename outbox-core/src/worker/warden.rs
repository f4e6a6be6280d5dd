//! The warden: looks after what the worker holds while it waits or runs. It renews their leases
//! (the heartbeat), so that a lease bounds how long a dead worker's messages wait rather than
//! how long a handler may run; and it counts handlers that overran their timeout (the
//! watchdog), sending their timed-out outcomes to the acker and replacing their stuck threads.
//! On a thread of its own, so that neither waits for a settlement.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::metrics;
use crate::store::{Outcome, Settlement};

use super::handlers::{self, log_settlement, policy_for, settle_attempt, Attempt};
use super::held::Entry;
use super::shared::Shared;
use super::timing::{ACKER_TICK, WATCHDOG_GRACE};
use super::vitals::{AliveGuard, Counters};

/// The warden's thread.
pub(crate) struct Warden {
    shared: Arc<Shared>,
    outcomes: Sender<Outcome>,
    /// Closed when the worker stops.
    stop: Receiver<()>,
    rounds: Rounds,
}

/// When the warden's rounds are due: given the time, so that the simulation drives them without
/// threads or sleeps.
pub(crate) struct Rounds {
    next_heartbeat: Instant,
}

impl Warden {
    pub fn new(shared: Arc<Shared>, outcomes: Sender<Outcome>, stop: Receiver<()>) -> Self {
        let rounds = Rounds::new(&shared, Instant::now());
        Warden {
            shared,
            outcomes,
            stop,
            rounds,
        }
    }

    /// The thread: watches and renews until the worker has stopped and nothing is held.
    pub fn run(mut self) {
        let shared = Arc::clone(&self.shared);
        let _alive = AliveGuard::new(&shared.vitals.warden_alive);
        loop {
            // Each round survives the other's panic: a watchdog that panics on every round
            // must not keep the heartbeat from renewing what is held.
            shared.survive("warden", ACKER_TICK, || self.watch());
            let (rounds, outcomes) = (&mut self.rounds, &self.outcomes);
            shared.survive("warden", ACKER_TICK, || {
                rounds.heartbeat(&shared, Instant::now(), |outcome| {
                    let _ = outcomes.send(outcome);
                })
            });
            if shared.stopping() && (shared.held.count() == 0 || shared.past_give_up()) {
                return;
            }
            let now = Instant::now();
            let next = self.rounds.next_heartbeat.min(now + ACKER_TICK);
            // Once the worker stops, its closed stop signal answers at once: the rest of the wait
            // is slept, or the warden would spin while the handlers finish.
            if let Err(RecvTimeoutError::Disconnected) =
                self.stop.recv_timeout(next.saturating_duration_since(now))
            {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        }
    }

    fn watch(&mut self) {
        let shared = Arc::clone(&self.shared);
        let outcomes = &self.outcomes;
        let stuck = self.rounds.watchdog(&shared, Instant::now(), |outcome| {
            let _ = outcomes.send(outcome);
        });
        for thread in stuck {
            // A stuck thread is replaced, and ends when its handler returns. Replacements stop
            // once as many threads are stuck as there are handler threads (a handler that hangs
            // on everything must not grow the process without bound); a thread not replaced
            // goes on serving when its handler returns.
            if shared.held.stuck() > shared.config.handler_threads || shared.stopping() {
                continue;
            }
            match handlers::spawn(&shared) {
                Ok(()) => shared.pool.retire(thread),
                Err(error) => {
                    log::error!("outbox: could not start a replacement handler thread: {error}")
                }
            }
        }
    }
}

impl Rounds {
    pub fn new(shared: &Shared, now: Instant) -> Self {
        Rounds {
            next_heartbeat: now + shared.config.heartbeat,
        }
    }

    /// Counts messages running past their handler's timeout as timed-out attempts, hands their
    /// outcomes to `settle`; returns the handler threads stuck in them.
    pub fn watchdog(
        &mut self,
        shared: &Shared,
        now: Instant,
        mut settle: impl FnMut(Outcome),
    ) -> Vec<usize> {
        let limit = shared.config.handler_timeout.saturating_add(WATCHDOG_GRACE);
        let mut stuck = Vec::new();
        for (position, entry) in shared.held.overdue(now, limit) {
            // Judged before the attempt is given up on, and sent before anything else is told
            // (the application's logger and recorder may panic): an attempt given up on
            // without an outcome would stay held for good.
            let settlement = settle_attempt(
                entry.attempt,
                Attempt::TimedOut(shared.config.handler_timeout),
                &policy_for(shared, &entry.message_type),
            );
            let Some((token, thread)) = shared.held.abandon(position, entry.job) else {
                continue;
            };
            Counters::add(&shared.counters.timed_out, 1);
            settle(Outcome {
                token,
                position,
                message_id: entry.message_id,
                ordering_key: entry.ordering_key.clone(),
                log: None,
                settlement: settlement.clone(),
            });
            // The next messages of its key chained behind it would wait for the stuck thread:
            // they go back to the store, the attempt not counted, to run in their turn.
            give_back(
                shared.held.give_up_chained(position, entry.job),
                &mut settle,
            );
            if !stuck.contains(&thread) {
                // Once, however many messages of a batch it holds.
                stuck.push(thread);
            }
            log::warn!(
                "outbox: message {} ({}) is still running on handler thread {thread} past its \
                 timeout of {:?}; counted as timed out",
                entry.message_id,
                entry.message_type,
                shared.config.handler_timeout
            );
            log_settlement(
                &entry.message_id,
                &entry.message_type,
                entry.trace_id.as_deref(),
                &settlement,
            );
            metrics::handler_timeout(shared.metric_type(&entry.message_type));
        }
        stuck
    }

    /// Renews the leases of everything held, a few times per lease; the messages chained behind
    /// one whose lease another claim took go back to the store, their outcomes to `settle`.
    pub fn heartbeat(&mut self, shared: &Shared, now: Instant, mut settle: impl FnMut(Outcome)) {
        if now < self.next_heartbeat {
            return;
        }
        self.next_heartbeat = now + shared.config.heartbeat;
        let leases = shared.held.leases();
        if leases.is_empty() {
            return;
        }
        let renewed = shared.vitals.store_call("warden", "extend_leases", || {
            shared.store.extend_leases(&leases, shared.config.lease)
        });
        match renewed {
            Ok(lost) => {
                // Before the rest is renewed: a chained message whose lease this renews would
                // run while another claim's attempt of the message before it may still run.
                give_back(shared.held.give_up_behind(&lost), &mut settle);
                let kept: Vec<_> = leases
                    .iter()
                    .copied()
                    .filter(|(_, position)| !lost.contains(position))
                    .collect();
                shared.held.renewed(&kept, now + shared.config.lease);
                if !lost.is_empty() {
                    log::warn!(
                        "outbox: the leases on {} held messages had passed to other claims; \
                         their outcomes will be dropped (positions {lost:?})",
                        lost.len()
                    );
                }
            }
            Err(error) => {
                metrics::store_error("extend_leases");
                log::warn!(
                    "outbox: renewing the leases of {} held messages failed (trying again in \
                     {:?}): {error}",
                    leases.len(),
                    shared.config.heartbeat
                );
            }
        }
    }
}

/// Gives chained messages back to the store, the attempt not counted.
fn give_back(given_up: Vec<(i64, Entry)>, settle: &mut impl FnMut(Outcome)) {
    for (position, entry) in given_up {
        settle(Outcome {
            token: entry.token,
            position,
            message_id: entry.message_id,
            ordering_key: entry.ordering_key,
            log: None,
            settlement: Settlement::Release,
        });
    }
}
