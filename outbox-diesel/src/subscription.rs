//! Subscriptions: webhook endpoints your customers add, change and remove while the workers
//! run, each taking the event types it asks for, delivered to it independently.
//!
//! Destinations are compiled into the worker; subscriptions are data, in the outbox's
//! `outbox_subscription` table. Route an event type to them, and give the worker
//! [`Subscriptions::delivery`]:
//!
//! ```no_run
//! use diesel::prelude::*;
//! use outbox_diesel::prelude::*;
//! use outbox_diesel::subscription::{NewSubscription, Subscriptions};
//! use outbox_diesel::{outbox_handler, DieselStore, EnqueueOptions, OutboxManager, Worker};
//!
//! // An event for subscribers: enqueued as any message, fanned out by the worker.
//! #[outbox_handler("invoice.paid", deliver_to = "subscribers")]
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct InvoicePaid { invoice: i64 }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = diesel::r2d2::Pool::new(OutboxManager::<SqliteConnection>::new("app.db")?)?;
//! // Secrets are encrypted at rest with this key (from your configuration, 32 bytes).
//! let subscriptions = Subscriptions::new().secret_key("2026-11", [7u8; 32]);
//! let worker = Worker::builder(DieselStore::new(pool.clone()))
//!     .subscriptions(subscriptions.delivery())
//!     .spawn()?;
//!
//! let mut conn = pool.get()?;
//! // A customer's settings page: the subscription commits with the rest of the request.
//! let created = conn.transaction(|conn| {
//!     subscriptions.create(
//!         conn,
//!         &NewSubscription::new("https://customer.example/hooks", ["invoice.*"]).owner("42"),
//!     )
//! })?;
//! println!("your signing secret (shown once): {}", created.secret);
//!
//! // Elsewhere, in the transaction that marks the invoice paid:
//! InvoicePaid { invoice: 1234 }.enqueue_with(&mut conn, &EnqueueOptions::new().owner("42"))?;
//! # worker.shutdown(std::time::Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! - **Fan-out, once.** The worker that claims an event writes one delivery per matching
//!   subscription (enabled, of the event's owner, whose filter takes its type, created no later
//!   than the event) in the transaction that removes the event: a crash in between leaves the
//!   event to be fanned out again, whole. The enqueue stays one `INSERT`, however many
//!   subscribers.
//! - **Independent deliveries.** Each delivery has its own attempts, backoff, dead letter and
//!   re-queue; each subscription is a destination of its own (`subscription:<id>`): its own
//!   health (paused after failures, probed, disabled by `410 Gone`), rate limit, learned rate
//!   and metrics. A failing or slow subscriber spends only its own deliveries' attempts, and
//!   per-key order holds within each subscriber.
//! - **The right party only.** An event enqueued with
//!   [`EnqueueOptions::owner`](crate::EnqueueOptions::owner) reaches only
//!   that owner's subscriptions; one without an owner reaches only subscriptions without one.
//! - **Secrets.** Each subscription signs with its own `whsec_…` secret (generated unless one
//!   is given), returned once by [`Subscriptions::create`] and
//!   [`Subscriptions::rotate_secret`] and never shown again. With a key
//!   ([`Subscriptions::secret_key`]) secrets are stored encrypted (XChaCha20-Poly1305); without
//!   one they are stored as they are. To rotate keys, give the new key first and keep the old
//!   ones after it: new secrets are encrypted with the first, stored ones are read with the key
//!   they name, and [`Subscriptions::reencrypt_secrets`] moves them all to the first. A rotated
//!   secret keeps signing beside the new one for the overlap given, so receivers can switch.
//! - **Addresses customers type.** A URL must be `https://` (unless the subscription allows
//!   `http://`) and must not name or resolve to a special-purpose address (loopback, private,
//!   link-local, ...; see `outbox_webhook::is_special_purpose`), checked when it is created and
//!   again at every connection; [`Subscriptions::allow_address`] opens one address for a
//!   receiver you trust.
//! - **Changes while the workers run.** Every worker reads the subscriptions every few seconds.
//!   A disabled subscription gets no new events and its waiting deliveries pause until it is
//!   enabled again; removing one deletes its waiting deliveries.
//!
//! Subscriptions beside destinations: a destination is yours, compiled in and configured by
//! you (your mail service, your broker); a subscription is your customer's, added at run time.
//! A message type goes to one destination or to the subscribers.

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

pub use outbox_core::destination::SubscriptionTransport;
pub use outbox_core::subscription::{filter_takes, Subscription, SUBSCRIBERS};
pub use outbox_core::SubscriptionDelivery;

use crate::connection::{with_backend, OutboxConnection};
use crate::error::{Error, Result};
use crate::sql::codec::time_from_micros;
use crate::sql::statements::retry_deadlocks;
use crate::sql::subscription::{NewSubscriptionRow, SubscriptionRow, SubscriptionStatements};

/// How long a rotated secret keeps signing beside the new one, unless said otherwise.
pub const DEFAULT_ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 60 * 60);

/// A secret's prefix, as Standard Webhooks writes it.
const SECRET_PREFIX: &str = "whsec_";

/// The prefix of a secret stored encrypted: `enc:v1:<key id>:<base64 of nonce and sealed text>`.
const ENCRYPTED_PREFIX: &str = "enc:v1:";

/// A subscription to create: [`Subscriptions::create`].
#[derive(Clone)]
pub struct NewSubscription {
    url: String,
    event_types: Vec<String>,
    owner: Option<String>,
    secret: Option<String>,
    rate_limit: Option<u32>,
    description: Option<String>,
    metadata: Option<serde_json::Value>,
    allow_http: bool,
    enabled: bool,
}

impl fmt::Debug for NewSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewSubscription")
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("owner", &self.owner)
            .field("rate_limit", &self.rate_limit)
            .finish_non_exhaustive()
    }
}

impl NewSubscription {
    /// Events of `event_types` (exact names, `prefix.*` or `*`) to `url`, enabled, without an
    /// owner, signed with a secret generated for it.
    pub fn new<T: Into<String>>(
        url: impl Into<String>,
        event_types: impl IntoIterator<Item = T>,
    ) -> Self {
        NewSubscription {
            url: url.into(),
            event_types: event_types.into_iter().map(Into::into).collect(),
            owner: None,
            secret: None,
            rate_limit: None,
            description: None,
            metadata: None,
            allow_http: false,
            enabled: true,
        }
    }

    /// The owner (tenant) whose events it takes (see [`EnqueueOptions::owner`]).
    ///
    /// [`EnqueueOptions::owner`]: crate::EnqueueOptions::owner
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Signs with this secret (`whsec_` and base64 of 24 to 64 bytes) instead of a new one.
    pub fn secret(mut self, secret: impl Into<String>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// At most this many deliveries a second to it.
    pub fn rate_limit(mut self, per_second: u32) -> Self {
        self.rate_limit = Some(per_second);
        self
    }

    /// A description shown to operators.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Data the application keeps with it (a JSON object).
    pub fn metadata(mut self, metadata: serde_json::Value) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Lets its URL be `http://` (deliveries then travel unencrypted).
    pub fn allow_http(mut self) -> Self {
        self.allow_http = true;
        self
    }

    /// Created disabled: it takes no events until enabled.
    pub fn disabled(mut self) -> Self {
        self.enabled = false;
        self
    }
}

/// A subscription as listed: everything but its secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubscriptionInfo {
    /// Its id.
    pub id: String,
    /// The owner whose events it takes, if any.
    pub owner: Option<String>,
    /// Where its deliveries go.
    pub url: String,
    /// The event types it takes.
    pub event_types: Vec<String>,
    /// At most this many deliveries a second, if set.
    pub rate_limit: Option<u32>,
    /// Whether its URL may be `http://`.
    pub allow_http: bool,
    /// Its description.
    pub description: Option<String>,
    /// The application's data kept with it.
    pub metadata: Option<serde_json::Value>,
    /// Whether it takes events.
    pub enabled: bool,
    /// When it was created.
    pub created_at: SystemTime,
    /// Until when a rotated secret still signs beside the current one, if one does.
    pub previous_secret_until: Option<SystemTime>,
    /// The destination name its health and metrics go by: `subscription:<id>`.
    pub destination: String,
}

impl SubscriptionInfo {
    fn from_row(row: &SubscriptionRow) -> Self {
        SubscriptionInfo {
            id: row.id.clone(),
            owner: row.owner.clone(),
            url: row.url.clone(),
            event_types: row.filters(),
            rate_limit: row.rate_limit.and_then(|rate| u32::try_from(rate).ok()),
            allow_http: row.allow_http != 0,
            description: row.description.clone(),
            metadata: row
                .metadata
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok()),
            enabled: row.enabled != 0,
            created_at: time_from_micros(row.created_micros),
            previous_secret_until: row
                .previous_secret
                .as_ref()
                .and(row.previous_until_micros)
                .map(time_from_micros),
            destination: outbox_core::subscription::destination_name(&row.id),
        }
    }
}

/// A subscription just created, with its signing secret: show it to its owner now, it is
/// never shown again.
#[derive(Clone)]
#[non_exhaustive]
pub struct CreatedSubscription {
    /// The subscription.
    pub subscription: SubscriptionInfo,
    /// Its signing secret (`whsec_…`).
    pub secret: String,
}

impl fmt::Debug for CreatedSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreatedSubscription")
            .field("subscription", &self.subscription)
            .finish_non_exhaustive()
    }
}

/// What the application allows its customers' subscriptions, and what it needs to create them
/// and deliver to them: the keys that encrypt their secrets, the addresses it trusts beyond
/// the address guard, the delivery timeout. Build it once from the configuration; give
/// [`Subscriptions::delivery`] to the worker.
#[derive(Clone, Default)]
pub struct Subscriptions {
    keys: Vec<(String, [u8; 32])>,
    allowed: Vec<IpAddr>,
    timeout: Option<Duration>,
}

impl fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key_ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("Subscriptions")
            .field("key_ids", &key_ids)
            .field("allowed", &self.allowed)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Subscriptions {
    /// No key (secrets stored as they are), no address beyond the guard, the default timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a 32-byte key that encrypts secrets at rest, under `id` (stored with each secret
    /// it encrypts). The first key given encrypts; every key given decrypts what names it.
    pub fn secret_key(mut self, id: impl Into<String>, key: [u8; 32]) -> Self {
        self.keys.push((id.into(), key));
        self
    }

    /// Adds the keys of `list`: `ID:KEY` pairs separated by commas, each key 32 bytes in
    /// base64, the first one encrypting (e.g. `OUTBOX_SECRET_KEYS=2026-12:…,2026-06:…` from the
    /// environment, newest first).
    pub fn secret_keys(mut self, list: &str) -> Result<Self> {
        for entry in list
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
        {
            let (id, key) = entry.split_once(':').ok_or_else(|| Error::SecretKey {
                reason: format!("a key is `ID:BASE64`, not {:?}", entry.split(':').next()),
            })?;
            let bytes = STANDARD.decode(key.trim()).map_err(|_| Error::SecretKey {
                reason: format!("key `{id}` is not base64"),
            })?;
            let key: [u8; 32] = bytes.try_into().map_err(|_| Error::SecretKey {
                reason: format!("key `{id}` is not 32 bytes"),
            })?;
            self = self.secret_key(id.trim(), key);
        }
        Ok(self)
    }

    /// Allows subscriptions to reach `address` although the address guard refuses it
    /// (loopback, private, ...), for a receiver you trust; checked at creation and at every
    /// connection.
    pub fn allow_address(mut self, address: IpAddr) -> Self {
        self.allowed.push(address);
        self
    }

    /// The limit on one delivery, from connecting to reading the answer (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Creates `new` inside the caller's transaction: checks its URL and filters, generates
    /// its secret (unless given), stores the secret encrypted (with a key) and returns it, the
    /// one time it is shown.
    pub fn create<C: OutboxConnection>(
        &self,
        conn: &mut C,
        new: &NewSubscription,
    ) -> Result<CreatedSubscription> {
        self.check_url(&new.url, new.allow_http)?;
        if new.event_types.is_empty() {
            return Err(Error::InvalidSubscription {
                reason: "it takes no event type: give at least one (`invoice.paid`, \
                         `invoice.*` or `*`)"
                    .into(),
            });
        }
        for filter in &new.event_types {
            if let Some(problem) = outbox_core::subscription::filter_problem(filter) {
                return Err(Error::InvalidSubscription {
                    reason: format!("event-type filter {filter:?} is {problem}"),
                });
            }
        }
        if let Some(owner) = &new.owner {
            if owner.is_empty() || owner.len() > 255 || owner.chars().any(char::is_control) {
                return Err(Error::InvalidOwner);
            }
        }
        if let Some(metadata) = &new.metadata {
            if !metadata.is_object() {
                return Err(Error::InvalidSubscription {
                    reason: "its metadata is not a JSON object".into(),
                });
            }
        }
        let secret = match &new.secret {
            Some(secret) => {
                check_secret(secret)?;
                secret.clone()
            }
            None => generate_secret()?,
        };
        let id = uuid::Uuid::now_v7().to_string();
        let event_types =
            serde_json::to_string(&new.event_types).map_err(|e| Error::InvalidSubscription {
                reason: e.to_string(),
            })?;
        let metadata = new.metadata.as_ref().map(ToString::to_string);
        let stored = self.seal(&secret)?;
        let row = NewSubscriptionRow {
            id: &id,
            owner: new.owner.as_deref(),
            url: &new.url,
            event_types: &event_types,
            secret: &stored,
            rate_limit: new.rate_limit.map(i64::from),
            allow_http: new.allow_http,
            description: new.description.as_deref(),
            metadata: metadata.as_deref(),
            enabled: new.enabled,
        };
        let created = with_backend!(conn.backend_connection(), c => {
            c.insert_subscription(&row)?;
            c.subscription(&id)?
        });
        let created = created.ok_or(Error::Database(diesel::result::Error::NotFound))?;
        Ok(CreatedSubscription {
            subscription: SubscriptionInfo::from_row(&created),
            secret,
        })
    }

    /// Gives subscription `id` a new secret, returned the one time it is shown; the old one
    /// keeps signing beside it for `overlap` (see [`DEFAULT_ROTATION_OVERLAP`]). `None` if there
    /// is no such subscription.
    pub fn rotate_secret<C: OutboxConnection>(
        &self,
        conn: &mut C,
        id: &str,
        overlap: Duration,
    ) -> Result<Option<String>> {
        let secret = generate_secret()?;
        let stored = self.seal(&secret)?;
        let overlap = i64::try_from(overlap.as_micros()).unwrap_or(i64::MAX);
        let changed = with_backend!(conn.backend_connection(), c => {
            c.rotate_subscription_secret(id, &stored, overlap)?
        });
        Ok((changed > 0).then_some(secret))
    }

    /// Encrypts every stored secret with the first key (after adding a new key first): returns
    /// how many were rewritten. Runs inside the caller's transaction.
    pub fn reencrypt_secrets<C: OutboxConnection>(&self, conn: &mut C) -> Result<usize> {
        let Some((first, _)) = self.keys.first() else {
            return Ok(0);
        };
        let rows = with_backend!(conn.backend_connection(), c => c.subscriptions(None)?);
        let mut rewritten = 0;
        for row in rows {
            let current = key_id(&row.secret);
            let previous = row.previous_secret.as_deref().map(key_id);
            if current == Some(first.as_str()) && previous.is_none_or(|id| id == Some(first)) {
                continue;
            }
            let secret = self.seal(&self.open(&row.secret)?)?;
            let previous = row
                .previous_secret
                .as_deref()
                .map(|stored| self.open(stored).and_then(|plain| self.seal(&plain)))
                .transpose()?;
            with_backend!(conn.backend_connection(), c => {
                c.reseal_subscription_secrets(&row.id, &secret, previous.as_deref())?
            });
            rewritten += 1;
        }
        Ok(rewritten)
    }

    /// Why `url` cannot be a subscription's, if it cannot: not `https` (unless `allow_http`), or
    /// a host that is, or resolves to, an address the guard refuses and this application does
    /// not allow.
    pub fn check_url(&self, url: &str, allow_http: bool) -> Result<()> {
        #[cfg(feature = "webhook")]
        {
            outbox_webhook::check_receiver_url(url, allow_http, &self.allowed).map_err(|error| {
                Error::InvalidSubscription {
                    reason: error.to_string(),
                }
            })
        }
        #[cfg(not(feature = "webhook"))]
        {
            let _ = (url, allow_http);
            Err(Error::InvalidSubscription {
                reason: "subscriptions are delivered as webhooks: enable outbox-diesel's \
                         `webhook` feature"
                    .into(),
            })
        }
    }

    /// The stored form of `secret`: encrypted with the first key, or as it is without one.
    fn seal(&self, secret: &str) -> Result<String> {
        let Some((id, key)) = self.keys.first() else {
            return Ok(secret.to_owned());
        };
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce).map_err(|e| Error::Random(e.to_string()))?;
        let cipher = XChaCha20Poly1305::new(key.into());
        let sealed = cipher
            .encrypt(XNonce::from_slice(&nonce), secret.as_bytes())
            .map_err(|_| Error::Random("encrypting a secret failed".into()))?;
        let mut bytes = nonce.to_vec();
        bytes.extend(sealed);
        Ok(format!("{ENCRYPTED_PREFIX}{id}:{}", STANDARD.encode(bytes)))
    }

    /// The secret a stored form stands for.
    pub(crate) fn open(&self, stored: &str) -> Result<String> {
        let Some(rest) = stored.strip_prefix(ENCRYPTED_PREFIX) else {
            return Ok(stored.to_owned());
        };
        let (id, sealed) = rest.split_once(':').ok_or_else(|| Error::SecretKey {
            reason: "a stored secret is damaged (no key id)".into(),
        })?;
        let (_, key) = self
            .keys
            .iter()
            .find(|(known, _)| known == id)
            .ok_or_else(|| Error::SecretKey {
                reason: format!(
                    "a secret is encrypted with key `{id}`, which this application was not given \
                     (Subscriptions::secret_key)"
                ),
            })?;
        let bytes = STANDARD.decode(sealed).map_err(|_| Error::SecretKey {
            reason: "a stored secret is damaged (not base64)".into(),
        })?;
        if bytes.len() < 24 {
            return Err(Error::SecretKey {
                reason: "a stored secret is damaged (too short)".into(),
            });
        }
        let (nonce, sealed) = bytes.split_at(24);
        let cipher = XChaCha20Poly1305::new(key.into());
        let plain = cipher
            .decrypt(XNonce::from_slice(nonce), sealed)
            .map_err(|_| Error::SecretKey {
                reason: format!("key `{id}` does not open a stored secret (a wrong key?)"),
            })?;
        String::from_utf8(plain).map_err(|_| Error::SecretKey {
            reason: "a stored secret is not text".into(),
        })
    }

    /// How a worker delivers to the subscriptions: each as a signed webhook (Standard Webhooks,
    /// with its own secrets), through the address guard, with this application's allowed
    /// addresses and timeout. Give it to
    /// [`WorkerBuilder::subscriptions`](crate::WorkerBuilder::subscriptions).
    #[cfg(feature = "webhook")]
    pub fn delivery(&self) -> outbox_core::SubscriptionDelivery {
        outbox_core::SubscriptionDelivery::new(SubscriptionWebhooks {
            subscriptions: self.clone(),
            template: std::sync::OnceLock::new(),
        })
    }
}

/// The key id a stored secret names, if it is encrypted.
fn key_id(stored: &str) -> Option<&str> {
    stored
        .strip_prefix(ENCRYPTED_PREFIX)
        .and_then(|rest| rest.split_once(':'))
        .map(|(id, _)| id)
}

/// Builds each subscription's signed webhook: [`Subscriptions::delivery`]. Every one shares the
/// HTTP clients of one template endpoint (each handler thread's client and its connections),
/// whatever the number of subscriptions.
#[cfg(feature = "webhook")]
struct SubscriptionWebhooks {
    subscriptions: Subscriptions,
    template: std::sync::OnceLock<std::result::Result<outbox_webhook::WebhookEndpoint, String>>,
}

#[cfg(feature = "webhook")]
impl SubscriptionWebhooks {
    /// The endpoint whose client, guard and timeouts every subscription's shares.
    fn template(&self) -> std::result::Result<&outbox_webhook::WebhookEndpoint, String> {
        self.template
            .get_or_init(|| {
                let settings = &self.subscriptions;
                let secret = generate_secret().map_err(|error| error.to_string())?;
                let secret = outbox_webhook::WebhookSecret::parse(&secret)
                    .map_err(|error| error.to_string())?;
                let mut builder =
                    outbox_webhook::WebhookEndpoint::builder("https://subscribers.invalid/")
                        .secret(secret);
                for address in &settings.allowed {
                    builder = builder.allow_address(*address);
                }
                if let Some(timeout) = settings.timeout {
                    builder = builder.timeout(timeout);
                }
                builder.build().map_err(|error| error.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

#[cfg(feature = "webhook")]
impl SubscriptionTransport for SubscriptionWebhooks {
    fn destination(
        &self,
        subscription: &outbox_core::subscription::Subscription,
    ) -> std::result::Result<std::sync::Arc<dyn outbox_core::destination::Destination>, String>
    {
        let settings = &self.subscriptions;
        settings
            .check_url(&subscription.url, subscription.allow_http)
            .map_err(|error| error.to_string())?;
        let mut secrets = Vec::with_capacity(subscription.secrets.len());
        for stored in &subscription.secrets {
            let secret = settings.open(stored).map_err(|error| error.to_string())?;
            secrets.push(
                outbox_webhook::WebhookSecret::parse(&secret)
                    .map_err(|error| format!("its secret cannot sign: {error}"))?,
            );
        }
        self.template()?
            .to_url(&subscription.url, secrets)
            .map(|endpoint| {
                std::sync::Arc::new(endpoint)
                    as std::sync::Arc<dyn outbox_core::destination::Destination>
            })
            .map_err(|error| error.to_string())
    }

    fn timeout(&self) -> Duration {
        self.subscriptions
            .timeout
            .unwrap_or(outbox_webhook::DEFAULT_TIMEOUT)
    }
}

/// A new secret: `whsec_` and base64 of 24 random bytes, as Standard Webhooks makes them.
fn generate_secret() -> Result<String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
    Ok(format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes)))
}

/// Refuses a given secret that is not `whsec_` and base64 of 24 to 64 bytes.
fn check_secret(secret: &str) -> Result<()> {
    let bytes = secret
        .strip_prefix(SECRET_PREFIX)
        .and_then(|encoded| STANDARD.decode(encoded).ok());
    match bytes {
        Some(bytes) if (24..=64).contains(&bytes.len()) => Ok(()),
        _ => Err(Error::InvalidSubscription {
            reason: "its secret is not `whsec_` followed by base64 of 24 to 64 bytes".into(),
        }),
    }
}

/// Every subscription, oldest first; with `owner`, only that owner's (`Some(None)`: those
/// without an owner).
pub fn list<C: OutboxConnection>(
    conn: &mut C,
    owner: Option<Option<&str>>,
) -> Result<Vec<SubscriptionInfo>> {
    let rows = with_backend!(conn.backend_connection(), c => c.subscriptions(owner)?);
    Ok(rows.iter().map(SubscriptionInfo::from_row).collect())
}

/// Subscription `id`, if there is one.
pub fn get<C: OutboxConnection>(conn: &mut C, id: &str) -> Result<Option<SubscriptionInfo>> {
    let row = with_backend!(conn.backend_connection(), c => c.subscription(id)?);
    Ok(row.as_ref().map(SubscriptionInfo::from_row))
}

/// Disables subscription `id`: it takes no new events, and its waiting deliveries pause
/// (without spending attempts) until it is enabled. Whether there was such a subscription.
/// Deadlocks are handled as [`remove`] says.
pub fn disable<C: OutboxConnection>(conn: &mut C, id: &str) -> Result<bool> {
    let changed = with_backend!(conn.backend_connection(), c => {
        retry_deadlocks(c, |c| c.set_subscription_enabled(id, false))?
    });
    Ok(changed > 0)
}

/// Enables subscription `id` again: it takes new events, and its paused deliveries are due at
/// once. Whether there was such a subscription. Deadlocks are handled as [`remove`] says.
pub fn enable<C: OutboxConnection>(conn: &mut C, id: &str) -> Result<bool> {
    let changed = with_backend!(conn.backend_connection(), c => {
        let changed = retry_deadlocks(c, |c| c.set_subscription_enabled(id, true))?;
        retry_deadlocks(c, |c| c.release_subscription(id))?;
        changed
    });
    Ok(changed > 0)
}

/// Removes subscription `id` and its waiting deliveries. The deliveries a worker holds at that
/// moment (claimed, up to its in-flight cap) are left to it: each may still be sent until the
/// workers next read the subscriptions (every few seconds), and each not delivered by then is
/// dead-lettered with the reason ("no longer exists"), never left waiting. The subscription's
/// dead letters stay, for the record. Whether there was such a subscription.
///
/// Each statement that a worker's claim or settlement deadlocks (MySQL) runs again, unless it
/// runs inside a transaction of yours, which the deadlock ended: the error is then yours.
pub fn remove<C: OutboxConnection>(conn: &mut C, id: &str) -> Result<bool> {
    let removed = with_backend!(conn.backend_connection(), c => {
        let removed = retry_deadlocks(c, |c| c.delete_subscription(id))?;
        retry_deadlocks(c, |c| c.delete_subscription_deliveries(id))?;
        removed
    });
    Ok(removed > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_sealed_with_a_key_opens_with_it_only() {
        let keys = Subscriptions::new().secret_key("k1", [1; 32]);
        let secret = generate_secret().unwrap();
        let sealed = keys.seal(&secret).unwrap();
        assert!(sealed.starts_with("enc:v1:k1:"), "{sealed}");
        assert!(!sealed.contains(&secret[SECRET_PREFIX.len()..]));
        assert_eq!(keys.open(&sealed).unwrap(), secret);
        let wrong = Subscriptions::new().secret_key("k1", [2; 32]);
        assert!(wrong.open(&sealed).is_err());
        let unknown = Subscriptions::new().secret_key("k2", [1; 32]);
        assert!(unknown
            .open(&sealed)
            .unwrap_err()
            .to_string()
            .contains("`k1`"));
        // Rotated keys: the new one first, the old one still opens.
        let rotated = Subscriptions::new()
            .secret_key("k2", [9; 32])
            .secret_key("k1", [1; 32]);
        assert_eq!(rotated.open(&sealed).unwrap(), secret);
        assert!(rotated.seal(&secret).unwrap().starts_with("enc:v1:k2:"));
        // Without a key, stored as it is.
        assert_eq!(Subscriptions::new().seal(&secret).unwrap(), secret);
    }

    #[test]
    fn generated_secrets_are_standard_webhooks_secrets_and_given_ones_are_checked() {
        let secret = generate_secret().unwrap();
        assert!(check_secret(&secret).is_ok());
        assert_ne!(secret, generate_secret().unwrap());
        assert!(check_secret("whsec_short").is_err());
        assert!(check_secret("not-a-secret").is_err());
    }
}
