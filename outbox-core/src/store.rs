//! What a storage backend implements for the worker: the [`Store`] trait and the types it
//! exchanges with the worker. Applications only name these to write a backend of their own;
//! `outbox-diesel`'s `DieselStore` implements it for PostgreSQL, MySQL and SQLite, and
//! [`MemoryStore`](crate::testing::MemoryStore) (feature `testing`) in memory, with faults
//! on demand.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::answer::Answer;
use crate::error::ProcessError;
use crate::headers::Headers;
use crate::message_id::MessageId;
use crate::priority::Priority;
use crate::subscription::Subscription;

/// What a message that is a delivery to one of the workers' destinations (a replay or a
/// resend) carries where a subscription's delivery carries the subscription's id
/// ([`ClaimedMessage::subscription_id`](ClaimedMessage::subscription_id)):
/// `destination:<name>`. Its payload goes to that destination as it is, without the type's
/// handler.
pub const DESTINATION_TARGET_PREFIX: &str = "destination:";

/// A paced destination's turns: a bucket of them, and the line of messages deferred to one.
/// Times are microseconds on one clock: the process's own for a limit of one process, the
/// store's for a limit
/// [`across_processes`](crate::destination::RateLimit::across_processes), which the store
/// keeps as these four numbers ([`SharedTurns::take_turn`]). This is the state a store keeps; the
/// pacing that takes and books turns lives with the destinations (`destination::pace`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Turns {
    /// Turns in the bucket; below zero, turns handed out ahead.
    pub tokens: f64,
    /// When the bucket was last filled up.
    pub refilled: i64,
    /// The last turn handed to a deferred message: the next deferral gets the turn after it.
    pub booked_until: Option<i64>,
    /// When a delivery last took a turn.
    pub last_turn: i64,
}

impl Turns {
    /// A full bucket of `burst` turns at `now`, and nobody in line.
    pub fn full(burst: f64, now: i64) -> Self {
        Turns {
            tokens: burst,
            refilled: now,
            booked_until: None,
            last_turn: now,
        }
    }
}

/// Identifies one claim: the worker that made it writes it into the rows it leases, and every
/// later change to those rows is conditioned on it (fencing). A worker whose lease expired and
/// whose rows were claimed again by another cannot touch them any more.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimToken(uuid::Uuid);

impl ClaimToken {
    /// A new, unique token.
    pub fn new() -> Self {
        ClaimToken(uuid::Uuid::new_v4())
    }

    /// The token as a UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimToken({})", self.0)
    }
}

impl fmt::Display for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// How much one claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimLimit {
    /// At most this many messages.
    pub messages: usize,
    /// At most this many bytes of payload in all.
    pub bytes: usize,
    /// Whether the oldest due message may be claimed alone when its payload is larger than
    /// `bytes` (the worker allows it when it holds nothing, so that no message is too large
    /// ever to be delivered).
    pub oversized_alone: bool,
}

impl ClaimLimit {
    /// At most `messages` messages, whatever their size.
    pub fn messages(messages: usize) -> Self {
        ClaimLimit {
            messages,
            bytes: usize::MAX,
            oversized_alone: true,
        }
    }

    /// How many of `sizes` (payload sizes in due order) a claim under this limit takes.
    pub fn take(&self, sizes: impl IntoIterator<Item = usize>) -> usize {
        let mut total = 0usize;
        let mut taken = 0;
        for size in sizes.into_iter().take(self.messages) {
            total = total.saturating_add(size);
            if total > self.bytes && !(taken == 0 && self.oversized_alone) {
                break;
            }
            taken += 1;
            if total > self.bytes {
                break;
            }
        }
        taken
    }
}

/// A message leased to this worker.
#[derive(Debug, Clone)]
pub struct ClaimedMessage {
    /// The row's position in the outbox (its auto-increment id).
    pub position: i64,
    /// The message's stable id.
    pub message_id: MessageId,
    /// The message's type string.
    pub message_type: String,
    /// The message's JSON payload.
    pub payload: String,
    /// The message's ordering key.
    pub ordering_key: Option<String>,
    /// Which attempt this claim starts, from 1.
    pub attempt: u32,
    /// When the message was enqueued.
    pub enqueued_at: SystemTime,
    /// When an operator's pause that held the message (of its type or its destination) last
    /// ended, if one did: how long a message may wait without spending attempts
    /// ([`max_deferral`](crate::WorkerBuilder::max_deferral)) counts from the later of this and
    /// its enqueue, so that time spent paused never counts against it.
    pub resumed_at: Option<SystemTime>,
    /// The headers set at enqueue.
    pub headers: Headers,
    /// The subscription this message is a delivery for ([`crate::subscription`]), if it is
    /// one; or, for a replay or a resend to one of the workers' destinations,
    /// `destination:<name>` ([`DESTINATION_TARGET_PREFIX`]).
    pub subscription_id: Option<String>,
    /// Its priority: how soon it was claimed against other due messages, and whether a paced
    /// destination lets it ahead of the turns it gave the backlog.
    pub priority: Priority,
}

/// What became of a claimed message.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// Processed: remove it from the outbox.
    Done,
    /// Failed, worth another attempt after `delay`.
    Retry {
        /// How long to wait.
        delay: Duration,
        /// The failure, stored as the message's last error.
        error: String,
    },
    /// Failed for good: move it to the dead-letter table.
    DeadLetter {
        /// Why, stored with the dead letter.
        error: String,
    },
    /// Not processed (the worker is stopping, or the lease was too short to start): give it back
    /// at once, without counting the attempt.
    Release,
    /// Not processed, and not to be tried before `delay` has passed (no handler for its type
    /// yet, during a rolling deploy): give it back without counting the attempt, keeping
    /// `reason` as its last error.
    Defer {
        /// How long to wait.
        delay: Duration,
        /// Why, stored as the message's last error.
        reason: String,
    },
    /// Not processed: an operator paused its message type or its destination. Give it back
    /// without counting the attempt, keeping `reason` as its last error, and keep it out of
    /// claims until [`Pauses::release_paused`] makes it due again.
    Pause {
        /// Why, stored as the message's last error.
        reason: String,
    },
}

impl Settlement {
    /// The text this settlement stores (its error or reason), if any.
    pub fn text(&self) -> Option<&str> {
        match self {
            Settlement::Retry { error, .. } | Settlement::DeadLetter { error } => Some(error),
            Settlement::Defer { reason, .. } | Settlement::Pause { reason } => Some(reason),
            Settlement::Done | Settlement::Release => None,
        }
    }

    /// The same settlement storing `text` instead of its own.
    pub fn with_text(&self, text: String) -> Settlement {
        match self {
            Settlement::Retry { delay, .. } => Settlement::Retry {
                delay: *delay,
                error: text,
            },
            Settlement::DeadLetter { .. } => Settlement::DeadLetter { error: text },
            Settlement::Defer { delay, .. } => Settlement::Defer {
                delay: *delay,
                reason: text,
            },
            Settlement::Pause { .. } => Settlement::Pause { reason: text },
            other => other.clone(),
        }
    }
}

/// One exchange with a destination during an attempt at a message: a row of the delivery log.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// The destination's name (`subscription:<id>` for a subscription's).
    pub destination: String,
    /// How it went: `delivered`, `failed` (retryable), `rejected` (for good) or
    /// `pushed_back` (the destination asked to wait; no attempt counted).
    pub outcome: &'static str,
    /// What the other side answered, where the destination says.
    pub answer: Option<Answer>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// When the exchange started.
    pub started_at: SystemTime,
    /// How long it took.
    pub latency: Duration,
}

/// What the delivery log keeps of one attempt: the exchanges with destinations it made, with
/// the message's type and attempt number. A store writes it in the transaction of the
/// attempt's outcome, so the log is never out of step with the message.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptLog {
    /// The message's type.
    pub message_type: String,
    /// Which attempt this was, from 1.
    pub attempt: u32,
    /// The subscription the message is a delivery for, if it is one.
    pub subscription_id: Option<String>,
    /// The exchanges, in the order they were made.
    pub exchanges: Vec<Exchange>,
}

/// A settlement for one message of one claim.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The claim the message was leased under.
    pub token: ClaimToken,
    /// The message's position.
    pub position: i64,
    /// The message's id, for logs.
    pub message_id: MessageId,
    /// The message's ordering key: when the outcome takes the message out of the outbox, the
    /// next message of its key is promoted.
    pub ordering_key: Option<String>,
    /// What to do with it.
    pub settlement: Settlement,
    /// What the attempt exchanged with destinations, for the delivery log (`None`: nothing,
    /// or the attempt did not run).
    pub log: Option<Box<AttemptLog>>,
}

impl Outcome {
    /// The outcome `settlement` of `message`, leased under `token`.
    pub fn of(token: ClaimToken, message: &ClaimedMessage, settlement: Settlement) -> Outcome {
        Outcome {
            token,
            position: message.position,
            message_id: message.message_id,
            ordering_key: message.ordering_key.clone(),
            settlement,
            log: None,
        }
    }

    /// The same outcome keeping `exchanges` in the delivery log (none: nothing to keep).
    pub fn logging(mut self, message: &ClaimedMessage, exchanges: Vec<Exchange>) -> Outcome {
        if !exchanges.is_empty() {
            let subscription_id = message
                .subscription_id
                .clone()
                .filter(|target| !target.starts_with(DESTINATION_TARGET_PREFIX));
            self.log = Some(Box::new(AttemptLog {
                message_type: message.message_type.clone(),
                attempt: message.attempt,
                subscription_id,
                exchanges,
            }));
        }
        self
    }
}

/// The message a [`TransactionalSettlement::settle_within`] settles: its claim, position and ordering key.
#[derive(Debug, Clone, Copy)]
pub struct SettleTarget<'a> {
    /// The claim that holds it now.
    pub token: ClaimToken,
    /// Its position.
    pub position: i64,
    /// Its ordering key, whose next message the settlement promotes.
    pub ordering_key: Option<&'a str>,
}

/// The next messages of ordering keys that a settlement may lease to the worker itself (see
/// [`Store::settle_and_lease`]).
#[derive(Debug, Clone, Copy)]
pub struct SuccessorLease {
    /// The claim they are leased under.
    pub token: ClaimToken,
    /// For how long.
    pub lease: Duration,
    /// The most payload bytes the messages leased for one key may have together: a key's
    /// next message larger than this is made claimable, not leased, so that the worker's byte
    /// cap holds.
    pub max_bytes: usize,
    /// The most messages of one key to lease, from its front, in order (one at least): the
    /// worker runs them in order on one handler thread, each only once the one before it
    /// succeeded, and gives the rest back at the first that did not.
    pub per_key: usize,
}

/// Where the worker's messages live: the core every store implements. `outbox-diesel`
/// implements it for PostgreSQL, MySQL and SQLite; it is public so that other storage can be
/// plugged in. A worker needs the capabilities of [`WorkerStore`] and a
/// [`TransactionalSettlement`] besides; each is a trait of its own, with no method that does
/// nothing by default, so a store states in its own code what it does for each. The store kit
/// ([`testing::store_kit`](crate::testing::store_kit), feature `testing`) states the contract
/// as checks a store runs on itself.
pub trait Store: Send + Sync + 'static {
    /// Checks, once at start-up, that the store is reachable and ready and can lend the worker
    /// `connections` connections at once, so that a wrong URL, a missing migration or a pool too
    /// small is an error from `spawn` rather than a wedged worker.
    fn check(&self, connections: usize) -> Result<(), StoreError>;

    /// Leases due messages under `token` for `lease`, oldest due first, within `limit`,
    /// taking at most the first pending message of each ordering key.
    fn claim(
        &self,
        token: ClaimToken,
        limit: ClaimLimit,
        lease: Duration,
    ) -> Result<Vec<ClaimedMessage>, StoreError>;

    /// Applies `outcomes` atomically. An outcome whose row is no longer leased under its token is
    /// skipped; returns the positions of those skipped (fenced) outcomes.
    fn settle(&self, outcomes: &[Outcome]) -> Result<Vec<i64>, StoreError>;

    /// Settles like [`settle`](Store::settle), and leases under `successors.token` the message
    /// that each settled head leaves at the front of its ordering key, where that message is due
    /// now and within `successors.max_bytes`: the key's next message goes to a handler without
    /// waiting for a claim, one round trip per message of a key instead of two. Where that one is
    /// leased, the messages after it too, up to `successors.per_key` in all, as long as each is
    /// due and the key's leased bytes stay within `successors.max_bytes`: a prefix of the key,
    /// with no gap. All but the first stay parked while leased (a claim must not take one, nor
    /// a release make one claimable, ahead of the messages before it). Returns the fenced
    /// positions and the leased messages, in order of position. A store that cannot lease in
    /// the settlement's transaction settles and leases nothing: the next claim takes the
    /// successors.
    fn settle_and_lease(
        &self,
        outcomes: &[Outcome],
        successors: &SuccessorLease,
    ) -> Result<(Vec<i64>, Vec<ClaimedMessage>), StoreError>;

    /// Extends the leases of messages still held by their claims to `lease` from now (the
    /// worker's heartbeat while they wait or run). Returns the positions whose leases another
    /// claim holds now: their outcomes will be fenced. A message that is no longer in the store,
    /// or no longer leased (settled, or given back, since the worker listed it), is not renewed
    /// and not returned: the heartbeat races the worker's own settlements.
    fn extend_leases(
        &self,
        leases: &[(ClaimToken, i64)],
        lease: Duration,
    ) -> Result<Vec<i64>, StoreError>;

    /// A cheap round trip that succeeds when the store is reachable: it tells "the database is
    /// down" (wait) from "the database refuses this one outcome" (do something about it).
    fn ping(&self) -> Result<(), StoreError>;

    /// The safety net of per-key order: makes the first pending message of every ordering key
    /// claimable where concurrent transactions left none so (a store that parks the messages
    /// behind a key's head). The worker calls it every few seconds; returns how many. A store
    /// that never parks a key's head returns `Ok(0)`, but must say so: a store that parks and
    /// forgets this stalls keys for good.
    fn promote_stranded(&self) -> Result<usize, StoreError>;

    /// Deletes what the store keeps only for a while and whose time has passed: idempotency
    /// keys past their window, and, where the application configured a retention, old dead
    /// letters, received webhook ids and the delivery log. A bounded amount of work per call;
    /// the worker calls it every few seconds.
    fn prune(&self) -> Result<Pruned, StoreError>;

    /// How much waits in the store, for the worker's gauges (sampled every
    /// [`backlog_interval`](crate::WorkerBuilder::backlog_interval)): one cheap query. `None`
    /// if the store cannot tell.
    fn backlog(&self) -> Result<Option<Backlog>, StoreError>;

    /// What keeps the store from lending the worker the connections it holds, if anything has
    /// for a while: the pool the application shares with the worker lends none, so the worker
    /// shares the connections it has, more slowly (`None` for a store without such a pool).
    /// The worker's [`health`](crate::WorkerHandle::health) reports it, and is unhealthy while
    /// it lasts.
    fn connection_shortage(&self) -> Option<String>;
}

/// A store's record of the worker's destinations, shared with other workers and operators.
pub trait SharedDestinations: Send + Sync {
    /// Shares the health of the worker's destinations with other workers and with operators,
    /// in one transaction: records the destinations the store does not know yet, reads them
    /// (locked against concurrent changes), hands them to `reconcile` (which applies what the
    /// store says: an operator enabled or disabled one, another worker was told `410 Gone`)
    /// and writes the reports it returns. The worker calls it when it starts and every few
    /// seconds. The store kit expects the records to be kept: a store that forgets a disable
    /// lets another worker deliver to a receiver that said it is gone.
    fn sync_destinations(
        &self,
        destinations: &[SyncedDestination<'_>],
        reconcile: &mut dyn FnMut(&[StoredDestination]) -> Vec<DestinationReport>,
    ) -> Result<(), StoreError>;
}

/// A store that keeps the turns of rate limits
/// [`across_processes`](crate::destination::RateLimit::across_processes).
pub trait SharedTurns: Send + Sync {
    /// Takes a turn of a destination's rate limit across processes: hands `take` the
    /// [`Turns`] the store keeps for destination `name` (of `kind`; `None` before the first)
    /// and the store's clock in microseconds, and keeps the turns it returns, with the
    /// destination locked meanwhile so that workers take turns one at a time. The worker calls
    /// it for each paced delivery. An error (the store is down) makes the message wait a
    /// second without counting an attempt, and the worker says why in its log; a store that
    /// never shares turns fails the store kit, and limits across processes would never pass.
    fn take_turn(
        &self,
        name: &str,
        kind: &str,
        take: &mut dyn FnMut(Option<Turns>, i64) -> Turns,
    ) -> Result<(), StoreError>;
}

/// A store that keeps an operator's pauses of message types and destinations.
pub trait Pauses: Send + Sync {
    /// The message types and destinations an operator paused, which the worker reads every few
    /// seconds: it settles a claimed message of a paused type, or for a paused destination, as
    /// [`Settlement::Pause`]. A store that keeps no pauses returns none.
    fn paused(&self) -> Result<Paused, StoreError>;

    /// Makes every message settled [`Settlement::Pause`] due at once, except those of a message
    /// type that is still paused (a message for a paused destination is paused again by the
    /// next worker that claims it); returns how many. Resuming runs it, and so does every
    /// worker when it sees a pause end, which catches a settlement that raced the resume.
    fn release_paused(&self) -> Result<usize, StoreError>;
}

/// A store that keeps subscriptions ([`crate::subscription`]) and fans events out to them.
pub trait Subscriptions: Send + Sync {
    /// The subscriptions the store keeps, enabled or not: the worker delivers to them, reading
    /// them every few seconds. A store that keeps none returns none. Every subscription
    /// committed before the read began must be in it: the worker takes a delivery whose
    /// subscription a read made after its claim does not return for one of a removed
    /// subscription, and dead-letters it.
    fn subscriptions(&self) -> Result<Vec<Subscription>, StoreError>;

    /// Fans the event at `target` out to its subscribers: in one transaction, one delivery (a
    /// message of the event's id, type, payload and headers, for one subscription) for each
    /// enabled subscription of the event's owner whose filter takes its type and that was
    /// created no later than it, and the event removed (its key's next message promoted), if
    /// the claim `target.token` still holds it. Returns how many deliveries it made, or `None`
    /// if the claim no longer holds the event (nothing written).
    fn fan_out(&self, target: &SettleTarget<'_>) -> Result<Option<usize>, StoreError>;

    /// Makes the deliveries of subscription `id` that wait paused (it was disabled) due at
    /// once, as the subscription is enabled again; returns how many.
    fn release_subscription(&self, id: &str) -> Result<usize, StoreError>;
}

/// How a store tells the worker that new messages were committed.
pub trait Notifications: Send + Sync {
    /// Whether [`listen`](Notifications::listen) gives a listener, which then holds a
    /// connection of its own (counted by the worker before it calls [`check`](Store::check)).
    fn listens(&self) -> bool;

    /// A way to be told promptly that new messages were committed (e.g. PostgreSQL
    /// `LISTEN`), or `None` if the store can only be polled.
    fn listen(&self) -> Result<Option<Box<dyn Listener>>, StoreError>;

    /// Whether enqueues in this process should wake the worker directly. Stores whose
    /// [`listen`](Notifications::listen) reports commits exactly return `false`: an in-process
    /// wake comes before the commit and would only cost an empty claim.
    fn wants_local_wakeups(&self) -> bool;
}

/// Everything a worker asks of its store besides a [`TransactionalSettlement`]: implemented
/// for every type that implements each part, and what the worker's threads share.
pub trait WorkerStore:
    Store + SharedDestinations + SharedTurns + Pauses + Subscriptions + Notifications
{
}

impl<S> WorkerStore for S where
    S: Store + SharedDestinations + SharedTurns + Pauses + Subscriptions + Notifications
{
}

/// A store that settles a claimed message in the same database transaction as a handler's own
/// writes: what exactly-once handlers (`outbox_diesel::exactly_once`) stand on.
pub trait TransactionalSettlement: Send + Sync + 'static {
    /// The connection the handler's work runs on: the one of the store's pool. A store without
    /// transactions names [`std::convert::Infallible`] and refuses.
    type Connection: 'static;

    /// Settles a claimed message as done in one database transaction with `work`, which gets
    /// the store's connection: the work's writes and the message's removal (only if `token`
    /// still holds it) commit together, or neither does. The removal comes last, so that the
    /// transaction locks the message's row only at its end. Returns the work's error after
    /// rolling back, a retryable error if the claim no longer holds the message (the work
    /// rolled back) or the database failed.
    fn settle_within(
        &self,
        message: &SettleTarget<'_>,
        work: &mut dyn FnMut(&mut Self::Connection) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessError>;
}

/// What an operator paused: [`Pauses::paused`]. Each is a name with the operator's reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Paused {
    /// Paused message types, by type string.
    pub message_types: BTreeMap<String, String>,
    /// Paused destinations, by name.
    pub destinations: BTreeMap<String, String>,
}

impl Paused {
    /// Nothing paused.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same, with `message_type` paused for `reason`.
    pub fn message_type(
        mut self,
        message_type: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        self.message_types
            .insert(message_type.into(), reason.into());
        self
    }

    /// The same, with destination `name` paused for `reason`.
    pub fn destination(mut self, name: impl Into<String>, reason: impl Into<String>) -> Self {
        self.destinations.insert(name.into(), reason.into());
        self
    }

    /// Whether nothing is paused.
    pub fn is_empty(&self) -> bool {
        self.message_types.is_empty() && self.destinations.is_empty()
    }
}

/// What one [`Store::prune`] call deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// Idempotency keys whose window had passed.
    pub idempotency_keys: usize,
    /// Dead letters older than their retention.
    pub dead_letters: usize,
    /// Received webhook ids older than their retention.
    pub inbox_ids: usize,
    /// Attempts of the delivery log past its retention.
    pub logged_attempts: usize,
    /// Messages of the archive past its window.
    pub archived: usize,
    /// Groups (`EnqueueOptions::group` in `outbox-diesel`) left without a pending message,
    /// which claims no longer visit.
    pub empty_groups: usize,
}

impl Pruned {
    /// Rows deleted in all.
    pub fn total(&self) -> usize {
        self.idempotency_keys
            + self.dead_letters
            + self.inbox_ids
            + self.logged_attempts
            + self.archived
            + self.empty_groups
    }
}

/// How long a transaction may keep the database from cleaning up before operators are warned:
/// reports and dumps take minutes, and a minute of held-back clean-up costs little.
pub const LONG_TRANSACTION: Duration = Duration::from_secs(60);

/// How much waits in a store: [`Store::backlog`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backlog {
    /// Messages in the outbox: due, delayed, held by a worker, or parked behind their key.
    pub pending: u64,
    /// How long the oldest due message that no worker holds has waited since it became due;
    /// zero when none waits. It stays near zero while the workers keep up.
    pub oldest_due_age: Duration,
    /// How long the oldest transaction that keeps the database from cleaning up has been open
    /// (PostgreSQL: the oldest holding back the xmin horizon in this database; MySQL: the
    /// oldest InnoDB transaction), if the store can tell. A transaction open for minutes (a
    /// report, a `pg_dump`, a request stuck mid-transaction) lets dead rows pile up in the
    /// outbox table and its indexes.
    pub oldest_transaction_age: Option<Duration>,
    /// Rows the database cannot clean up yet (PostgreSQL: dead tuples in the outbox table;
    /// MySQL: the undo history list), if the store can tell.
    pub dead_rows: Option<u64>,
}

impl Backlog {
    /// A backlog of `pending` messages whose oldest due one has waited `oldest_due_age`.
    pub fn new(pending: u64, oldest_due_age: Duration) -> Self {
        Backlog {
            pending,
            oldest_due_age,
            oldest_transaction_age: None,
            dead_rows: None,
        }
    }

    /// The age of the oldest open transaction if it has been open for [`LONG_TRANSACTION`] or
    /// longer: what the CLI's `stats` and the admin pages warn about.
    pub fn long_transaction(&self) -> Option<Duration> {
        self.oldest_transaction_age
            .filter(|age| *age >= LONG_TRANSACTION)
    }

    /// The same backlog, with what holds the database's clean-up back.
    pub fn with_horizon(
        mut self,
        oldest_transaction_age: Option<Duration>,
        dead_rows: Option<u64>,
    ) -> Self {
        self.oldest_transaction_age = oldest_transaction_age;
        self.dead_rows = dead_rows;
        self
    }
}

/// A destination a worker shares through the store: [`SharedDestinations::sync_destinations`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncedDestination<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its kind (`webhook`, `jetstream`, ...).
    pub kind: &'a str,
}

impl<'a> SyncedDestination<'a> {
    /// Destination `name` of `kind`.
    pub fn new(name: &'a str, kind: &'a str) -> Self {
        SyncedDestination { name, kind }
    }
}

/// A destination as the store keeps it: [`SharedDestinations::sync_destinations`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredDestination {
    /// The destination's name.
    pub name: String,
    /// Why it is disabled, if the store says it is: a `410 Gone` some worker was told, or an
    /// operator's decision.
    pub disabled: Option<String>,
    /// How many times an operator has enabled it: a worker that sees the count grow enables its
    /// destination.
    pub enables: i64,
}

impl StoredDestination {
    /// A destination named `name`, disabled for `disabled` if given, enabled `enables` times.
    pub fn new(name: impl Into<String>, disabled: Option<String>, enables: i64) -> Self {
        StoredDestination {
            name: name.into(),
            disabled,
            enables,
        }
    }
}

/// One destination's health as a worker reports it: [`SharedDestinations::sync_destinations`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DestinationReport {
    /// The destination's name.
    pub name: String,
    /// Its kind (`webhook`, `jetstream`, ...).
    pub kind: &'static str,
    /// `healthy`, `held`, `paused` or `disabled`.
    pub state: &'static str,
    /// Retryable failures since the destination last answered.
    pub consecutive_failures: u32,
    /// The last failure while paused, or what the destination said while held.
    pub last_error: Option<String>,
    /// How long until the next probe while paused, or until deliveries resume while held.
    pub probe_in: Option<Duration>,
    /// Why it is disabled.
    pub disabled_reason: Option<String>,
}

/// Waits for a store's notifications.
pub trait Listener: Send {
    /// Blocks for at most `timeout`; `Ok(true)` if new messages may have been committed.
    fn wait(&mut self, timeout: Duration) -> Result<bool, StoreError>;
}

/// The store failed; the worker logs it, waits, and tries again.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {source}")]
pub struct StoreError {
    context: &'static str,
    kind: StoreErrorKind,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// What a [`StoreError`] says about the store: what the worker does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The call failed: the store may be unreachable, or refuse what it was given. The worker
    /// asks the store whether it answers to tell the two apart.
    Failed,
    /// The store answered that it could not do it now: a lock held elsewhere outlasted the
    /// wait for it (MySQL's lock wait timeout, SQLite's busy timeout, a deadlock, a statement
    /// timeout). Nothing about the call itself is refused: the worker waits and tries again,
    /// and never gives up an outcome for it.
    Busy,
}

impl StoreError {
    /// Wraps `source`, saying what the store was doing.
    pub fn new(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StoreError {
            context,
            kind: StoreErrorKind::Failed,
            source: source.into(),
        }
    }

    /// The same error, of `kind`.
    pub fn with_kind(mut self, kind: StoreErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// What the store was doing.
    pub fn context(&self) -> &'static str {
        self.context
    }

    /// What the error says about the store.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(messages: usize, bytes: usize, oversized_alone: bool) -> ClaimLimit {
        ClaimLimit {
            messages,
            bytes,
            oversized_alone,
        }
    }

    #[test]
    fn a_transaction_is_long_from_a_minute_on() {
        let backlog = |age: Option<u64>| {
            Backlog::new(0, Duration::ZERO).with_horizon(age.map(Duration::from_secs), Some(3))
        };
        assert_eq!(backlog(None).long_transaction(), None);
        assert_eq!(backlog(Some(59)).long_transaction(), None);
        assert_eq!(
            backlog(Some(60)).long_transaction(),
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn a_claim_stops_at_the_count_or_the_bytes() {
        assert_eq!(limit(3, 100, false).take([10, 10, 10, 10]), 3);
        assert_eq!(limit(10, 25, false).take([10, 10, 10, 10]), 2);
        assert_eq!(limit(10, 30, false).take([10, 10, 10, 10]), 3);
        assert_eq!(limit(10, 100, false).take([]), 0);
        assert_eq!(ClaimLimit::messages(2).take([usize::MAX, usize::MAX]), 2);
    }

    #[test]
    fn an_oversized_message_goes_alone_only_when_allowed() {
        assert_eq!(limit(10, 5, false).take([10, 1]), 0);
        assert_eq!(limit(10, 5, true).take([10, 1]), 1);
        assert_eq!(
            limit(10, 5, true).take([1, 10]),
            1,
            "only the first may be oversized"
        );
        assert_eq!(limit(0, 5, true).take([10]), 0);
    }

    #[test]
    fn texts_are_swapped_without_changing_the_settlement() {
        let retry = Settlement::Retry {
            delay: Duration::from_secs(2),
            error: "caf\u{e9}".into(),
        };
        assert_eq!(retry.text(), Some("caf\u{e9}"));
        assert_eq!(
            retry.with_text("cafe".into()),
            Settlement::Retry {
                delay: Duration::from_secs(2),
                error: "cafe".into()
            }
        );
        assert_eq!(Settlement::Done.with_text("x".into()), Settlement::Done);
        assert_eq!(Settlement::Release.text(), None);
    }
}
