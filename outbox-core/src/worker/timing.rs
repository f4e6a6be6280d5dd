//! Every interval and bound the worker's threads keep, in one place, each with why.

use std::time::Duration;

/// How long after an in-process wake-up that found nothing the claimer looks again: the wake
/// comes before the enqueuing transaction commits, and commits take about this long.
pub const FOLLOW_UPS_MS: [u64; 5] = [1, 4, 16, 64, 256];

/// How long after claiming a message of a raised priority claims stay at `batch_size`: a
/// raised message waits for the next claim, and the smallest claims come soonest (on MariaDB,
/// claims of 256 put a `High` message's p99 at 37-74 ms, claims of 64 at 13-15).
pub const SMALL_CLAIMS_AFTER_RAISED: Duration = Duration::from_secs(1);

/// How long the acker waits for more outcomes to settle together while more are on their way.
/// Each settlement costs a statement and a commit whatever its size; the wait delays only the
/// settlement (and the claim of what waits behind it in its ordering key), never a delivery.
pub const SETTLE_LINGER: Duration = Duration::from_millis(2);

/// The acker's sleeps while it lingers with many outcomes still to come (with few, it receives
/// each as it comes): it stops lingering once every message held has reported, at most this
/// long after.
pub const SETTLE_LINGER_STEP: Duration = Duration::from_micros(200);

/// The acker's longest sleep: how often it looks after the watchdog, the heartbeat and
/// outcomes waiting to be tried again, when no outcome wakes it.
pub const ACKER_TICK: Duration = Duration::from_millis(100);

/// How long past its handler timeout a running message is left before the watchdog counts it
/// timed out: a handler that enforces the timeout itself (a webhook) reports first.
pub const WATCHDOG_GRACE: Duration = Duration::from_secs(1);

/// The shortest lease: the heartbeat renews leases every third of it, and each renewal is a
/// statement.
pub const MIN_LEASE: Duration = Duration::from_secs(2);

/// How many heartbeats fit in a lease: one can fail (a database hiccup) without the lease
/// running out under a running message.
pub const HEARTBEATS_PER_LEASE: u32 = 3;

/// A message whose lease has less than this left (the heartbeat failed) is not started.
pub const START_MARGIN: Duration = Duration::from_millis(500);

/// How long a handler thread runs on through a chain of one key's messages while other jobs
/// wait for a thread: past it, the rest of the chain goes back to the store and the key takes
/// its turn again, so that a key of slow messages keeps no other key (and no raised message)
/// waiting. A chain of fast messages ends well within it.
pub const CHAIN_SLICE: Duration = Duration::from_millis(2);

/// The longest setting of a duration (handler timeout, lease, poll interval, grace), and the
/// longest delay stored with a message: beyond, timestamps overflow on some backend, and no
/// outbox setting needs more.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Backoff after a failed claim (the database is unreachable): first pause and cap.
pub const CLAIM_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Backoff while outcomes cannot be saved because the database is unreachable.
pub const SETTLE_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// Backoff before an outcome the database refused (while answering otherwise) is tried again.
pub const REFUSED_RETRY: (Duration, Duration) =
    (Duration::from_millis(20), Duration::from_millis(500));

/// Backoff before the listener reconnects.
pub const LISTEN_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Times an outcome may be refused before its text is reduced to a short ASCII one, and times
/// the reduced one may be refused before the outcome is given up (its message returns when its
/// lease runs out).
pub const REFUSALS_BEFORE_REDUCING: u32 = 3;
/// See [`REFUSALS_BEFORE_REDUCING`].
pub const REFUSALS_BEFORE_GIVING_UP: u32 = 3;

/// How long one store call may run before the worker reports itself unhealthy: a claim, a
/// settlement or a heartbeat takes milliseconds, the slowest chore (a backlog count over
/// millions of rows) about a second; a call past this is stuck (a connection whose peer
/// vanished, a lock held elsewhere), and the messages it holds will be run by another worker
/// once their leases end.
pub const STUCK_STORE_CALL: Duration = Duration::from_secs(30);

/// The shortest deferral bound by default, whatever the retry policy: a policy of quick retries
/// (seconds in all) must not make a pause of its destination dead-letter its messages at once.
pub const MIN_DEFAULT_DEFERRAL: Duration = Duration::from_secs(3600);

/// Store errors in a row after which the worker reports itself unhealthy.
pub const UNHEALTHY_STORE_ERRORS: u32 = 5;

/// The delay of a retry after a panic the worker could not attribute to a policy (the
/// handler's own `retry_policy()` panicked).
pub const PANIC_RETRY_DELAY: Duration = Duration::from_secs(60);

/// How long the listener waits for a notification before it checks whether it should stop.
pub const LISTEN_WAIT: Duration = Duration::from_millis(200);

/// How often the claimer runs the store's safety net for per-key order
/// ([`Store::promote_stranded`](crate::store::Store::promote_stranded)) and its pruning
/// ([`Store::prune`](crate::store::Store::prune)): the longest a key whose head concurrent
/// transactions left parked waits. The net reads one index entry per parked key; a prune
/// deletes a bounded number of rows.
pub const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(5);

/// Error texts are stored in the outbox row; receivers' bodies can be large.
pub const MAX_ERROR_LEN: usize = 2000;
/// The length of a reduced (ASCII-only) error text.
pub const MAX_REDUCED_ERROR_LEN: usize = 200;
