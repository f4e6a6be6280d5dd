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
//!   already spaces them. A destination that never pushes back is never paced. Turn it off
//!   with [`DestinationOptions::learn_rate`](super::DestinationOptions::learn_rate).
//!
//! Both are per process. Several worker processes share a destination's static limit only if
//! each is given its share (the limit divided by the processes); learned limits need no such
//! care: each process learns its share from the push-back it gets.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::priority::Priority;

/// The longest a handler thread waits for a paced delivery's turn; a later turn defers the
/// message instead, so that one slow destination does not hold the threads other messages need.
pub(crate) const LONGEST_PACING_WAIT: Duration = Duration::from_millis(250);

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
        }
    }

    /// One delivery every `interval`, in bursts of one. A zero interval is refused when the
    /// worker starts.
    pub fn one_every(interval: Duration) -> Self {
        RateLimit { interval, burst: 1 }
    }

    /// How many deliveries may go out at once after a quiet spell (at least one).
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst.max(1);
        self
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

/// One destination's pacing.
#[derive(Debug)]
pub(crate) struct Pacer {
    limit: Option<RateLimit>,
    learns: bool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The learned rate, deliveries a second, since the last push-back.
    learned: Option<f64>,
    /// Tokens in the bucket; below zero, turns reserved ahead.
    tokens: f64,
    refilled: Instant,
    /// When the learned rate last rose.
    raised: Instant,
    /// When the learned rate last dropped: the requests in flight then all come back pushed
    /// back, and the rate drops once for them, not once each.
    dropped: Option<Instant>,
    /// When deliveries were accepted, over the last [`WINDOW`].
    accepted: VecDeque<Instant>,
    /// Push-backs since the last accepted delivery.
    pushed_in_a_row: u32,
    /// The last turn handed to a deferred message: the next deferral gets the turn after it.
    booked_until: Option<Instant>,
    /// When a delivery last took a turn.
    last_turn: Instant,
}

impl Pacer {
    pub fn new(limit: Option<RateLimit>, learns: bool, now: Instant) -> Self {
        Pacer {
            limit,
            learns,
            state: Mutex::new(State {
                learned: None,
                tokens: limit.map_or(0.0, |limit| f64::from(limit.burst)),
                refilled: now,
                raised: now,
                dropped: None,
                accepted: VecDeque::new(),
                pushed_in_a_row: 0,
                booked_until: None,
                last_turn: now,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rate in force, deliveries a second, and the bucket's size; `None`: unpaced.
    fn in_force(&self, state: &State) -> Option<(f64, f64)> {
        let fixed = self
            .limit
            .map(|limit| (limit.rate(), f64::from(limit.burst)));
        let learned = state.learned.map(|rate| (rate, (rate / 10.0).max(1.0)));
        match (fixed, learned) {
            (Some(f), Some(l)) => Some(if l.0 < f.0 { l } else { f }),
            (f, l) => f.or(l),
        }
    }

    /// The rate in force, if any: what the metrics show.
    pub fn rate(&self) -> Option<f64> {
        let state = self.state();
        self.in_force(&state).map(|(rate, _)| rate)
    }

    /// Takes a turn for one delivery of a message of `priority`.
    ///
    /// A message whose turn is far is deferred to a turn of its own: the one after the last
    /// handed out, so a backlog comes back one message per turn, each claimed once more, instead
    /// of all of it at the next free turn, to be claimed and deferred again and again. A message
    /// of a raised priority is not put at the end of that line: it is deferred to just before
    /// the next free turn, which it then waits for and takes from the line (the message that
    /// expected it gets a later one).
    pub fn pace(&self, now: Instant, priority: Priority) -> Pace {
        let mut state = self.state();
        let Some((rate, bucket)) = self.in_force(&state) else {
            return Pace::Go;
        };
        let elapsed = now.saturating_duration_since(state.refilled).as_secs_f64();
        state.tokens = (state.tokens + elapsed * rate).min(bucket);
        state.refilled = now;
        if now.saturating_duration_since(state.last_turn).as_secs_f64() > (2.0 / rate).max(1.0) {
            // Nobody came for the turns handed out (their messages were deleted, or another
            // process took them): the line is gone.
            state.booked_until = None;
        }
        if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            state.last_turn = now;
            return Pace::Go;
        }
        let wait = Duration::from_secs_f64((1.0 - state.tokens) / rate);
        if wait <= LONGEST_PACING_WAIT {
            state.tokens -= 1.0;
            state.last_turn = now;
            return Pace::GoAfter(wait);
        }
        let next_free = now + wait;
        if priority > Priority::Normal {
            // Back a little before the turn, ahead of the line's message due at it, to wait
            // for it in the handler thread: back at the turn itself, it would find the turn
            // taken, and again at the next one.
            return Pace::Defer(wait.saturating_sub(LONGEST_PACING_WAIT / 2));
        }
        let turn = match state.booked_until {
            Some(last) => (last + Duration::from_secs_f64(1.0 / rate)).max(next_free),
            None => next_free,
        };
        state.booked_until = Some(turn);
        Pace::Defer(turn.saturating_duration_since(now))
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
        let current = self.in_force(&state).map(|(rate, _)| rate);
        let base = match current {
            Some(rate) if accepted > 0.0 => rate.min(accepted),
            Some(rate) => rate,
            None => accepted.max(1.0),
        };
        state.learned = Some((base * LEARNED_SHARE).max(SLOWEST));
        state.raised = now;
        state.dropped = Some(now);
        // The turns already handed out went out; the bucket starts again from one.
        state.tokens = state.tokens.min(1.0);
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

    /// Turns taken at `now` until one is not `Go`.
    fn burst(pacer: &Pacer, now: Instant) -> usize {
        (0..1_000)
            .take_while(|_| pacer.pace(now, Priority::Normal) == Pace::Go)
            .count()
    }

    #[test]
    fn a_static_limit_lets_its_burst_through_then_spaces_the_rest() {
        let t0 = Instant::now();
        let pacer = Pacer::new(Some(RateLimit::per_second(10).burst(3)), true, t0);
        assert_eq!(burst(&pacer, t0), 3);
        // The fourth turn was reserved a tenth of a second ahead (the call that ended the burst).
        let Pace::GoAfter(wait) = pacer.pace(t0, Priority::Normal) else {
            panic!("the next turns are near: they wait");
        };
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-6, "{wait:?}");
        // Turns further off than a quarter second are deferred, not waited for.
        match pacer.pace(t0, Priority::Normal) {
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
                    pacer.pace(now, Priority::Normal),
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
        (0..count).map(|_| pacer.pace(now, priority)).collect()
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
            let pace = pacer.pace(t0 + *wait, Priority::Normal);
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
        match pacer.pace(t0, Priority::Normal) {
            Pace::Defer(wait) => assert!(wait > Duration::from_secs(90), "{wait:?}"),
            other => panic!("{other:?}"),
        }
        let Pace::Defer(wait) = pacer.pace(t0, Priority::High) else {
            panic!("the next free turn is too far to wait for");
        };
        assert!(wait < Duration::from_millis(400), "{wait:?}");
        // Back before the turn, it waits for it, ahead of the message due at it.
        assert!(matches!(
            pacer.pace(t0 + wait, Priority::Urgent),
            Pace::GoAfter(turn) if turn <= LONGEST_PACING_WAIT
        ));
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
        for _ in 0..16 {
            pacer.pushed_back(again);
        }
        assert!(
            (pacer.rate().unwrap() - 91.0 * 0.9).abs() < 1e-9,
            "{:?}",
            pacer.rate()
        );
        // Push-back after push-back with nothing accepted: never below one every ten seconds.
        for second in 4..100 {
            pacer.pushed_back(pushed + Duration::from_secs(second));
        }
        assert_eq!(pacer.rate(), Some(SLOWEST));
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
        // Refused twice running: that is a rate.
        let later = t0 + Duration::from_secs(20);
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
