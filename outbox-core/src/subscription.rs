//! Subscriptions: endpoints an application's own customers add and remove while the workers
//! run, each taking the events of the types it asks for, delivered to it independently.
//!
//! Destinations are compiled in; subscriptions are data. A message type routed to
//! [`SUBSCRIBERS`] (`#[outbox_handler("invoice.paid", deliver_to = "subscribers")]`) is an
//! *event*: its enqueue stays one `INSERT`, and the worker that claims it fans it out, in the
//! transaction that settles it, into one *delivery* per matching subscription (an enabled
//! subscription of the event's owner whose filter takes its type, created no later than the
//! event). The fan-out happens once: it commits together with the event's removal, fenced by
//! the claim, so a crash in the middle of it leaves the event to be fanned out again, whole.
//!
//! Each delivery is a message of its own: the event's id, type, payload and headers, for one
//! subscription, with its own attempts, backoff, dead letter and re-queue, and per-key order
//! within that subscription (its ordering key is the event's, prefixed by the subscription).
//! Each subscription is a destination of its own too, built by the worker's
//! [`SubscriptionTransport`](crate::destination::SubscriptionTransport) (a signed webhook, with `outbox-webhook`), with its own health
//! (paused after failures, probed, disabled by a `410`), rate limit, learned rate and metrics
//! (under the destination name `subscription:<id>`). So a subscriber that fails or is slow
//! spends only its own deliveries' attempts and never re-delivers to another.
//!
//! The store keeps the subscriptions ([`Subscription`]); every worker reads them every few
//! seconds, and at once when it claims a delivery for one it does not know yet.

use std::fmt;

/// The destination name that routes a message type to the subscriptions:
/// `#[outbox_handler("invoice.paid", deliver_to = "subscribers")]`. A worker with
/// [`WorkerBuilder::subscriptions`](crate::WorkerBuilder::subscriptions) takes it; no
/// destination may have this name.
pub const SUBSCRIBERS: &str = "subscribers";

/// The prefix of a subscription's destination name (in the metrics, the destinations' health,
/// the admin pages): `subscription:<id>`.
pub const SUBSCRIPTION_DESTINATION_PREFIX: &str = "subscription:";

/// The destination name of subscription `id`.
pub fn destination_name(id: &str) -> String {
    format!("{SUBSCRIPTION_DESTINATION_PREFIX}{id}")
}

/// Whether event-type filter `filter` takes `message_type`: an exact name, a prefix ending in
/// `.*` (`invoice.*` takes `invoice.paid` and `invoice.line.added`, not `invoice` or
/// `invoices.paid`), or `*` for every type.
///
/// ```
/// use outbox_core::subscription::filter_takes;
///
/// assert!(filter_takes("invoice.*", "invoice.paid"));
/// assert!(filter_takes("invoice.paid", "invoice.paid"));
/// assert!(filter_takes("*", "comment.created"));
/// assert!(!filter_takes("invoice.*", "invoices.paid"));
/// assert!(!filter_takes("invoice.*", "invoice"));
/// ```
pub fn filter_takes(filter: &str, message_type: &str) -> bool {
    if filter == "*" {
        return true;
    }
    match filter.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('.') => {
            message_type.len() > prefix.len() && message_type.starts_with(prefix)
        }
        _ => filter == message_type,
    }
}

/// Why an event-type filter cannot be used, if it cannot: empty, longer than 255 bytes, with
/// control characters or spaces, or with a `*` anywhere but a whole `.*` suffix or alone.
pub fn filter_problem(filter: &str) -> Option<&'static str> {
    if filter.is_empty() {
        return Some("empty");
    }
    if filter.len() > 255 {
        return Some("longer than 255 bytes");
    }
    if filter.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some("made of more than printable characters without spaces");
    }
    let stars = filter.matches('*').count();
    let wildcard_ok = filter == "*" || (filter.ends_with(".*") && filter.len() > 2);
    if stars > 1 || (stars == 1 && !wildcard_ok) {
        return Some("a wildcard other than `*` alone or a `.*` suffix (`invoice.*`)");
    }
    None
}

/// A subscription as the store keeps it, as workers deliver to it.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Subscription {
    /// Its id.
    pub id: String,
    /// The owner (tenant) whose events it takes; `None`: events enqueued without an owner.
    pub owner: Option<String>,
    /// Where its deliveries go.
    pub url: String,
    /// The event types it takes ([`filter_takes`]).
    pub event_types: Vec<String>,
    /// Its signing secrets as stored (perhaps encrypted): the current one first, then the one
    /// it replaced, while their overlap lasts.
    pub secrets: Vec<String>,
    /// At most this many deliveries a second, if set.
    pub rate_limit: Option<u32>,
    /// Whether its URL may be `http://` rather than `https://`.
    pub allow_http: bool,
    /// Whether it takes deliveries; a disabled subscription's deliveries wait, paused.
    pub enabled: bool,
    /// Changes whenever any of the above does: a worker builds its destination anew then.
    pub version: i64,
}

impl Subscription {
    /// A subscription of `id` for `owner`'s events of `event_types`, delivered to `url` and
    /// signed with `secrets` (as stored), enabled, without a rate limit.
    pub fn new(
        id: impl Into<String>,
        owner: Option<String>,
        url: impl Into<String>,
        event_types: Vec<String>,
        secrets: Vec<String>,
    ) -> Self {
        Subscription {
            id: id.into(),
            owner,
            url: url.into(),
            event_types,
            secrets,
            rate_limit: None,
            allow_http: false,
            enabled: true,
            version: 0,
        }
    }

    /// Whether it takes events of `message_type`.
    pub fn takes(&self, message_type: &str) -> bool {
        self.event_types
            .iter()
            .any(|filter| filter_takes(filter, message_type))
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Secrets are never shown.
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("owner", &self.owner)
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("secrets", &self.secrets.len())
            .field("rate_limit", &self.rate_limit)
            .field("allow_http", &self.allow_http)
            .field("enabled", &self.enabled)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_take_exact_names_prefixes_and_everything() {
        assert!(filter_takes("order.paid", "order.paid"));
        assert!(!filter_takes("order.paid", "order.paid.late"));
        assert!(filter_takes("order.*", "order.paid.late"));
        assert!(!filter_takes("order.*", "order."));
        assert!(!filter_takes("order.*", "orders"));
        assert!(filter_takes("*", "anything"));
        assert!(
            !filter_takes("order*", "orders"),
            "only a `.*` suffix is a wildcard"
        );
    }

    #[test]
    fn filters_that_mean_nothing_are_refused() {
        for bad in ["", "order*", "*.paid", "a.*.b", "a b", "a.**", ".*", "a\n"] {
            assert!(filter_problem(bad).is_some(), "{bad:?}");
        }
        for good in ["*", "a.*", "invoice.paid", "a.b.*"] {
            assert_eq!(filter_problem(good), None, "{good:?}");
        }
    }
}
