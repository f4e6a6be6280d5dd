//! A store around the library's `DieselStore` that counts what the worker asks of the
//! database: claims (with their limits and sizes, empty and short ones), settlements, the time
//! each takes, and the idle gaps between claims. Costs a clock read and a lock per claim or
//! settlement, not per message.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use outbox_diesel::store::{
    Backlog, ClaimLimit, ClaimToken, ClaimedMessage, DestinationReport, Listener, Notifications,
    Outcome, Paused, Pauses, Pruned, SettleTarget, SharedDestinations, SharedTurns, Store,
    StoreError, StoredDestination, Subscriptions, SuccessorLease, SyncedDestination,
    TransactionalSettlement, Turns,
};
use outbox_diesel::subscription::Subscription;
use outbox_diesel::ProcessError;
use serde_json::{json, Value};

use crate::stats::round;

/// Counters shared between the store and the benchmark.
#[derive(Debug, Default, Clone)]
pub struct Trace {
    claims: u64,
    empty_claims: u64,
    /// Claims that returned some messages but fewer than asked for.
    short_claims: u64,
    claimed: u64,
    asked: u64,
    claim_time: Duration,
    max_claim: Duration,
    settles: u64,
    settled: u64,
    /// Messages settlements leased (the next messages of settled ordering keys).
    leased_by_settles: u64,
    settle_time: Duration,
    max_settle: Duration,
    last_claim_end: Option<Instant>,
    first_claim: Option<Instant>,
    last_claim_size: usize,
    /// Where each idle gap began (ms after the first claim) and what the claim before it got.
    gap_context: Vec<(f64, usize)>,
    /// Pauses over 200 ms between one claim's end and the next one's start.
    gaps_ms: Vec<f64>,
}

/// The handle the benchmark keeps.
#[derive(Debug, Clone, Default)]
pub struct TraceHandle(Arc<Mutex<Trace>>);

impl TraceHandle {
    fn with<T>(&self, f: impl FnOnce(&mut Trace) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Claims, messages claimed, and the time claims took, so far.
    pub fn totals(&self) -> (u64, u64, Duration) {
        self.with(|t| (t.claims, t.claimed, t.claim_time))
    }

    /// Forgets everything so far.
    pub fn reset(&self) {
        self.with(|t| *t = Trace::default());
    }

    /// Per-message figures for `messages` processed.
    pub fn summary(&self, messages: u64) -> Value {
        let t = self.with(|t| t.clone());
        let per = |n: u64| round(n as f64 / messages.max(1) as f64, 4);
        let ms = |d: Duration| round(d.as_secs_f64() * 1000.0, 2);
        json!({
            "claims": t.claims,
            "empty_claims": t.empty_claims,
            "short_claims": t.short_claims,
            "msgs_per_nonempty_claim":
                round(t.claimed as f64 / (t.claims - t.empty_claims).max(1) as f64, 2),
            "mean_claim_limit": round(t.asked as f64 / t.claims.max(1) as f64, 2),
            "claims_per_msg": per(t.claims),
            "settles": t.settles,
            "msgs_per_settle": round(t.settled as f64 / t.settles.max(1) as f64, 2),
            "settles_per_msg": per(t.settles),
            "leased_by_settles": t.leased_by_settles,
            "claim_ms_total": ms(t.claim_time),
            "claim_ms_mean": round(t.claim_time.as_secs_f64() * 1000.0 / t.claims.max(1) as f64, 3),
            "claim_ms_max": ms(t.max_claim),
            "settle_ms_total": ms(t.settle_time),
            "settle_ms_mean":
                round(t.settle_time.as_secs_f64() * 1000.0 / t.settles.max(1) as f64, 3),
            "settle_ms_max": ms(t.max_settle),
            "idle_gaps_over_200ms": t.gaps_ms.len(),
            "idle_gap_ms": t.gaps_ms,
            "idle_gap_at_ms_after_claim_of": t.gap_context,
        })
    }
}

/// The wrapped store.
pub struct TracedStore<S> {
    inner: S,
    trace: TraceHandle,
}

impl<S> TracedStore<S> {
    /// Wraps `inner`, counting into `trace`.
    pub fn new(inner: S, trace: TraceHandle) -> Self {
        TracedStore { inner, trace }
    }

    fn traced_settle(&self, settled: usize, leased: usize, took: Duration) {
        self.trace.with(|t| {
            t.settles += 1;
            t.settled += settled as u64;
            t.leased_by_settles += leased as u64;
            t.settle_time += took;
            t.max_settle = t.max_settle.max(took);
        });
    }
}

impl<S: Store> Store for TracedStore<S> {
    fn check(&self, connections: usize) -> Result<(), StoreError> {
        self.inner.check(connections)
    }

    fn claim(
        &self,
        token: ClaimToken,
        limit: ClaimLimit,
        lease: Duration,
    ) -> Result<Vec<ClaimedMessage>, StoreError> {
        let started = Instant::now();
        let result = self.inner.claim(token, limit, lease);
        let ended = Instant::now();
        let took = ended - started;
        self.trace.with(|t| {
            if let Some(last) = t.last_claim_end {
                let gap = started.saturating_duration_since(last);
                if gap > Duration::from_millis(200) {
                    t.gaps_ms.push(round(gap.as_secs_f64() * 1000.0, 0));
                    let at = last.saturating_duration_since(*t.first_claim.get_or_insert(started));
                    let before = t.last_claim_size;
                    t.gap_context
                        .push((round(at.as_secs_f64() * 1000.0, 0), before));
                }
            }
            t.first_claim.get_or_insert(started);
            t.last_claim_end = Some(ended);
            t.last_claim_size = result.as_ref().map_or(0, Vec::len);
            t.claims += 1;
            t.asked += limit.messages as u64;
            t.claim_time += took;
            t.max_claim = t.max_claim.max(took);
            if let Ok(claimed) = &result {
                let n = claimed.len() as u64;
                t.claimed += n;
                if n == 0 {
                    t.empty_claims += 1;
                } else if n < limit.messages as u64 {
                    t.short_claims += 1;
                }
            }
        });
        result
    }

    fn settle(&self, outcomes: &[Outcome]) -> Result<Vec<i64>, StoreError> {
        let started = Instant::now();
        let result = self.inner.settle(outcomes);
        self.traced_settle(outcomes.len(), 0, started.elapsed());
        result
    }

    fn settle_and_lease(
        &self,
        outcomes: &[Outcome],
        successors: &SuccessorLease,
    ) -> Result<(Vec<i64>, Vec<ClaimedMessage>), StoreError> {
        let started = Instant::now();
        let result = self.inner.settle_and_lease(outcomes, successors);
        let leased = result.as_ref().map_or(0, |(_, leased)| leased.len());
        self.traced_settle(outcomes.len(), leased, started.elapsed());
        result
    }

    fn extend_leases(
        &self,
        leases: &[(ClaimToken, i64)],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        self.inner.extend_leases(leases, lease)
    }

    fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping()
    }

    fn promote_stranded(&self) -> Result<usize, StoreError> {
        self.inner.promote_stranded()
    }

    fn prune(&self) -> Result<Pruned, StoreError> {
        self.inner.prune()
    }

    fn backlog(&self) -> Result<Option<Backlog>, StoreError> {
        self.inner.backlog()
    }

    fn connection_shortage(&self) -> Option<String> {
        self.inner.connection_shortage()
    }
}

impl<S: SharedDestinations> SharedDestinations for TracedStore<S> {
    fn sync_destinations(
        &self,
        destinations: &[SyncedDestination<'_>],
        reconcile: &mut dyn FnMut(&[StoredDestination]) -> Vec<DestinationReport>,
    ) -> Result<(), StoreError> {
        self.inner.sync_destinations(destinations, reconcile)
    }
}

impl<S: SharedTurns> SharedTurns for TracedStore<S> {
    fn take_turn(
        &self,
        name: &str,
        kind: &str,
        take: &mut dyn FnMut(Option<Turns>, i64) -> Turns,
    ) -> Result<(), StoreError> {
        self.inner.take_turn(name, kind, take)
    }
}

impl<S: Pauses> Pauses for TracedStore<S> {
    fn paused(&self) -> Result<Paused, StoreError> {
        self.inner.paused()
    }

    fn release_paused(&self) -> Result<usize, StoreError> {
        self.inner.release_paused()
    }
}

impl<S: Subscriptions> Subscriptions for TracedStore<S> {
    fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError> {
        self.inner.subscriptions()
    }

    fn fan_out(&self, target: &SettleTarget<'_>) -> Result<Option<usize>, StoreError> {
        self.inner.fan_out(target)
    }

    fn release_subscription(&self, id: &str) -> Result<usize, StoreError> {
        self.inner.release_subscription(id)
    }
}

impl<S: Notifications> Notifications for TracedStore<S> {
    fn listens(&self) -> bool {
        self.inner.listens()
    }

    fn listen(&self) -> Result<Option<Box<dyn Listener>>, StoreError> {
        self.inner.listen()
    }

    fn wants_local_wakeups(&self) -> bool {
        self.inner.wants_local_wakeups()
    }
}

impl<S: TransactionalSettlement> TransactionalSettlement for TracedStore<S> {
    type Connection = S::Connection;

    fn settle_within(
        &self,
        message: &SettleTarget<'_>,
        work: &mut dyn FnMut(&mut S::Connection) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessError> {
        self.inner.settle_within(message, work)
    }
}
