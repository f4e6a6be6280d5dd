//! The jobs channel: claimed messages on their way to the handler threads, the raised
//! priorities ahead of the ordinary ones already waiting.
//!
//! A claim hands its raised messages out first, but the claims before it may have left up to
//! two of the largest claims' worth of ordinary messages waiting for a handler thread; one
//! channel would make a `High` message wait for all of them (at claims of 256 on MariaDB, a
//! p99 of 99 ms under a backlog). Two lanes let it take the next free thread instead.

use crossbeam_channel::{Receiver, SendError, Sender, TryRecvError, TrySendError};

use crate::priority::Priority;
use crate::store::ClaimedMessage;

use super::held::JobId;

/// A claimed message on its way to a handler thread.
#[derive(Debug)]
pub(crate) struct Job {
    pub job: JobId,
    pub message: ClaimedMessage,
    /// The next messages of its ordering key, leased with it: run after it on the same thread,
    /// in order, each only if the one before it succeeded (see [`Job::chained`]).
    pub chain: Vec<Job>,
}

impl Job {
    /// A job with nothing chained behind it.
    pub fn single(job: JobId, message: ClaimedMessage) -> Self {
        Job {
            job,
            message,
            chain: Vec::new(),
        }
    }

    /// `chain` behind `self`: the next messages of its ordering key, in order.
    pub fn chained(mut self, chain: Vec<Job>) -> Self {
        self.chain = chain;
        self
    }
}

/// A jobs channel of two lanes, each holding up to `capacity` jobs.
pub(crate) fn channel(capacity: usize) -> (JobSender, JobReceiver) {
    let (raised_tx, raised_rx) = crossbeam_channel::bounded(capacity);
    let (ordinary_tx, ordinary_rx) = crossbeam_channel::bounded(capacity);
    let (waiting_tx, waiting_rx) = crossbeam_channel::bounded(2 * capacity);
    (
        JobSender {
            raised: raised_tx,
            ordinary: ordinary_tx,
            waiting: waiting_tx,
        },
        JobReceiver {
            raised: raised_rx,
            ordinary: ordinary_rx,
            waiting: waiting_rx,
        },
    )
}

/// Hands jobs to the handler threads, each in its priority's lane.
#[derive(Debug, Clone)]
pub(crate) struct JobSender {
    raised: Sender<Job>,
    ordinary: Sender<Job>,
    /// One token per job put in a lane, sent after it: a handler thread waits on the tokens,
    /// so that each job wakes one thread (waiting on both lanes at once would wake them all).
    waiting: Sender<()>,
}

impl JobSender {
    fn lane(&self, job: &Job) -> &Sender<Job> {
        if job.message.priority > Priority::Normal {
            &self.raised
        } else {
            &self.ordinary
        }
    }

    /// Waits for room; fails once the handler threads are gone.
    // The job comes back in the error, as in crossbeam's own `send`: the caller settles it.
    #[allow(clippy::result_large_err)]
    pub fn send(&self, job: Job) -> Result<(), SendError<Job>> {
        self.lane(&job).send(job)?;
        // Never full: there are never more tokens than jobs in the lanes.
        let _ = self.waiting.send(());
        Ok(())
    }

    /// Gives the job back when its lane is full, rather than waiting.
    #[allow(clippy::result_large_err)]
    pub fn try_send(&self, job: Job) -> Result<(), TrySendError<Job>> {
        self.lane(&job).try_send(job)?;
        let _ = self.waiting.send(());
        Ok(())
    }

    /// How many jobs wait for a handler thread.
    pub fn len(&self) -> usize {
        self.raised.len() + self.ordinary.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the handler threads take jobs from.
#[derive(Debug, Clone)]
pub(crate) struct JobReceiver {
    raised: Receiver<Job>,
    ordinary: Receiver<Job>,
    waiting: Receiver<()>,
}

impl JobReceiver {
    /// The next job, a raised one if any waits; waits for one. `None` once every sender is gone
    /// and both lanes are empty: the queue is finished before the handler threads end.
    pub fn recv(&self) -> Option<Job> {
        loop {
            // A token is sent after its job, and taken before a job is: holding one, this
            // thread finds a job in a lane that no other thread can take from under it.
            self.waiting.recv().ok()?;
            match self.raised.try_recv() {
                Ok(job) => return Some(job),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
            }
            if let Ok(job) = self.ordinary.try_recv() {
                return Some(job);
            }
        }
    }

    /// Whether a chain that has run its slice (`slice_over`) on a handler thread should give
    /// way: a job waits for a thread.
    pub fn should_yield(&self, slice_over: bool) -> bool {
        slice_over && !(self.raised.is_empty() && self.ordinary.is_empty())
    }

    /// The next job if one waits, a raised one first, without waiting: more of a batch (and
    /// the simulation's way to move jobs by hand on one thread).
    pub fn try_recv(&self) -> Option<Job> {
        self.waiting.try_recv().ok()?;
        self.raised
            .try_recv()
            .or_else(|_| self.ordinary.try_recv())
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime};

    use super::*;
    use crate::headers::Headers;
    use crate::message_id::MessageId;
    use crate::store::ClaimedMessage;

    fn job(position: i64, priority: Priority) -> Job {
        Job::single(
            position as u64,
            ClaimedMessage {
                position,
                message_id: MessageId::new(),
                message_type: "core.lanes".into(),
                payload: "{}".into(),
                ordering_key: None,
                attempt: 1,
                enqueued_at: SystemTime::now(),
                resumed_at: None,
                headers: Headers::default(),
                subscription_id: None,
                priority,
            },
        )
    }

    fn positions(receiver: &JobReceiver, count: usize) -> Vec<i64> {
        (0..count)
            .map(|_| receiver.recv().map(|job| job.message.position).unwrap())
            .collect()
    }

    #[test]
    fn raised_jobs_overtake_the_ordinary_ones_already_waiting() {
        let (sender, receiver) = channel(16);
        for position in 0..5 {
            sender.try_send(job(position, Priority::Normal)).unwrap();
        }
        sender.send(job(10, Priority::High)).unwrap();
        sender.send(job(11, Priority::Urgent)).unwrap();
        sender.send(job(12, Priority::High)).unwrap();
        assert_eq!(sender.len(), 8);
        assert_eq!(
            positions(&receiver, 8),
            [10, 11, 12, 0, 1, 2, 3, 4],
            "raised in the order they were handed out, then the ordinary ones in theirs"
        );
        assert_eq!(sender.len(), 0);
    }

    #[test]
    fn the_queue_is_finished_after_the_senders_are_gone_then_it_ends() {
        let (sender, receiver) = channel(16);
        let acker = sender.clone();
        sender.send(job(0, Priority::Normal)).unwrap();
        acker.send(job(1, Priority::High)).unwrap();
        drop(sender);
        acker.send(job(2, Priority::Normal)).unwrap();
        drop(acker);
        assert_eq!(positions(&receiver, 3), [1, 0, 2]);
        assert!(receiver.recv().is_none());
    }

    #[test]
    fn a_waiting_handler_thread_wakes_for_either_lane() {
        for priority in [Priority::Normal, Priority::Urgent] {
            let (sender, receiver) = channel(4);
            let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
            let waiting = std::thread::spawn(move || {
                ready_tx.send(()).unwrap();
                receiver
                    .recv()
                    .map(|job| (job.message.position, Instant::now()))
            });
            // The thread is about to wait, or waits already, when the job is sent: a loaded
            // machine may run it late, never early.
            ready_rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            let sent = Instant::now();
            sender.send(job(7, priority)).unwrap();
            let (received, at) = waiting.join().unwrap().expect("woken with the job");
            assert_eq!(received, 7, "{priority:?}");
            assert!(at >= sent, "received after it was sent");
        }
    }
}
