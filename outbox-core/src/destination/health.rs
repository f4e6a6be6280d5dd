//! Destination health: a destination that keeps failing is paused instead of hammered, probed
//! with backoff, and resumed when it answers; one that says it is gone for good is disabled;
//! one that asks for fewer deliveries is held for the time it asks.
//!
//! - **Healthy**: every delivery is sent. Each retryable failure about the destination (a
//!   timeout, a refused connection, a `5xx`, a broker that is down) adds to a count of
//!   consecutive failures; any answer that shows the destination is up (a success, or a
//!   failure about the message alone) resets it.
//! - **Paused**, after [`HealthPolicy::failures_to_pause`] consecutive failures: deliveries are
//!   not sent; their messages are deferred until the pause ends, **without counting an
//!   attempt**, so an outage of any length uses up nobody's retries. When the pause ends, the
//!   next delivery goes out as the probe (one at a time; the others keep waiting). If the
//!   destination answers, it is healthy again; if not, the probe's message is deferred too (a
//!   failed probe is the outage's, not the message's: no attempt is counted) and the next pause
//!   is twice as long, up to [`HealthPolicy::longest_pause`].
//! - **Held**, after a push-back (a webhook's `429`, or `503` with `Retry-After`; any
//!   destination's [`DeliveryError::push_back`](super::DeliveryError::push_back)): no delivery goes out until the time asked for has passed; the messages wait
//!   without counting attempts, and nothing counts as a failure.
//! - **Disabled**, after a failure that says the destination is gone for good (a webhook's
//!   `410 Gone`): every delivery fails permanently, so messages are dead-lettered with that
//!   reason, until an operator enables it again (after which they can be re-queued).
//!
//! The state lives in the worker, one per named destination. The worker shares it through its
//! store every few seconds
//! ([`SharedDestinations::sync_destinations`](crate::store::SharedDestinations::sync_destinations)): a disable recorded
//! there (another worker's `410 Gone`, an earlier run's, an operator's) is adopted, before the
//! worker's first claim when it starts, and an operator's enable is followed. Pauses and holds
//! stay per process: each worker learns of an outage, and of its end, by itself.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The cap on any pause or hold, so that a policy or a request of `Duration::MAX` stays a time
/// the clock can hold.
const LONGEST_ANY_PAUSE: Duration = Duration::from_secs(24 * 60 * 60);

/// When a destination is paused and for how long:
/// [`DestinationOptions::health_policy`](super::DestinationOptions::health_policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    failures_to_pause: u32,
    first_pause: Duration,
    longest_pause: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            failures_to_pause: 10,
            first_pause: Duration::from_secs(30),
            longest_pause: Duration::from_secs(15 * 60),
        }
    }
}

impl HealthPolicy {
    /// Pause after 10 consecutive failures, for 30 s at first, doubling up to 15 minutes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pause after this many consecutive retryable failures (at least 1).
    pub fn failures_to_pause(mut self, failures: u32) -> Self {
        self.failures_to_pause = failures.max(1);
        self
    }

    /// The first pause; each failed probe doubles it.
    pub fn first_pause(mut self, pause: Duration) -> Self {
        self.first_pause = pause;
        self
    }

    /// The longest pause between probes.
    pub fn longest_pause(mut self, pause: Duration) -> Self {
        self.longest_pause = pause;
        self
    }

    /// Never pause: every delivery is sent, however many failed before it.
    pub fn never_pause() -> Self {
        HealthPolicy {
            failures_to_pause: u32::MAX,
            ..Self::default()
        }
    }

    /// The pause after `earlier` pauses in a row (a day at most, whatever the policy says).
    fn pause_after(&self, earlier: u32) -> Duration {
        let factor = 2u32.saturating_pow(earlier);
        self.first_pause
            .saturating_mul(factor)
            .min(self.longest_pause.max(self.first_pause))
            .min(LONGEST_ANY_PAUSE)
    }
}

/// Where a destination stands: [`WorkerHandle::destination_state`](crate::WorkerHandle::destination_state).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DestinationState {
    /// Deliveries are sent.
    Healthy {
        /// Retryable failures since the last answer.
        consecutive_failures: u32,
    },
    /// Deliveries wait (deferred, not counted as attempts) because the destination asked for
    /// no deliveries until then.
    Held {
        /// How long until deliveries resume.
        resume_in: Duration,
        /// What the destination said.
        reason: String,
    },
    /// Deliveries wait (deferred, not counted as attempts) until the next probe.
    Paused {
        /// Retryable failures since the last answer.
        consecutive_failures: u32,
        /// How long until the next probe may go out (zero: now, or one is on its way).
        probe_in: Duration,
        /// The last failure.
        last_error: String,
    },
    /// Deliveries fail permanently until the destination is enabled again.
    Disabled {
        /// Why (the receiver's `410 Gone`, an operator's decision).
        reason: String,
    },
}

impl DestinationState {
    /// Every state's name, as [`name`](DestinationState::name) gives it.
    pub const NAMES: [&'static str; 4] = ["healthy", "held", "paused", "disabled"];

    /// `healthy`, `held`, `paused` or `disabled`: the metric's and the pages' word for it.
    pub fn name(&self) -> &'static str {
        match self {
            DestinationState::Healthy { .. } => "healthy",
            DestinationState::Held { .. } => "held",
            DestinationState::Paused { .. } => "paused",
            DestinationState::Disabled { .. } => "disabled",
        }
    }
}

/// What to do with the next delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Send it.
    Send,
    /// Send it as the probe of a paused destination.
    Probe,
    /// Do not send it: defer its message this long.
    Wait { delay: Duration, why: String },
    /// Do not send it: the destination is disabled.
    Refuse(String),
}

/// What a delivery found out about the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed<'a> {
    /// It answered (a success, or a failure about the message rather than the destination).
    Answered,
    /// A retryable failure about the destination: no answer, or an answer that says "later".
    Failed(&'a str),
    /// It asked for no deliveries for this long.
    PushedBack(Duration, &'a str),
    /// It is gone for good.
    Gone(&'a str),
    /// Nothing about the destination (the delivery never left: a refused address, a bad
    /// header).
    Nothing,
}

#[derive(Debug)]
struct Machine {
    consecutive_failures: u32,
    pause: Option<Pause>,
    hold: Option<(Instant, String)>,
    disabled: Option<String>,
    last_error: String,
}

#[derive(Debug, Clone, Copy)]
struct Pause {
    until: Instant,
    /// Pauses in a row so far, this one included.
    pauses: u32,
    probing: bool,
}

/// One destination's health.
#[derive(Debug)]
pub(crate) struct Health {
    policy: HealthPolicy,
    machine: Mutex<Machine>,
}

/// A transition worth telling the operator about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transition {
    Paused(Duration),
    Held(Duration),
    Resumed,
    Disabled,
}

impl Health {
    pub fn new(policy: HealthPolicy) -> Self {
        Health {
            policy,
            machine: Mutex::new(Machine {
                consecutive_failures: 0,
                pause: None,
                hold: None,
                disabled: None,
                last_error: String::new(),
            }),
        }
    }

    fn machine(&self) -> std::sync::MutexGuard<'_, Machine> {
        self.machine.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn gate(&self, now: Instant) -> Gate {
        let mut m = self.machine();
        if let Some(reason) = &m.disabled {
            return Gate::Refuse(reason.clone());
        }
        if let Some((until, reason)) = &m.hold {
            if now < *until {
                return Gate::Wait {
                    delay: *until - now,
                    why: format!(
                        "holding its deliveries for {:?}, as it asked ({reason})",
                        *until - now
                    ),
                };
            }
            m.hold = None;
        }
        let failures = m.consecutive_failures;
        let last_error = m.last_error.clone();
        let Some(pause) = m.pause.as_mut() else {
            return Gate::Send;
        };
        let length = self.policy.pause_after(pause.pauses.saturating_sub(1));
        if now < pause.until {
            return Gate::Wait {
                delay: pause.until - now,
                why: format!(
                    "paused after {failures} consecutive failures (last: {last_error}); the \
                     next probe is due in {:?}",
                    pause.until - now
                ),
            };
        }
        if pause.probing {
            // The probe is out: wait for its verdict, a pause's length at most.
            return Gate::Wait {
                delay: length,
                why: format!(
                    "paused after {failures} consecutive failures (last: {last_error}); a \
                     probe is on its way"
                ),
            };
        }
        pause.probing = true;
        Gate::Probe
    }

    /// Records what a delivery (the probe, if `probe`) found.
    pub fn record(&self, observed: Observed<'_>, probe: bool, now: Instant) -> Option<Transition> {
        let mut m = self.machine();
        match observed {
            Observed::Answered => {
                m.consecutive_failures = 0;
                m.pause.take().map(|_| Transition::Resumed)
            }
            Observed::PushedBack(wait, reason) => {
                // An answer all the same: the destination is up, and an outage is over.
                m.consecutive_failures = 0;
                m.pause = None;
                let until = now + wait.min(LONGEST_ANY_PAUSE);
                let longer = m.hold.as_ref().is_none_or(|(held, _)| *held < until);
                if longer {
                    m.hold = Some((until, reason.to_owned()));
                    return Some(Transition::Held(until - now));
                }
                None
            }
            Observed::Gone(reason) => {
                m.pause = None;
                m.hold = None;
                m.disabled = Some(reason.to_owned());
                Some(Transition::Disabled)
            }
            Observed::Failed(error) => {
                m.consecutive_failures = m.consecutive_failures.saturating_add(1);
                m.last_error = error.to_owned();
                match m.pause {
                    Some(pause) if probe => {
                        let length = self.policy.pause_after(pause.pauses);
                        m.pause = Some(Pause {
                            until: now + length,
                            pauses: pause.pauses.saturating_add(1),
                            probing: false,
                        });
                        Some(Transition::Paused(length))
                    }
                    // A delivery sent before the pause began: the pause stands.
                    Some(_) => None,
                    None if m.consecutive_failures >= self.policy.failures_to_pause => {
                        let length = self.policy.pause_after(0);
                        m.pause = Some(Pause {
                            until: now + length,
                            pauses: 1,
                            probing: false,
                        });
                        Some(Transition::Paused(length))
                    }
                    None => None,
                }
            }
            Observed::Nothing => {
                if let Some(pause) = m.pause.as_mut().filter(|_| probe) {
                    // The probe told nothing: let the next delivery probe.
                    pause.probing = false;
                }
                None
            }
        }
    }

    pub fn state(&self, now: Instant) -> DestinationState {
        let m = self.machine();
        if let Some(reason) = &m.disabled {
            return DestinationState::Disabled {
                reason: reason.clone(),
            };
        }
        if let Some(pause) = m.pause {
            return DestinationState::Paused {
                consecutive_failures: m.consecutive_failures,
                probe_in: pause.until.saturating_duration_since(now),
                last_error: m.last_error.clone(),
            };
        }
        match &m.hold {
            Some((until, reason)) if now < *until => DestinationState::Held {
                resume_in: *until - now,
                reason: reason.clone(),
            },
            _ => DestinationState::Healthy {
                consecutive_failures: m.consecutive_failures,
            },
        }
    }

    /// Clears a disabled, paused or held state: deliveries are sent again.
    pub fn enable(&self) {
        let mut m = self.machine();
        m.disabled = None;
        m.pause = None;
        m.hold = None;
        m.consecutive_failures = 0;
    }

    /// Disables the destination for `reason` (what another worker or an operator decided).
    pub fn disable(&self, reason: &str) {
        let mut m = self.machine();
        m.pause = None;
        m.hold = None;
        m.disabled = Some(reason.to_owned());
    }
}

/// What a worker does to its destination after reading the store's record of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Adopt {
    /// An operator enabled it since the worker last looked.
    Enable,
    /// The store says it is disabled and this worker does not know yet.
    Disable(String),
    Nothing,
}

/// Decides what the store's record means for a worker's destination. `enables_seen` is the
/// operator's count of enables when this worker last read it (`None`: never read, so an
/// earlier enable is history, not news); `disabled_here` whether the destination is disabled in
/// this worker. An operator's enable wins over a disable in the same record, since the enable
/// clears the record's disable.
pub(crate) fn adopt(
    stored: &crate::store::StoredDestination,
    enables_seen: Option<i64>,
    disabled_here: bool,
) -> Adopt {
    if enables_seen.is_some_and(|seen| stored.enables > seen) {
        return Adopt::Enable;
    }
    match &stored.disabled {
        Some(reason) if !disabled_here => Adopt::Disable(reason.clone()),
        _ => Adopt::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(failures: u32) -> Health {
        Health::new(
            HealthPolicy::new()
                .failures_to_pause(failures)
                .first_pause(Duration::from_secs(10))
                .longest_pause(Duration::from_secs(35)),
        )
    }

    #[test]
    fn failures_below_the_threshold_keep_sending_and_an_answer_resets_them() {
        let h = health(3);
        let now = Instant::now();
        for _ in 0..2 {
            assert_eq!(h.gate(now), Gate::Send);
            assert_eq!(h.record(Observed::Failed("503"), false, now), None);
        }
        assert_eq!(h.record(Observed::Answered, false, now), None);
        assert_eq!(
            h.state(now),
            DestinationState::Healthy {
                consecutive_failures: 0
            }
        );
        for _ in 0..2 {
            h.record(Observed::Failed("503"), false, now);
        }
        assert_eq!(h.gate(now), Gate::Send, "the count started again");
    }

    #[test]
    fn a_pause_defers_then_one_probe_goes_out_and_an_answer_resumes() {
        let h = health(2);
        let t0 = Instant::now();
        h.record(Observed::Failed("503"), false, t0);
        let paused = h.record(Observed::Failed("timed out"), false, t0);
        assert_eq!(paused, Some(Transition::Paused(Duration::from_secs(10))));
        match h.gate(t0 + Duration::from_secs(4)) {
            Gate::Wait { delay, why } => {
                assert_eq!(delay, Duration::from_secs(6));
                assert!(why.contains("2 consecutive failures") && why.contains("timed out"));
            }
            other => panic!("{other:?}"),
        }
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(h.gate(t1), Gate::Probe);
        assert!(
            matches!(h.gate(t1), Gate::Wait { delay, .. } if delay == Duration::from_secs(10)),
            "one probe at a time"
        );
        // A delivery sent before the pause fails late: the pause stands, the probe is out.
        assert_eq!(h.record(Observed::Failed("503"), false, t1), None);
        assert_eq!(
            h.record(Observed::Answered, true, t1),
            Some(Transition::Resumed)
        );
        assert_eq!(h.gate(t1), Gate::Send);
    }

    #[test]
    fn failed_probes_double_the_pause_up_to_the_longest() {
        let h = health(1);
        let mut now = Instant::now();
        assert_eq!(
            h.record(Observed::Failed("503"), false, now),
            Some(Transition::Paused(Duration::from_secs(10)))
        );
        let mut lengths = Vec::new();
        for _ in 0..4 {
            let DestinationState::Paused { probe_in, .. } = h.state(now) else {
                panic!("paused");
            };
            now += probe_in;
            assert_eq!(h.gate(now), Gate::Probe);
            match h.record(Observed::Failed("503"), true, now) {
                Some(Transition::Paused(length)) => lengths.push(length.as_secs()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(lengths, [20, 35, 35, 35]);
        // A probe that never left lets the next delivery probe.
        let DestinationState::Paused { probe_in, .. } = h.state(now) else {
            panic!("paused");
        };
        now += probe_in;
        assert_eq!(h.gate(now), Gate::Probe);
        assert_eq!(h.record(Observed::Nothing, true, now), None);
        assert_eq!(h.gate(now), Gate::Probe);
    }

    #[test]
    fn gone_disables_until_enabled() {
        let h = health(5);
        let now = Instant::now();
        assert_eq!(
            h.record(Observed::Gone("410 Gone"), false, now),
            Some(Transition::Disabled)
        );
        assert_eq!(h.gate(now), Gate::Refuse("410 Gone".into()));
        assert_eq!(h.state(now).name(), "disabled");
        h.record(Observed::Answered, false, now);
        assert_eq!(
            h.state(now).name(),
            "disabled",
            "only an operator enables it"
        );
        h.enable();
        assert_eq!(h.gate(now), Gate::Send);
        assert_eq!(h.state(now).name(), "healthy");
    }

    #[test]
    fn never_pause_never_pauses() {
        let h = Health::new(HealthPolicy::never_pause());
        let now = Instant::now();
        for _ in 0..10_000 {
            h.record(Observed::Failed("503"), false, now);
        }
        assert_eq!(h.gate(now), Gate::Send);
        assert!(HealthPolicy::new().failures_to_pause(0).failures_to_pause == 1);
        let huge = HealthPolicy::new()
            .first_pause(Duration::MAX)
            .longest_pause(Duration::from_secs(1));
        assert_eq!(huge.pause_after(40), LONGEST_ANY_PAUSE, "no overflow");
        let h = Health::new(huge.failures_to_pause(1));
        assert_eq!(
            h.record(Observed::Failed("503"), false, now),
            Some(Transition::Paused(LONGEST_ANY_PAUSE))
        );
    }

    fn stored(disabled: Option<&str>, enables: i64) -> crate::store::StoredDestination {
        crate::store::StoredDestination::new("mail", disabled.map(str::to_owned), enables)
    }

    #[test]
    fn a_worker_adopts_a_disable_it_does_not_know_and_an_enable_that_is_news() {
        // First read: the record's enables are history; its disable is adopted.
        assert_eq!(adopt(&stored(None, 3), None, false), Adopt::Nothing);
        assert_eq!(
            adopt(&stored(Some("410 Gone"), 3), None, false),
            Adopt::Disable("410 Gone".into())
        );
        // Already disabled here: nothing to do, whatever the reason.
        assert_eq!(
            adopt(&stored(Some("410 Gone"), 3), Some(3), true),
            Adopt::Nothing
        );
        // The operator enabled it since: enable, disabled here or not.
        assert_eq!(adopt(&stored(None, 4), Some(3), true), Adopt::Enable);
        assert_eq!(adopt(&stored(None, 4), Some(3), false), Adopt::Enable);
        // An enable the worker has seen is not repeated.
        assert_eq!(adopt(&stored(None, 4), Some(4), false), Adopt::Nothing);
        // A disable recorded after the last enable is adopted.
        assert_eq!(
            adopt(&stored(Some("an operator"), 4), Some(4), false),
            Adopt::Disable("an operator".into())
        );
    }

    #[test]
    fn a_disable_from_the_store_refuses_deliveries_until_enabled() {
        let health = health(3);
        health.disable("disabled by an operator");
        assert_eq!(
            health.gate(Instant::now()),
            Gate::Refuse("disabled by an operator".into())
        );
        health.enable();
        assert_eq!(health.gate(Instant::now()), Gate::Send);
    }
}
