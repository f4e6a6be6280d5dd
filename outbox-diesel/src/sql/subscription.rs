//! The statements of subscriptions ([`crate::subscription`]) that every backend shares in shape:
//! the rows they read, the fan-out's order of statements, and what each backend implements
//! ([`SubscriptionStatements`], in each backend's file beside its other statements).

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryResult;
use outbox_core::subscription::Subscription;

use super::bind::Bind;
use super::delivery_log::DeliveryLogStatements;
use super::statements::{LoadFixed, Statements};

/// The longest ordering key the tables store, in bytes.
const MAX_KEY: usize = 255;

/// A subscription as stored.
#[derive(diesel::QueryableByName, Debug)]
pub(crate) struct SubscriptionRow {
    #[diesel(sql_type = Text)]
    pub(crate) id: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) owner: Option<String>,
    #[diesel(sql_type = Text)]
    pub(crate) url: String,
    #[diesel(sql_type = Text)]
    pub(crate) event_types: String,
    #[diesel(sql_type = Text)]
    pub(crate) secret: String,
    /// The secret a rotation replaced, while its overlap lasts.
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) previous_secret: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) rate_limit: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub(crate) allow_http: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) description: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) metadata: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) enabled: i64,
    /// µs since the epoch.
    #[diesel(sql_type = BigInt)]
    pub(crate) created_micros: i64,
    /// µs since the epoch: changes with every change of the subscription.
    #[diesel(sql_type = BigInt)]
    pub(crate) updated_micros: i64,
    /// When the previous secret stops being signed with, µs since the epoch.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) previous_until_micros: Option<i64>,
}

impl SubscriptionRow {
    /// The event-type filters, from their JSON array (a row edited by hand into something else
    /// takes nothing).
    pub(crate) fn filters(&self) -> Vec<String> {
        serde_json::from_str(&self.event_types).unwrap_or_default()
    }

    /// The subscription as a worker delivers to it.
    pub(crate) fn to_subscription(&self) -> Subscription {
        let mut secrets = vec![self.secret.clone()];
        secrets.extend(self.previous_secret.clone());
        let mut subscription = Subscription::new(
            self.id.clone(),
            self.owner.clone(),
            self.url.clone(),
            self.filters(),
            secrets,
        );
        subscription.rate_limit = self
            .rate_limit
            .and_then(|rate| u32::try_from(rate).ok())
            .filter(|rate| *rate > 0);
        subscription.allow_http = self.allow_http != 0;
        subscription.enabled = self.enabled != 0;
        // The previous secret's end changes what is signed with without a change of the row.
        subscription.version = self
            .updated_micros
            .wrapping_add(i64::from(self.previous_secret.is_some()));
        subscription
    }
}

/// A subscription a fan-out considers: its id and filters.
#[derive(diesel::QueryableByName, Debug)]
pub(crate) struct CandidateRow {
    #[diesel(sql_type = Text)]
    pub(crate) id: String,
    #[diesel(sql_type = Text)]
    pub(crate) event_types: String,
}

/// The event a fan-out holds: its type and ordering key.
#[derive(diesel::QueryableByName, Debug)]
pub(crate) struct EventRow {
    #[diesel(sql_type = Text)]
    pub(crate) message_type: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) ordering_key: Option<String>,
}

/// A new subscription's row.
#[derive(Debug)]
pub(crate) struct NewSubscriptionRow<'a> {
    pub(crate) id: &'a str,
    pub(crate) owner: Option<&'a str>,
    pub(crate) url: &'a str,
    pub(crate) event_types: &'a str,
    pub(crate) secret: &'a str,
    pub(crate) rate_limit: Option<i64>,
    pub(crate) allow_http: bool,
    pub(crate) description: Option<&'a str>,
    pub(crate) metadata: Option<&'a str>,
    pub(crate) enabled: bool,
}

/// The text of the subscriptions' statements every backend runs alike but for their text:
/// each backend's file gives them, and the provided methods of [`SubscriptionStatements`] run
/// them.
pub(crate) trait SubscriptionDialect {
    /// The statement of [`SubscriptionStatements::delete_subscription`].
    const DELETE_SUBSCRIPTION: &'static str;
    /// The statement of [`SubscriptionStatements::delete_subscription_deliveries`].
    const DELETE_SUBSCRIPTION_DELIVERIES: &'static str;
    /// The statement of [`SubscriptionStatements::fan_out_candidates`].
    const FAN_OUT_CANDIDATES: &'static str;
    /// The statement of [`SubscriptionStatements::insert_subscription`].
    const INSERT_SUBSCRIPTION: &'static str;
    /// The statement of [`SubscriptionStatements::lock_event`].
    const LOCK_EVENT: &'static str;
    /// The statement of [`SubscriptionStatements::release_subscription`].
    const RELEASE_SUBSCRIPTION: &'static str;
    /// The statement of [`SubscriptionStatements::reseal_subscription_secrets`].
    const RESEAL_SUBSCRIPTION_SECRETS: &'static str;
    /// The statement of [`SubscriptionStatements::rotate_subscription_secret`].
    const ROTATE_SUBSCRIPTION_SECRET: &'static str;
    /// The statement of [`SubscriptionStatements::set_subscription_enabled`].
    const SET_SUBSCRIPTION_ENABLED: &'static str;
    /// The statement of [`SubscriptionStatements::subscription`].
    const SUBSCRIPTION: &'static str;
    /// The statement of [`SubscriptionStatements::subscriptions`].
    const SUBSCRIPTIONS: &'static str;
    /// The statement of [`SubscriptionStatements::subscriptions`].
    const SUBSCRIPTIONS_OF: &'static str;
}

/// What each backend runs for subscriptions; its statements are in its own file.
pub(crate) trait SubscriptionStatements:
    Statements
    + SubscriptionDialect
    + LoadFixed<SubscriptionRow>
    + LoadFixed<EventRow>
    + LoadFixed<CandidateRow>
{
    /// Every subscription, oldest first; with `owner` given, only that owner's (`Some(None)`:
    /// those without an owner).
    fn subscriptions(&mut self, owner: Option<Option<&str>>) -> QueryResult<Vec<SubscriptionRow>> {
        match owner {
            None => self.load_fixed(Self::SUBSCRIPTIONS, &[]),
            Some(owner) => self.load_fixed(Self::SUBSCRIPTIONS_OF, &[Bind::NullableText(owner)]),
        }
    }

    /// Subscription `id`.
    fn subscription(&mut self, id: &str) -> QueryResult<Option<SubscriptionRow>> {
        let rows: Vec<SubscriptionRow> = self.load_fixed(Self::SUBSCRIPTION, &[Bind::Text(id)])?;
        Ok(rows.into_iter().next())
    }

    /// Inserts a subscription.
    fn insert_subscription(&mut self, row: &NewSubscriptionRow<'_>) -> QueryResult<()> {
        let binds = [
            Bind::Text(row.id),
            Bind::NullableText(row.owner),
            Bind::Text(row.url),
            Bind::Text(row.event_types),
            Bind::Text(row.secret),
            Bind::NullableBigInt(row.rate_limit),
            Bind::Bool(row.allow_http),
            Bind::NullableText(row.description),
            Bind::NullableText(row.metadata),
            Bind::Bool(row.enabled),
        ];
        self.run_fixed(Self::INSERT_SUBSCRIPTION, &binds).map(drop)
    }

    /// Enables or disables subscription `id`; how many rows changed.
    fn set_subscription_enabled(&mut self, id: &str, enabled: bool) -> QueryResult<usize> {
        self.run_fixed(
            Self::SET_SUBSCRIPTION_ENABLED,
            &[Bind::Bool(enabled), Bind::Text(id)],
        )
    }

    /// Replaces subscription `id`'s secret with `secret`, keeping the old one as the previous
    /// secret for `overlap_micros`; how many rows changed.
    fn rotate_subscription_secret(
        &mut self,
        id: &str,
        secret: &str,
        overlap_micros: i64,
    ) -> QueryResult<usize> {
        let binds = [
            Bind::Text(secret),
            Bind::BigInt(overlap_micros),
            Bind::Text(id),
        ];
        self.run_fixed(Self::ROTATE_SUBSCRIPTION_SECRET, &binds)
    }

    /// Rewrites subscription `id`'s stored secrets (encrypted anew), leaving everything else.
    fn reseal_subscription_secrets(
        &mut self,
        id: &str,
        secret: &str,
        previous: Option<&str>,
    ) -> QueryResult<usize> {
        let binds = [
            Bind::Text(secret),
            Bind::NullableText(previous),
            Bind::Text(id),
        ];
        self.run_fixed(Self::RESEAL_SUBSCRIPTION_SECRETS, &binds)
    }

    /// Deletes subscription `id`; how many rows.
    fn delete_subscription(&mut self, id: &str) -> QueryResult<usize> {
        self.run_fixed(Self::DELETE_SUBSCRIPTION, &[Bind::Text(id)])
    }

    /// Deletes the pending deliveries of subscription `id` that no claim holds; how many.
    fn delete_subscription_deliveries(&mut self, id: &str) -> QueryResult<usize> {
        self.run_fixed(Self::DELETE_SUBSCRIPTION_DELIVERIES, &[Bind::Text(id)])
    }

    /// Makes the paused deliveries of subscription `id` due now; how many.
    fn release_subscription(&mut self, id: &str) -> QueryResult<usize> {
        self.run_fixed(Self::RELEASE_SUBSCRIPTION, &[Bind::Text(id)])
    }

    /// The event at `id` if the claim `token` holds it, locked for the transaction.
    fn lock_event(&mut self, id: i64, token: &str) -> QueryResult<Option<EventRow>> {
        let rows: Vec<EventRow> =
            self.load_fixed(Self::LOCK_EVENT, &[Bind::BigInt(id), Bind::Text(token)])?;
        Ok(rows.into_iter().next())
    }

    /// The enabled subscriptions of the owner of the event at `id` created no later than it.
    fn fan_out_candidates(&mut self, id: i64) -> QueryResult<Vec<CandidateRow>> {
        self.load_fixed(Self::FAN_OUT_CANDIDATES, &[Bind::BigInt(id)])
    }

    /// Inserts one delivery of the event at `id` for each `(subscription, ordering key)`, in
    /// order: the event's id, type, payload, headers, priority, group, owner and enqueue time.
    fn insert_deliveries(
        &mut self,
        id: i64,
        deliveries: &[(&str, Option<String>)],
    ) -> QueryResult<()>;
}

/// A delivery's ordering key: the event's, within its subscription, so that per-key order holds
/// per subscriber and one subscriber's key never waits for another's. A key too long to prefix
/// is replaced by its SHA-256 (order within it is kept; two keys that share the hash would only
/// be ordered together).
pub(crate) fn delivery_key(subscription: &str, key: Option<&str>) -> Option<String> {
    let key = key?;
    let whole = format!("{subscription}:{key}");
    if whole.len() <= MAX_KEY {
        return Some(whole);
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    Some(format!("{subscription}:#{hex}"))
}

/// Fans the event at `position` out, as [`Subscriptions::fan_out`](outbox_core::store::Subscriptions::fan_out)
/// says: `None` if the claim `token` no longer holds it. Runs inside the caller's transaction.
/// With `archive`, the event is kept in the archive as it leaves.
pub(crate) fn fan_out<C: SubscriptionStatements + DeliveryLogStatements>(
    c: &mut C,
    position: i64,
    token: &str,
    archive: bool,
) -> QueryResult<Option<usize>> {
    let Some(event) = c.lock_event(position, token)? else {
        return Ok(None);
    };
    if archive {
        super::delivery_log::archive(c, &[(token.to_owned(), vec![position])])?;
    }
    let subscriptions: Vec<String> = c
        .fan_out_candidates(position)?
        .into_iter()
        .filter(|candidate| {
            serde_json::from_str::<Vec<String>>(&candidate.event_types)
                .unwrap_or_default()
                .iter()
                .any(|filter| outbox_core::subscription::filter_takes(filter, &event.message_type))
        })
        .map(|candidate| candidate.id)
        .collect();
    let deliveries: Vec<(&str, Option<String>)> = subscriptions
        .iter()
        .map(|id| (id.as_str(), delivery_key(id, event.ordering_key.as_deref())))
        .collect();
    for chunk in deliveries.chunks(FAN_OUT_CHUNK) {
        c.insert_deliveries(position, chunk)?;
    }
    let keys: Vec<&str> = event.ordering_key.as_deref().into_iter().collect();
    let removed = c.delete_done(&[(token.to_owned(), vec![position])], &keys)?;
    if removed == 0 {
        // Locked and held a moment ago: only a row edited by hand meanwhile could get here.
        return Err(diesel::result::Error::RollbackTransaction);
    }
    Ok(Some(deliveries.len()))
}

/// Deliveries one `INSERT` of a fan-out carries at most (two binds each).
pub(crate) const FAN_OUT_CHUNK: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_key_is_the_event_key_within_its_subscription() {
        assert_eq!(delivery_key("sub-1", None), None);
        assert_eq!(
            delivery_key("sub-1", Some("order-7")).as_deref(),
            Some("sub-1:order-7")
        );
        let long = "k".repeat(250);
        let hashed = delivery_key("sub-1", Some(&long)).unwrap();
        assert!(
            hashed.starts_with("sub-1:#") && hashed.len() == 7 + 64,
            "{hashed}"
        );
        assert_eq!(delivery_key("sub-1", Some(&long)), Some(hashed));
    }
}
