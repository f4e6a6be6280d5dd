//! Fan-outs committed together: the handler threads that fan events out at the same moment
//! share one transaction on the settlement connection instead of taking it one commit each.
//!
//! Run alone, each event's fan-out is a transaction of its own, and the settlement connection
//! runs one transaction at a time: an event with a single subscriber cost a commit per
//! delivery, and events with few subscribers drained at a twentieth of the rate of ordinary
//! messages. So a caller queues its fan-out; if no group is running it runs every fan-out
//! queued by then (up to [`MAX_GROUP`]) in one transaction, and otherwise it waits until a
//! group has run, woken with its result or to run the next group. Nobody waits for a timer: a
//! fan-out alone runs at once, and a group forms only while the connection is busy. (A caller
//! whose result is ready never waits for the next group: waiting for a turn to read it held
//! every finished caller behind each group of one.)
//!
//! A group that fails (one event's rows refused, a deadlock) is run again one event a
//! transaction, so that an event that cannot be fanned out fails alone.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use diesel::QueryResult;
use outbox_core::store::StoreError;

/// The most events one transaction fans out.
pub(crate) const MAX_GROUP: usize = 64;

/// One queued fan-out: the event's position, the claim that holds it, and, once run, its result.
#[derive(Debug)]
pub(crate) struct FanOut {
    pub(crate) position: i64,
    pub(crate) token: String,
    result: Mutex<Slot>,
}

#[derive(Debug)]
enum Slot {
    Waiting,
    Done(Result<Option<usize>, StoreError>),
    Taken,
}

impl FanOut {
    /// Gives it its result, unless it has one.
    fn finish(&self, result: Result<Option<usize>, StoreError>) {
        let mut slot = lock(&self.result);
        if matches!(*slot, Slot::Waiting) {
            *slot = Slot::Done(result);
        }
    }

    fn take(&self) -> Option<Result<Option<usize>, StoreError>> {
        let mut slot = lock(&self.result);
        match std::mem::replace(&mut *slot, Slot::Taken) {
            Slot::Done(result) => Some(result),
            other => {
                *slot = other;
                None
            }
        }
    }
}

/// The queue of fan-outs, and whether a group is running.
#[derive(Debug, Default)]
pub(crate) struct FanOuts {
    state: Mutex<State>,
    /// Signalled when a group has run.
    ran: Condvar,
}

#[derive(Debug, Default)]
struct State {
    queued: Vec<Arc<FanOut>>,
    running: bool,
}

/// Runs fan-outs on the settlement connection.
pub(crate) trait RunFanOuts {
    /// Fans out every event of `group` in one transaction: each one's result, in order.
    fn together(&self, group: &[Arc<FanOut>]) -> Result<Vec<Option<usize>>, StoreError>;

    /// Fans out one event in a transaction of its own.
    fn alone(&self, fan_out: &FanOut) -> Result<Option<usize>, StoreError>;
}

impl FanOuts {
    /// Fans the event at `position` out, with whatever other fan-outs are queued when its turn
    /// comes; `None` if the claim `token` no longer holds it.
    pub(crate) fn fan_out(
        &self,
        position: i64,
        token: String,
        runner: &impl RunFanOuts,
    ) -> Result<Option<usize>, StoreError> {
        let mine = Arc::new(FanOut {
            position,
            token,
            result: Mutex::new(Slot::Waiting),
        });
        let mut state = lock(&self.state);
        state.queued.push(Arc::clone(&mine));
        loop {
            // A group run meanwhile may have held it. Its result is given before the group's
            // runner signals, under this lock, so no signal is missed between here and the wait.
            if let Some(result) = mine.take() {
                return result;
            }
            if state.running {
                state = self.ran.wait(state).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            state.running = true;
            let take = state.queued.len().min(MAX_GROUP);
            let mut group: Vec<Arc<FanOut>> = state.queued.drain(..take).collect();
            drop(state);
            // Always in the same order, so two workers' groups never wait on each other.
            group.sort_by_key(|fan_out| fan_out.position);
            {
                let _running = Running {
                    fan_outs: self,
                    group: &group,
                };
                run_group(&group, runner);
            }
            state = lock(&self.state);
        }
    }
}

/// A group being run: when it ends, even by a panic, every member has a result and the waiters
/// are woken.
struct Running<'a> {
    fan_outs: &'a FanOuts,
    group: &'a [Arc<FanOut>],
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        for fan_out in self.group {
            fan_out.finish(Err(StoreError::new(
                "fanning events out to their subscribers",
                "the fan-out panicked; the event is fanned out again when its lease ends",
            )));
        }
        lock(&self.fan_outs.state).running = false;
        self.fan_outs.ran.notify_all();
    }
}

fn run_group(group: &[Arc<FanOut>], runner: &impl RunFanOuts) {
    if let [fan_out] = group {
        fan_out.finish(runner.alone(fan_out));
        return;
    }
    match runner.together(group) {
        Ok(results) if results.len() == group.len() => {
            for (fan_out, result) in group.iter().zip(results) {
                fan_out.finish(Ok(result));
            }
        }
        Ok(_) | Err(_) => {
            for fan_out in group {
                fan_out.finish(runner.alone(fan_out));
            }
        }
    }
}

/// Every event of `group` fanned out by `fan_out` inside one transaction already begun.
pub(crate) fn each<C>(
    c: &mut C,
    group: &[Arc<FanOut>],
    fan_out: impl Fn(&mut C, i64, &str) -> QueryResult<Option<usize>>,
) -> QueryResult<Vec<Option<usize>>> {
    group
        .iter()
        .map(|one| fan_out(c, one.position, &one.token))
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;
    use std::time::Duration;

    use super::*;

    /// Fans out by answering each position's double, failing a group that holds position 13,
    /// and counting its transactions.
    #[derive(Default)]
    struct Counting {
        transactions: AtomicUsize,
        largest_group: AtomicUsize,
    }

    impl RunFanOuts for Counting {
        fn together(&self, group: &[Arc<FanOut>]) -> Result<Vec<Option<usize>>, StoreError> {
            self.transactions.fetch_add(1, Ordering::SeqCst);
            self.largest_group.fetch_max(group.len(), Ordering::SeqCst);
            // Long enough for the other callers to queue behind it.
            std::thread::sleep(Duration::from_millis(20));
            if group.iter().any(|one| one.position == 13) {
                return Err(StoreError::new("fanning out", "position 13 is refused"));
            }
            Ok(group
                .iter()
                .map(|one| usize::try_from(one.position * 2).ok())
                .collect())
        }

        fn alone(&self, fan_out: &FanOut) -> Result<Option<usize>, StoreError> {
            self.transactions.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            if fan_out.position == 13 {
                return Err(StoreError::new("fanning out", "position 13 is refused"));
            }
            Ok(usize::try_from(fan_out.position * 2).ok())
        }
    }

    /// An event's position and what its fan-out returned.
    type FannedOut = (i64, Result<Option<usize>, String>);

    fn fan_out_from_threads(positions: &[i64]) -> (Vec<FannedOut>, Counting) {
        let fan_outs = FanOuts::default();
        let runner = Counting::default();
        let start = Barrier::new(positions.len());
        let results = std::thread::scope(|scope| {
            let running: Vec<_> = positions
                .iter()
                .map(|&position| {
                    let (fan_outs, runner, start) = (&fan_outs, &runner, &start);
                    scope.spawn(move || {
                        start.wait();
                        let result = fan_outs
                            .fan_out(position, format!("token-{position}"), runner)
                            .map_err(|e| e.to_string());
                        (position, result)
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .collect()
        });
        (results, runner)
    }

    #[test]
    fn callers_at_the_same_moment_share_transactions_and_each_gets_its_own_result() {
        let positions: Vec<i64> = (1..=16).filter(|p| *p != 13).collect();
        let (results, runner) = fan_out_from_threads(&positions);
        for (position, result) in &results {
            assert_eq!(
                result,
                &Ok(Some(*position as usize * 2)),
                "position {position}"
            );
        }
        let transactions = runner.transactions.load(Ordering::SeqCst);
        assert!(
            transactions < positions.len(),
            "{transactions} transactions for {} fan-outs: none were shared",
            positions.len()
        );
        assert!(runner.largest_group.load(Ordering::SeqCst) > 1);
    }

    #[test]
    fn a_fan_out_that_fails_its_group_fails_alone() {
        let positions: Vec<i64> = (1..=16).collect();
        let (results, _) = fan_out_from_threads(&positions);
        for (position, result) in &results {
            if *position == 13 {
                let error = result.as_ref().unwrap_err();
                assert!(error.contains("position 13 is refused"), "{error}");
            } else {
                assert_eq!(
                    result,
                    &Ok(Some(*position as usize * 2)),
                    "position {position}"
                );
            }
        }
    }

    /// Panics on any group that holds position 5, as a bug in a statement's handling might.
    struct Panicking;

    impl RunFanOuts for Panicking {
        fn together(&self, group: &[Arc<FanOut>]) -> Result<Vec<Option<usize>>, StoreError> {
            std::thread::sleep(Duration::from_millis(20));
            assert!(group.iter().all(|one| one.position != 5), "a bug");
            Ok(group.iter().map(|_| Some(1)).collect())
        }

        fn alone(&self, fan_out: &FanOut) -> Result<Option<usize>, StoreError> {
            std::thread::sleep(Duration::from_millis(20));
            assert!(fan_out.position != 5, "a bug");
            Ok(Some(1))
        }
    }

    #[test]
    fn a_panicking_group_fails_its_members_and_the_next_fan_out_still_runs() {
        let fan_outs = FanOuts::default();
        let start = Barrier::new(8);
        let results: Vec<(i64, bool)> = std::thread::scope(|scope| {
            let running: Vec<_> = (1..=8)
                .map(|position| {
                    let (fan_outs, start) = (&fan_outs, &start);
                    scope.spawn(move || {
                        start.wait();
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            fan_outs.fan_out(position, String::new(), &Panicking)
                        }));
                        (position, matches!(result, Ok(Ok(Some(1)))))
                    })
                })
                .collect();
            running.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(
            results.iter().any(|(position, ok)| *position == 5 && !ok),
            "{results:?}"
        );
        // Nobody is left waiting (the scope ended), and the queue still runs.
        assert_eq!(
            fan_outs.fan_out(9, String::new(), &Panicking).unwrap(),
            Some(1)
        );
    }

    #[test]
    fn a_fan_out_alone_runs_at_once_in_a_transaction_of_its_own() {
        let (results, runner) = fan_out_from_threads(&[7]);
        assert_eq!(results, vec![(7, Ok(Some(14)))]);
        assert_eq!(runner.transactions.load(Ordering::SeqCst), 1);
        assert_eq!(
            runner.largest_group.load(Ordering::SeqCst),
            0,
            "not run as a group"
        );
    }
}
