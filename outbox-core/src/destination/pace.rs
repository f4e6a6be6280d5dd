//! Pacing a destination: a rate limit the application sets, and the rate a destination's
//! push-back teaches.
//!
//! - **A static limit** ([`RateLimit`], set with
//!   [`DestinationOptions::rate_limit`](super::DestinationOptions::rate_limit)): a token bucket
//!   shared by every handler thread of the process. A delivery over the limit waits for its turn
//!   when the turn is near (a quarter of a second at most: a handler thread is not held longer)
//!   and is otherwise deferred to it, **without counting an attempt**.
//! - **A learned limit**, by default on every destination. Every push-back (a webhook's `429`,
//!   or `503` with `Retry-After`:
//!   [`DeliveryError::push_back`](super::DeliveryError::push_back)) holds the destination for
//!   the time asked (see [`health`](super::health)). Push-back twice in a row, with nothing
//!   accepted in between, says the rate is too high: it is set to nine tenths of what the
//!   destination accepted in the second before, and every second of deliveries then raises it
//!   by 1 % (at least one more a second), until the next such push-back. A lone push-back
//!   between accepted deliveries (a receiver that refuses now and then, whatever the rate)
//!   changes no rate: cutting the rate for it would only slow every delivery, since the hold
//!   already spaces them. Push-back with nothing accepted in the second before (a receiver
//!   that refuses everything for a while) changes no rate either: there is no rate to learn
//!   from, and the hold spaces the deliveries. A line of deferred messages is booked at the
//!   rate each turn will have risen to, so that it speeds up with the rate. A destination that
//!   never pushes back is never paced. Turn it off with
//!   [`DestinationOptions::learn_rate`](super::DestinationOptions::learn_rate).
//!
//! A static limit is per process, unless it is made
//! [`across_processes`](RateLimit::across_processes): then every worker on the store takes its
//! turns from one bucket and one line the store keeps for the destination (a short write
//! transaction on the destination's row per paced delivery), so that the limit holds however
//! many processes deliver, and whichever of them claims the messages. A learned limit is per
//! process: each process learns its share from the push-back it gets.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::priority::Priority;
use crate::store::{SharedTurns, StoreError, Turns};

/// The longest a handler thread waits for a paced delivery's turn; a later turn defers the
/// message instead, so that one slow destination does not hold the threads other messages need.
pub(crate) const LONGEST_PACING_WAIT: Duration = Duration::from_millis(250);

/// How long before its reserved turn a message of a raised priority is made due again.
const RESERVATION_LEAD: Duration = Duration::from_millis(125);

/// How long after its time a reserved turn is kept for a message of a raised priority that has
/// not come back (another process took it, or it was deleted): then the turn is lost.
const RESERVATION_KEPT: Duration = Duration::from_secs(5);

/// What a learned rate is set to, of what the destination accepted in the second before it
/// pushed back.
const LEARNED_SHARE: f64 = 0.9;

/// How much a learned rate rises per second of deliveries: a share of itself, and at least one
/// delivery a second more.
const LEARNED_RISE: f64 = 0.01;

/// The lowest rate pacing ever sets: one delivery every ten seconds.
const SLOWEST: f64 = 0.1;

/// The window over which accepted deliveries are counted.
const WINDOW: Duration = Duration::from_secs(1);

/// A destination's rate limit: on average at most so many deliveries a second, with bursts of
/// at most [`burst`](RateLimit::burst) after a quiet spell.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::destination::{DestinationOptions, RateLimit};
///
/// // Amazon SES's default sending rate.
/// let ses = DestinationOptions::new().rate_limit(RateLimit::per_second(14));
/// // A partner API that takes 30 calls a minute, never two at once.
/// let partner = DestinationOptions::new()
///     .rate_limit(RateLimit::one_every(Duration::from_secs(2)).burst(1));
/// # let _ = (ses, partner);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    interval: Duration,
    burst: u32,
    across_processes: bool,
}

impl RateLimit {
    /// At most `deliveries` a second, in bursts of at most as many. Zero is refused when the
    /// worker starts (`WorkerError::InvalidConfig`): disable a destination to stop it.
    pub fn per_second(deliveries: u32) -> Self {
        RateLimit {
            interval: Duration::from_secs(1)
                .checked_div(deliveries)
                .unwrap_or(Duration::ZERO),
            burst: deliveries.max(1),
            across_processes: false,
        }
    }

    /// One delivery every `interval`, in bursts of one. A zero interval is refused when the
    /// worker starts.
    pub fn one_every(interval: Duration) -> Self {
        RateLimit {
            interval,
            burst: 1,
            across_processes: false,
        }
    }

    /// How many deliveries may go out at once after a quiet spell (at least one).
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst.max(1);
        self
    }

    /// The limit holds for every worker process on the store together, not for each: the
    /// workers take their turns from one bucket and one line the store keeps (on the
    /// destination's row), whichever of them claims the messages. Each paced delivery costs a
    /// short write transaction on that row, over one more connection the worker holds from its
    /// pool, so this suits limits up to some hundreds a second. Without it, give each process its
    /// share of the limit, and know that a process that claims a backlog first lines all of it
    /// up at its own share.
    ///
    /// ```
    /// use outbox_core::destination::RateLimit;
    ///
    /// // Amazon SES's 14 a second, for the account, however many workers send.
    /// let ses = RateLimit::per_second(14).across_processes();
    /// assert!(ses.is_across_processes());
    /// ```
    pub fn across_processes(mut self) -> Self {
        self.across_processes = true;
        self
    }

    /// Whether the limit holds for every worker process together.
    pub fn is_across_processes(&self) -> bool {
        self.across_processes
    }

    /// The average time between deliveries.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Deliveries a second.
    pub(crate) fn rate(&self) -> f64 {
        1.0 / self.interval.as_secs_f64()
    }

    /// Why the worker refuses this limit, if it does.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        (self.interval.is_zero() || !self.rate().is_finite())
            .then_some("a rate limit of no deliveries at all; disable the destination instead")
    }
}

/// What a paced delivery does now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Pace {
    /// Send now.
    Go,
    /// Send after this wait (its turn is reserved).
    GoAfter(Duration),
    /// Its turn is this far away: defer the message by it.
    Defer(Duration),
}

impl Turns {
    /// Takes a turn for one delivery of a message of `priority`, at `rate` deliveries a second
    /// in bursts of `bucket`.
    ///
    /// A message whose turn is far is deferred to a turn of its own: the one after the last
    /// handed out, so a backlog comes back one message per turn, each claimed once more, instead
    /// of all of it at the next free turn, to be claimed and deferred again and again. A message
    /// of a raised priority is not put at the end of that line: the next free turn is taken for
    /// it, and it is deferred to just before it (the message that expected that turn gets a
    /// later one); the pacer keeps the reservation ([`Pacer::pace`]).
    fn take(&mut self, now: i64, pace: &InForce, priority: Priority) -> Pace {
        let (rate, bucket) = (pace.rate, pace.bucket);
        if now < self.refilled {
            // The clock stepped back (a database server's wall clock set back): counting from
            // the old times would refill nothing until it caught up, and hold every turn.
            self.refilled = now;
            self.last_turn = self.last_turn.min(now);
            self.booked_until = None;
        }
        let elapsed = seconds(now.saturating_sub(self.refilled));
        self.tokens = (self.tokens + elapsed * rate).min(bucket);
        self.refilled = self.refilled.max(now);
        if seconds(now.saturating_sub(self.last_turn)) > (2.0 / rate).max(1.0) {
            // Nobody came for the turns handed out (their messages were deleted, or another
            // process took them): the line is gone.
            self.booked_until = None;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.last_turn = now;
            return Pace::Go;
        }
        let wait = Duration::from_secs_f64((1.0 - self.tokens) / rate);
        if wait <= LONGEST_PACING_WAIT {
            self.tokens -= 1.0;
            self.last_turn = now;
            return Pace::GoAfter(wait);
        }
        if priority > Priority::Normal {
            // The next free turn is taken for it now (the pacer keeps the reservation), and it
            // comes back a little before it: the line's message due at that turn finds it
            // taken and goes to the end of the line, however late this one is back.
            self.tokens -= 1.0;
            self.last_turn = now;
            return Pace::Defer(wait.saturating_sub(RESERVATION_LEAD));
        }
        let next_free = now.saturating_add(micros(wait));
        let turn = match self.booked_until {
            Some(last) => {
                let ahead = seconds(last.saturating_sub(now));
                let spacing = Duration::from_secs_f64(1.0 / pace.rate_in(ahead));
                last.saturating_add(micros(spacing)).max(next_free)
            }
            None => next_free,
        };
        self.booked_until = Some(turn);
        Pace::Defer(Duration::from_micros(
            u64::try_from(turn.saturating_sub(now)).unwrap_or_default(),
        ))
    }
}

fn seconds(micros: i64) -> f64 {
    micros.max(0) as f64 / 1e6
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// Where a limit [`across_processes`](RateLimit::across_processes) keeps its turns: the store,
/// under the destination's name and kind.
pub(crate) struct TurnsInStore<'a> {
    /// `None` outside a worker (a destination's own tests).
    pub store: Option<&'a dyn SharedTurns>,
    pub name: &'a str,
    pub kind: &'a str,
}

/// One destination's pacing.
#[derive(Debug)]
pub(crate) struct Pacer {
    limit: Option<RateLimit>,
    learns: bool,
    /// What the process's clock counts turns from.
    epoch: Instant,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The learned rate, deliveries a second, since the last push-back.
    learned: Option<f64>,
    /// The turns of this process (all of them but those of a limit across processes).
    turns: Turns,
    /// When the learned rate last rose.
    raised: Instant,
    /// When the learned rate last dropped: the requests in flight then all come back pushed
    /// back, and the rate drops once for them, not once each.
    dropped: Option<Instant>,
    /// When deliveries were accepted, over the last [`WINDOW`].
    accepted: VecDeque<Instant>,
    /// Push-backs since the last accepted delivery.
    pushed_in_a_row: u32,
    /// Turns taken for messages of a raised priority that were deferred to them, by time (µs on
    /// the process's clock), earliest first: whichever such message comes back uses the first.
    reserved: VecDeque<i64>,
}

impl State {
    /// A turn reserved for a message of a raised priority, if one is near: how long to wait
    /// for it. Reservations long past, whose messages never came back, are dropped.
    fn reservation(&mut self, now: i64) -> Option<Duration> {
        while self
            .reserved
            .front()
            .is_some_and(|at| now.saturating_sub(*at) > micros(RESERVATION_KEPT))
        {
            self.reserved.pop_front();
        }
        let at = *self.reserved.front()?;
        if at.saturating_sub(now) > micros(LONGEST_PACING_WAIT) {
            return None;
        }
        self.reserved.pop_front();
        Some(Duration::from_micros(
            u64::try_from(at.saturating_sub(now)).unwrap_or_default(),
        ))
    }
}

/// The pace in force: deliveries a second, the bucket's size, whether the store keeps the
/// turns, and for a learned rate the most it rises to (the static limit, if any).
#[derive(Debug, Clone, Copy, PartialEq)]
struct InForce {
    rate: f64,
    bucket: f64,
    across_processes: bool,
    rises_to: Option<f64>,
}

impl InForce {
    /// The rate `seconds` from now. A static limit stays; a learned rate rises as deliveries go
    /// on ([`risen`]), so a line of deferred messages is booked at the rate each turn will have,
    /// not at the rate of the moment it was booked: a rate learned low and a backlog lined up
    /// on it would otherwise keep the low rate's spacing for as long as the line is long.
    fn rate_in(&self, seconds: f64) -> f64 {
        match self.rises_to {
            Some(ceiling) => risen(self.rate, seconds).min(ceiling),
            None => self.rate,
        }
    }
}

/// What a learned rate of `rate` deliveries a second rises to in `seconds` of deliveries, as
/// [`Pacer::accepted`] raises it: one more a second while a hundredth of it is less, then a
/// hundredth of itself a second.
fn risen(rate: f64, seconds: f64) -> f64 {
    let linear_until = 1.0 / LEARNED_RISE;
    let linear = (linear_until - rate).max(0.0);
    if seconds <= linear {
        rate + seconds
    } else {
        rate.max(linear_until) * (LEARNED_RISE * (seconds - linear)).exp()
    }
}

impl Pacer {
    pub fn new(limit: Option<RateLimit>, learns: bool, now: Instant) -> Self {
        let burst = limit.map_or(0.0, |limit| f64::from(limit.burst));
        Pacer {
            limit,
            learns,
            epoch: now,
            state: Mutex::new(State {
                learned: None,
                turns: Turns::full(burst, 0),
                raised: now,
                dropped: None,
                accepted: VecDeque::new(),
                pushed_in_a_row: 0,
                reserved: VecDeque::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pace in force; `None`: unpaced. A learned rate below the static limit is this
    /// process's own, even under a limit across processes.
    fn in_force(&self, state: &State) -> Option<InForce> {
        let fixed = self.limit.map(|limit| InForce {
            rate: limit.rate(),
            bucket: f64::from(limit.burst),
            across_processes: limit.across_processes,
            rises_to: None,
        });
        let learned = state.learned.map(|rate| InForce {
            rate,
            bucket: (rate / 10.0).max(1.0),
            across_processes: false,
            rises_to: Some(self.limit.map_or(f64::INFINITY, |limit| limit.rate())),
        });
        match (fixed, learned) {
            (Some(f), Some(l)) => Some(if l.rate < f.rate { l } else { f }),
            (f, l) => f.or(l),
        }
    }

    /// Whether the application set a limit (not only a rate learned from push-back).
    pub fn has_limit(&self) -> bool {
        self.limit.is_some()
    }

    /// Whether the static limit holds across processes.
    pub fn across_processes(&self) -> bool {
        self.limit.is_some_and(|limit| limit.across_processes)
    }

    /// The rate in force, if any: what the metrics show.
    pub fn rate(&self) -> Option<f64> {
        let state = self.state();
        self.in_force(&state).map(|pace| pace.rate)
    }

    /// Takes a turn for one delivery of a message of `priority` ([`Turns::take`]): from the
    /// process's turns, or under a limit across processes from those `shared` keeps. A message
    /// of a raised priority first takes a turn reserved for one like it, if one is near.
    pub fn pace(
        &self,
        now: Instant,
        priority: Priority,
        shared: &TurnsInStore<'_>,
    ) -> Result<Pace, StoreError> {
        let local = micros(now.saturating_duration_since(self.epoch));
        let raised = priority > Priority::Normal;
        let mut state = self.state();
        let Some(pace) = self.in_force(&state) else {
            return Ok(Pace::Go);
        };
        if raised {
            if let Some(wait) = state.reservation(local) {
                return Ok(if wait.is_zero() {
                    Pace::Go
                } else {
                    Pace::GoAfter(wait)
                });
            }
        }
        let taken = if pace.across_processes {
            drop(state);
            let taken = self.pace_across_processes(pace, priority, shared)?;
            state = self.state();
            taken
        } else {
            state.turns.take(local, &pace, priority)
        };
        if let (true, Pace::Defer(wait)) = (raised, taken) {
            state
                .reserved
                .push_back(local.saturating_add(micros(wait + RESERVATION_LEAD)));
        }
        Ok(taken)
    }

    /// [`Turns::take`] on the turns the store keeps.
    fn pace_across_processes(
        &self,
        pace: InForce,
        priority: Priority,
        shared: &TurnsInStore<'_>,
    ) -> Result<Pace, StoreError> {
        let store = shared.store.ok_or_else(|| {
            StoreError::new(
                "taking a turn of a rate limit across processes",
                "the destination is not a worker's: no store keeps its turns",
            )
        })?;
        let mut taken = Pace::Go;
        store.take_turn(shared.name, shared.kind, &mut |turns, now| {
            let mut turns = turns.unwrap_or_else(|| Turns::full(pace.bucket, now));
            taken = turns.take(now, &pace, priority);
            turns
        })?;
        Ok(taken)
    }

    /// A delivery was accepted: counted, and the learned rate rises.
    pub fn accepted(&self, now: Instant) {
        let mut state = self.state();
        forget_before(&mut state.accepted, now);
        state.accepted.push_back(now);
        state.pushed_in_a_row = 0;
        if let Some(rate) = state.learned {
            let seconds = now.saturating_duration_since(state.raised).as_secs_f64();
            if seconds >= 1.0 {
                state.learned = Some(rate + (rate * LEARNED_RISE).max(1.0) * seconds.min(1.0));
                state.raised = now;
            }
        }
    }

    /// The destination pushed back: the second push-back in a row drops the learned rate to a
    /// share of what it accepted in the last second.
    pub fn pushed_back(&self, now: Instant) {
        if !self.learns {
            return;
        }
        let mut state = self.state();
        state.pushed_in_a_row = state.pushed_in_a_row.saturating_add(1);
        if state.pushed_in_a_row < 2 {
            return;
        }
        if state
            .dropped
            .is_some_and(|at| now.saturating_duration_since(at) < WINDOW)
        {
            return;
        }
        forget_before(&mut state.accepted, now);
        let accepted = state.accepted.len() as f64;
        if accepted == 0.0 {
            // Nothing accepted in the last second says nothing about a rate the destination
            // takes: it refuses everything for now (a deploy, a burst limit), and the hold it
            // asked for already spaces the deliveries. A rate learned here (a tenth of nothing)
            // would outlast the refusals by hours.
            return;
        }
        let base = match self.in_force(&state) {
            Some(pace) => pace.rate.min(accepted),
            None => accepted,
        };
        state.learned = Some((base * LEARNED_SHARE).max(SLOWEST));
        state.raised = now;
        state.dropped = Some(now);
        // The turns already handed out went out; the bucket starts again from one.
        state.turns.tokens = state.turns.tokens.min(1.0);
    }
}

fn forget_before(accepted: &mut VecDeque<Instant>, now: Instant) {
    while accepted
        .front()
        .is_some_and(|at| now.saturating_duration_since(*at) > WINDOW)
    {
        accepted.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemoryStore;

    /// Takes a turn from `pacer`, whose turns across processes (if any) `store` keeps.
    fn turn(pacer: &Pacer, now: Instant, priority: Priority) -> Pace {
        turn_in(&MemoryStore::with_manual_clock(), pacer, now, priority)
    }

    fn turn_in(store: &MemoryStore, pacer: &Pacer, now: Instant, priority: Priority) -> Pace {
        let shared = TurnsInStore {
            store: Some(store),
            name: "mail",
            kind: "webhook",
        };
        match pacer.pace(now, priority, &shared) {
            Ok(pace) => pace,
            Err(error) => panic!("{error}"),
        }
    }

    /// Turns taken at `now` until one is not `Go`.
    fn burst(pacer: &Pacer, now: Instant) -> usize {
        (0..1_000)
            .take_while(|_| turn(pacer, now, Priority::Normal) == Pace::Go)
            .count()
    }

    #[test]
    fn a_static_limit_lets_its_burst_through_then_spaces_the_rest() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(10).burst(3)), true, t0);
        assert_eq!(burst(&pacer, t0), 3);
        // The fourth turn was reserved a tenth of a second ahead (the call that ended the burst).
        let Pace::GoAfter(wait) = turn(&pacer, t0, Priority::Normal) else {
            panic!("the next turns are near: they wait");
        };
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-6, "{wait:?}");
        // Turns further off than a quarter second are deferred, not waited for.
        match turn(&pacer, t0, Priority::Normal) {
            Pace::Defer(wait) => assert!(wait > LONGEST_PACING_WAIT, "{wait:?}"),
            other => panic!("expected a deferral, got {other:?}"),
        }
    }

    #[test]
    fn over_a_long_run_a_static_limit_holds_its_rate() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(14)), true, t0);
        // Many threads asking every millisecond for 60 s.
        let mut sent = 0;
        for ms in 0..60_000u64 {
            let now = t0 + Duration::from_millis(ms);
            for _ in 0..16 {
                if matches!(
                    turn(&pacer, now, Priority::Normal),
                    Pace::Go | Pace::GoAfter(_)
                ) {
                    sent += 1;
                }
            }
        }
        // 14 a second plus the first burst, and the turns reserved at the end.
        assert!((840..=14 * 60 + 14 + 4).contains(&sent), "{sent}");
    }

    /// The waits of `count` deliveries asking at `now`, each deferred or not.
    fn ask(pacer: &Pacer, now: Instant, count: usize, priority: Priority) -> Vec<Pace> {
        (0..count).map(|_| turn(pacer, now, priority)).collect()
    }

    #[test]
    fn a_backlog_gets_a_turn_each_and_is_deferred_once() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(10).burst(1)), true, t0);
        let first = ask(&pacer, t0, 500, Priority::Normal);
        let deferred: Vec<Duration> = first
            .iter()
            .filter_map(|pace| match pace {
                Pace::Defer(wait) => Some(*wait),
                _ => None,
            })
            .collect();
        assert_eq!(deferred.len(), 497, "one now, two within a quarter second");
        for pair in deferred.windows(2) {
            let gap = pair[1].saturating_sub(pair[0]).as_secs_f64();
            assert!((gap - 0.1).abs() < 1e-6, "one turn apart: {pair:?}");
        }
        // Each comes back at its turn, as the store makes it due, and goes.
        for wait in &deferred {
            let pace = turn(&pacer, t0 + *wait, Priority::Normal);
            assert!(
                matches!(pace, Pace::Go | Pace::GoAfter(_)),
                "deferred twice: {pace:?} at {wait:?}"
            );
        }
    }

    #[test]
    fn a_raised_priority_takes_the_next_free_turn_not_the_end_of_the_line() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(10).burst(1)), true, t0);
        let line = ask(&pacer, t0, 1_000, Priority::Normal);
        assert!(matches!(line.last(), Some(Pace::Defer(wait)) if *wait > Duration::from_secs(90)));
        // A normal message still goes to the end of the line.
        match turn(&pacer, t0, Priority::Normal) {
            Pace::Defer(wait) => assert!(wait > Duration::from_secs(90), "{wait:?}"),
            other => panic!("{other:?}"),
        }
        let Pace::Defer(wait) = turn(&pacer, t0, Priority::High) else {
            panic!("the next free turn is too far to wait for");
        };
        assert!(wait < Duration::from_millis(400), "{wait:?}");
        // Back before the turn, it waits for it, ahead of the message due at it.
        assert!(matches!(
            turn(&pacer, t0 + wait, Priority::Urgent),
            Pace::GoAfter(turn) if turn <= LONGEST_PACING_WAIT
        ));
    }

    /// CI, loaded: a raised message came back for its turn more than the lead late, found it
    /// taken by the line's message due at it, was deferred to just before the next, came back
    /// late again, and went seven deliveries after its enqueue. Its turn is now taken for it
    /// when it is deferred.
    #[test]
    fn a_raised_priority_late_for_its_turn_still_has_it() {
        let t0 = Instant::now();
        let pacer = Pacer::new(
            Some(RateLimit::one_every(Duration::from_millis(400))),
            true,
            t0,
        );
        let line: Vec<Duration> = ask(&pacer, t0, 50, Priority::Normal)
            .into_iter()
            .filter_map(|pace| match pace {
                Pace::Defer(wait) => Some(wait),
                _ => None,
            })
            .collect();
        let Pace::Defer(wait) = turn(&pacer, t0, Priority::High) else {
            panic!("the next free turn is too far to wait for");
        };
        // The line's messages come back at their turns while the raised one is a second late.
        let late = wait + Duration::from_secs(1);
        for at in line.iter().filter(|at| **at < late) {
            let pace = turn(&pacer, t0 + *at, Priority::Normal);
            assert!(matches!(pace, Pace::Go | Pace::GoAfter(_) | Pace::Defer(_)));
        }
        match turn(&pacer, t0 + late, Priority::High) {
            Pace::Go => {}
            Pace::GoAfter(wait) => assert!(wait <= LONGEST_PACING_WAIT, "{wait:?}"),
            other => panic!("its reserved turn was lost: {other:?}"),
        }
        assert!(pacer.state().reserved.is_empty());
    }

    #[test]
    fn a_reservation_is_used_near_its_time_and_dropped_long_after_it() {
        let pacer = Pacer::new(Some(RateLimit::per_second(10)), true, Instant::now());
        let mut state = pacer.state();
        let at = 10_000_000;
        state.reserved.push_back(at);
        assert_eq!(
            state.reservation(at - 1_000_000),
            None,
            "too early: not yet"
        );
        assert_eq!(
            state.reservation(at - 100_000),
            Some(Duration::from_millis(100))
        );
        state.reserved.push_back(at);
        assert_eq!(state.reservation(at + 2_000_000), Some(Duration::ZERO));
        state.reserved.push_back(at);
        let long_after = at + micros(RESERVATION_KEPT) + 1;
        assert_eq!(state.reservation(long_after), None);
        assert!(state.reserved.is_empty());
    }

    #[test]
    fn a_line_nobody_comes_for_is_forgotten() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(10).burst(1)), true, t0);
        ask(&pacer, t0, 100, Priority::Normal);
        // The 97 deferred messages were deleted: none comes back for its turn.
        let later = t0 + Duration::from_secs(5);
        let paces = ask(&pacer, later, 4, Priority::Normal);
        assert_eq!(paces[0], Pace::Go);
        match paces[3] {
            Pace::Defer(wait) => assert!(wait < Duration::from_millis(400), "{wait:?}"),
            other => panic!("{other:?}"),
        }
    }

    /// Two processes under one limit across processes: whichever claims the messages, the
    /// turns come from one bucket and one line, as if one process sent them all.
    #[test]
    fn a_limit_across_processes_is_one_bucket_and_one_line_for_every_process() {
        let store = MemoryStore::with_manual_clock();
        let t0 = Instant::now();
        let limit = Some(RateLimit::per_second(10).burst(2).across_processes());
        let (a, b) = (Pacer::new(limit, true, t0), Pacer::new(limit, true, t0));
        // One burst between them, not one each.
        assert_eq!(turn_in(&store, &a, t0, Priority::Normal), Pace::Go);
        assert_eq!(turn_in(&store, &b, t0, Priority::Normal), Pace::Go);
        for _ in 0..2 {
            assert!(matches!(
                turn_in(&store, &b, t0, Priority::Normal),
                Pace::GoAfter(_)
            ));
        }
        // Process A lines up a backlog; process B's deferrals queue behind it, one turn apart.
        let line = |pacer: &Pacer, count: usize| -> Vec<Duration> {
            (0..count)
                .map(|_| match turn_in(&store, pacer, t0, Priority::Normal) {
                    Pace::Defer(wait) => wait,
                    other => panic!("expected a deferral, got {other:?}"),
                })
                .collect()
        };
        let first = line(&a, 50);
        let second = line(&b, 50);
        let whole: Vec<Duration> = first.iter().chain(&second).copied().collect();
        for pair in whole.windows(2) {
            let gap = pair[1].saturating_sub(pair[0]).as_secs_f64();
            assert!((gap - 0.1).abs() < 1e-3, "one turn apart: {pair:?}");
        }
        // Each comes back at its turn to whichever process claims it, and goes.
        let mut sent = 0;
        for (n, wait) in whole.iter().enumerate() {
            store.advance(wait.saturating_sub(store.now()));
            let pacer = if n % 3 == 0 { &a } else { &b };
            let pace = turn_in(&store, pacer, t0 + *wait, Priority::Normal);
            assert!(
                matches!(pace, Pace::Go | Pace::GoAfter(_)),
                "deferred twice: {pace:?} at {wait:?}"
            );
            sent += 1;
        }
        assert_eq!(sent, 100);
        // The rate is the limit's for both together: 100 turns took 10 s of the store's clock.
        assert!(
            (store.now().as_secs_f64() - 10.0).abs() < 0.35,
            "{:?}",
            store.now()
        );
    }

    /// The store's clock is a database server's wall clock, which an operator or NTP may set
    /// back: the turns carry on from the new time instead of waiting for the old one.
    #[test]
    fn a_clock_set_back_an_hour_holds_no_turn() {
        let hour = 3_600_000_000;
        let mut turns = Turns::full(1.0, 10 * hour);
        let pace = InForce {
            rate: 10.0,
            bucket: 1.0,
            across_processes: false,
            rises_to: None,
        };
        let limit = |turns: &mut Turns, now: i64| turns.take(now, &pace, Priority::Normal);
        assert_eq!(limit(&mut turns, 10 * hour), Pace::Go);
        // Two turns handed out ahead, a backlog lined up, then the clock goes back an hour.
        let paces: Vec<Pace> = (0..50).map(|_| limit(&mut turns, 10 * hour)).collect();
        assert!(paces[2..].iter().all(|pace| matches!(pace, Pace::Defer(_))));
        let back = 9 * hour;
        match limit(&mut turns, back) {
            Pace::Defer(wait) => assert!(wait <= Duration::from_millis(300), "{wait:?}"),
            other => panic!("{other:?}"),
        }
        // A second later on the new clock: turns again, at the limit's rate.
        let later = back + 1_000_000;
        assert_eq!(limit(&mut turns, later), Pace::Go);
        match limit(&mut turns, later) {
            Pace::GoAfter(wait) => assert!(wait <= Duration::from_millis(100), "{wait:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_limit_across_processes_outside_a_worker_says_no_store_keeps_it() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(10).across_processes()), true, t0);
        let shared = TurnsInStore {
            store: None,
            name: "mail",
            kind: "webhook",
        };
        let error = pacer.pace(t0, Priority::Normal, &shared).unwrap_err();
        assert!(
            error.to_string().contains("no store keeps its turns"),
            "{error}"
        );
    }

    #[test]
    fn no_limit_and_no_push_back_is_never_paced() {
        let t0 = Instant::now();
        let pacer = Pacer::new(None, true, t0);
        assert_eq!(burst(&pacer, t0), 1_000);
        assert_eq!(pacer.rate(), None);
    }

    #[test]
    fn a_push_back_sets_the_rate_to_nine_tenths_of_what_was_accepted_and_it_rises_again() {
        let t0 = Instant::now();
        let pacer = Pacer::new(None, true, t0);
        for i in 0..100u64 {
            pacer.accepted(t0 + Duration::from_millis(i * 5));
        }
        let pushed = t0 + Duration::from_millis(600);
        pacer.pushed_back(pushed);
        assert_eq!(pacer.rate(), None, "a lone push-back changes no rate");
        pacer.pushed_back(pushed);
        assert_eq!(pacer.rate(), Some(90.0));
        // A second of deliveries later: one more a second (1 % of 90 is less).
        pacer.accepted(pushed + Duration::from_secs(1));
        assert_eq!(pacer.rate(), Some(91.0));
        // The other requests in flight come back pushed back too: the rate drops once for all.
        let again = pushed + Duration::from_secs(3);
        for i in 0..100u64 {
            pacer.accepted(again - Duration::from_millis(500 - i));
        }
        assert_eq!(pacer.rate(), Some(92.0), "a second more of deliveries");
        for _ in 0..16 {
            pacer.pushed_back(again);
        }
        assert!(
            (pacer.rate().unwrap() - 92.0 * 0.9).abs() < 1e-9,
            "{:?}",
            pacer.rate()
        );
        // A delivery a second, each followed by push-back: nine tenths of what was accepted.
        for second in 4..100 {
            let at = pushed + Duration::from_secs(second);
            pacer.accepted(at);
            pacer.pushed_back(at);
            pacer.pushed_back(at);
        }
        assert_eq!(pacer.rate(), Some(1.8), "two deliveries in the last second");
    }

    /// A receiver that refuses everything for a few seconds: nothing accepted before the
    /// push-back, so no rate is learned (a rate from an empty window was 0.9 a second, and a
    /// backlog of 3,000 lined up on it drained over hours).
    #[test]
    fn no_rate_is_learned_or_cut_from_a_second_with_nothing_accepted() {
        let t0 = Instant::now();
        let pacer = Pacer::new(None, true, t0);
        for second in 0..3 {
            let at = t0 + Duration::from_secs(second);
            pacer.pushed_back(at);
            pacer.pushed_back(at);
        }
        assert_eq!(pacer.rate(), None);
        // A rate learned from deliveries is not cut further while nothing is accepted.
        pacer.accepted(t0 + Duration::from_millis(3_100));
        pacer.accepted(t0 + Duration::from_millis(3_200));
        let pushed = t0 + Duration::from_millis(3_300);
        pacer.pushed_back(pushed);
        pacer.pushed_back(pushed);
        assert_eq!(pacer.rate(), Some(1.8));
        for second in 2..10 {
            pacer.pushed_back(pushed + Duration::from_secs(second));
        }
        assert_eq!(pacer.rate(), Some(1.8));
    }

    /// A line booked on a rate learned low speeds up as the rate rises: 3,000 messages lined up
    /// at 1.8 a second come back within two minutes (their rate rising by one a second), not
    /// over half an hour at the spacing of the moment they were booked.
    #[test]
    fn a_line_booked_at_a_learned_rate_follows_its_rise() {
        let t0 = Instant::now();
        let pacer = Pacer::new(None, true, t0);
        pacer.accepted(t0);
        pacer.accepted(t0 + Duration::from_millis(100));
        pacer.pushed_back(t0 + Duration::from_millis(200));
        pacer.pushed_back(t0 + Duration::from_millis(200));
        assert_eq!(pacer.rate(), Some(1.8));
        let at = t0 + Duration::from_millis(300);
        let line: Vec<Duration> = ask(&pacer, at, 3_000, Priority::Normal)
            .into_iter()
            .filter_map(|pace| match pace {
                Pace::Defer(wait) => Some(wait),
                _ => None,
            })
            .collect();
        let last = line.last().copied().unwrap_or_default();
        // 1.8 t + t² / 2 = 3,000 at t = 75.7 s.
        assert!(
            (70.0..80.0).contains(&last.as_secs_f64()),
            "the last turn in {last:?}"
        );
        for pair in line.windows(2) {
            assert!(pair[0] <= pair[1], "in order: {pair:?}");
        }
        // Under a static limit the rise stops there.
        let capped = Pacer::new(Some(RateLimit::per_second(5)), true, t0);
        capped.accepted(t0);
        capped.accepted(t0 + Duration::from_millis(100));
        capped.pushed_back(t0 + Duration::from_millis(200));
        capped.pushed_back(t0 + Duration::from_millis(200));
        let line = ask(&capped, at, 600, Priority::Normal);
        let Some(Pace::Defer(last)) = line.last() else {
            panic!("{:?}", line.last());
        };
        assert!(last.as_secs_f64() > 100.0, "at most 5 a second: {last:?}");
    }

    #[test]
    fn a_learned_rate_rises_by_one_a_second_then_by_a_hundredth_of_itself() {
        assert!((risen(10.0, 5.0) - 15.0).abs() < 1e-9);
        assert!((risen(99.0, 1.0) - 100.0).abs() < 1e-9);
        assert!((risen(100.0, 100.0) - 100.0 * 1f64.exp()).abs() < 1e-6);
        assert!((risen(50.0, 60.0) - 100.0 * 0.1f64.exp()).abs() < 1e-6);
    }

    #[test]
    fn a_learned_rate_never_exceeds_the_static_limit_and_learning_can_be_off() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(5)), true, t0);
        for i in 0..50u64 {
            pacer.accepted(t0 + Duration::from_millis(i));
        }
        pacer.pushed_back(t0 + Duration::from_millis(100));
        pacer.pushed_back(t0 + Duration::from_millis(100));
        assert_eq!(pacer.rate(), Some(4.5), "nine tenths of the limit in force");

        let fixed = Pacer::new(Some(RateLimit::per_second(5)), false, t0);
        fixed.pushed_back(t0);
        fixed.pushed_back(t0);
        assert_eq!(fixed.rate(), Some(5.0));
    }

    /// CI's receiver drill: a receiver that answers one request in twenty 429 with
    /// `Retry-After`, whatever the rate. Each push-back held the destination, and each also cut
    /// the rate to nine tenths of the last second's deliveries, themselves cut short by the
    /// hold: the rate sank to about ten a second, the drill past its patience.
    #[test]
    fn push_back_now_and_then_between_deliveries_changes_no_rate() {
        let t0 = Instant::now();
        let pacer = Pacer::new(None, true, t0);
        for n in 0..2_000u64 {
            let at = t0 + Duration::from_millis(n * 5);
            if n % 20 == 3 {
                pacer.pushed_back(at);
            } else {
                pacer.accepted(at);
            }
        }
        assert_eq!(pacer.rate(), None);
        // Refused twice running, right after deliveries: that is a rate.
        let later = t0 + Duration::from_millis(10_100);
        pacer.pushed_back(later);
        pacer.pushed_back(later);
        assert!(pacer.rate().is_some());
    }

    #[test]
    fn zero_rates_are_refused() {
        assert!(RateLimit::per_second(0).problem().is_some());
        assert!(RateLimit::one_every(Duration::ZERO).problem().is_some());
        assert!(RateLimit::per_second(1).problem().is_none());
        assert_eq!(RateLimit::per_second(0).burst, 1);
    }
}
