//! The worker's subscriptions: the destination of each one (with its health and pace), rebuilt
//! when the subscription changes, and followed from the store by the housekeeper.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::destination::SubscriptionTransport;
use crate::destination::{DestinationOptions, Registered};
use crate::store::{StoreError, Subscriptions};
use crate::subscription::{destination_name, Subscription};

/// How often a handler thread that met a subscription this worker does not know may read the
/// subscriptions again itself (the housekeeper reads them every few seconds anyway).
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_millis(200);

/// How a worker delivers to subscriptions: [`WorkerBuilder::subscriptions`](crate::WorkerBuilder::subscriptions).
#[derive(Clone)]
pub struct SubscriptionDelivery {
    transport: Arc<dyn SubscriptionTransport>,
    options: DestinationOptions,
}

impl std::fmt::Debug for SubscriptionDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionDelivery")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SubscriptionDelivery {
    /// Subscriptions delivered through `transport` (e.g. `outbox-webhook`'s signed webhooks),
    /// each wrapped with the default [`DestinationOptions`] (a subscription's own rate limit, if
    /// it has one, replaces theirs).
    pub fn new(transport: impl SubscriptionTransport) -> Self {
        SubscriptionDelivery {
            transport: Arc::new(transport),
            options: DestinationOptions::new(),
        }
    }

    /// How each subscription's destination is wrapped: its health policy, whether it learns a
    /// rate from push-back, a rate limit for those without their own.
    pub fn options(mut self, options: DestinationOptions) -> Self {
        self.options = options;
        self
    }
}

/// One subscription as this worker knows it.
pub(crate) struct Known {
    pub subscription: Subscription,
    /// Its destination, or why the transport could build none.
    pub destination: Result<Arc<Registered>, String>,
}

/// The subscriptions of a worker that delivers to them.
pub(crate) struct Subscribers {
    delivery: SubscriptionDelivery,
    by_id: RwLock<HashMap<String, Arc<Known>>>,
    last_read: Mutex<Option<Instant>>,
    /// When the last read [`Self::removed_since`] made began, and the ids it found.
    checked: Mutex<Option<(Instant, HashSet<String>)>>,
    /// Subscriptions seen enabled again, whose paused deliveries the housekeeper releases.
    to_release: Mutex<BTreeSet<String>>,
}

impl Subscribers {
    pub fn new(delivery: SubscriptionDelivery) -> Self {
        Subscribers {
            delivery,
            by_id: RwLock::new(HashMap::new()),
            last_read: Mutex::new(None),
            checked: Mutex::new(None),
            to_release: Mutex::new(BTreeSet::new()),
        }
    }

    /// Subscription `id`, if this worker knows it.
    pub fn get(&self, id: &str) -> Option<Arc<Known>> {
        self.by_id
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// Every subscription this worker knows.
    pub fn all(&self) -> Vec<Arc<Known>> {
        self.by_id
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Subscription `id`, reading the store again first if this worker does not know it and
    /// has not read for a moment: a delivery can come before the housekeeper's next reading.
    pub fn get_or_read(
        &self,
        id: &str,
        store: &dyn Subscriptions,
    ) -> Result<Option<Arc<Known>>, StoreError> {
        if let Some(known) = self.get(id) {
            return Ok(Some(known));
        }
        let due = {
            let mut last = self
                .last_read
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let due = last.is_none_or(|at| at.elapsed() >= REFRESH_AT_MOST_EVERY);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if due {
            self.follow(store.subscriptions()?);
        }
        Ok(self.get(id))
    }

    /// Whether subscription `id` is gone from the store, by a read that began at `since` or
    /// later (made now unless another thread's already was). A delivery claimed before `since`
    /// whose subscription such a read does not find belongs to a removed subscription: the
    /// fan-out writes deliveries only for subscriptions committed before them. One read serves
    /// every thread that asks about deliveries claimed before it began.
    pub fn removed_since(
        &self,
        id: &str,
        store: &dyn Subscriptions,
        since: Instant,
    ) -> Result<bool, StoreError> {
        let mut checked = self.checked.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((began, ids)) = checked.as_ref() {
            if *began >= since {
                return Ok(!ids.contains(id));
            }
        }
        let began = Instant::now();
        let subscriptions = store.subscriptions()?;
        let ids: HashSet<String> = subscriptions.iter().map(|s| s.id.clone()).collect();
        self.follow(subscriptions);
        let removed = !ids.contains(id);
        *checked = Some((began, ids));
        Ok(removed)
    }

    /// The subscriptions seen enabled again since the last call, whose paused deliveries are
    /// to be made due.
    pub fn take_enabled(&self) -> BTreeSet<String> {
        std::mem::take(
            &mut *self
                .to_release
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Puts back subscriptions whose release failed, for the next try.
    pub fn release_later(&self, ids: impl IntoIterator<Item = String>) {
        self.to_release
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(ids);
    }

    /// Takes the store's subscriptions in: builds the destination of each new or changed one,
    /// forgets removed ones, and notes those that were disabled and are enabled now (see
    /// [`Self::take_enabled`]).
    pub fn follow(&self, subscriptions: Vec<Subscription>) {
        let mut by_id = self.by_id.write().unwrap_or_else(PoisonError::into_inner);
        *self
            .last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let mut next = HashMap::with_capacity(subscriptions.len());
        let mut enabled = Vec::new();
        for subscription in subscriptions {
            let id = subscription.id.clone();
            let known = match by_id.remove(&id) {
                Some(known) if known.subscription == subscription => known,
                earlier => {
                    if earlier
                        .as_ref()
                        .is_some_and(|e| !e.subscription.enabled && subscription.enabled)
                    {
                        enabled.push(id.clone());
                    }
                    Arc::new(self.build(subscription))
                }
            };
            next.insert(id, known);
        }
        *by_id = next;
        drop(by_id);
        self.release_later(enabled);
    }

    fn build(&self, subscription: Subscription) -> Known {
        let mut options = self.delivery.options.clone();
        if let Some(rate) = subscription.rate_limit.filter(|rate| *rate > 0) {
            options = options.rate_limit(crate::destination::RateLimit::per_second(rate));
        }
        let destination = self
            .delivery
            .transport
            .destination(&subscription)
            .map(|destination| {
                Arc::new(Registered::new(
                    destination_name(&subscription.id),
                    destination,
                    options,
                ))
            });
        if let Err(problem) = &destination {
            log::warn!(
                "outbox: subscription {} cannot be delivered to: {problem}; its deliveries wait \
                 until it changes",
                subscription.id
            );
        }
        Known {
            subscription,
            destination,
        }
    }

    /// The longest one delivery to a subscription takes.
    pub fn timeout(&self) -> Duration {
        self.delivery.transport.timeout()
    }

    /// Follows the operator's pauses of destinations: a subscription's destination is paused
    /// by its name (`subscription:<id>`).
    pub fn follow_pauses(&self, paused: &BTreeMap<String, String>) {
        for known in self.all() {
            if let Ok(destination) = &known.destination {
                destination.set_operator_pause(paused.get(destination.name()).cloned());
            }
        }
    }
}
