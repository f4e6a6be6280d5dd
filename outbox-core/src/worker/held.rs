//! The messages a worker holds, from claim to settlement: what counts against its in-flight
//! caps, what the heartbeat renews, what the watchdog watches.

use std::collections::{hash_map, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::message_id::MessageId;
use crate::store::{ClaimToken, ClaimedMessage};

/// One dispatch of a message to a handler thread; a re-claim of the same message is another.
pub type JobId = u64;

/// Where a held message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Claimed, waiting for a handler thread.
    Queued,
    /// A handler thread runs it.
    Running {
        /// Since when.
        since: Instant,
        /// Which handler thread.
        thread: usize,
    },
    /// Its outcome is on its way to the store.
    Settling,
}

/// A held message.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The dispatch.
    pub job: JobId,
    /// The claim it is leased under now (a re-claim moves it).
    pub token: ClaimToken,
    /// The claims it was leased under before, in this dispatch: an outcome under one of them
    /// is this dispatch's, to settle under `token`. (An outcome under any other claim is not,
    /// though it names the same message: a stuck earlier attempt's.)
    pub moved_from: Vec<ClaimToken>,
    /// For logs and synthesized outcomes.
    pub message_id: MessageId,
    /// For the watchdog's retry policy and the metrics.
    pub message_type: String,
    /// For the delivery lag metric.
    pub enqueued_at: SystemTime,
    /// For the watchdog's outcome.
    pub ordering_key: Option<String>,
    /// For the watchdog's log lines: the trace that enqueued it.
    pub trace_id: Option<String>,
    /// Which attempt this is.
    pub attempt: u32,
    /// Payload bytes, counted against the byte cap.
    pub bytes: usize,
    /// When the lease ends, as far as this worker knows.
    pub lease_ends: Instant,
    /// Where it is.
    pub stage: Stage,
    /// The next messages of its ordering key chained behind it on the same handler thread, by
    /// position and job: given back with it if the watchdog gives up on it.
    pub chained: Vec<(i64, JobId)>,
}

/// What the claimer does with a message a claim returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// New: dispatch it as this job.
    Dispatch(JobId),
    /// This worker holds it already (its lease ran out while it waited or ran, and this worker
    /// claimed it again): the held one now answers to the new claim; do not dispatch it twice.
    AlreadyHeld,
    /// A handler thread of this worker is still stuck in an earlier attempt of it: count this
    /// attempt as timed out too, without running it beside the stuck one.
    StillStuck,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<i64, Entry>,
    bytes: usize,
    next_job: JobId,
    /// Messages whose handler thread the watchdog gave up on, by position: the job and thread.
    stuck: HashMap<i64, (JobId, usize)>,
}

/// The held messages, shared by the worker's threads.
#[derive(Debug, Default)]
pub struct Held {
    state: Mutex<State>,
}

impl Held {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Messages held.
    pub fn count(&self) -> usize {
        self.state().entries.len()
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        self.state().bytes
    }

    /// Handler threads stuck in a message past its timeout (a thread stuck in a batch counts
    /// once).
    pub fn stuck(&self) -> usize {
        let threads: HashSet<usize> = self.state().stuck.values().map(|(_, t)| *t).collect();
        threads.len()
    }

    /// Takes a claimed message in.
    pub fn admit(
        &self,
        token: ClaimToken,
        message: &ClaimedMessage,
        lease_ends: Instant,
    ) -> Admission {
        let mut state = self.state();
        if state.stuck.contains_key(&message.position) {
            return Admission::StillStuck;
        }
        if let Some(entry) = state.entries.get_mut(&message.position) {
            let earlier = std::mem::replace(&mut entry.token, token);
            entry.moved_from.push(earlier);
            entry.lease_ends = lease_ends;
            return Admission::AlreadyHeld;
        }
        let job = state.next_job;
        state.next_job += 1;
        let bytes = message.payload.len();
        state.bytes += bytes;
        state.entries.insert(
            message.position,
            Entry {
                job,
                token,
                moved_from: Vec::new(),
                message_id: message.message_id,
                message_type: message.message_type.clone(),
                enqueued_at: message.enqueued_at,
                ordering_key: message.ordering_key.clone(),
                trace_id: message.headers.trace_id().map(str::to_owned),
                attempt: message.attempt,
                bytes,
                lease_ends,
                stage: Stage::Queued,
                chained: Vec::new(),
            },
        );
        Admission::Dispatch(job)
    }

    /// Chains jobs of one ordering key, in order: each runs after the one before it on one
    /// handler thread (see [`give_up_chained`](Self::give_up_chained)).
    pub fn chain(&self, jobs: &[(i64, JobId)]) {
        let mut state = self.state();
        for (n, (position, job)) in jobs.iter().enumerate() {
            if let Some(entry) = state.entries.get_mut(position).filter(|e| e.job == *job) {
                entry.chained = jobs[n + 1..].to_vec();
            }
        }
    }

    /// A handler thread starts `job`; its lease end, or `None` if the job is no longer held or
    /// was given up before it started.
    pub fn start(&self, position: i64, job: JobId, thread: usize, now: Instant) -> Option<Instant> {
        let mut state = self.state();
        let entry = state
            .entries
            .get_mut(&position)
            .filter(|e| e.job == job && e.stage == Stage::Queued)?;
        entry.stage = Stage::Running { since: now, thread };
        Some(entry.lease_ends)
    }

    /// The claim `job` is leased under now, while it runs (not once the watchdog gave up on
    /// it).
    pub fn token(&self, position: i64, job: JobId) -> Option<ClaimToken> {
        let state = self.state();
        if state
            .stuck
            .get(&position)
            .is_some_and(|(stuck, _)| *stuck == job)
        {
            return None;
        }
        state
            .entries
            .get(&position)
            .filter(|e| e.job == job)
            .map(|e| e.token)
    }

    /// The claim a held message answers to now, if it was claimed again (by this worker) after
    /// it was leased under `token`.
    pub fn moved_to(&self, position: i64, token: ClaimToken) -> Option<ClaimToken> {
        self.state()
            .entries
            .get(&position)
            .filter(|entry| entry.moved_from.contains(&token))
            .map(|entry| entry.token)
    }

    /// A handler thread finished `job`: the claim to settle it under, or `None` if the
    /// watchdog gave up on it meanwhile (its outcome is then dropped: another was settled).
    pub fn finish(&self, position: i64, job: JobId) -> Option<ClaimToken> {
        let mut state = self.state();
        if state
            .stuck
            .get(&position)
            .is_some_and(|(stuck, _)| *stuck == job)
        {
            state.stuck.remove(&position);
            return None;
        }
        let entry = state
            .entries
            .get_mut(&position)
            .filter(|e| e.job == job && e.stage != Stage::Settling)?;
        entry.stage = Stage::Settling;
        Some(entry.token)
    }

    /// Outcomes of these messages, each under the claim it names, were settled (or given up):
    /// they are no longer held. Returns their entries, in the order given (`None` for a message
    /// not held, or held by a dispatch that never answered to that claim: a newer attempt,
    /// which an older attempt's outcome must not release).
    pub fn release(
        &self,
        settled: impl IntoIterator<Item = (i64, ClaimToken)>,
    ) -> Vec<Option<Entry>> {
        let mut state = self.state();
        settled
            .into_iter()
            .map(|(position, token)| {
                let hash_map::Entry::Occupied(held) = state.entries.entry(position) else {
                    return None;
                };
                let ours = held.get().token == token || held.get().moved_from.contains(&token);
                if !ours {
                    return None;
                }
                let entry = held.remove();
                state.bytes -= entry.bytes;
                Some(entry)
            })
            .collect()
    }

    /// Messages running for longer than `timeout`, oldest first.
    pub fn overdue(&self, now: Instant, timeout: Duration) -> Vec<(i64, Entry)> {
        let mut overdue: Vec<(i64, Entry)> = self
            .state()
            .entries
            .iter()
            .filter(|(_, e)| {
                matches!(e.stage, Stage::Running { since, .. }
                    if now.saturating_duration_since(since) > timeout)
            })
            .map(|(position, entry)| (*position, entry.clone()))
            .collect();
        overdue.sort_by_key(|(_, e)| e.job);
        overdue
    }

    /// The watchdog gives up on a running message: its thread's eventual outcome will be
    /// dropped, and its message counts as stuck until that thread returns. Returns the claim
    /// to settle the timed-out attempt under, and the stuck thread.
    pub fn abandon(&self, position: i64, job: JobId) -> Option<(ClaimToken, usize)> {
        let mut state = self.state();
        let entry = state.entries.get_mut(&position).filter(|e| e.job == job)?;
        let Stage::Running { thread, .. } = entry.stage else {
            return None;
        };
        entry.stage = Stage::Settling;
        let token = entry.token;
        state.stuck.insert(position, (job, thread));
        Some((token, thread))
    }

    /// The jobs chained behind an abandoned `job` that have not started: given up with it, so
    /// that they wait for no stuck thread, and never started by it. Returns them, to be given
    /// back to the store.
    pub fn give_up_chained(&self, position: i64, job: JobId) -> Vec<(i64, Entry)> {
        let mut state = self.state();
        let chained = match state.entries.get(&position).filter(|e| e.job == job) {
            Some(entry) => entry.chained.clone(),
            None => return Vec::new(),
        };
        Self::give_up(&mut state, chained)
    }

    /// The jobs chained behind messages whose leases passed to other claims, that have not
    /// started: given up, so that none runs before (or beside) another claim's attempt of the
    /// message before it. Returns them, to be given back to the store.
    pub fn give_up_behind(&self, lost: &[i64]) -> Vec<(i64, Entry)> {
        let mut state = self.state();
        let chained: Vec<(i64, JobId)> = lost
            .iter()
            .filter_map(|position| state.entries.get(position))
            .flat_map(|entry| entry.chained.iter().copied())
            .collect();
        Self::give_up(&mut state, chained)
    }

    fn give_up(state: &mut State, chained: Vec<(i64, JobId)>) -> Vec<(i64, Entry)> {
        let mut given_up = Vec::new();
        for (position, job) in chained {
            if let Some(entry) = state
                .entries
                .get_mut(&position)
                .filter(|e| e.job == job && e.stage == Stage::Queued)
            {
                entry.stage = Stage::Settling;
                given_up.push((position, entry.clone()));
            }
        }
        given_up
    }

    /// Every held lease, for the heartbeat.
    pub fn leases(&self) -> Vec<(ClaimToken, i64)> {
        let mut leases: Vec<(ClaimToken, i64)> = self
            .state()
            .entries
            .iter()
            .map(|(position, entry)| (entry.token, *position))
            .collect();
        leases.sort_unstable();
        leases
    }

    /// The heartbeat renewed these leases until `lease_ends`.
    pub fn renewed(&self, leases: &[(ClaimToken, i64)], lease_ends: Instant) {
        let mut state = self.state();
        for (token, position) in leases {
            if let Some(entry) = state.entries.get_mut(position) {
                if entry.token == *token {
                    entry.lease_ends = lease_ends;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn message(position: i64, payload: &str) -> ClaimedMessage {
        ClaimedMessage {
            position,
            message_id: MessageId::new(),
            message_type: "t".into(),
            payload: payload.into(),
            ordering_key: None,
            attempt: 1,
            enqueued_at: SystemTime::now(),
            resumed_at: None,
            headers: Default::default(),
            subscription_id: None,
            priority: Default::default(),
        }
    }

    #[test]
    fn counts_and_bytes_follow_admission_and_release() {
        let held = Held::default();
        let now = Instant::now();
        let token = ClaimToken::new();
        assert!(matches!(
            held.admit(token, &message(1, "abc"), now),
            Admission::Dispatch(_)
        ));
        assert!(matches!(
            held.admit(token, &message(2, "de"), now),
            Admission::Dispatch(_)
        ));
        assert_eq!((held.count(), held.bytes()), (2, 5));
        held.release([(1, token), (1, token), (3, token)]);
        assert_eq!((held.count(), held.bytes()), (1, 2));
        held.release([(2, ClaimToken::new())]);
        assert_eq!(
            held.count(),
            1,
            "another claim's outcome does not release it"
        );
        assert_eq!(held.leases(), vec![(token, 2)]);
    }

    #[test]
    fn a_message_claimed_again_while_held_moves_to_the_new_claim_and_is_not_dispatched_twice() {
        let held = Held::default();
        let now = Instant::now();
        let (first, second) = (ClaimToken::new(), ClaimToken::new());
        let Admission::Dispatch(job) = held.admit(first, &message(7, "x"), now) else {
            panic!("not dispatched");
        };
        held.start(7, job, 0, now).unwrap();
        assert_eq!(
            held.admit(second, &message(7, "x"), now),
            Admission::AlreadyHeld
        );
        assert_eq!(held.count(), 1);
        assert_eq!(
            held.finish(7, job),
            Some(second),
            "settled under the claim that holds it"
        );
    }

    #[test]
    fn only_the_claims_a_held_message_answered_to_settle_and_release_it() {
        let held = Held::default();
        let now = Instant::now();
        let (first, second, third, other) = (
            ClaimToken::new(),
            ClaimToken::new(),
            ClaimToken::new(),
            ClaimToken::new(),
        );
        assert!(matches!(
            held.admit(first, &message(5, "x"), now),
            Admission::Dispatch(_)
        ));
        assert_eq!(held.moved_to(5, first), None, "not moved yet");
        held.admit(second, &message(5, "x"), now);
        held.admit(third, &message(5, "x"), now);
        assert_eq!(held.moved_to(5, first), Some(third));
        assert_eq!(held.moved_to(5, second), Some(third));
        assert_eq!(held.moved_to(5, other), None, "another attempt's claim");
        assert!(held.release([(5, other)])[0].is_none());
        assert_eq!(held.count(), 1);
        assert!(
            held.release([(5, first)])[0].is_some(),
            "an earlier claim's outcome"
        );
        assert_eq!(held.count(), 0);
    }

    #[test]
    fn an_abandoned_job_drops_its_late_outcome_and_blocks_a_second_run() {
        let held = Held::default();
        let start = Instant::now();
        let token = ClaimToken::new();
        let Admission::Dispatch(job) = held.admit(token, &message(9, "x"), start) else {
            panic!("not dispatched");
        };
        held.start(9, job, 3, start).unwrap();
        let later = start + Duration::from_secs(10);
        assert!(held.overdue(later, Duration::from_secs(20)).is_empty());
        let overdue = held.overdue(later, Duration::from_secs(5));
        assert_eq!(overdue.len(), 1);
        assert_eq!(held.abandon(9, job), Some((token, 3)));
        assert_eq!(held.stuck(), 1);
        held.release([(9, token)]);
        assert_eq!(
            held.admit(ClaimToken::new(), &message(9, "x"), later),
            Admission::StillStuck
        );
        assert_eq!(held.finish(9, job), None, "the late outcome is dropped");
        assert_eq!(held.stuck(), 0);
        assert!(matches!(
            held.admit(token, &message(9, "x"), later),
            Admission::Dispatch(_)
        ));
    }

    /// A chain's messages behind one the watchdog gives up on, or whose lease another claim
    /// took, are given up once: never started afterwards, and no outcome of theirs is taken
    /// from the thread that held them.
    #[test]
    fn the_chain_behind_an_abandoned_or_lost_message_is_given_up_once() {
        let now = Instant::now();
        let token = ClaimToken::new();
        for lost in [false, true] {
            let held = Held::default();
            let jobs: Vec<(i64, JobId)> = (1..=4)
                .map(
                    |position| match held.admit(token, &message(position, "x"), now) {
                        Admission::Dispatch(job) => (position, job),
                        other => panic!("{other:?}"),
                    },
                )
                .collect();
            held.chain(&jobs);
            held.start(1, jobs[0].1, 0, now).unwrap();
            assert_eq!(held.finish(1, jobs[0].1), Some(token));
            held.start(2, jobs[1].1, 0, now).unwrap();
            let given_up = if lost {
                held.give_up_behind(&[2])
            } else {
                assert!(held.abandon(2, jobs[1].1).is_some());
                held.give_up_chained(2, jobs[1].1)
            };
            let positions: Vec<i64> = given_up.iter().map(|(p, _)| *p).collect();
            assert_eq!(positions, [3, 4], "lost: {lost}");
            assert!(held.give_up_behind(&[2]).is_empty(), "once");
            assert_eq!(held.start(3, jobs[2].1, 0, now), None, "not started");
            assert_eq!(held.finish(4, jobs[3].1), None, "no second outcome");
            assert_eq!(held.count(), 4, "held until their give-backs are settled");
        }
    }

    #[test]
    fn a_finished_or_unknown_job_cannot_be_started_or_abandoned() {
        let held = Held::default();
        let now = Instant::now();
        assert_eq!(held.start(1, 0, 0, now), None);
        assert_eq!(held.abandon(1, 0), None);
        let Admission::Dispatch(job) = held.admit(ClaimToken::new(), &message(1, ""), now) else {
            panic!("not dispatched");
        };
        assert_eq!(held.abandon(1, job), None, "queued, not running");
        assert_eq!(held.start(1, job + 1, 0, now), None, "another job");
    }
}
