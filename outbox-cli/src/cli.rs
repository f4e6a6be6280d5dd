//! The command line, as clap types.

use clap::{Args, Parser, Subcommand};

/// What `--help` says after the options: how URLs and JSON output look.
const AFTER_HELP: &str = "\
Database URLs:
  PostgreSQL        postgres://USER[:PASSWORD]@HOST[:PORT]/DB (or postgresql://)
  MySQL or MariaDB  mysql://USER[:PASSWORD]@HOST[:PORT]/DB
  SQLite            sqlite://PATH, file:PATH[?OPTIONS], or a PATH ending .db, .sqlite or .sqlite3

JSON output (--json): each command prints one JSON document on stdout. Times are RFC 3339
strings in UTC with microseconds (e.g. \"2025-01-31T09:15:02.123456Z\"), ages are whole
seconds, payloads are the stored JSON (a string if the stored text is not JSON).

Exit codes: 0 success, 1 error (one `error: ` line on stderr), 2 usage error.";

/// Operate a transactional outbox: run its migrations, look at pending messages and dead
/// letters, re-queue or purge dead letters, see and switch destinations.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// The database: postgres://, postgresql://, mysql://, sqlite://PATH, file:PATH or a path
    /// ending .db, .sqlite or .sqlite3.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        global = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,

    /// Print one JSON document on stdout instead of tables: times as RFC 3339 UTC strings,
    /// ages in seconds (`outbox --help` tells more).
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox tables.
    Migrate,
    /// Pending, in-flight and dead messages by type, with the oldest pending message's age.
    Stats,
    /// Messages waiting in the outbox.
    #[command(subcommand)]
    Pending(PendingCommand),
    /// Messages that failed for good.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Every field of one message, pending or dead, found by its message id (a receiver's
    /// `webhook-id`): headers, attempts, last error, payload pretty-printed.
    Show {
        /// The message id, a UUID.
        message_id: outbox_diesel::MessageId,
    },
    /// Ordering keys held up by a head that failed and waits for a retry, soonest retry first,
    /// with how many messages wait behind each.
    Blocked {
        /// At most this many keys.
        #[arg(long, default_value_t = 100, value_name = "N")]
        limit: u32,
    },
    /// Destinations (webhook endpoints, brokers) as the workers report them: healthy, held (it
    /// asked for no deliveries for a while), paused (failing again and again: deliveries wait
    /// and are probed with backoff) or disabled (it said it is gone, or an operator disabled
    /// it: deliveries are dead-lettered).
    Destinations,
    /// Enable or disable a destination for every worker that delivers to it.
    #[command(subcommand)]
    Destination(DestinationCommand),
    /// Stop processing a message type, or delivering to a destination, on every worker within
    /// a few seconds. Its messages stay pending (no attempt spent, never dead-lettered for it)
    /// until `outbox resume`; a message a worker holds at that moment still finishes.
    Pause {
        /// What to pause.
        #[command(flatten)]
        target: PauseTarget,
        /// Why, shown with the pause and as the paused messages' last error.
        #[arg(long, default_value = "paused by an operator")]
        reason: String,
    },
    /// End a pause: its messages are due at once, and every worker follows within a few
    /// seconds.
    Resume {
        /// What to resume.
        #[command(flatten)]
        target: PauseTarget,
    },
    /// The message types and destinations paused, with why and since when.
    Paused,
    /// Cancel pending messages: each is removed from the outbox and kept with the reason in
    /// `outbox_cancelled`, never dead-lettered and never delivered; a cancelled message that
    /// headed its ordering key lets the key's next message run. A message a worker is
    /// delivering at that moment is left alone, and counted.
    Cancel {
        /// Which messages (every filter given must hold).
        #[command(flatten)]
        target: CancelTarget,
        /// Only messages enqueued at least this long ago (`1h`, `30m`, ...).
        #[arg(long, value_parser = humantime::parse_duration, value_name = "AGE")]
        older_than: Option<std::time::Duration>,
        /// Why: kept with each cancelled message.
        #[arg(long)]
        reason: String,
    },
    /// The delivery log: each exchange with a destination (webhook endpoints, brokers,
    /// subscriptions), newest first, with its outcome, status code, the start of the answer,
    /// the error and how long it took. `outbox attempts MESSAGE_ID` shows one message's.
    Attempts(AttemptsArgs),
    /// Send the archived messages enqueued in a time range (optionally of one type) again, to
    /// one destination or subscription, as new deliveries with their original ids (receivers
    /// drop what they have by id). Only what the store archived is there
    /// (`DieselStore::archive`); a subscription gets only its owner's events of its types.
    Replay {
        /// Where they go.
        #[command(flatten)]
        target: ReplayTargetArgs,
        /// Messages enqueued since this time: RFC 3339 (`2025-01-31T14:00:00Z`) or an age
        /// (`1h`).
        #[arg(long, value_parser = time_or_age, value_name = "TIME")]
        since: std::time::SystemTime,
        /// Messages enqueued before this time (default: now).
        #[arg(long, value_parser = time_or_age, value_name = "TIME")]
        until: Option<std::time::SystemTime>,
        /// Only messages of this type.
        #[arg(long = "type", value_name = "TYPE")]
        message_type: Option<String>,
    },
    /// Send one archived message again to one destination or subscription, with its id.
    Resend {
        /// The message id (a UUID, a receiver's `webhook-id`).
        message_id: outbox_diesel::MessageId,
        /// Where it goes.
        #[command(flatten)]
        target: ReplayTargetArgs,
    },
    /// Subscriptions: endpoints the application's customers add, each taking the event types
    /// it asks for (secrets are read and written with the keys in `OUTBOX_SECRET_KEYS`:
    /// `ID:BASE64` pairs, comma-separated, the first one encrypting).
    #[command(subcommand)]
    Subscription(SubscriptionCommand),
}

/// `outbox attempts`: which logged attempts (every filter given must hold).
#[derive(Debug, Args)]
pub struct AttemptsArgs {
    /// Only this message's attempts (a UUID, a receiver's `webhook-id`).
    pub message_id: Option<outbox_diesel::MessageId>,
    /// Only those to this destination (`subscription:ID` for a subscription's).
    #[arg(long, value_name = "NAME")]
    pub destination: Option<String>,
    /// Only those of deliveries for this subscription.
    #[arg(long, value_name = "ID")]
    pub subscription: Option<String>,
    /// Only those of messages of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub message_type: Option<String>,
    /// Only those that did not deliver (failed, rejected, pushed back).
    #[arg(long)]
    pub failures: bool,
    /// Only those started since this time: RFC 3339 (`2025-01-31T14:00:00Z`) or an age
    /// (`1h`: the last hour).
    #[arg(long, value_parser = time_or_age, value_name = "TIME")]
    pub since: Option<std::time::SystemTime>,
    /// Only those started before this time: RFC 3339 or an age.
    #[arg(long, value_parser = time_or_age, value_name = "TIME")]
    pub until: Option<std::time::SystemTime>,
    /// Only those logged before the attempt with this id: the next page.
    #[arg(long, value_name = "ID")]
    pub before: Option<i64>,
    /// At most this many.
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub limit: u32,
}

/// A time written as RFC 3339, or as an age before now (`90m`).
fn time_or_age(text: &str) -> Result<std::time::SystemTime, String> {
    outbox_diesel::delivery_log::parse_time(text)
}

/// `outbox subscription ...`
#[derive(Debug, Subcommand)]
pub enum SubscriptionCommand {
    /// Add a subscription; its signing secret is printed this once.
    Add(AddSubscription),
    /// List subscriptions, oldest first (never their secrets).
    List {
        /// Only this owner's.
        #[arg(long, value_name = "OWNER")]
        owner: Option<String>,
    },
    /// Every field of one subscription (never its secret).
    Show {
        /// The subscription's id (the first column of `subscription list`).
        id: String,
    },
    /// Stop delivering to it: new events are not fanned out to it, and its waiting deliveries
    /// pause, without spending attempts, until it is enabled.
    Disable {
        /// The subscription's id.
        id: String,
    },
    /// Deliver to it again: its paused deliveries are due at once.
    Enable {
        /// The subscription's id.
        id: String,
    },
    /// Remove it and its waiting deliveries.
    Remove {
        /// The subscription's id.
        id: String,
    },
    /// Give it a new signing secret, printed this once; the old one keeps signing beside it
    /// for the overlap.
    RotateSecret {
        /// The subscription's id.
        id: String,
        /// How long the old secret keeps signing (`24h`, `30m`, ...).
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        overlap: std::time::Duration,
    },
}

/// `outbox subscription add`
#[derive(Debug, Args)]
pub struct AddSubscription {
    /// Where deliveries go (`https://`; `http://` with --allow-http).
    pub url: String,
    /// The event types it takes: exact names, `prefix.*`, or `*` (repeat, or separate with
    /// commas).
    #[arg(
        long = "event-type",
        value_name = "FILTER",
        required = true,
        value_delimiter = ','
    )]
    pub event_types: Vec<String>,
    /// The owner (tenant) whose events it takes.
    #[arg(long)]
    pub owner: Option<String>,
    /// Sign with this secret (`whsec_...`) instead of a new one.
    #[arg(long, env = "OUTBOX_SUBSCRIPTION_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
    /// At most this many deliveries a second.
    #[arg(long, value_name = "PER_SECOND")]
    pub rate_limit: Option<u32>,
    /// A description shown to operators.
    #[arg(long)]
    pub description: Option<String>,
    /// Data to keep with it, a JSON object.
    #[arg(long, value_name = "JSON")]
    pub metadata: Option<String>,
    /// Let the URL be `http://`.
    #[arg(long)]
    pub allow_http: bool,
    /// Reach this address although the address guard refuses it (loopback, private, ...).
    #[arg(long, value_name = "IP")]
    pub allow_address: Vec<std::net::IpAddr>,
    /// Create it disabled.
    #[arg(long)]
    pub disabled: bool,
}

/// A message type, or a destination with `--destination`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct PauseTarget {
    /// The message type (as `outbox stats` lists it).
    #[arg(value_name = "TYPE")]
    pub message_type: Option<String>,
    /// A destination instead (as `outbox destinations` lists it).
    #[arg(long, value_name = "NAME")]
    pub destination: Option<String>,
}

/// A destination, or a subscription with `--subscription`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ReplayTargetArgs {
    /// A destination, as `outbox destinations` lists it.
    #[arg(long, value_name = "NAME")]
    pub destination: Option<String>,
    /// A subscription, by id.
    #[arg(long, value_name = "ID")]
    pub subscription: Option<String>,
}

impl ReplayTargetArgs {
    /// The target the arguments name (clap requires one).
    pub fn target(&self) -> outbox_diesel::delivery_log::ReplayTarget {
        use outbox_diesel::delivery_log::ReplayTarget;
        match (&self.destination, &self.subscription) {
            (Some(name), _) => ReplayTarget::Destination(name.clone()),
            (None, Some(id)) => ReplayTarget::Subscription(id.clone()),
            (None, None) => ReplayTarget::Destination(String::new()),
        }
    }
}

/// Which pending messages a cancel takes: at least one of these, every one given must hold.
#[derive(Debug, Args)]
#[group(required = true, multiple = true)]
pub struct CancelTarget {
    /// The message with this id (a UUID): the event and its deliveries alike, unless
    /// `--subscription` narrows it to one.
    #[arg(long = "id", value_name = "MESSAGE_ID")]
    pub message_id: Option<outbox_diesel::MessageId>,
    /// Messages of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub message_type: Option<String>,
    /// Deliveries to this subscription.
    #[arg(long, value_name = "ID")]
    pub subscription: Option<String>,
}

/// `outbox destination ...`
#[derive(Debug, Subcommand)]
pub enum DestinationCommand {
    /// Deliver to the destination again, whatever disabled or paused it; the workers follow
    /// within a few seconds. Messages dead-lettered meanwhile can then be re-queued.
    Enable {
        /// The destination's name (the first column of `outbox destinations`).
        name: String,
    },
    /// Stop delivering to the destination, as a `410 Gone` does: within a few seconds the
    /// workers dead-letter its messages with the reason, until `outbox destination enable`.
    Disable {
        /// The destination's name (the first column of `outbox destinations`).
        name: String,
        /// Why, recorded with the dead letters.
        #[arg(long, default_value = "disabled by an operator")]
        reason: String,
    },
}

/// `outbox pending ...`
#[derive(Debug, Subcommand)]
pub enum PendingCommand {
    /// List pending messages, oldest first.
    List(ListArgs),
}

/// `outbox dead ...`
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead letters, oldest first.
    List(ListArgs),
    /// Show every field of one dead letter, its payload pretty-printed.
    Show {
        /// The dead letter's position (the first column of `dead list`).
        position: i64,
    },
    /// Move dead letters back into the outbox, to be processed again from the first attempt.
    ///
    /// Positions that do not exist are reported on stderr and make the exit code 1; the others
    /// are still re-queued.
    Requeue {
        /// Which dead letters.
        #[command(flatten)]
        selector: Selector,
        /// Only list what would be re-queued; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete dead letters for good, after asking (unless --yes).
    ///
    /// Positions that do not exist are reported on stderr and make the exit code 1; the others
    /// are still purged.
    Purge {
        /// Which dead letters.
        #[command(flatten)]
        selector: Selector,
        /// Only list what would be purged; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// Filters of a listing.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only messages of this type.
    #[arg(long = "type", value_name = "TYPE")]
    pub message_type: Option<String>,
    /// At most this many messages.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub limit: u32,
}

/// Which dead letters a requeue or purge applies to: exactly one of positions, `--type` or
/// `--all`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Selector {
    /// The dead letters at these positions.
    #[arg(value_name = "POSITION")]
    pub positions: Vec<i64>,
    /// Every dead letter of this message type.
    #[arg(long = "type", value_name = "TYPE")]
    pub message_type: Option<String>,
    /// Every dead letter.
    #[arg(long)]
    pub all: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_selector_takes_exactly_one_kind() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["outbox", "dead"], args].concat());
        assert!(parse(&["requeue", "1", "2"]).is_ok());
        assert!(parse(&["requeue", "--type", "a"]).is_ok());
        assert!(parse(&["purge", "--all", "--yes"]).is_ok());
        assert!(parse(&["requeue"]).is_err());
        assert!(parse(&["requeue", "1", "--all"]).is_err());
        assert!(parse(&["purge", "--type", "a", "--all"]).is_err());
    }

    #[test]
    fn a_cancel_names_messages_and_gives_a_reason() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["outbox"], args].concat());
        assert!(parse(&["cancel", "--type", "a", "--reason", "r"]).is_ok());
        assert!(parse(&[
            "cancel",
            "--type",
            "a",
            "--subscription",
            "s",
            "--reason",
            "r"
        ])
        .is_ok());
        assert!(
            parse(&["cancel", "--reason", "r"]).is_err(),
            "names no message"
        );
        assert!(
            parse(&["cancel", "--type", "a"]).is_err(),
            "gives no reason"
        );
    }
}
