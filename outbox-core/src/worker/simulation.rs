//! A randomized simulation of workers against a [`MemoryStore`] with faults, driven step by
//! step on one thread with a manual clock: the roles' own code (claim planning, the book of
//! held messages, the settlement decisions, the acker's settler with its refused-outcome
//! policy, the warden's heartbeat and watchdog, the housekeeper's chores) under thousands of
//! seeded schedules in seconds.
//!
//! Each schedule enqueues messages (some keyed, some of a raised priority, some of unknown
//! types, some large), then takes random steps: claims, handler starts and finishes (success,
//! failure, permanent failure, panic, hang), settlements, heartbeats, watchdog rounds,
//! housekeeping, clock jumps, store faults (down, failing calls, an outcome refused forever,
//! texts refused as a `LATIN1` database does), worker crashes, and stale outcomes of crashed
//! workers. Then the faults stop and healthy workers run. It asserts: in-flight never above its
//! caps; a fenced outcome changes nothing; within a bounded number of rounds after the faults
//! stop, every message is settled or dead-lettered.
//!
//! `OUTBOX_SIM_SEEDS=N` runs N schedules (default 300); `OUTBOX_SIM_SEED=S` replays one. A
//! failure prints its seed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::bounded;

use crate::context::Resources;
use crate::destination::Destinations;
use crate::error::ProcessError;
use crate::priority::Priority;
use crate::registry::Registry;
use crate::retry::RetryPolicy;
use crate::store::{ClaimLimit, ClaimToken, ClaimedMessage, Exchange, Outcome, Settlement, Store};
use crate::testing::MemoryStore;

use super::acker::{Acker, Settler};
use super::claimer::{dispatch, plan_claim, ClaimSignals, ClaimSize, Claimed};
use super::config::Config;
use super::handlers::{settle_attempt, settle_unknown_type, Attempt};
use super::held::JobId;
use super::housekeeper::Housekeeper;
use super::jobs::Job;
use super::jobs::{JobReceiver, JobSender};
use super::pool::{HandlerParts, HandlerPool, TypePauses};
use super::shared::{Parts, Shared};
use super::timing::{HEARTBEATS_PER_LEASE, START_MARGIN};
use super::warden::Rounds;

const KNOWN: &str = "sim.known";
const UNKNOWN: &str = "sim.unknown";

/// What a started job will do.
#[derive(Debug, Clone, Copy)]
enum Plan {
    Succeed,
    Fail,
    FailPermanently,
    Panic,
    /// Hangs until this simulated time.
    HangUntil(Duration),
}

struct Running {
    /// The job, with the next messages of its key chained behind it.
    job: Job,
    plan: Plan,
}

/// One simulated worker: the real shared state and settler, with jobs moved by hand.
struct SimWorker {
    shared: Arc<Shared>,
    settler: Settler,
    rounds: Rounds,
    housekeeper: Housekeeper,
    /// The handler threads' jobs channel, its two ends.
    queued: JobSender,
    jobs: JobReceiver,
    running: Vec<Running>,
    /// Chains whose message before succeeded: their next job, which runs on as a handler
    /// thread would, started before any job of the channel.
    chained: Vec<Job>,
    /// Messages whose `Done` outcome this worker handed to its settler.
    done: HashSet<i64>,
    /// Chained messages started.
    chained_starts: u64,
    next_thread: usize,
    size: ClaimSize,
    signals: Arc<ClaimSignals>,
    /// The store, as the checks read it.
    store: MemoryStore,
}

impl SimWorker {
    fn new(config: &Config, store: &MemoryStore, now: Instant) -> Self {
        Self::handled_by(Registry::empty(), config, store, now)
    }

    fn handled_by(registry: Registry, config: &Config, store: &MemoryStore, now: Instant) -> Self {
        let (stop, stopped) = bounded(1);
        let (_, unused_jobs) = super::jobs::channel(1);
        let (queued, jobs) = super::jobs::channel(config.max_in_flight);
        let (outcomes, _) = bounded(1);
        let checked = store.clone();
        let store = Arc::new(store.clone());
        let handler_parts = HandlerParts {
            resources: Resources::new(),
            settlements: crate::context::Settlements::of(Arc::clone(&store)),
            type_pauses: Arc::new(TypePauses::default()),
        };
        let type_pauses = Arc::clone(&handler_parts.type_pauses);
        let parts = Parts {
            config: config.clone(),
            store,
            registry,
            destinations: Destinations::default(),
            subscribers: None,
        };
        let shared = Arc::new(Shared::new(
            parts,
            stop,
            HandlerPool::new(unused_jobs, outcomes, handler_parts),
        ));
        let signals = Arc::new(ClaimSignals::default());
        // Settlements lease the next messages of settled keys into the jobs channel; the
        // claimer's wake-ups have no one to wake here.
        let settler =
            Settler::new(now).with_outlets(queued.clone(), bounded(1).0, Arc::clone(&signals));
        SimWorker {
            settler,
            rounds: Rounds::new(&shared, now),
            housekeeper: Housekeeper::new(Arc::clone(&shared), type_pauses, stopped),
            shared,
            queued,
            jobs,
            running: Vec::new(),
            chained: Vec::new(),
            done: HashSet::new(),
            chained_starts: 0,
            next_thread: 0,
            size: ClaimSize::new(config),
            signals,
            store: checked,
        }
    }

    fn claim(&mut self, now: Instant) {
        let shared = &self.shared;
        let Some(limit) = plan_claim(
            &shared.config,
            self.size.get(),
            self.size.held_at_most(&shared.config, now),
            shared.held.count(),
            shared.held.bytes(),
        ) else {
            return;
        };
        let token = ClaimToken::new();
        let Ok(claimed) = shared.store.claim(token, limit, shared.config.lease) else {
            return;
        };
        self.signals.set_short(claimed.len() < limit.messages);
        self.size.claimed(
            Claimed::of(limit.messages, &claimed, self.queued.len()),
            now,
        );
        let settler = &mut self.settler;
        let queued = &self.queued;
        dispatch(
            shared,
            token,
            claimed,
            now + shared.config.lease,
            |job| {
                let sent = queued.try_send(job);
                assert!(sent.is_ok(), "the jobs channel holds what may be held");
                true
            },
            |outcome| {
                settler.push(outcome);
                true
            },
        );
    }

    fn start(&mut self, plan: Plan, now: Instant) {
        let chained = self.chained.pop();
        if chained.is_some() {
            self.chained_starts += 1;
        }
        let Some(job) = chained.or_else(|| self.jobs.try_recv()) else {
            return;
        };
        let thread = self.next_thread;
        self.next_thread += 1;
        let shared = &self.shared;
        let Some(lease_ends) = shared
            .held
            .start(job.message.position, job.job, thread, now)
        else {
            self.release_chain(job.chain);
            return;
        };
        if lease_ends < now + START_MARGIN {
            self.finish_with(&job.message, job.job, Settlement::Release);
            self.release_chain(job.chain);
            return;
        }
        // Per-key order: every earlier message of its key is gone from the store, or this
        // worker ran it and its success is on the way.
        if let Some(key) = &job.message.ordering_key {
            let earlier: Vec<i64> = self
                .store
                .rows()
                .iter()
                .filter(|row| row.position < job.message.position)
                .filter(|row| row.ordering_key.as_ref() == Some(key))
                .map(|row| row.position)
                .filter(|position| !self.done.contains(position))
                .collect();
            assert!(
                earlier.is_empty(),
                "message {} of key {key} started before {earlier:?}",
                job.message.position
            );
        }
        self.running.push(Running { job, plan });
    }

    /// Gives back the messages chained behind one that did not succeed, as a handler thread
    /// does (those the watchdog gave back already are not held for their jobs any more).
    fn release_chain(&mut self, chain: Vec<Job>) {
        for job in chain {
            self.finish_with(&job.message, job.job, Settlement::Release);
        }
    }

    /// Finishes the running job at `index`, unless it is still hanging at `sim_now`.
    fn finish(&mut self, index: usize, store: &MemoryStore) {
        let Some(running) = self.running.get(index) else {
            return;
        };
        if matches!(running.plan, Plan::HangUntil(until) if until > store.now()) {
            return;
        }
        let Running { job, plan } = self.running.swap_remove(index);
        let message = &job.message;
        let policy = &self.shared.config.retry_policy;
        let settlement = if message.message_type == UNKNOWN {
            settle_unknown_type(
                message,
                &[KNOWN],
                self.shared.config.unknown_type_grace,
                store.system_now(),
            )
        } else {
            let attempt = match plan {
                Plan::Succeed | Plan::HangUntil(_) => Attempt::Succeeded,
                Plan::Fail => Attempt::Failed(ProcessError::retryable("503 … überlastet")),
                Plan::FailPermanently => Attempt::Failed(ProcessError::permanent("410 Gone")),
                Plan::Panic => Attempt::Panicked("boom".into()),
            };
            settle_attempt(message.attempt, attempt, policy)
        };
        let succeeded = settlement == Settlement::Done;
        let handed = self.finish_with(&job.message, job.job, settlement);
        let mut chain = job.chain.into_iter();
        match chain.next() {
            Some(next) if succeeded && handed => self.chained.push(next.chained(chain.collect())),
            Some(next) => self.release_chain(std::iter::once(next).chain(chain).collect()),
            None => {}
        }
    }

    /// Every finished attempt made one exchange with a destination, for the delivery log.
    /// Whether the outcome went to the settler (not when the watchdog gave up on the job).
    fn finish_with(
        &mut self,
        message: &ClaimedMessage,
        job: JobId,
        settlement: Settlement,
    ) -> bool {
        let Some(token) = self.shared.held.finish(message.position, job) else {
            return false;
        };
        if settlement == Settlement::Done {
            self.done.insert(message.position);
        }
        let exchange = Exchange {
            destination: "simulated".to_owned(),
            outcome: if settlement == Settlement::Done {
                "delivered"
            } else {
                "failed"
            },
            answer: None,
            error: None,
            started_at: SystemTime::UNIX_EPOCH,
            latency: Duration::ZERO,
        };
        let outcome = Outcome::of(token, message, settlement);
        self.settler.push(outcome.logging(message, vec![exchange]));
        true
    }

    /// The warden's heartbeat; the chains it gives back go to this worker's settler.
    fn heartbeat(&mut self, now: Instant) {
        let settler = &mut self.settler;
        self.rounds
            .heartbeat(&self.shared, now, |outcome| settler.push(outcome));
    }

    /// The warden's watchdog round; its outcomes go to this worker's settler.
    fn watchdog(&mut self, now: Instant) {
        let settler = &mut self.settler;
        self.rounds
            .watchdog(&self.shared, now, |outcome| settler.push(outcome));
    }

    fn check_caps(&self, seed: u64) {
        let config = &self.shared.config;
        let (count, bytes) = (self.shared.held.count(), self.shared.held.bytes());
        assert!(
            count <= config.max_in_flight,
            "seed {seed}: {count} held, cap {}",
            config.max_in_flight
        );
        assert!(
            bytes <= config.max_in_flight_bytes || count == 1,
            "seed {seed}: {bytes} bytes held in {count} messages, cap {}",
            config.max_in_flight_bytes
        );
    }
}

fn config(rng: &mut fastrand::Rng) -> Config {
    let batch_size = rng.usize(1..=8);
    let max_batch_size = batch_size * rng.usize(1..=4);
    let handler_threads = rng.usize(1..=4);
    let lease = Duration::from_millis(rng.u64(2_000..=10_000));
    Config {
        handler_threads,
        batch_size,
        max_batch_size,
        lease,
        heartbeat: lease / HEARTBEATS_PER_LEASE,
        handler_timeout: Duration::from_millis(rng.u64(100..=3_000)),
        poll_interval: Duration::from_millis(100),
        listen: false,
        retry_policy: RetryPolicy::new()
            .max_attempts(rng.u32(1..=5))
            .initial_backoff(Duration::from_millis(rng.u64(1..=200)))
            .multiplier(2.0)
            .max_backoff(Duration::from_secs(5)),
        unknown_type_grace: Duration::from_millis(rng.u64(0..=20_000)),
        max_in_flight: 2 * max_batch_size + handler_threads,
        max_in_flight_bytes: rng.usize(64..=4_096),
        backlog_interval: Duration::from_secs(15),
        max_deferral: None,
    }
}

/// The random configuration of one fixed seed, for the tests of one sequence.
fn seeded_config() -> Config {
    config(&mut fastrand::Rng::with_seed(7))
}

/// A store on a manual clock holding one message of a known type, a worker for it, and the
/// time as the worker sees it.
/// A worker of one handler thread, for the tests that step one message through it by hand.
fn one_handler_config() -> Config {
    Config {
        batch_size: 4,
        max_batch_size: 4,
        handler_threads: 1,
        max_in_flight: 9,
        max_in_flight_bytes: 4_096,
        ..seeded_config()
    }
}

fn one_message_worker(
    config: &Config,
) -> (MemoryStore, SimWorker, impl Fn(&MemoryStore) -> Instant) {
    one_message_worker_handled_by(Registry::empty(), config)
}

fn one_message_worker_handled_by(
    registry: Registry,
    config: &Config,
) -> (MemoryStore, SimWorker, impl Fn(&MemoryStore) -> Instant) {
    let store = MemoryStore::with_manual_clock();
    let base = Instant::now();
    let now = move |store: &MemoryStore| base + store.now();
    store.enqueue(KNOWN, "{}", None);
    let worker = SimWorker::handled_by(registry, config, &store, now(&store));
    (store, worker, now)
}

/// What all schedules did, to see that they exercise what they claim to.
#[derive(Debug, Default)]
struct Totals {
    messages: u64,
    stats: [u64; 8],
    dead: u64,
    crashes: u64,
    stale_fenced: u64,
    chained_starts: u64,
}

fn add(totals: &mut Totals, worker: &SimWorker) {
    totals.chained_starts += worker.chained_starts;
    let s = worker.shared.counters.snapshot();
    for (total, n) in totals.stats.iter_mut().zip([
        s.succeeded,
        s.retried,
        s.dead_lettered,
        s.released,
        s.deferred,
        s.fenced,
        s.timed_out,
        s.abandoned_outcomes,
    ]) {
        *total += n;
    }
}

/// One schedule; panics with the seed when an invariant breaks.
fn run(seed: u64, totals: &mut Totals) {
    let mut rng = fastrand::Rng::with_seed(seed);
    // The retry policy's jitter draws from the thread's generator: seeded, it replays.
    fastrand::seed(seed);
    let store = MemoryStore::with_manual_clock();
    let base = Instant::now();
    let now = |store: &MemoryStore| base + store.now();
    let config = config(&mut rng);

    let messages = rng.usize(1..=30);
    for n in 0..messages {
        let kind = if rng.u8(..10) == 0 { UNKNOWN } else { KNOWN };
        let key = match rng.u8(..3) {
            0 => Some(format!("k{}", rng.u8(..3))),
            _ => None,
        };
        let size = if rng.u8(..8) == 0 {
            rng.usize(1_000..6_000)
        } else {
            rng.usize(2..200)
        };
        let priority = if rng.u8(..8) == 0 {
            Priority::High
        } else {
            Priority::Normal
        };
        store.enqueue_with_priority(kind, &format!("{n:0>size$}"), key.as_deref(), priority);
    }

    let mut worker = SimWorker::new(&config, &store, now(&store));
    let mut zombies: Vec<Outcome> = Vec::new();
    let steps = rng.usize(50..=400);
    for _ in 0..steps {
        let t = now(&store);
        match rng.u8(..100) {
            0..=14 => worker.claim(t),
            15..=34 => {
                let plan = match rng.u8(..20) {
                    0..=10 => Plan::Succeed,
                    11..=14 => Plan::Fail,
                    15 => Plan::FailPermanently,
                    16 => Plan::Panic,
                    _ => Plan::HangUntil(store.now() + Duration::from_millis(rng.u64(0..20_000))),
                };
                worker.start(plan, t);
            }
            35..=54 => {
                if !worker.running.is_empty() {
                    let index = rng.usize(..worker.running.len());
                    worker.finish(index, &store);
                }
            }
            55..=69 => worker.settler.settle(&worker.shared, t),
            70..=73 => worker.watchdog(t),
            74 => worker.housekeeper.step(t),
            75..=79 => worker.heartbeat(t),
            80..=87 => store.advance(Duration::from_millis(rng.u64(0..3_000))),
            88 => store.set_down(!rng.bool() && rng.bool()),
            89 => store.fail_claims(rng.u32(0..3)),
            90 => store.fail_settles(rng.u32(0..3)),
            91 => {
                let rows = store.rows();
                if !rows.is_empty() {
                    store.refuse_outcomes_of(rows[rng.usize(..rows.len())].position);
                }
            }
            92 => store.refuse_non_latin1(rng.bool()),
            93 => {
                // The worker dies: what it held stays leased until the leases run out; some
                // of its outcomes arrive later, from a zombie.
                for running in &worker.running {
                    if let Some(entry) = worker
                        .shared
                        .held
                        .leases()
                        .iter()
                        .find(|(_, p)| *p == running.job.message.position)
                    {
                        zombies.push(Outcome {
                            token: entry.0,
                            position: entry.1,
                            message_id: running.job.message.message_id,
                            ordering_key: running.job.message.ordering_key.clone(),
                            log: None,
                            settlement: Settlement::Done,
                        });
                    }
                }
                add(totals, &worker);
                totals.crashes += 1;
                worker = SimWorker::new(&config, &store, t);
            }
            94 if !zombies.is_empty() => {
                let outcome = zombies.swap_remove(rng.usize(..zombies.len()));
                totals.stale_fenced += u64::from(settle_stale(&store, outcome, seed));
            }
            _ => worker.claim(t),
        }
        worker.check_caps(seed);
    }

    // The faults stop; healthy workers must settle everything within a bounded number of
    // rounds.
    store.set_down(false);
    store.fail_claims(0);
    store.fail_settles(0);
    for row in store.rows() {
        store.accept(row.position);
    }
    let mut rounds = 0;
    while !store.rows().is_empty() {
        rounds += 1;
        assert!(
            rounds <= 2_000,
            "seed {seed}: wedged: {} messages left after the faults stopped: {:?}",
            store.rows().len(),
            store.rows().first()
        );
        store.advance(Duration::from_millis(500));
        let t = now(&store);
        worker.claim(t);
        while !worker.queued.is_empty() || !worker.chained.is_empty() {
            worker.start(Plan::Succeed, now(&store));
        }
        for index in (0..worker.running.len()).rev() {
            worker.finish(index, &store);
        }
        worker.watchdog(t);
        worker.settler.settle(&worker.shared, now(&store));
        worker.heartbeat(now(&store));
        worker.housekeeper.step(now(&store));
        worker.check_caps(seed);
    }
    add(totals, &worker);
    totals.messages += messages as u64;
    let dead = store.dead_letters();
    totals.dead += dead.len() as u64;
    // Every dead letter was counted by the worker that settled it (a fenced outcome is not).
    assert_eq!(
        totals.dead, totals.stats[2],
        "seed {seed}: dead letters in the store and counted differ"
    );
    for letter in &dead {
        assert!(
            !letter.error.is_empty(),
            "seed {seed}: a dead letter without a reason"
        );
    }
}

/// A crashed worker's outcome: taken only while its claim still holds the row, and when
/// fenced, it changes nothing.
fn settle_stale(store: &MemoryStore, outcome: Outcome, seed: u64) -> bool {
    let before = store.rows();
    match store.settle(std::slice::from_ref(&outcome)) {
        Ok(fenced) if fenced.contains(&outcome.position) => {
            assert_eq!(
                store.rows(),
                before,
                "seed {seed}: a fenced outcome changed the store"
            );
            return true;
        }
        Ok(_) => {
            let held = before
                .iter()
                .find(|row| row.position == outcome.position)
                .and_then(|row| row.locked_by);
            assert_eq!(
                held,
                Some(outcome.token),
                "seed {seed}: an outcome taken without its claim"
            );
        }
        Err(_) => {}
    }
    false
}

#[test]
fn randomized_schedules_lose_nothing_and_never_wedge() {
    let mut totals = Totals::default();
    if std::env::var("OUTBOX_SIM_DEBUG").is_ok() {
        struct Stderr;
        impl log::Log for Stderr {
            fn enabled(&self, _: &log::Metadata<'_>) -> bool {
                true
            }
            fn log(&self, record: &log::Record<'_>) {
                eprintln!("{} {}", record.level(), record.args());
            }
            fn flush(&self) {}
        }
        let _ = log::set_logger(&Stderr);
        log::set_max_level(log::LevelFilter::Debug);
    }
    if let Some(seed) = std::env::var("OUTBOX_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run(seed, &mut totals);
        eprintln!("{totals:?}");
        return;
    }
    let seeds: u64 = std::env::var("OUTBOX_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let started = Instant::now();
    for seed in 0..seeds {
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed, &mut totals)));
        if let Err(panic) = outcome {
            eprintln!(
                "simulation failed with seed {seed}; replay it with \
                 OUTBOX_SIM_SEED={seed} cargo test -p outbox-core --features testing simulation"
            );
            std::panic::resume_unwind(panic);
        }
    }
    eprintln!(
        "simulation: {seeds} schedules in {:?}; [succeeded, retried, dead-lettered, released, \
         deferred, fenced, timed out, abandoned outcomes] = {:?}; {totals:?}",
        started.elapsed(),
        totals.stats
    );
    // The schedules exercise every path they claim to.
    if seeds >= 300 {
        assert!(totals.stats.iter().all(|n| *n > 0), "{totals:?}");
        assert!(totals.crashes > 0 && totals.stale_fenced > 0, "{totals:?}");
        assert!(totals.chained_starts > 0, "no chain ran: {totals:?}");
    }
}

/// A message whose lease runs out while its outcome waits to be saved, and that this worker
/// claims again meanwhile: the outcome, fenced under the old claim, is saved under the new one,
/// and the message is settled once, not left leased to run again when the new lease ends.
#[test]
fn an_outcome_on_its_way_follows_its_message_to_a_new_claim() {
    let config = one_handler_config();
    let (store, mut worker, now) = one_message_worker(&config);
    worker.claim(now(&store));
    worker.start(Plan::Succeed, now(&store));
    worker.finish(0, &store);
    assert_eq!(worker.shared.held.count(), 1, "its outcome is on its way");

    store.advance(config.lease + Duration::from_secs(1));
    worker.claim(now(&store));
    assert!(
        worker.queued.is_empty(),
        "held already: not dispatched again"
    );

    worker.settler.settle(&worker.shared, now(&store));
    worker.settler.settle(&worker.shared, now(&store));
    assert!(
        store.rows().is_empty(),
        "settled under the new claim: {:?}",
        store.rows()
    );
    assert_eq!(worker.shared.held.count(), 0);
    let stats = worker.shared.counters.snapshot();
    assert_eq!((stats.succeeded, stats.fenced), (1, 0), "{stats:?}");
    // The fenced settlement saved the attempt's exchange; settled again under the new claim,
    // the outcome carries it no more.
    assert_eq!(store.logged().len(), 1, "{:?}", store.logged());
}

/// A message whose outcome reached the store and made it due at once (a retry without delay),
/// claimed again by this worker before the acker let the outcome's entry go: the new claim is
/// no one's to run (the claimer left it to the entry), so it is given back at once, without
/// counting an attempt, rather than waiting out its lease.
#[test]
fn a_message_claimed_again_before_its_settled_entry_is_let_go_runs_again_at_once() {
    let config = one_handler_config();
    let (store, mut worker, now) = one_message_worker(&config);
    worker.claim(now(&store));
    worker.start(Plan::Fail, now(&store));
    let job = worker.running.remove(0).job;
    let token = worker
        .shared
        .held
        .finish(job.message.position, job.job)
        .expect("held");
    let outcome = Outcome {
        token,
        position: job.message.position,
        message_id: job.message.message_id,
        ordering_key: None,
        log: None,
        settlement: Settlement::Retry {
            delay: Duration::ZERO,
            error: "503".into(),
        },
    };
    // The acker's settlement commits; before it lets the entry go, the claimer runs.
    let fenced = worker
        .shared
        .store
        .settle(std::slice::from_ref(&outcome))
        .unwrap();
    assert!(fenced.is_empty());
    worker.claim(now(&store));
    assert!(worker.queued.is_empty(), "held already: not dispatched");
    assert_eq!(store.rows()[0].attempts, 2);

    worker
        .settler
        .settled(&worker.shared, &[outcome], &fenced, now(&store));
    worker.settler.settle(&worker.shared, now(&store));
    let row = &store.rows()[0];
    assert_eq!(
        (row.locked_by, row.attempts),
        (None, 1),
        "the claim no one runs is given back, its attempt not counted: {row:?}"
    );
    assert_eq!(worker.shared.held.count(), 0);
    worker.claim(now(&store));
    assert_eq!(
        worker.queued.len(),
        1,
        "claimed and dispatched again at once"
    );
}

/// A handler thread stuck in a message that is claimed again: the claimer settles that claim's
/// attempt as timed out too. If that outcome reaches the store only after its claim ran out and
/// the message was claimed a third time and given to a handler, it is fenced: it must not
/// settle the newer attempt under the newer claim, nor release it from the book of held
/// messages, while that attempt still runs.
#[test]
fn a_late_outcome_of_a_stuck_attempt_leaves_a_newer_attempt_alone() {
    let lease = Duration::from_secs(6);
    let config = Config {
        lease,
        heartbeat: lease / HEARTBEATS_PER_LEASE,
        handler_timeout: Duration::from_secs(1),
        retry_policy: RetryPolicy::new()
            .max_attempts(10)
            .initial_backoff(Duration::from_millis(1))
            .max_backoff(Duration::from_millis(1)),
        ..one_handler_config()
    };
    let (store, mut worker, now) = one_message_worker(&config);

    // Attempt 1 hangs; the watchdog gives up on it, and its timed-out outcome is saved.
    worker.claim(now(&store));
    worker.start(
        Plan::HangUntil(store.now() + Duration::from_secs(20)),
        now(&store),
    );
    store.advance(Duration::from_secs(3));
    worker.watchdog(now(&store));
    worker.settler.settle(&worker.shared, now(&store));
    assert_eq!(worker.shared.held.count(), 0);
    assert_eq!(worker.shared.held.stuck(), 1);

    // Claim 2 finds its thread still stuck: that attempt's outcome waits for the acker, which
    // does not get to it for longer than a lease.
    store.advance(Duration::from_millis(100));
    worker.claim(now(&store));
    assert!(worker.queued.is_empty(), "not run beside the stuck thread");

    // The stuck thread returns; claim 2 runs out; claim 3 gives the message to a handler.
    store.advance(Duration::from_secs(20));
    worker.finish(0, &store);
    assert_eq!(worker.shared.held.stuck(), 0);
    worker.claim(now(&store));
    worker.start(Plan::Succeed, now(&store));
    assert_eq!(worker.running.len(), 1, "attempt 3 runs");
    let claim_3 = worker.shared.held.leases()[0].0;

    // Claim 2's outcome arrives: fenced, it changes nothing.
    worker.settler.settle(&worker.shared, now(&store));
    worker.settler.settle(&worker.shared, now(&store));
    let rows = store.rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].locked_by,
        Some(claim_3),
        "claim 2's outcome settled attempt 3's lease: {rows:?}"
    );
    assert_eq!(
        worker.shared.held.count(),
        1,
        "attempt 3 released from the book while it runs"
    );
    assert_eq!(worker.shared.counters.snapshot().fenced, 1);

    // Attempt 3's own outcome settles the message.
    worker.finish(0, &store);
    worker.settler.settle(&worker.shared, now(&store));
    assert!(store.rows().is_empty(), "{:?}", store.rows());
    assert_eq!(worker.shared.held.count(), 0);
    let stats = worker.shared.counters.snapshot();
    assert_eq!((stats.succeeded, stats.timed_out), (1, 1), "{stats:?}");
}

/// The claimer's last outcome (the attempt of a message a stuck thread still runs, which no
/// held message stands for) may reach the acker's channel after the acker last looked, just
/// before the claimer reports it is done: a stopping acker is not finished while an outcome
/// waits there, and settles it before it ends.
#[test]
fn a_stopping_acker_settles_an_outcome_still_in_its_channel() {
    let config = seeded_config();
    let (store, worker, _) = one_message_worker(&config);
    let token = ClaimToken::new();
    let limit = ClaimLimit {
        messages: 1,
        bytes: 4_096,
        oversized_alone: true,
    };
    let claimed = store.claim(token, limit, config.lease).expect("claim");
    assert_eq!(claimed.len(), 1);

    let (outcomes, received) = bounded(1);
    let (jobs, _) = super::jobs::channel(1);
    let (capacity, _) = bounded(1);
    let signals = Arc::new(super::claimer::ClaimSignals::default());
    let acker = Acker::new(
        Arc::clone(&worker.shared),
        received,
        jobs,
        capacity,
        Arc::clone(&signals),
    );
    worker.shared.request_stop();
    signals.finish();
    let timed_out = Settlement::Retry {
        delay: Duration::from_secs(1),
        error: "still running past its timeout".into(),
    };
    outcomes
        .send(Outcome::of(token, &claimed[0], timed_out))
        .expect("send");
    assert!(
        !acker.finished(),
        "finished with an outcome waiting in its channel"
    );

    // Not a hang if the settlement failed: the shutdown's deadline ends the acker.
    worker
        .shared
        .set_give_up_at(Some(Instant::now() + Duration::from_secs(10)));
    acker.run();
    let rows = store.rows();
    assert_eq!(rows[0].locked_by, None, "settled before the acker ended");
    assert_eq!(
        rows[0].last_error.as_deref(),
        Some("still running past its timeout")
    );
}

/// An application's metrics recorder that panics whenever it records, and counts its panics.
#[derive(Default)]
struct PanickingRecorder {
    panics: Arc<std::sync::atomic::AtomicUsize>,
}

impl PanickingRecorder {
    fn panics(&self) -> usize {
        self.panics.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct Panics(Arc<std::sync::atomic::AtomicUsize>);

impl Panics {
    fn panic(&self) -> ! {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        panic!("the recorder broke");
    }
}

impl metrics::CounterFn for Panics {
    fn increment(&self, _: u64) {
        self.panic()
    }
    fn absolute(&self, _: u64) {
        self.panic()
    }
}

impl metrics::GaugeFn for Panics {
    fn increment(&self, _: f64) {
        self.panic()
    }
    fn decrement(&self, _: f64) {
        self.panic()
    }
    fn set(&self, _: f64) {
        self.panic()
    }
}

impl metrics::HistogramFn for Panics {
    fn record(&self, _: f64) {
        self.panic()
    }
}

impl metrics::Recorder for PanickingRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(Arc::new(Panics(Arc::clone(&self.panics))))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(Arc::new(Panics(Arc::clone(&self.panics))))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::from_arc(Arc::new(Panics(Arc::clone(&self.panics))))
    }
}

/// A recorder that panics while the acker books a settlement the store took: the booking
/// completes, and the settled message does not stay in the book of held messages, where it
/// would count against the worker's in-flight cap and keep a shutdown waiting until its
/// deadline.
#[test]
fn a_panicking_metrics_recorder_leaves_no_settled_message_held() {
    let config = seeded_config();
    let (store, mut worker, now) = one_message_worker(&config);
    worker.claim(now(&store));
    worker.start(Plan::Succeed, now(&store));
    worker.finish(0, &store);
    assert_eq!(worker.shared.held.count(), 1, "its outcome is on its way");

    let t = now(&store);
    let recorder = PanickingRecorder::default();
    metrics::with_local_recorder(&recorder, || worker.settler.settle(&worker.shared, t));
    assert!(recorder.panics() > 0, "the recorder was used");
    assert!(store.rows().is_empty(), "the store took the outcome");
    assert_eq!(
        worker.shared.held.count(),
        0,
        "a settled message stays held after the recorder panicked"
    );
}

/// The same recorder, panicking while the watchdog counts a timed-out attempt: the attempt's
/// outcome is on its way all the same, and settling it leaves nothing held.
#[test]
fn a_panicking_metrics_recorder_leaves_no_timed_out_attempt_held() {
    let config = Config {
        handler_timeout: Duration::from_secs(1),
        lease: Duration::from_secs(6),
        retry_policy: RetryPolicy::new().max_attempts(5),
        ..seeded_config()
    };
    let (store, mut worker, now) = one_message_worker(&config);
    worker.claim(now(&store));
    worker.start(
        Plan::HangUntil(store.now() + Duration::from_secs(60)),
        now(&store),
    );
    store.advance(Duration::from_secs(3));

    let t = now(&store);
    let recorder = PanickingRecorder::default();
    metrics::with_local_recorder(&recorder, || worker.watchdog(t));
    assert!(recorder.panics() > 0, "the recorder was used");
    worker.settler.settle(&worker.shared, now(&store));
    assert_eq!(
        worker.shared.held.count(),
        0,
        "the timed-out attempt stays held after the recorder panicked"
    );
    let rows = store.rows();
    assert_eq!(rows[0].locked_by, None, "its retry was saved: {rows:?}");
    assert_eq!(worker.shared.counters.snapshot().timed_out, 1);
}

/// A handler whose own retry policy panics whenever it is asked.
#[derive(serde::Serialize, serde::Deserialize)]
struct PolicyPanics;

impl crate::Message for PolicyPanics {
    const MESSAGE_TYPE: &'static str = KNOWN;
}

impl crate::Handler for PolicyPanics {
    fn process(self, _: &mut crate::Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }

    fn retry_policy() -> Option<RetryPolicy> {
        panic!("the policy is not ready")
    }
}

static POLICY_PANICS: crate::HandlerRegistration =
    crate::HandlerRegistration::new::<PolicyPanics>("PolicyPanics");

/// The watchdog and the claimer judge an attempt that ran past its timeout by the handler's
/// retry policy, which is the application's code and may panic. The warden's and the claimer's
/// threads survive a panic, but the attempt they gave up on must still get its outcome: without
/// one it stayed held, its lease renewed by every heartbeat, and the message never ran again
/// while the process lived.
#[test]
fn a_panicking_retry_policy_leaves_no_timed_out_attempt_held() {
    let config = Config {
        handler_timeout: Duration::from_secs(1),
        lease: Duration::from_secs(6),
        retry_policy: RetryPolicy::new()
            .max_attempts(5)
            .initial_backoff(Duration::from_millis(1))
            .max_backoff(Duration::from_millis(1)),
        ..seeded_config()
    };
    let registry = Registry::from_registrations([&POLICY_PANICS]).expect("one handler");
    let (store, mut worker, now) = one_message_worker_handled_by(registry, &config);
    // Attempt 1 hangs; the watchdog gives up on it.
    worker.claim(now(&store));
    worker.start(
        Plan::HangUntil(store.now() + Duration::from_secs(60)),
        now(&store),
    );
    store.advance(Duration::from_secs(3));
    let shared = Arc::clone(&worker.shared);
    shared.survive("warden", Duration::ZERO, || worker.watchdog(now(&store)));
    worker.settler.settle(&worker.shared, now(&store));
    assert_eq!(
        worker.shared.held.count(),
        0,
        "the timed-out attempt stays held after its policy panicked"
    );
    let rows = store.rows();
    assert_eq!(rows[0].locked_by, None, "its retry was saved: {rows:?}");

    // Claim 2 finds its thread still stuck: that attempt too is counted and saved.
    store.advance(Duration::from_secs(1));
    shared.survive("claimer", Duration::ZERO, || worker.claim(now(&store)));
    worker.settler.settle(&worker.shared, now(&store));
    let rows = store.rows();
    assert_eq!(
        (rows[0].locked_by, rows[0].attempts),
        (None, 2),
        "the still-stuck attempt was saved: {rows:?}"
    );
    assert_eq!(worker.shared.counters.snapshot().timed_out, 1);
}

/// A handler that succeeds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Succeeds {}

impl crate::Message for Succeeds {
    const MESSAGE_TYPE: &'static str = KNOWN;
}

impl crate::Handler for Succeeds {
    fn process(self, _: &mut crate::Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

static SUCCEEDS: crate::HandlerRegistration =
    crate::HandlerRegistration::new::<Succeeds>("Succeeds");

/// A recorder that panics while the worker times a handler that succeeded: the attempt counts
/// as succeeded, not as a panic to retry, which would run the handler once more.
#[test]
fn a_panicking_metrics_recorder_fails_no_succeeded_attempt() {
    let config = seeded_config();
    let registry = Registry::from_registrations([&SUCCEEDS]).expect("one handler");
    let (store, mut worker, now) = one_message_worker_handled_by(registry, &config);
    worker.claim(now(&store));
    let mut job = worker.jobs.try_recv().expect("dispatched");
    let recorder = PanickingRecorder::default();
    let settlement = metrics::with_local_recorder(&recorder, || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let exchanges = crate::destination::Exchanges::default();
            super::handlers::process(&worker.shared, &mut job.message, job.job, &exchanges)
        }))
    });
    assert!(recorder.panics() > 0, "the recorder was used");
    assert_eq!(settlement.ok(), Some(Settlement::Done));
}

/// A chained message whose predecessor's lease another claim took while it ran (the heartbeat
/// failed for longer than a lease, then came back) is given back by the heartbeat, not run:
/// the other claim's attempt of the predecessor may come after it.
#[test]
fn a_chain_behind_a_lost_lease_is_given_back_not_run() {
    let config = one_handler_config();
    let store = MemoryStore::with_manual_clock();
    let base = Instant::now();
    let now = |store: &MemoryStore| base + store.now();
    let keyed: Vec<i64> = (0..3)
        .map(|_| store.enqueue(KNOWN, "{}", Some("k")))
        .collect();
    let mut worker = SimWorker::new(&config, &store, now(&store));
    worker.claim(now(&store));
    worker.start(Plan::Succeed, now(&store));
    worker.finish(0, &store);
    worker.settler.settle(&worker.shared, now(&store));
    assert_eq!(worker.queued.len(), 1, "the settlement leased a chain");

    worker.start(Plan::Succeed, now(&store));
    assert_eq!(worker.running[0].job.message.position, keyed[1]);
    assert_eq!(worker.running[0].job.chain.len(), 1, "{:?}", store.rows());
    store.advance(config.lease + Duration::from_secs(1));
    let other = store
        .claim(ClaimToken::new(), ClaimLimit::messages(10), config.lease)
        .unwrap();
    assert_eq!(
        other.iter().map(|m| m.position).collect::<Vec<_>>(),
        [keyed[1]]
    );

    worker.heartbeat(now(&store));
    worker.finish(0, &store);
    worker.start(Plan::Succeed, now(&store));
    assert!(
        worker.running.is_empty(),
        "the chained message ran behind a lost lease"
    );
    worker.settler.settle(&worker.shared, now(&store));
    let last = store
        .rows()
        .into_iter()
        .find(|row| row.position == keyed[2]);
    assert_eq!(
        last.map(|row| (row.locked_by, row.attempts)),
        Some((None, 0)),
        "given back, the attempt not counted"
    );
}
